// The paged host pool: see page_pool.h.
#include "hisparse/daemon/page_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "hisparse/common/log.h"
#include "hisparse/common/size_parse.h"
#include "hisparse/common/status_macros.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels answer EINVAL and the engine faults pages in
#endif

namespace hisparse {
namespace {

constexpr uint64_t kSmallPage = 4096;
constexpr uint64_t kHugePage = 2ull << 20;

// Writes every page of [data, data+bytes) using `threads` threads, so the kernel backs the whole
// range now rather than in an engine's decode step. Zero is what a fresh memfd reads as anyway.
void PretouchParallel(uint8_t* data, uint64_t bytes, int threads) {
  const uint64_t chunk = std::max<uint64_t>(kSmallPage, (bytes / threads + kSmallPage - 1) / kSmallPage * kSmallPage);
  auto touch = [data](uint64_t begin, uint64_t end) {
    for (uint64_t off = begin; off < end; off += kSmallPage) data[off] = 0;
  };
  std::vector<std::thread> workers;
  for (uint64_t begin = 0; begin < bytes; begin += chunk) {
    const uint64_t end = std::min(bytes, begin + chunk);
    try {
      workers.emplace_back(touch, begin, end);
    } catch (const std::system_error&) {
      touch(begin, end);  // out of threads: this one does the chunk, slower but the same
    }
  }
  for (auto& w : workers) w.join();
}

// Punches every page out of a retired slab's memfd: the kernel frees them at once, even while
// another process holds the file or maps it (its mapping then reads zeros, and a page it touches
// again is new memory, charged to its own cgroup). Works for shmem and hugetlbfs memfds alike,
// and the size seals allow it (KEEP_SIZE). Returns the bytes the file still has allocated after
// the punch (st_blocks): 0 unless a holder touched a page again in between.
absl::StatusOr<uint64_t> PunchOutRange(int fd, uint64_t bytes, const std::function<void()>& after_punch = nullptr) {
  if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(bytes)) != 0) {
    return ErrnoStatus(errno, "punching a retired slab out of its memfd (fallocate PUNCH_HOLE)");
  }
  if (after_punch) after_punch();
  struct stat st {};
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "fstat of a retired slab's memfd");
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

int ResolveThreads(int requested) {
  if (requested > 0) return requested;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

absl::StatusOr<uint64_t> PagePool::PunchOut(int fd) {
  HS_ASSIGN_OR_RETURN(size_t bytes, FileSize(fd));
  return PunchOutRange(fd, bytes);
}

absl::StatusOr<std::unique_ptr<PagePool>> PagePool::Create(const Options& options,
                                                           std::vector<RecoveredSlab> recovered) {
  const uint64_t unit = options.hugepages == Hugepages::kOn ? kHugePage : kSmallPage;
  if (options.page_bytes == 0 || options.page_bytes % unit != 0) {
    return absl::InvalidArgumentError(absl::StrCat("host_pool.page_size must be a positive multiple of ",
                                                   FormatByteSize(unit), ", got ", options.page_bytes));
  }
  if (options.slab_bytes < options.page_bytes || options.slab_bytes % options.page_bytes != 0 ||
      options.slab_bytes / options.page_bytes > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("host_pool.slab_size (", options.slab_bytes,
                                                   ") must be a whole number of pages of ", options.page_bytes));
  }
  if (options.budget_bytes < options.page_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("host_pool.size (", options.budget_bytes,
                                                   ") must hold at least one page of ", options.page_bytes));
  }
  std::unique_ptr<PagePool> pool(new PagePool(options));
  if (options.hugepages == Hugepages::kOn) {
    // Fail at start, not at the first admission, when the host has no huge pages to give.
    const uint64_t probe = std::min(options.slab_bytes, options.budget_bytes / options.page_bytes * options.page_bytes);
    HS_ASSIGN_OR_RETURN(std::shared_ptr<SlabMemory> mem, pool->MakeMemory(probe, /*threads=*/0));
    (void)mem;
  }
  {
    absl::MutexLock lock(&pool->mu_);
    pool->next_slab_ = std::max<uint64_t>(options.first_slab_id, 1);
    for (RecoveredSlab& slab : recovered) HS_RETURN_IF_ERROR(pool->AdoptRecoveredLocked(std::move(slab)));
  }
  pool->worker_ = std::thread([p = pool.get()] { p->WorkerLoop(); });
  LOG(INFO) << "host pool: budget " << FormatByteSize(options.budget_bytes) << " in pages of "
            << FormatByteSize(options.page_bytes) << ", slabs up to " << FormatByteSize(options.slab_bytes)
            << ", reserve " << options.reserve_slabs << " slabs";
  return pool;
}

PagePool::PagePool(const Options& options)
    : options_(options), slab_pages_(static_cast<uint32_t>(options.slab_bytes / options.page_bytes)) {
  absl::MutexLock lock(&mu_);
  locked_ = options.mlock;
}

PagePool::~PagePool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (worker_.joinable()) worker_.join();
}

absl::StatusOr<std::shared_ptr<PagePool::SlabMemory>> PagePool::MakeMemory(uint64_t bytes, int threads) const {
  auto mem = std::make_shared<SlabMemory>();
  const bool try_huge = options_.hugepages != Hugepages::kOff && bytes % kHugePage == 0;
  HS_ASSIGN_OR_RETURN(mem->fd, CreateMemfd("hisparse-slab", bytes, try_huge, &mem->hugetlb));
  if (options_.hugepages == Hugepages::kOn && !mem->hugetlb) {
    return absl::FailedPreconditionError(
        "host_pool.hugepages is on but the host has too few huge pages reserved (vm.nr_hugepages)");
  }
  HS_ASSIGN_OR_RETURN(mem->map, MappedRegion::MapShared(mem->fd.get(), bytes));
  if (!mem->hugetlb) ::madvise(mem->map.data(), bytes, MADV_HUGEPAGE);  // transparent huge pages, if shmem allows
  if (threads > 0) PretouchParallel(mem->map.data(), bytes, threads);
  return mem;
}

