// Exact layer-wise prefetch on the CPU reference: an anchor's RESOLVE records its miss plan, and
// replaying the plan into the layers that share its selection leaves the whole arena (slot
// tables, LRU orders, slot bytes, counters) byte-identical to running RESOLVE on every layer.
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "arena_fixture.h"
#include "gtest/gtest.h"
#include "hisparse/kernels/resolve.h"

namespace hisparse {
namespace replay_reference_test {

using testing::ArenaFixture;

// Plan storage in plain memory, as the host backend keeps it.
struct PlanBuffer {
  PlanBuffer(const ArenaGeometry& g, int32_t max_batch)
      : words((MissPlan::Bytes(g, max_batch) + 3) / 4, 0x5a5a5a5a), plan(MissPlan::Of(words.data(), max_batch)) {}
  std::vector<int32_t> words;
  MissPlan plan;
};

// Selections with some locality: most of the previous step's positions stay, the rest are fresh,
// plus the newest token; an optional duplicate makes the row invalid.
std::vector<int32_t> Select(std::mt19937& rng, const std::vector<int32_t>& prev, int32_t k, int32_t seq_len,
                            bool make_invalid) {
  std::vector<int32_t> sel;
  std::vector<char> used(seq_len, 0);
  auto take = [&](int32_t p) {
    if (p >= 0 && p < seq_len && !used[p] && static_cast<int32_t>(sel.size()) < k) {
      used[p] = 1;
      sel.push_back(p);
    }
  };
  take(seq_len - 1);
  for (int32_t p : prev) {
    if (rng() % 4 != 0) take(p);
  }
  for (int tries = 0; static_cast<int32_t>(sel.size()) < k - 1 && tries < 10 * k; ++tries) {
    take(static_cast<int32_t>(rng() % seq_len));
  }
  std::shuffle(sel.begin(), sel.end(), rng);
  if (make_invalid && sel.size() >= 2) sel[1] = sel[0];
  sel.resize(k, kPadding);
  return sel;
}

void AppendAll(ArenaFixture& f, int32_t layer, int32_t batch, const std::vector<int32_t>& rows,
               const std::vector<int32_t>& seq_lens, const std::vector<uint8_t>& src) {
  AppendDesc a{};
  a.arena = f.view();
  a.host = f.host();
  a.layer = layer;
  a.max_batch = static_cast<int32_t>(rows.size());
  a.batch_size = &batch;
  a.rows = rows.data();
  a.seq_lens = seq_lens.data();
  a.src = src.data();
  a.src_stride = f.geometry().record_bytes;
  ASSERT_EQ(AppendReference(a), 0u);
}

TEST(ReplayReference, EqualsPerLayerResolveOverManySteps) {
  // Layers 1 and 2 follow anchor 0; layer 3 is its own anchor with no follower; layer 4 follows 3.
  const std::vector<int32_t> anchor = {0, 0, 0, 3, 3};
  const ArenaGeometry g{6, 5, 24, 8, 48};
  const int32_t capacity = 400;
  ArenaFixture full(g, capacity), pref(g, capacity);
  const int32_t max_batch = 5;  // one padded entry: the batch is 4 rows
  std::vector<PlanBuffer> plans;
  for (int32_t l = 0; l < g.num_layers; ++l) plans.emplace_back(g, max_batch);

  std::vector<int32_t> rows = {3, 0, 5, 2, 1};
  std::vector<int32_t> seq(max_batch, 0);
  for (int32_t i = 0; i < max_batch; ++i) {
    seq[i] = 10 + 7 * i;  // row i's prompt: some longer than B, some shorter
    full.FillHost(rows[i], seq[i]);
    pref.FillHost(rows[i], seq[i]);
  }
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> prev(max_batch);
  const int32_t batch = 4;
  uint64_t replayed_steps = 0;
  for (int step = 0; step < 120; ++step) {
    for (int32_t i = 0; i < max_batch; ++i) ++seq[i];
    std::vector<int32_t> positions;
    for (int32_t i = 0; i < max_batch; ++i) {
      const bool invalid = step % 17 == 5 && i == 1;
      std::vector<int32_t> s = Select(rng, prev[i], g.k, seq[i], invalid);
      if (!invalid) prev[i] = s;
      positions.insert(positions.end(), s.begin(), s.end());
    }
    std::vector<int32_t> out_anchor;
    for (int32_t l = 0; l < g.num_layers; ++l) {
      // The newest token's record of this layer, identical in both arenas.
      std::vector<uint8_t> src(static_cast<size_t>(max_batch) * g.record_bytes);
      for (int32_t i = 0; i < max_batch; ++i) {
        full.Pattern(src.data() + i * g.record_bytes, rows[i], l, seq[i] - 1, 1000 + step);
      }
      AppendAll(full, l, batch, rows, seq, src);
      AppendAll(pref, l, batch, rows, seq, src);

      std::vector<int32_t> out_full;
      uint32_t ef = 0;
      full.Resolve(l, batch, rows, seq, positions, &out_full, 0, &ef);
      if (anchor[l] == l) {
        out_anchor.assign(positions.size(), 12345);  // padded entries become kPadding in both
        uint32_t ea = 0;
        EXPECT_EQ(pref.Resolve(l, batch, rows, seq, positions, &out_anchor, 0, &ea, plans[l].plan), ef);
        EXPECT_EQ(ea, ef);
        EXPECT_EQ(*plans[l].plan.batch, batch);
        EXPECT_EQ(out_anchor, out_full) << "layer " << l << " step " << step;
        EXPECT_EQ(out_anchor.back(), kPadding) << "entry 4 is padding";
        EXPECT_EQ(plans[l].plan.summary[3 * batch], kPadding);
        EXPECT_EQ(plans[l].plan.summary[3 * batch + 1], -1);
      } else {
        ReplayDesc r{};
        r.arena = pref.view();
        r.host = pref.host();
        r.anchor_layer = anchor[l];
        r.layer = l;
        r.max_batch = max_batch;
        r.plan = plans[anchor[l]].plan;
        ASSERT_EQ(ReplayReference(r), 0u);
        ++replayed_steps;
        // The anchor's outputs are the follower's outputs.
        EXPECT_EQ(out_anchor, out_full) << "layer " << l << " step " << step;
      }
      ASSERT_EQ(pref.Snapshot(), full.Snapshot()) << "arenas differ after layer " << l << " of step " << step;
    }
  }
  EXPECT_EQ(replayed_steps, 120u * 3);
  EXPECT_GT(full.counters().misses, 0u);
  EXPECT_GT(full.counters().hits, 0u);
}

TEST(ReplayReference, PlanRecordsMissesInOrderAndInvalidRows) {
  const ArenaGeometry g{2, 2, 4, 2, 16};
  ArenaFixture f(g, 32);
  f.FillHost(0, 10);
  f.FillHost(1, 10);
  f.SetState(0, 0, {0, 1, 2, 3}, {0, 1, 2, 3});
  PlanBuffer pb(g, 2);
  const int32_t batch = 2;
  std::vector<int32_t> rows = {0, 1}, seq = {10, 10};
  std::vector<int32_t> pos = {7, 1, 4, 4};  // row 1 selects 4 twice: invalid
  std::vector<int32_t> out;
  EXPECT_EQ(f.Resolve(0, batch, rows, seq, pos, &out, 0, nullptr, pb.plan), static_cast<uint32_t>(kResolveDuplicate));
  EXPECT_EQ(*pb.plan.batch, 2);
  // Row 0: position 1 hits slot 1; position 7 misses into slot 0 (the LRU slot without a hit).
  EXPECT_EQ(pb.plan.summary[0], 0);
  EXPECT_EQ(pb.plan.summary[1], 1);
  EXPECT_EQ(pb.plan.summary[2], 1);
  EXPECT_EQ(pb.plan.entries[0], 7);
  EXPECT_EQ(pb.plan.entries[1], 0);
  EXPECT_EQ(pb.plan.summary[3], 1);
  EXPECT_EQ(pb.plan.summary[4], -1);  // invalid entry: the replay leaves it alone
}

TEST(ReplayReference, RejectsBadLayers) {
  const ArenaGeometry g{1, 2, 4, 2, 16};
  ArenaFixture f(g, 8);
  PlanBuffer pb(g, 1);
  *pb.plan.batch = 0;
  ReplayDesc r{};
  r.arena = f.view();
  r.host = f.host();
  r.max_batch = 1;
  r.plan = pb.plan;
  r.anchor_layer = 0;
  r.layer = 0;
  EXPECT_EQ(ReplayReference(r), static_cast<uint32_t>(kResolveBadRow));
  r.layer = 2;
  EXPECT_EQ(ReplayReference(r), static_cast<uint32_t>(kResolveBadRow));
  r.layer = 1;
  r.anchor_layer = -1;
  EXPECT_EQ(ReplayReference(r), static_cast<uint32_t>(kResolveBadRow));
  r.anchor_layer = 0;
  const auto before = f.Snapshot();
  EXPECT_EQ(ReplayReference(r), 0u);  // an empty plan changes nothing
  EXPECT_EQ(f.Snapshot(), before);
}

}  // namespace replay_reference_test
}  // namespace hisparse
