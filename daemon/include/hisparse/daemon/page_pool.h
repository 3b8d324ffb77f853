// PagePool: the node's host KV memory as fixed-size pages carved from owner-private memfd slabs.
//
// The pool's size is a budget, not a partition. Memory is handed out in pages of page_bytes; a
// page lives in a slab, one memfd that belongs to exactly one owner (a session) for its whole
// life, so passing an owner the fds of its slabs exposes nothing of anyone else. Slabs are made on
// demand from the budget and sized to the need: an owner short of pages gets a slab of
// max(need, what it holds already) pages, at most slab_bytes, so a tenant needing two pages takes
// two pages' worth of budget and a growing one reaches full slabs in a few doublings. Full-size
// slabs come from a small reserve of ready slabs (pre-touched, and mlocked when configured) that a
// background worker keeps filled; a smaller slab is made at once (memfd_create, ftruncate, mmap:
// no page is touched) and the worker populates it afterwards (MADV_POPULATE_WRITE or mlock, which
// keep its contents).
//
// Pages carry a reference count. Allocate gives each page one reference; AddRef maps a page into
// another table of the same owner (read-only there: the next issues share prefixes and parked
// requests this way); Release drops one. A page with no reference is free for its owner's next
// allocation (it keeps that owner's old bytes, which only that owner can read). A slab with no
// referenced page stays its owner's, idle, so the owner's next request reuses memory that is
// already backed; it leaves its owner when another allocation needs its budget or at RetireIdleOf
// (a session's end). Leaving, it is unlinked at once, its budget returns to the pool, and the
// worker frees its memory outside every lock: it punches every page out of the memfd
// (fallocate PUNCH_HOLE), then drops the memfd and the mapping. The punch frees the memory even
// where an engine kept a descriptor of the slab or still maps it: that engine reads zeros, and a
// page it touches again is new memory, charged by the kernel to the engine's own cgroup; no later
// owner ever gets the old memory. Slab ids are never reused, so a client's cache of "slab N"
// cannot alias.
//
// Retired slabs charged to a tenant: a slab the fd channel handed to an engine (DupSlabFd with a
// tenant) may be held by that engine after it leaves its owner. From its retirement until the
// kernel reports its memfd empty (st_blocks 0) its bytes count against that tenant
// (RetiredBytesOf, which SessionManager adds to the tenant's host quota): first the whole slab,
// until the worker's punch; then what the engine touched again meanwhile, kept with the memfd in
// a list that SweepRetired punches again until it is empty. docs/DESIGN.md, "Retired slabs".
//
// Accounting (exact, CheckInvariants): budget = owners' slabs + ready slabs + slabs being made +
// unallocated. Slabs waiting for their scrub are no longer in the budget: they are what the
// kernel frees next (Stats::scrub_queue), as are retired slabs still charged to a tenant
// (Stats::retired_bytes). So is a reserve slab whose budget an allocation took
// while the worker was making it (the worker drops it): an allocation that fits the budget never
// waits for the worker and never fails because of it.
//
// Thread-safe, with locks that match the data (issue 41, item 2). The pool's mutex (mu_) is held
// exclusively by whatever changes the set of slabs or the budget (a new slab, a retired or
// reclaimed one, a hand-over, the reserve, the worker's queues, Stats, the invariants), and
// *shared* by an owner's own page calls (Allocate from its free pages, AddRef, Release,
// ReleaseAll, PageData, the per-owner counts), which also take their owner's shard lock (owner
// modulo kShards): a slab's references, free set and idleness are its owner's shard's. So the
// sessions' admissions and releases that need no new slab do not wait on each other here. The
// node-wide page counters are atomics. memfd creation, pre-touching, populating and scrubbing run
// outside every lock. Calls for one owner must not race each other (a session's lock, or the
// node's, serializes them: session_core.h, "Locks"); calls for different owners may, and an
// allocation another owner's reclaim overtakes is planned again. Lock order: mu_, then a shard.
#ifndef HISPARSE_DAEMON_PAGE_POOL_H_
#define HISPARSE_DAEMON_PAGE_POOL_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "hisparse/common/unique_fd.h"

