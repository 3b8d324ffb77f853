// The CUDA multi-query RESOLVE (resolve.h rule 8, draft_tokens > 0): its own kernel, so the
// single-query kernel of resolve.cu (draft_tokens = 0) keeps its code and speed.
//
// Design: one block per batch entry computes exactly what ResolveReference's PlanStep / ResolveRow
// compute, phase by phase with a block barrier between phases, around one open-addressing table
// of the entry's selected positions (first appearance, regular slot, list bits). The table lives
// in shared memory when it fits the device's opt-in limit (up to (n + 1) * k = 8192 selections,
// n = 3 at k = 2048), else in the entry's scratch in the workspace; the code is the same.
//   1. validation (row, query count, seq_len), then every list against its query's length; each
//      selection goes into the table: the smallest flat index x = t * k + j per position (its
//      first appearance, rule 8b's order) by atomicMin, and a bit per list, whose second setting
//      is a duplicate;
//   2. hits, found as the single-query kernel finds them: every regular slot looks its position
//      up in the table (atomicMin keeps the smallest slot, as the reference's resident map does);
//   3. every first appearance is classified (tail, hit: marks its slot, miss) over contiguous
//      per-thread shares, and one block scan ranks the misses in flat-index order (U's order);
//      the counts give |U| (rule 8c), the misses M and the hits (rule 8f);
//   4. one block scan ranks the non-hit slots in LRU order: the i-th is the i-th miss's victim,
//      and the new LRU order has the closed form of resolve.cu (untouched, then victims, then hit
//      slots);
//   5. outputs (a repeated position takes its first appearance's slot) and rule 9's page table,
//      slot_pos of the victims, the miss plan, the counters, and the entry's fetch list (its
//      misses' (position, slot)).
// The fetch is a second kernel over the whole GPU (MultiQueryFetchKernel). The first version
// copied inside the planner, one record per warp with plain loads, and moved 0.4 GB/s for one
// request on the H200 (bench/RESULTS.md, "Multi-query RESOLVE"); it also kept three hash tables
// in global memory and ranked with one scan per 512 items.
// Invalid entries and padded entries (rule 7) publish kPadding everywhere and touch nothing else.
// The table and the columns are rebuilt by their block at the start of every launch, so graph
// replays need nothing in between.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/block/block_scan.cuh>
#include <string>

#include "hisparse/kernels/resolve_cuda.h"
#include "host_load.cuh"
#include "record_dispatch.h"
#include "resolve_multi.h"

namespace hisparse {
namespace internal {
namespace {

constexpr int kThreads = 512;
constexpr int kEmpty = -1;            // empty key of the position table (keys are positions >= 0)
constexpr int kNoIndex = 0x7fffffff;  // "none yet" of the first-appearance and slot columns
constexpr int kNone = 0, kTailFirst = 1, kHitFirst = 2, kMissFirst = 3;

int Pow2AtLeast(size_t n) {
  int bits = 4;
  while ((size_t{1} << bits) < n) ++bits;
  return bits;
}

// The position table of one entry: open addressing over 2^bits entries (at least twice the
// selections, so it never fills), four columns. key: the position; first: the smallest flat
// index x = t * k + j selecting it (rule 8b's first appearance); slot: the smallest regular slot
// holding it (as the reference's sorted resident map finds it); lists: a byte per entry, bit t
// set once list t selected it (a second time is a duplicate).
struct TableLayout {
  int bits;
  size_t key, first, slot, lists, bytes;
};

TableLayout ComputeTable(const ArenaGeometry& g) {
  TableLayout t{};
  t.bits = Pow2AtLeast(2 * MissPlan::EntriesPerRow(g));
  const size_t h = size_t{1} << t.bits;
  t.key = 0;
  t.first = h * 4;
  t.slot = h * 8;
  t.lists = h * 12;
  t.bytes = h * 13;  // h >= 16: the lists column is whole 32-bit words
  return t;
}

// Byte offsets of one entry's scratch in the workspace (16-byte aligned): the table (used when it
// does not fit in shared memory), the per-selection and per-slot columns, the fetch list.
struct Scratch {
  TableLayout table;
  size_t table_at, kind, miss_rank, victim, is_hit, new_lru, fetch, fetch_count, bytes;
};

Scratch ComputeScratch(const ArenaGeometry& g) {
  Scratch s{};
  s.table = ComputeTable(g);
  const size_t qk = MissPlan::EntriesPerRow(g), b = g.slots;
  size_t o = 0;
  auto take = [&](size_t bytes) {
    const size_t at = o;
    o = AlignUp(o + bytes, 16);
    return at;
  };
  s.table_at = take(s.table.bytes);
  s.kind = take(qk * 4);
  s.miss_rank = take(qk * 4);
  s.victim = take(b * 4);
  s.is_hit = take(b * 4);
  s.new_lru = take(b * 4);
  s.fetch = take(qk * 8);
  s.fetch_count = take(4);
  s.bytes = AlignUp(o, 256);
  return s;
}

__device__ __forceinline__ unsigned Slot0(int pos, unsigned mask) {
  return (static_cast<unsigned>(pos) * 2654435761u >> 7) & mask;
}

// The position table in shared memory or in the entry's scratch (global memory); the same code
// runs over both. Entries written with atomics are read after a block barrier.
struct Table {
  int *key, *first, *slot;
  unsigned* lists;
  unsigned mask;

