// The CUDA multi-query RESOLVE (resolve.h rule 8, draft_tokens > 0): its own kernel, so the
// single-query kernel of resolve.cu (draft_tokens = 0) keeps its code and speed.
//
// Design: one block per batch entry computes exactly what ResolveReference's PlanStep / ResolveRow
// compute, phase by phase with a block barrier between phases, around one open-addressing table
// of the entry's selected positions (64-bit entries: first appearance and position; the regular
// slot). The table, the slots' hit bytes and the misses' entries live in shared memory when they
// fit the device's opt-in limit (up to (n + 1) * k = 8192 selections at B = (n + 2) k, n = 3 at
// k = 2048), else in the entry's scratch in the workspace; the code is the same.
//   1. validation (row, query count, seq_len), then every list against its query's length; the
//      lists go into the table one after another (a barrier between them), so the one CAS that
//      places a position records its first appearance x = t * k + j (rule 8b's order); a
//      position found placed with an x of the same list is a duplicate, and one placed by an
//      earlier list sets the list's bit in the entry's byte, whose second setting is one;
//   2. hits, found as the single-query kernel finds them: every regular slot looks its position
//      up in the table (atomicMin keeps the smallest slot, as the reference's resident map does);
//   3. every first appearance is classified (tail, hit: marks its slot, miss) by warps that own
//      contiguous segments of the flat indices: ballots count, one barrier sums the warps' totals,
//      a second pass ranks the misses in flat-index order (U's order) from the same ballots; the
//      counts give |U| (rule 8c), the misses M and the hits (rule 8f);
//   4. the non-hit slots are ranked in LRU order the same way (warp segments of the LRU order,
//      counted, summed, ranked): the i-th takes the i-th miss (its slot, slot_pos, the fetch list
//      and the plan are written there), and the new LRU order has the closed form of resolve.cu
//      (untouched, then victims, then hit slots), written to the scratch;
//   5. the new LRU order copied back, outputs (a repeated position takes its first appearance's
//      slot) and rule 9's page table, the counters.
// The fetch is a second kernel over the whole GPU (MultiQueryFetchKernel). The first version
// copied inside the planner, one record per warp with plain loads, and moved 0.4 GB/s for one
// request on the H200 (bench/RESULTS.md, "Multi-query RESOLVE"); the second kept its per-
// selection columns in global memory and ranked with per-thread serial shares and block scans,
// planning at 2.0-3.2x a single list (the same section); this one plans with the single-query
// kernel's warp-ballot ranks.
// Invalid entries and padded entries (rule 7) publish kPadding everywhere and touch nothing else.
// The state is rebuilt by its block at the start of every launch, so graph replays need nothing
// in between.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "hisparse/kernels/resolve_cuda.h"
#include "host_load.cuh"
#include "record_dispatch.h"
#include "resolve_multi.h"

