// HostPool: the node's host KV memory, the authoritative home of every request's records.
//
// The pool is a set of equal segments, each one memfd (huge pages when the host has them reserved)
// mapped into the daemon and pre-touched in parallel at start, so that no page fault lands in an
// engine's decode step. Each segment has an ExtentAllocator that hands out contiguous runs: a
// request gets one run per layer, because GPU threads gathering records reach the link's
// bandwidth only when one step's records lie within a bounded host range (FACTS.md).
//
// Isolation: a segment belongs to at most one owner (a session) at a time, and the owner's engine
// maps exactly the segments it owns (their fds travel over the fd channel). A segment returns to
// the free list when its last run is freed. A claim prefers a segment the owner used last, then
// one never used; a segment that passes to a different owner gets a fresh memfd first, so that a
// mapping the previous engine may still hold can never reach the next tenant's records.
//
// Capacity note: since segments are exclusive, at most `segment_count` sessions hold memory at
// once; size host_pool.segment_size so that the pool has several segments per expected session.
//
// Not thread-safe: SessionManager owns the pool and serializes every call under its mutex.
#ifndef HISPARSE_DAEMON_HOST_POOL_H_
#define HISPARSE_DAEMON_HOST_POOL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/daemon/extent_allocator.h"

namespace hisparse {

class HostPool {
 public:
  enum class Hugepages { kAuto, kOn, kOff };
  struct Options {
    uint64_t size_bytes = 1ull << 30;
    uint64_t segment_bytes = 256ull << 20;  // the last segment may be smaller
    Hugepages hugepages = Hugepages::kAuto;
    int pretouch_threads = 0;  // 0: one per CPU
    bool mlock = false;        // lock pages in RAM (needs LimitMEMLOCK)
  };
  // One contiguous run of a segment.
  struct Run {
    uint32_t segment = 0;
    uint64_t offset = 0;
    uint64_t bytes = 0;
  };
  struct Stats {
    uint64_t capacity_bytes = 0, used_bytes = 0, free_bytes = 0, largest_free_run = 0;
    uint64_t sum_largest_free_per_segment = 0;
    uint32_t segments = 0, segments_in_use = 0;
    uint64_t segment_bytes = 0;
    bool hugepages = false, locked = false;
    double pretouch_seconds = 0;
    // The share of free bytes that are not part of their segment's largest free run: 0 when
    // every segment's free space is one run. (Segments bound a run anyway, so the pool-wide
    // largest run would call a pool of empty segments fragmented.)
    double fragmentation() const {
      return free_bytes == 0 ? 0.0 : 1.0 - static_cast<double>(sum_largest_free_per_segment) / free_bytes;
    }
  };
  static constexpr uint64_t kNoOwner = 0;
  static constexpr uint64_t kRunAlignment = 256;

  // Creates, maps and pre-touches every segment. Fails with a message when memory is short.
  static absl::StatusOr<std::unique_ptr<HostPool>> Create(const Options& options);
  ~HostPool();

  // One run of `bytes` for `owner` (non-zero): from a segment the owner holds (best fit), else,
  // when `may_claim`, from a free segment (`*claimed`, if given, tells which it was).
  // ResourceExhausted when nothing fits; InvalidArgument when `bytes` exceeds a segment.
  // Run::bytes is what the run holds: `bytes` rounded up to kRunAlignment (HeldBytes).
  absl::StatusOr<Run> Allocate(uint64_t owner, uint64_t bytes, bool may_claim = true, bool* claimed = nullptr);
  // Frees a run of `owner`. NotFound when it is not one; nothing changes then.
  absl::Status Free(uint64_t owner, const Run& run);
  // Grows a run in place (to HeldBytes(new_bytes)); false when the bytes after it are taken.
  bool TryGrow(uint64_t owner, Run& run, uint64_t new_bytes);
  // Shrinks a run in place (undoes TryGrow when a later step of the same change fails).
  absl::Status Shrink(uint64_t owner, Run& run, uint64_t new_bytes);

  // Copies the first `bytes` of run `from` to run `to`, both of `owner` (Extend, when a run moves).
  // The source is read with pread from its memfd into the daemon's mapping of the destination, so
  // memory the owner's engine damaged through its descriptors (a hole punched in a hugetlb segment
  // the host then has no huge page to refill) fails the copy, with DataLoss, instead of faulting
  // the daemon: a syscall sees such a fault as EFAULT where a memcpy would take SIGBUS.
  absl::Status CopyRun(uint64_t owner, const Run& from, const Run& to, uint64_t bytes);
  // CopyRun in two steps, so that the copy can run outside the owner's lock: PlanCopy checks the
  // runs and names the source descriptor and destination bytes; ExecuteCopy, which touches no pool
  // state, copies. The plan stays valid while both runs stay allocated to `owner`.
  struct CopyPlan {
    int src_fd = -1;
    uint64_t src_offset = 0;
    uint8_t* dst = nullptr;
    uint64_t bytes = 0;
    uint32_t from_segment = 0, to_segment = 0;
  };
  absl::StatusOr<CopyPlan> PlanCopy(uint64_t owner, const Run& from, const Run& to, uint64_t bytes) const;
  static absl::Status ExecuteCopy(const CopyPlan& plan);

  // The daemon's own mapping of a segment (for tests).
  uint8_t* SegmentData(uint32_t segment) const;
  // The segment's memfd, borrowed, when `owner` owns it; PermissionDenied otherwise.
  absl::StatusOr<int> SegmentFdFor(uint64_t owner, uint32_t segment) const;
  uint64_t segment_bytes() const { return options_.segment_bytes; }
  // What a run of `bytes` holds once allocated.
  static uint64_t HeldBytes(uint64_t bytes) { return (bytes + kRunAlignment - 1) / kRunAlignment * kRunAlignment; }
  // The segments `owner` holds now (O(1)).
  uint32_t SegmentsOf(uint64_t owner) const;
  // One segment as admission planning sees it.
  struct SegmentState {
    uint64_t owner = kNoOwner, capacity = 0, free_bytes = 0;
  };
  SegmentState GetSegment(uint32_t segment) const;
  uint32_t segment_count() const { return static_cast<uint32_t>(segments_.size()); }

  Stats GetStats() const;
  // used = sum of live runs, every segment's allocator consistent, owners consistent.
  absl::Status CheckInvariants() const;

 private:
  struct Segment {
    UniqueFd fd;
    MappedRegion map;
    std::unique_ptr<ExtentAllocator> runs;
    uint64_t owner = kNoOwner;
    uint64_t last_owner = kNoOwner;
  };
  explicit HostPool(const Options& options) : options_(options) {}
  // New memfd + mapping for `s`; pre-touched by `threads` threads (0: not pre-touched).
  absl::Status MakeSegmentMemory(Segment& s, uint64_t bytes, int threads, bool* hugetlb);
  absl::Status CheckRun(uint64_t owner, const Run& run) const;

  Options options_;
  std::vector<Segment> segments_;
  std::unordered_map<uint64_t, uint32_t> segments_by_owner_;  // owners with at least one segment
  bool hugepages_ = false;
  bool locked_ = false;
  double pretouch_seconds_ = 0;
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_HOST_POOL_H_
