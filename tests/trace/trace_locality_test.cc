// Locality statistics (overlaps, reuse distances), per-record miss percentiles and the study
// mode of `hisparse-bench trace`, on hand-worked traces.
#include <string>
#include <utility>
#include <vector>

#include "bench_cmd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hisparse/trace/locality.h"
#include "hisparse/trace/replay.h"
#include "hisparse/trace/trace.h"
#include "trace_test_util.h"

namespace hisparse::trace {
namespace trace_locality_test {

using ::hisparse::trace::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Request 7, k = 3. Layer 0 at steps 0, 1, 3 (the request skips step 2) and 7; layer 1 at steps
// 0 and 1 only.
const TraceHeader kHeader{3, 2, 0, {}};
const std::vector<TraceRecord> kRecords = {
    {0, 0, 7, 10, {1, 2, 3}, {}}, {0, 1, 7, 10, {9, 2, 1}, {}},   // 9 is layer 1's newest token
    {1, 1, 7, 11, {4}, {}},       {1, 0, 7, 11, {4, 1, 2}, {}},   // layers in either order within a step
    {3, 0, 7, 12, {1, 5, 4}, {}}, {7, 0, 7, 13, {2, 1, 12}, {}},  // 12 is the newest token
};

LocalityStats Measure(const TraceHeader& h, const std::vector<TraceRecord>& recs) {
  LocalityMeter meter(h.layers);
  for (const TraceRecord& r : recs) meter.Add(r);
  return meter.Finish();
}

TEST(TraceLocalityTest, OverlapsHandWorked) {
  const LocalityStats s = Measure(kHeader, kRecords);
  // Layer 0: {1,2,4} vs {1,2,3}: 2/3; {1,4,5} vs {1,2,4}: 2/3; {1,2,12} vs {1,4,5}: 1/3.
  EXPECT_EQ(s.consecutive[0].count, 3u);
  EXPECT_NEAR(s.consecutive[0].mean(), 5.0 / 9, 1e-12);
  // Layer 1: {4} vs {1,2,9}: 0 of 1.
  EXPECT_EQ(s.consecutive[1].count, 1u);
  EXPECT_EQ(s.consecutive[1].mean(), 0.0);
  // Layers 0 and 1 meet at steps 0 ({1,2,3} vs {1,2,9}: 2/3) and 1 ({1,2,4} vs {4}: 1/3).
  ASSERT_EQ(s.adjacent.size(), 1u);
  EXPECT_EQ(s.adjacent[0].count, 2u);
  EXPECT_NEAR(s.adjacent[0].mean(), 0.5, 1e-12);
  EXPECT_NEAR(s.MeanConsecutive(0, 1), (5.0 / 9 + 0) / 2, 1e-12);
  EXPECT_EQ(s.MeanAdjacent(3, 5), 0.0);  // no such pairs
}

TEST(TraceLocalityTest, ReuseDistanceHandWorked) {
  const LocalityStats s = Measure(kHeader, kRecords);
  // Layer 0: position 1 at steps 0,1,3,7 -> distances 1, 2, 4; position 2 at 0,1,7 -> 1, 6;
  // position 4 at 1,3 -> 2. Log2 buckets [1] [2,3] [4,7]: 2, 2, 2. The last use of each of the
  // six distinct positions (1,2,3,4,5,12) is never reused.
  EXPECT_THAT(s.reuse[0].buckets, ElementsAre(2, 2, 2));
  EXPECT_EQ(s.reuse[0].never, 6u);
  // Layer 1: 1, 2, 9, 4 are each selected once.
  EXPECT_THAT(s.reuse[1].buckets, ElementsAre(0, 0, 0));
  EXPECT_EQ(s.reuse[1].never, 4u);
  EXPECT_THAT(s.reuse_total.buckets, ElementsAre(2, 2, 2));
  EXPECT_EQ(s.reuse_total.never, 10u);
  EXPECT_EQ(s.reuse_total.total(), 16u);  // every selection lands in exactly one bucket
}

TEST(TraceLocalityTest, MissPercentilesPerRecord) {
  // LRU, B = 3. Layer 0: step 0 misses 3 (cold); step 1 misses 4 (evicts 3); step 3 misses 5
  // (evicts 2, the least recent non-hit); step 7: 12 is the newest, 1 hits, 2 misses -> 3,1,1,1.
  // Layer 1: step 0 misses 1 and 2 (9 is the newest), step 1 misses 4 -> 2,1.
  auto r = ReplayRecords(kHeader, kRecords, ReplayOptions{3, Policy::kLru, 0});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->per_layer[0].misses, 6u);
  EXPECT_EQ(r->per_layer[0].misses_p50, 1u);  // nearest rank: 2nd of 1,1,1,3
  EXPECT_EQ(r->per_layer[0].misses_p99, 3u);
  EXPECT_EQ(r->per_layer[1].misses_p50, 1u);
  EXPECT_EQ(r->per_layer[1].misses_p99, 2u);
  EXPECT_EQ(r->total.misses_p50, 1u);  // 3rd of 1,1,1,1,2,3
  EXPECT_EQ(r->total.misses_p99, 3u);
  EXPECT_EQ(r->total.misses_max, 3u);
  // Staging keeps the previous selection only: the same misses here.
  auto st = ReplayRecords(kHeader, kRecords, ReplayOptions{3, Policy::kStaging, 0});
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->total.misses, 9u);
  EXPECT_EQ(st->per_layer[0].misses_p99, 3u);
}

