// Multi-query RESOLVE and append on the CPU reference (resolve.h rule 8, speculative decoding):
// hand-worked cases, refusals, and random decode runs with random draft acceptance held against
// an independent, deliberately naive model of the rule.
#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "arena_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hisparse/kernels/resolve.h"

namespace hisparse {
namespace multi_query_test {

using ::hisparse::testing::ArenaFixture;
using ::testing::Each;
using ::testing::ElementsAre;

ArenaGeometry Geometry(int32_t rows, int32_t layers, int32_t B, int32_t k, int32_t n) {
  ArenaGeometry g{rows, layers, B, k, 32};
  g.draft_tokens = n;
  return g;
}

// Appends q tokens (positions seq_len - q ..) of one row and layer with pattern generation gen.
uint32_t AppendTokens(ArenaFixture& f, int32_t layer, int32_t row, int32_t seq_len, int32_t q, uint32_t gen) {
  return f.AppendTokens(layer, row, seq_len, q, gen);
}

TEST(MultiQueryGeometryTest, DraftTokensSizeTheTailAndAreValidated) {
  ArenaGeometry g = Geometry(2, 3, 8, 4, 0);
  const size_t base = ComputeArenaOffsets(g).total_bytes;
  g.draft_tokens = 3;
  EXPECT_EQ(ValidateArenaGeometry(g), nullptr);
  EXPECT_EQ(g.RecordSlots(), 12u);
  EXPECT_EQ(ComputeArenaOffsets(g).total_bytes - ComputeArenaOffsets(g).records,
            AlignUp(2u * 3 * 12 * 32, kArenaSectionAlign));
  EXPECT_GT(ComputeArenaOffsets(g).total_bytes, base);
  EXPECT_EQ(MissPlan::EntriesPerRow(g), 16u);
  g.draft_tokens = -1;
  EXPECT_NE(ValidateArenaGeometry(g), nullptr);
  g.draft_tokens = kMaxDraftTokens + 1;
  EXPECT_NE(ValidateArenaGeometry(g), nullptr);
}

// Rule 8 by hand: union [11 hit, 20 miss, 21 miss], tails 28 -> B, 29 -> B + 1.
TEST(MultiQueryTest, HandWorkedUnionStep) {
  ArenaFixture f(Geometry(1, 1, 6, 3, 1), 64);
  f.FillHost(0, 64);
  f.SetState(0, 0, {10, 11, 12, 13, 14, 15}, {0, 1, 2, 3, 4, 5});
  ASSERT_EQ(AppendTokens(f, 0, 0, 30, 2, 9), 0u);
  std::vector<int32_t> out;
  const std::vector<int32_t> q = {2};
  EXPECT_EQ(0u, f.Resolve(0, 1, {0}, {30}, {11, 20, 28, /**/ 20, 21, 29}, &out, 0, nullptr, MissPlan{}, q.data()));
  EXPECT_THAT(out, ElementsAre(1, 0, 6, /**/ 0, 2, 7));
  EXPECT_THAT(f.SlotPos(0, 0), ElementsAre(20, 11, 21, 13, 14, 15));
  EXPECT_THAT(f.Lru(0, 0), ElementsAre(3, 4, 5, 0, 2, 1));
  EXPECT_EQ(f.counters().hits, 3u);  // 11, 28, 29 (20 counts once, as a miss)
  EXPECT_EQ(f.counters().misses, 2u);
  EXPECT_EQ(f.counters().steps, 1u);
  for (int32_t p : {20, 21, 11}) {
    const int32_t s = p == 20 ? 0 : p == 21 ? 2 : 1;
    EXPECT_EQ(0, std::memcmp(f.view().Record(0, 0, s), f.HostRecord(0, 0, p), 32));
  }
  EXPECT_EQ(0, std::memcmp(f.view().Record(0, 0, 7), f.HostRecord(0, 0, 29), 32));
}

TEST(MultiQueryTest, FewerQueriesPadTheirRowsAndNullCountsMeanOne) {
  ArenaFixture f(Geometry(2, 1, 8, 2, 2), 64);
  f.FillHost(0, 64);
  f.FillHost(1, 64);
  std::vector<int32_t> out;
  const std::vector<int32_t> q = {1, 2};
  // Entry 0: one query at 9; entry 1: two queries at 18, 19. Unused query rows hold garbage.
  const std::vector<int32_t> sel = {3, 9, 77, 77, 77, 77, /**/ 5, 18, 5, 19, 77, 77};
  EXPECT_EQ(0u, f.Resolve(0, 2, {0, 1}, {10, 20}, sel, &out, 0, nullptr, MissPlan{}, q.data()));
  EXPECT_THAT(out, ElementsAre(0, 8, -1, -1, -1, -1, /**/ 0, 8, 0, 9, -1, -1));
  // Null counts: q = 1 for every entry, so the garbage rows are ignored again.
  std::vector<int32_t> out2;
  EXPECT_EQ(0u, f.Resolve(0, 2, {0, 1}, {10, 20}, sel, &out2));
  EXPECT_THAT(out2, ElementsAre(0, 8, -1, -1, -1, -1, /**/ 0, 1, -1, -1, -1, -1));  // 18 is no tail now
}

// A multi-query geometry run with q = 1 everywhere equals the single-query geometry step for step:
// same outputs (first list), tables and counters.
TEST(MultiQueryTest, SingleQueryStepsEqualDraftTokensZero) {
  std::mt19937 rng(5);
  ArenaFixture f0(Geometry(1, 1, 6, 3, 0), 200), f3(Geometry(1, 1, 6, 3, 3), 200);
  f0.FillHost(0, 200);
  f3.FillHost(0, 200);
  for (int32_t seq = 2; seq < 150; ++seq) {
    std::set<int32_t> ch;
    while (static_cast<int32_t>(ch.size()) < std::min(3, seq)) ch.insert(static_cast<int32_t>(rng() % seq));
    std::vector<int32_t> sel(ch.begin(), ch.end());
    sel.resize(3, kPadding);
    std::vector<int32_t> sel3 = sel;
    sel3.resize(12, 999);  // padded query rows: ignored
    std::vector<int32_t> o0, o3;
    ASSERT_EQ(0u, f0.Resolve(0, 1, {0}, {seq}, sel, &o0));
    ASSERT_EQ(0u, f3.Resolve(0, 1, {0}, {seq}, sel3, &o3));
    ASSERT_EQ(std::vector<int32_t>(o3.begin(), o3.begin() + 3), o0);
    ASSERT_THAT(std::vector<int32_t>(o3.begin() + 3, o3.end()), Each(kPadding));
    ASSERT_EQ(f0.SlotPos(0, 0), f3.SlotPos(0, 0));
    ASSERT_EQ(f0.Lru(0, 0), f3.Lru(0, 0));
  }
  EXPECT_EQ(f0.counters().hits, f3.counters().hits);
  EXPECT_EQ(f0.counters().misses, f3.counters().misses);
}

// Each bad input refuses exactly its row: its Q * k outputs are kPadding, its bit is set, the
// arena is byte-identical to a run of the good row alone.
TEST(MultiQueryTest, BadRowsAreRefusedAndTouchNothingElse) {
  const ArenaGeometry g = Geometry(2, 1, 4, 3, 1);  // Q = 2, Q * k = 6 > B = 4
  struct Case {
    const char* what;
    int32_t q;
    int32_t seq_len;
    std::vector<int32_t> sel;
    uint32_t bit;
  };
  const std::vector<Case> cases = {
      {"three queries, Q = 2", 3, 30, {1, 2, 3, 1, 2, 3}, kResolveBadQueryCount},
      {"zero queries", 0, 30, {1, 2, 3, 1, 2, 3}, kResolveBadQueryCount},
      {"list 0 selects query 1's position", 2, 30, {29, 2, 3, 1, 2, 3}, kResolveBadPosition},
      {"list 1 beyond seq_len", 2, 30, {1, 2, 3, 30, 2, 3}, kResolveBadPosition},
      {"duplicate in one list", 2, 30, {1, 1, 3, 1, 2, 3}, kResolveDuplicate},
      {"seq_len below q", 2, 1, {-1, -1, -1, 0, -1, -1}, kResolveBadSeqLen},
      {"union of 6 > B = 4", 2, 30, {0, 1, 2, 3, 4, 5}, kResolveUnionTooLarge},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ArenaFixture bad(g, 64), ref(g, 64);
    for (ArenaFixture* f : {&bad, &ref}) {
      f->FillHost(0, 64);
      f->FillHost(1, 64);
      f->SetState(0, 0, {7, 8, -1, 9}, {2, 0, 1, 3});
    }
    std::vector<int32_t> sel = c.sel;
    sel.insert(sel.end(), {7, 10, 28, 10, 11, 29});  // row 1, valid (union 7, 10, 11)
    const std::vector<int32_t> qs = {c.q, 2};
    std::vector<int32_t> out;
    uint32_t flags = 0;
    EXPECT_EQ(bad.Resolve(0, 2, {0, 1}, {c.seq_len, 30}, sel, &out, 0, &flags, MissPlan{}, qs.data()), c.bit);
    EXPECT_EQ(flags, c.bit);
    EXPECT_THAT(std::vector<int32_t>(out.begin(), out.begin() + 6), Each(kPadding));
    std::vector<int32_t> out_ref;
    const std::vector<int32_t> q1 = {2};
    ASSERT_EQ(0u, ref.Resolve(0, 1, {1}, {30}, {7, 10, 28, 10, 11, 29}, &out_ref, 0, nullptr, MissPlan{}, q1.data()));
    EXPECT_EQ(std::vector<int32_t>(out.begin() + 6, out.end()), out_ref);
    // The one difference: the refused row is counted (counters.rejected).
    EXPECT_EQ(bad.counters().rejected, 1u);
    bad.view().counters->rejected = 0;
    EXPECT_EQ(bad.Snapshot(), ref.Snapshot());
  }
  // An overlapping union of 4 fits the same B.
  ArenaFixture f(g, 64);
  f.FillHost(0, 64);
  std::vector<int32_t> out;
  const std::vector<int32_t> q = {2};
  EXPECT_EQ(0u, f.Resolve(0, 1, {0}, {30}, {0, 1, 2, 1, 2, 3}, &out, 0, nullptr, MissPlan{}, q.data()));
  EXPECT_THAT(out, ElementsAre(0, 1, 2, 1, 2, 3));
}

// Rules 10a and 10b with several query tokens: list t reads only its first P_t + 1 columns, and a
// row of kPadding is a padded entry.
TEST(MultiQueryTest, ColumnsPastEachQueryAndRowMinusOneArePadding) {
  const ArenaGeometry g = Geometry(2, 1, 4, 3, 1);  // Q = 2, k = 3, B = 4
  ArenaFixture f(g, 64), ref(g, 64);
  f.FillHost(0, 64);
  ref.FillHost(0, 64);
  // seq_len 2, q 2: list 0 is query position 0 (one column), list 1 position 1 (two columns).
  // Past them: a stale duplicate, a position past seq_len and one below -1.
  const std::vector<int32_t> qs = {2, 1};
  std::vector<int32_t> out, want;
  uint32_t flags = 0;
  EXPECT_EQ(0u, f.Resolve(0, 2, {0, kPadding}, {2, 99}, {0, 0, 5, 1, 0, 1, 7, 7, 7, 7, 7, 7}, &out, 0, &flags,
                          MissPlan{}, qs.data()));
  EXPECT_EQ(flags, 0u);
  EXPECT_THAT(out, ElementsAre(g.slots, kPadding, kPadding, g.slots + 1, g.slots, kPadding, kPadding, kPadding,
                               kPadding, kPadding, kPadding, kPadding));
  ASSERT_EQ(0u, ref.Resolve(0, 1, {0, 0}, {2, 0}, {0, -1, -1, 1, 0, -1, 0, 0, 0, 0, 0, 0}, &want, 0, nullptr,
                            MissPlan{}, qs.data()));
  EXPECT_EQ(f.Snapshot(), ref.Snapshot());
}

TEST(MultiQueryAppendTest, WritesTailSlotsAndHostAndRefusesBadCounts) {
  ArenaFixture f(Geometry(1, 2, 4, 2, 2), 64);
  ASSERT_EQ(AppendTokens(f, 1, 0, 12, 3, 4), 0u);
  for (int32_t t = 0; t < 3; ++t) {
    std::vector<uint8_t> want(32);
    f.Pattern(want.data(), 0, 1, 9 + t, 4);
    EXPECT_EQ(0, std::memcmp(f.HostRecord(0, 1, 9 + t), want.data(), 32));
    EXPECT_EQ(0, std::memcmp(f.view().Record(0, 1, 4 + t), want.data(), 32));
  }
  const std::vector<uint64_t> before = f.Snapshot();
  EXPECT_EQ(AppendTokens(f, 1, 0, 12, 4, 5), static_cast<uint32_t>(kResolveBadQueryCount));
  EXPECT_EQ(AppendTokens(f, 1, 0, 12, 0, 5), static_cast<uint32_t>(kResolveBadQueryCount));
  EXPECT_EQ(AppendTokens(f, 1, 0, 2, 3, 5), static_cast<uint32_t>(kResolveBadSeqLen));
  EXPECT_EQ(AppendTokens(f, 1, 0, 65, 3, 5), static_cast<uint32_t>(kResolveBadSeqLen));
  EXPECT_EQ(f.Snapshot(), before);
}

// ---- The naive model of rule 8 (linear searches over plain vectors, nothing shared). ----
struct ModelState {
  std::vector<int32_t> pos, lru;
};
struct ModelStep {
  uint32_t err = 0;
  std::vector<int32_t> out;
  uint64_t hits = 0, misses = 0;
  std::vector<int32_t> plan;  // (position, slot) of each miss
};

bool Has(const std::vector<int32_t>& v, int32_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

ModelStep ModelResolve(ModelState& st, const ArenaGeometry& g, int32_t cap, int32_t seq_len, int32_t q,
                       const int32_t* sel) {
  const int32_t B = g.slots, k = g.k, Q = g.TailSlots();
  ModelStep r;
  r.out.assign(static_cast<size_t>(Q) * k, kPadding);
  if (q < 1 || q > Q) return r.err = kResolveBadQueryCount, r;
  if (seq_len < q || seq_len > cap) return r.err = kResolveBadSeqLen, r;
  for (int32_t t = 0; t < q; ++t) {
    std::vector<int32_t> seen;
    for (int32_t j = 0; j < k; ++j) {
      const int32_t p = sel[t * k + j];
      if (p < -1 || p >= seq_len - q + t + 1)
        r.err |= kResolveBadPosition;
      else if (p != -1 && Has(seen, p))
        r.err |= kResolveDuplicate;
      else if (p != -1)
        seen.push_back(p);
    }
  }
  if (r.err) return r;
  std::vector<int32_t> uni, tails;
  for (int32_t x = 0; x < q * k; ++x) {
    const int32_t p = sel[x];
    if (p == -1) continue;
    if (p >= seq_len - q) {
      if (!Has(tails, p)) tails.push_back(p);
    } else if (!Has(uni, p)) {
      uni.push_back(p);
    }
  }
  if (static_cast<int32_t>(uni.size()) > B) return r.err = kResolveUnionTooLarge, r;
  std::vector<int32_t> hit_slots, miss_pos;
  for (int32_t p : uni) {
    const auto it = std::find(st.pos.begin(), st.pos.end(), p);
    if (it != st.pos.end())
      hit_slots.push_back(static_cast<int32_t>(it - st.pos.begin()));
    else
      miss_pos.push_back(p);
  }
  std::vector<int32_t> free_slots, victims, next;
  for (int32_t s : st.lru) {
    if (!Has(hit_slots, s)) free_slots.push_back(s);
  }
  victims.assign(free_slots.begin(), free_slots.begin() + miss_pos.size());
  for (size_t m = 0; m < miss_pos.size(); ++m) {
    st.pos[victims[m]] = miss_pos[m];
    r.plan.push_back(miss_pos[m]);
    r.plan.push_back(victims[m]);
  }
  for (int32_t s : st.lru) {
    if (!Has(hit_slots, s) && !Has(victims, s)) next.push_back(s);
  }
  next.insert(next.end(), victims.begin(), victims.end());
  for (int32_t s : st.lru) {
    if (Has(hit_slots, s)) next.push_back(s);
  }
  st.lru = next;
  for (int32_t x = 0; x < q * k; ++x) {
    const int32_t p = sel[x];
    if (p == -1) continue;
    if (p >= seq_len - q) {
      r.out[x] = B + p - (seq_len - q);
    } else {
      r.out[x] = static_cast<int32_t>(std::find(st.pos.begin(), st.pos.end(), p) - st.pos.begin());
    }
  }
  r.hits = hit_slots.size() + tails.size();
  r.misses = miss_pos.size();
  return r;
}

// Random decode with drafts: every step a batch row appends q in [1, n + 1] tokens at its
// committed length, RESOLVEs n + 1 lists with locality per layer (some rows made invalid), and
// then accepts a random a in [1, q] tokens. Outputs, tables, counters, plans and every output
// slot's bytes are checked against the model and the host pool after every launch.
void RandomRun(int32_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  auto U = [&](int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng); };
  const int32_t k = U(1, 8), Q = n + 1;
  const int32_t B = U(k, (n + 2) * k);  // small B: union refusals happen, too
  const int32_t rows = 3, layers = 2, cap = 160;
  const ArenaGeometry g = Geometry(rows, layers, B, k, n);
  ASSERT_EQ(ValidateArenaGeometry(g), nullptr);
  ArenaFixture f(g, cap);
  std::vector<int32_t> committed(rows, 0);
  std::vector<uint32_t> gen(rows, 0);
  std::vector<std::vector<ModelState>> model(rows, std::vector<ModelState>(layers));
  auto admit = [&](int32_t r) {
    ResetRowReference(f.view(), r);
    for (auto& m : model[r]) {
      m.pos.assign(B, kEmptySlot);
      m.lru.resize(B);
      for (int32_t s = 0; s < B; ++s) m.lru[s] = s;
    }
    committed[r] = U(0, 2 * B);
    gen[r] += 1;
    for (int32_t l = 0; l < layers; ++l) {
      for (int32_t p = 0; p < committed[r]; ++p) f.Pattern(f.HostRecord(r, l, p), r, l, p, gen[r]);
    }
  };
  for (int32_t r = 0; r < rows; ++r) admit(r);
  std::vector<int32_t> prev(static_cast<size_t>(rows) * Q * k, kPadding);
  std::vector<uint8_t> planbuf(MissPlan::Bytes(g, rows));
  const MissPlan plan = MissPlan::Of(planbuf.data(), rows);
  uint64_t refused = 0, multi = 0;
  for (int step = 0; step < 120; ++step) {
    std::vector<int32_t> order = {0, 1, 2};
    std::shuffle(order.begin(), order.end(), rng);
    const int32_t batch = U(0, rows);
    std::vector<int32_t> qs(rows, 1), seqs(rows, 1);
    for (int32_t i = 0; i < batch; ++i) {
      const int32_t r = order[i];
      if (committed[r] + Q >= cap) admit(r);
      qs[i] = U(1, Q);
      seqs[i] = committed[r] + qs[i];
      gen[r] += 1;  // rewritten (rejected) positions get new bytes
    }
    for (int32_t l = 0; l < layers; ++l) {
      std::vector<int32_t> sel(static_cast<size_t>(rows) * Q * k, 777);  // garbage where unused
      std::vector<int32_t> bad(rows, 0);
      std::vector<int32_t> lq = qs, ls = seqs;  // what this layer's RESOLVE is told
      for (int32_t i = 0; i < batch; ++i) {
        const int32_t r = order[i];
        ASSERT_EQ(AppendTokens(f, l, r, seqs[i], qs[i], gen[r]), 0u);
        for (int32_t t = 0; t < qs[i]; ++t) {
          const int32_t len = seqs[i] - qs[i] + t + 1;  // query t selects over [0, len)
          std::vector<int32_t> list;
          for (int32_t j = 0; j < k; ++j) {
            // Overlap with the list before: last step's list 0, or this step's list t - 1.
            const int32_t p = t == 0 ? prev[r * Q * k + j] : sel[(i * Q + t - 1) * k + j];
            if (p >= 0 && p < len && !Has(list, p) && U(0, 9) < 8) list.push_back(p);
          }
          for (int tries = 0; static_cast<int32_t>(list.size()) < k && tries < 3 * k; ++tries) {
            const int32_t p = U(0, len - 1);
            if (!Has(list, p)) list.push_back(p);
          }
          std::shuffle(list.begin(), list.end(), rng);
          if (U(0, 3) == 0 && !list.empty()) list.pop_back();  // padding
          list.resize(k, kPadding);
          std::copy(list.begin(), list.end(), sel.begin() + (i * Q + t) * k);
        }
        if (U(0, 25) == 0) {  // an invalid entry
          switch (U(0, 2)) {
            case 0:
              lq[i] = Q + 1;
              break;
            case 1:
              sel[i * Q * k] = seqs[i] - qs[i] + 1;
              break;  // beyond list 0's length
            default:
              ls[i] = cap + 1;
              break;
          }
          bad[i] = 1;
        }
      }
      std::vector<ModelStep> want(rows);
      for (int32_t i = 0; i < batch; ++i) {
        want[i] = ModelResolve(model[order[i]][l], g, cap, ls[i], lq[i], &sel[i * Q * k]);
        if (bad[i]) {
          ASSERT_NE(want[i].err, 0u);
        }
      }
      const ArenaCounters c0 = f.counters();
      std::vector<int32_t> out;
      uint32_t flags = 0;
      const uint32_t err = f.Resolve(l, batch, order, ls, sel, &out, 0, &flags, plan, lq.data());
      uint32_t want_err = 0;
      uint64_t hits = 0, misses = 0, steps = 0;
      ASSERT_EQ(*plan.batch, batch);
      for (int32_t i = 0; i < rows; ++i) {
        const int32_t r = order[i];
        const std::vector<int32_t> got(out.begin() + i * Q * k, out.begin() + (i + 1) * Q * k);
        if (i >= batch) {
          ASSERT_THAT(got, Each(kPadding));
          continue;
        }
        const ModelStep& w = want[i];
        want_err |= w.err;
        ASSERT_EQ(got, w.out) << "step " << step << " entry " << i;
        ASSERT_EQ(f.SlotPos(r, l), model[r][l].pos);
        ASSERT_EQ(f.Lru(r, l), model[r][l].lru);
        const int32_t* sum = plan.summary + 3 * i;
        if (w.err) {
          ++refused;
          ASSERT_EQ(sum[1], -1);
          continue;
        }
        multi += lq[i] > 1;
        hits += w.hits, misses += w.misses, ++steps;
        ASSERT_EQ(sum[0], r);
        ASSERT_EQ(sum[1], static_cast<int32_t>(w.misses));
        ASSERT_EQ(sum[2], static_cast<int32_t>(w.hits));
        const int32_t* e = plan.entries + i * MissPlan::EntriesPerRow(g) * 2;
        ASSERT_EQ(std::vector<int32_t>(e, e + 2 * w.misses), w.plan);
        for (int32_t x = 0; x < Q * k; ++x) {
          if (got[x] == kPadding) continue;
          ASSERT_EQ(0, std::memcmp(f.view().Record(r, l, got[x]), f.HostRecord(r, l, sel[i * Q * k + x]), 32))
              << "output " << x << " does not hold its position's record";
        }
        std::copy(sel.begin() + i * Q * k, sel.begin() + (i + 1) * Q * k, prev.begin() + r * Q * k);
      }
      ASSERT_EQ(err, want_err);
      ASSERT_EQ(flags, want_err);
      ASSERT_EQ(f.counters().hits - c0.hits, hits);
      ASSERT_EQ(f.counters().misses - c0.misses, misses);
      ASSERT_EQ(f.counters().bytes_fetched - c0.bytes_fetched, misses * 32);
      ASSERT_EQ(f.counters().steps - c0.steps, steps);
    }
    for (int32_t i = 0; i < batch; ++i) committed[order[i]] += U(1, qs[i]);  // accepted tokens
  }
  EXPECT_GE(multi, n > 0 ? 20u : 0u);
  EXPECT_GT(refused, 0u);
}

// Exact prefetch with drafts: replaying the anchor's multi-query plan (EntriesPerRow = Q * k
// entries per batch entry) into a follower layer leaves the arena byte-identical to resolving the
// follower with the same lists, with more than k misses in one entry.
TEST(MultiQueryTest, ReplayOfAMultiQueryPlanEqualsResolve) {
  const ArenaGeometry g = Geometry(3, 2, 40, 6, 3);  // Q = 4: up to 24 misses > k
  ArenaFixture full(g, 300), pref(g, 300);
  std::vector<int32_t> words((MissPlan::Bytes(g, 3) + 3) / 4, 0x5a5a5a5a);
  const MissPlan plan = MissPlan::Of(words.data(), 3);
  std::mt19937 rng(9);
  const std::vector<int32_t> rows = {2, 0, 1};
  std::vector<int32_t> committed = {20, 50, 90};
  for (int32_t r = 0; r < 3; ++r) {
    full.FillHost(r, 300);
    pref.FillHost(r, 300);
  }
  size_t most_misses = 0;
  for (int step = 0; step < 40; ++step) {
    std::vector<int32_t> q(3), seq(3), sel(3 * 4 * 6, kPadding);
    for (int32_t i = 0; i < 3; ++i) {
      q[i] = 1 + static_cast<int32_t>(rng() % 4);
      seq[i] = committed[i] + q[i];
      for (int32_t t = 0; t < q[i]; ++t) {
        std::set<int32_t> list;
        while (list.size() < 6) list.insert(static_cast<int32_t>(rng() % (seq[i] - q[i] + t + 1)));
        std::copy(list.begin(), list.end(), sel.begin() + (i * 4 + t) * 6);
      }
    }
    std::vector<int32_t> out_full, out_pref;
    ASSERT_EQ(full.Resolve(0, 3, rows, seq, sel, &out_full, 0, nullptr, MissPlan{}, q.data()), 0u);
    ASSERT_EQ(full.Resolve(1, 3, rows, seq, sel, &out_full, 0, nullptr, MissPlan{}, q.data()), 0u);
    ASSERT_EQ(pref.Resolve(0, 3, rows, seq, sel, &out_pref, 0, nullptr, plan, q.data()), 0u);
    for (int32_t i = 0; i < 3; ++i) most_misses = std::max(most_misses, static_cast<size_t>(plan.summary[3 * i + 1]));
    ReplayDesc r{};
    r.arena = pref.view();
    r.host = pref.host();
    r.anchor_layer = 0;
    r.layer = 1;
    r.max_batch = 3;
    r.plan = plan;
    ASSERT_EQ(ReplayReference(r), 0u);
    ASSERT_EQ(out_pref, out_full);
    ASSERT_EQ(pref.Snapshot(), full.Snapshot()) << "step " << step;
    for (int32_t i = 0; i < 3; ++i) committed[i] += 1 + static_cast<int32_t>(rng() % q[i]);
  }
  EXPECT_GT(most_misses, static_cast<size_t>(g.k));  // the plan's larger stride was exercised
}

TEST(MultiQueryTest, RandomAcceptanceMatchesTheModel) {
  for (int32_t n = 0; n <= 4; ++n) {
    for (uint32_t seed = 1; seed <= 12; ++seed) {
      SCOPED_TRACE(::testing::Message() << "draft_tokens " << n << " seed " << seed);
      RandomRun(n, seed * 977 + n);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

}  // namespace multi_query_test
}  // namespace hisparse