namespace hisparse {
namespace internal {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
static_assert(kWarps <= 32, "warp totals are summed by one warp");
constexpr int kNoIndex = 0x7fffffff;  // "no regular slot holds it" of the slot column
constexpr int kNone = 0, kTailFirst = 1, kHitFirst = 2, kMissFirst = 3;
constexpr int kLoadBatch = 8;  // global loads one thread keeps in flight in phases 1, 2 and 4
// A table entry: the first appearance x (rule 8b) in the high word, the position in the low one;
// all ones = empty (no valid entry has a negative position). Inserting is one atomicCAS, and for a
// position an earlier list placed, one atomicOr of the list's bit (phase 1).
constexpr unsigned long long kEmptyEntry = ~0ull;

// The planner's state of one entry: in shared memory when it fits the device's opt-in limit
// (up to n = 3 at k = 2048, B = (n + 2) k), else in the entry's scratch; the code is the same.
//   ent        [h] the position table (open addressing, h = 2 Q k or 1.5 Q k, linear probing), entries
//              as above;
//   slot       [h] the smallest regular slot holding the entry's position (as the reference's
//              sorted resident map finds it), kNoIndex for none; after phase 4 the slot that holds
//              it (a miss's victim);
//   is_hit     [B] a byte per slot: it holds a hit of this step;
//   lists      [h] a byte per entry, bit t set once list t > first list found it (a second time
//              is a duplicate);
//   rank_entry [min(Q k, B)] the table entry of miss m (U's order).
struct StateLayout {
  unsigned h;
  size_t ent, slot, lists, is_hit, rank_entry, bytes;
};

// The table has 2 Q k entries where the whole state then stays within kRoomyStateBytes (shared
// memory on every device this runs on), else 1.5 Q k: a lower load factor shortens the probes.
constexpr size_t kRoomyStateBytes = 192 << 10;

StateLayout ComputeStateWith(const ArenaGeometry& g, size_t entries) {
  const size_t qk = MissPlan::EntriesPerRow(g);
  StateLayout s{};
  s.h = static_cast<unsigned>(AlignUp(std::max<size_t>(64, entries), 64));
  size_t o = 0;
  auto take = [&](size_t bytes) {
    const size_t at = o;
    o = AlignUp(o + bytes, 16);
    return at;
  };
  s.ent = take(size_t{s.h} * 8);
  s.slot = take(size_t{s.h} * 4);
  s.lists = take(s.h);  // h is a multiple of 64: whole 32-bit words
  s.is_hit = take(g.slots);
  s.rank_entry = take(std::min<size_t>(qk, g.slots) * 4);
  s.bytes = o;
  return s;
}

StateLayout ComputeState(const ArenaGeometry& g) {
  const size_t qk = MissPlan::EntriesPerRow(g);
  const StateLayout roomy = ComputeStateWith(g, 2 * qk);
  return roomy.bytes <= kRoomyStateBytes ? roomy : ComputeStateWith(g, qk * 3 / 2);
}

// Byte offsets of one entry's scratch in the workspace (16-byte aligned): the state (used when
// it does not fit in shared memory), the new LRU order, the fetch list.
struct Scratch {
  StateLayout state;
  size_t state_at, new_lru, fetch, fetch_count, bytes;
};

Scratch ComputeScratch(const ArenaGeometry& g) {
  Scratch s{};
  s.state = ComputeState(g);
  const size_t qk = MissPlan::EntriesPerRow(g), b = g.slots;
  size_t o = 0;
  auto take = [&](size_t bytes) {
    const size_t at = o;
    o = AlignUp(o + bytes, 16);
    return at;
  };
  s.state_at = take(s.state.bytes);
  s.new_lru = take(b * 4);
  s.fetch = take(qk * 8);
  s.fetch_count = take(4);
  s.bytes = AlignUp(o, 256);
  return s;
}

// The state over shared memory or the entry's scratch. Entries written with atomics are read
// after a block barrier.
struct Table {
  unsigned long long* ent;
  int* slot;
  unsigned* lists;
  uint8_t* is_hit;
  int* rank_entry;
  unsigned h;

