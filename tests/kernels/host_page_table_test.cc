// The CPU reference over host page tables (arena_layout.h, "Host page tables"): over pages of a few
// records scattered in random order over one pool, some of them shared read-only between two
// rows, RESOLVE (single- and multi-query), prefetch replay, store, indexed store and append give
// byte-identical results to the same data laid out as one contiguous run per (row, layer): same
// outputs, errors, miss plans, slot tables, LRU orders, counters, the whole arena and every host
// record. And the write path refuses a read-only page: nothing of that row written, others proceed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "arena_fixture.h"
#include "hisparse/kernels/resolve.h"

namespace hisparse {
namespace host_page_table_test {

using testing::ArenaFixture;
using testing::PagedLayout;

// The same sequence of operations on a paged fixture and a contiguous one holding the same bytes.
class Twins {
 public:
  Twins(const ArenaGeometry& g, int32_t capacity, const PagedLayout& layout)
      : g_(g),
        cap_(capacity),
        shared_positions_(layout.shared_pages * static_cast<int32_t>(layout.records_per_page)),
        paged_(g, capacity, layout),
        flat_(g, capacity),
        rng_(layout.seed) {
    for (int32_t r = 0; r < g.max_rows; ++r) paged_.FillHost(r, capacity, 7);
    for (int32_t r = 0; r < g.max_rows; ++r) {
      for (int32_t l = 0; l < g.num_layers; ++l) {
        for (int32_t p = 0; p < capacity; ++p) {
          std::memcpy(flat_.HostRecord(r, l, p), paged_.HostRecord(r, l, p), g.record_bytes);
        }
      }
    }
    // Rows start past the shared pages (and an append's Q tokens past them): rows 0 and 1 never
    // write their shared prefix again.
    for (int32_t r = 0; r < g.max_rows; ++r) {
      seq_.push_back(UniI(std::max(shared_positions_ + g.TailSlots(), g.k * g.TailSlots()) + 1, capacity / 2));
    }
    plans_[0].assign((MissPlan::Bytes(g, g.max_rows) + 3) / 4, 0);
    plans_[1].assign(plans_[0].size(), 0);
  }

  int UniI(int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng_); }
  bool Bern(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

  // Distinct random rows, 1..max_rows of them.
  std::vector<int32_t> Rows() {
    std::vector<int32_t> rows(g_.max_rows);
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), rng_);
    rows.resize(UniI(1, g_.max_rows));
    return rows;
  }