namespace hisparse {

class PagePool {
 public:
  enum class Hugepages { kAuto, kOn, kOff };
  struct Options {
    uint64_t budget_bytes = 1ull << 30;
    uint64_t page_bytes = 2ull << 20;   // a multiple of 4 KiB (of 2 MiB with huge pages on)
    uint64_t slab_bytes = 64ull << 20;  // the largest slab, and the reserve's; a multiple of page_bytes
    uint32_t reserve_slabs = 2;         // ready slabs the worker keeps (while the budget allows)
    Hugepages hugepages = Hugepages::kAuto;
    int pretouch_threads = 0;  // 0: one per CPU
    bool mlock = false;        // lock slabs in RAM (needs LimitMEMLOCK)
    // The first slab id (ids are never reused: a restarted daemon starts past its former lives'
    // ids, request_journal.h).
    uint64_t first_slab_id = 1;
  };
  // A slab a former life of the daemon made, taken back at start (request_journal.h): its id,
  // its owner (a session id), its memfd and each page's references (0: free).
  struct RecoveredSlab {
    uint64_t id = 0;
    uint64_t owner = 0;
    UniqueFd fd;
    std::vector<uint32_t> refs;
  };
  // A page: slab `slab`, bytes [index * page_bytes, (index + 1) * page_bytes) of its memfd.
  struct Page {
    uint64_t slab = 0;
    uint32_t index = 0;
    bool operator==(const Page& o) const { return slab == o.slab && index == o.index; }
    bool operator<(const Page& o) const { return slab < o.slab || (slab == o.slab && index < o.index); }
  };
  struct Stats {
    uint64_t budget_bytes = 0, page_bytes = 0, slab_bytes = 0;
    uint64_t pages_used = 0;      // referenced pages of owners' slabs
    uint64_t pages_free = 0;      // unreferenced pages of owners' slabs
    uint64_t pages_reserved = 0;  // pages of ready slabs
    uint64_t pages_shared = 0;    // pages with more than one reference
    uint64_t owned_bytes = 0, ready_bytes = 0, making_bytes = 0, unallocated_bytes = 0;
    uint32_t slabs = 0, ready_slabs = 0, owners = 0;
    uint32_t idle_slabs = 0;      // owned slabs with no referenced page (reclaimable)
    uint32_t scrub_queue = 0;     // slabs left by their owners, not yet dropped
    uint32_t populate_queue = 0;  // slabs made on demand, not yet populated
    uint64_t slabs_made = 0, slabs_scrubbed = 0;
    // Slabs an Allocate made on its caller's thread (not the worker's reserve, not Prepare's): the
    // syscalls its caller waited on, maybe under its own locks.
    uint64_t slabs_made_inline = 0;
    // Retired slabs charged to tenants (handed out by the fd channel) whose memory is not yet
    // seen freed, and their charge: whole slabs before the punch, st_blocks after it.
    uint32_t retired_slabs = 0;
    uint64_t retired_bytes = 0;
    bool hugepages = false, locked = false;
  };
  static constexpr uint64_t kNoOwner = 0;

  // Frees the memory of a slab that is no pool's (a former daemon's nothing needs any more,
  // request_journal.h) as the worker frees a retired slab's: every page punched out of the memfd
  // at once, whoever else holds or maps it. Returns the bytes still allocated after the punch.
  static absl::StatusOr<uint64_t> PunchOut(int fd);

  // Validates the options and starts the worker, which fills the reserve in the background.
  // `recovered` slabs (ids below first_slab_id, each owned, a whole number of pages, together
  // within the budget) are the pool's from the start, mapped, their pages referenced as given;
  // InvalidArgument, with nothing kept, for one that is not.
  static absl::StatusOr<std::unique_ptr<PagePool>> Create(const Options& options,
                                                          std::vector<RecoveredSlab> recovered = {});
  // Stops the worker and drops every slab.
  ~PagePool();
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  // `count` pages for `owner` (non-zero), one reference each, all or nothing. Free pages of the
  // owner's slabs when they suffice: those right after `after` (a page the owner holds, when
  // given: an Extend continues a layer's pages in place), then the lowest free pages of the slab
  // with the most free pages, and so on (the fewest slabs: host locality is per slab). Otherwise new slabs for all
  // `count` (so that an admission's pages are consecutive), or, when the budget cannot, new slabs for what the owner's
  // free pages lack. InvalidArgument for owner 0 or count 0; ResourceExhausted when the budget cannot hold them
  // (nothing changes then).
  absl::StatusOr<std::vector<Page>> Allocate(uint64_t owner, uint32_t count, const Page* after = nullptr);
  // Makes sure `owner`'s slabs hold `count` free pages, as Allocate would for `count` (new slabs
  // for all of them when the budget allows, else for what its free pages lack), and takes none:
  // they stay the owner's, free (its idle slabs, which another owner's allocation may reclaim).
  // OK at once when they are there; ResourceExhausted, with nothing changed, when the budget
  // cannot hold them. For a caller that allocates next under locks of its own: the new slabs'
  // syscalls happen here (SlabsOutsideLocks).
  absl::Status Prepare(uint64_t owner, uint64_t count);