void PagePool::Populate(SlabMemory& mem) {
  if (options_.mlock) {
    if (::mlock(mem.map.data(), mem.map.size()) == 0) return;  // mlock populates too
    bool first = false;
    {
      absl::MutexLock lock(&mu_);
      first = std::exchange(locked_, false);
    }
    if (first) LOG(WARNING) << "mlock of a host pool slab failed (raise LimitMEMLOCK): pages may be swapped";
  }
  // Content-preserving: the engine may be writing the slab already.
  (void)::madvise(mem.map.data(), mem.map.size(), MADV_POPULATE_WRITE);
}

uint64_t PagePool::UnallocatedLocked() const {
  const uint64_t taken = owned_bytes_ + ready_.size() * options_.slab_bytes + making_bytes_ + refill_bytes_;
  return taken >= options_.budget_bytes ? 0 : options_.budget_bytes - taken;
}

uint64_t PagePool::FreePagesOfLocked(uint64_t owner) const {
  auto it = slabs_by_owner_.find(owner);
  if (it == slabs_by_owner_.end()) return 0;
  uint64_t n = 0;
  for (uint64_t id : it->second) n += slabs_.at(id).free.size();
  return n;
}

bool PagePool::SlabsOutsideLocks::MayMake(const Want& want) {
  SlabsOutsideLocks* scope = active_;
  if (scope == nullptr || scope->lifted_) return true;
  scope->want_ = want;
  return false;
}

bool PagePool::SlabsOutsideLocks::MakeWanted(PagePool& pool) {
  std::optional<Want> larger = larger_;
  std::optional<Want> want = TakeWant();
  if (!want.has_value()) return false;
  const bool lifted = std::exchange(lifted_, true);
  // Its answer is the next try's to give: under the holder's locks, the allocation decides.
  if (!larger.has_value() || !pool.Prepare(larger->owner, larger->pages).ok()) {
    (void)pool.Prepare(want->owner, want->pages);
  }
  lifted_ = lifted;
  made_for_ = want->owner;
  ++made_;
  return true;
}

absl::StatusOr<std::vector<PagePool::NewSlab>> PagePool::PlanSlabsLocked(uint64_t owner, uint64_t need,
                                                                         const SlabsOutsideLocks::Want& want) {
  uint64_t held = 0;  // pages of the owner's slabs: a new slab doubles it, up to a full slab
  if (auto it = slabs_by_owner_.find(owner); it != slabs_by_owner_.end()) {
    for (uint64_t id : it->second) held += slabs_.at(id).refs.size();
  }
  uint64_t budget_left = UnallocatedLocked();
  size_t ready_left = ready_.size(), drop = 0;
  bool cancel_refill = false;
  std::vector<uint64_t> reclaim;  // other owners' idle slabs whose budget this plan takes
  std::vector<uint64_t> idle;     // every owner's idle slabs, gathered once a plan needs to reclaim
  size_t next_idle = 0;
  std::vector<NewSlab> plan;
  for (uint64_t remaining = need; remaining > 0;) {
    uint64_t pages =
        remaining >= slab_pages_ ? slab_pages_ : std::min<uint64_t>(slab_pages_, std::max(remaining, held));
    if (pages == slab_pages_ && ready_left > 0) {
      --ready_left;
      plan.push_back(NewSlab{slab_pages_, /*from_reserve=*/true, nullptr});
    } else {
      if (pages * options_.page_bytes > budget_left) pages = std::min<uint64_t>(remaining, slab_pages_);
      // A slab smaller than the reserve's: ready slabs give their budget back if it is short.
      while (pages * options_.page_bytes > budget_left && ready_left > 0) {
        --ready_left, ++drop;
        budget_left += options_.slab_bytes;
      }
      // So does the worker's refill in progress: it drops that slab when it is done.
      if (pages * options_.page_bytes > budget_left && refill_bytes_ != 0 && !cancel_refill) {
        cancel_refill = true;
        budget_left += refill_bytes_;
      }
      // Then other owners' idle slabs, oldest first.
      if (pages * options_.page_bytes > budget_left && idle.empty()) idle = IdleSlabsLocked();
      for (; pages * options_.page_bytes > budget_left && next_idle < idle.size(); ++next_idle) {
        const Slab& slab = slabs_.at(idle[next_idle]);
        if (slab.owner == owner) continue;
        reclaim.push_back(idle[next_idle]);
        budget_left += slab.refs.size() * options_.page_bytes;
      }
      if (pages * options_.page_bytes > budget_left) {
        return absl::ResourceExhaustedError(
            absl::StrCat("host pool cannot hold ", need, " more pages of ", options_.page_bytes,
                         " bytes: ", UnallocatedLocked() / options_.page_bytes, " pages of budget unallocated, ",
                         ready_.size(), " ready slabs, budget ", options_.budget_bytes, " bytes (host_pool.size)"));
      }
      budget_left -= pages * options_.page_bytes;
      plan.push_back(NewSlab{static_cast<uint32_t>(pages), /*from_reserve=*/false, nullptr});
    }
    held += plan.back().pages;
    remaining -= std::min<uint64_t>(plan.back().pages, remaining);
  }
  const bool makes = std::any_of(plan.begin(), plan.end(), [](const NewSlab& ns) { return !ns.from_reserve; });
  if (makes && !SlabsOutsideLocks::MayMake(want)) {
    return absl::UnavailableError(absl::StrCat("a new slab for ", need, " pages is made outside the caller's locks"));
  }
  // Apply: nothing above changed the pool. Until Allocate adds them, the plan's slabs (ready ones
  // included) are charged as being made.
  for (NewSlab& ns : plan) {
    making_bytes_ += uint64_t{ns.pages} * options_.page_bytes;
    if (!ns.from_reserve) continue;
    ns.mem = std::move(ready_.back());
    ready_.pop_back();
  }
  if (cancel_refill) {
    refill_bytes_ = 0;
    refill_cancelled_ = true;
  }
  for (uint64_t id : reclaim) RetireSlabLocked(id);
  for (size_t i = 0; i < drop; ++i) {
    scrub_.push_back(std::move(ready_.back()));
    ready_.pop_back();
  }
  return plan;
}

