// Property test of the CPU reference RESOLVE: thousands of random decode steps over random
// geometries, with prefill (StoreReference), decode append (AppendReference) and readmission
// (ResetRowReference), checking the arena invariants and the contract after every step.
#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "arena_fixture.h"
#include "gtest/gtest.h"
#include "hisparse/kernels/resolve.h"

namespace hisparse {
namespace resolve_property_test {

using ::hisparse::testing::ArenaFixture;

// Arena invariants of (row, layer) (arena_layout.h) plus exactness of every filled slot.
void CheckInvariants(ArenaFixture& f, int32_t row, int32_t layer) {
  const int32_t B = f.geometry().slots;
  const std::vector<int32_t> lru = f.Lru(row, layer);
  const std::vector<int32_t> pos = f.SlotPos(row, layer);
  std::vector<int32_t> sorted = lru;
  std::sort(sorted.begin(), sorted.end());
  for (int32_t s = 0; s < B; ++s) ASSERT_EQ(sorted[s], s) << "LRU is not a permutation";
  bool seen_filled = false;
  for (int32_t s : lru) {
    if (pos[s] != kEmptySlot) seen_filled = true;
    ASSERT_FALSE(seen_filled && pos[s] == kEmptySlot) << "an EMPTY slot after a filled one";
  }
  std::set<int32_t> resident;
  for (int32_t s = 0; s < B; ++s) {
    if (pos[s] == kEmptySlot) continue;
    ASSERT_TRUE(resident.insert(pos[s]).second) << "position " << pos[s] << " held twice";
    ASSERT_EQ(0,
              std::memcmp(f.view().Record(row, layer, s), f.HostRecord(row, layer, pos[s]), f.geometry().record_bytes))
        << "slot " << s << " differs from host position " << pos[s];
  }
}

struct RowState {
  int32_t seq_len = 0;
  uint32_t gen = 0;
  std::vector<std::vector<int32_t>> prev;  // per layer: the previous selection
};

class Sim {
 public:
  Sim(const ArenaGeometry& g, int32_t cap, std::mt19937* rng)
      : g_(g), cap_(cap), rng_(*rng), f_(g, cap), rows_(g.max_rows) {
    for (int32_t r = 0; r < g.max_rows; ++r) Admit(r);
  }

  // Readmission: reset the row, prefill a random length in chunks through StoreReference.
  void Admit(int32_t r) {
    RowState& st = rows_[r];
    st.gen += 1;
    st.prev.assign(g_.num_layers, {});
    st.seq_len = Uniform(1, std::min(cap_ - 1, 2 * g_.slots + 2));
    ResetRowReference(f_.view(), r);
    const int32_t rb = g_.record_bytes;
    for (int32_t start = 0; start < st.seq_len;) {
      const int32_t n = Uniform(1, st.seq_len - start);
      const int64_t token_stride = rb + 16 * Uniform(0, 1);
      std::vector<uint8_t> src(g_.num_layers * n * token_stride);
      for (int32_t l = 0; l < g_.num_layers; ++l) {
        for (int32_t t = 0; t < n; ++t) {
          f_.Pattern(&src[(l * n + t) * token_stride], r, l, start + t, st.gen);
        }
      }
      StoreDesc d{f_.view(), f_.host(), r, start, n, start + n, src.data(), n * token_stride, token_stride};
      ASSERT_EQ(0u, StoreReference(d));
      start += n;
    }
    for (int32_t l = 0; l < g_.num_layers; ++l) CheckInvariants(f_, r, l);
  }