  // Inserts pos (selected at flat index x by list `list`); true when the list selected it before.
  __device__ bool Insert(int pos, int x, int list) const {
    for (unsigned h = Slot0(pos, mask);; h = (h + 1) & mask) {
      const int prev = atomicCAS(&key[h], kEmpty, pos);
      if (prev == kEmpty || prev == pos) {
        atomicMin(&first[h], x);
        const unsigned bit = 1u << ((h & 3) * 8 + list);
        return (atomicOr(&lists[h >> 2], bit) & bit) != 0;
      }
    }
  }
  // The entry of pos, or -1.
  __device__ int Find(int pos) const {
    for (unsigned h = Slot0(pos, mask);; h = (h + 1) & mask) {
      const int k = key[h];
      if (k == pos) return static_cast<int>(h);
      if (k == kEmpty) return -1;
    }
  }
};

using BlockScan = cub::BlockScan<int, kThreads>;

// This thread's contiguous share [*lo, *hi) of n items: order-preserving ranks need one block
// scan of per-thread counts instead of one per 512 items.
__device__ __forceinline__ void ShareOf(int n, int* lo, int* hi) {
  const int per = (n + kThreads - 1) / kThreads;
  *lo = min(n, static_cast<int>(threadIdx.x) * per);
  *hi = min(n, *lo + per);
}

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

template <bool kShared>
__global__ void __launch_bounds__(kThreads)
    MultiQueryResolveKernel(const ResolveDesc d, uint8_t* scratch_base, const Scratch sc) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ BlockScan::TempStorage tmp;
  __shared__ unsigned s_err;
  __shared__ int s_union, s_misses, s_hits;
  const ArenaView& a = d.arena;
  const int B = a.geometry.slots, K = a.geometry.k, Q = a.geometry.TailSlots();
  const int outs = Q * K;
  const int i = blockIdx.x;
  uint8_t* base = scratch_base + static_cast<size_t>(i) * sc.bytes;
  int* fetch_count = reinterpret_cast<int*>(base + sc.fetch_count);
  int batch = *d.batch_size;
  batch = batch < 0 ? 0 : (batch > d.max_batch ? d.max_batch : batch);
  if (i == 0 && threadIdx.x == 0 && d.plan.summary) *d.plan.batch = batch;
  if (i >= batch) {  // rule 7
    PublishPadding(d, i, kPadding, outs, fetch_count);
    return;
  }
  const int row = d.rows[i], seq = d.seq_lens[i];
  const int q = d.query_counts ? d.query_counts[i] : 1;
  if (const unsigned err = CheckEntry(d, row, seq, q)) {
    PublishPadding(d, i, row, outs, fetch_count);
    if (threadIdx.x == 0 && d.error_flags) atomicOr(d.error_flags, err);
    return;
  }
  uint8_t* tb = kShared ? smem : base + sc.table_at;
  const Table t{reinterpret_cast<int*>(tb + sc.table.key), reinterpret_cast<int*>(tb + sc.table.first),
                reinterpret_cast<int*>(tb + sc.table.slot), reinterpret_cast<unsigned*>(tb + sc.table.lists),
                (1u << sc.table.bits) - 1};
  int* kind = reinterpret_cast<int*>(base + sc.kind);
  int* miss_rank = reinterpret_cast<int*>(base + sc.miss_rank);
  int* victim = reinterpret_cast<int*>(base + sc.victim);
  int* is_hit = reinterpret_cast<int*>(base + sc.is_hit);
  int* new_lru = reinterpret_cast<int*>(base + sc.new_lru);
  const int hs = 1 << sc.table.bits;
  for (int x = threadIdx.x; x < hs; x += kThreads) {
    t.key[x] = kEmpty;
    t.first[x] = kNoIndex;
    t.slot[x] = kNoIndex;
  }
  for (int x = threadIdx.x; x < hs / 4; x += kThreads) t.lists[x] = 0;
  for (int s = threadIdx.x; s < B; s += kThreads) is_hit[s] = 0;
  if (threadIdx.x == 0) {
    s_err = 0;
    s_union = s_misses = s_hits = 0;
  }
  __syncthreads();

