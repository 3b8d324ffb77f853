// The online policies beside LRU (hint-aware LRU, LRU-2): hand-worked traces, hint at depth 0 and
// on hintless traces equal to RESOLVE's LRU record for record, Belady >= every online policy on
// random, generated and committed traces, and the study command with hints (the ctest smoke).
// "Online policy" means one with RESOLVE's B regular slots: staging is not one (it keeps the
// previous step's newest token, which RESOLVE never gives a regular slot, so at B = k it can
// beat Belady by that one position a step), and is left out of the Belady bound.
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench_cmd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hisparse/trace/generate.h"
#include "hisparse/trace/locality.h"
#include "hisparse/trace/replay.h"
#include "hisparse/trace/trace.h"
#include "trace_test_util.h"

namespace hisparse::trace {
namespace trace_policy_test {

using ::hisparse::trace::testing::TempDir;
using ::testing::HasSubstr;

ReplayResult MustReplay(const TraceHeader& h, const std::vector<TraceRecord>& recs, int32_t slots, Policy policy,
                        int32_t hint_depth = -1) {
  auto r = ReplayRecords(h, recs, ReplayOptions{slots, policy, 0, hint_depth});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : ReplayResult{};
}

// Every count of two replays, per layer and in total, percentiles included.
void ExpectSameCounts(const ReplayResult& a, const ReplayResult& b, const std::string& what) {
  auto same = [&](const ReplayCounts& x, const ReplayCounts& y, const std::string& where) {
    EXPECT_EQ(x.selections, y.selections) << what << where;
    EXPECT_EQ(x.hits, y.hits) << what << where;
    EXPECT_EQ(x.misses, y.misses) << what << where;
    EXPECT_EQ(x.misses_p50, y.misses_p50) << what << where;
    EXPECT_EQ(x.misses_p99, y.misses_p99) << what << where;
    EXPECT_EQ(x.misses_max, y.misses_max) << what << where;
  };
  same(a.total, b.total, " total");
  ASSERT_EQ(a.per_layer.size(), b.per_layer.size());
  for (size_t l = 0; l < a.per_layer.size(); ++l) same(a.per_layer[l], b.per_layer[l], " layer " + std::to_string(l));
}

TEST(TracePolicyTest, HintKeepsTheHintedPosition) {
  // k = 2, B = 3, one stream; seq_len 100 keeps the newest token out of the selections.
  //   step 0: [0 1]          slots (LRU first): [e 0 1]
  //   step 1: [2 3], hint 0  LRU: 2, 3 take e and 0 -> [1 2 3]; hint: e, then 1 (0 is hinted) -> [0 2 3]
  //   step 2: [0]            LRU: a miss; hint: a hit
  const TraceHeader h{2, 1, 1, {}};
  const std::vector<TraceRecord> recs = {
      {0, 0, 0, 100, {0, 1}, {}}, {1, 0, 0, 100, {2, 3}, {0}}, {2, 0, 0, 100, {0}, {}}};
  EXPECT_EQ(MustReplay(h, recs, 3, Policy::kLru).total.hits, 0u);
  EXPECT_EQ(MustReplay(h, recs, 3, Policy::kHint).total.hits, 1u);
  EXPECT_EQ(MustReplay(h, recs, 3, Policy::kHint, 0).total.hits, 0u);  // depth 0: LRU
  // When every unselected slot is hinted, the hinted ones go in LRU order: 2 and 3 take e and 0.
  const std::vector<TraceRecord> all_hinted = {
      {0, 0, 0, 100, {0, 1}, {}}, {1, 0, 0, 100, {2, 3}, {0}}, {2, 0, 0, 100, {1}, {}}};
  EXPECT_EQ(MustReplay(h, all_hinted, 3, Policy::kHint).total.hits, 0u);  // 1 was evicted for the hint
  EXPECT_EQ(MustReplay(h, all_hinted, 3, Policy::kLru).total.hits, 1u);
}

TEST(TracePolicyTest, Lru2KeepsThePositionSelectedTwice) {
  // k = 2, B = 3: 1 is selected at steps 0 and 1, then 2, 3 and 4 once each.
  //   step 2: [2 3] evicts e and 0 (0 was selected twice too, but longer ago) -> slots {1, 2, 3}
  //   step 3: [4]   LRU evicts 1 (least recent); LRU-2 evicts 2 (selected once: infinite distance)
  //   step 4: [1]   LRU: a miss; LRU-2: a hit
  const TraceHeader h{2, 1, 0, {}};
  const std::vector<TraceRecord> recs = {{0, 0, 0, 100, {0, 1}, {}},
                                         {1, 0, 0, 100, {0, 1}, {}},
                                         {2, 0, 0, 100, {2, 3}, {}},
                                         {3, 0, 0, 100, {4}, {}},
                                         {4, 0, 0, 100, {1}, {}}};
  EXPECT_EQ(MustReplay(h, recs, 3, Policy::kLru).total.hits, 2u);
  EXPECT_EQ(MustReplay(h, recs, 3, Policy::kLru2).total.hits, 3u);
}

// A random trace with hints: `streams` requests of one layer each (plus a second layer), k
// selections mostly drawn from a drifting window so positions recur, hints from the window too.
std::vector<TraceRecord> RandomHintedTrace(std::mt19937* rng, int32_t k, int32_t h, int32_t steps) {
  std::vector<TraceRecord> recs;
  for (int32_t t = 0; t < steps; ++t) {
    for (int32_t req = 0; req < 3; ++req) {
      for (int32_t l = 0; l < 2; ++l) {
        const int32_t seq_len = 4 * k + t;
        std::vector<int32_t> pool(seq_len);
        for (int32_t p = 0; p < seq_len; ++p) pool[p] = p;
        // Favour a window that drifts with t: shuffle it first, then the rest.
        const int32_t lo = (t * 3) % (2 * k), hi = std::min(seq_len, lo + 2 * k);
        std::shuffle(pool.begin() + lo, pool.begin() + hi, *rng);
        std::rotate(pool.begin(), pool.begin() + lo, pool.begin() + hi);
        std::shuffle(pool.begin() + (hi - lo), pool.end(), *rng);
        if ((*rng)() % 4 == 0) std::swap(pool[0], pool[seq_len - 1]);  // sometimes the newest token
        TraceRecord r{t, l, req, seq_len, {}, {}};
        const int32_t n = k - static_cast<int32_t>((*rng)() % 3);
        r.positions.assign(pool.begin(), pool.begin() + n);
        r.hints.assign(pool.begin() + n, pool.begin() + n + h);
        recs.push_back(std::move(r));
      }
    }
  }
  return recs;
}

TEST(TracePolicyTest, HintAtDepthZeroIsLruAndBeladyBeatsEveryOnlinePolicy) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 12; ++trial) {
    const int32_t k = 4 + trial, h = k;
    const TraceHeader header{k, 2, h, {}};
    const std::vector<TraceRecord> recs = RandomHintedTrace(&rng, k, h, 30);
    for (int32_t b : {k, k + 1, 3 * k / 2, 2 * k, 4 * k}) {
      const std::string what = "trial " + std::to_string(trial) + " B " + std::to_string(b);
      const ReplayResult lru = MustReplay(header, recs, b, Policy::kLru);
      ExpectSameCounts(MustReplay(header, recs, b, Policy::kHint, 0), lru, what + " hint@0");
      const ReplayResult bel = MustReplay(header, recs, b, Policy::kBelady);
      for (const ReplayResult& online :
           {lru, MustReplay(header, recs, b, Policy::kHint), MustReplay(header, recs, b, Policy::kHint, h / 2),
            MustReplay(header, recs, b, Policy::kLru2)}) {
        EXPECT_GE(bel.total.hits, online.total.hits) << what << " " << PolicyName(online.policy);
        for (size_t l = 0; l < bel.per_layer.size(); ++l) {
          EXPECT_GE(bel.per_layer[l].hits, online.per_layer[l].hits) << what << " layer " << l;
        }
      }
    }
  }
}

