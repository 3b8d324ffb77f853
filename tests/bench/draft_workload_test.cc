// The workload of `hisparse-bench resolve --draft-tokens` (bench/draft_workload.h): its lists,
// steady state and reference outcomes keep the promises the benchmark's figures rest on, and its
// own checker catches a workload that breaks them.
#include "draft_workload.h"

#include <algorithm>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace hisparse::bench {
namespace draft_workload_test {

DraftPoint Tiny(int32_t n, int32_t batch) {
  DraftPoint p;
  p.draft_tokens = n;
  p.batch = batch;
  p.k = 20;
  p.context = 600;
  p.record_bytes = 32;
  return p;
}

TEST(DraftWorkloadTest, EveryDraftCountKeepsItsPromises) {
  for (int32_t n = 0; n <= 4; ++n) {
    for (int32_t batch : {1, 3}) {
      absl::StatusOr<DraftWorkload> w = MakeDraftWorkload(Tiny(n, batch));
      ASSERT_TRUE(w.ok()) << w.status();
      EXPECT_EQ(CheckDraftWorkload(*w), "") << "n " << n << " batch " << batch;
      EXPECT_EQ(w->point.Slots(), (n + 2) * 20);
      EXPECT_EQ(w->separate.size(), static_cast<size_t>(n + 1));
    }
  }
}

TEST(DraftWorkloadTest, TimedStepFetchesOnlyFreshPositions) {
  const DraftPoint p = Tiny(3, 2);
  absl::StatusOr<DraftWorkload> w = MakeDraftWorkload(p);
  ASSERT_TRUE(w.ok()) << w.status();
  const int32_t fresh = p.k - p.Kept();  // 20 - round(0.8 * 20) = 4
  ASSERT_EQ(fresh, 4);
  EXPECT_EQ(w->multi.misses, 2u * 4 * fresh);
  EXPECT_EQ(w->single.misses, 2u * fresh);
  // Multi-query hits: the union k + 3 * fresh less its misses (rule 8f; no tail position).
  EXPECT_EQ(w->multi.hits, 2u * (p.k + 3 * fresh - 4 * fresh));
  // The slot tables were full before the step: a steady state, not a cold arena.
  for (const DraftTables* t : {&w->multi_before, &w->single_before}) {
    EXPECT_EQ(std::count(t->slot_pos.begin(), t->slot_pos.end(), kEmptySlot), 0);
  }
  // Every fresh position of the timed step is new to its row: none was resident before it.
  const int32_t q = p.Queries(), B = p.Slots();
  for (int32_t r = 0; r < p.batch; ++r) {
    const std::set<int32_t> held(w->multi_before.slot_pos.begin() + r * B,
                                 w->multi_before.slot_pos.begin() + (r + 1) * B);
    const int32_t* step = w->Step(w->steps - 1) + static_cast<size_t>(r) * q * p.k;
    std::set<int32_t> absent;
    for (int32_t x = 0; x < q * p.k; ++x) {
      if (held.count(step[x]) == 0) absent.insert(step[x]);
    }
    EXPECT_EQ(absent.size(), static_cast<size_t>(q * fresh)) << "row " << r;
  }
}

TEST(DraftWorkloadTest, SeedDecidesTheLists) {
  absl::StatusOr<DraftWorkload> a = MakeDraftWorkload(Tiny(1, 2));
  absl::StatusOr<DraftWorkload> b = MakeDraftWorkload(Tiny(1, 2));
  DraftPoint other = Tiny(1, 2);
  other.seed = 2;
  absl::StatusOr<DraftWorkload> c = MakeDraftWorkload(other);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->lists, b->lists);
  EXPECT_NE(a->lists, c->lists);
  // Rows draw their own chains.
  EXPECT_FALSE(std::equal(a->Step(0), a->Step(0) + 40, a->Step(0) + 40));
}

TEST(DraftWorkloadTest, CheckerCatchesBrokenWorkloads) {
  absl::StatusOr<DraftWorkload> w = MakeDraftWorkload(Tiny(2, 2));
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(CheckDraftWorkload(*w), "");
  DraftWorkload bad = *w;
  bad.multi.misses += 1;
  EXPECT_NE(CheckDraftWorkload(bad), "");
  bad = *w;
  bad.lists[1] = bad.lists[0];  // a repeat inside list 0 of row 0
  EXPECT_NE(CheckDraftWorkload(bad), "");
  bad = *w;
  bad.multi.out[0] = (bad.multi.out[0] + 1) % bad.point.Slots();
  EXPECT_NE(CheckDraftWorkload(bad), "");
  bad = *w;
  std::fill(bad.multi_before.slot_pos.begin(), bad.multi_before.slot_pos.end(), kEmptySlot);
  EXPECT_NE(CheckDraftWorkload(bad), "");
  bad = *w;
  bad.separate.back().errors = kResolveUnionTooLarge;
  EXPECT_NE(CheckDraftWorkload(bad), "");
}

TEST(DraftWorkloadTest, PointsThatCannotBeBuiltAreRefused) {
  DraftPoint p = Tiny(1, 1);
  p.overlap = 1.0;  // nothing fresh: no chain
  EXPECT_EQ(MakeDraftWorkload(p).status().code(), absl::StatusCode::kInvalidArgument);
  p = Tiny(3, 1);
  p.slots = 25;  // below one step's union 20 + 3 * 4
  EXPECT_EQ(MakeDraftWorkload(p).status().code(), absl::StatusCode::kInvalidArgument);
  p = Tiny(3, 1);
  p.context = 100;  // the chains need more distinct positions
  EXPECT_EQ(MakeDraftWorkload(p).status().code(), absl::StatusCode::kInvalidArgument);
  p = Tiny(8, 1);  // draft_tokens beyond kMaxDraftTokens
  EXPECT_EQ(MakeDraftWorkload(p).status().code(), absl::StatusCode::kInvalidArgument);
  p = Tiny(0, 1);
  p.record_bytes = 24;  // not a multiple of 16
  EXPECT_EQ(MakeDraftWorkload(p).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace draft_workload_test
}  // namespace hisparse::bench
