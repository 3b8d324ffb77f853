// Test fixture: one slot arena and its host pool in plain host memory, as the host-emulated
// backend lays them out. Owns both; not thread-safe. Host record bytes are a deterministic
// function of (row, layer, position, generation) so a test can tell any two records apart.
#ifndef HISPARSE_TESTS_KERNELS_ARENA_FIXTURE_H_
#define HISPARSE_TESTS_KERNELS_ARENA_FIXTURE_H_

#include <cstdint>
#include <cstring>
#include <vector>

#include "hisparse/kernels/arena_layout.h"
#include "hisparse/kernels/resolve.h"

namespace hisparse::testing {

class ArenaFixture {
 public:
  ArenaFixture(const ArenaGeometry& g, int32_t capacity)
      : geometry_(g),
        storage_(ComputeArenaOffsets(g).total_bytes / sizeof(uint64_t) + 1, 0),
        view_(ArenaView::Of(storage_.data(), g)),
        capacity_(g.max_rows, capacity),
        host_(static_cast<size_t>(g.max_rows) * g.num_layers),
        layer_base_(host_.size()) {
    for (size_t i = 0; i < host_.size(); ++i) {
      host_[i].assign(static_cast<size_t>(capacity) * g.record_bytes, 0);
      layer_base_[i] = host_[i].data();
    }
    for (int32_t r = 0; r < g.max_rows; ++r) ResetRowReference(view_, r);
  }

  const ArenaGeometry& geometry() const { return geometry_; }
  const ArenaView& view() const { return view_; }
  HostRecordMap host() const { return HostRecordMap{layer_base_.data(), capacity_.data()}; }
  const ArenaCounters& counters() const { return *view_.counters; }
  void set_capacity(int32_t row, int32_t c) { capacity_[row] = c; }

  uint8_t* HostRecord(int32_t row, int32_t layer, int32_t pos) {
    return layer_base_[view_.RowLayer(row, layer)] + static_cast<size_t>(pos) * geometry_.record_bytes;
  }
  // Writes a pattern that differs for every (row, layer, pos, gen) into `dst`.
  void Pattern(uint8_t* dst, int32_t row, int32_t layer, int32_t pos, uint32_t gen) const {
    uint32_t x = 0x9e3779b9u * (row + 1) ^ 0x85ebca6bu * (layer + 7) ^ 0xc2b2ae35u * (pos + 3) ^ gen;
    for (uint32_t b = 0; b < geometry_.record_bytes; ++b) {
      x = x * 1664525u + 1013904223u;
      dst[b] = static_cast<uint8_t>(x >> 24);
    }
  }
  // Fills host positions [0, n) of every layer of `row` directly (bypassing StoreReference).
  void FillHost(int32_t row, int32_t n, uint32_t gen = 0) {
    for (int32_t l = 0; l < geometry_.num_layers; ++l) {
      for (int32_t p = 0; p < n; ++p) Pattern(HostRecord(row, l, p), row, l, p, gen);
    }
  }
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
  std::vector<std::vector<uint8_t>> host_;
  std::vector<uint8_t*> layer_base_;
};

}  // namespace hisparse::testing

#endif  // HISPARSE_TESTS_KERNELS_ARENA_FIXTURE_H_