TEST(TracePolicyTest, PropertiesHoldOnGeneratedTraces) {
  for (const std::string& preset : PresetNames()) {
    GeneratorOptions o;
    o.preset = *FindPreset(preset);
    o.requests = 2;
    o.layers = 3;
    o.steps = 32;
    o.context = 1024;
    o.k = 64;
    o.hints = 64;
    std::vector<TraceRecord> recs;
    ASSERT_TRUE(GenerateTrace(o, [&](const TraceRecord& r) {
                  recs.push_back(r);
                  return absl::OkStatus();
                }).ok());
    const TraceHeader header = GeneratedHeader(o);
    for (int32_t b : {64, 96, 128, 256}) {
      const ReplayResult lru = MustReplay(header, recs, b, Policy::kLru);
      ExpectSameCounts(MustReplay(header, recs, b, Policy::kHint, 0), lru, preset + " hint@0");
      const uint64_t best = MustReplay(header, recs, b, Policy::kBelady).total.hits;
      for (Policy p : {Policy::kLru, Policy::kHint, Policy::kLru2}) {
        EXPECT_GE(best, MustReplay(header, recs, b, p).total.hits) << preset << " B " << b << " " << PolicyName(p);
      }
    }
  }
}

// The committed traces (bench/traces): hint and lru2 run on the real RESOLVE's mechanics, so
// with no hints (or depth 0) hint is today's lru figure for figure; Belady bounds them all.
TEST(TracePolicyTest, CommittedTracesReproduceLru) {
  const std::string dir = std::string(HISPARSE_SOURCE_DIR) + "/bench/traces/";
  for (const char* name :
       {"dsv32-small.trace.gz", "stress-small.trace.gz", "local-small.trace.gz", "debian-dsa-small.trace.gz",
        "debian-quest-small.trace.gz", "debian-dsa-hints-small.trace.gz", "debian-quest-hints-small.trace.gz"}) {
    auto trace = LoadTrace(dir + name);
    ASSERT_TRUE(trace.ok()) << trace.status();
    const int32_t k = trace->header().k;
    for (int32_t b : {k, 3 * k / 2, 2 * k, 4 * k}) {
      auto run = [&](Policy p, int32_t depth) {
        auto r = Replay(*trace, ReplayOptions{b, p, 0, depth});
        EXPECT_TRUE(r.ok()) << r.status();
        return r.ok() ? *r : ReplayResult{};
      };
      const ReplayResult lru = run(Policy::kLru, -1);
      const ReplayResult hint = run(Policy::kHint, -1);
      if (trace->header().hints == 0) ExpectSameCounts(hint, lru, std::string(name) + " hint");
      ExpectSameCounts(run(Policy::kHint, 0), lru, std::string(name) + " hint@0");
      const uint64_t best = run(Policy::kBelady, -1).total.hits;
      EXPECT_GE(best, lru.total.hits) << name;
      EXPECT_GE(best, hint.total.hits) << name;
      EXPECT_GE(best, run(Policy::kLru2, -1).total.hits) << name;
    }
  }
}

