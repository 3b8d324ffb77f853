#include "hisparse/daemon/extent_allocator.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hisparse {
namespace extent_allocator_test {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kA = 4096;  // alignment used by most tests

uint64_t MustAllocate(ExtentAllocator& a, uint64_t bytes) {
  absl::StatusOr<uint64_t> offset = a.Allocate(bytes);
  EXPECT_TRUE(offset.ok()) << offset.status();
  EXPECT_TRUE(a.CheckInvariants().ok()) << a.CheckInvariants();
  return offset.value_or(~uint64_t{0});
}

void MustFree(ExtentAllocator& a, uint64_t offset) {
  EXPECT_TRUE(a.Free(offset).ok());
  EXPECT_TRUE(a.CheckInvariants().ok()) << a.CheckInvariants();
}

TEST(ExtentAllocatorTest, StartsAsOneFreeExtent) {
  ExtentAllocator a(64 * kA, kA);
  EXPECT_EQ(a.capacity(), 64 * kA);
  EXPECT_EQ(a.alignment(), kA);
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.free_bytes(), 64 * kA);
  EXPECT_EQ(a.largest_free_extent(), 64 * kA);
  EXPECT_EQ(a.free_extent_count(), 1u);
  EXPECT_EQ(a.allocation_count(), 0u);
  EXPECT_EQ(a.fragmentation(), 0.0);
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST(ExtentAllocatorTest, CreateValidatesAlignmentAndRoundsCapacityDown) {
  EXPECT_EQ(ExtentAllocator::Create(1 << 20, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ExtentAllocator::Create(1 << 20, 3000).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<ExtentAllocator> a = ExtentAllocator::Create(10 * kA + 100, kA);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->capacity(), 10 * kA);
  EXPECT_TRUE(a->CheckInvariants().ok());
}

TEST(ExtentAllocatorTest, ZeroCapacityIsAlwaysExhausted) {
  ExtentAllocator a(kA - 1, kA);
  EXPECT_EQ(a.capacity(), 0u);
  EXPECT_EQ(a.free_extent_count(), 0u);
  EXPECT_EQ(a.Allocate(1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST(ExtentAllocatorTest, AllocatesAlignedRoundedExtents) {
  ExtentAllocator a(64 * kA, kA);
  const uint64_t x = MustAllocate(a, 1);
  const uint64_t y = MustAllocate(a, kA + 1);
  EXPECT_EQ(x, 0u);
  EXPECT_EQ(y, kA);
  EXPECT_EQ(a.allocation_size(x), kA);
  EXPECT_EQ(a.allocation_size(y), 2 * kA);
  EXPECT_EQ(a.allocation_size(kA * 7), std::nullopt);
  EXPECT_EQ(a.used_bytes(), 3 * kA);
  EXPECT_EQ(a.free_bytes(), 61 * kA);
  EXPECT_EQ(a.allocation_count(), 2u);
}

TEST(ExtentAllocatorTest, ZeroBytesIsInvalid) {
  ExtentAllocator a(64 * kA, kA);
  EXPECT_EQ(a.Allocate(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.used_bytes(), 0u);
}

TEST(ExtentAllocatorTest, AlignmentOneIsByteGranular) {
  ExtentAllocator a(10, 1);
  EXPECT_EQ(MustAllocate(a, 3), 0u);
  EXPECT_EQ(MustAllocate(a, 7), 3u);
  EXPECT_EQ(a.free_bytes(), 0u);
  EXPECT_EQ(a.fragmentation(), 0.0);  // nothing free: defined as 0
}

TEST(ExtentAllocatorTest, ExhaustionWhenFull) {
  ExtentAllocator a(4 * kA, kA);
  MustAllocate(a, 4 * kA);
  absl::StatusOr<uint64_t> r = a.Allocate(1);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string msg(r.status().message());
  EXPECT_THAT(msg, HasSubstr("cannot allocate 1 bytes (4096 aligned)"));
  EXPECT_THAT(msg, HasSubstr("0 of 16384 bytes free, largest free extent 0 bytes"));
  EXPECT_THAT(msg, Not(HasSubstr("fragmented")));
}

TEST(ExtentAllocatorTest, ExhaustionWhenLargerThanCapacity) {
  ExtentAllocator a(4 * kA, kA);
  absl::StatusOr<uint64_t> r = a.Allocate(~uint64_t{0});  // RoundUp would overflow
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("holds only 16384"));
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST(ExtentAllocatorTest, ExhaustionSaysFragmented) {
  ExtentAllocator a(4 * kA, kA);
  const uint64_t x0 = MustAllocate(a, kA);
  MustAllocate(a, kA);
  const uint64_t x2 = MustAllocate(a, kA);
  MustAllocate(a, kA);
  MustFree(a, x0);
  MustFree(a, x2);
  EXPECT_EQ(a.free_bytes(), 2 * kA);
  EXPECT_EQ(a.largest_free_extent(), kA);
  absl::StatusOr<uint64_t> r = a.Allocate(2 * kA);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string msg(r.status().message());
  EXPECT_THAT(msg, HasSubstr("cannot allocate 8192 bytes"));
  EXPECT_THAT(msg, HasSubstr("8192 of 16384 bytes free, largest free extent 4096 bytes"));
  EXPECT_THAT(msg, HasSubstr("fragmented"));
}

TEST(ExtentAllocatorTest, FragmentationFigure) {
  ExtentAllocator a(8 * kA, kA);
  std::vector<uint64_t> x;
  for (int i = 0; i < 8; ++i) x.push_back(MustAllocate(a, kA));
  // Free 0, 2, 3, 5: free extents of 1, 2 and 1 pages: 4 free, largest 2 -> 0.5.
  for (int i : {0, 2, 3, 5}) MustFree(a, x[i]);
  EXPECT_EQ(a.free_extent_count(), 3u);
  EXPECT_DOUBLE_EQ(a.fragmentation(), 0.5);
  MustFree(a, x[1]);  // joins 0..3: free 5 pages, largest 4
  EXPECT_DOUBLE_EQ(a.fragmentation(), 1.0 - 4.0 / 5.0);
}

// Free extents of 3, 1 and 2 pages (at 0, 4 and 6), separated by live allocations.
class BestFitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 9; ++i) pages_.push_back(MustAllocate(a_, kA));
    for (int i : {0, 1, 2, 4, 6, 7}) MustFree(a_, pages_[i]);
    ASSERT_EQ(a_.free_extent_count(), 3u);
  }
  ExtentAllocator a_{9 * kA, kA};
  std::vector<uint64_t> pages_;
};

TEST_F(BestFitTest, PicksSmallestExtentThatFits) {
  EXPECT_EQ(MustAllocate(a_, kA), 4 * kA);      // the 1-page hole, not the front of the 3
  EXPECT_EQ(MustAllocate(a_, 2 * kA), 6 * kA);  // the 2-page hole
  EXPECT_EQ(MustAllocate(a_, 3 * kA), 0u);      // the 3-page hole
  EXPECT_EQ(a_.free_bytes(), 0u);
}

TEST_F(BestFitTest, SplitsTheBestFitAndKeepsTheRest) {
  EXPECT_EQ(MustAllocate(a_, 2 * kA), 6 * kA);
  EXPECT_EQ(MustAllocate(a_, 2 * kA), 0u);  // only the 3-page hole is left large enough
  EXPECT_EQ(a_.largest_free_extent(), kA);
  EXPECT_EQ(a_.free_extent_count(), 2u);  // page 2 and page 4
}

TEST(ExtentAllocatorTest, BestFitTiesGoToLowestOffset) {
  ExtentAllocator a(7 * kA, kA);
  std::vector<uint64_t> x;
  for (int i = 0; i < 7; ++i) x.push_back(MustAllocate(a, kA));
  // Three 1-page holes at 5, 1, 3 (freed in that order so insertion order is not offset order).
  for (int i : {5, 1, 3}) MustFree(a, x[i]);
  EXPECT_EQ(MustAllocate(a, kA), 1 * kA);
  EXPECT_EQ(MustAllocate(a, kA), 3 * kA);
  EXPECT_EQ(MustAllocate(a, kA), 5 * kA);
}

// Coalescing: a freed extent with no free neighbour, a free left, a free right, and both.
class CoalesceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Fill the region exactly, so the region's edges are exercised as well.
    for (int i = 0; i < 5; ++i) x_.push_back(MustAllocate(a_, kA));
    ASSERT_EQ(a_.free_bytes(), 0u);
  }
  ExtentAllocator a_{5 * kA, kA};
  std::vector<uint64_t> x_;
};

TEST_F(CoalesceTest, NoFreeNeighbour) {
  MustFree(a_, x_[2]);
  EXPECT_EQ(a_.free_extent_count(), 1u);
  EXPECT_EQ(a_.largest_free_extent(), kA);
  MustFree(a_, x_[0]);  // at the region's start, right neighbour live
  MustFree(a_, x_[4]);  // at the region's end, left neighbour live
  EXPECT_EQ(a_.free_extent_count(), 3u);
}

TEST_F(CoalesceTest, FreeLeftNeighbour) {
  MustFree(a_, x_[1]);
  MustFree(a_, x_[2]);
  EXPECT_EQ(a_.free_extent_count(), 1u);
  EXPECT_EQ(a_.largest_free_extent(), 2 * kA);
  EXPECT_EQ(MustAllocate(a_, 2 * kA), x_[1]);
}

TEST_F(CoalesceTest, FreeRightNeighbour) {
  MustFree(a_, x_[3]);
  MustFree(a_, x_[2]);
  EXPECT_EQ(a_.free_extent_count(), 1u);
  EXPECT_EQ(a_.largest_free_extent(), 2 * kA);
  EXPECT_EQ(MustAllocate(a_, 2 * kA), x_[2]);
}

TEST_F(CoalesceTest, BothNeighboursFree) {
  MustFree(a_, x_[1]);
  MustFree(a_, x_[3]);
  EXPECT_EQ(a_.free_extent_count(), 2u);
  MustFree(a_, x_[2]);
  EXPECT_EQ(a_.free_extent_count(), 1u);
  EXPECT_EQ(a_.largest_free_extent(), 3 * kA);
}

TEST_F(CoalesceTest, EverythingFreedIsOneExtentAgain) {
  for (int i : {4, 0, 2, 1, 3}) MustFree(a_, x_[i]);
  EXPECT_EQ(a_.free_extent_count(), 1u);
  EXPECT_EQ(a_.largest_free_extent(), 5 * kA);
  EXPECT_EQ(a_.used_bytes(), 0u);
  EXPECT_EQ(a_.allocation_count(), 0u);
}

TEST(ExtentAllocatorTest, DoubleFreeIsRefusedAndChangesNothing) {
  ExtentAllocator a(8 * kA, kA);
  const uint64_t x = MustAllocate(a, kA);
  MustAllocate(a, kA);
  MustFree(a, x);
  const uint64_t used = a.used_bytes();
  const size_t extents = a.free_extent_count();
  absl::Status s = a.Free(x);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("double free"));
  EXPECT_EQ(a.used_bytes(), used);
  EXPECT_EQ(a.free_extent_count(), extents);
  EXPECT_TRUE(a.CheckInvariants().ok());
  // Also an offset that falls in the middle of free space.
  EXPECT_EQ(a.Free(5 * kA).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ExtentAllocatorTest, UnknownOffsetIsNotFound) {
  ExtentAllocator a(8 * kA, kA);
  const uint64_t x = MustAllocate(a, 4 * kA);
  absl::Status inside = a.Free(x + kA);
  EXPECT_EQ(inside.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(inside.message()), HasSubstr("inside the allocation at 0"));
  EXPECT_EQ(a.Free(x + 1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a.Free(100 * kA).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a.used_bytes(), 4 * kA);
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST(ExtentAllocatorTest, GrowInPlaceTakesTheFollowingFreeExtent) {
  ExtentAllocator a(16 * kA, kA);
  const uint64_t x = MustAllocate(a, kA);
  EXPECT_TRUE(a.TryGrowInPlace(x, 3 * kA + 1));  // rounds to 4 pages
  EXPECT_EQ(a.allocation_size(x), 4 * kA);
  EXPECT_EQ(a.used_bytes(), 4 * kA);
  EXPECT_TRUE(a.CheckInvariants().ok());
  const uint64_t y = MustAllocate(a, kA);
  EXPECT_EQ(y, 4 * kA);
  EXPECT_FALSE(a.TryGrowInPlace(x, 5 * kA));  // y is in the way
  EXPECT_EQ(a.allocation_size(x), 4 * kA);
  EXPECT_TRUE(a.TryGrowInPlace(y, 12 * kA));  // exactly the rest: the free extent disappears
  EXPECT_EQ(a.free_bytes(), 0u);
  EXPECT_EQ(a.free_extent_count(), 0u);
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST(ExtentAllocatorTest, GrowInPlaceRefusals) {
  ExtentAllocator a(8 * kA, kA);
  const uint64_t x = MustAllocate(a, 2 * kA);
  EXPECT_TRUE(a.TryGrowInPlace(x, kA));  // already large enough: no shrink
  EXPECT_TRUE(a.TryGrowInPlace(x, 2 * kA));
  EXPECT_EQ(a.allocation_size(x), 2 * kA);
  EXPECT_FALSE(a.TryGrowInPlace(x, 9 * kA));  // past the end of the region
  EXPECT_FALSE(a.TryGrowInPlace(x, ~uint64_t{0}));
  EXPECT_FALSE(a.TryGrowInPlace(x + kA, 3 * kA));  // not the start of an allocation
  EXPECT_FALSE(a.TryGrowInPlace(5 * kA, kA));      // free space
  EXPECT_EQ(a.used_bytes(), 2 * kA);
  EXPECT_TRUE(a.CheckInvariants().ok());
  // The free extent after x is 6 pages; exactly that succeeds.
  EXPECT_TRUE(a.TryGrowInPlace(x, 8 * kA));
  EXPECT_EQ(a.free_bytes(), 0u);
}

TEST(ExtentAllocatorTest, ShrinkInPlaceUndoesGrowthAndCoalesces) {
  ExtentAllocator a(16 * kA, kA);
  const uint64_t x = MustAllocate(a, kA);
  ASSERT_TRUE(a.TryGrowInPlace(x, 6 * kA));
  EXPECT_TRUE(a.ShrinkInPlace(x, kA).ok());
  EXPECT_EQ(a.allocation_size(x), kA);
  EXPECT_EQ(a.used_bytes(), kA);
  EXPECT_EQ(a.free_extent_count(), 1u);  // the tail merged with the free space after it
  EXPECT_EQ(a.largest_free_extent(), 15 * kA);
  EXPECT_TRUE(a.CheckInvariants().ok());
  // With a neighbour right after, the tail stands alone.
  ASSERT_TRUE(a.TryGrowInPlace(x, 4 * kA));
  const uint64_t y = MustAllocate(a, kA);
  EXPECT_EQ(y, 4 * kA);
  EXPECT_TRUE(a.ShrinkInPlace(x, 2 * kA).ok());
  EXPECT_EQ(a.free_extent_count(), 2u);
  EXPECT_TRUE(a.CheckInvariants().ok());
  EXPECT_EQ(a.ShrinkInPlace(x + kA, kA).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a.ShrinkInPlace(x, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(a.ShrinkInPlace(x, 3 * kA).ok());  // larger than it is: nothing to do
  EXPECT_EQ(a.allocation_size(x), 2 * kA);
}

TEST(ExtentAllocatorTest, CopyIsIndependent) {
  ExtentAllocator a(8 * kA, kA);
  const uint64_t x = MustAllocate(a, kA);
  ExtentAllocator b = a;
  MustFree(a, x);
  EXPECT_EQ(b.used_bytes(), kA);
  EXPECT_TRUE(b.Free(x).ok());
}

// Random allocations, frees and growths against a shadow map of what must be live; the
// invariants hold after every operation and the accounting matches the shadow exactly.
TEST(ExtentAllocatorTest, RandomOperationsKeepInvariants) {
  for (uint64_t alignment : {uint64_t{1}, uint64_t{64}, kA}) {
    const uint64_t capacity = 1000 * alignment + alignment / 2;
    ExtentAllocator a(capacity, alignment);
    std::mt19937_64 rng(42 + alignment);
    std::map<uint64_t, uint64_t> live;  // offset -> rounded size
    auto round = [&](uint64_t b) { return (b + alignment - 1) / alignment * alignment; };
    uint64_t successes = 0;
    uint64_t exhaustions = 0;
    for (int step = 0; step < 20000; ++step) {
      const int op = static_cast<int>(rng() % 10);
      if (op < 5 || live.empty()) {
        // Sizes skewed small, sometimes large, so the region both fills and fragments.
        const uint64_t bytes = 1 + rng() % (rng() % 8 == 0 ? 200 * alignment : 8 * alignment);
        absl::StatusOr<uint64_t> r = a.Allocate(bytes);
        if (r.ok()) {
          ASSERT_EQ(*r % alignment, 0u);
          for (const auto& [o, s] : live) ASSERT_TRUE(*r + round(bytes) <= o || o + s <= *r);
          live[*r] = round(bytes);
          ++successes;
        } else {
          ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
          ASSERT_LT(a.largest_free_extent(), round(bytes));
          ++exhaustions;
        }
      } else if (op < 9) {
        auto it = live.begin();
        std::advance(it, rng() % live.size());
        ASSERT_TRUE(a.Free(it->first).ok());
        if (rng() % 4 == 0) {
          ASSERT_FALSE(a.Free(it->first).ok());  // double free refused
        }
        live.erase(it);
      } else {
        auto it = live.begin();
        std::advance(it, rng() % live.size());
        const uint64_t want = it->second + 1 + rng() % (4 * alignment);
        if (a.TryGrowInPlace(it->first, want)) it->second = std::max(it->second, round(want));
      }
      ASSERT_TRUE(a.CheckInvariants().ok()) << "step " << step << ": " << a.CheckInvariants();
      uint64_t sum = 0;
      for (const auto& [o, s] : live) {
        ASSERT_EQ(a.allocation_size(o), s);
        sum += s;
      }
      ASSERT_EQ(a.used_bytes(), sum);
      ASSERT_EQ(a.allocation_count(), live.size());
      ASSERT_EQ(a.used_bytes() + a.free_bytes(), a.capacity());
      ASSERT_GE(a.fragmentation(), 0.0);
      ASSERT_LT(a.fragmentation(), 1.0);
    }
    EXPECT_GT(successes, 1000u);
    EXPECT_GT(exhaustions, 10u);  // the loop did reach a full or fragmented region
    for (const auto& [o, s] : live) ASSERT_TRUE(a.Free(o).ok());
    EXPECT_EQ(a.free_extent_count(), 1u);
    EXPECT_EQ(a.largest_free_extent(), a.capacity());
  }
}

}  // namespace extent_allocator_test
}  // namespace hisparse
