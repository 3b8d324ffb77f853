// The CUDA multi-query RESOLVE (resolve.h rule 8, draft_tokens > 0): its own kernel, so the
// single-query kernel of resolve.cu (draft_tokens = 0) keeps its code and speed.
//
// Design: one block per batch entry computes exactly what ResolveReference's PlanStep / ResolveRow
// compute, phase by phase with a block barrier between phases, around one open-addressing table
// of the entry's selected positions (32-bit keys; per entry the regular slot and a byte of list
// bits). The state lives in shared memory when it fits the device's opt-in limit (n = 3 at
// k = 2048, B = (n + 2) k fits the H200's), else in the entry's scratch in the workspace; the code
// is the same. The selections are read from global memory once: every later phase works from the
// table entry each selection was given.
//   0. the entry's row, length, query count and first selections are loaded together with the
//      batch size; once the row is known, its LRU order is staged into shared memory with every
//      load in flight (cp.async, as the single-query kernel stages its tables) and the slot
//      table's first batch is loaded, so both land while the table is cleared and filled;
//   1. validation (row, query count, seq_len), then every selection of every list: checked
//      against its query's length, placed by one atomicCAS of its position (or found placed),
//      and its list's bit set in the entry's byte by one atomicOr, whose second setting is a
//      duplicate. The entry goes to sel_entry[x] (x = t * k + j, the flat index). The lists go
//      in one after another, a barrier between them, so the atomicOr also tells whether a lower
//      list selected the position: where none did, x is its first appearance (rule 8b's order),
//      flagged in sel_entry[x];
//   2. hits, found as the single-query kernel finds them: every regular slot looks its position
//      up (atomicMin keeps the smallest slot, as the reference's resident map does);
//   3. every first appearance is classified (tail, hit: marks its slot, miss) by warps that own
//      contiguous segments of the flat indices: ballots count, one barrier sums the warps' totals,
//      a second pass ranks the misses in flat-index order (U's order) from the same ballots; the
//      counts give |U| (rule 8c), the misses M and the hits (rule 8f);
//   4. the non-hit slots are ranked in LRU order the same way (warp segments of the staged LRU
//      order, counted, summed, ranked): the i-th takes the i-th miss (its slot, slot_pos, the
//      fetch list and the plan are written there), and the new LRU order has the closed form of
//      resolve.cu (untouched, then victims, then hit slots), written straight over the row's old
//      one, which only the staged copy is read from;
//   5. outputs from sel_entry (a repeated position shares its first appearance's entry, so its
//      slot) and rule 9's page table, the counters.
// The fetch is a second kernel over the whole GPU (MultiQueryFetchKernel). The first version
// copied inside the planner, one record per warp with plain loads, and moved 0.4 GB/s for one
// request on the H200 (bench/RESULTS.md, "Multi-query RESOLVE"); the second kept its per-
// selection columns in global memory and ranked with per-thread serial shares and block scans;
// the third ranked with warp ballots but looked every selection up again in three later phases,
// read the LRU order from global memory twice and copied the new one back through the scratch
// (bench/RESULTS.md, "Multi-query planner: one table lookup per selection"); the fourth read the
// LRU order from global memory in rounds of dependent loads during phase 4, the entry's row only
// after the batch size, and had a denser table (bench/RESULTS.md, "Multi-query planner: staged
// LRU order, a sparser table"); the fifth ran 512 threads, 0.76 warps of its 16 ready to issue on
// average (ncu), and told first appearances in phase 3 from the list bits and an integer
// division a lane (bench/RESULTS.md, "Multi-query planner: first appearances flagged at insert,
// 1024 threads").
// Invalid entries and padded entries (rule 7) publish kPadding everywhere and touch nothing else.
// The state is rebuilt by its block at the start of every launch, so graph replays need nothing
// in between.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cp_async.cuh"
#include "hisparse/kernels/resolve_cuda.h"
#include "host_load.cuh"
#include "record_dispatch.h"
#include "resolve_multi.h"
#include "stream_order.cuh"

