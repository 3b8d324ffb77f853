// RESOLVE's page-table output (resolve.h, rule 9) on the CPU reference: the global record index of
// every output slot, in pages of P records from page O, -1 wherever the output is padding; the
// same state and outputs with or without it, and with out_slots left out.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "arena_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hisparse/kernels/resolve.h"

namespace hisparse {
namespace page_table_test {

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
  EXPECT_EQ(f.counters().rejected, 1u);  // the row is counted as refused, and nothing else moves
  f.view().counters->rejected = 0;
  EXPECT_EQ(before, f.Snapshot());
}

// ---- Rule 9 with draft tokens (rule 8): page_table shaped like out_slots [max_batch][Q][k], over
// S = B + 1 + n record slots per (row, layer), tail slots included. ----

// 2 rows, 2 layers, B 6, k 3, n 2: Q = 3 query rows, S = 9 records per (row, layer).
ArenaGeometry DraftG() {
  ArenaGeometry g{/*max_rows=*/2, /*num_layers=*/2, /*slots=*/6, /*k=*/3, /*record_bytes=*/32};
  g.draft_tokens = 2;
  return g;
}

// One multi-query RESOLVE of `layer` with the given outputs (either may be null).
uint32_t ResolveDraft(ArenaFixture& f, int32_t layer, const Launch& l, const std::vector<int32_t>& q, int32_t* out,
                      int32_t* pt, int32_t page_records, int32_t page_offset) {
  ResolveDesc d{};
  d.arena = f.view();
  d.host = f.host();
  d.layer = layer;
  d.max_batch = static_cast<int32_t>(l.rows.size());
  d.batch_size = &l.batch;
  d.rows = l.rows.data();
  d.seq_lens = l.seqs.data();
  d.positions = l.pos.data();
  d.query_counts = q.data();
  d.out_slots = out;
  d.page_table = pt;
  d.page_records = page_records;
  d.page_offset = page_offset;
  return ResolveReference(d);
}

// Appends q tokens (positions seq_len - q ..) of (row, layer): host pool and tail slots B + t.
void AppendTail(ArenaFixture& f, int32_t layer, int32_t row, int32_t seq_len, int32_t q, uint32_t gen) {
  ASSERT_EQ(f.AppendTokens(layer, row, seq_len, q, gen), 0u);
}

TEST(PageTableTest, DraftTokensIndexRegularAndTailSlotsOverTheirStride) {
  const ArenaGeometry g = DraftG();
  ArenaFixture f(g, kCap);
  for (int32_t r = 0; r < 2; ++r) f.FillHost(r, 30);
  // (row 1, layer 1) holds 10, 11, 12 in slots 0..2, slots 3..5 EMPTY (least recently used).
  f.SetState(1, 1, {10, 11, 12, -1, -1, -1}, {3, 4, 5, 0, 1, 2});
  ASSERT_NO_FATAL_FAILURE(AppendTail(f, 1, 1, 22, 2, 9));  // query tokens 20, 21 -> tail slots 6, 7
  // Entry 0: row 1, q = 2 of Q = 3. List 0 (over [0, 21)): 10 hit, 20 its own token, 5 a miss;
  // list 1 (over [0, 22)): its own token 21, 10 again, padding; query row 2 is padded (garbage).
  // Entry 1: row 0, three disjoint lists, union 9 > B = 6: refused. Entry 2: past the batch.
  const Launch l{{1, 0, 1},
                 {22, 25, 22},
                 {10, 20, 5, 21, 10, -1, 99, 99, 99,  //
                  0,  1,  2, 3,  4,  5,  6,  7,  8,   //
                  1,  2,  3, 4,  5,  6,  7,  8,  9},
                 2};
  const std::vector<int32_t> q{2, 3, 3};
  std::vector<int32_t> out(27, 77), pt(27, 77);
  EXPECT_EQ(ResolveDraft(f, 1, l, q, out.data(), pt.data(), 1, 0), static_cast<uint32_t>(kResolveUnionTooLarge));
  EXPECT_THAT(std::vector<int32_t>(out.begin(), out.begin() + 9), ElementsAre(0, 6, 3, 7, 0, -1, -1, -1, -1));
  const int32_t b = (1 * 2 + 1) * 9;  // (row 1, layer 1)'s first record: stride B + 1 + n = 9
  EXPECT_THAT(std::vector<int32_t>(pt.begin(), pt.begin() + 9), ElementsAre(b, b + 6, b + 3, b + 7, b, -1, -1, -1, -1));
  EXPECT_EQ(std::vector<int32_t>(pt.begin() + 9, pt.end()), std::vector<int32_t>(18, -1));
  // The record at each index is the selected position's: regular slots and the tail alike.
  const int32_t positions[] = {10, 20, 5, 21};
  for (int32_t x = 0; x < 4; ++x) {
    EXPECT_EQ(0, std::memcmp(f.view().records + static_cast<size_t>(pt[x]) * g.record_bytes,
                             f.HostRecord(1, 1, positions[x]), g.record_bytes))
        << "selection " << x << " position " << positions[x];
  }
}

// Random multi-query steps: the page table (pages of P from page O) is O * P + (row * layers +
// layer) * S + out_slots wherever out_slots is a slot, -1 elsewhere; the state, counters and
// outputs are the same with or without it, and with out_slots null the page table alone.
TEST(PageTableTest, DraftTokensPagesAndOffsetAndWithoutOutSlots) {
  const ArenaGeometry g = DraftG();
  const int32_t Q = g.TailSlots(), S = static_cast<int32_t>(g.RecordSlots()), outs = Q * g.k;
  constexpr int32_t kDraftCap = 200;  // 40 steps of up to 3 accepted tokens from 20
  ArenaFixture plain(g, kDraftCap), paged(g, kDraftCap), only(g, kDraftCap);
  for (ArenaFixture* f : {&plain, &paged, &only}) {
    for (int32_t r = 0; r < 2; ++r) f->FillHost(r, kDraftCap);
  }
  const int32_t P = 16, O = 5;
  std::mt19937 rng(5);
  std::vector<int32_t> committed{12, 20};
  int32_t tails = 0;
  for (int step = 0; step < 40; ++step) {
    const int32_t layer = step % 2;
    Launch l{{1, 0}, {0, 0}, std::vector<int32_t>(2 * outs, 4444), 2};
    std::vector<int32_t> q(2);
    for (int32_t i = 0; i < 2; ++i) {
      const int32_t r = l.rows[i];
      q[i] = 1 + static_cast<int32_t>(rng() % Q);
      l.seqs[i] = committed[r] + q[i];
      for (ArenaFixture* f : {&plain, &paged, &only})
        ASSERT_NO_FATAL_FAILURE(AppendTail(*f, layer, r, l.seqs[i], q[i], step))
            << "step " << step << " seq " << l.seqs[i] << " q " << q[i] << " row " << r;
      for (int32_t t = 0; t < q[i]; ++t) {
        const int32_t len = l.seqs[i] - q[i] + t + 1;
        std::vector<int32_t> list;
        while (static_cast<int32_t>(list.size()) < g.k) {  // a hot set, the newest tokens, some padding
          const int32_t p = rng() % 4 == 0 ? -1
                                           : (rng() % 2 ? static_cast<int32_t>(rng() % 8)
                                                        : len - 1 - static_cast<int32_t>(rng() % 3));
          if (p >= len || (p >= 0 && std::find(list.begin(), list.end(), p) != list.end())) continue;
          list.push_back(p);
        }
        std::copy(list.begin(), list.end(), l.pos.begin() + (i * Q + t) * g.k);
      }
    }
    std::vector<int32_t> out_a(2 * outs), out_b(2 * outs), pt_b(2 * outs), pt_c(2 * outs, 55);
    const uint32_t err = ResolveDraft(plain, layer, l, q, out_a.data(), nullptr, 0, 0);
    ASSERT_EQ(err, ResolveDraft(paged, layer, l, q, out_b.data(), pt_b.data(), P, O));
    ASSERT_EQ(err, ResolveDraft(only, layer, l, q, nullptr, pt_c.data(), P, O));
    ASSERT_EQ(err & ~static_cast<uint32_t>(kResolveUnionTooLarge), 0u);
    EXPECT_EQ(out_a, out_b);
    EXPECT_EQ(pt_b, pt_c);
    for (int32_t x = 0; x < 2 * outs; ++x) {
      const int32_t s = out_a[x];
      tails += s >= g.slots;
      const int32_t want = s < 0 ? -1 : O * P + (l.rows[x / outs] * g.num_layers + layer) * S + s;
      ASSERT_EQ(pt_b[x], want) << "step " << step << " output " << x;
    }
    ASSERT_EQ(plain.Snapshot(), paged.Snapshot());
    ASSERT_EQ(plain.Snapshot(), only.Snapshot());
    for (int32_t i = 0; i < 2; ++i) committed[l.rows[i]] += 1 + static_cast<int32_t>(rng() % q[i]);
  }
  EXPECT_GT(tails, 20);  // tail slots B + t were indexed, not only slot B
}

TEST(PageTableTest, DraftTokensWidenTheInt32Bound) {
  ArenaGeometry g = kG;
  g.draft_tokens = 2;  // 3 rows * 2 layers * (4 + 1 + 2) = 42 records
  EXPECT_EQ(ValidatePageTable(g, 1, INT32_MAX - 41), nullptr);
  EXPECT_NE(ValidatePageTable(g, 1, INT32_MAX - 40), nullptr);
  EXPECT_NE(ValidatePageTable(g, 1, INT32_MAX - 29), nullptr);  // kG's bound without the tails
}

}  // namespace page_table_test
}  // namespace hisparse
