#include "hisparse/daemon/extent_allocator.h"

#include <algorithm>
#include <cassert>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace hisparse {
namespace {

bool IsPowerOfTwo(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

}  // namespace

absl::StatusOr<ExtentAllocator> ExtentAllocator::Create(uint64_t capacity, uint64_t alignment) {
  if (!IsPowerOfTwo(alignment)) {
    return absl::InvalidArgumentError(absl::StrCat("extent alignment must be a power of two, got ", alignment));
  }
  return ExtentAllocator(capacity, alignment);
}

ExtentAllocator::ExtentAllocator(uint64_t capacity, uint64_t alignment)
    : alignment_(IsPowerOfTwo(alignment) ? alignment : 1) {
  assert(IsPowerOfTwo(alignment));
  capacity_ = capacity & ~(alignment_ - 1);
  if (capacity_ > 0) InsertFree(0, capacity_);
}

void ExtentAllocator::InsertFree(uint64_t offset, uint64_t size) {
  free_by_offset_.emplace(offset, size);
  free_by_size_.emplace(size, offset);
}

void ExtentAllocator::EraseFree(std::map<uint64_t, uint64_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_by_offset_.erase(it);
}

absl::StatusOr<uint64_t> ExtentAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("cannot allocate an extent of 0 bytes");
  if (bytes > capacity_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes: the region holds only ", capacity_));
  }
  // bytes <= capacity_, a multiple of alignment_, so RoundUp cannot overflow.
  const uint64_t size = RoundUp(bytes);
  auto fit = free_by_size_.lower_bound({size, 0});
  if (fit == free_by_size_.end()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes (", size, " aligned): ", free_bytes(), " of ", capacity_,
                     " bytes free, largest free extent ", largest_free_extent(), " bytes",
                     free_bytes() >= size ? " (enough space in total, but fragmented)" : ""));
  }
  const uint64_t offset = fit->second;
  const uint64_t extent = fit->first;
  EraseFree(free_by_offset_.find(offset));
  if (extent > size) InsertFree(offset + size, extent - size);
  allocations_.emplace(offset, size);
  used_bytes_ += size;
  return offset;
}

absl::Status ExtentAllocator::Free(uint64_t offset) {
  auto alloc = allocations_.find(offset);
  if (alloc == allocations_.end()) {
    // Say where the offset lies, so a caller's bug report points at the cause.
    auto free_after = free_by_offset_.upper_bound(offset);
    if (free_after != free_by_offset_.begin()) {
      auto free_at = std::prev(free_after);
      if (offset < free_at->first + free_at->second) {
        return absl::FailedPreconditionError(
            absl::StrCat("offset ", offset, " is not allocated: it lies in the free extent [", free_at->first, ", ",
                         free_at->first + free_at->second, ") (double free?)"));
      }
    }
    auto alloc_after = allocations_.upper_bound(offset);
    if (alloc_after != allocations_.begin()) {
      auto owner = std::prev(alloc_after);
      if (offset < owner->first + owner->second) {
        return absl::NotFoundError(absl::StrCat("no allocation starts at offset ", offset,
                                                ": it lies inside the allocation at ", owner->first, " of ",
                                                owner->second, " bytes"));
      }
    }
    return absl::NotFoundError(absl::StrCat("no allocation starts at offset ", offset, " (capacity ", capacity_, ")"));
  }

  uint64_t start = alloc->first;
  uint64_t size = alloc->second;
  used_bytes_ -= size;
  allocations_.erase(alloc);

  // Merge with the free extent that starts right at our end, then the one that ends at our start.
  auto next = free_by_offset_.lower_bound(start);
  if (next != free_by_offset_.end() && next->first == start + size) {
    size += next->second;
    auto after = std::next(next);
    EraseFree(next);
    next = after;
  }
  if (next != free_by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      EraseFree(prev);
    }
  }
  InsertFree(start, size);
  return absl::OkStatus();
}

bool ExtentAllocator::TryGrowInPlace(uint64_t offset, uint64_t new_bytes) {
  auto alloc = allocations_.find(offset);
  if (alloc == allocations_.end()) return false;
  if (new_bytes <= alloc->second) return true;
  if (new_bytes > capacity_ - offset) return false;  // also keeps RoundUp from overflowing
  const uint64_t need = RoundUp(new_bytes) - alloc->second;
  auto next = free_by_offset_.find(offset + alloc->second);
  if (next == free_by_offset_.end() || next->second < need) return false;
  const uint64_t rest_offset = next->first + need;
  const uint64_t rest_size = next->second - need;
  EraseFree(next);
  if (rest_size > 0) InsertFree(rest_offset, rest_size);
  alloc->second += need;
  used_bytes_ += need;
  return true;
}