namespace hisparse {
namespace internal {
namespace {

// A whole SM's worth of threads: one block per SM (the state takes its shared memory), and the
// planner is latency-bound (dependent shared-memory loads and atomics), so more warps in flight is
// what pays. On the H200 (ncu, n = 3, batch 1) 512 threads issued an instruction every 8.4 cycles
// per warp with 0.75 warps eligible per scheduler; 1024 threads (48-56 registers, within the 64
// that allows) had 2.0 eligible and planned n = 3 in 24.4 us against 28.3 (bench/RESULTS.md,
// "Multi-query planner: first appearances flagged at insert, 1024 threads").
constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
static_assert(kWarps <= 32, "warp totals are summed by one warp");
static_assert(kMaxDraftTokens + 1 <= 8, "a table entry's list bits are one byte");
constexpr int kNoIndex = 0x7fffffff;  // "no regular slot holds it" of the slot column
constexpr int kNone = 0, kTailFirst = 1, kHitFirst = 2, kMissFirst = 3;
constexpr int kLoadBatch = 8;  // slot-table loads one thread keeps in flight in phase 2
// Selections of one list a thread inserts per batch in phase 1: k = 2048 (DSA's, GLM-5's) in one
// batch.
constexpr int kInsertBatch = (2048 + kThreads - 1) / kThreads;
// An empty key. Only positions >= 0 are placed (padding and invalid positions never are).
constexpr int kEmptyKey = -1;

// The planner's state of one entry: in shared memory when it fits the device's opt-in limit, else
// in the entry's scratch; the code is the same, over these columns:
//   key        [h] the position table (open addressing, linear probing), kEmptyKey when empty;
//   slot       [h] the smallest regular slot holding the entry's position (as the reference's
//              sorted resident map finds it), kNoIndex for none; after phase 4 the slot that holds
//              it (a miss's victim). Set by the thread that places the position, so it needs no
//              clearing;
//   lists      [h] a byte per entry: bit t set once list t selected its position;
//   sel_entry  [Q k] the table entry of selection x (flat index) of the q lists, FirstBit set
//              where x is its position's first appearance; "none" (all ones) for padding;
//   is_hit     [B] a byte per slot: it holds a hit of this step;
//   rank_entry [min(Q k, B)] the table entry of miss m (U's order);
//   lru        [B] the row's LRU order before the step, staged (phase 4 ranks from it while it
//              overwrites the row's).
// In shared memory a table entry's index is 16 bits, its top bit the first-appearance flag (h <
// 2^15 there: the state is under 227 KiB), which leaves room for a larger table; in the workspace
// it is an int.
template <bool kShared>
using IndexOf = std::conditional_t<kShared, uint16_t, int>;

struct StateLayout {
  unsigned h;
  size_t key, slot, lists, sel_entry, is_hit, rank_entry, lru, bytes;
};

// The table has the most of 4, 3, 2, 1.5 and 1.25 Q k entries with which the whole shared state
// stays within kRoomyStateBytes (the 227 KiB H100 and H200 blocks can opt into, less 1 KiB for
// the static words). A sparser table plans much faster than its probe counts suggest: on the
// H200, n = 1 (k 2048, B 6144) planned in 23.3 / 20.2 / 19.4 us at batch 1 with 2 / 3 / 4 Q k
// entries, and 1.25 Q k took 29.1 (bench/RESULTS.md, "Multi-query planner: staged LRU order, a
// sparser table"). n = 1 at k = 2048, B = (n + 2) k takes 4 Q k (193 KiB), n = 3 2 Q k (226 KiB).
// The workspace state has 1.5 Q k.
constexpr size_t kRoomyStateBytes = 226 << 10;

StateLayout ComputeStateWith(const ArenaGeometry& g, size_t entries, bool shared) {
  const size_t qk = MissPlan::EntriesPerRow(g);
  const size_t idx = shared ? sizeof(IndexOf<true>) : sizeof(IndexOf<false>);  // a table entry's index
  const size_t slots = static_cast<uint32_t>(g.slots);
  StateLayout s{};
  s.h = static_cast<unsigned>(AlignUp(std::max<size_t>(64, entries), 64));
  size_t o = 0;
  auto take = [&](size_t bytes) {
    const size_t at = o;
    o = AlignUp(o + bytes, 16);
    return at;
  };
  s.key = take(size_t{s.h} * 4);
  s.slot = take(size_t{s.h} * 4);
  s.lists = take(s.h);  // h is a multiple of 64: whole 32-bit words, whole 16-byte rows
  s.sel_entry = take(qk * idx);
  s.is_hit = take(slots);  // cleared in 16-byte rows: take() pads it to them
  s.rank_entry = take(std::min(qk, slots) * idx);
  s.lru = take(slots * 4);
  s.bytes = o;
  return s;
}

// The state in shared memory (its bytes may exceed what a block can have: then the workspace's).
StateLayout SharedState(const ArenaGeometry& g) {
  const size_t qk = MissPlan::EntriesPerRow(g);
  for (const size_t entries : {4 * qk, 3 * qk, 2 * qk, qk * 3 / 2, qk * 5 / 4}) {
    const StateLayout s = ComputeStateWith(g, entries, true);
    if (s.bytes <= kRoomyStateBytes) return s;
  }
  return ComputeStateWith(g, qk * 5 / 4, true);
}

StateLayout WorkspaceState(const ArenaGeometry& g) {
  return ComputeStateWith(g, MissPlan::EntriesPerRow(g) * 3 / 2, false);
}

// Byte offsets of one entry's scratch in the workspace (16-byte aligned): the state (used when
// it does not fit in shared memory), the fetch list.
struct Scratch {
  size_t state_at, fetch, fetch_count, bytes;
};

Scratch ComputeScratch(const ArenaGeometry& g) {
  Scratch s{};
  const size_t qk = MissPlan::EntriesPerRow(g);
  size_t o = 0;
  auto take = [&](size_t bytes) {
    const size_t at = o;
    o = AlignUp(o + bytes, 16);
    return at;
  };
  s.state_at = take(WorkspaceState(g).bytes);
  s.fetch = take(qk * 8);
  s.fetch_count = take(4);
  s.bytes = AlignUp(o, 256);
  return s;
}

// sel_entry's flag of a first appearance (rule 8b's order), beside the table entry's index (below
// it: h < 0x7fff in shared memory, StateFitsShared; far below it in the workspace).
template <typename Idx>
__device__ __forceinline__ constexpr unsigned FirstBit() {
  return sizeof(Idx) == 2 ? 0x8000u : 0x40000000u;
}

// A table entry's index as sel_entry stores it (Idx: uint16_t in shared memory, int in the
// workspace), its first-appearance flag taken off; all ones is "none" (-1).
template <typename Idx>
__device__ __forceinline__ int EntryOf(Idx v) {
  return v == static_cast<Idx>(-1) ? -1 : static_cast<int>(v & ~FirstBit<Idx>());
}

// Whether sel_entry's value v is a first appearance.
template <typename Idx>
__device__ __forceinline__ bool IsFirst(Idx v) {
  return v != static_cast<Idx>(-1) && (v & FirstBit<Idx>()) != 0;
}

// The state over shared memory or the entry's scratch. Entries written with atomics are read
// after a block barrier.
template <typename Idx>
struct Table {
  int* key;
  int* slot;
  unsigned* lists;
  Idx* sel_entry;
  uint8_t* is_hit;
  Idx* rank_entry;
  int* lru;
  unsigned h;