uint64_t PagePool::FreeAfterLocked(const Page& after) const {
  const Slab& s = slabs_.at(after.slab);
  uint64_t n = 0;
  for (uint32_t i = after.index + 1; i < s.refs.size() && s.refs[i] == 0; ++i) ++n;
  return n;
}

std::vector<uint64_t> PagePool::IdleSlabsLocked() const {
  std::vector<uint64_t> idle;
  for (Shard& sh : shards_) {
    absl::MutexLock shard(&sh.mu);
    idle.insert(idle.end(), sh.idle.begin(), sh.idle.end());
  }
  std::sort(idle.begin(), idle.end());
  return idle;
}

void PagePool::TakePagesFromLocked(Shard& sh, const std::vector<uint64_t>& slab_ids, uint32_t count,
                                   std::vector<Page>* out) {
  uint32_t left = count;
  for (uint64_t id : slab_ids) {
    Slab& s = slabs_.at(id);
    for (; left > 0 && !s.free.empty(); --left) TakePageLocked(sh, s, id, *s.free.begin(), out);
  }
}

uint64_t PagePool::AddSlabLocked(uint64_t owner, std::shared_ptr<SlabMemory> mem, uint32_t pages) {
  const uint64_t id = next_slab_++;
  mem->id = id;
  Slab& s = slabs_[id];
  s.owner = owner;
  s.mem = std::move(mem);
  s.refs.assign(pages, 0);
  for (uint32_t i = 0; i < pages; ++i) s.free.insert(s.free.end(), i);
  slabs_by_owner_[owner].push_back(id);
  owned_bytes_ += uint64_t{pages} * options_.page_bytes;
  pages_free_ += pages;
  return id;
}

absl::Status PagePool::AdoptRecoveredLocked(RecoveredSlab slab) {
  const uint64_t pages = slab.refs.size();
  const uint64_t bytes = pages * options_.page_bytes;
  if (slab.owner == kNoOwner || slab.id == 0 || slab.id >= next_slab_ || slabs_.count(slab.id) != 0 || pages == 0 ||
      pages > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("recovered slab ", slab.id, " of owner ", slab.owner, " (", pages,
                                                   " pages) cannot be taken back"));
  }
  if (owned_bytes_ + bytes > options_.budget_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("recovered slab ", slab.id, " does not fit in the budget"));
  }
  HS_ASSIGN_OR_RETURN(size_t size, FileSize(slab.fd.get()));
  if (size != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("recovered slab ", slab.id, " is ", size, " bytes, not ", pages, " pages"));
  }
  auto mem = std::make_shared<SlabMemory>();
  HS_ASSIGN_OR_RETURN(mem->map, MappedRegion::MapShared(slab.fd.get(), bytes));
  mem->fd = std::move(slab.fd);
  mem->id = slab.id;
  // The kernel says whether the memfd is on huge pages (hugetlbfs has no holes to punch that
  // differ; only the figure in Stats depends on it).
  struct stat st {};
  mem->hugetlb = ::fstat(mem->fd.get(), &st) == 0 && static_cast<uint64_t>(st.st_blksize) >= kHugePage;
  if (!mem->hugetlb) hugepages_ = false;
  Slab& s = slabs_[slab.id];
  s.owner = slab.owner;
  s.mem = std::move(mem);
  s.refs = std::move(slab.refs);
  for (uint32_t i = 0; i < s.refs.size(); ++i) {
    if (s.refs[i] == 0) {
      s.free.insert(s.free.end(), i);
      ++pages_free_;
    } else {
      ++pages_used_;
      if (s.refs[i] > 1) ++pages_shared_;
    }
  }
  if (s.free.size() == s.refs.size()) {
    Shard& sh = ShardOf(slab.owner);
    absl::MutexLock shard(&sh.mu);
    sh.idle.insert(slab.id);
  }
  slabs_by_owner_[slab.owner].push_back(slab.id);
  owned_bytes_ += bytes;
  // mlocked (host_pool.mlock) as every slab is, contents kept. Without mlock it is not populated:
  // its pages in use are there already (their data survived), and populating a large pool's slabs
  // right after a restart took the mmap lock from the calls that adopt them (on the H200 host a
  // 30 GiB adoption waited 3.5 s behind it); a free page is faulted in when a request takes it.
  if (options_.mlock) populate_.push_back(s.mem);
  return absl::OkStatus();
}

void PagePool::TakePageLocked(Shard& sh, Slab& slab, uint64_t slab_id, uint32_t index, std::vector<Page>* out) {
  if (slab.free.size() == slab.refs.size()) sh.idle.erase(slab_id);
  slab.free.erase(index);
  slab.refs[index] = 1;
  --pages_free_;
  ++pages_used_;
  out->push_back(Page{slab_id, index});
}