  // While one lives on a thread, Allocate and Prepare there make no slab from the OS: where one
  // would (memfd_create, ftruncate and mmap of a slab the reserve cannot give), it changes
  // nothing and answers Unavailable, and the scope keeps what was wanted. Its holder releases its
  // own locks, has the want made (MakeWanted) and tries again. Ready slabs are still taken (no
  // syscall). The daemon's admissions and extends hold one around their locks (session_core.h,
  // "Locks"), so no session waits on those syscalls. A scope made inside another is the active one
  // until it ends.
  class SlabsOutsideLocks {
   public:
    struct Want {
      uint64_t owner = kNoOwner;
      uint64_t pages = 0;
    };
    SlabsOutsideLocks() : outer_(active_) { active_ = this; }
    ~SlabsOutsideLocks() { active_ = outer_; }
    SlabsOutsideLocks(const SlabsOutsideLocks&) = delete;
    SlabsOutsideLocks& operator=(const SlabsOutsideLocks&) = delete;

    // Whether an allocation in the scope wanted a slab made since the last MakeWanted.
    bool HasWant() const { return want_.has_value(); }
    // Forgets the want of the thread's active scope, if any: its call was refused after all (its
    // quota), and nothing is to be made for it.
    static void DropWant() {
      if (active_ != nullptr) active_->TakeWant();
    }
    // The active scope's want, if it has one, is to be made as `larger` (WantedLarger): a caller
    // whose first allocation of several wanted a slab has the slabs for them all made at once.
    static void WidenWant(const Want& larger) {
      if (active_ != nullptr && active_->want_.has_value()) active_->WantedLarger(larger);
    }
    // A caller that knows its whole need (a batch's items, of which an allocation wanted one):
    // MakeWanted makes `larger` instead, or the allocation's own want where the budget cannot.
    void WantedLarger(const Want& larger) { larger_ = larger; }
    // Makes the want (Prepare), outside the holder's locks, with the scope lifted meanwhile; the
    // want is taken. False when there was none.
    bool MakeWanted(PagePool& pool);
    // The owner of the last want made (kNoOwner before any), and how many wants were made.
    uint64_t made_for() const { return made_for_; }
    int made() const { return made_; }
    // From here on, allocations in the scope make slabs as they would without it (a holder that
    // has tried often enough: progress before purity).
    void Lift() { lifted_ = true; }

   private:
    friend class PagePool;
    std::optional<Want> TakeWant() {
      larger_.reset();
      return std::exchange(want_, std::nullopt);
    }
    // Whether an allocation on this thread may make a slab now; if not, it records `want`.
    static bool MayMake(const Want& want);
    inline static thread_local SlabsOutsideLocks* active_ = nullptr;
    SlabsOutsideLocks* const outer_;
    std::optional<Want> want_, larger_;
    uint64_t made_for_ = kNoOwner;
    int made_ = 0;
    bool lifted_ = false;
  };

  // One more reference to a page `owner` holds. NotFound when it holds no such page.
  absl::Status AddRef(uint64_t owner, const Page& page);
  // Drops one reference to a page `owner` holds. NotFound when it holds no such page.
  absl::Status Release(uint64_t owner, const Page& page);
  // Retires every idle slab of `owner` (all of them once it holds no page: a session's end).
  void RetireIdleOf(uint64_t owner);
  // Durable requests adopted by a new session (durability.cc): every slab of `from`, with
  // its pages, references and free pages as they are, becomes `to`'s (which may own slabs
  // already). The caller vouches that both owners are one tenant, so no byte changes hands
  // between tenants. Returns the slabs moved; InvalidArgument for owner 0 or from == to.
  absl::StatusOr<uint32_t> HandOverSlabs(uint64_t from, uint64_t to);
  // Releases every page of `pages` (each once), reporting the first error; under one lock.
  absl::Status ReleaseAll(uint64_t owner, const std::vector<Page>& pages);
  // The same for a request's pages, layer by layer.
  absl::Status ReleaseAll(uint64_t owner, const std::vector<std::vector<Page>>& layers);
  // The page's references (0: free, or not a page of a live slab).
  uint32_t RefCount(const Page& page) const;