  // One RESOLVE of `layer` on both (a miss plan recorded); then, sometimes, a replay of it.
  void Resolve() {
    const int32_t layer = UniI(0, g_.num_layers - 1);
    const std::vector<int32_t> rows = Rows();
    const int32_t Q = g_.TailSlots(), k = g_.k, n = static_cast<int32_t>(rows.size());
    std::vector<int32_t> seqs(n), counts(n), pos(static_cast<size_t>(n) * Q * k, kPadding);
    for (int32_t i = 0; i < n; ++i) {
      seqs[i] = seq_[rows[i]];
      counts[i] = UniI(1, Q);
      for (int32_t t = 0; t < counts[i]; ++t) {
        // List t selects distinct positions of [0, P_t + 1), P_t = seq - q + t; some padding.
        const int32_t span = seqs[i] - counts[i] + t + 1;
        std::vector<int32_t> all(span);
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng_);
        const int32_t take = std::min(k - (Bern(0.3) ? UniI(0, 2) : 0), span);
        std::copy_n(all.begin(), take, pos.begin() + (static_cast<size_t>(i) * Q + t) * k);
      }
    }
    std::vector<int32_t> out[2];
    uint32_t err[2];
    ArenaFixture* f[2] = {&paged_, &flat_};
    for (int x = 0; x < 2; ++x) {
      const MissPlan plan = MissPlan::Of(plans_[x].data(), g_.max_rows);
      err[x] = f[x]->Resolve(layer, n, rows, seqs, pos, &out[x], 0, nullptr, plan, Q > 1 ? counts.data() : nullptr);
    }
    ASSERT_EQ(err[0], err[1]);
    ASSERT_EQ(out[0], out[1]);
    ASSERT_EQ(plans_[0], plans_[1]);
    if (g_.num_layers > 1 && Bern(0.4)) {
      for (int x = 0; x < 2; ++x) {
        ReplayDesc d{};
        d.arena = f[x]->view();
        d.host = f[x]->host();
        d.anchor_layer = layer;
        d.layer = (layer + 1) % g_.num_layers;
        d.max_batch = n;
        d.plan = MissPlan::Of(plans_[x].data(), g_.max_rows);
        err[x] = ReplayReference(d);
      }
      ASSERT_EQ(err[0], err[1]);
    }
  }

  // An append of 1..Q tokens to some rows, every layer (rows grow).
  void Append() {
    std::vector<int32_t> rows = Rows();
    const int32_t Q = g_.TailSlots(), n = static_cast<int32_t>(rows.size());
    std::vector<int32_t> seqs(n), counts(n);
    for (int32_t i = 0; i < n; ++i) {
      counts[i] = UniI(1, Q);
      // Usually new tokens; sometimes a rewrite of the last ones (rejected drafts).
      const int32_t grow = Bern(0.8) ? counts[i] : 0;
      seq_[rows[i]] = std::min(cap_, seq_[rows[i]] + grow);
      seqs[i] = seq_[rows[i]];
    }
    std::vector<uint8_t> src(static_cast<size_t>(n) * Q * g_.record_bytes);
    for (auto& b : src) b = static_cast<uint8_t>(rng_());
    ArenaFixture* f[2] = {&paged_, &flat_};
    for (int32_t l = 0; l < g_.num_layers; ++l) {
      uint32_t err[2];
      for (int x = 0; x < 2; ++x) {
        AppendDesc d{};
        d.arena = f[x]->view();
        d.host = f[x]->host();
        d.layer = l;
        d.max_batch = n;
        d.batch_size = &n;
        d.rows = rows.data();
        d.seq_lens = seqs.data();
        d.src = src.data();
        d.src_stride = g_.record_bytes;
        d.token_counts = Q > 1 ? counts.data() : nullptr;
        err[x] = AppendReference(d);
      }
      ASSERT_EQ(err[0], err[1]);
      ASSERT_EQ(err[0], 0u);
    }
  }

  // A store (plain or indexed over a random layer range) rewriting part of one row, past the
  // shared prefix.
  void Store() {
    const int32_t row = UniI(0, g_.max_rows - 1);
    const int32_t lo = row < 2 ? shared_positions_ : 0;
    const int32_t start = UniI(lo, seq_[row] - 1), n = UniI(0, seq_[row] - start);
    const int32_t first = UniI(0, g_.num_layers - 1), layers = UniI(1, g_.num_layers - first);
    std::vector<uint8_t> src(static_cast<size_t>(g_.num_layers) * (n + 3) * g_.record_bytes);
    for (auto& b : src) b = static_cast<uint8_t>(rng_());
    std::vector<int32_t> index(n);
    for (int32_t t = 0; t < n; ++t) index[t] = (t * 7 + 2) % (n + 3);
    const bool indexed = Bern(0.5);
    ArenaFixture* f[2] = {&paged_, &flat_};
    uint32_t err[2];
    for (int x = 0; x < 2; ++x) {
      IndexedStoreDesc d{};
      d.arena = f[x]->view();
      d.host = f[x]->host();
      d.row = row;
      d.first_layer = indexed ? first : 0;
      d.num_layers = indexed ? layers : g_.num_layers;
      d.start_pos = start;
      d.num_tokens = n;
      d.seq_len_after = seq_[row];
      d.src_base = src.data();
      d.src_index = indexed ? index.data() : nullptr;
      d.src_tokens = n + 3;
      d.src_layer_stride = static_cast<int64_t>(n + 3) * g_.record_bytes;
      d.src_token_stride = g_.record_bytes;
      err[x] = IndexedStoreReference(d);
    }
    ASSERT_EQ(err[0], err[1]);
    ASSERT_EQ(err[0], 0u);
  }

  // Everything either side can observe.
  void Compare(const std::string& what) {
    ASSERT_EQ(paged_.Snapshot(), flat_.Snapshot()) << what << ": arenas differ";
    for (int32_t r = 0; r < g_.max_rows; ++r) {
      for (int32_t l = 0; l < g_.num_layers; ++l) {
        for (int32_t p = 0; p < cap_; ++p) {
          ASSERT_EQ(std::memcmp(paged_.HostRecord(r, l, p), flat_.HostRecord(r, l, p), g_.record_bytes), 0)
              << what << ": host record (" << r << ", " << l << ", " << p << ")";
        }
      }
    }
  }

  ArenaGeometry g_;
  int32_t cap_;
  int32_t shared_positions_;
  ArenaFixture paged_, flat_;
  std::mt19937 rng_;
  std::vector<int32_t> seq_;
  std::vector<int32_t> plans_[2];
};

