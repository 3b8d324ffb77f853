// Hand-worked cases of the CPU reference RESOLVE (resolve.h, "RESOLVE semantics").
#include <cstring>
#include <vector>

#include "arena_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hisparse/kernels/resolve.h"

namespace hisparse {
namespace resolve_reference_test {

using ::hisparse::testing::ArenaFixture;
using ::testing::ElementsAre;

constexpr int32_t kCap = 64;
const ArenaGeometry kG4{/*max_rows=*/2, /*num_layers=*/2, /*slots=*/4, /*k=*/2, /*record_bytes=*/32};

// Output slot j holds positions[j] and its bytes equal the host record.
void ExpectExact(ArenaFixture& f, int32_t row, int32_t layer, const std::vector<int32_t>& sel,
                 const std::vector<int32_t>& out, int32_t seq_len) {
  for (size_t j = 0; j < sel.size(); ++j) {
    if (sel[j] == kPadding) continue;
    const int32_t s = out[j];
    if (sel[j] != seq_len - 1) {
      EXPECT_EQ(f.view().SlotPos(row, layer)[s], sel[j]);
    }
    EXPECT_EQ(0,
              std::memcmp(f.view().Record(row, layer, s), f.HostRecord(row, layer, sel[j]), f.geometry().record_bytes))
        << "selection " << j;
  }
}

TEST(ResolveGeometryTest, ValidatesEveryField) {
  EXPECT_EQ(ValidateArenaGeometry(kG4), nullptr);
  ArenaGeometry g = kG4;
  g.slots = 1;
  EXPECT_NE(ValidateArenaGeometry(g), nullptr);  // B < k
  g = kG4, g.record_bytes = 24;
  EXPECT_NE(ValidateArenaGeometry(g), nullptr);
  g = kG4, g.record_bytes = 0;
  EXPECT_NE(ValidateArenaGeometry(g), nullptr);
  g = kG4, g.record_bytes = kMaxRecordBytes + 16;
  EXPECT_NE(ValidateArenaGeometry(g), nullptr);
  g = kG4, g.k = 0;
  EXPECT_NE(ValidateArenaGeometry(g), nullptr);
  g = kG4, g.max_rows = 0;
  EXPECT_NE(ValidateArenaGeometry(g), nullptr);
  g = kG4, g.num_layers = 0;
  EXPECT_NE(ValidateArenaGeometry(g), nullptr);
}

TEST(ResolveTest, EmptyCacheMissesFillLruOrder) {
  ArenaFixture f(kG4, kCap);
  f.FillHost(0, 20);
  std::vector<int32_t> out;
  EXPECT_EQ(0u, f.Resolve(1, 1, {0}, {10}, {3, 5}, &out));
  EXPECT_THAT(out, ElementsAre(0, 1));
  EXPECT_THAT(f.SlotPos(0, 1), ElementsAre(3, 5, kEmptySlot, kEmptySlot));
  EXPECT_THAT(f.Lru(0, 1), ElementsAre(2, 3, 0, 1));          // EMPTY slots stay least recently used
  EXPECT_THAT(f.SlotPos(0, 0), ElementsAre(-1, -1, -1, -1));  // other layer untouched
  ExpectExact(f, 0, 1, {3, 5}, out, 10);
  EXPECT_EQ(f.counters().hits, 0u);
  EXPECT_EQ(f.counters().misses, 2u);
  EXPECT_EQ(f.counters().bytes_fetched, 64u);
  EXPECT_EQ(f.counters().steps, 1u);
}

TEST(ResolveTest, AllHitsKeepSlotsAndMoveThemToMostRecent) {
  ArenaFixture f(kG4, kCap);
  f.FillHost(0, 20);
  f.SetState(0, 0, {7, 3, 5, 9}, {2, 0, 3, 1});
  std::vector<int32_t> out;
  EXPECT_EQ(0u, f.Resolve(0, 1, {0}, {20}, {9, 7}, &out));
  EXPECT_THAT(out, ElementsAre(3, 0));
  // Untouched 2, 1 (old order), then hits 0, 3 in old relative order.
  EXPECT_THAT(f.Lru(0, 0), ElementsAre(2, 1, 0, 3));
  EXPECT_THAT(f.SlotPos(0, 0), ElementsAre(7, 3, 5, 9));
  EXPECT_EQ(f.counters().hits, 2u);
  EXPECT_EQ(f.counters().misses, 0u);
  EXPECT_EQ(f.counters().bytes_fetched, 0u);
}

TEST(ResolveTest, AllMissesEvictLeastRecentlyUsed) {
  ArenaFixture f(kG4, kCap);
  f.FillHost(0, 30);
  f.SetState(0, 0, {10, 11, 12, 13}, {3, 1, 0, 2});
  std::vector<int32_t> out;
  EXPECT_EQ(0u, f.Resolve(0, 1, {0}, {30}, {20, 21}, &out));
  EXPECT_THAT(out, ElementsAre(3, 1));
  EXPECT_THAT(f.SlotPos(0, 0), ElementsAre(10, 21, 12, 20));
  EXPECT_THAT(f.Lru(0, 0), ElementsAre(0, 2, 3, 1));
  ExpectExact(f, 0, 0, {20, 21}, out, 30);
}

TEST(ResolveTest, ContractExample) {
  // LRU [0,1,2,3]; a hit in slot 1, one miss -> the miss takes slot 0 -> [2,3,0,1].
  ArenaFixture f(kG4, kCap);
  f.FillHost(0, 30);
  f.SetState(0, 0, {10, 11, 12, 13}, {0, 1, 2, 3});
  std::vector<int32_t> out;
  EXPECT_EQ(0u, f.Resolve(0, 1, {0}, {30}, {20, 11}, &out));
  EXPECT_THAT(out, ElementsAre(0, 1));
  EXPECT_THAT(f.Lru(0, 0), ElementsAre(2, 3, 0, 1));
  EXPECT_THAT(f.SlotPos(0, 0), ElementsAre(20, 11, 12, 13));
  ExpectExact(f, 0, 0, {20, 11}, out, 30);
}

TEST(ResolveTest, MissSkipsLruSlotHoldingAHit) {
  // The least recently used slot holds a hit, so the miss takes the next one.
  ArenaFixture f(kG4, kCap);
  f.FillHost(0, 30);
  f.SetState(0, 0, {10, 11, 12, 13}, {0, 1, 2, 3});
  std::vector<int32_t> out;
  EXPECT_EQ(0u, f.Resolve(0, 1, {0}, {30}, {10, 25}, &out));
  EXPECT_THAT(out, ElementsAre(0, 1));
  EXPECT_THAT(f.Lru(0, 0), ElementsAre(2, 3, 1, 0));
}

TEST(ResolveTest, NewestTokenMapsToExtraSlotWithoutTouchingLru) {
  ArenaFixture f(kG4, kCap);
  f.FillHost(0, 20);
  f.SetState(0, 0, {0, 9, 2, 3}, {0, 1, 2, 3});  // slot 1 happens to hold position 9 too
  std::memcpy(f.view().Record(0, 0, 4), f.HostRecord(0, 0, 9), 32);
  std::vector<int32_t> out;
  EXPECT_EQ(0u, f.Resolve(0, 1, {0}, {10}, {9, 2}, &out));
  EXPECT_THAT(out, ElementsAre(4, 2));
  EXPECT_THAT(f.Lru(0, 0), ElementsAre(0, 1, 3, 2));  // only the hit in slot 2 moved
  EXPECT_THAT(f.SlotPos(0, 0), ElementsAre(0, 9, 2, 3));
  EXPECT_EQ(f.counters().hits, 2u);
  EXPECT_EQ(f.counters().misses, 0u);
  ExpectExact(f, 0, 0, {9, 2}, out, 10);
}

TEST(ResolveTest, PaddingAnywhereOutputsPadding) {
  const ArenaGeometry g{1, 1, 4, 3, 16};
  ArenaFixture f(g, kCap);
  f.FillHost(0, 20);
  std::vector<int32_t> out;
  EXPECT_EQ(0u, f.Resolve(0, 1, {0}, {10}, {-1, 5, -1}, &out));
  EXPECT_THAT(out, ElementsAre(-1, 0, -1));
  EXPECT_EQ(0u, f.Resolve(0, 1, {0}, {10}, {-1, -1, -1}, &out));
  EXPECT_THAT(out, ElementsAre(-1, -1, -1));
  EXPECT_EQ(f.counters().hits + f.counters().misses, 1u);
  EXPECT_EQ(f.counters().steps, 2u);
}

TEST(ResolveTest, ShortRowAfterStoreIsAllHits) {
  ArenaFixture f(kG4, kCap);
  const int32_t n = 3;
  std::vector<uint8_t> src(2 * n * 32);
  for (int32_t l = 0; l < 2; ++l) {
    for (int32_t t = 0; t < n; ++t) f.Pattern(&src[(l * n + t) * 32], 1, l, t, 5);
  }
  StoreDesc s{f.view(), f.host(), /*row=*/1, /*start_pos=*/0, n, /*seq_len_after=*/n, src.data(), n * 32, 32};
  ASSERT_EQ(0u, StoreReference(s));
  EXPECT_THAT(f.SlotPos(1, 0), ElementsAre(0, 1, 2, kEmptySlot));
  EXPECT_THAT(f.Lru(1, 1), ElementsAre(3, 0, 1, 2));
  std::vector<int32_t> out;
  EXPECT_EQ(0u, f.Resolve(1, 2, {1, 0}, {n, 1}, {0, 1, -1, -1}, &out));
  EXPECT_THAT(out, ElementsAre(0, 1, -1, -1));
  EXPECT_EQ(0u, f.Resolve(0, 1, {1}, {n}, {2, 1}, &out));
  EXPECT_THAT(out, ElementsAre(4, 1));  // newest token -> slot B
  EXPECT_EQ(f.counters().misses, 0u);
  EXPECT_EQ(f.counters().hits, 4u);
  ExpectExact(f, 1, 0, {2, 1}, out, n);
}

TEST(ResolveTest, InvalidRowsLeaveStateUntouchedAndOthersProceed) {
  ArenaFixture f(kG4, kCap);
  f.FillHost(0, kCap);
  f.FillHost(1, kCap);
  f.SetState(0, 0, {10, 11, 12, 13}, {0, 1, 2, 3});
  struct Case {
    int32_t row, seq_len;
    std::vector<int32_t> sel;
    uint32_t bits;
  };
  const std::vector<Case> cases = {
      {0, 30, {5, 5}, kResolveDuplicate},
      {0, 30, {30, 1}, kResolveBadPosition},
      {0, 30, {-2, 1}, kResolveBadPosition},
      {0, 0, {-1, -1}, kResolveBadSeqLen},
      {0, kCap + 1, {1, 2}, kResolveBadSeqLen},
      {-2, 30, {1, 2}, kResolveBadRow},  // -1 is padding (rule 10a)
      {2, 30, {1, 2}, kResolveBadRow},
      {0, 30, {40, 40}, kResolveBadPosition},  // duplicates are judged among valid positions
      {0, 30, {-7, 30}, kResolveBadPosition},
  };
  for (const Case& c : cases) {
    const auto before = f.Snapshot();
    std::vector<int32_t> out;
    uint32_t flags = 0;
    EXPECT_EQ(c.bits, f.Resolve(0, 1, {c.row}, {c.seq_len}, c.sel, &out, 0, &flags));
    EXPECT_EQ(c.bits, flags);
    EXPECT_THAT(out, ElementsAre(kPadding, kPadding));
    // Counted as refused (counters.rejected, which the daemon exports), and nothing else moves.
    EXPECT_EQ(f.counters().rejected, 1u);
    f.view().counters->rejected = 0;
    EXPECT_EQ(before, f.Snapshot()) << "state touched by an invalid row";
  }
  // An invalid row beside a valid one: the valid one proceeds.
  std::vector<int32_t> out;
  EXPECT_EQ(kResolveDuplicate, f.Resolve(0, 2, {0, 1}, {30, 30}, {5, 5, 7, 8}, &out));
  EXPECT_THAT(out, ElementsAre(-1, -1, 0, 1));
  EXPECT_THAT(f.SlotPos(0, 0), ElementsAre(10, 11, 12, 13));
  EXPECT_EQ(f.counters().steps, 1u);
  // A layer outside the arena rejects every row.
  EXPECT_EQ(kResolveBadRow, f.Resolve(2, 1, {0}, {30}, {1, 2}, &out));
  EXPECT_EQ(kResolveBadRow, f.Resolve(-1, 1, {0}, {30}, {1, 2}, &out));
  // So does a geometry with B < k (a miss could find no slot).
  ResolveDesc d{};
  ArenaGeometry bad = kG4;
  bad.slots = 1;
  const int32_t one = 1, row = 0, seq_len = 30, sel[2] = {1, 2};
  int32_t slots_out[2] = {7, 7};
  d.arena = ArenaView::Of(f.view().counters, bad);
  d.host = f.host();
  d.max_batch = 1;
  d.batch_size = &one;
  d.rows = &row;
  d.seq_lens = &seq_len;
  d.positions = sel;
  d.out_slots = slots_out;
  EXPECT_EQ(kResolveBadRow, ResolveReference(d));
  EXPECT_THAT(slots_out, ElementsAre(kPadding, kPadding));
}

TEST(ResolveTest, SlotsEqualKReplacesEverySlot) {
  const ArenaGeometry g{1, 1, 3, 3, 16};
  ArenaFixture f(g, kCap);
  f.FillHost(0, 40);
  f.SetState(0, 0, {1, 2, 3}, {2, 0, 1});
  std::vector<int32_t> out;
  EXPECT_EQ(0u, f.Resolve(0, 1, {0}, {40}, {20, 3, 21}, &out));
  EXPECT_THAT(out, ElementsAre(0, 2, 1));  // LRU non-hit slots: 0, 1
  EXPECT_THAT(f.Lru(0, 0), ElementsAre(0, 1, 2));
  EXPECT_EQ(0u, f.Resolve(0, 1, {0}, {40}, {30, 31, 32}, &out));
  EXPECT_THAT(out, ElementsAre(0, 1, 2));
  ExpectExact(f, 0, 0, {30, 31, 32}, out, 40);
}

TEST(ResolveTest, NoFetchPlansIdenticallyButMovesNoBytes) {
  ArenaFixture a(kG4, kCap), b(kG4, kCap);
  a.FillHost(0, 30);
  b.FillHost(0, 30);
  a.SetState(0, 0, {10, 11, 12, 13}, {0, 1, 2, 3});
  b.SetState(0, 0, {10, 11, 12, 13}, {0, 1, 2, 3});
  std::vector<uint8_t> slot0(a.view().Record(0, 0, 0), a.view().Record(0, 0, 0) + 32);
  std::vector<int32_t> out_a, out_b;
  a.Resolve(0, 1, {0}, {30}, {20, 11}, &out_a);
  b.Resolve(0, 1, {0}, {30}, {20, 11}, &out_b, kResolveFlagNoFetch);
  EXPECT_EQ(out_a, out_b);
  EXPECT_EQ(a.SlotPos(0, 0), b.SlotPos(0, 0));
  EXPECT_EQ(a.Lru(0, 0), b.Lru(0, 0));
  EXPECT_EQ(a.counters().bytes_fetched, b.counters().bytes_fetched);
  EXPECT_EQ(0, std::memcmp(b.view().Record(0, 0, 0), slot0.data(), 32));  // old bytes remain
}

TEST(ResolveTest, CountersAccumulateOverRowsAndLaunches) {
  ArenaFixture f(kG4, kCap);
  f.FillHost(0, 30);
  f.FillHost(1, 30);
  std::vector<int32_t> out;
  f.Resolve(0, 2, {0, 1}, {10, 20}, {1, 9, 2, 3}, &out);   // row 0: 1 miss + newest; row 1: 2 misses
  f.Resolve(0, 2, {0, 1}, {11, 20}, {1, 9, 3, -1}, &out);  // row 0: 1 hit + 1 miss; row 1: 1 hit
  EXPECT_EQ(f.counters().hits, 3u);
  EXPECT_EQ(f.counters().misses, 4u);
  EXPECT_EQ(f.counters().bytes_fetched, 4u * 32);
  EXPECT_EQ(f.counters().steps, 4u);
}

// Rule 7: entries past *batch_size publish kPadding in every output column and touch nothing
// else: garbage in their rows, seq_lens and positions is not read and sets no error bit.
TEST(ResolveTest, RowsPastBatchSizePublishPadding) {
  ArenaFixture f(kG4, kCap);
  f.FillHost(0, 30);
  f.FillHost(1, 30);
  std::vector<int32_t> out(4, 777);
  // Entry 1 is invalid (duplicate) but past *batch_size: no error, padding out, no state change.
  EXPECT_EQ(0u, f.Resolve(0, 1, {0, 1}, {10, 10}, {1, 2, 5, 5}, &out));
  EXPECT_THAT(out, ElementsAre(0, 1, kPadding, kPadding));
  EXPECT_THAT(f.SlotPos(1, 0), ElementsAre(-1, -1, -1, -1));
  EXPECT_EQ(f.counters().steps, 1u);
  // Garbage rows and seq_lens past the batch: no kResolveBadRow, no kResolveBadSeqLen.
  out.assign(4, 777);
  uint32_t flags = 0;
  EXPECT_EQ(0u, f.Resolve(0, 1, {0, -9}, {10, -4}, {1, 2, -70, 99}, &out, 0, &flags));
  EXPECT_EQ(flags, 0u);
  EXPECT_THAT(out, ElementsAre(0, 1, kPadding, kPadding));
  // A batch size of 0 (or below) pads every entry and changes no state; above max_batch is clamped.
  const auto before = f.Snapshot();
  out.assign(4, 777);
  EXPECT_EQ(0u, f.Resolve(0, 0, {0, 1}, {10, 10}, {1, 2, 5, 5}, &out));
  EXPECT_THAT(out, ElementsAre(kPadding, kPadding, kPadding, kPadding));
  out.assign(4, 777);
  EXPECT_EQ(0u, f.Resolve(0, -3, {0, 1}, {10, 10}, {1, 2, 5, 5}, &out));
  EXPECT_THAT(out, ElementsAre(kPadding, kPadding, kPadding, kPadding));
  EXPECT_EQ(f.Snapshot(), before);
  EXPECT_EQ(0u, f.Resolve(0, 9, {0, 1}, {10, 10}, {1, 2, 5, 6}, &out));
  EXPECT_EQ(f.counters().steps, 4u);
}

// Rule 7 for the miss plan: a padded entry's summary is (kPadding, -1, 0), so a replay skips it;
// its plan entries are not written. *batch is the clamped batch size.
TEST(ResolveTest, PaddedEntriesRecordAnEmptyPlan) {
  ArenaFixture f(kG4, kCap);
  f.FillHost(0, 30);
  std::vector<int32_t> words((MissPlan::Bytes(kG4, 3) + 3) / 4, 0x5a5a5a5a);
  const MissPlan plan = MissPlan::Of(words.data(), 3);
  std::vector<int32_t> out(6, 777);
  EXPECT_EQ(0u, f.Resolve(0, 1, {0, 1, 5}, {10, 10, 10}, {1, 9, 2, 2, 3, 3}, &out, 0, nullptr, plan));
  EXPECT_EQ(*plan.batch, 1);
  EXPECT_THAT(std::vector<int32_t>(plan.summary, plan.summary + 9),
              ElementsAre(0, 1, 1, kPadding, -1, 0, kPadding, -1, 0));
  const int32_t* e1 = plan.entries + 2 * kG4.k;  // entry 1's miss records: not written
  EXPECT_EQ(e1[0], 0x5a5a5a5a);
  EXPECT_THAT(out, ElementsAre(0, kG4.slots, kPadding, kPadding, kPadding, kPadding));
}

// Rule 10a: a row of kPadding inside the batch (vLLM pads a batch this way) publishes padding,
// sets no error bit and reads nothing else of its entry (garbage seq_len, duplicate and
// out-of-range positions); the entries around it resolve as they would alone.
TEST(ResolveTest, RowMinusOneIsPaddingAnywhereInTheBatch) {
  ArenaFixture f(kG4, kCap), alone(kG4, kCap);
  for (ArenaFixture* x : {&f, &alone}) {
    x->FillHost(0, 30);
    x->FillHost(1, 30);
  }
  std::vector<int32_t> words((MissPlan::Bytes(kG4, 3) + 3) / 4, 0);
  const MissPlan plan = MissPlan::Of(words.data(), 3);
  std::vector<int32_t> out;
  uint32_t flags = 0;
  EXPECT_EQ(0u, f.Resolve(0, 3, {0, kPadding, 1}, {10, -4, 12}, {1, 2, 5, 5, 3, 4}, &out, 0, &flags, plan));
  EXPECT_EQ(flags, 0u);
  EXPECT_THAT(std::vector<int32_t>(plan.summary + 3, plan.summary + 6), ElementsAre(kPadding, -1, 0));
  std::vector<int32_t> o0, o1;
  ASSERT_EQ(0u, alone.Resolve(0, 1, {0}, {10}, {1, 2}, &o0));
  ASSERT_EQ(0u, alone.Resolve(0, 1, {1}, {12}, {3, 4}, &o1));
  EXPECT_THAT(out, ElementsAre(o0[0], o0[1], kPadding, kPadding, o1[0], o1[1]));
  EXPECT_EQ(f.Snapshot(), alone.Snapshot());  // counters too: two steps, not three
  EXPECT_EQ(f.counters().steps, 2u);
}

// Rule 10b: a list reads only its first seq_len columns. SGLang's top-k buffer keeps the previous
// step's values past a short row's length; whatever they are (a stale duplicate, a position past
// seq_len, below -1), those columns publish kPadding, set no error bit and fetch nothing.
TEST(ResolveTest, ColumnsAtOrPastSeqLenArePadding) {
  const ArenaGeometry g{1, 1, /*slots=*/8, /*k=*/6, 32};
  ArenaFixture f(g, kCap), ref(g, kCap);
  f.FillHost(0, 30);
  ref.FillHost(0, 30);
  std::vector<int32_t> out, want;
  uint32_t flags = 0;
  // seq_len 3: columns 0..2 select; 3..5 hold a duplicate of 1, a position past seq_len and -9.
  EXPECT_EQ(0u, f.Resolve(0, 1, {0}, {3}, {0, 2, 1, 1, 17, -9}, &out, 0, &flags));
  EXPECT_EQ(flags, 0u);
  ASSERT_EQ(0u, ref.Resolve(0, 1, {0}, {3}, {0, 2, 1, -1, -1, -1}, &want));
  EXPECT_EQ(out, want);
  EXPECT_THAT(std::vector<int32_t>(out.begin() + 3, out.end()), ElementsAre(kPadding, kPadding, kPadding));
  EXPECT_EQ(f.Snapshot(), ref.Snapshot());
  // Inside the first seq_len columns the checks hold as before.
  EXPECT_EQ(static_cast<uint32_t>(kResolveDuplicate), f.Resolve(0, 1, {0}, {3}, {1, 1, 0, 4, 4, 4}, &out));
  EXPECT_EQ(static_cast<uint32_t>(kResolveBadPosition), f.Resolve(0, 1, {0}, {3}, {0, 3, 1, 0, 0, 0}, &out));
  // A row at least k long reads every column.
  EXPECT_EQ(static_cast<uint32_t>(kResolveDuplicate), f.Resolve(0, 1, {0}, {6}, {0, 1, 2, 3, 4, 4}, &out));
}

TEST(ResolveTest, ResetRowEmptiesEveryLayer) {
  ArenaFixture f(kG4, kCap);
  f.FillHost(1, 30);
  f.SetState(1, 0, {10, 11, 12, 13}, {3, 2, 1, 0});
  f.SetState(1, 1, {10, 11, 12, 13}, {3, 2, 1, 0});
  f.SetState(0, 1, {10, 11, 12, 13}, {3, 2, 1, 0});
  ResetRowReference(f.view(), 1);
  ResetRowReference(f.view(), 7);  // out of range: nothing
  for (int32_t l = 0; l < 2; ++l) {
    EXPECT_THAT(f.SlotPos(1, l), ElementsAre(-1, -1, -1, -1));
    EXPECT_THAT(f.Lru(1, l), ElementsAre(0, 1, 2, 3));
  }
  EXPECT_THAT(f.SlotPos(0, 1), ElementsAre(10, 11, 12, 13));
}

}  // namespace resolve_reference_test
}  // namespace hisparse