  // A dup of the slab's memfd (the caller owns it) and its size, when `owner` owns the slab;
  // PermissionDenied for another owner's, NotFound for a slab that is gone. With `tenant` (the
  // dup leaves the daemon: the fd channel hands it to that uid's engine), the slab's retirement
  // is charged to that tenant until its memory is seen freed (RetiredBytesOf).
  absl::StatusOr<UniqueFd> DupSlabFd(uint64_t owner, uint64_t slab, uint64_t* bytes = nullptr,
                                     std::optional<uint32_t> tenant = std::nullopt);
  // A slab that left its owner (an allocation took its budget back, or RetireIdleOf) after the fd
  // channel had handed it to an engine (DupSlabFd with a tenant), which may keep it mapped while
  // idle: SessionManager tells that engine (SlabRetired) so it drops the mapping.
  struct Departure {
    uint64_t owner = kNoOwner;
    uint64_t slab = 0;
  };
  // Departures since the last call, oldest first; at most kMaxDepartures are kept (the oldest go:
  // an engine then keeps an idle mapping of a punched slab, which reads zeros, until it drops it).
  static constexpr size_t kMaxDepartures = 1 << 16;
  std::vector<Departure> TakeDepartures() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether TakeDepartures has any: a check without the lock for the callers' fast path.
  bool HasDepartures() const { return has_departures_.load(std::memory_order_acquire); }
  // Retired slabs charged to a tenant and not yet seen freed, and their charge in bytes.
  struct Retired {
    uint64_t bytes = 0;
    uint32_t slabs = 0;
  };
  Retired RetiredOf(uint32_t tenant) const;
  uint64_t RetiredBytesOf(uint32_t tenant) const { return RetiredOf(tenant).bytes; }
  // Punches the retired slabs still charged (an engine touched them again after the worker's
  // punch) once more and drops those whose memfd is empty now, with their charge. Returns how
  // many it dropped. The daemon runs it periodically (with the lease sweep); tests call it.
  size_t SweepRetired();
  // The daemon's own mapping of a page `owner` holds (page_bytes bytes; valid while the owner
  // holds a reference to it): the daemon's copies (a shared prefix's partial page) go through
  // it. NotFound when the owner holds no such page.
  absl::StatusOr<uint8_t*> PageData(uint64_t owner, const Page& page) const;
  // The daemon's own mapping of a page (for tests; valid while the page's slab is owned; null for
  // a page of no live slab).
  uint8_t* PageDataForTest(const Page& page) const;

  uint64_t page_bytes() const { return options_.page_bytes; }
  uint64_t slab_bytes() const { return options_.slab_bytes; }
  uint64_t budget_bytes() const { return options_.budget_bytes; }
  // The slabs and the referenced pages of one owner now.
  uint32_t SlabsOf(uint64_t owner) const;
  uint64_t PagesOf(uint64_t owner) const;
  // Unreferenced pages of the owner's slabs (what it can take without a new slab).
  uint64_t FreePagesOf(uint64_t owner) const;
  // Pages of other owners' idle slabs: budget an allocation of `owner` may reclaim.
  uint64_t ReclaimablePagesFor(uint64_t owner) const;
  // Slabs per owner, for the metrics.
  std::map<uint64_t, uint32_t> SlabsByOwner() const;

  Stats GetStats() const;
  // Pages tile every slab exactly (free set and reference counts agree), the counters equal
  // their sums, owners' slab lists equal the slabs' owners, and the budget adds up.
  absl::Status CheckInvariants() const;
  // Blocks until the worker has nothing left to do (scrub and populate queues empty, the reserve
  // full or the budget short). For tests and orderly shutdown.
  void WaitIdle() const;
  // For tests of a retired slab's life: while paused the worker takes no job (WaitIdle then waits
  // for the resume); `after_punch` (may be empty) runs on the worker right after each punch,
  // before the memfd is measured, as an engine touching a slab again at that moment would.
  void PauseWorkerForTest(bool paused);
  void SetAfterPunchForTest(std::function<void()> after_punch);
  // Runs on the worker, outside every lock, once a slab that left its owner is punched (its
  // memory freed): the journal drops it from the fd store (request_journal.h). Set before use.
  void SetSlabDroppedHook(std::function<void(uint64_t slab)> hook);