  __device__ __forceinline__ unsigned Home(int pos) const {
    return __umulhi(static_cast<unsigned>(pos) * 2654435761u, h);
  }
  __device__ __forceinline__ unsigned Next(unsigned e) const { return e + 1 == h ? 0 : e + 1; }
  static __device__ __forceinline__ unsigned long long Pack(int pos, unsigned hi) {
    return static_cast<unsigned long long>(hi) << 32 | static_cast<unsigned>(pos);
  }
  // Finishes the insert of `mine` (position pos) whose CAS into entry *e of an empty entry
  // returned `cur`: probes on past other positions until it places `mine` (returns kEmptyEntry)
  // or finds pos placed already (returns that entry's value); *e ends at its entry.
  __device__ __forceinline__ unsigned long long FinishInsert(int pos, unsigned long long mine, unsigned* e,
                                                             unsigned long long cur) const {
    // Past the home entry, plain loads probe (an atomic is a round trip) and a CAS claims the
    // first empty entry; one that lost the race looks again at what the winner put there.
    while (cur != kEmptyEntry && static_cast<int>(cur & 0xffffffffu) != pos) {
      *e = Next(*e);
      cur = ent[*e];
      if (cur == kEmptyEntry) cur = atomicCAS(&ent[*e], kEmptyEntry, mine);
    }
    return cur;
  }
  // The entry of pos, or -1.
  __device__ __forceinline__ int Find(int pos) const {
    for (unsigned e = Home(pos);; e = Next(e)) {
      const unsigned long long v = ent[e];
      if (static_cast<int>(v & 0xffffffffu) == pos) return static_cast<int>(e);
      if (v == kEmptyEntry) return -1;
    }
  }
  __device__ __forceinline__ int FirstOf(int e) const { return static_cast<int>(ent[e] >> 32); }
  __device__ __forceinline__ int PositionOf(int e) const { return static_cast<int>(ent[e] & 0xffffffffu); }
};

// kPadding in every output of entry i (out_slots and the page table, whichever are asked for) and
// its plan summary (rejected: row, padding: kPadding); nothing for the fetch kernel to copy.
__device__ void PublishPadding(const ResolveDesc& d, int i, int summary_row, int outs, int* fetch_count) {
  int* out = d.out_slots ? d.out_slots + static_cast<size_t>(i) * outs : nullptr;
  int* pt = d.page_table ? d.page_table + static_cast<size_t>(i) * outs : nullptr;
  for (int x = threadIdx.x; x < outs; x += kThreads) {
    if (out) out[x] = kPadding;
    if (pt) pt[x] = kPadding;
  }
  if (threadIdx.x == 0) *fetch_count = 0;
  if (threadIdx.x == 0 && d.plan.summary) {
    int* sum = d.plan.summary + static_cast<size_t>(i) * 3;
    sum[0] = summary_row;
    sum[1] = -1;
    sum[2] = 0;
  }
}

// Entry checks, in the reference's order (CheckEntry): 0 or the ResolveError bit.
__device__ __forceinline__ unsigned CheckEntry(const ResolveDesc& d, int row, int seq, int q) {
  const ArenaGeometry& g = d.arena.geometry;
  if (d.layer < 0 || d.layer >= g.num_layers || row < 0 || row >= g.max_rows) return kResolveBadRow;
  if (q < 1 || q > g.TailSlots()) return kResolveBadQueryCount;
  if (seq < q || seq > d.host.capacity[row]) return kResolveBadSeqLen;
  return 0;
}

// The sum of v over the warps before this one (every lane gets it); v has kWarps entries.
__device__ __forceinline__ int WarpsBefore(const int* v, int warp, int lane) {
  int s = lane < warp ? v[lane] : 0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
  return s;
}

// Phase 3's classification of selection pos at flat index x (kPadding past the lists): whether
// it is its position's first appearance, and then a tail position, a hit or a miss; *e_out
// receives its table entry (when not kNone).
__device__ __forceinline__ int KindOf(const Table& t, int pos, int x, int tail_first, int* e_out) {
  if (pos == kPadding) return kNone;
  const int e = t.Find(pos);
  *e_out = e;
  if (t.FirstOf(e) != x) return kNone;
  if (pos >= tail_first) return kTailFirst;
  return t.slot[e] != kNoIndex ? kHitFirst : kMissFirst;
}

// Loads v[j] = src[base + j * stride] for j < kLoadBatch, `fill` where the index is at or past
// `n`: every load in flight before any is used.
__device__ __forceinline__ void LoadBatch(int (&v)[kLoadBatch], const int* src, int base, int stride, int n, int fill) {
#pragma unroll
  for (int j = 0; j < kLoadBatch; ++j) {
    const int x = base + j * stride;
    v[j] = x < n ? src[x] : fill;
  }
}

// A loop's loads one batch ahead: v takes the batch loaded last, and the next one (when `more`)
// is issued at once, so its latency passes while v is worked on. Every phase's loop reads its
// global inputs this way (at cold L2 each batch is an HBM round trip; B = 10240 at n = 3 is three
// batches per phase).
__device__ __forceinline__ void Advance(int (&v)[kLoadBatch], int (&ahead)[kLoadBatch], bool more, const int* src,
                                        int base, int stride, int n, int fill) {
#pragma unroll
  for (int j = 0; j < kLoadBatch; ++j) v[j] = ahead[j];
  if (more) LoadBatch(ahead, src, base, stride, n, fill);
}

// ---------------------------------------------------------------------------------------------
// Planning one entry: the phases of the design above, one __forceinline__ function each (the
// compiler still sees one body). "Rule n" is rule n of resolve.h.

// What every phase reads: the geometry, the entry, this thread's place in the block, the state.
struct Entry {
  const ResolveDesc* d;
  Table t;
  int B, K, q, n, outs;  // slots, selections per list, query tokens, selections, output columns
  int i, row, seq, tail_first;
  int tid, lane, warp;
  unsigned lt;  // mask of the lanes below this one
  const int* sel;
  int* sp;              // the row's slot table
  int* lru;             // the row's LRU order
  int segb, y0, y_end;  // phase 4: LRU entries per warp; this warp's first and end
};

// The block's words shared between phases (static shared memory).
struct Words {
  unsigned err;
  int uni, hits;  // |U|; hits as rule 8f counts them
  int warp_misses[kWarps], warp_free[kWarps];
};

__device__ __forceinline__ void ClearState(const Entry& e, const StateLayout& L, Words& w) {
  for (unsigned x = e.tid; x < L.h; x += kThreads) {
    e.t.ent[x] = kEmptyEntry;
    e.t.slot[x] = kNoIndex;
  }
  for (unsigned x = e.tid; x < L.h / 4; x += kThreads) e.t.lists[x] = 0;
  for (int s = e.tid; s < e.B; s += kThreads) e.t.is_hit[s] = 0;
  if (e.tid == 0) {
    w.err = 0;
    w.uni = w.hits = 0;
  }
  __syncthreads();
}

// Phase 1: every list against its query's length, duplicates, first appearances. The lists go
// in one after another, a barrier between them, so the CAS that places a position is its first
// appearance's (x never needs a second atomic); finding the position placed already with an x of
// the same list is a duplicate, and one placed by an earlier list is marked with the list's bit
// (its second marking is a duplicate). Per list and thread, kLoadBatch selections are loaded,
// then all their CASes issued, then all their bits, before any result is looked at (shared-memory
// atomics are slow one at a time); collisions are resolved in between. Returns this thread's
// error bits.
__device__ __forceinline__ unsigned InsertLists(const Entry& e) {
  const Table& t = e.t;
  unsigned err = 0;
  constexpr int kStep = kThreads * kLoadBatch;
  // The selections are read one batch ahead, across the barrier between lists: their latency
  // (cold L2: HBM) then overlaps the previous batch's atomics instead of following the barrier.
  int v[kLoadBatch], ahead[kLoadBatch];
  LoadBatch(ahead, e.sel, e.tid, kThreads, e.K, kPadding);
  for (int list = 0; list < e.q; ++list) {
    const int limit = e.seq - e.q + list + 1;  // list `list` selects over [0, P_t + 1)
    const unsigned first_x = static_cast<unsigned>(list * e.K);
    for (int at = 0; at < e.K; at += kStep) {
#pragma unroll
      for (int j = 0; j < kLoadBatch; ++j) v[j] = ahead[j];
      const bool next_list = at + kStep >= e.K;
      if (!next_list || list + 1 < e.q) {
        LoadBatch(ahead, e.sel + (next_list ? first_x + e.K : first_x), (next_list ? 0 : at + kStep) + e.tid, kThreads,
                  e.K, kPadding);
      }
      unsigned long long mine[kLoadBatch], prev[kLoadBatch];
      unsigned home[kLoadBatch];
#pragma unroll
      for (int j = 0; j < kLoadBatch; ++j) {
        const int jj = at + j * kThreads + e.tid, pos = v[j];
        mine[j] = kEmptyEntry;
        if (jj >= e.K) continue;
        if (pos < kPadding || pos >= limit) {
          err |= kResolveBadPosition;
        } else if (pos != kPadding) {
          mine[j] = Table::Pack(pos, first_x + static_cast<unsigned>(jj));
          home[j] = t.Home(pos);
          prev[j] = atomicCAS(&t.ent[home[j]], kEmptyEntry, mine[j]);
        }
      }
      unsigned seen[kLoadBatch], bit[kLoadBatch];
#pragma unroll
      for (int j = 0; j < kLoadBatch; ++j) {
        seen[j] = bit[j] = 0;
        if (mine[j] == kEmptyEntry) continue;
        const unsigned long long found = t.FinishInsert(v[j], mine[j], &home[j], prev[j]);
        if (found == kEmptyEntry) continue;  // placed: the first appearance
        if (static_cast<unsigned>(found >> 32) >= first_x) {
          err |= kResolveDuplicate;  // this list placed it
        } else {
          bit[j] = 1u << ((home[j] & 3) * 8 + list);
          seen[j] = atomicOr(&t.lists[home[j] >> 2], bit[j]);
        }
      }
#pragma unroll
      for (int j = 0; j < kLoadBatch; ++j) {
        if (seen[j] & bit[j]) err |= kResolveDuplicate;
      }
    }
    __syncthreads();  // this list's entries are in before the next list looks
  }
  return err;
}

// Phase 2: the regular slots holding a selected position (the smallest slot per position);
// `first` is the slot table's first batch, loaded before phase 1.
__device__ __forceinline__ void FindHits(const Entry& e, const int (&first)[kLoadBatch]) {
  constexpr int kStep = kThreads * kLoadBatch;
  int v[kLoadBatch], ahead[kLoadBatch];
#pragma unroll
  for (int j = 0; j < kLoadBatch; ++j) ahead[j] = first[j];
  for (int at = 0; at < e.B; at += kStep) {
    Advance(v, ahead, at + kStep < e.B, e.sp, at + kStep + e.tid, kThreads, e.B, kEmptySlot);
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      if (v[j] == kEmptySlot) continue;
      const int x = e.t.Find(v[j]);
      if (x >= 0) atomicMin(&e.t.slot[x], at + j * kThreads + e.tid);
    }
  }
  __syncthreads();
}

// Phase 3, first pass: classify first appearances (tail, hit: marks its slot, miss) over this
// warp's contiguous flat indices [warp * seg, (warp + 1) * seg) by ballots, and add the warp's
// totals to w. Returns the first 32 rounds' miss bits of this lane (RankMisses classifies later
// rounds again).
__device__ __forceinline__ unsigned CountFirsts(const Entry& e, int seg, Words& w) {
  const int x0 = e.warp * seg, x_end = min(e.n, x0 + seg);
  unsigned miss_bits = 0;
  int misses = 0, uni = 0, hits = 0;
  int v[kLoadBatch], ahead[kLoadBatch];
  LoadBatch(ahead, e.sel, x0 + e.lane, 32, x_end, kPadding);
  for (int r0 = 0; r0 * 32 < seg; r0 += kLoadBatch) {
    const int next = (r0 + kLoadBatch) * 32;
    Advance(v, ahead, next < seg, e.sel, x0 + next + e.lane, 32, x_end, kPadding);
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      const int r = r0 + j;
      int x = 0;
      const int kind = KindOf(e.t, v[j], x0 + r * 32 + e.lane, e.tail_first, &x);
      if (kind == kHitFirst) e.t.is_hit[e.t.slot[x]] = 1;
      const unsigned mb = __ballot_sync(~0u, kind == kMissFirst);
      const unsigned hb = __ballot_sync(~0u, kind == kHitFirst);
      const unsigned tb = __ballot_sync(~0u, kind == kTailFirst);
      if (r < 32 && kind == kMissFirst) miss_bits |= 1u << r;
      misses += __popc(mb);
      uni += __popc(mb) + __popc(hb);
      hits += __popc(hb) + __popc(tb);
    }
  }
  if (e.lane == 0) {
    w.warp_misses[e.warp] = misses;
    atomicAdd(&w.uni, uni);
    atomicAdd(&w.hits, hits);
  }
  __syncthreads();
  return miss_bits;
}

