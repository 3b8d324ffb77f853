// ExtentAllocator: hands out aligned, contiguous byte ranges ("extents") of one region.
//
// The daemon gives each admitted request, per layer, one contiguous run of records in a host
// pool segment, because GPU threads gather scattered records at near link speed only when one
// step's records lie within a bounded host range (docs/ARCHITECTURE.md). This class does the
// bookkeeping for one such region: it knows offsets only and never touches memory.
//
// Policy: best fit (the smallest free extent that fits; ties go to the lowest offset), which
// keeps large extents whole for large requests. Sizes round up to `alignment`. A freed extent
// merges with free neighbours at once, so free extents are never adjacent and
// largest_free_extent() is the true answer to "what is the largest request that can succeed".
//
// Cost: Allocate, Free and TryGrowInPlace are O(log n) in the number of extents; the accessors
// are O(1) (CheckInvariants is O(n), for tests and debug builds).
//
// Thread-safety: none. The owner (a host pool) serialises calls under its own lock.
// Copyable and movable; a copy is an independent allocator with the same state.
#ifndef HISPARSE_DAEMON_EXTENT_ALLOCATOR_H_
#define HISPARSE_DAEMON_EXTENT_ALLOCATOR_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hisparse {

class ExtentAllocator {
 public:
  // Validates the arguments: `alignment` must be a non-zero power of two. A `capacity` that is
  // not a multiple of `alignment` is rounded down (the tail could never be handed out whole).
  static absl::StatusOr<ExtentAllocator> Create(uint64_t capacity, uint64_t alignment);

  // As Create, for arguments the caller knows to be valid (constants, already-validated config).
  // Precondition: `alignment` is a non-zero power of two (asserted in debug builds; otherwise an
  // invalid alignment is replaced by 1).
  ExtentAllocator(uint64_t capacity, uint64_t alignment);

  // Reserves `bytes` rounded up to alignment() and returns its offset; the offset is a
  // multiple of alignment(). Errors, with nothing changed:
  //   InvalidArgument   bytes == 0.
  //   ResourceExhausted no free extent is large enough. The message gives the requested bytes,
  //                     the free bytes and the largest free extent, and says "fragmented" when
  //                     enough bytes are free in total but not in one piece.
  absl::StatusOr<uint64_t> Allocate(uint64_t bytes);

  // Releases the allocation that starts at `offset`, merging it with free neighbours. Errors,
  // with nothing changed:
  //   FailedPrecondition `offset` lies in free space (typically a double free).
  //   NotFound           no allocation starts at `offset` (inside another allocation, or
  //                      beyond the capacity).
  // A double free is caught only while the range stays free: once it has been handed out again
  // the offset names the new owner's allocation (callers own their offsets; see the host pool).
  absl::Status Free(uint64_t offset);

  // Grows the allocation at `offset` to `new_bytes` (rounded up to alignment()) by taking the
  // front of the free extent that follows it, so the records stay contiguous and keep their
  // offset. Returns true when the allocation is now at least that large (also when it already
  // was: allocations never shrink here); false, with nothing changed, when `offset` is not the
  // start of an allocation or the space right after it is not free or not large enough.
  bool TryGrowInPlace(uint64_t offset, uint64_t new_bytes);
  // Shrinks an allocation to new_bytes (rounded up to the alignment); the tail becomes free and
  // coalesces. Undoes TryGrowInPlace when a later step of the same change fails.
  absl::Status ShrinkInPlace(uint64_t offset, uint64_t new_bytes);

  // The size (rounded to alignment) of the allocation that starts at `offset`, if any.
  std::optional<uint64_t> allocation_size(uint64_t offset) const;

  uint64_t capacity() const { return capacity_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t used_bytes() const { return used_bytes_; }
  uint64_t free_bytes() const { return capacity_ - used_bytes_; }
  uint64_t largest_free_extent() const;
  size_t free_extent_count() const { return free_by_offset_.size(); }
  size_t allocation_count() const { return allocations_.size(); }

  // 1 - largest_free_extent / free_bytes: 0 when all free space is one extent (or nothing is
  // free), approaching 1 when free space is scattered in small pieces.
  double fragmentation() const;

  // Checks every structural invariant and says which one broke: free extents are aligned,
  // non-empty, sorted, neither overlapping nor adjacent (fully coalesced), and agree with the
  // by-size index; allocations are aligned and disjoint from each other and from free extents;
  // together they tile [0, capacity) exactly, so used + free == capacity. Returns Internal.
  absl::Status CheckInvariants() const;

 private:
  void InsertFree(uint64_t offset, uint64_t size);
  void EraseFree(std::map<uint64_t, uint64_t>::iterator it);
  uint64_t RoundUp(uint64_t bytes) const { return (bytes + alignment_ - 1) & ~(alignment_ - 1); }

  uint64_t capacity_;
  uint64_t alignment_;
  uint64_t used_bytes_ = 0;
  // Free extents by offset (offset -> size), for coalescing and growth.
  std::map<uint64_t, uint64_t> free_by_offset_;
  // The same extents as (size, offset): lower_bound({n, 0}) is the best fit for n bytes.
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_;
  // Live allocations, offset -> rounded size.
  std::map<uint64_t, uint64_t> allocations_;
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_EXTENT_ALLOCATOR_H_