struct PropertyCase {
  ArenaGeometry g;
  uint32_t records_per_page;
  int32_t shared_pages;
};

class HostPageTableProperty : public ::testing::TestWithParam<PropertyCase> {};

TEST_P(HostPageTableProperty, PagedEqualsContiguous) {
  const PropertyCase c = GetParam();
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    Twins t(c.g, 160, PagedLayout{c.records_per_page, seed * 31 + c.records_per_page, c.shared_pages});
    for (int op = 0; op < 150; ++op) {
      const int which = t.UniI(0, 19);
      const std::string what = "seed " + std::to_string(seed) + " op " + std::to_string(op);
      if (which < 11) {
        ASSERT_NO_FATAL_FAILURE(t.Resolve()) << what;
      } else if (which < 16) {
        ASSERT_NO_FATAL_FAILURE(t.Append()) << what;
      } else {
        ASSERT_NO_FATAL_FAILURE(t.Store()) << what;
      }
      ASSERT_NO_FATAL_FAILURE(t.Compare(what));
    }
    // Not vacuous: records were fetched (through the scattered pages) and rows outgrew pages.
    EXPECT_GT(t.paged_.counters().misses, 100u);
    EXPECT_GT(t.paged_.counters().hits, 0u);
  }
}

ArenaGeometry Geo(int32_t rows, int32_t layers, int32_t B, int32_t k, uint32_t rb, int32_t n) {
  ArenaGeometry g{rows, layers, B, k, rb};
  g.draft_tokens = n;
  return g;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, HostPageTableProperty,
    ::testing::Values(PropertyCase{Geo(4, 2, 12, 6, 48, 0), 1, 3}, PropertyCase{Geo(4, 2, 12, 6, 48, 0), 3, 4},
                      PropertyCase{Geo(3, 3, 16, 8, 32, 0), 7, 2}, PropertyCase{Geo(4, 2, 20, 5, 16, 2), 4, 5},
                      PropertyCase{Geo(3, 2, 24, 4, 64, 3), 5, 1}, PropertyCase{Geo(2, 1, 8, 8, 48, 0), 160, 0}));

// ---- the write path refuses read-only pages ----

class ReadOnlyPageTest : public ::testing::Test {
 protected:
  // Pages of 4 records; row 1's first 3 pages (positions 0..11) are row 0's, read-only.
  ReadOnlyPageTest() : g_(Geo(3, 2, 8, 4, 32, 2)), f_(g_, 64, PagedLayout{4, 5, 3}) {
    for (int32_t r = 0; r < g_.max_rows; ++r) f_.FillHost(r, 64, 1);
  }
  uint32_t Store(int32_t row, int32_t first_layer, int32_t layers, int32_t start, int32_t n, int32_t after) {
    src_.assign(static_cast<size_t>(g_.num_layers) * 64 * g_.record_bytes, 0xab);
    IndexedStoreDesc d{};
    d.arena = f_.view();
    d.host = f_.host();
    d.row = row;
    d.first_layer = first_layer;
    d.num_layers = layers;
    d.start_pos = start;
    d.num_tokens = n;
    d.seq_len_after = after;
    d.src_base = src_.data();
    d.src_layer_stride = int64_t{64} * g_.record_bytes;
    d.src_token_stride = g_.record_bytes;
    return IndexedStoreReference(d);
  }
  uint32_t Append(const std::vector<int32_t>& rows, const std::vector<int32_t>& seqs,
                  const std::vector<int32_t>& counts, uint32_t* flags) {
    const int32_t n = static_cast<int32_t>(rows.size());
    src_.assign(static_cast<size_t>(n) * g_.TailSlots() * g_.record_bytes, 0xcd);
    AppendDesc d{};
    d.arena = f_.view();
    d.host = f_.host();
    d.layer = 1;
    d.max_batch = n;
    d.batch_size = &n;
    d.rows = rows.data();
    d.seq_lens = seqs.data();
    d.src = src_.data();
    d.src_stride = g_.record_bytes;
    d.error_flags = flags;
    d.token_counts = counts.data();
    return AppendReference(d);
  }
  bool Unchanged(const std::vector<uint64_t>& arena, const std::vector<std::vector<uint8_t>>& host) const {
    return f_.Snapshot() == arena && f_.HostSnapshot() == host;
  }

  ArenaGeometry g_;
  ArenaFixture f_;
  std::vector<uint8_t> src_;
};

