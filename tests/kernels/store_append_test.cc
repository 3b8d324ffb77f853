// StoreReference and AppendReference: the host pool stays authoritative, short rows become
// wholly resident, append writes slot B and host[seq_len - 1].
#include <cstring>
#include <vector>

#include "arena_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hisparse/kernels/resolve.h"

namespace hisparse {
namespace store_append_test {

using ::hisparse::testing::ArenaFixture;
using ::testing::ElementsAre;

constexpr uint32_t kRb = 32;
const ArenaGeometry kG{/*max_rows=*/2, /*num_layers=*/2, /*slots=*/4, /*k=*/2, kRb};

// Engine buffer of tokens [start, start + n) of every layer, token stride `stride`.
std::vector<uint8_t> Src(const ArenaFixture& f, int32_t row, int32_t start, int32_t n, int64_t stride, uint32_t gen) {
  std::vector<uint8_t> src(2 * n * stride, 0xee);
  for (int32_t l = 0; l < 2; ++l) {
    for (int32_t t = 0; t < n; ++t) f.Pattern(&src[(l * n + t) * stride], row, l, start + t, gen);
  }
  return src;
}

bool SameAsPattern(const ArenaFixture& f, const uint8_t* p, int32_t row, int32_t layer, int32_t pos, uint32_t gen) {
  std::vector<uint8_t> want(kRb);
  f.Pattern(want.data(), row, layer, pos, gen);
  return std::memcmp(p, want.data(), kRb) == 0;
}

uint32_t Store(ArenaFixture& f, int32_t row, int32_t start, int32_t n, int32_t after, const std::vector<uint8_t>& src,
               int64_t stride) {
  return StoreReference(StoreDesc{f.view(), f.host(), row, start, n, after, src.data(), n * stride, stride});
}

TEST(StoreTest, ChunkedPrefillWithinBIsWhollyResident) {
  ArenaFixture f(kG, 16);
  const int64_t stride = kRb + 16;  // strided source
  ASSERT_EQ(0u, Store(f, 1, 0, 2, 2, Src(f, 1, 0, 2, stride, 1), stride));
  EXPECT_THAT(f.SlotPos(1, 0), ElementsAre(0, 1, -1, -1));
  EXPECT_THAT(f.Lru(1, 0), ElementsAre(2, 3, 0, 1));
  ASSERT_EQ(0u, Store(f, 1, 2, 2, 4, Src(f, 1, 2, 2, stride, 1), stride));
  for (int32_t l = 0; l < 2; ++l) {
    EXPECT_THAT(f.SlotPos(1, l), ElementsAre(0, 1, 2, 3));
    EXPECT_THAT(f.Lru(1, l), ElementsAre(0, 1, 2, 3));
    for (int32_t p = 0; p < 4; ++p) {
      EXPECT_TRUE(SameAsPattern(f, f.HostRecord(1, l, p), 1, l, p, 1));
      EXPECT_TRUE(SameAsPattern(f, f.view().Record(1, l, p), 1, l, p, 1));
    }
    EXPECT_TRUE(SameAsPattern(f, f.view().Record(1, l, 4), 1, l, 3, 1));  // newest in slot B
  }
  EXPECT_THAT(f.SlotPos(0, 0), ElementsAre(-1, -1, -1, -1));
  EXPECT_EQ(f.counters().steps, 0u);  // store does not count as RESOLVE
}

TEST(StoreTest, LongRowWritesOnlyTheHostPool) {
  ArenaFixture f(kG, 16);
  ASSERT_EQ(0u, Store(f, 0, 0, 3, 3, Src(f, 0, 0, 3, kRb, 1), kRb));
  ASSERT_EQ(0u, Store(f, 0, 3, 5, 8, Src(f, 0, 3, 5, kRb, 1), kRb));
  // The first chunk's slots stay (still exact); the second chunk went only to the host pool.
  EXPECT_THAT(f.SlotPos(0, 1), ElementsAre(0, 1, 2, -1));
  for (int32_t p = 0; p < 8; ++p) EXPECT_TRUE(SameAsPattern(f, f.HostRecord(0, 1, p), 0, 1, p, 1));
  EXPECT_TRUE(SameAsPattern(f, f.view().Record(0, 1, 4), 0, 1, 7, 1));
  std::vector<int32_t> out;
  ASSERT_EQ(0u, f.Resolve(1, 1, {0}, {8}, {6, 1}, &out));
  EXPECT_THAT(out, ElementsAre(3, 1));
  EXPECT_TRUE(SameAsPattern(f, f.view().Record(0, 1, 3), 0, 1, 6, 1));
}

TEST(StoreTest, RestoringAResidentPositionRefreshesItsSlot) {
  ArenaFixture f(kG, 16);
  ASSERT_EQ(0u, Store(f, 0, 0, 8, 8, Src(f, 0, 0, 8, kRb, 1), kRb));
  std::vector<int32_t> out;
  ASSERT_EQ(0u, f.Resolve(0, 1, {0}, {8}, {5, 2}, &out));
  ASSERT_EQ(0u, Store(f, 0, 4, 2, 8, Src(f, 0, 4, 2, kRb, 9), kRb));
  EXPECT_TRUE(SameAsPattern(f, f.view().Record(0, 0, out[0]), 0, 0, 5, 9));
  EXPECT_TRUE(SameAsPattern(f, f.view().Record(0, 0, out[1]), 0, 0, 2, 1));
}

TEST(StoreTest, InvalidStoresTouchNothing) {
  ArenaFixture f(kG, 16);
  f.set_capacity(1, 0);  // row 1 not admitted
  const std::vector<uint8_t> src = Src(f, 0, 0, 8, kRb, 1);
  const auto before = f.Snapshot();
  const std::vector<uint8_t> host_before(f.HostRecord(0, 0, 0), f.HostRecord(0, 0, 16));
  EXPECT_EQ(kResolveBadRow, Store(f, 2, 0, 2, 2, src, kRb));
  EXPECT_EQ(kResolveBadRow, Store(f, -1, 0, 2, 2, src, kRb));
  EXPECT_EQ(kResolveBadPosition, Store(f, 0, -1, 2, 2, src, kRb));
  EXPECT_EQ(kResolveBadPosition, Store(f, 0, 0, -2, 2, src, kRb));
  EXPECT_EQ(kResolveBadSeqLen, Store(f, 0, 0, 4, 3, src, kRb));    // tokens past seq_len_after
  EXPECT_EQ(kResolveBadSeqLen, Store(f, 0, 10, 8, 18, src, kRb));  // past capacity
  EXPECT_EQ(kResolveBadSeqLen, Store(f, 0, 0, 0, 0, src, kRb));
  EXPECT_EQ(kResolveBadSeqLen, Store(f, 1, 0, 1, 1, src, kRb));
  EXPECT_EQ(before, f.Snapshot());
  EXPECT_EQ(host_before, std::vector<uint8_t>(f.HostRecord(0, 0, 0), f.HostRecord(0, 0, 16)));
}

TEST(AppendTest, WritesSlotBAndHostAndResolveSeesIt) {
  ArenaFixture f(kG, 16);
  ASSERT_EQ(0u, Store(f, 0, 0, 6, 6, Src(f, 0, 0, 6, kRb, 1), kRb));
  ASSERT_EQ(0u, Store(f, 1, 0, 2, 2, Src(f, 1, 0, 2, kRb, 1), kRb));
  const int64_t stride = 2 * kRb;
  std::vector<uint8_t> src(3 * stride, 0);
  f.Pattern(&src[0], 1, 1, 2, 4);       // row 1 newest: position 2
  f.Pattern(&src[stride], 0, 1, 6, 4);  // row 0 newest: position 6
  f.Pattern(&src[2 * stride], 0, 1, 9, 4);
  std::vector<int32_t> rows = {1, 0, 0}, seq = {3, 7, 10};
  int32_t batch = 2;
  uint32_t flags = 0;
  AppendDesc d{f.view(), f.host(), 1, 3, &batch, rows.data(), seq.data(), src.data(), stride, &flags};
  ASSERT_EQ(0u, AppendReference(d));
  EXPECT_EQ(0u, flags);
  EXPECT_TRUE(SameAsPattern(f, f.view().Record(1, 1, 4), 1, 1, 2, 4));
  EXPECT_TRUE(SameAsPattern(f, f.HostRecord(1, 1, 2), 1, 1, 2, 4));
  EXPECT_TRUE(SameAsPattern(f, f.view().Record(0, 1, 4), 0, 1, 6, 4));
  EXPECT_TRUE(SameAsPattern(f, f.HostRecord(0, 1, 6), 0, 1, 6, 4));
  EXPECT_FALSE(SameAsPattern(f, f.HostRecord(0, 1, 9), 0, 1, 9, 4));  // past batch_size
  EXPECT_FALSE(SameAsPattern(f, f.HostRecord(0, 0, 6), 0, 1, 6, 4));  // other layer
  std::vector<int32_t> out;
  ASSERT_EQ(0u, f.Resolve(1, 1, {0}, {7}, {6, 0}, &out));
  EXPECT_THAT(out, ElementsAre(4, 0));
  EXPECT_TRUE(SameAsPattern(f, f.view().Record(0, 1, 4), 0, 1, 6, 4));
  // Next step: position 6 is no longer the newest and is fetched from the host pool.
  ASSERT_EQ(0u, f.Resolve(1, 1, {0}, {8}, {6, -1}, &out));
  EXPECT_NE(out[0], 4);
  EXPECT_TRUE(SameAsPattern(f, f.view().Record(0, 1, out[0]), 0, 1, 6, 4));
}

TEST(AppendTest, InvalidRowsSetBitsAndTouchNothing) {
  ArenaFixture f(kG, 16);
  std::vector<uint8_t> src(4 * kRb, 0x5a);
  std::vector<int32_t> rows = {5, 0, 1, -1}, seq = {3, 0, 17, 2};
  int32_t batch = 4;
  uint32_t flags = 0;
  const auto before = f.Snapshot();
  AppendDesc d{f.view(), f.host(), 0, 4, &batch, rows.data(), seq.data(), src.data(), kRb, &flags};
  EXPECT_EQ(kResolveBadRow | kResolveBadSeqLen, AppendReference(d));
  EXPECT_EQ(kResolveBadRow | kResolveBadSeqLen, flags);
  d.layer = 2;
  rows = {0, 0, 0, 0}, seq = {1, 1, 1, 1};
  EXPECT_EQ(kResolveBadRow, AppendReference(d));
  EXPECT_EQ(before, f.Snapshot());
}

}  // namespace store_append_test
}  // namespace hisparse