 private:
  // A slab's memory: shared so the worker can populate or drop it outside the lock.
  struct SlabMemory {
    UniqueFd fd;
    MappedRegion map;
    bool hugetlb = false;
    // Set under mu_ when DupSlabFd hands the memfd to a tenant's engine: the tenant its retirement
    // is charged to. Read under mu_.
    std::optional<uint32_t> charged_to;
    uint64_t id = 0;  // the slab's id once owned (0: a ready slab)
  };
  // A retired slab whose memfd still had memory after a punch: kept (the memfd, no mapping) and
  // charged to `tenant` for `held` bytes until a sweep finds it empty.
  struct Retained {
    std::shared_ptr<SlabMemory> mem;
    uint32_t tenant = 0;
    uint64_t bytes = 0;  // the slab's size
    uint64_t held = 0;   // st_blocks * 512 at the last punch: the charge
  };
  struct Slab {
    uint64_t owner = kNoOwner;
    std::shared_ptr<SlabMemory> mem;
    std::vector<uint32_t> refs;  // per page
    std::set<uint32_t> free;     // unreferenced pages, ascending
  };
  // One slab Allocate will add: a ready one taken from the reserve, or one to make of `pages`.
  struct NewSlab {
    uint32_t pages = 0;
    bool from_reserve = false;
    std::shared_ptr<SlabMemory> mem;  // set once taken from the reserve or made
  };

