// Policy replay (lru, belady, staging) on hand-worked traces, LRU against an independent model,
// Belady >= LRU on random traces, and the `hisparse-bench trace` command's exit codes.
#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "bench_cmd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hisparse/trace/replay.h"
#include "hisparse/trace/trace.h"
#include "trace_test_util.h"

namespace hisparse::trace {
namespace trace_replay_test {

using ::hisparse::trace::testing::TempDir;
using ::testing::HasSubstr;

ReplayResult MustReplay(const TraceHeader& h, const std::vector<TraceRecord>& recs, int32_t slots, Policy policy) {
  auto r = ReplayRecords(h, recs, ReplayOptions{slots, policy, 0});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : ReplayResult{};
}

TEST(TraceReplayTest, LruAndBeladyHandWorked) {
  // One stream, k = 2, B = 2; seq_len grows so the newest token is seq_len - 1.
  //   step 0: [1 2]  -> 2 misses                     LRU slots: {1, 2}
  //   step 1: [2 3]  -> 2 hit, 3 miss evicts 1       {3, 2}
  //   step 2: [1 11] -> 11 newest hit, 1 miss evicts 3
  //   step 3: [3 2]  -> 2 hit, 3 miss evicts 1
  const TraceHeader h{2, 1, 0, {}};
  const std::vector<TraceRecord> recs = {
      {0, 0, 5, 10, {1, 2}, {}}, {1, 0, 5, 11, {2, 3}, {}}, {2, 0, 5, 12, {1, 11}, {}}, {3, 0, 5, 13, {3, 2}, {}}};
  const ReplayResult lru = MustReplay(h, recs, 2, Policy::kLru);
  EXPECT_EQ(lru.total.selections, 8u);
  EXPECT_EQ(lru.total.hits, 3u);
  EXPECT_EQ(lru.total.misses, 5u);
  EXPECT_EQ(lru.streams, 1u);
  EXPECT_EQ(MustReplay(h, recs, 2, Policy::kBelady).total.hits, 3u);
  EXPECT_EQ(MustReplay(h, recs, 4, Policy::kLru).total.hits, 5u);  // no eviction: 0+1+2+2
}

TEST(TraceReplayTest, BeladyBeatsLruOnACycle) {
  // k = 1, B = 2 over the cycle 1 2 3 1 2 3 (two streams): LRU misses all; Belady evicts the
  // position used farthest ahead and hits at steps 3 and 5.
  const TraceHeader h{1, 2, 0, {}};
  std::vector<TraceRecord> recs;
  const int cycle[] = {1, 2, 3, 1, 2, 3};
  for (int s = 0; s < 6; ++s) {
    recs.push_back({s, 0, 1, 100, {cycle[s]}, {}});
    recs.push_back({s, 1, 2, 100, {cycle[s] + 10}, {}});
  }
  const ReplayResult lru = MustReplay(h, recs, 2, Policy::kLru);
  const ReplayResult bel = MustReplay(h, recs, 2, Policy::kBelady);
  EXPECT_EQ(lru.total.hits, 0u);
  EXPECT_EQ(bel.per_layer[0].hits, 2u);
  EXPECT_EQ(bel.per_layer[1].hits, 2u);
  EXPECT_EQ(bel.per_layer[1].misses, 4u);
  EXPECT_EQ(bel.streams, 2u);
  EXPECT_DOUBLE_EQ(bel.total.hit_rate(), 4.0 / 12);
}

TEST(TraceReplayTest, StagingHoldsThePreviousSelection) {
  const TraceHeader h{3, 1, 0, {}};
  const std::vector<TraceRecord> recs = {
      {0, 0, 1, 10, {1, 2, 3}, {}},   // 0 hits
      {1, 0, 1, 10, {1, 2, 3}, {}},   // 3 hits: the selection repeats
      {2, 0, 1, 10, {2, 3, 4}, {}},   // 2 hits
      {2, 0, 2, 10, {2, 3, 4}, {}},   // another request: its own buffer, 0 hits
      {5, 0, 1, 11, {10, 4, 1}, {}},  // newest 10 + 4 hit, 1 miss (step 1's selection is gone)
      {6, 0, 1, 12, {10, 11}, {}},    // 10 was in the previous selection, 11 is the newest
  };
  const ReplayResult st = MustReplay(h, recs, 3, Policy::kStaging);
  EXPECT_EQ(st.total.selections, 17u);
  EXPECT_EQ(st.total.hits, 0u + 3 + 2 + 0 + 2 + 2);
  // LRU (B = 3): step 2 evicts 1 for 4 and step 5 evicts 2 for 1; the newest token of step 5
  // (10) never entered a slot, so step 6 misses it: 0 + 3 + 2 + 0 + 2 + 1.
  EXPECT_EQ(MustReplay(h, recs, 3, Policy::kLru).total.hits, 8u);
}

// Straightforward position-level LRU of the RESOLVE rules: the list is least -> most recent.
uint64_t ModelLruHits(const std::vector<TraceRecord>& recs, int32_t slots, int32_t layer) {
  std::map<int64_t, std::vector<int32_t>> lists;  // request -> resident positions, LRU first
  uint64_t hits = 0;
  for (const TraceRecord& r : recs) {
    if (r.layer != layer) continue;
    std::vector<int32_t>& list = lists[r.request];
    std::vector<int32_t> hit, miss;
    for (int32_t p : r.positions) {
      if (p == r.seq_len - 1) {
        ++hits;
      } else if (std::find(list.begin(), list.end(), p) != list.end()) {
        ++hits;
        hit.push_back(p);
      } else {
        miss.push_back(p);
      }
    }
    std::vector<int32_t> untouched, hits_old_order;
    for (int32_t p : list) {
      (std::find(hit.begin(), hit.end(), p) != hit.end() ? hits_old_order : untouched).push_back(p);
    }
    const size_t room = slots - list.size();  // empty slots go first
    const size_t evict = miss.size() > room ? miss.size() - room : 0;
    untouched.erase(untouched.begin(), untouched.begin() + evict);
    list = untouched;
    list.insert(list.end(), miss.begin(), miss.end());
    list.insert(list.end(), hits_old_order.begin(), hits_old_order.end());
  }
  return hits;
}

std::vector<TraceRecord> RandomTrace(std::mt19937& rng, int32_t k, int32_t layers) {
  std::vector<TraceRecord> recs;
  const int32_t requests = std::uniform_int_distribution<int32_t>(1, 4)(rng);
  std::vector<int32_t> seq(requests);
  std::map<std::pair<int, int>, std::vector<int32_t>> prev;
  for (auto& s : seq) s = std::uniform_int_distribution<int32_t>(1, 60)(rng);
  for (int64_t step = 0; step < 60; ++step) {
    for (int32_t q = 0; q < requests; ++q) {
      if (rng() % 5 == 0) continue;  // the request skips this step
      ++seq[q];
      for (int32_t l = 0; l < layers; ++l) {
        std::set<int32_t> sel;
        const int32_t n = std::uniform_int_distribution<int32_t>(0, std::min(k, seq[q]))(rng);
        if (n > 0 && rng() % 2) sel.insert(seq[q] - 1);
        for (int32_t p : prev[{q, l}]) {
          if (static_cast<int32_t>(sel.size()) < n && rng() % 10 < 6) sel.insert(p);
        }
        while (static_cast<int32_t>(sel.size()) < n) sel.insert(rng() % seq[q]);
        std::vector<int32_t> v(sel.begin(), sel.end());
        std::shuffle(v.begin(), v.end(), rng);
        prev[{q, l}] = v;
        recs.push_back({step, l, q * 1000 + 3, seq[q], v, {}});
      }
    }
  }
  return recs;
}

TEST(TraceReplayTest, RandomTracesLruMatchesModelAndBeladyIsNoWorse) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 150; ++trial) {
    const int32_t k = std::uniform_int_distribution<int32_t>(1, 10)(rng);
    const int32_t layers = std::uniform_int_distribution<int32_t>(1, 3)(rng);
    const int32_t slots = k + std::uniform_int_distribution<int32_t>(0, 2 * k)(rng);
    const std::vector<TraceRecord> recs = RandomTrace(rng, k, layers);
    const TraceHeader h{k, layers, 0, {}};
    const ReplayResult lru = MustReplay(h, recs, slots, Policy::kLru);
    const ReplayResult bel = MustReplay(h, recs, slots, Policy::kBelady);
    const ReplayResult st = MustReplay(h, recs, slots, Policy::kStaging);
    for (int32_t l = 0; l < layers; ++l) {
      ASSERT_EQ(lru.per_layer[l].hits, ModelLruHits(recs, slots, l)) << "trial " << trial;
      ASSERT_GE(bel.per_layer[l].hits, lru.per_layer[l].hits) << "trial " << trial;
      ASSERT_EQ(bel.per_layer[l].selections, lru.per_layer[l].selections);
      ASSERT_EQ(st.per_layer[l].hits + st.per_layer[l].misses, st.per_layer[l].selections);
    }
  }
}