absl::Status ExtentAllocator::ShrinkInPlace(uint64_t offset, uint64_t new_bytes) {
  auto alloc = allocations_.find(offset);
  if (alloc == allocations_.end()) {
    return absl::NotFoundError(absl::StrCat("no allocation starts at offset ", offset));
  }
  if (new_bytes == 0) return absl::InvalidArgumentError("cannot shrink an allocation to 0 bytes");
  const uint64_t keep = RoundUp(new_bytes);
  if (keep >= alloc->second) return absl::OkStatus();
  // The released tail becomes free space, merged with a free extent right after it.
  uint64_t tail_offset = offset + keep;
  uint64_t tail_size = alloc->second - keep;
  auto next = free_by_offset_.find(offset + alloc->second);
  if (next != free_by_offset_.end()) {
    tail_size += next->second;
    EraseFree(next);
  }
  InsertFree(tail_offset, tail_size);
  used_bytes_ -= alloc->second - keep;
  alloc->second = keep;
  return absl::OkStatus();
}

std::optional<uint64_t> ExtentAllocator::allocation_size(uint64_t offset) const {
  auto it = allocations_.find(offset);
  if (it == allocations_.end()) return std::nullopt;
  return it->second;
}

uint64_t ExtentAllocator::largest_free_extent() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

double ExtentAllocator::fragmentation() const {
  const uint64_t free = free_bytes();
  if (free == 0) return 0.0;
  return 1.0 - static_cast<double>(largest_free_extent()) / static_cast<double>(free);
}

absl::Status ExtentAllocator::CheckInvariants() const {
  auto broken = [](auto&&... parts) {
    return absl::InternalError(absl::StrCat("extent allocator invariant broken: ", parts...));
  };
  if (free_by_offset_.size() != free_by_size_.size()) {
    return broken(free_by_offset_.size(), " free extents by offset but ", free_by_size_.size(), " by size");
  }
  uint64_t free_sum = 0;
  uint64_t prev_end = 0;
  bool first = true;
  for (const auto& [offset, size] : free_by_offset_) {
    if (size == 0) return broken("empty free extent at ", offset);
    if (offset % alignment_ != 0 || size % alignment_ != 0) {
      return broken("free extent [", offset, ", +", size, ") is not aligned to ", alignment_);
    }
    if (!first && offset < prev_end) return broken("free extents overlap at ", offset);
    if (!first && offset == prev_end) return broken("free extents adjacent at ", offset, " (not coalesced)");
    if (free_by_size_.count({size, offset}) == 0) {
      return broken("free extent [", offset, ", +", size, ") missing from the by-size index");
    }
    free_sum += size;
    prev_end = offset + size;
    first = false;
  }

  uint64_t used_sum = 0;
  for (const auto& [offset, size] : allocations_) {
    if (size == 0 || offset % alignment_ != 0 || size % alignment_ != 0) {
      return broken("allocation [", offset, ", +", size, ") is empty or not aligned");
    }
    used_sum += size;
  }
  if (used_sum != used_bytes_) return broken("used_bytes ", used_bytes_, " != sum of allocations ", used_sum);

  // Walk both maps in offset order: together they must tile [0, capacity) with no gap or overlap.
  // That one check gives disjointness and used + free == capacity.
  auto f = free_by_offset_.begin();
  auto a = allocations_.begin();
  uint64_t cursor = 0;
  while (f != free_by_offset_.end() || a != allocations_.end()) {
    const bool take_free = a == allocations_.end() || (f != free_by_offset_.end() && f->first < a->first);
    const auto& [offset, size] = take_free ? *f : *a;
    if (offset != cursor) {
      return broken(offset < cursor ? "overlap" : "gap", " at ", std::min(offset, cursor), " (",
                    take_free ? "free extent" : "allocation", " at ", offset, ")");
    }
    cursor = offset + size;
    if (take_free) {
      ++f;
    } else {
      ++a;
    }
  }
  if (cursor != capacity_) return broken("extents end at ", cursor, ", capacity is ", capacity_);
  if (used_sum + free_sum != capacity_) {
    return broken("used ", used_sum, " + free ", free_sum, " != capacity ", capacity_);
  }
  return absl::OkStatus();
}

}  // namespace hisparse