  __device__ __forceinline__ unsigned Home(int pos) const {
    return __umulhi(static_cast<unsigned>(pos) * 2654435761u, h);
  }
  __device__ __forceinline__ unsigned Next(unsigned e) const { return e + 1 == h ? 0 : e + 1; }
  // Finishes the insert of pos whose CAS into entry *e returned `cur`: probes on past other
  // positions until pos is placed or found placed; *e ends at its entry. True when this thread
  // placed it.
  __device__ __forceinline__ bool FinishInsert(int pos, unsigned* e, int cur) const {
    // Past the home entry, plain loads probe (an atomic is a round trip) and a CAS claims the
    // first empty entry; one that lost the race looks again at what the winner put there.
    while (cur != kEmptyKey && cur != pos) {
      *e = Next(*e);
      cur = key[*e];
      if (cur == kEmptyKey) cur = atomicCAS(&key[*e], kEmptyKey, pos);
    }
    return cur == kEmptyKey;
  }
  // The entry of pos, or -1.
  __device__ __forceinline__ int Find(int pos) const {
    for (unsigned e = Home(pos);; e = Next(e)) {
      const int v = key[e];
      if (v == pos) return static_cast<int>(e);
      if (v == kEmptyKey) return -1;
    }
  }
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

// Loads v[j] = src[base + j * stride] for j < N, `fill` where the index is at or past `n`: every
// load in flight before any is used. Phase 1 reads the selections this way, one batch ahead (at
// cold L2 each batch is an HBM round trip).
template <int N>
__device__ __forceinline__ void LoadBatch(int (&v)[N], const int* src, int base, int stride, int n, int fill) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const int x = base + j * stride;
    v[j] = x < n ? src[x] : fill;
  }
}

// ---------------------------------------------------------------------------------------------
// Planning one entry: the phases of the design above, one __forceinline__ function each (the
// compiler still sees one body). "Rule n" is rule n of resolve.h.

// What every phase reads: the geometry, the entry, this thread's place in the block, the state.
template <typename Idx>
struct Entry {
  const ResolveDesc* d;
  Table<Idx> t;
  int B, K, q, n, outs;  // slots, selections per list, query tokens, selections, output columns
  int i, row, seq, tail_first;
  int tid, lane, warp;
  unsigned lt;  // mask of the lanes below this one
  const int* sel;
  int* sp;   // the row's slot table
  int* lru;  // the row's LRU order
};

// The block's words shared between phases (static shared memory).
struct Words {
  unsigned err;
  int uni, hits;  // |U|; hits as rule 8f counts them
  int warp_misses[kWarps], warp_free[kWarps];
};

// Puts the row's LRU order where phase 4 reads it (phase 4 overwrites the row's): in shared memory
// staged with every load in flight (one cp.async group, which lands while the table is cleared
// and filled), in the workspace copied; seen after a later barrier (WaitStaged first for cp.async).
template <bool kShared, typename Idx>
__device__ __forceinline__ void StageLru(const Entry<Idx>& e) {
  if constexpr (kShared) {
    StageInts<kThreads>(e.t.lru, e.lru, e.B);
    CpAsyncCommit();
  } else {
    for (int y = e.tid; y < e.B; y += kThreads) e.t.lru[y] = e.lru[y];
  }
}

// Waits for the staged LRU order (seen after the next barrier).
template <bool kShared>
__device__ __forceinline__ void WaitStaged() {
  if constexpr (kShared) CpAsyncWaitAll();
}

// Empties the table's keys and list bytes and the hit bytes, in 16-byte rows (every column is a
// whole number of them).
template <typename Idx>
__device__ __forceinline__ void ClearState(const Entry<Idx>& e, const StateLayout& L, Words& w) {
  const int4 empty = make_int4(kEmptyKey, kEmptyKey, kEmptyKey, kEmptyKey);
  const int4 zero = make_int4(0, 0, 0, 0);
  int4* key = reinterpret_cast<int4*>(e.t.key);
  for (unsigned x = e.tid; x < L.h / 4; x += kThreads) key[x] = empty;
  int4* lists = reinterpret_cast<int4*>(e.t.lists);
  for (unsigned x = e.tid; x < L.h / 16; x += kThreads) lists[x] = zero;
  int4* is_hit = reinterpret_cast<int4*>(e.t.is_hit);
  for (int x = e.tid; x < (e.B + 15) / 16; x += kThreads) is_hit[x] = zero;
  if (e.tid == 0) {
    w.err = 0;
    w.uni = w.hits = 0;
  }
  __syncthreads();
}

// Phase 1, one batch of one list: kLoadBatch selections (position v[j], index x0 + j * kThreads in
// list `list`, valid below k) checked against the list's length (list t selects over
// [0, P_t + 1)), placed or found in the table (the thread that places a position also sets its
// slot to kNoIndex), the list's bit set in the entry's byte (a bit set already is a duplicate in
// that list), the entry recorded in sel_entry[x] (none for padding and invalid positions). All
// CASes are issued, then all bits, before any result is looked at (shared-memory atomics are slow
// one at a time); collisions are resolved in between. Returns the batch's error bits.
template <typename Idx>
__device__ __forceinline__ unsigned InsertBatch(const Entry<Idx>& e, const int (&v)[kInsertBatch], int list, int x0) {
  const Table<Idx>& t = e.t;
  unsigned err = 0;
  const int first_x = list * e.K;
  unsigned entry[kInsertBatch], bit[kInsertBatch];
  int prev[kInsertBatch];
#pragma unroll
  for (int j = 0; j < kInsertBatch; ++j) {
    const int jj = x0 + j * kThreads, pos = v[j];
    bit[j] = 0;
    if (jj >= e.K) continue;
    if (pos < kPadding || pos >= e.tail_first + list + 1) err |= kResolveBadPosition;
    if (pos < 0 || pos > e.tail_first + list) {
      t.sel_entry[first_x + jj] = static_cast<Idx>(-1);
      continue;
    }
    entry[j] = t.Home(pos);
    bit[j] = 1u << ((entry[j] & 3) * 8 + list);  // its byte is fixed once the entry is
    prev[j] = atomicCAS(&t.key[entry[j]], kEmptyKey, pos);
  }
  unsigned seen[kInsertBatch];
#pragma unroll
  for (int j = 0; j < kInsertBatch; ++j) {
    if (bit[j] == 0) continue;
    const unsigned home = entry[j];
    if (t.FinishInsert(v[j], &entry[j], prev[j])) t.slot[entry[j]] = kNoIndex;
    if (entry[j] != home) bit[j] = 1u << ((entry[j] & 3) * 8 + list);
    seen[j] = atomicOr(&t.lists[entry[j] >> 2], bit[j]);
    // The first appearance: no lower list selected the position (they all went in before this one).
    const bool first = (seen[j] & (bit[j] - 1u) & (0xffu << ((entry[j] & 3) * 8))) == 0;
    t.sel_entry[first_x + x0 + j * kThreads] = static_cast<Idx>(entry[j] | (first ? FirstBit<Idx>() : 0u));
  }
#pragma unroll
  for (int j = 0; j < kInsertBatch; ++j) {
    if (bit[j] != 0 && (seen[j] & bit[j])) err |= kResolveDuplicate;
  }
  return err;
}

// Rule 10b: the columns list t reads, min(k, P_t + 1); the loads give kPadding past them, so
// whatever an engine's buffer holds there is never read.
template <typename Idx>
__device__ __forceinline__ int ListColumns(const Entry<Idx>& e, int list) {
  const int n = e.tail_first + list + 1;
  return n < e.K ? n : e.K;
}

// Phase 1: every selection of the q lists, list after list with a barrier between them: the
// barriers let InsertBatch tell first appearances, and they paid before they were needed for
// that (on the H200 one pass over all lists planned n = 3 at batch 128 in 46.7 µs against 38.8
// list after list; bench/RESULTS.md, "Multi-query planner: one table lookup per selection").
// The selections are read one batch ahead, across the barrier between lists, so their latency
// overlaps the previous batch's atomics; `first` is list 0's first batch, loaded with the batch
// size. Returns this thread's error bits.
template <typename Idx>
__device__ __forceinline__ unsigned InsertLists(const Entry<Idx>& e, const int (&first)[kInsertBatch]) {
  unsigned err = 0;
  constexpr int kStep = kThreads * kInsertBatch;
  int v[kInsertBatch], ahead[kInsertBatch];
#pragma unroll
  for (int j = 0; j < kInsertBatch; ++j) ahead[j] = first[j];
  for (int list = 0; list < e.q; ++list) {
    for (int at = 0; at < e.K; at += kStep) {
#pragma unroll
      for (int j = 0; j < kInsertBatch; ++j) v[j] = ahead[j];
      const bool next_list = at + kStep >= e.K;
      if (!next_list || list + 1 < e.q) {
        const int next = next_list ? list + 1 : list;
        LoadBatch(ahead, e.sel + next * e.K, (next_list ? 0 : at + kStep) + e.tid, kThreads, ListColumns(e, next),
                  kPadding);
      }
      err |= InsertBatch(e, v, list, at + e.tid);
    }
    if (list + 1 < e.q) __syncthreads();  // this list's entries are in before the next list looks
  }
  return err;
}

// Phase 2: the regular slots holding a selected position (the smallest slot per position), read
// from the row's slot table one batch ahead; `first` is its first batch, loaded before phase 1.
// (Staging the slot table into shared memory as well measured slower: its 40 KiB at n = 3 came
// out of the table, bench/RESULTS.md, "Multi-query planner: staged LRU order, a sparser table".)
template <typename Idx>
__device__ __forceinline__ void FindHits(const Entry<Idx>& e, const int (&first)[kLoadBatch]) {
  constexpr int kStep = kThreads * kLoadBatch;
  int v[kLoadBatch], ahead[kLoadBatch];
#pragma unroll
  for (int j = 0; j < kLoadBatch; ++j) ahead[j] = first[j];
  for (int at = 0; at < e.B; at += kStep) {
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) v[j] = ahead[j];
    if (at + kStep < e.B) LoadBatch(ahead, e.sp, at + kStep + e.tid, kThreads, e.B, kEmptySlot);
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      if (v[j] == kEmptySlot) continue;
      const int x = e.t.Find(v[j]);
      if (x >= 0) atomicMin(&e.t.slot[x], at + j * kThreads + e.tid);
    }
  }
}