// Phase 3, second pass: the misses ranked in flat-index order (U's order) from the warps' totals
// and the same ballots; miss m's table entry goes to rank_entry[m].
__device__ __forceinline__ void RankMisses(const Entry& e, int seg, const Words& w, unsigned miss_bits) {
  const int x0 = e.warp * seg, x_end = min(e.n, x0 + seg);
  int rank = WarpsBefore(w.warp_misses, e.warp, e.lane);
  int v[kLoadBatch], ahead[kLoadBatch];
  LoadBatch(ahead, e.sel, x0 + e.lane, 32, x_end, kPadding);
  for (int r0 = 0; r0 * 32 < seg; r0 += kLoadBatch) {
    const int next = (r0 + kLoadBatch) * 32;
    Advance(v, ahead, next < seg, e.sel, x0 + next + e.lane, 32, x_end, kPadding);
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      const int r = r0 + j;
      int x = 0;
      const bool miss = r < 32 ? ((miss_bits >> r) & 1u) != 0
                               : KindOf(e.t, v[j], x0 + r * 32 + e.lane, e.tail_first, &x) == kMissFirst;
      const unsigned mb = __ballot_sync(~0u, miss);
      if (miss) e.t.rank_entry[rank + __popc(mb & e.lt)] = r < 32 ? e.t.Find(v[j]) : x;
      rank += __popc(mb);
    }
  }
}