void PagePool::TakePagesLocked(Shard& sh, uint64_t owner, uint32_t count, const Page* after, std::vector<Page>* out) {
  uint32_t left = count;
  if (after != nullptr) {
    Slab& s = slabs_.at(after->slab);
    for (uint32_t i = after->index + 1; left > 0 && i < s.refs.size() && s.refs[i] == 0; ++i, --left) {
      TakePageLocked(sh, s, after->slab, i, out);
    }
  }
  if (left == 0) return;
  // The slabs with the most free pages first, so the pages land in the fewest slabs: a slab is
  // the unit of host locality the GPU's fetch cares about (bench/RESULTS.md, "Pages in slabs").
  std::vector<std::pair<size_t, uint64_t>> order;  // (free pages, slab), most free first
  if (auto mine = slabs_by_owner_.find(owner); mine != slabs_by_owner_.end()) {
    for (uint64_t id : mine->second) {
      const size_t free = slabs_.at(id).free.size();
      if (free > 0) order.emplace_back(free, id);
    }
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [free, id] : order) {
    Slab& s = slabs_.at(id);
    for (; left > 0 && !s.free.empty(); --left) TakePageLocked(sh, s, id, *s.free.begin(), out);
    if (left == 0) break;
  }
}

absl::StatusOr<std::vector<PagePool::Page>> PagePool::Allocate(uint64_t owner, uint32_t count, const Page* after) {
  // A plan made under the lock can be overtaken while its new slabs are made outside it: another
  // owner's allocation may reclaim this owner's idle slab meanwhile. The slabs made stay this
  // owner's, free, and the allocation is planned again (a few times at most).
  return AllocateRetrying(owner, count, after, /*take=*/true);
}

absl::StatusOr<std::vector<PagePool::Page>> PagePool::AllocateRetrying(uint64_t owner, uint32_t count,
                                                                       const Page* after, bool take) {
  constexpr int kTries = 8;
  for (int attempt = 1;; ++attempt) {
    absl::StatusOr<std::vector<Page>> got = AllocateOnce(owner, count, after, take);
    if (!absl::IsAborted(got.status())) return got;
    if (attempt == kTries) {
      // Overtaken every time: other owners' allocations reclaimed what this one made, which they
      // do only when the budget is spent. To the caller that is the pool being full, not a new
      // kind of error (a TSan run of 8 owners on a 64-page pool saw it).
      return absl::ResourceExhaustedError(absl::StrCat("host pool cannot hold ", count, " more pages for now: other ",
                                                       "owners' allocations took them ", kTries,
                                                       " times in a row (the budget is contended)"));
    }
  }
}

absl::Status PagePool::Prepare(uint64_t owner, uint64_t count) {
  if (count == 0) return absl::OkStatus();
  if (count > UINT32_MAX) {
    return absl::ResourceExhaustedError(absl::StrCat("host pool cannot hold ", count, " more pages"));
  }
  return AllocateRetrying(owner, static_cast<uint32_t>(count), nullptr, /*take=*/false).status();
}

std::optional<absl::StatusOr<std::vector<PagePool::Page>>> PagePool::TakeFreeLocked(Shard& sh, uint64_t owner,
                                                                                    uint32_t count, const Page* after,
                                                                                    bool take) {
  if (after != nullptr && FindOwnedLocked(owner, *after) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("page ", after->index, " of slab ", after->slab, " is not a page of this owner"));
  }
  if (FreePagesOfLocked(owner) < count && (after == nullptr || FreeAfterLocked(*after) < count)) return std::nullopt;
  std::vector<Page> out;
  if (take) {
    out.reserve(count);
    TakePagesLocked(sh, owner, count, after, &out);
  }
  return out;
}

absl::StatusOr<std::vector<PagePool::Page>> PagePool::AllocateOnce(uint64_t owner, uint32_t count, const Page* after,
                                                                   bool take) {
  if (owner == kNoOwner) return absl::InvalidArgumentError("page owner must be non-zero");
  if (count == 0) return absl::InvalidArgumentError("cannot allocate zero pages");
  Shard& sh = ShardOf(owner);
  {
    // The owner's free pages: the pool's lock shared, so that other owners' page calls go on.
    absl::ReaderMutexLock lock(&mu_);
    absl::MutexLock shard(&sh.mu);
    if (auto done = TakeFreeLocked(sh, owner, count, after, take)) return *std::move(done);
  }
  std::vector<Page> out;
  std::vector<NewSlab> plan;
  bool fresh = false;
  {
    absl::MutexLock lock(&mu_);  // exclusively: the plan changes the slabs and the budget
    {
      absl::MutexLock shard(&sh.mu);
      if (auto done = TakeFreeLocked(sh, owner, count, after, take)) return *std::move(done);
    }
    const uint64_t free = FreePagesOfLocked(owner);
    // New slabs for the whole allocation keep its pages consecutive (one run per slab); when the
    // budget cannot, the owner's free pages make up the difference.
    const SlabsOutsideLocks::Want want{owner, count};
    absl::StatusOr<std::vector<NewSlab>> whole = PlanSlabsLocked(owner, count, want);
    if (absl::IsUnavailable(whole.status())) return whole.status();
    fresh = whole.ok();
    if (fresh) {
      plan = *std::move(whole);
    } else {
      HS_ASSIGN_OR_RETURN(plan, PlanSlabsLocked(owner, count - free, want));
    }
  }
  // New slabs are made outside the pool's lock: a few syscalls each, no page touched.
  uint64_t charged = 0;
  absl::Status made;
  for (NewSlab& ns : plan) {
    charged += uint64_t{ns.pages} * options_.page_bytes;
    if (ns.from_reserve || !made.ok()) continue;
    absl::StatusOr<std::shared_ptr<SlabMemory>> mem = MakeMemory(uint64_t{ns.pages} * options_.page_bytes, 0);
    if (mem.ok()) {
      ns.mem = *std::move(mem);
    } else {
      made = mem.status();
    }
  }
  absl::MutexLock lock(&mu_);
  making_bytes_ -= charged;
  if (!made.ok()) {
    // Ready slabs go back untouched (still zero); those made already are dropped by the worker.
    for (NewSlab& ns : plan) {
      if (ns.mem == nullptr) continue;
      if (ns.from_reserve) {
        ready_.push_back(std::move(ns.mem));
      } else {
        scrub_.push_back(std::move(ns.mem));
      }
    }
    return made;
  }
  absl::MutexLock shard(&sh.mu);
  std::vector<uint64_t> added;
  for (NewSlab& ns : plan) {
    hugepages_ = hugepages_ && ns.mem->hugetlb;
    added.push_back(AddSlabLocked(owner, ns.mem, ns.pages));
    if (!ns.from_reserve) {
      ++slabs_made_;
      if (take) ++slabs_made_inline_;
      populate_.push_back(std::move(ns.mem));  // the worker populates it (a ready slab is already)
    }
  }
  if (!take) {
    for (uint64_t id : added) sh.idle.insert(id);  // prepared: free, the owner's
    return out;
  }
  if (fresh) {
    TakePagesFromLocked(sh, added, count, &out);
    return out;
  }
  if (FreePagesOfLocked(owner) < count) {
    for (uint64_t id : added) sh.idle.insert(id);  // made for this call, nothing taken: idle, the owner's
    return absl::AbortedError("a concurrent allocation took this owner's pages");
  }
  TakePagesLocked(sh, owner, count, after, &out);
  return out;
}

