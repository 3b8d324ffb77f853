// Test fixture: one slot arena and its host pool in plain host memory, as the host-emulated
// backend lays them out. Owns both; not thread-safe. Host record bytes are a deterministic
// function of (row, layer, position, generation) so a test can tell any two records apart.
// The host pool is one contiguous run per (row, layer) by default, or (PagedLayout) pages of R
// records scattered in random order over one pool, the first few pages of row 1's tables mapping
// row 0's pages read-only (shared), as the host page tables of arena_layout.h allow.
#ifndef HISPARSE_TESTS_KERNELS_ARENA_FIXTURE_H_
#define HISPARSE_TESTS_KERNELS_ARENA_FIXTURE_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "hisparse/kernels/arena_layout.h"
#include "hisparse/kernels/resolve.h"

namespace hisparse::testing {

// A paged host pool: R records a page, the pages of every (row, layer) drawn in random order
// (seed) from one pool; row 1's first shared_pages pages of every layer are row 0's, read-only.
struct PagedLayout {
  uint32_t records_per_page;
  uint32_t seed;
  int32_t shared_pages = 0;  // needs max_rows >= 2
};

class ArenaFixture {
 public:
  ArenaFixture(const ArenaGeometry& g, int32_t capacity)
      : geometry_(g),
        storage_(ComputeArenaOffsets(g).total_bytes / sizeof(uint64_t) + 1, 0),
        view_(ArenaView::Of(storage_.data(), g)),
        capacity_(g.max_rows, capacity),
        host_(static_cast<size_t>(g.max_rows) * g.num_layers),
        page_base_(host_.size()) {
    for (size_t i = 0; i < host_.size(); ++i) {
      host_[i].assign(static_cast<size_t>(capacity) * g.record_bytes, 0);
      page_base_[i] = host_[i].data();
    }
    for (int32_t r = 0; r < g.max_rows; ++r) ResetRowReference(view_, r);
  }

