// The CPU reference of RESOLVE, store (plain and indexed) and append (resolve.h): the oracle the
// CUDA kernels are held equal to, and what the host-emulated backend runs. Written for
// obviousness, not speed: each
// (row, layer) step builds its position -> slot lookup from scratch, so nothing but the arena
// carries state between calls.
//
// Error precedence (the CUDA kernel reports the same bits): a bad row reports only kResolveBadRow
// (its capacity cannot be read); else a bad seq_len reports only kResolveBadSeqLen (positions
// cannot be judged against it); else kResolveBadPosition and kResolveDuplicate are both reported
// when both occur, a duplicate being a valid (in-range) position selected twice. A descriptor
// layer outside [0, num_layers) names no (row, layer) state, so every active row of the launch is
// rejected as kResolveBadRow (RESOLVE does the same for a geometry ValidateArenaGeometry rejects).
#include <algorithm>
#include <climits>
#include <cstring>
#include <utility>
#include <vector>

#include "hisparse/kernels/resolve.h"

namespace hisparse {
namespace {

// Rows the launch covers: *batch_size clamped to [0, max_batch] so a bad scalar cannot index past
// the per-batch arrays.
int32_t ActiveRows(const int32_t* batch_size, int32_t max_batch) {
  const int32_t n = batch_size ? *batch_size : 0;
  return std::max(0, std::min(n, max_batch));
}

bool LayerInRange(const ArenaView& a, int32_t layer) { return layer >= 0 && layer < a.geometry.num_layers; }

// Host record of `pos` in (row, layer), through the row's page table (arena_layout.h).
uint8_t* HostRecord(const ArenaView& a, const HostRecordMap& h, int32_t row, int32_t layer, int32_t pos) {
  return h.Record(a.geometry, row, layer, pos);
}

// Positions in [-1, seq_len) and no non-padding position twice. Returns the error bits.
uint32_t CheckSelection(const int32_t* sel, int32_t k, int32_t seq_len) {
  uint32_t err = 0;
  std::vector<int32_t> seen;
  seen.reserve(k);
  for (int32_t j = 0; j < k; ++j) {
    if (sel[j] < kPadding || sel[j] >= seq_len) {
      err |= kResolveBadPosition;
    } else if (sel[j] != kPadding) {
      seen.push_back(sel[j]);
    }
  }
  std::sort(seen.begin(), seen.end());
  if (std::adjacent_find(seen.begin(), seen.end()) != seen.end()) err |= kResolveDuplicate;
  return err;
}

// The union of a step's lists (rule 8b), without touching state: for every selection its
// outcome, and the misses in union order.
struct StepPlan {
  std::vector<int32_t> out;       // [Q * k] slot, or kPadding, or kSelMiss - m for miss m
  std::vector<char> is_hit;       // [B] regular slots holding a hit
  std::vector<int32_t> miss_pos;  // positions of the misses, in union order
  uint64_t hits = 0;              // distinct positions needing no fetch (rule 8f)
  int64_t union_size = 0;         // |U|: regular hits + misses
};
constexpr int32_t kSelMiss = -2;  // out value of miss m: kSelMiss - m

// Rules 1 and 8a-8b: hits, tail positions and misses of q lists of k selections each.
StepPlan PlanStep(const ArenaView& a, int32_t row, int32_t layer, int32_t seq_len, int32_t q, const int32_t* sel) {
  const int32_t B = a.geometry.slots;
  const int32_t k = a.geometry.k;
  const int32_t Q = a.geometry.TailSlots();
  const int32_t tail_first = seq_len - q;  // query token t is position tail_first + t
  const int32_t* slot_pos = a.SlotPos(row, layer);
  StepPlan p;
  p.out.assign(static_cast<size_t>(Q) * k, kPadding);
  p.is_hit.assign(B, 0);

  // position -> slot over the filled slots, sorted by position for binary search.
  std::vector<std::pair<int32_t, int32_t>> resident;
  resident.reserve(B);
  for (int32_t s = 0; s < B; ++s) {
    if (slot_pos[s] != kEmptySlot) resident.emplace_back(slot_pos[s], s);
  }
  std::sort(resident.begin(), resident.end());

  // position -> its outcome in this step, for positions an earlier list already selected.
  std::vector<std::pair<int32_t, int32_t>> seen;  // kept sorted by position
  for (int32_t t = 0; t < q; ++t) {
    for (int32_t j = 0; j < k; ++j) {
      const int32_t pos = sel[static_cast<size_t>(t) * k + j];
      int32_t& o = p.out[static_cast<size_t>(t) * k + j];
      if (pos == kPadding) continue;
      auto at = std::lower_bound(seen.begin(), seen.end(), std::make_pair(pos, INT32_MIN));
      if (at != seen.end() && at->first == pos) {
        o = at->second;  // selected by an earlier list: same slot, counted once
        continue;
      }
      if (pos >= tail_first) {
        o = B + (pos - tail_first);  // rule 8a: the newest tokens' tail slots
        ++p.hits;
      } else {
        auto it = std::lower_bound(resident.begin(), resident.end(), std::make_pair(pos, -1));
        if (it != resident.end() && it->first == pos) {
          o = it->second;
          p.is_hit[it->second] = 1;
          ++p.hits;
        } else {
          o = kSelMiss - static_cast<int32_t>(p.miss_pos.size());
          p.miss_pos.push_back(pos);
        }
        ++p.union_size;
      }
      seen.insert(at, std::make_pair(pos, o));
    }
  }
  return p;
}

// One valid (row, layer) step of RESOLVE; the numbered rules are those of resolve.h.
// plan_index: the batch entry, for the miss plan (recorded when d.plan.summary is set). q: query
// tokens (rule 8; 1 when there is a single list). Returns kResolveUnionTooLarge (and changes
// nothing) when the union does not fit in B (rule 8c), else 0.
uint32_t ResolveRow(const ResolveDesc& d, int32_t plan_index, int32_t row, int32_t seq_len, int32_t q,
                    const int32_t* sel, int32_t* out) {
  const ArenaView& a = d.arena;
  const int32_t B = a.geometry.slots;
  const size_t outs = static_cast<size_t>(a.geometry.TailSlots()) * a.geometry.k;
  StepPlan p = PlanStep(a, row, d.layer, seq_len, q, sel);
  if (p.union_size > B) return kResolveUnionTooLarge;
  int32_t* slot_pos = a.SlotPos(row, d.layer);
  int32_t* lru = a.Lru(row, d.layer);
  const size_t misses = p.miss_pos.size();

  // Rule 2: the i-th miss takes the i-th least recently used slot holding no hit. |U| <= B
  // guarantees enough of them: hit slots + misses = |U| <= B.
  std::vector<int32_t> victims;
  victims.reserve(misses);
  for (int32_t i = 0; i < B && victims.size() < misses; ++i) {
    if (!p.is_hit[lru[i]]) victims.push_back(lru[i]);
  }
  std::vector<char> is_victim(B, 0);
  for (size_t i = 0; i < misses; ++i) {
    const int32_t s = victims[i];
    is_victim[s] = 1;
    slot_pos[s] = p.miss_pos[i];
    if (!(d.flags & kResolveFlagNoFetch)) {
      std::memcpy(a.Record(row, d.layer, s), HostRecord(a, d.host, row, d.layer, p.miss_pos[i]),
                  a.geometry.record_bytes);
    }
  }
  for (size_t x = 0; x < outs; ++x) {
    out[x] = p.out[x] <= kSelMiss ? victims[kSelMiss - p.out[x]] : p.out[x];
  }

  // Rule 3: untouched (old order), then filled by misses (miss order), then hits (old order).
  // Victims were taken in LRU order, so miss order and their old relative order coincide.
  std::vector<int32_t> next;
  next.reserve(B);
  for (int32_t i = 0; i < B; ++i) {
    if (!p.is_hit[lru[i]] && !is_victim[lru[i]]) next.push_back(lru[i]);
  }
  next.insert(next.end(), victims.begin(), victims.end());
  for (int32_t i = 0; i < B; ++i) {
    if (p.is_hit[lru[i]]) next.push_back(lru[i]);
  }
  std::copy(next.begin(), next.end(), lru);

  if (d.plan.summary) {
    int32_t* sum = d.plan.summary + static_cast<size_t>(plan_index) * 3;
    sum[0] = row;
    sum[1] = static_cast<int32_t>(misses);
    sum[2] = static_cast<int32_t>(p.hits);
    int32_t* e = d.plan.entries + static_cast<size_t>(plan_index) * MissPlan::EntriesPerRow(a.geometry) * 2;
    for (size_t i = 0; i < misses; ++i) {
      e[2 * i] = p.miss_pos[i];
      e[2 * i + 1] = victims[i];
    }
  }

  ArenaCounters* c = a.counters;
  c->hits += p.hits;
  c->misses += misses;
  c->bytes_fetched += static_cast<uint64_t>(misses) * a.geometry.record_bytes;
  c->steps += 1;
  return 0;
}

// Keeps "every filled slot's record equals the host record" true when a store or append
// rewrites host positions [first, last) that a regular slot of (row, layer) already holds.
void RefreshResidentSlots(const ArenaView& a, const HostRecordMap& h, int32_t row, int32_t layer, int32_t first,
                          int32_t last) {
  const int32_t* slot_pos = a.SlotPos(row, layer);
  for (int32_t s = 0; s < a.geometry.slots; ++s) {
    if (slot_pos[s] >= first && slot_pos[s] < last) {
      std::memcpy(a.Record(row, layer, s), HostRecord(a, h, row, layer, slot_pos[s]), a.geometry.record_bytes);
    }
  }
}

// Rule 9: the page table of batch entry i from its Q * k outputs (-1 where they are kPadding; a
// tail slot B + t indexes its record like a regular slot).
void WritePageTable(const ResolveDesc& d, int32_t i, const int32_t* out) {
  const size_t outs = static_cast<size_t>(d.arena.geometry.TailSlots()) * d.arena.geometry.k;
  int32_t* pt = d.page_table + i * outs;
  for (size_t x = 0; x < outs; ++x) pt[x] = out[x] < 0 ? kPadding : PageTableEntry(d, d.rows[i], out[x]);
}

// Query tokens of batch entry i (rule 8): query_counts[i], or 1 without counts.
int32_t QueryCount(const int32_t* counts, int32_t i) { return counts ? counts[i] : 1; }

// Row, query count and seq_len checks shared by RESOLVE and append (resolve.h, in this order).
uint32_t CheckEntry(const ArenaView& a, const HostRecordMap& h, int32_t row, int32_t q, int32_t seq_len) {
  if (row < 0 || row >= a.geometry.max_rows) return kResolveBadRow;
  if (q < 1 || q > a.geometry.TailSlots()) return kResolveBadQueryCount;
  if (seq_len < q || seq_len > h.capacity[row]) return kResolveBadSeqLen;
  return 0;
}

// Every list t < q against its query's length seq_len - q + t + 1 (rule 8).
uint32_t CheckLists(const int32_t* sel, int32_t k, int32_t q, int32_t seq_len) {
  uint32_t err = 0;
  for (int32_t t = 0; t < q; ++t) err |= CheckSelection(sel + static_cast<size_t>(t) * k, k, seq_len - q + t + 1);
  return err;
}

// Rule 10b: the q lists with every column j past its query token P_t (j >= seq_len - q + t + 1)
// made padding, whatever the engine's buffer holds there.
std::vector<int32_t> SelectableColumns(const int32_t* sel, int32_t k, int32_t q, int32_t seq_len) {
  std::vector<int32_t> v(sel, sel + static_cast<size_t>(q) * k);
  for (int32_t t = 0; t < q; ++t) {
    const int32_t len = seq_len - q + t + 1;
    for (int32_t j = std::max(len, 0); j < k; ++j) v[static_cast<size_t>(t) * k + j] = kPadding;
  }
  return v;
}

// Rules 7 and 10a: entry i publishes padding (no row, nothing fetched) and reads nothing else.
void PublishPadding(const ResolveDesc& d, int32_t i, size_t outs) {
  if (d.out_slots) std::fill_n(d.out_slots + static_cast<size_t>(i) * outs, outs, kPadding);
  if (d.page_table) std::fill_n(d.page_table + static_cast<size_t>(i) * outs, outs, kPadding);
  if (d.plan.summary) {
    int32_t* sum = d.plan.summary + static_cast<size_t>(i) * 3;
    sum[0] = kPadding;
    sum[1] = -1;
    sum[2] = 0;
  }
}

}  // namespace

uint32_t ResolveReference(const ResolveDesc& d) {
  const size_t outs = static_cast<size_t>(d.arena.geometry.TailSlots()) * d.arena.geometry.k;
  const int32_t k = d.arena.geometry.k;
  const int32_t n = ActiveRows(d.batch_size, d.max_batch);
  // An invalid geometry (B < k above all) could leave a miss without a slot, and invalid page-table
  // parameters could not be written: reject every row.
  const bool layer_ok =
      LayerInRange(d.arena, d.layer) && ValidateArenaGeometry(d.arena.geometry) == nullptr &&
      (d.page_table == nullptr || ValidatePageTable(d.arena.geometry, d.page_records, d.page_offset) == nullptr);
  uint32_t all_errors = 0;
  if (d.plan.summary) *d.plan.batch = n;
  std::vector<int32_t> scratch(d.out_slots ? 0 : outs);  // the outputs when only the page table is asked for
  for (int32_t i = 0; i < n; ++i) {
    if (d.rows[i] == kPadding) {  // rule 10a
      PublishPadding(d, i, outs);
      continue;
    }
    int32_t* out = d.out_slots ? d.out_slots + static_cast<size_t>(i) * outs : scratch.data();
    const int32_t q = QueryCount(d.query_counts, i);
    uint32_t err =
        layer_ok ? CheckEntry(d.arena, d.host, d.rows[i], q, d.seq_lens[i]) : static_cast<uint32_t>(kResolveBadRow);
    std::vector<int32_t> sel;
    if (err == 0) {
      sel = SelectableColumns(d.positions + static_cast<size_t>(i) * outs, k, q, d.seq_lens[i]);
      err = CheckLists(sel.data(), k, q, d.seq_lens[i]);
    }
    if (err == 0) err = ResolveRow(d, i, d.rows[i], d.seq_lens[i], q, sel.data(), out);
    if (err != 0) {
      std::fill(out, out + outs, kPadding);  // state untouched, counters but `rejected` untouched
      ++d.arena.counters->rejected;
      if (d.plan.summary) {
        int32_t* sum = d.plan.summary + static_cast<size_t>(i) * 3;
        sum[0] = d.rows[i];
        sum[1] = -1;
        sum[2] = 0;
      }
      if (d.page_table) WritePageTable(d, i, out);  // every entry -1: the row is not read
      all_errors |= err;
    } else if (d.page_table) {
      WritePageTable(d, i, out);
    }
  }
  // Rule 7: padded entries publish kPadding and read nothing else of the batch.
  for (int32_t i = n; i < d.max_batch; ++i) PublishPadding(d, i, outs);
  if (d.error_flags) *d.error_flags |= all_errors;
  return all_errors;
}

namespace {

// Store validity (resolve.h, IndexedStoreDesc), in this order: row, then layer range
// (kResolveBadRow); start_pos >= 0, num_tokens >= 0 (kResolveBadPosition); start_pos + num_tokens
// <= seq_len_after <= capacity, seq_len_after >= 1 (kResolveBadSeqLen); every source index in
// [0, src_tokens) (kResolveBadIndex); every page the store writes writable (kResolveReadOnlyPage).
// Source token t is position start_pos + t.
uint32_t CheckStore(const IndexedStoreDesc& d) {
  const ArenaGeometry& g = d.arena.geometry;
  if (d.row < 0 || d.row >= g.max_rows) return kResolveBadRow;
  if (d.num_layers < 1 || d.first_layer < 0 || d.first_layer > g.num_layers - d.num_layers) return kResolveBadRow;
  if (d.start_pos < 0 || d.num_tokens < 0) return kResolveBadPosition;
  const int64_t end = static_cast<int64_t>(d.start_pos) + d.num_tokens;
  if (d.seq_len_after < 1 || end > d.seq_len_after || d.seq_len_after > d.host.capacity[d.row]) {
    return kResolveBadSeqLen;
  }
  if (d.src_index != nullptr) {
    for (int32_t t = 0; t < d.num_tokens; ++t) {
      if (d.src_index[t] < 0 || d.src_index[t] >= d.src_tokens) return kResolveBadIndex;
    }
  }
  for (int32_t l = d.first_layer; l < d.first_layer + d.num_layers; ++l) {
    if (!d.host.RangeWritable(g, d.row, l, d.start_pos, d.start_pos + d.num_tokens)) return kResolveReadOnlyPage;
  }
  return 0;
}

}  // namespace

uint32_t IndexedStoreReference(const IndexedStoreDesc& d) {
  if (const uint32_t err = CheckStore(d)) return err;
  const ArenaView& a = d.arena;
  const int32_t B = a.geometry.slots;
  const uint32_t rb = a.geometry.record_bytes;
  const int32_t end = d.start_pos + d.num_tokens;
  for (int32_t i = 0; i < d.num_layers; ++i) {
    const int32_t l = d.first_layer + i;
    // The host pool is written first: it is the authoritative copy every slot is filled from.
    for (int32_t t = 0; t < d.num_tokens; ++t) {
      const int64_t index = d.src_index ? d.src_index[t] : t;
      const uint8_t* src = d.src_base + i * d.src_layer_stride + index * d.src_token_stride;
      std::memcpy(HostRecord(a, d.host, d.row, l, d.start_pos + t), src, rb);
    }
    RefreshResidentSlots(a, d.host, d.row, l, d.start_pos, end);
    // The newest token's slot B is filled too, so that a RESOLVE at seq_len_after right after
    // the store is exact.
    if (d.seq_len_after - 1 >= d.start_pos && d.seq_len_after - 1 < end) {
      std::memcpy(a.Record(d.row, l, B), HostRecord(a, d.host, d.row, l, d.seq_len_after - 1), rb);
    }
    if (d.seq_len_after > B) continue;
    // Rule 5: a short row is wholly resident, position p in slot p; earlier chunks come from the
    // host pool, so chunked prefill ends in the same state as a single store.
    int32_t* slot_pos = a.SlotPos(d.row, l);
    int32_t* lru = a.Lru(d.row, l);
    const int32_t filled = d.seq_len_after;
    for (int32_t s = 0; s < B; ++s) {
      slot_pos[s] = s < filled ? s : kEmptySlot;
      if (s < filled) {
        std::memcpy(a.Record(d.row, l, s), HostRecord(a, d.host, d.row, l, s), rb);
      }
    }
    // EMPTY slots are least recently used, then the filled slots in position order.
    for (int32_t x = 0; x < B; ++x) lru[x] = x < B - filled ? filled + x : x - (B - filled);
  }
  return 0;
}

uint32_t StoreReference(const StoreDesc& d) {
  IndexedStoreDesc x = IndexedStoreOf(d);
  return IndexedStoreReference(x);
}

uint32_t AppendReference(const AppendDesc& d) {
  const ArenaView& a = d.arena;
  const int32_t n = ActiveRows(d.batch_size, d.max_batch);
  const bool layer_ok = LayerInRange(a, d.layer);
  const int32_t Q = a.geometry.TailSlots();
  const uint32_t rb = a.geometry.record_bytes;
  uint32_t all_errors = 0;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t row = d.rows[i];
    const int32_t seq_len = d.seq_lens[i];
    const int32_t q = QueryCount(d.token_counts, i);
    uint32_t err = layer_ok ? CheckEntry(a, d.host, row, q, seq_len) : static_cast<uint32_t>(kResolveBadRow);
    if (err == 0 && !d.host.RangeWritable(a.geometry, row, d.layer, seq_len - q, seq_len)) err = kResolveReadOnlyPage;
    if (err != 0) {
      all_errors |= err;
      continue;
    }
    // Token t is position seq_len - q + t, into tail slot B + t (rule 8a).
    for (int32_t t = 0; t < q; ++t) {
      const uint8_t* src = d.src + (static_cast<int64_t>(i) * Q + t) * d.src_stride;
      std::memcpy(HostRecord(a, d.host, row, d.layer, seq_len - q + t), src, rb);
      std::memcpy(a.Record(row, d.layer, a.geometry.slots + t), src, rb);
    }
    RefreshResidentSlots(a, d.host, row, d.layer, seq_len - q, seq_len);
  }
  if (d.error_flags) *d.error_flags |= all_errors;
  return all_errors;
}