PagePool::Slab* PagePool::FindOwnedLocked(uint64_t owner, const Page& page) {
  auto it = slabs_.find(page.slab);
  if (it == slabs_.end() || it->second.owner != owner || owner == kNoOwner) return nullptr;
  if (page.index >= it->second.refs.size() || it->second.refs[page.index] == 0) return nullptr;
  return &it->second;
}

absl::StatusOr<PagePool::Slab*> PagePool::HeldSlabLocked(uint64_t owner, const Page& page) {
  Slab* s = FindOwnedLocked(owner, page);
  if (s == nullptr) {
    return absl::NotFoundError(absl::StrCat("page ", page.index, " of slab ", page.slab, " is not held by this owner"));
  }
  return s;
}

absl::Status PagePool::AddRef(uint64_t owner, const Page& page) {
  absl::ReaderMutexLock lock(&mu_);
  absl::MutexLock shard(&ShardOf(owner).mu);
  HS_ASSIGN_OR_RETURN(Slab * s, HeldSlabLocked(owner, page));
  uint32_t& refs = s->refs[page.index];
  if (refs == UINT32_MAX) return absl::ResourceExhaustedError("page reference count at its limit");
  if (++refs == 2) ++pages_shared_;
  return absl::OkStatus();
}

absl::Status PagePool::Release(uint64_t owner, const Page& page) {
  absl::ReaderMutexLock lock(&mu_);
  Shard& sh = ShardOf(owner);
  absl::MutexLock shard(&sh.mu);
  return ReleaseLocked(sh, owner, page);
}

absl::Status PagePool::ReleaseLocked(Shard& sh, uint64_t owner, const Page& page) {
  HS_ASSIGN_OR_RETURN(Slab * s, HeldSlabLocked(owner, page));
  uint32_t& refs = s->refs[page.index];
  if (refs-- == 2) --pages_shared_;
  if (refs != 0) return absl::OkStatus();
  s->free.insert(page.index);
  --pages_used_;
  ++pages_free_;
  if (s->free.size() == s->refs.size()) sh.idle.insert(page.slab);  // kept for the owner's next request
  return absl::OkStatus();
}

void PagePool::RetireIdleOf(uint64_t owner) {
  absl::MutexLock lock(&mu_);
  auto it = slabs_by_owner_.find(owner);
  if (it == slabs_by_owner_.end()) return;
  std::vector<uint64_t> idle;
  {
    Shard& sh = ShardOf(owner);
    absl::MutexLock shard(&sh.mu);
    for (uint64_t id : it->second) {
      if (sh.idle.count(id) != 0) idle.push_back(id);
    }
  }
  for (uint64_t id : idle) RetireSlabLocked(id);
}

absl::StatusOr<uint32_t> PagePool::HandOverSlabs(uint64_t from, uint64_t to) {
  if (from == kNoOwner || to == kNoOwner || from == to) {
    return absl::InvalidArgumentError(absl::StrCat("cannot hand slabs from owner ", from, " to owner ", to));
  }
  absl::MutexLock lock(&mu_);
  auto it = slabs_by_owner_.find(from);
  if (it == slabs_by_owner_.end()) return 0;
  const std::vector<uint64_t> moved = std::move(it->second);
  slabs_by_owner_.erase(it);
  std::vector<uint64_t>& mine = slabs_by_owner_[to];
  std::vector<uint64_t> idle;  // moved from `from`'s shard to `to`'s
  {
    Shard& sh = ShardOf(from);
    absl::MutexLock shard(&sh.mu);
    for (uint64_t id : moved) {
      if (sh.idle.erase(id) != 0) idle.push_back(id);
    }
  }
  {
    Shard& sh = ShardOf(to);
    absl::MutexLock shard(&sh.mu);
    sh.idle.insert(idle.begin(), idle.end());
  }
  for (uint64_t id : moved) {
    slabs_.at(id).owner = to;
    mine.push_back(id);
  }
  return static_cast<uint32_t>(moved.size());
}

uint64_t PagePool::ReclaimablePagesFor(uint64_t owner) const {
  absl::MutexLock lock(&mu_);
  uint64_t n = 0;
  for (uint64_t id : IdleSlabsLocked()) {
    const Slab& s = slabs_.at(id);
    if (s.owner != owner) n += s.refs.size();
  }
  return n;
}

absl::Status PagePool::ReleaseAll(uint64_t owner, const std::vector<Page>& pages) {
  // One lock for them all: the pool's lock is every session's (issue 41, item 2).
  absl::Status first;
  absl::ReaderMutexLock lock(&mu_);
  Shard& sh = ShardOf(owner);
  absl::MutexLock shard(&sh.mu);
  for (const Page& p : pages) first.Update(ReleaseLocked(sh, owner, p));
  return first;
}