int RunTrace(std::vector<std::string> args, std::string* out) {
  return testing::RunCommand(bench::TraceMain, "trace", std::move(args), out);
}

// The study with hints, on a tiny version-2 trace (seconds): what bench/RESULTS.md's hint study
// runs, in small.
TEST(TracePolicyTest, StudyCommandWithHintsSmoke) {
  TempDir dir;
  const std::string a = dir.Write("a.trace.gz",
                                  "hisparse-trace 2\nk 2\nlayers 1\nhints 2\n"
                                  "S 0 0 1 10 1 2\nH 0 0 1 3 4\nS 1 0 1 11 2 5\nH 1 0 1 3 1\nS 2 0 1 12 3 1\n");
  std::string out;
  ASSERT_EQ(0, RunTrace({"--trace", a, "--policy", "all", "--ratios", "1,1.5", "--hints", "1,0.5", "--json"}, &out));
  EXPECT_THAT(out, HasSubstr("\"policy\": \"hint\", \"ratio\": 1.5, \"label\": \"hint@1\", \"hint_depth\": 2"));
  EXPECT_THAT(out, HasSubstr("\"label\": \"hint@0.5\", \"hint_depth\": 1, \"hint_ratio\": 0.5"));
  EXPECT_THAT(out, HasSubstr("\"policy\": \"lru2\", \"ratio\": 1.5"));
  EXPECT_EQ(0, RunTrace({"--trace", a, "--policy", "hint,lru", "--slots", "3", "--hints", "1"}, &out));
  EXPECT_THAT(out, HasSubstr("hint@1"));
  EXPECT_EQ(0, RunTrace({"--trace", a, "--policy", "hint", "--slots", "3", "--hints", "0.5", "--json"}, &out));
  EXPECT_THAT(out, HasSubstr("\"policy\": \"hint\", \"slots\": 3, \"k\": 2, \"layers\": 1, \"hint_depth\": 1"));
  EXPECT_EQ(2, RunTrace({"--trace", a, "--policy", "hint", "--slots", "3", "--hints", "-1"}, &out));
  EXPECT_EQ(2, RunTrace({"--trace", a, "--policy", "hint", "--slots", "3", "--hints", "x"}, &out));
  EXPECT_EQ(2, RunTrace({"--trace", a, "--policy", "lru3", "--slots", "3"}, &out));
}

}  // namespace trace_policy_test
}  // namespace hisparse::trace