  // One decode step of a random batch: append, then RESOLVE, layer by layer.
  void Step() {
    std::vector<int32_t> rows(g_.max_rows);
    for (int32_t r = 0; r < g_.max_rows; ++r) rows[r] = r;
    std::shuffle(rows.begin(), rows.end(), rng_);
    const int32_t batch = Uniform(1, g_.max_rows);
    for (int32_t i = 0; i < batch; ++i) {
      if (rows_[rows[i]].seq_len + 1 >= cap_ || Uniform(0, 200) == 0) Admit(rows[i]);
      rows_[rows[i]].seq_len += 1;
    }
    std::vector<int32_t> seq_lens(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) seq_lens[i] = rows_[rows[i]].seq_len;
    const int32_t rb = g_.record_bytes;
    for (int32_t l = 0; l < g_.num_layers; ++l) {
      std::vector<uint8_t> src(rows.size() * rb);
      for (int32_t i = 0; i < batch; ++i) {
        f_.Pattern(&src[i * rb], rows[i], l, seq_lens[i] - 1, rows_[rows[i]].gen);
      }
      int32_t bs = batch;
      AppendDesc a{f_.view(),  f_.host(), l,      static_cast<int32_t>(rows.size()), &bs, rows.data(), seq_lens.data(),
                   src.data(), rb,        nullptr};
      ASSERT_EQ(0u, AppendReference(a));
      ResolveLayer(l, batch, rows, seq_lens);
    }
  }

  int64_t steps() const { return f_.counters().steps; }

 private:
  int32_t Uniform(int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng_); }

  // A selection with locality: part of the previous one, maybe the newest token, the rest random,
  // padding anywhere in the first seq_len columns.
  std::vector<int32_t> Select(int32_t r, int32_t l, int32_t seq_len) {
    std::set<int32_t> chosen;
    const int32_t n = Uniform(0, std::min(g_.k, seq_len));
    if (n > 0 && Uniform(0, 2) == 0) chosen.insert(seq_len - 1);
    for (int32_t p : rows_[r].prev[l]) {
      if (static_cast<int32_t>(chosen.size()) < n && p < seq_len && Uniform(0, 9) < 7) {
        chosen.insert(p);
      }
    }
    while (static_cast<int32_t>(chosen.size()) < n) chosen.insert(Uniform(0, seq_len - 1));
    std::vector<int32_t> sel(chosen.begin(), chosen.end());
    rows_[r].prev[l] = sel;
    sel.resize(g_.k, kPadding);
    // Padding anywhere among the columns a list reads: its first seq_len (rule 10b).
    std::shuffle(sel.begin(), sel.begin() + std::min(g_.k, seq_len), rng_);
    return sel;
  }