absl::Status PagePool::ReleaseAll(uint64_t owner, const std::vector<std::vector<Page>>& layers) {
  absl::Status first;
  absl::ReaderMutexLock lock(&mu_);
  Shard& sh = ShardOf(owner);
  absl::MutexLock shard(&sh.mu);
  for (const std::vector<Page>& pages : layers) {
    for (const Page& p : pages) first.Update(ReleaseLocked(sh, owner, p));
  }
  return first;
}

void PagePool::RetireSlabLocked(uint64_t slab_id) {
  auto it = slabs_.find(slab_id);
  Slab& s = it->second;
  std::vector<uint64_t>& mine = slabs_by_owner_[s.owner];
  mine.erase(std::find(mine.begin(), mine.end(), slab_id));
  if (mine.empty()) slabs_by_owner_.erase(s.owner);
  owned_bytes_ -= s.refs.size() * options_.page_bytes;
  pages_free_ -= s.refs.size();
  {
    Shard& sh = ShardOf(s.owner);
    absl::MutexLock shard(&sh.mu);
    sh.idle.erase(slab_id);
  }
  // An engine may hold the memfd: the whole slab is its tenant's until the worker's punch. It may
  // keep it mapped while idle, too: it is told (Departure).
  if (s.mem->charged_to.has_value()) {
    ChargeRetiredLocked(*s.mem->charged_to, s.mem->map.size(), 0, +1);
    if (departures_.size() == kMaxDepartures) departures_.pop_front();
    departures_.push_back(Departure{s.owner, slab_id});
    has_departures_.store(true, std::memory_order_release);
  }
  // Unlinked now; punched and dropped by the worker, outside every lock.
  scrub_.push_back(std::move(s.mem));
  slabs_.erase(it);
}

std::vector<PagePool::Departure> PagePool::TakeDepartures() {
  absl::MutexLock lock(&mu_);
  std::vector<Departure> out(departures_.begin(), departures_.end());
  departures_.clear();
  has_departures_.store(false, std::memory_order_release);
  return out;
}

uint32_t PagePool::RefCount(const Page& page) const {
  absl::MutexLock lock(&mu_);
  auto it = slabs_.find(page.slab);
  if (it == slabs_.end() || page.index >= it->second.refs.size()) return 0;
  return it->second.refs[page.index];
}

absl::StatusOr<UniqueFd> PagePool::DupSlabFd(uint64_t owner, uint64_t slab, uint64_t* bytes,
                                             std::optional<uint32_t> tenant) {
  absl::MutexLock lock(&mu_);
  auto it = slabs_.find(slab);
  if (it == slabs_.end()) return absl::NotFoundError(absl::StrCat("slab ", slab, " is gone (or never was)"));
  if (owner == kNoOwner || it->second.owner != owner) {
    return absl::PermissionDeniedError(absl::StrCat("slab ", slab, " does not belong to this session"));
  }
  // A dup is one cheap syscall; the slab may be retired as soon as the lock is dropped.
  UniqueFd dup(::fcntl(it->second.mem->fd.get(), F_DUPFD_CLOEXEC, 0));
  if (!dup.valid()) return ErrnoStatus(errno, "dup of a slab descriptor");
  // A slab has one owner, of one tenant, for its whole life (HandOverSlabs keeps the tenant).
  if (tenant.has_value()) it->second.mem->charged_to = tenant;
  if (bytes != nullptr) *bytes = it->second.mem->map.size();
  return dup;
}

PagePool::Retired PagePool::RetiredOf(uint32_t tenant) const {
  absl::ReaderMutexLock lock(&mu_);  // under the ledger's lock, on every quota check
  auto it = retired_by_tenant_.find(tenant);
  return it == retired_by_tenant_.end() ? Retired{} : it->second;
}

void PagePool::ChargeRetiredLocked(uint32_t tenant, uint64_t add, uint64_t remove, int slabs) {
  Retired& r = retired_by_tenant_[tenant];
  r.bytes = r.bytes + add - std::min(r.bytes + add, remove);
  r.slabs = static_cast<uint32_t>(static_cast<int64_t>(r.slabs) + slabs);
  if (r.slabs == 0) retired_by_tenant_.erase(tenant);
}

size_t PagePool::SweepRetired() {
  std::vector<Retained> batch;
  {
    absl::MutexLock lock(&mu_);
    batch.swap(retained_);  // their charges stay until each is decided below
  }
  if (batch.empty()) return 0;
  std::vector<absl::StatusOr<uint64_t>> left;
  left.reserve(batch.size());
  for (const Retained& r : batch) left.push_back(PunchOutRange(r.mem->fd.get(), r.bytes));
  std::vector<Retained> dropped;  // closed after the lock is dropped
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < batch.size(); ++i) {
      Retained& r = batch[i];
      // A punch that fails now (one worked on this memfd before) leaves the charge as it was.
      const uint64_t held = left[i].ok() ? *left[i] : r.held;
      ChargeRetiredLocked(r.tenant, held, r.held, held != 0 ? 0 : -1);
      r.held = held;
      if (held != 0) {
        retained_.push_back(std::move(r));
      } else {
        dropped.push_back(std::move(r));
      }
    }
  }
  return dropped.size();
}

absl::StatusOr<uint8_t*> PagePool::PageData(uint64_t owner, const Page& page) const {
  absl::ReaderMutexLock lock(&mu_);
  absl::MutexLock shard(&ShardOf(owner).mu);
  auto it = slabs_.find(page.slab);
  if (owner == kNoOwner || it == slabs_.end() || it->second.owner != owner || page.index >= it->second.refs.size() ||
      it->second.refs[page.index] == 0) {
    return absl::NotFoundError(absl::StrCat("page ", page.index, " of slab ", page.slab, " is not held by this owner"));
  }
  return it->second.mem->map.data() + uint64_t{page.index} * options_.page_bytes;
}