uint32_t ReplayReference(const ReplayDesc& d) {
  const ArenaView& a = d.arena;
  if (!LayerInRange(a, d.layer) || !LayerInRange(a, d.anchor_layer) || d.layer == d.anchor_layer) {
    return kResolveBadRow;
  }
  const int32_t n = ActiveRows(d.plan.batch, std::min(d.max_batch, d.plan.max_batch));
  const int32_t B = a.geometry.slots;
  const uint32_t rb = a.geometry.record_bytes;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t* sum = d.plan.summary + static_cast<size_t>(i) * 3;
    const int32_t row = sum[0], misses = sum[1], hits = sum[2];
    if (misses < 0) {  // the anchor rejected the entry (or it is padding) and left its state alone
      if (row != kPadding) ++a.counters->rejected;  // as this layer's RESOLVE would count it
      continue;
    }
    const int32_t* e = d.plan.entries + static_cast<size_t>(i) * MissPlan::EntriesPerRow(a.geometry) * 2;
    for (int32_t m = 0; m < misses; ++m) {
      std::memcpy(a.Record(row, d.layer, e[2 * m + 1]), HostRecord(a, d.host, row, d.layer, e[2 * m]), rb);
    }
    std::copy(a.SlotPos(row, d.anchor_layer), a.SlotPos(row, d.anchor_layer) + B, a.SlotPos(row, d.layer));
    std::copy(a.Lru(row, d.anchor_layer), a.Lru(row, d.anchor_layer) + B, a.Lru(row, d.layer));
    ArenaCounters* c = a.counters;
    c->hits += static_cast<uint64_t>(hits);
    c->misses += static_cast<uint64_t>(misses);
    c->bytes_fetched += static_cast<uint64_t>(misses) * rb;
    c->steps += 1;
  }
  return 0;
}

void ResetRowReference(const ArenaView& arena, int32_t row) {
  if (row < 0 || row >= arena.geometry.max_rows) return;
  for (int32_t l = 0; l < arena.geometry.num_layers; ++l) {
    int32_t* slot_pos = arena.SlotPos(row, l);
    int32_t* lru = arena.Lru(row, l);
    for (int32_t s = 0; s < arena.geometry.slots; ++s) {
      slot_pos[s] = kEmptySlot;
      lru[s] = s;
    }
  }
}

}  // namespace hisparse