TEST_F(ReadOnlyPageTest, StoresTouchingASharedPageWriteNothing) {
  const auto arena = f_.Snapshot();
  const auto host = f_.HostSnapshot();
  // Plain stores (every layer) and indexed stores of one layer, the shared page anywhere in range.
  EXPECT_EQ(Store(1, 0, 2, 10, 10, 20), kResolveReadOnlyPage);  // crosses from shared into own pages
  EXPECT_EQ(Store(1, 0, 2, 0, 1, 6), kResolveReadOnlyPage);     // within B: slots would be rewritten
  EXPECT_EQ(Store(1, 1, 1, 11, 1, 12), kResolveReadOnlyPage);   // the last shared position
  EXPECT_TRUE(Unchanged(arena, host)) << "a refused store wrote something";
  // Past the shared pages it stores; the owner (row 0) writes its own pages.
  EXPECT_EQ(Store(1, 0, 2, 12, 20, 32), 0u);
  EXPECT_EQ(Store(0, 0, 2, 0, 4, 20), 0u);
  // Row 1 reads row 0's new records through its table: the very same bytes.
  for (int32_t l = 0; l < 2; ++l) {
    for (int32_t p = 0; p < 12; ++p) EXPECT_EQ(f_.HostRecord(1, l, p), f_.HostRecord(0, l, p));
    EXPECT_EQ(f_.HostRecord(1, l, 0)[0], 0xab);
  }
}

TEST_F(ReadOnlyPageTest, AppendIntoASharedPageRefusesThatEntryOnly) {
  const auto arena = f_.Snapshot();
  std::vector<uint8_t> own(f_.HostRecord(1, 1, 12), f_.HostRecord(1, 1, 12) + g_.record_bytes);
  uint32_t flags = 0;
  // Entry 1 writes positions 10..12 (10, 11 shared): refused whole; entries 0 and 2 proceed.
  EXPECT_EQ(Append({0, 1, 2}, {30, 13, 40}, {1, 3, 2}, &flags), kResolveReadOnlyPage);
  EXPECT_EQ(flags, kResolveReadOnlyPage);
  const uint8_t written = 0xcd;
  EXPECT_EQ(f_.HostRecord(0, 1, 29)[0], written);
  EXPECT_EQ(f_.HostRecord(2, 1, 38)[0], written);
  EXPECT_EQ(f_.HostRecord(2, 1, 39)[0], written);
  EXPECT_EQ(std::memcmp(f_.HostRecord(1, 1, 12), own.data(), g_.record_bytes), 0)
      << "row 1's own page of a refused entry was written";
  EXPECT_NE(f_.view().Record(1, 1, g_.slots)[0], written) << "row 1's tail slot of a refused entry was written";
  // Row 1's slot tables and records: untouched (compare row 1's span of the arena).
  const auto now = f_.Snapshot();
  const ArenaView before = ArenaView::Of(const_cast<uint64_t*>(arena.data()), g_);
  EXPECT_EQ(std::memcmp(before.Record(1, 0, 0), f_.view().Record(1, 0, 0),
                        g_.num_layers * g_.RecordSlots() * g_.record_bytes),
            0);
  EXPECT_NE(now, arena);  // the other entries did write
  // Past the shared pages the same row appends.
  flags = 0;
  EXPECT_EQ(Append({1}, {14}, {2}, &flags), 0u);
  EXPECT_EQ(flags, 0u);
  EXPECT_EQ(f_.HostRecord(1, 1, 13)[0], written);
}

TEST_F(ReadOnlyPageTest, ResolveReadsSharedPages) {
  // Row 1 selects shared positions: the records fetched are row 0's.
  std::vector<int32_t> out;
  const int32_t Q = g_.TailSlots();
  std::vector<int32_t> pos(static_cast<size_t>(Q) * g_.k, kPadding);
  pos[0] = 0, pos[1] = 5, pos[2] = 11, pos[3] = 12;
  ASSERT_EQ(f_.Resolve(0, 1, {1}, {20}, pos, &out), 0u);
  for (int j = 0; j < 4; ++j) {
    ASSERT_GE(out[j], 0);
    EXPECT_EQ(std::memcmp(f_.view().Record(1, 0, out[j]), f_.HostRecord(1, 0, pos[j]), g_.record_bytes), 0)
        << "selection " << j;
    // Positions 0..11 of row 1 are row 0's records (the same page), 12 its own.
    EXPECT_EQ(f_.HostRecord(1, 0, pos[j]) == f_.HostRecord(0, 0, pos[j]), pos[j] < 12) << "selection " << j;
  }
  EXPECT_EQ(f_.counters().misses, 4u);
}

}  // namespace host_page_table_test
}  // namespace hisparse