TEST(TraceLocalityTest, StudyRunsEveryPolicyAtEveryB) {
  StudyOptions o;
  o.policies = {Policy::kLru, Policy::kBelady};
  o.slots = {4};
  o.ratios = {1, 1.5, 2};
  auto s = StudyRecords(kHeader, kRecords, o);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->runs.size(), 8u);  // 2 policies x 4 B
  EXPECT_EQ(s->runs[0].result.slots, 4);
  EXPECT_EQ(s->runs[0].ratio, 0.0);
  EXPECT_EQ(s->runs[2].result.slots, 5);  // ceil(1.5 * 3)
  EXPECT_EQ(s->runs[3].result.slots, 6);
  EXPECT_EQ(s->runs[6].result.policy, Policy::kBelady);
  EXPECT_EQ(s->runs[6].result.slots, 5);
  EXPECT_GE(s->runs[6].result.total.hits, s->runs[2].result.total.hits);  // Belady >= LRU
  EXPECT_EQ(s->records, 6u);
  EXPECT_EQ(s->streams, 2u);
  EXPECT_EQ(s->locality.reuse_total.never, 10u);
  const std::string json = LocalityStudyJson(*s);
  EXPECT_THAT(json, HasSubstr("\"overlap\": {\"consecutive\": [0.5556, 0.0000], \"adjacent\": [0.5000]}"));
  EXPECT_THAT(json, HasSubstr("\"buckets\": [\"1\", \"2-3\", \"4-7\"], \"total\": "
                              "{\"counts\": [2, 2, 2], \"never\": 10}"));
  EXPECT_THAT(json, HasSubstr("{\"policy\": \"lru\", \"ratio\": 1.5, \"slots\": 5, \"total\": {"));
  EXPECT_THAT(LocalityStudyTable(*s), HasSubstr("reuse distance"));

  o.ratios = {0.5};
  EXPECT_EQ(StudyRecords(kHeader, kRecords, o).status().code(), absl::StatusCode::kInvalidArgument);
}

int RunTrace(std::vector<std::string> args, std::string* out) {
  return testing::RunCommand(bench::TraceMain, "trace", std::move(args), out);
}

TEST(TraceLocalityTest, StudyCommand) {
  TempDir dir;
  const std::string a = dir.Write("a.trace.gz", "hisparse-trace 1\nk 2\nlayers 1\nS 0 0 1 10 1 2\nS 1 0 1 11 2 3\n");
  const std::string b = dir.Write("b.trace", "hisparse-trace 1\nk 2\nlayers 1\nS 0 0 4 10 5 9\n");
  std::string out;
  ASSERT_EQ(0, RunTrace({"--trace", a, "--trace", b, "--policy", "all", "--ratios", "1,1.5,4", "--json"}, &out));
  EXPECT_THAT(out, HasSubstr("{\"traces\": [\n{\"trace\": "));
  EXPECT_THAT(out, HasSubstr("\"policy\": \"staging\", \"ratio\": 4, \"slots\": 8"));
  EXPECT_THAT(out, HasSubstr("\"consecutive\": [0.5000]"));
  EXPECT_THAT(out, HasSubstr("b.trace"));
  EXPECT_EQ(0, RunTrace({"--trace", a, "--policy", "lru", "--slots", "2", "--study"}, &out));
  EXPECT_THAT(out, HasSubstr("consecutive steps"));
  EXPECT_EQ(0, RunTrace({"--trace", a, "--policy", "lru,belady", "--slots", "2,3"}, &out));
  EXPECT_THAT(out, HasSubstr("belady"));
  // The single-replay form is unchanged.
  EXPECT_EQ(0, RunTrace({"--trace", a, "--policy", "lru", "--slots", "2", "--json"}, &out));
  EXPECT_THAT(out, HasSubstr("{\"trace\": "));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("traces")));

  EXPECT_EQ(2, RunTrace({"--trace", a, "--policy", "all", "--ratios", "0.5"}, &out));
  EXPECT_EQ(2, RunTrace({"--trace", a, "--policy", "all", "--ratios", "x"}, &out));
  EXPECT_EQ(2, RunTrace({"--trace", a, "--policy", "lru,fifo", "--ratios", "1"}, &out));
  EXPECT_EQ(2, RunTrace({"--trace", a, "--policy", "all"}, &out));                    // no B
  EXPECT_EQ(2, RunTrace({"--trace", a, "--policy", "all", "--slots", "1,2"}, &out));  // B < k
  EXPECT_EQ(
      1, RunTrace({"--trace", a, "--trace", dir.Path("missing"), "--policy", "lru", "--ratios", "1", "--json"}, &out));
  EXPECT_THAT(out, HasSubstr("]}"));  // what was printed before the failure is closed
}

}  // namespace trace_locality_test
}  // namespace hisparse::trace