  void ResolveLayer(int32_t l, int32_t batch, const std::vector<int32_t>& rows, const std::vector<int32_t>& seq_lens) {
    const int32_t k = g_.k, B = g_.slots;
    std::vector<int32_t> positions(rows.size() * k, kPadding);
    std::vector<std::vector<int32_t>> before(rows.size()), before_lru(rows.size());
    uint64_t want_hits = 0, want_misses = 0;
    for (int32_t i = 0; i < batch; ++i) {
      const std::vector<int32_t> sel = Select(rows[i], l, seq_lens[i]);
      std::copy(sel.begin(), sel.end(), positions.begin() + i * k);
      before[i] = f_.SlotPos(rows[i], l);
      before_lru[i] = f_.Lru(rows[i], l);
      for (int32_t p : sel) {
        if (p == kPadding) continue;
        const bool res = std::find(before[i].begin(), before[i].end(), p) != before[i].end();
        (p == seq_lens[i] - 1 || res) ? ++want_hits : ++want_misses;
      }
    }
    const ArenaCounters c0 = f_.counters();
    std::vector<int32_t> out;
    ASSERT_EQ(0u, f_.Resolve(l, batch, rows, seq_lens, positions, &out));
    const ArenaCounters& c1 = f_.counters();
    ASSERT_EQ(c1.hits - c0.hits, want_hits);
    ASSERT_EQ(c1.misses - c0.misses, want_misses);
    ASSERT_EQ(c1.bytes_fetched - c0.bytes_fetched, want_misses * g_.record_bytes);
    ASSERT_EQ(c1.steps - c0.steps, static_cast<uint64_t>(batch));
    for (int32_t i = 0; i < batch; ++i) {
      const int32_t r = rows[i];
      CheckInvariants(f_, r, l);
      const std::vector<int32_t> lru = f_.Lru(r, l);
      std::vector<int32_t> hit_slots, miss_slots;
      for (int32_t j = 0; j < k; ++j) {
        const int32_t p = positions[i * k + j], s = out[i * k + j];
        if (p == kPadding) {
          ASSERT_EQ(s, kPadding);
          continue;
        }
        ASSERT_EQ(0, std::memcmp(f_.view().Record(r, l, s), f_.HostRecord(r, l, p), g_.record_bytes));
        if (p == seq_lens[i] - 1) {
          ASSERT_EQ(s, B);
          continue;
        }
        ASSERT_TRUE(s >= 0 && s < B);
        ASSERT_EQ(f_.SlotPos(r, l)[s], p);
        (before[i][s] == p ? hit_slots : miss_slots).push_back(s);
      }
      // Rule 3: the LRU ends with the miss-filled slots (miss order), then the hit slots.
      const size_t nh = hit_slots.size(), nm = miss_slots.size();
      std::vector<int32_t> hits_in_old_order;  // hit slots in their old relative LRU order
      for (int32_t s : before_lru[i]) {
        if (std::find(hit_slots.begin(), hit_slots.end(), s) != hit_slots.end()) {
          hits_in_old_order.push_back(s);
        }
      }
      ASSERT_EQ(std::vector<int32_t>(lru.end() - nh, lru.end()), hits_in_old_order);
      ASSERT_EQ(std::vector<int32_t>(lru.end() - nh - nm, lru.end() - nh), miss_slots);
      // Rule 2: the misses took the least recently used slots that hold no hit, in order.
      std::vector<int32_t> want_victims;
      for (int32_t s : before_lru[i]) {
        const bool hit = std::find(hit_slots.begin(), hit_slots.end(), s) != hit_slots.end();
        if (!hit && want_victims.size() < nm) want_victims.push_back(s);
      }
      ASSERT_EQ(miss_slots, want_victims);
      // Rule 3: untouched slots keep their old relative order at the front.
      std::vector<int32_t> untouched;
      for (int32_t s : before_lru[i]) {
        if (std::find(lru.end() - nh - nm, lru.end(), s) == lru.end()) untouched.push_back(s);
      }
      ASSERT_EQ(std::vector<int32_t>(lru.begin(), lru.end() - nh - nm), untouched);
    }
  }

  ArenaGeometry g_;
  int32_t cap_;
  std::mt19937& rng_;
  ArenaFixture f_;
  std::vector<RowState> rows_;
};

TEST(ResolvePropertyTest, InvariantsHoldOverRandomSteps) {
  std::mt19937 rng(20260101);
  int64_t steps = 0;
  for (int trial = 0; trial < 200; ++trial) {
    ArenaGeometry g{};
    g.k = std::uniform_int_distribution<int32_t>(1, 12)(rng);
    g.slots = g.k + std::uniform_int_distribution<int32_t>(0, 2 * g.k + 2)(rng);
    g.record_bytes = 16 * std::uniform_int_distribution<uint32_t>(1, 4)(rng);
    g.max_rows = std::uniform_int_distribution<int32_t>(1, 4)(rng);
    g.num_layers = std::uniform_int_distribution<int32_t>(1, 3)(rng);
    ASSERT_EQ(ValidateArenaGeometry(g), nullptr);
    Sim sim(g, /*cap=*/std::uniform_int_distribution<int32_t>(8, 120)(rng), &rng);
    for (int s = 0; s < 100 && !::testing::Test::HasFatalFailure(); ++s) sim.Step();
    ASSERT_FALSE(::testing::Test::HasFatalFailure()) << "trial " << trial;
    steps += sim.steps();
  }
  EXPECT_GT(steps, 20000);
}

}  // namespace resolve_property_test
}  // namespace hisparse