TEST(TraceReplayTest, FileReplayAndErrors) {
  TempDir dir;
  const std::string text = "hisparse-trace 1\nk 2\nlayers 2\nS 0 0 1 10 1 2\nS 0 1 1 10 9\nS 1 0 1 11 2 3\n";
  const std::string path = dir.Write("t.trace.gz", text);
  auto r = ReplayTrace(path, ReplayOptions{2, Policy::kLru, 656});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->records, 3u);
  EXPECT_EQ(r->per_layer[0].hits, 1u);
  EXPECT_EQ(r->per_layer[1].hits, 1u);  // newest token
  EXPECT_EQ(r->total.misses, 3u);
  const std::string json = ReplayResultJson(*r, path);
  EXPECT_THAT(json, HasSubstr("\"total\": {\"selections\": 5, \"hits\": 2, \"misses\": 3, "
                              "\"hit_rate\": 0.400000, \"bytes_fetched\": 1968, \"misses_p50\": 1, "
                              "\"misses_p99\": 2, \"misses_max\": 2}"));
  EXPECT_THAT(json, HasSubstr("{\"layer\": 1, \"selections\": 1, \"hits\": 1"));
  EXPECT_THAT(ReplayResultTable(*r, path), HasSubstr("bytes_fetched"));
  EXPECT_EQ(ReplayTrace(path, ReplayOptions{1, Policy::kLru, 0}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const std::string bad = dir.Write("bad.trace", "hisparse-trace 1\nk 2\nlayers 2\nS 0 0 1 10 1 1\n");
  auto b = ReplayTrace(bad, ReplayOptions{2, Policy::kBelady, 0});
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(b.status().message()), HasSubstr(bad + ":4: "));
  EXPECT_FALSE(ParsePolicy("fifo").ok());
  EXPECT_EQ(*ParsePolicy("staging"), Policy::kStaging);
}