  ArenaFixture(const ArenaGeometry& g, int32_t capacity, const PagedLayout& paged)
      : geometry_(g),
        storage_(ComputeArenaOffsets(g).total_bytes / sizeof(uint64_t) + 1, 0),
        view_(ArenaView::Of(storage_.data(), g)),
        capacity_(g.max_rows, capacity),
        records_per_page_(paged.records_per_page),
        pages_per_entry_((static_cast<uint32_t>(capacity) + paged.records_per_page - 1) / paged.records_per_page) {
    const size_t entries = static_cast<size_t>(g.max_rows) * g.num_layers;
    const size_t page_bytes = static_cast<size_t>(records_per_page_) * g.record_bytes;
    std::vector<size_t> order(entries * pages_per_entry_);
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), std::mt19937(paged.seed));
    host_.resize(1);
    host_[0].assign(order.size() * page_bytes + 16, 0);
    uint8_t* pool = host_[0].data() + (16 - reinterpret_cast<uintptr_t>(host_[0].data()) % 16) % 16;
    page_base_.resize(order.size());
    for (size_t i = 0; i < order.size(); ++i) page_base_[i] = pool + order[i] * page_bytes;
    for (int32_t l = 0; l < g.num_layers && g.max_rows >= 2; ++l) {
      for (int32_t pg = 0; pg < paged.shared_pages; ++pg) {
        page_base_[Entry(1, l) + pg] = HostRecordMap::ReadOnlyEntry(page_base_[Entry(0, l) + pg]);
      }
    }
    for (int32_t r = 0; r < g.max_rows; ++r) ResetRowReference(view_, r);
  }

  const ArenaGeometry& geometry() const { return geometry_; }
  const ArenaView& view() const { return view_; }
  HostRecordMap host() const {
    return HostRecordMap{page_base_.data(), capacity_.data(), records_per_page_, pages_per_entry_};
  }
  const ArenaCounters& counters() const { return *view_.counters; }
  void set_capacity(int32_t row, int32_t c) { capacity_[row] = c; }
  int32_t capacity(int32_t row) const { return capacity_[row]; }

  uint8_t* HostRecord(int32_t row, int32_t layer, int32_t pos) { return host().Record(geometry_, row, layer, pos); }
  bool HostWritable(int32_t row, int32_t layer, int32_t pos) const {
    return host().Writable(geometry_, row, layer, pos);
  }
  // Writes a pattern that differs for every (row, layer, pos, gen) into `dst`.
  void Pattern(uint8_t* dst, int32_t row, int32_t layer, int32_t pos, uint32_t gen) const {
    uint32_t x = 0x9e3779b9u * (row + 1) ^ 0x85ebca6bu * (layer + 7) ^ 0xc2b2ae35u * (pos + 3) ^ gen;
    for (uint32_t b = 0; b < geometry_.record_bytes; ++b) {
      x = x * 1664525u + 1013904223u;
      dst[b] = static_cast<uint8_t>(x >> 24);
    }
  }
  // AppendReference of q tokens (positions seq_len - q .., the pattern of generation gen) of one
  // (row, layer): host pool and tail slots B + t. Returns its error bits.
  uint32_t AppendTokens(int32_t layer, int32_t row, int32_t seq_len, int32_t q, uint32_t gen) {
    const int32_t Q = geometry_.TailSlots();
    std::vector<uint8_t> src(static_cast<size_t>(Q) * geometry_.record_bytes, 0);
    for (int32_t t = 0; t < q && t < Q; ++t)
      Pattern(&src[t * geometry_.record_bytes], row, layer, seq_len - q + t, gen);
    int32_t batch = 1;
    AppendDesc a{};
    a.arena = view();
    a.host = host();
    a.layer = layer;
    a.max_batch = 1;
    a.batch_size = &batch;
    a.rows = &row;
    a.seq_lens = &seq_len;
    a.src = src.data();
    a.src_stride = geometry_.record_bytes;
    a.token_counts = &q;
    return AppendReference(a);
  }
  // Fills host positions [0, n) of every layer of `row` directly (bypassing StoreReference),
  // skipping positions on read-only pages (they are another row's).
  void FillHost(int32_t row, int32_t n, uint32_t gen = 0) {
    for (int32_t l = 0; l < geometry_.num_layers; ++l) {
      for (int32_t p = 0; p < n; ++p) {
        if (HostWritable(row, l, p)) Pattern(HostRecord(row, l, p), row, l, p, gen);
      }
    }
  }
  // Every host byte of the pool (both layouts), for "nothing written" comparisons.
  std::vector<std::vector<uint8_t>> HostSnapshot() const { return host_; }
  // Sets (row, layer)'s slot table and LRU order directly and loads each filled slot's record
  // from the host pool, so the arena invariants hold.
  void SetState(int32_t row, int32_t layer, const std::vector<int32_t>& slot_pos, const std::vector<int32_t>& lru) {
    for (int32_t s = 0; s < geometry_.slots; ++s) {
      view_.SlotPos(row, layer)[s] = slot_pos[s];
      view_.Lru(row, layer)[s] = lru[s];
      if (slot_pos[s] != kEmptySlot) {
        std::memcpy(view_.Record(row, layer, s), HostRecord(row, layer, slot_pos[s]), geometry_.record_bytes);
      }
    }
  }
  std::vector<int32_t> SlotPos(int32_t row, int32_t layer) const {
    const int32_t* p = view_.SlotPos(row, layer);
    return std::vector<int32_t>(p, p + geometry_.slots);
  }
  std::vector<int32_t> Lru(int32_t row, int32_t layer) const {
    const int32_t* p = view_.Lru(row, layer);
    return std::vector<int32_t>(p, p + geometry_.slots);
  }
  // The whole arena, bytes, for "state untouched" comparisons.
  std::vector<uint64_t> Snapshot() const { return storage_; }

  // One RESOLVE launch. `positions` holds max_batch * (draft_tokens + 1) * k entries (pad with
  // kPadding); `plan`, when given (summary set), receives the launch's miss plan; `query_counts`
  // (max_batch entries, or null) are the multi-query counts of rule 8.
  uint32_t Resolve(int32_t layer, int32_t batch_size, const std::vector<int32_t>& rows,
                   const std::vector<int32_t>& seq_lens, const std::vector<int32_t>& positions,
                   std::vector<int32_t>* out, uint32_t flags = 0, uint32_t* error_flags = nullptr,
                   const MissPlan& plan = MissPlan{}, const int32_t* query_counts = nullptr) {
    ResolveDesc d{};
    d.arena = view_;
    d.host = host();
    d.layer = layer;
    d.max_batch = static_cast<int32_t>(rows.size());
    d.batch_size = &batch_size;
    d.rows = rows.data();
    d.seq_lens = seq_lens.data();
    d.positions = positions.data();
    if (out->size() != positions.size()) out->assign(positions.size(), 12345);
    d.out_slots = out->data();
    d.error_flags = error_flags;
    d.flags = flags;
    d.plan = plan;
    d.query_counts = query_counts;
    return ResolveReference(d);
  }

 private:
  ArenaGeometry geometry_;
  std::vector<uint64_t> storage_;  // 8-byte aligned for the counters
  ArenaView view_;
  std::vector<int32_t> capacity_;
  uint32_t records_per_page_ = kContiguousRecordsPerPage;
  uint32_t pages_per_entry_ = 1;
  std::vector<std::vector<uint8_t>> host_;  // one run per (row, layer), or (paged) the one pool
  std::vector<uint8_t*> page_base_;         // [max_rows * layers * pages_per_entry_]

  size_t Entry(int32_t row, int32_t layer) const {
    return (static_cast<size_t>(row) * geometry_.num_layers + layer) * pages_per_entry_;
  }
};

}  // namespace hisparse::testing

#endif  // HISPARSE_TESTS_KERNELS_ARENA_FIXTURE_H_