  // Phase 1: every list against its query's length, duplicates, first appearances.
  const int* sel = d.positions + static_cast<size_t>(i) * outs;
  const int n = q * K;
  unsigned my_err = 0;
  for (int x = threadIdx.x; x < n; x += kThreads) {
    const int list = x / K, pos = sel[x];
    if (pos < kPadding || pos >= seq - q + list + 1) {
      my_err |= kResolveBadPosition;
    } else if (pos != kPadding && t.Insert(pos, x, list)) {
      my_err |= kResolveDuplicate;
    }
  }
  if (my_err) atomicOr(&s_err, my_err);
  __syncthreads();
  if (s_err) {
    PublishPadding(d, i, row, outs, fetch_count);
    if (threadIdx.x == 0 && d.error_flags) atomicOr(d.error_flags, s_err);
    return;
  }
  // Phase 2: the regular slots holding a selected position (the smallest slot per position).
  const int* slot_pos = a.SlotPos(row, d.layer);
  for (int s = threadIdx.x; s < B; s += kThreads) {
    const int p = slot_pos[s];
    if (p == kEmptySlot) continue;
    const int h = t.Find(p);
    if (h >= 0) atomicMin(&t.slot[h], s);
  }
  __syncthreads();

  // Phase 3: classify first appearances (tail, hit: marks its slot, miss) and rank the misses in
  // flat-index order (U's order), over this thread's contiguous share.
  const int tail_first = seq - q;
  int lo, hi;
  ShareOf(n, &lo, &hi);
  int my_union = 0, my_misses = 0, my_hits = 0;
  for (int x = lo; x < hi; ++x) {
    const int pos = sel[x];
    int k = kNone;
    if (pos != kPadding) {
      const int h = t.Find(pos);
      if (t.first[h] == x) {
        if (pos >= tail_first) {
          k = kTailFirst;
          ++my_hits;
        } else if (t.slot[h] != kNoIndex) {
          k = kHitFirst;
          is_hit[t.slot[h]] = 1;
          ++my_hits;
          ++my_union;
        } else {
          k = kMissFirst;
          ++my_misses;
          ++my_union;
        }
      }
    }
    kind[x] = k;
  }
  int rank = 0;
  BlockScan(tmp).ExclusiveSum(my_misses, rank);
  for (int x = lo; x < hi; ++x) {
    if (kind[x] == kMissFirst) miss_rank[x] = rank++;
  }
  atomicAdd(&s_union, my_union);
  atomicAdd(&s_misses, my_misses);
  atomicAdd(&s_hits, my_hits);
  __syncthreads();
  if (s_union > B) {  // rule 8c
    PublishPadding(d, i, row, outs, fetch_count);
    if (threadIdx.x == 0 && d.error_flags) atomicOr(d.error_flags, static_cast<unsigned>(kResolveUnionTooLarge));
    return;
  }
  const int M = s_misses, H = s_union - s_misses;