uint8_t* PagePool::PageDataForTest(const Page& page) const {
  absl::MutexLock lock(&mu_);
  auto it = slabs_.find(page.slab);
  if (it == slabs_.end() || page.index >= it->second.refs.size()) return nullptr;
  return it->second.mem->map.data() + uint64_t{page.index} * options_.page_bytes;
}

uint32_t PagePool::SlabsOf(uint64_t owner) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = slabs_by_owner_.find(owner);
  return it == slabs_by_owner_.end() ? 0 : static_cast<uint32_t>(it->second.size());
}

uint64_t PagePool::PagesOf(uint64_t owner) const {
  absl::ReaderMutexLock lock(&mu_);
  absl::MutexLock shard(&ShardOf(owner).mu);
  auto it = slabs_by_owner_.find(owner);
  if (it == slabs_by_owner_.end()) return 0;
  uint64_t n = 0;
  for (uint64_t id : it->second) {
    const Slab& s = slabs_.at(id);
    n += s.refs.size() - s.free.size();
  }
  return n;
}

uint64_t PagePool::FreePagesOf(uint64_t owner) const {
  absl::ReaderMutexLock lock(&mu_);
  absl::MutexLock shard(&ShardOf(owner).mu);
  return FreePagesOfLocked(owner);
}

std::map<uint64_t, uint32_t> PagePool::SlabsByOwner() const {
  absl::ReaderMutexLock lock(&mu_);
  std::map<uint64_t, uint32_t> out;
  for (const auto& [owner, ids] : slabs_by_owner_) out[owner] = static_cast<uint32_t>(ids.size());
  return out;
}

PagePool::Stats PagePool::GetStats() const {
  absl::MutexLock lock(&mu_);
  Stats st;
  st.budget_bytes = options_.budget_bytes;
  st.page_bytes = options_.page_bytes;
  st.slab_bytes = options_.slab_bytes;
  st.pages_used = pages_used_;
  st.pages_free = pages_free_;
  st.pages_reserved = ready_.size() * slab_pages_;
  st.pages_shared = pages_shared_;
  st.owned_bytes = owned_bytes_;
  st.ready_bytes = ready_.size() * options_.slab_bytes;
  st.making_bytes = making_bytes_ + refill_bytes_;
  st.unallocated_bytes = UnallocatedLocked();
  st.slabs = static_cast<uint32_t>(slabs_.size());
  st.ready_slabs = static_cast<uint32_t>(ready_.size());
  st.owners = static_cast<uint32_t>(slabs_by_owner_.size());
  for (Shard& sh : shards_) {
    absl::MutexLock shard(&sh.mu);
    st.idle_slabs += static_cast<uint32_t>(sh.idle.size());
  }
  st.scrub_queue = static_cast<uint32_t>(scrub_.size());
  st.populate_queue = static_cast<uint32_t>(populate_.size());
  st.slabs_made = slabs_made_;
  st.slabs_made_inline = slabs_made_inline_;
  st.slabs_scrubbed = slabs_scrubbed_;
  for (const auto& [tenant, r] : retired_by_tenant_) {
    st.retired_bytes += r.bytes;
    st.retired_slabs += r.slabs;
  }
  st.hugepages = hugepages_ && slabs_made_ != 0;
  st.locked = locked_;
  return st;
}

absl::Status PagePool::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  auto bad = [](auto... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  uint64_t used = 0, free = 0, shared = 0, owned = 0;
  size_t listed = 0;
  for (const auto& [owner, ids] : slabs_by_owner_) {
    if (ids.empty()) return bad("owner ", owner, " is listed with no slab");
    for (uint64_t id : ids) {
      auto it = slabs_.find(id);
      if (it == slabs_.end() || it->second.owner != owner) return bad("owner ", owner, " lists slab ", id, " wrongly");
    }
    listed += ids.size();
  }
  if (listed != slabs_.size()) return bad(slabs_.size(), " slabs, ", listed, " listed by owners");
  for (size_t i = 0; i < kShards; ++i) {
    absl::MutexLock shard(&shards_[i].mu);
    for (uint64_t id : shards_[i].idle) {
      auto it = slabs_.find(id);
      if (it == slabs_.end()) return bad("idle slab ", id, " is not a slab");
      if (it->second.owner % kShards != i) return bad("idle slab ", id, " is in another owner's shard");
    }
  }
  const std::vector<uint64_t> idle_list = IdleSlabsLocked();
  const std::set<uint64_t> idle(idle_list.begin(), idle_list.end());
  for (const auto& [id, s] : slabs_) {
    if (s.owner == kNoOwner || s.mem == nullptr) return bad("slab ", id, " has no owner or memory");
    if (s.refs.size() * options_.page_bytes != s.mem->map.size()) return bad("slab ", id, ": pages != its size");
    uint64_t slab_free = 0;
    for (uint32_t i = 0; i < s.refs.size(); ++i) {
      const bool in_free = s.free.count(i) != 0;
      if (in_free != (s.refs[i] == 0)) return bad("slab ", id, " page ", i, ": free set and references disagree");
      slab_free += in_free ? 1 : 0;
      used += s.refs[i] != 0 ? 1 : 0;
      shared += s.refs[i] > 1 ? 1 : 0;
    }
    if (slab_free != s.free.size()) return bad("slab ", id, ": free set names pages past its end");
    if ((slab_free == s.refs.size()) != (idle.count(id) != 0)) return bad("slab ", id, ": idle set disagrees");
    free += slab_free;
    owned += s.mem->map.size();
  }
  if (used != pages_used_.load() || free != pages_free_.load() || shared != pages_shared_.load() ||
      owned != owned_bytes_) {
    return bad("counters (used ", pages_used_.load(), ", free ", pages_free_.load(), ", shared ", pages_shared_.load(),
               ", owned ", owned_bytes_, ") != sums (", used, ", ", free, ", ", shared, ", ", owned, ")");
  }
  for (const auto& mem : ready_) {
    if (mem->map.size() != options_.slab_bytes) return bad("a ready slab is not full-size");
  }
  if (owned + ready_.size() * options_.slab_bytes + making_bytes_ + refill_bytes_ > options_.budget_bytes) {
    return bad("slabs (", owned, " owned, ", ready_.size(), " ready, ", making_bytes_ + refill_bytes_,
               " being made) exceed the budget ", options_.budget_bytes);
  }
  return absl::OkStatus();
}