  explicit PagePool(const Options& options);
  // memfd + mapping of `bytes`; touched by `threads` threads (0: not touched).
  absl::StatusOr<std::shared_ptr<SlabMemory>> MakeMemory(uint64_t bytes, int threads) const;
  // The slabs an allocation of `need` more pages for `owner` takes, budget charged (making_)
  // and ready slabs taken; ResourceExhausted, with nothing changed, when the budget cannot.
  // Unavailable, with nothing changed, when the plan needs a slab made and the thread's
  // SlabsOutsideLocks forbids it (which then keeps `want`).
  absl::StatusOr<std::vector<NewSlab>> PlanSlabsLocked(uint64_t owner, uint64_t need,
                                                       const SlabsOutsideLocks::Want& want)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t FreePagesOfLocked(uint64_t owner) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  uint64_t UnallocatedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new slab of `owner`, all pages free; returns its id.
  uint64_t AddSlabLocked(uint64_t owner, std::shared_ptr<SlabMemory> mem, uint32_t pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Create's: a recovered slab, mapped, with its pages' references.
  absl::Status AdoptRecoveredLocked(RecoveredSlab slab) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Free pages right after `after` in its slab.
  uint64_t FreeAfterLocked(const Page& after) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // An owner's shard: the idleness of its slabs, under the shard's lock (with mu_ held at least
  // shared; see the top of this file).
  static constexpr size_t kShards = 16;
  struct Shard {
    absl::Mutex mu;
    std::set<uint64_t> idle ABSL_GUARDED_BY(mu);  // its owners' slabs with no referenced page
  };
  Shard& ShardOf(uint64_t owner) const { return shards_[owner % kShards]; }
  // Every shard's idle slabs, oldest (lowest id) first.
  std::vector<uint64_t> IdleSlabsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `count` free pages from `slab_ids` (the caller's new slabs, of `sh`'s owner), in order.
  void TakePagesFromLocked(Shard& sh, const std::vector<uint64_t>& slab_ids, uint32_t count, std::vector<Page>* out)
      ABSL_SHARED_LOCKS_REQUIRED(mu_) ABSL_EXCLUSIVE_LOCKS_REQUIRED(sh.mu);
  // Takes a free page of the owner of `sh` (slab, index) and references it.
  void TakePageLocked(Shard& sh, Slab& slab, uint64_t slab_id, uint32_t index, std::vector<Page>* out)
      ABSL_SHARED_LOCKS_REQUIRED(mu_) ABSL_EXCLUSIVE_LOCKS_REQUIRED(sh.mu);
  void TakePagesLocked(Shard& sh, uint64_t owner, uint32_t count, const Page* after, std::vector<Page>* out)
      ABSL_SHARED_LOCKS_REQUIRED(mu_) ABSL_EXCLUSIVE_LOCKS_REQUIRED(sh.mu);
  // Allocate's first step, from the owner's free pages: the answer (the pages, or an `after` the
  // owner does not hold; none taken without `take`), or unset when its free pages do not suffice.
  std::optional<absl::StatusOr<std::vector<Page>>> TakeFreeLocked(Shard& sh, uint64_t owner, uint32_t count,
                                                                  const Page* after, bool take)
      ABSL_SHARED_LOCKS_REQUIRED(mu_) ABSL_EXCLUSIVE_LOCKS_REQUIRED(sh.mu);
  // Unlinks a slab whose pages are all free: its budget returns, its memory joins the scrub queue.
  void RetireSlabLocked(uint64_t slab_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Slab* FindOwnedLocked(uint64_t owner, const Page& page) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // FindOwnedLocked, or NotFound naming the page.
  absl::StatusOr<Slab*> HeldSlabLocked(uint64_t owner, const Page& page) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status ReleaseLocked(Shard& sh, uint64_t owner, const Page& page) ABSL_SHARED_LOCKS_REQUIRED(mu_)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(sh.mu);
  // One try of Allocate (or, without `take`, of Prepare: the pages stay free): Aborted when another
  // allocation overtook its plan (the caller tries again).
  absl::StatusOr<std::vector<Page>> AllocateOnce(uint64_t owner, uint32_t count, const Page* after, bool take)
      ABSL_LOCKS_EXCLUDED(mu_);
  // AllocateOnce, planned again (a few times at most) while another owner's reclaim overtakes it;
  // overtaken every time, ResourceExhausted (only a spent budget makes others reclaim).
  absl::StatusOr<std::vector<Page>> AllocateRetrying(uint64_t owner, uint32_t count, const Page* after, bool take)
      ABSL_LOCKS_EXCLUDED(mu_);
  bool WantsRefillLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WorkerLoop();
  // The worker's scrub of one slab taken from scrub_ (called with mu_ held, which it drops for the
  // punch and the drop): punched, unmapped, then dropped, or kept as Retained when charged memory
  // is left.
  void ScrubOne(std::shared_ptr<SlabMemory> mem) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds `add` bytes to and takes `remove` bytes from `tenant`'s charge, and `slabs` (+1: a slab
  // retires charged; -1: one is seen freed) to its slabs; a tenant left with none is forgotten.
  void ChargeRetiredLocked(uint32_t tenant, uint64_t add, uint64_t remove, int slabs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Populates (and mlocks) memory the engine may already be writing: content-preserving only.
  void Populate(SlabMemory& mem);

  const Options options_;
  const uint32_t slab_pages_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, Slab> slabs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::vector<uint64_t>> slabs_by_owner_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<SlabMemory>> ready_ ABSL_GUARDED_BY(mu_);    // full-size, zeroed
  std::deque<std::shared_ptr<SlabMemory>> scrub_ ABSL_GUARDED_BY(mu_);     // to drop
  std::deque<std::shared_ptr<SlabMemory>> populate_ ABSL_GUARDED_BY(mu_);  // to populate
  std::vector<Retained> retained_ ABSL_GUARDED_BY(mu_);                    // punched, not yet empty
  // Charged slabs (in scrub_, being scrubbed, or in retained_) by tenant; tenants with some only.
  std::map<uint32_t, Retired> retired_by_tenant_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> punch_failed_{false};  // logged once
  std::deque<Departure> departures_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> has_departures_{false};  // !departures_.empty(), readable without mu_
  uint64_t next_slab_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t owned_bytes_ ABSL_GUARDED_BY(mu_) = 0;   // bytes of owners' slabs
  uint64_t making_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // budget charged for Allocate's slabs being made
  // The worker's reserve slab being made (0: none). An allocation short of budget may take it:
  // refill_cancelled_ then tells the worker to drop that slab instead of keeping it.
  uint64_t refill_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool refill_cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // Changed under mu_ shared and a shard's lock, or mu_ exclusively: exact whenever mu_ is held
  // exclusively (no page call runs then).
  std::atomic<uint64_t> pages_used_{0};
  std::atomic<uint64_t> pages_free_{0};
  std::atomic<uint64_t> pages_shared_{0};
  mutable std::array<Shard, kShards> shards_;
  uint64_t slabs_made_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t slabs_made_inline_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t slabs_scrubbed_ ABSL_GUARDED_BY(mu_) = 0;
  bool worker_busy_ ABSL_GUARDED_BY(mu_) = false;
  bool refill_failed_ ABSL_GUARDED_BY(mu_) = false;  // stops retrying a reserve the host cannot back
  bool hugepages_ ABSL_GUARDED_BY(mu_) = true;       // every slab made so far is hugetlb
  bool locked_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_for_test_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> after_punch_for_test_ ABSL_GUARDED_BY(mu_);
  std::function<void(uint64_t)> slab_dropped_hook_ ABSL_GUARDED_BY(mu_);
  std::thread worker_;
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_PAGE_POOL_H_
