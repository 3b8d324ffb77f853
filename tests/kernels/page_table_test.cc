// RESOLVE's page-table output (resolve.h, rule 9) on the CPU reference: the global record index of
// every output slot, in pages of P records from page O, -1 wherever the output is padding; the
// same state and outputs with or without it, and with out_slots left out.
#include <cstdint>
#include <cstring>
#include <vector>

#include "arena_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hisparse/kernels/resolve.h"

namespace hisparse {
namespace {

using ::hisparse::testing::ArenaFixture;
using ::testing::ElementsAre;

constexpr int32_t kCap = 64;
// 3 rows, 2 layers, B 4, k 3: (B + 1) = 5 records per (row, layer).
const ArenaGeometry kG{/*max_rows=*/3, /*num_layers=*/2, /*slots=*/4, /*k=*/3, /*record_bytes=*/32};

struct Launch {
  std::vector<int32_t> rows, seqs, pos;
  int32_t batch;
};

// One RESOLVE of layer 1 with the given outputs (either may be null).
uint32_t ResolveLayer1(ArenaFixture& f, const Launch& l, int32_t* out, int32_t* pt, int32_t page_records,
                       int32_t page_offset) {
  ResolveDesc d{};
  d.arena = f.view();
  d.host = f.host();
  d.layer = 1;
  d.max_batch = static_cast<int32_t>(l.rows.size());
  d.batch_size = &l.batch;
  d.rows = l.rows.data();
  d.seq_lens = l.seqs.data();
  d.positions = l.pos.data();
  d.out_slots = out;
  d.page_table = pt;
  d.page_records = page_records;
  d.page_offset = page_offset;
  return ResolveReference(d);
}

TEST(PageTableTest, GlobalRecordIndexOfEverySlotPaddingIsMinusOne) {
  ArenaFixture f(kG, kCap);
  for (int32_t r = 0; r < 3; ++r) f.FillHost(r, 20);
  // Entry 0: row 2, position 9 is the newest (slot B), 3 misses into slot 0, -1 pads. Entry 1:
  // row 0 selects 5 twice (rejected). Entry 2: past the batch.
  const Launch l{{2, 0, 1}, {10, 10, 10}, {3, 9, -1, 5, 5, 1, 7, 7, 7}, 2};
  std::vector<int32_t> out(9, 77), pt(9, 77);
  EXPECT_EQ(ResolveLayer1(f, l, out.data(), pt.data(), 1, 0), static_cast<uint32_t>(kResolveDuplicate));
  EXPECT_THAT(out, ElementsAre(0, 4, -1, -1, -1, -1, -1, -1, -1));
  const int32_t g = (2 * 2 + 1) * 5;  // (row 2, layer 1)'s first record
  EXPECT_THAT(pt, ElementsAre(g + 0, g + 4, -1, -1, -1, -1, -1, -1, -1));
  // The record at that index of the records section holds the position's host record.
  EXPECT_EQ(0, std::memcmp(f.view().records + static_cast<size_t>(pt[0]) * kG.record_bytes, f.HostRecord(2, 1, 3),
                           kG.record_bytes));
}

// Pages of P records from page O: O * P + g. The same state, counters and outputs as without the
// page table, and with out_slots null the page table alone.
TEST(PageTableTest, PagesAndOffsetAndWithoutOutSlots) {
  ArenaFixture plain(kG, kCap), paged(kG, kCap), only(kG, kCap);
  for (ArenaFixture* f : {&plain, &paged, &only}) {
    for (int32_t r = 0; r < 3; ++r) f->FillHost(r, 30);
  }
  const int32_t P = 64, O = 3;
  for (int step = 0; step < 6; ++step) {
    const Launch l{{1, 2, 0}, {20 + step, 25, 12}, {step, 19 + step, step + 10, 24, step + 3, -1, 11, 0, 5}, 3};
    std::vector<int32_t> out_a(9), out_b(9), pt_b(9), pt_c(9, 55);
    ASSERT_EQ(0u, ResolveLayer1(plain, l, out_a.data(), nullptr, 0, 0));
    ASSERT_EQ(0u, ResolveLayer1(paged, l, out_b.data(), pt_b.data(), P, O));
    ASSERT_EQ(0u, ResolveLayer1(only, l, nullptr, pt_c.data(), P, O));
    EXPECT_EQ(out_a, out_b);
    EXPECT_EQ(pt_b, pt_c);
    for (int32_t i = 0; i < 3; ++i) {
      for (int32_t j = 0; j < 3; ++j) {
        const int32_t s = out_a[i * 3 + j];
        const int32_t want = s < 0 ? -1 : O * P + (l.rows[i] * 2 + 1) * 5 + s;
        EXPECT_EQ(pt_b[i * 3 + j], want) << "entry " << i << " selection " << j;
      }
    }
    ASSERT_EQ(plain.Snapshot(), paged.Snapshot());
    ASSERT_EQ(plain.Snapshot(), only.Snapshot());
  }
}

TEST(PageTableTest, ValidatesItsParameters) {
  EXPECT_EQ(ValidatePageTable(kG, 1, 0), nullptr);
  EXPECT_EQ(ValidatePageTable(kG, 64, 1000), nullptr);
  EXPECT_NE(ValidatePageTable(kG, 0, 0), nullptr);
  EXPECT_NE(ValidatePageTable(kG, 1, -1), nullptr);
  // 30 records: the last entry O * P + 29 must fit in int32.
  EXPECT_EQ(ValidatePageTable(kG, 1, INT32_MAX - 29), nullptr);
  EXPECT_NE(ValidatePageTable(kG, 1, INT32_MAX - 28), nullptr);
  EXPECT_NE(ValidatePageTable(kG, 1 << 16, 1 << 16), nullptr);
  // The reference rejects every row of a launch with invalid parameters, writing -1 and no state.
  ArenaFixture f(kG, kCap);
  f.FillHost(0, 20);
  const auto before = f.Snapshot();
  std::vector<int32_t> out(3, 77), pt(3, 77);
  EXPECT_EQ(ResolveLayer1(f, Launch{{0}, {10}, {1, 2, 3}, 1}, out.data(), pt.data(), 0, 0),
            static_cast<uint32_t>(kResolveBadRow));
  EXPECT_THAT(out, ElementsAre(-1, -1, -1));
  EXPECT_THAT(pt, ElementsAre(-1, -1, -1));
  EXPECT_EQ(before, f.Snapshot());
}

}  // namespace
}  // namespace hisparse