bool PagePool::WantsRefillLocked() const {
  return !refill_failed_ && ready_.size() < options_.reserve_slabs && UnallocatedLocked() >= options_.slab_bytes;
}

bool PagePool::HasWorkLocked() const { return !scrub_.empty() || !populate_.empty() || WantsRefillLocked(); }

bool PagePool::IdleLocked() const { return !worker_busy_ && !HasWorkLocked(); }

void PagePool::PauseWorkerForTest(bool paused) {
  absl::MutexLock lock(&mu_);
  paused_for_test_ = paused;
}

void PagePool::SetSlabDroppedHook(std::function<void(uint64_t)> hook) {
  absl::MutexLock lock(&mu_);
  slab_dropped_hook_ = std::move(hook);
}

void PagePool::SetAfterPunchForTest(std::function<void()> after_punch) {
  absl::MutexLock lock(&mu_);
  after_punch_for_test_ = std::move(after_punch);
}

void PagePool::WaitIdle() const {
  mu_.LockWhen(absl::Condition(this, &PagePool::IdleLocked));
  mu_.Unlock();
}

void PagePool::ScrubOne(std::shared_ptr<SlabMemory> mem) {
  const std::optional<uint32_t> tenant = mem->charged_to;
  const uint64_t bytes = mem->map.size();
  const std::function<void()> after_punch = after_punch_for_test_;
  const std::function<void(uint64_t)> dropped = slab_dropped_hook_;
  const uint64_t id = mem->id;
  mu_.Unlock();
  // The memory is freed here, whoever else holds the memfd; then the daemon's mapping goes.
  const absl::StatusOr<uint64_t> left = PunchOutRange(mem->fd.get(), bytes, after_punch);
  mem->map.Reset();
  if (dropped && id != 0) dropped(id);
  const bool keep = tenant.has_value() && left.ok() && *left != 0;
  // A punch that failed (a kernel without hole punching for this memfd) frees nothing here: the
  // memory lives as long as an engine holds the memfd, as it did before punching.
  if (!keep) mem.reset();  // closes the daemon's descriptor
  if (!left.ok() && !punch_failed_.exchange(true)) {
    LOG(WARNING) << "host pool: " << left.status() << "; a retired slab lives on while an engine holds it";
  }
  mu_.Lock();
  if (!tenant.has_value()) return;
  if (!keep) {
    ChargeRetiredLocked(*tenant, 0, bytes, -1);
    return;
  }
  ChargeRetiredLocked(*tenant, *left, bytes, 0);
  retained_.push_back(Retained{std::move(mem), *tenant, bytes, *left});
}

// One job at a time, by priority: drop scrubbed memory (frees RAM), populate slabs made on demand,
// then refill the reserve. The lock is held only to take a job and to record its outcome.
void PagePool::WorkerLoop() {
  const int threads = ResolveThreads(options_.pretouch_threads);
  mu_.Lock();
  while (true) {
    mu_.Await(absl::Condition(
        +[](PagePool* p)
             ABSL_NO_THREAD_SAFETY_ANALYSIS { return p->stopping_ || (!p->paused_for_test_ && p->HasWorkLocked()); },
        this));
    if (stopping_) break;
    worker_busy_ = true;
    if (!scrub_.empty()) {
      std::shared_ptr<SlabMemory> mem = std::move(scrub_.front());
      scrub_.pop_front();
      ScrubOne(std::move(mem));
      ++slabs_scrubbed_;
      refill_failed_ = false;  // memory came back: the reserve may be refilled again
    } else if (!populate_.empty()) {
      std::shared_ptr<SlabMemory> mem = std::move(populate_.front());
      populate_.pop_front();
      mu_.Unlock();
      if (mem.use_count() > 1) Populate(*mem);  // else its slab is gone already
      mem.reset();
      mu_.Lock();
    } else if (WantsRefillLocked()) {
      refill_bytes_ = options_.slab_bytes;
      mu_.Unlock();
      absl::StatusOr<std::shared_ptr<SlabMemory>> made = MakeMemory(options_.slab_bytes, threads);
      if (made.ok() && options_.mlock && ::mlock((*made)->map.data(), options_.slab_bytes) != 0) {
        LOG(WARNING) << "mlock of a host pool slab failed (raise LimitMEMLOCK): pages may be swapped";
        absl::MutexLock lock(&mu_);
        locked_ = false;
      }
      mu_.Lock();
      refill_bytes_ = 0;
      const absl::Status refilled = made.status();  // logged after the lock, below
      if (made.ok() && refill_cancelled_) {
        scrub_.push_back(*std::move(made));  // an allocation took its budget meanwhile
      } else if (made.ok()) {
        ++slabs_made_;
        hugepages_ = hugepages_ && (*made)->hugetlb;
        ready_.push_back(*std::move(made));
      } else {
        refill_failed_ = true;
      }
      refill_cancelled_ = false;
      if (!refilled.ok()) {
        mu_.Unlock();  // not logged under the lock
        LOG(WARNING) << "refilling the host pool's reserve: " << refilled;
        mu_.Lock();
      }
    }
    worker_busy_ = false;
  }
  mu_.Unlock();
}

}  // namespace hisparse
