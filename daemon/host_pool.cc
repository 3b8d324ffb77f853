#include "hisparse/daemon/host_pool.h"

#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <system_error>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "hisparse/common/log.h"
#include "hisparse/common/size_parse.h"
#include "hisparse/common/status_macros.h"

namespace hisparse {
namespace {

// Writes every page of [data, data+bytes) using `threads` threads, so the kernel backs the whole
// range now rather than in an engine's decode step. Zero is what a fresh memfd reads as anyway.
void PretouchParallel(uint8_t* data, uint64_t bytes, int threads) {
  constexpr uint64_t kPage = 4096;
  const uint64_t chunk = std::max<uint64_t>(kPage, (bytes / threads + kPage - 1) / kPage * kPage);
  auto touch = [data](uint64_t begin, uint64_t end) {
    for (uint64_t off = begin; off < end; off += kPage) data[off] = 0;
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

int ResolveThreads(int requested) {
  if (requested > 0) return requested;
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostPool>> HostPool::Create(const Options& options) {
  if (options.size_bytes == 0) return absl::InvalidArgumentError("host pool size must be > 0");
  if (options.segment_bytes < (1u << 20) || options.segment_bytes % kRunAlignment != 0) {
    return absl::InvalidArgumentError("host pool segment size must be >= 1 MiB and a multiple of 256");
  }
  std::unique_ptr<HostPool> pool(new HostPool(options));
  const auto start = std::chrono::steady_clock::now();
  const uint64_t n = (options.size_bytes + options.segment_bytes - 1) / options.segment_bytes;
  pool->segments_.resize(n);
  const int threads = ResolveThreads(options.pretouch_threads);
  bool all_huge = true;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t bytes = std::min(options.segment_bytes, options.size_bytes - i * options.segment_bytes);
    bool huge = false;
    HS_RETURN_IF_ERROR(pool->MakeSegmentMemory(pool->segments_[i], bytes, threads, &huge));
    all_huge &= huge;
  }
  pool->hugepages_ = all_huge;
  if (options.hugepages == Hugepages::kOn && !all_huge) {
    return absl::FailedPreconditionError(
        "host_pool.hugepages is on but the host has too few huge pages reserved (vm.nr_hugepages)");
  }
  if (options.mlock) {
    pool->locked_ = true;
    for (Segment& s : pool->segments_) {
      if (::mlock(s.map.data(), s.map.size()) != 0) {
        pool->locked_ = false;
        LOG(WARNING) << "mlock of the host pool failed (raise LimitMEMLOCK): pages may be swapped";
        break;
      }
    }
  }
  pool->pretouch_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  LOG(INFO) << "host pool ready: " << FormatByteSize(options.size_bytes) << " in " << n << " segments of "
            << FormatByteSize(options.segment_bytes) << ", huge pages " << (all_huge ? "yes" : "no")
            << ", pre-touched by " << threads << " threads in " << pool->pretouch_seconds_ << " s";
  return pool;
}

HostPool::~HostPool() = default;

absl::Status HostPool::MakeSegmentMemory(Segment& s, uint64_t bytes, int threads, bool* hugetlb) {
  const bool try_huge = options_.hugepages != Hugepages::kOff;
  HS_ASSIGN_OR_RETURN(UniqueFd fd, CreateMemfd("hisparse-pool", bytes, try_huge, hugetlb));
  HS_ASSIGN_OR_RETURN(MappedRegion map, MappedRegion::MapShared(fd.get(), bytes));
  if (!*hugetlb) ::madvise(map.data(), bytes, MADV_HUGEPAGE);  // transparent huge pages, if shmem allows
  if (threads > 0) PretouchParallel(map.data(), bytes, threads);
  s.fd = std::move(fd);
  s.map = std::move(map);
  s.runs = std::make_unique<ExtentAllocator>(bytes, kRunAlignment);
  return absl::OkStatus();
}

absl::StatusOr<HostPool::Run> HostPool::Allocate(uint64_t owner, uint64_t bytes, bool may_claim, bool* claimed) {
  if (claimed != nullptr) *claimed = false;
  if (owner == kNoOwner) return absl::InvalidArgumentError("run owner must be non-zero");
  if (bytes == 0) return absl::InvalidArgumentError("cannot allocate an empty run");
  if (bytes > options_.segment_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a run of ", bytes, " bytes exceeds the pool's segment size (",
                                                   options_.segment_bytes, " bytes)"));
  }
  // 1. Best fit among the owner's segments keeps its records together and other segments free.
  int best = -1;
  uint64_t best_free = 0;
  for (size_t i = 0; i < segments_.size(); ++i) {
    const Segment& s = segments_[i];
    if (s.owner != owner || s.runs->largest_free_extent() < bytes) continue;
    if (best < 0 || s.runs->largest_free_extent() < best_free) {
      best = static_cast<int>(i);
      best_free = s.runs->largest_free_extent();
    }
  }
  // 2. Else a free segment: one this owner used last, else one nobody has used since it was made
  // (neither needs new memory), else any free one, which gets fresh memory first.
  const bool claiming = best < 0 && may_claim;
  if (claiming) {
    int rank_best = 3;
    for (size_t i = 0; i < segments_.size(); ++i) {
      const Segment& s = segments_[i];
      if (s.owner != kNoOwner || s.runs->capacity() < bytes) continue;
      const int rank = s.last_owner == owner ? 0 : s.last_owner == kNoOwner ? 1 : 2;
      if (rank < rank_best) {
        rank_best = rank;
        best = static_cast<int>(i);
        if (rank == 0) break;
      }
    }
    if (best >= 0) {
      Segment& s = segments_[best];
      if (rank_best == 2) {
        // Scrub by replacement: the previous engine may still map the old memfd. The fresh one is
        // not pre-touched here (that would stall every session behind this lock); the engine's
        // cudaHostRegister populates it when it maps the segment.
        bool huge = false;
        HS_RETURN_IF_ERROR(MakeSegmentMemory(s, s.map.size(), /*threads=*/0, &huge));
      }
      s.owner = owner;
      s.last_owner = owner;
      ++segments_by_owner_[owner];
    }
  }
  if (best < 0) {
    const Stats st = GetStats();
    return absl::ResourceExhaustedError(absl::StrCat(
        "host pool cannot hold a run of ", bytes, " bytes: ", st.free_bytes, " bytes free in all, ",
        may_claim ? "no free segment" : "no segment it may claim", " and no room in this session's segments"));
  }
  Segment& s = segments_[best];
  auto offset = s.runs->Allocate(bytes);
  if (!offset.ok()) return offset.status();
  if (claimed != nullptr) *claimed = claiming;
  // The run records what it holds: the allocator's rounded size, which is what is charged.
  return Run{static_cast<uint32_t>(best), *offset, s.runs->allocation_size(*offset).value_or(bytes)};
}

absl::Status HostPool::CheckRun(uint64_t owner, const Run& run) const {
  if (run.segment >= segments_.size() || segments_[run.segment].owner != owner || owner == kNoOwner) {
    return absl::NotFoundError(absl::StrCat("no run of this owner in segment ", run.segment));
  }
  return absl::OkStatus();
}

absl::Status HostPool::Free(uint64_t owner, const Run& run) {
  HS_RETURN_IF_ERROR(CheckRun(owner, run));
  Segment& s = segments_[run.segment];
  HS_RETURN_IF_ERROR(s.runs->Free(run.offset));
  if (s.runs->allocation_count() == 0) {
    if (--segments_by_owner_[owner] == 0) segments_by_owner_.erase(owner);
    s.owner = kNoOwner;
  }
  return absl::OkStatus();
}

uint32_t HostPool::SegmentsOf(uint64_t owner) const {
  auto it = segments_by_owner_.find(owner);
  return it == segments_by_owner_.end() ? 0 : it->second;
}

HostPool::SegmentState HostPool::GetSegment(uint32_t segment) const {
  if (segment >= segments_.size()) return {};
  const Segment& s = segments_[segment];
  return SegmentState{s.owner, s.runs->capacity(), s.runs->free_bytes()};
}

bool HostPool::TryGrow(uint64_t owner, Run& run, uint64_t new_bytes) {
  if (!CheckRun(owner, run).ok()) return false;
  ExtentAllocator& runs = *segments_[run.segment].runs;
  if (!runs.TryGrowInPlace(run.offset, new_bytes)) return false;
  run.bytes = runs.allocation_size(run.offset).value_or(new_bytes);
  return true;
}

absl::Status HostPool::Shrink(uint64_t owner, Run& run, uint64_t new_bytes) {
  HS_RETURN_IF_ERROR(CheckRun(owner, run));
  ExtentAllocator& runs = *segments_[run.segment].runs;
  HS_RETURN_IF_ERROR(runs.ShrinkInPlace(run.offset, new_bytes));
  run.bytes = runs.allocation_size(run.offset).value_or(new_bytes);
  return absl::OkStatus();
}

absl::Status HostPool::CopyRun(uint64_t owner, const Run& from, const Run& to, uint64_t bytes) {
  HS_ASSIGN_OR_RETURN(const CopyPlan plan, PlanCopy(owner, from, to, bytes));
  return ExecuteCopy(plan);
}

absl::StatusOr<HostPool::CopyPlan> HostPool::PlanCopy(uint64_t owner, const Run& from, const Run& to,
                                                      uint64_t bytes) const {
  HS_RETURN_IF_ERROR(CheckRun(owner, from));
  HS_RETURN_IF_ERROR(CheckRun(owner, to));
  if (bytes > from.bytes || bytes > to.bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a copy of ", bytes, " bytes exceeds its runs (", from.bytes, " and ", to.bytes, " bytes)"));
  }
  return CopyPlan{segments_[from.segment].fd.get(),
                  from.offset,
                  segments_[to.segment].map.data() + to.offset,
                  bytes,
                  from.segment,
                  to.segment};
}

absl::Status HostPool::ExecuteCopy(const CopyPlan& plan) {
  for (uint64_t done = 0; done < plan.bytes;) {
    const ssize_t n =
        ::pread(plan.src_fd, plan.dst + done, plan.bytes - done, static_cast<off_t>(plan.src_offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::DataLossError(absl::StrCat("moving a run from segment ", plan.from_segment, " to segment ",
                                              plan.to_segment, " failed after ", done, " of ", plan.bytes, " bytes (",
                                              n < 0 ? std::strerror(errno) : "end of segment",
                                              "): the engine holding them may have removed their pages"));
    }
    done += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

uint8_t* HostPool::SegmentData(uint32_t segment) const {
  return segment < segments_.size() ? segments_[segment].map.data() : nullptr;
}

absl::StatusOr<int> HostPool::SegmentFdFor(uint64_t owner, uint32_t segment) const {
  if (segment >= segments_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("no segment ", segment, " (the pool has ", segments_.size(), ")"));
  }
  if (owner == kNoOwner || segments_[segment].owner != owner) {
    return absl::PermissionDeniedError(absl::StrCat("segment ", segment, " does not belong to this session"));
  }
  return segments_[segment].fd.get();
}

HostPool::Stats HostPool::GetStats() const {
  Stats st;
  st.segments = static_cast<uint32_t>(segments_.size());
  st.segment_bytes = options_.segment_bytes;
  st.hugepages = hugepages_;
  st.locked = locked_;
  st.pretouch_seconds = pretouch_seconds_;
  for (const Segment& s : segments_) {
    st.capacity_bytes += s.runs->capacity();
    st.used_bytes += s.runs->used_bytes();
    st.free_bytes += s.runs->free_bytes();
    st.largest_free_run = std::max(st.largest_free_run, s.runs->largest_free_extent());
    st.sum_largest_free_per_segment += s.runs->largest_free_extent();
    if (s.owner != kNoOwner) ++st.segments_in_use;
  }
  return st;
}

absl::Status HostPool::CheckInvariants() const {
  std::unordered_map<uint64_t, uint32_t> by_owner;
  for (const Segment& s : segments_) {
    if (s.owner != kNoOwner) ++by_owner[s.owner];
  }
  if (by_owner != segments_by_owner_) return absl::InternalError("per-owner segment counts disagree with segments");
  for (size_t i = 0; i < segments_.size(); ++i) {
    const Segment& s = segments_[i];
    HS_RETURN_IF_ERROR(s.runs->CheckInvariants());
    if ((s.owner == kNoOwner) != (s.runs->allocation_count() == 0)) {
      return absl::InternalError(absl::StrCat("segment ", i, ": owner and allocations disagree"));
    }
  }
  return absl::OkStatus();
}

}  // namespace hisparse