// Where phase 4 writes: the new LRU order (scratch), the fetch list (scratch), the miss plan.
struct Placement {
  int* new_lru;
  int2* fetch;
  int2* plan;  // null unless the plan is recorded
};

// Phase 4: non-hit slots ranked in LRU order over warp segments of it, as in phase 3 (counted,
// summed, ranked): the i-th takes the i-th miss (its slot, slot_pos, the fetch list and the
// plan), and the new LRU order has the closed form of resolve.cu (untouched, then victims, then
// hit slots). M misses, H hit slots; `first` is this lane's first batch of the LRU order.
__device__ __forceinline__ void PlaceVictims(const Entry& e, Words& w, const int (&first)[kLoadBatch], int M, int H,
                                             const Placement& out) {
  const Table& t = e.t;
  constexpr int kStep = 32 * kLoadBatch;
  int free_slots = 0;
  int v[kLoadBatch], ahead[kLoadBatch];
#pragma unroll
  for (int j = 0; j < kLoadBatch; ++j) ahead[j] = first[j];
  for (int at = 0; at < e.segb; at += kStep) {
    Advance(v, ahead, at + kStep < e.segb, e.lru, e.y0 + at + kStep + e.lane, 32, e.y_end, -1);
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) free_slots += __popc(__ballot_sync(~0u, v[j] >= 0 && !t.is_hit[v[j]]));
  }
  if (e.lane == 0) w.warp_free[e.warp] = free_slots;
  __syncthreads();
  int r = WarpsBefore(w.warp_free, e.warp, e.lane);  // non-hit slots before this lane's entry
#pragma unroll
  for (int j = 0; j < kLoadBatch; ++j) ahead[j] = first[j];
  for (int at = 0; at < e.segb; at += kStep) {
    Advance(v, ahead, at + kStep < e.segb, e.lru, e.y0 + at + kStep + e.lane, 32, e.y_end, -1);
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      const int y = e.y0 + at + j * 32 + e.lane, s = v[j];
      const bool free_slot = s >= 0 && !t.is_hit[s];
      const unsigned fb = __ballot_sync(~0u, free_slot);
      const int rank = r + __popc(fb & e.lt);
      if (free_slot) {
        if (rank < M) {
          const int x = t.rank_entry[rank];
          const int pos = t.PositionOf(x);
          t.slot[x] = s;
          e.sp[s] = pos;
          out.fetch[rank] = make_int2(pos, s);
          if (out.plan) out.plan[rank] = make_int2(pos, s);
        }
        out.new_lru[rank >= M ? rank - M : (e.B - H - M) + rank] = s;
      } else if (s >= 0) {
        out.new_lru[(e.B - H) + (y - rank)] = s;  // y - rank: this hit slot's rank among hit slots
      }
      r += __popc(fb);
    }
  }
  __syncthreads();
}