int RunCmd(std::vector<std::string> args) {
  args.insert(args.begin(), "trace");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return bench::TraceMain(static_cast<int>(argv.size()), argv.data());
}

TEST(TraceReplayTest, CommandExitCodes) {
  TempDir dir;
  const std::string good = dir.Write("g.trace", "hisparse-trace 1\nk 2\nlayers 1\nS 0 0 1 10 1 2\n");
  const std::string bad = dir.Write("b.trace", "hisparse-trace 1\nk 2\nlayers 1\nS 0 3 1 10 1\n");
  EXPECT_EQ(0, RunCmd({"--trace", good, "--slots", "2", "--policy", "lru", "--json"}));
  EXPECT_EQ(0, RunCmd({"--trace=" + good, "--slots=4", "--policy=belady", "--record-bytes", "16"}));
  EXPECT_EQ(1, RunCmd({"--trace", bad, "--slots", "2", "--policy", "staging"}));
  EXPECT_EQ(1, RunCmd({"--trace", dir.Path("missing"), "--slots", "2", "--policy", "lru"}));
  EXPECT_EQ(2, RunCmd({"--trace", good, "--slots", "1", "--policy", "lru"}));  // B < k
  EXPECT_EQ(2, RunCmd({"--trace", good, "--slots", "2", "--policy", "fifo"}));
  EXPECT_EQ(2, RunCmd({"--trace", good, "--slots", "x", "--policy", "lru"}));
  EXPECT_EQ(2, RunCmd({"--trace", good, "--policy", "lru"}));
  EXPECT_EQ(2, RunCmd({"--trace", good, "--slots", "2", "--policy", "lru", "--bogus"}));
  EXPECT_EQ(2, RunCmd({"--trace"}));
}

}  // namespace trace_replay_test
}  // namespace hisparse::trace