// Phase 3's classification of flat index x (kNone at or past the lists, for padding and for
// every appearance but the first); *e_out receives its table entry.
template <typename Idx>
__device__ __forceinline__ int KindOf(const Entry<Idx>& e, int x, int* e_out) {
  const Table<Idx>& t = e.t;
  const Idx v = x < e.n ? t.sel_entry[x] : static_cast<Idx>(-1);
  const int te = EntryOf(v);
  *e_out = te;
  if (!IsFirst(v)) return kNone;
  if (t.key[te] >= e.tail_first) return kTailFirst;
  return t.slot[te] != kNoIndex ? kHitFirst : kMissFirst;
}

// Phase 3, first pass: classify first appearances (tail, hit: marks its slot, miss) over this
// warp's contiguous flat indices [warp * seg, (warp + 1) * seg) by ballots, and add the warp's
// totals to w. Returns the first 32 rounds' miss bits of this lane (RankMisses classifies later
// rounds again).
template <typename Idx>
__device__ __forceinline__ unsigned CountFirsts(const Entry<Idx>& e, int seg, Words& w) {
  const int x0 = e.warp * seg;
  unsigned miss_bits = 0;
  int misses = 0, uni = 0, hits = 0;
  for (int r = 0; r * 32 < seg; ++r) {
    int te = 0;
    const int kind = KindOf(e, x0 + r * 32 + e.lane, &te);
    if (kind == kHitFirst) e.t.is_hit[e.t.slot[te]] = 1;
    const unsigned mb = __ballot_sync(~0u, kind == kMissFirst);
    const unsigned hb = __ballot_sync(~0u, kind == kHitFirst);
    const unsigned tb = __ballot_sync(~0u, kind == kTailFirst);
    if (r < 32 && kind == kMissFirst) miss_bits |= 1u << r;
    misses += __popc(mb);
    uni += __popc(mb) + __popc(hb);
    hits += __popc(hb) + __popc(tb);
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
template <typename Idx>
__device__ __forceinline__ void RankMisses(const Entry<Idx>& e, int seg, const Words& w, unsigned miss_bits) {
  const int x0 = e.warp * seg;
  int rank = WarpsBefore(w.warp_misses, e.warp, e.lane);
  for (int r = 0; r * 32 < seg; ++r) {
    const int x = x0 + r * 32 + e.lane;
    int te = 0;
    const bool miss = r < 32 ? ((miss_bits >> r) & 1u) != 0 : KindOf(e, x, &te) == kMissFirst;
    const unsigned mb = __ballot_sync(~0u, miss);
    if (miss) e.t.rank_entry[rank + __popc(mb & e.lt)] = static_cast<Idx>(EntryOf(e.t.sel_entry[x]));
    rank += __popc(mb);
  }
}

// Where phase 4 writes besides the row's tables: the fetch list (scratch), the miss plan.
struct Placement {
  int2* fetch;
  int2* plan;  // null unless the plan is recorded
};

// Phase 4: non-hit slots ranked in LRU order over warp segments of the staged order, as in phase
// 3 (counted, summed, ranked): the i-th takes the i-th miss (its slot, slot_pos, the fetch list
// and the plan), and the new LRU order has the closed form of resolve.cu (untouched, then
// victims, then hit slots), written over the row's old one (only the staged order is read). M
// misses, H hit slots.
template <typename Idx>
__device__ __forceinline__ void PlaceVictims(const Entry<Idx>& e, Words& w, int M, int H, const Placement& out) {
  const Table<Idx>& t = e.t;
  const int segb = (e.B + kThreads - 1) / kThreads * 32;  // LRU entries per warp
  const int y0 = e.warp * segb, y_end = min(e.B, y0 + segb);
  int free_slots = 0;
  for (int y = y0 + e.lane; y - e.lane < y_end; y += 32) {
    const int s = y < y_end ? t.lru[y] : -1;
    free_slots += __popc(__ballot_sync(~0u, s >= 0 && !t.is_hit[s]));
  }
  if (e.lane == 0) w.warp_free[e.warp] = free_slots;
  __syncthreads();
  int r = WarpsBefore(w.warp_free, e.warp, e.lane);  // non-hit slots before this lane's entry
  for (int y = y0 + e.lane; y - e.lane < y_end; y += 32) {
    const int s = y < y_end ? t.lru[y] : -1;
    const bool free_slot = s >= 0 && !t.is_hit[s];
    const unsigned fb = __ballot_sync(~0u, free_slot);
    const int rank = r + __popc(fb & e.lt);
    if (free_slot) {
      if (rank < M) {
        const int x = t.rank_entry[rank];
        const int pos = t.key[x];
        t.slot[x] = s;
        e.sp[s] = pos;
        out.fetch[rank] = make_int2(pos, s);
        if (out.plan) out.plan[rank] = make_int2(pos, s);
      }
      e.lru[rank >= M ? rank - M : (e.B - H - M) + rank] = s;
    } else if (s >= 0) {
      e.lru[(e.B - H) + (y - rank)] = s;  // y - rank: this hit slot's rank among hit slots
    }
    r += __popc(fb);
  }
  __syncthreads();
}

// Phase 5: the outputs (a repeated position shares its first appearance's entry, so its slot)
// and rule 9's page table.
template <typename Idx>
__device__ __forceinline__ void WriteOutputs(const Entry<Idx>& e) {
  const ResolveDesc& d = *e.d;
  const Table<Idx>& t = e.t;
  int* out = d.out_slots ? d.out_slots + static_cast<size_t>(e.i) * e.outs : nullptr;
  int* pt = d.page_table ? d.page_table + static_cast<size_t>(e.i) * e.outs : nullptr;  // rule 9
  for (int x = e.tid; x < e.outs; x += kThreads) {
    const int te = x < e.n ? EntryOf(t.sel_entry[x]) : -1;
    int o = kPadding;
    if (te >= 0) {
      const int pos = t.key[te];
      o = pos >= e.tail_first ? e.B + (pos - e.tail_first) : t.slot[te];
    }
    if (out) out[x] = o;
    if (pt) pt[x] = o == kPadding ? kPadding : PageTableEntry(d, e.row, o);
  }
}

// The entry's plan summary and the arena's counters (rule 8f), by one thread.
template <typename Idx>
__device__ __forceinline__ void CountEntry(const Entry<Idx>& e, int M, int hits) {
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

// An invalid entry's report (by one thread): its error bits, and one more rejected row-step.
__device__ __forceinline__ void CountRejected(const ResolveDesc& d, unsigned err) {
  if (d.error_flags) atomicOr(d.error_flags, err);
  atomicAdd(reinterpret_cast<unsigned long long*>(&d.arena.counters->rejected), 1ull);
}

// Rejects entry i after its LRU order was staged (a row error found in phase 1 or rule 8c): kPadding
// everywhere, the error bit, nothing else; the staged loads land before the block ends.
template <bool kShared>
__device__ __forceinline__ void RejectStaged(const ResolveDesc& d, int i, int row, int outs, int* fetch_count,
                                             unsigned err) {
  WaitStaged<kShared>();
  PublishPadding(d, i, row, outs, fetch_count);
  if (threadIdx.x == 0) CountRejected(d, err);
}

template <bool kShared>
__global__ void __launch_bounds__(kThreads, 1)
    MultiQueryResolveKernel(const ResolveDesc d, uint8_t* scratch_base, const Scratch sc, const StateLayout L) {
  using Idx = IndexOf<kShared>;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ Words w;
  WaitForPriorGrid();  // before any global access (a programmatic launch)
  const ArenaView& a = d.arena;
  Entry<Idx> e;
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
  // Everything that needs only the entry's index is loaded together with the batch size (i <
  // max_batch: in bounds whatever the batch): its row, length, query count and the first batch
  // of its selections.
  const int row = d.rows[e.i], seq = d.seq_lens[e.i], q = d.query_counts ? d.query_counts[e.i] : 1;
  e.sel = d.positions + static_cast<size_t>(e.i) * e.outs;
  int sel_first[kInsertBatch];
  LoadBatch(sel_first, e.sel, e.tid, kThreads, e.K, kPadding);
  int batch = *d.batch_size;
  batch = batch < 0 ? 0 : (batch > d.max_batch ? d.max_batch : batch);
  if (e.i == 0 && e.tid == 0 && d.plan.summary) *d.plan.batch = batch;
  if (e.i >= batch || row == kPadding) {  // rules 7 and 10a
    PublishPadding(d, e.i, kPadding, e.outs, fetch_count);
    return;
  }
  e.row = row;
  e.seq = seq;
  e.q = q;
  if (const unsigned err = CheckEntry(d, e.row, e.seq, e.q)) {
    PublishPadding(d, e.i, e.row, e.outs, fetch_count);
    if (e.tid == 0) CountRejected(d, err);
    return;
  }
  e.n = e.q * e.K;
  e.tail_first = e.seq - e.q;
#pragma unroll
  for (int j = 0; j < kInsertBatch; ++j) {  // rule 10b for list 0's first batch, loaded before seq
    if (e.tid + j * kThreads > e.tail_first) sel_first[j] = kPadding;
  }
  e.sp = a.SlotPos(e.row, d.layer);
  e.lru = a.Lru(e.row, d.layer);
  uint8_t* st = kShared ? smem : base + sc.state_at;
  e.t = Table<Idx>{reinterpret_cast<int*>(st + L.key),
                   reinterpret_cast<int*>(st + L.slot),
                   reinterpret_cast<unsigned*>(st + L.lists),
                   reinterpret_cast<Idx*>(st + L.sel_entry),
                   st + L.is_hit,
                   reinterpret_cast<Idx*>(st + L.rank_entry),
                   reinterpret_cast<int*>(st + L.lru),
                   L.h};
  int sp_first[kLoadBatch];  // lands while the table is cleared and filled
  LoadBatch(sp_first, e.sp, e.tid, kThreads, e.B, kEmptySlot);
  StageLru<kShared>(e);
  ClearState(e, L, w);

  if (const unsigned err = InsertLists(e, sel_first)) atomicOr(&w.err, err);
  __syncthreads();
  if (w.err) {
    RejectStaged<kShared>(d, e.i, e.row, e.outs, fetch_count, w.err);
    return;
  }
  FindHits(e, sp_first);
  WaitStaged<kShared>();  // the LRU order, for phase 4
  __syncthreads();
  const int seg = (e.n + kThreads - 1) / kThreads * 32;  // phase 3: flat indices per warp
  const unsigned miss_bits = CountFirsts(e, seg, w);
  if (w.uni > e.B) {  // rule 8c
    RejectStaged<kShared>(d, e.i, e.row, e.outs, fetch_count, static_cast<unsigned>(kResolveUnionTooLarge));
    return;
  }
  int M = 0;
#pragma unroll
  for (int x = 0; x < kWarps; ++x) M += w.warp_misses[x];
  RankMisses(e, seg, w, miss_bits);
  const Placement place{
      reinterpret_cast<int2*>(base + sc.fetch),
      d.plan.summary ? reinterpret_cast<int2*>(d.plan.entries) + e.i * MissPlan::EntriesPerRow(a.geometry) : nullptr};
  PlaceVictims(e, w, M, w.uni - M, place);
  WriteOutputs(e);
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
  WaitForPriorGrid();  // the planner's fetch lists (launched as its programmatic dependent)
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

// The shared state fits next to the kernel's static shared memory (its 16-bit entry indices then
// always suffice: h is far below 2^16 in 227 KiB).
bool StateFitsShared(const StateLayout& L, int smem_optin) {
  return L.bytes + kStaticSmem <= static_cast<size_t>(smem_optin) && L.h < 0x7fffu;
}

cudaError_t PrepareMultiQueryLaunch(const ArenaGeometry& g, ResolveLaunchConfig* c) {
  // The state in shared memory when it fits the device's opt-in limit, else in the entry's scratch.
  const StateLayout L = SharedState(g);
  c->blocks_per_sm = 1;
  c->smem = 0;
  if (!StateFitsShared(L, c->smem_optin)) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(MultiQueryResolveKernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(L.bytes));
  if (e != cudaSuccess) {
    SetLaunchError(cudaGetErrorName(e));
    return e;
  }
  c->smem = static_cast<unsigned>(L.bytes);
  return cudaSuccess;
}

cudaError_t LaunchMultiQueryResolve(const ResolveDesc& d, void* workspace, size_t workspace_bytes,
                                    const ResolveLaunchConfig& c, cudaStream_t stream) {
  const ArenaGeometry& g = d.arena.geometry;
  const Scratch sc = ComputeScratch(g);
  const size_t need = static_cast<size_t>(d.max_batch) * sc.bytes;
  if (!workspace || workspace_bytes < need) {
    return FailLaunch("multi-query RESOLVE workspace too small: " + std::to_string(workspace_bytes) + " bytes, needs " +
                      std::to_string(need));
  }
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  cudaError_t e = c.smem != 0 ? LaunchInOrder(MultiQueryResolveKernel<true>, dim3(d.max_batch), dim3(kThreads), c.smem,
                                              stream, Programmatic(c), d, ws, sc, SharedState(g))
                              : LaunchInOrder(MultiQueryResolveKernel<false>, dim3(d.max_batch), dim3(kThreads), 0,
                                              stream, Programmatic(c), d, ws, sc, WorkspaceState(g));
  if (e != cudaSuccess) return LaunchCallFailed(e);
  if (d.flags & kResolveFlagNoFetch) return CheckLaunched();
  // The fetch: about four blocks per SM over the batch, no more columns than an entry has chunks.
  const int max_chunks =
      static_cast<int>((MissPlan::EntriesPerRow(d.arena.geometry) + kFetchRecords - 1) / kFetchRecords);
  int gx = (4 * c.sms + d.max_batch - 1) / d.max_batch;
  gx = std::max(1, std::min(gx, (max_chunks + kFetchWarps - 1) / kFetchWarps));
  if (c.max_blocks > 0) gx = std::max(1, std::min(gx, c.max_blocks / d.max_batch));  // the caller's budget
  // A programmatic dependent of the planner wherever the device allows it: its launch overlaps
  // the planner's tail, and it waits for the planner's lists before reading them.
  e = LaunchInOrder(FetchKernelFor(d.arena.geometry.record_bytes), dim3(gx, d.max_batch), dim3(kFetchThreads), 0,
                    stream, c.cc_major >= 9, d, static_cast<const uint8_t*>(workspace), sc);
  return e != cudaSuccess ? LaunchCallFailed(e) : CheckLaunched();
}

}  // namespace internal
}  // namespace hisparse