// Phase 5: the new LRU order copied back, the outputs (a repeated position takes its first
// appearance's slot) and rule 9's page table.
__device__ __forceinline__ void WriteOutputs(const Entry& e, const int* new_lru) {
  const ResolveDesc& d = *e.d;
  constexpr int kStep = kThreads * kLoadBatch;
  int v[kLoadBatch], ahead[kLoadBatch];
  LoadBatch(ahead, new_lru, e.tid, kThreads, e.B, -1);
  for (int at = 0; at < e.B; at += kStep) {
    Advance(v, ahead, at + kStep < e.B, new_lru, at + kStep + e.tid, kThreads, e.B, -1);
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      if (v[j] >= 0) e.lru[at + j * kThreads + e.tid] = v[j];
    }
  }
  int* out = d.out_slots ? d.out_slots + static_cast<size_t>(e.i) * e.outs : nullptr;
  int* pt = d.page_table ? d.page_table + static_cast<size_t>(e.i) * e.outs : nullptr;  // rule 9
  LoadBatch(ahead, e.sel, e.tid, kThreads, e.n, kPadding);
  for (int at = 0; at < e.outs; at += kStep) {
    Advance(v, ahead, at + kStep < e.outs, e.sel, at + kStep + e.tid, kThreads, e.n, kPadding);
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      const int x = at + j * kThreads + e.tid, pos = v[j];
      if (x >= e.outs) break;
      int o = kPadding;
      if (pos != kPadding) o = pos >= e.tail_first ? e.B + (pos - e.tail_first) : e.t.slot[e.t.Find(pos)];
      if (out) out[x] = o;
      if (pt) pt[x] = o == kPadding ? kPadding : PageTableEntry(d, e.row, o);
    }
  }
}

// The entry's plan summary and the arena's counters (rule 8f), by one thread.
__device__ __forceinline__ void CountEntry(const Entry& e, int M, int hits) {
  const ResolveDesc& d = *e.d;
  if (d.plan.summary) {
    int* sum = d.plan.summary + static_cast<size_t>(e.i) * 3;
    sum[0] = e.row;
    sum[1] = M;
    sum[2] = hits;
  }
  ArenaCounters* c = d.arena.counters;
  const uint32_t rb = d.arena.geometry.record_bytes;
  atomicAdd(reinterpret_cast<unsigned long long*>(&c->hits), static_cast<unsigned long long>(hits));
  atomicAdd(reinterpret_cast<unsigned long long*>(&c->misses), static_cast<unsigned long long>(M));
  atomicAdd(reinterpret_cast<unsigned long long*>(&c->bytes_fetched), static_cast<unsigned long long>(M) * rb);
  atomicAdd(reinterpret_cast<unsigned long long*>(&c->steps), 1ull);
}