  // Phase 4: non-hit slots ranked in LRU order (the i-th takes the i-th miss) and the new LRU
  // order in closed form (untouched, then victims, then hit slots), over contiguous shares.
  int* lru = a.Lru(row, d.layer);
  ShareOf(B, &lo, &hi);
  int my_free = 0;
  for (int y = lo; y < hi; ++y) my_free += is_hit[lru[y]] ? 0 : 1;
  int r = 0;
  __syncthreads();  // tmp is reused
  BlockScan(tmp).ExclusiveSum(my_free, r);
  for (int y = lo; y < hi; ++y) {
    const int s = lru[y];
    if (!is_hit[s]) {
      if (r < M) victim[r] = s;
      new_lru[r >= M ? r - M : (B - H - M) + r] = s;
      ++r;
    } else {
      new_lru[(B - H) + (y - r)] = s;  // y - r: this hit slot's rank among hit slots
    }
  }
  __syncthreads();

  // Phase 5: tables, outputs, plan, counters, and the fetch list MultiQueryFetchKernel copies.
  int2* fetch = reinterpret_cast<int2*>(base + sc.fetch);
  int* sp = a.SlotPos(row, d.layer);
  for (int y = threadIdx.x; y < B; y += kThreads) lru[y] = new_lru[y];
  int* out = d.out_slots ? d.out_slots + static_cast<size_t>(i) * outs : nullptr;
  int* pt = d.page_table ? d.page_table + static_cast<size_t>(i) * outs : nullptr;  // rule 9
  int2* plan =
      d.plan.summary ? reinterpret_cast<int2*>(d.plan.entries) + i * MissPlan::EntriesPerRow(a.geometry) : nullptr;
  for (int x = threadIdx.x; x < outs; x += kThreads) {
    const int pos = x < n ? sel[x] : kPadding;
    int o = kPadding;
    if (pos != kPadding) {
      if (pos >= tail_first) {
        o = B + (pos - tail_first);
      } else {
        const int h = t.Find(pos);
        const int f = t.first[h];
        o = kind[f] == kHitFirst ? t.slot[h] : victim[miss_rank[f]];
      }
      if (kind[x] == kMissFirst) {
        sp[o] = pos;
        fetch[miss_rank[x]] = make_int2(pos, o);
        if (plan) plan[miss_rank[x]] = make_int2(pos, o);
      }
    }
    if (out) out[x] = o;
    if (pt) pt[x] = o == kPadding ? kPadding : PageTableEntry(d, row, o);
  }
  if (threadIdx.x == 0) {
    *fetch_count = M;
    if (d.plan.summary) {
      int* sum = d.plan.summary + static_cast<size_t>(i) * 3;
      sum[0] = row;
      sum[1] = M;
      sum[2] = s_hits;
    }
    ArenaCounters* c = a.counters;
    const uint32_t rb = a.geometry.record_bytes;
    atomicAdd(reinterpret_cast<unsigned long long*>(&c->hits), static_cast<unsigned long long>(s_hits));
    atomicAdd(reinterpret_cast<unsigned long long*>(&c->misses), static_cast<unsigned long long>(M));
    atomicAdd(reinterpret_cast<unsigned long long*>(&c->bytes_fetched), static_cast<unsigned long long>(M) * rb);
    atomicAdd(reinterpret_cast<unsigned long long*>(&c->steps), 1ull);
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

// The block scan's storage and a few words, rounded up: the planner's static shared memory.
constexpr size_t kStaticSmem = 8 << 10;

cudaError_t PrepareMultiQueryLaunch(const ArenaGeometry& g, ResolveLaunchConfig* c) {
  // The position table in shared memory when it fits the device's opt-in limit (next to the
  // kernel's static shared memory), else in the entry's scratch.
  const Scratch sc = ComputeScratch(g);
  c->blocks_per_sm = 1;
  c->smem = 0;
  if (sc.table.bytes + kStaticSmem > static_cast<size_t>(c->smem_optin)) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(MultiQueryResolveKernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(sc.table.bytes));
  if (e != cudaSuccess) {
    SetLaunchError(cudaGetErrorName(e));
    return e;
  }
  c->smem = static_cast<unsigned>(sc.table.bytes);
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