template <bool kShared>
__global__ void __launch_bounds__(kThreads, 1)
    MultiQueryResolveKernel(const ResolveDesc d, uint8_t* scratch_base, const Scratch sc) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ Words w;
  const ArenaView& a = d.arena;
  Entry e;
  e.d = &d;
  e.B = a.geometry.slots;
  e.K = a.geometry.k;
  e.outs = a.geometry.TailSlots() * e.K;
  e.i = blockIdx.x;
  e.tid = threadIdx.x;
  e.lane = e.tid & 31;
  e.warp = e.tid >> 5;
  e.lt = (1u << e.lane) - 1u;
  uint8_t* base = scratch_base + static_cast<size_t>(e.i) * sc.bytes;
  int* fetch_count = reinterpret_cast<int*>(base + sc.fetch_count);
  int batch = *d.batch_size;
  batch = batch < 0 ? 0 : (batch > d.max_batch ? d.max_batch : batch);
  if (e.i == 0 && e.tid == 0 && d.plan.summary) *d.plan.batch = batch;
  if (e.i >= batch) {  // rule 7
    PublishPadding(d, e.i, kPadding, e.outs, fetch_count);
    return;
  }
  e.row = d.rows[e.i];
  e.seq = d.seq_lens[e.i];
  e.q = d.query_counts ? d.query_counts[e.i] : 1;
  if (const unsigned err = CheckEntry(d, e.row, e.seq, e.q)) {
    PublishPadding(d, e.i, e.row, e.outs, fetch_count);
    if (e.tid == 0 && d.error_flags) atomicOr(d.error_flags, err);
    return;
  }
  e.n = e.q * e.K;
  e.tail_first = e.seq - e.q;
  e.sel = d.positions + static_cast<size_t>(e.i) * e.outs;
  e.sp = a.SlotPos(e.row, d.layer);
  e.lru = a.Lru(e.row, d.layer);
  e.segb = (e.B + kThreads - 1) / kThreads * 32;
  e.y0 = e.warp * e.segb;
  e.y_end = min(e.B, e.y0 + e.segb);
  // The first batch of phase 2's slot table and of phase 4's LRU order, loaded now: their HBM
  // latency passes while the table is cleared and filled.
  int sp_first[kLoadBatch], lru_first[kLoadBatch];
  LoadBatch(sp_first, e.sp, e.tid, kThreads, e.B, kEmptySlot);
  LoadBatch(lru_first, e.lru, e.y0 + e.lane, 32, e.y_end, -1);
  uint8_t* st = kShared ? smem : base + sc.state_at;
  const StateLayout& L = sc.state;
  e.t = Table{reinterpret_cast<unsigned long long*>(st + L.ent), reinterpret_cast<int*>(st + L.slot),
              reinterpret_cast<unsigned*>(st + L.lists),         st + L.is_hit,
              reinterpret_cast<int*>(st + L.rank_entry),         L.h};
  ClearState(e, L, w);

  if (const unsigned err = InsertLists(e)) atomicOr(&w.err, err);
  __syncthreads();
  if (w.err) {
    PublishPadding(d, e.i, e.row, e.outs, fetch_count);
    if (e.tid == 0 && d.error_flags) atomicOr(d.error_flags, w.err);
    return;
  }
  FindHits(e, sp_first);
  const int seg = (e.n + kThreads - 1) / kThreads * 32;  // phase 3: flat indices per warp
  const unsigned miss_bits = CountFirsts(e, seg, w);
  if (w.uni > e.B) {  // rule 8c
    PublishPadding(d, e.i, e.row, e.outs, fetch_count);
    if (e.tid == 0 && d.error_flags) atomicOr(d.error_flags, static_cast<unsigned>(kResolveUnionTooLarge));
    return;
  }
  int M = 0;
#pragma unroll
  for (int x = 0; x < kWarps; ++x) M += w.warp_misses[x];
  RankMisses(e, seg, w, miss_bits);
  const Placement place{
      reinterpret_cast<int*>(base + sc.new_lru), reinterpret_cast<int2*>(base + sc.fetch),
      d.plan.summary ? reinterpret_cast<int2*>(d.plan.entries) + e.i * MissPlan::EntriesPerRow(a.geometry) : nullptr};
  PlaceVictims(e, w, lru_first, M, w.uni - M, place);
  WriteOutputs(e, place.new_lru);
  if (e.tid == 0) {
    *fetch_count = M;
    CountEntry(e, M, w.hits);
  }
}

constexpr int kFetchThreads = 256;
constexpr int kFetchWarps = kFetchThreads / 32;
constexpr int kFetchRecords = 8;  // records of one warp's chunk
constexpr int kFetchUnroll = 4;   // 16-byte loads a lane keeps in flight

// The fetch of a multi-query launch, spread over the whole GPU: grid (gx, max_batch); the warps of
// column i copy entry i's fetch list (its misses, written by the planner just before, in U's
// order) in chunks of kFetchRecords records, each chunk's 16-byte units spread over the lanes
// across record borders with kFetchUnroll loads in flight. Entries without misses (padding,
// rejected, all hits) have count 0. UPR: the record's 16-byte units when compiled for its size.
template <int UPR>
__global__ void __launch_bounds__(kFetchThreads)
    MultiQueryFetchKernel(const ResolveDesc d, const uint8_t* scratch_base, const Scratch sc) {
  const uint8_t* base = scratch_base + static_cast<size_t>(blockIdx.y) * sc.bytes;
  const int misses = *reinterpret_cast<const int*>(base + sc.fetch_count);
  if (misses <= 0) return;
  const int2* list = reinterpret_cast<const int2*>(base + sc.fetch);
  const ArenaView& a = d.arena;
  const int row = d.rows[blockIdx.y];
  const uint32_t rb = a.geometry.record_bytes;
  const int upr = UPR ? UPR : static_cast<int>(rb / 16);
  // The row's host page table; a one-page table (a contiguous run: every valid position on page 0)
  // is looked up once here, so its records' addresses need no further dependent load.
  uint8_t* const* table = d.host.Table(a.geometry, row, d.layer);
  const uint8_t* page0 = d.host.pages_per_entry == 1 ? HostRecordMap::PageAddress(table[0]) : nullptr;
  uint8_t* dst = a.Record(row, d.layer, 0);
  const int lane = threadIdx.x & 31;
  const int chunks = (misses + kFetchRecords - 1) / kFetchRecords;
  for (int c = blockIdx.x * kFetchWarps + (threadIdx.x >> 5); c < chunks; c += gridDim.x * kFetchWarps) {
    const int start = c * kFetchRecords;
    const int count = misses - start < kFetchRecords ? misses - start : kFetchRecords;
    const int2 e = lane < count ? list[start + lane] : make_int2(0, 0);
    // Lane r < count: record r's host address, looked up in the page table once.
    const uint8_t* rec = page0 ? page0 + static_cast<size_t>(e.x) * rb : d.host.RecordIn(table, e.x, rb);
    const long long src = lane < count ? reinterpret_cast<long long>(rec) : 0;
    const int n = count * upr;
    for (int at = 0; at < n; at += 32 * kFetchUnroll) {
      int4 v[kFetchUnroll];
#pragma unroll
      for (int t = 0; t < kFetchUnroll; ++t) {
        const int u = at + t * 32 + lane;
        const int rec = u < n ? u / upr : 0;
        const long long from = __shfl_sync(~0u, src, rec);
        if (u < n) v[t] = LdHost(reinterpret_cast<const uint8_t*>(from) + (u - rec * upr) * 16);
      }
#pragma unroll
      for (int t = 0; t < kFetchUnroll; ++t) {
        const int u = at + t * 32 + lane;
        const int rec = u < n ? u / upr : 0;
        const int slot = __shfl_sync(~0u, e.y, rec);
        if (u < n) *reinterpret_cast<int4*>(dst + static_cast<size_t>(slot) * rb + (u - rec * upr) * 16) = v[t];
      }
    }
  }
}

using FetchKernelFn = void (*)(const ResolveDesc, const uint8_t*, const Scratch);
FetchKernelFn FetchKernelFor(uint32_t record_bytes) {
  return DispatchRecordBytes(record_bytes,
                             [](auto upr) -> FetchKernelFn { return MultiQueryFetchKernel<decltype(upr)::value>; });
}

}  // namespace

size_t MultiQueryWorkspaceBytes(const ArenaGeometry& g, int max_batch) {
  return static_cast<size_t>(max_batch > 0 ? max_batch : 0) * ComputeScratch(g).bytes;
}

// A few words, rounded up: the planner's static shared memory.
constexpr size_t kStaticSmem = 1 << 10;

cudaError_t PrepareMultiQueryLaunch(const ArenaGeometry& g, ResolveLaunchConfig* c) {
  // The position table in shared memory when it fits the device's opt-in limit (next to the
  // kernel's static shared memory), else in the entry's scratch.
  const Scratch sc = ComputeScratch(g);
  c->blocks_per_sm = 1;
  c->smem = 0;
  if (sc.state.bytes + kStaticSmem > static_cast<size_t>(c->smem_optin)) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(MultiQueryResolveKernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(sc.state.bytes));
  if (e != cudaSuccess) {
    SetLaunchError(cudaGetErrorName(e));
    return e;
  }
  c->smem = static_cast<unsigned>(sc.state.bytes);
  return cudaSuccess;
}

cudaError_t LaunchMultiQueryResolve(const ResolveDesc& d, void* workspace, size_t workspace_bytes,
                                    const ResolveLaunchConfig& c, cudaStream_t stream) {
  const size_t need = MultiQueryWorkspaceBytes(d.arena.geometry, d.max_batch);
  if (!workspace || workspace_bytes < need) {
    return FailLaunch("multi-query RESOLVE workspace too small: " + std::to_string(workspace_bytes) + " bytes, needs " +
                      std::to_string(need));
  }
  const Scratch sc = ComputeScratch(d.arena.geometry);
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  if (c.smem != 0) {
    MultiQueryResolveKernel<true><<<d.max_batch, kThreads, c.smem, stream>>>(d, ws, sc);
  } else {
    MultiQueryResolveKernel<false><<<d.max_batch, kThreads, 0, stream>>>(d, ws, sc);
  }
  if (d.flags & kResolveFlagNoFetch) return CheckLaunched();
  // The fetch: about four blocks per SM over the batch, no more columns than an entry has chunks.
  const int max_chunks =
      static_cast<int>((MissPlan::EntriesPerRow(d.arena.geometry) + kFetchRecords - 1) / kFetchRecords);
  int gx = (4 * c.sms + d.max_batch - 1) / d.max_batch;
  gx = std::max(1, std::min(gx, (max_chunks + kFetchWarps - 1) / kFetchWarps));
  FetchKernelFor(d.arena.geometry.record_bytes)<<<dim3(gx, d.max_batch), kFetchThreads, 0, stream>>>(
      d, static_cast<const uint8_t*>(workspace), sc);
  return CheckLaunched();
}

}  // namespace internal
}  // namespace hisparse
