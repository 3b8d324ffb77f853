// The CUDA multi-query RESOLVE (resolve.h rule 8, draft_tokens > 0): its own kernel, so the
// single-query kernel of resolve.cu (draft_tokens = 0) keeps its code and speed.
//
// Design: correctness by construction first. One block per batch entry computes exactly what
// ResolveReference's PlanStep / ResolveRow compute, phase by phase with a block barrier between
// phases, in the entry's own scratch in the workspace (global memory, so any k, B and n fit):
//   1. validation (row, query count, seq_len), then every list against its query's length and for
//      duplicates (a hash set of (list, position)), while the first appearance of every position
//      (the smallest flat index x = t * k + j, atomicMin in a position hash table) and the
//      position -> slot map of the row's regular slots (a second hash table) are built;
//   2. every selection that is its position's first appearance is classified: tail, hit (marks
//      its slot) or miss; the counts give |U|, the misses M and the hits (rule 8f);
//   3. two block scans rank the misses in flat-index order (U's order) and the non-hit slots in
//      LRU order: the i-th non-hit slot is the i-th miss's victim, and the new LRU order has the
//      closed form of resolve.cu (untouched, then victims, then hit slots);
//   4. outputs (a repeated position takes its first appearance's slot), slot_pos of the victims,
//      the miss plan, the counters, and the fetch (one warp per missed record).
// Invalid entries and padded entries (rule 7) publish kPadding everywhere and touch nothing else.
// The scratch is cleared by its block at the start of every launch, so graph replays need nothing
// in between. Speed is not tuned yet (no work queue, no shared-memory planning).
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>
#include <string>

#include "hisparse/kernels/resolve_cuda.h"
#include "resolve_multi.h"

namespace hisparse {
namespace internal {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kEmpty = -1;                        // empty key of the int hash tables (keys are >= 0)
constexpr unsigned long long kEmptyPair = ~0ull;  // empty key of the (list, position) set
constexpr int kNone = 0, kTailFirst = 1, kHitFirst = 2, kMissFirst = 3;

int Pow2AtLeast(size_t n) {
  int bits = 4;
  while ((size_t{1} << bits) < n) ++bits;
  return bits;
}

// Byte offsets of one entry's scratch (all 8-byte aligned).
struct Scratch {
  int sel_bits, res_bits;
  size_t first_key, first_val, pairs, res_key, res_val, kind, miss_rank, victim, is_hit, new_lru, bytes;
};

Scratch ComputeScratch(const ArenaGeometry& g) {
  Scratch s{};
  const size_t qk = MissPlan::EntriesPerRow(g);
  s.sel_bits = Pow2AtLeast(2 * qk);
  s.res_bits = Pow2AtLeast(2 * static_cast<size_t>(g.slots));
  const size_t hs = size_t{1} << s.sel_bits, hr = size_t{1} << s.res_bits, b = g.slots;
  size_t o = 0;
  auto take = [&](size_t bytes) {
    const size_t at = o;
    o = AlignUp(o + bytes, 16);
    return at;
  };
  s.pairs = take(hs * 8);
  s.first_key = take(hs * 4);
  s.first_val = take(hs * 4);
  s.res_key = take(hr * 4);
  s.res_val = take(hr * 4);
  s.kind = take(qk * 4);
  s.miss_rank = take(qk * 4);
  s.victim = take(b * 4);
  s.is_hit = take(b * 4);
  s.new_lru = take(b * 4);
  s.bytes = AlignUp(o, 256);
  return s;
}

__device__ __forceinline__ unsigned Hash(unsigned long long x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return static_cast<unsigned>(x);
}

struct Tables {
  unsigned long long* pairs;
  int *first_key, *first_val, *res_key, *res_val, *kind, *miss_rank, *victim, *is_hit, *new_lru;
  unsigned sel_mask, res_mask;
};

// Inserts pos with index x, keeping the smallest index per position.
__device__ void InsertFirst(const Tables& t, int pos, int x) {
  for (unsigned h = Hash(static_cast<unsigned>(pos)) & t.sel_mask;; h = (h + 1) & t.sel_mask) {
    const int prev = atomicCAS(&t.first_key[h], kEmpty, pos);
    if (prev == kEmpty || prev == pos) {
      atomicMin(&t.first_val[h], x);
      return;
    }
  }
}
// Reads of entries other threads wrote with atomics: from L2, past this SM's L1.
__device__ int FirstOf(const Tables& t, int pos) {
  for (unsigned h = Hash(static_cast<unsigned>(pos)) & t.sel_mask;; h = (h + 1) & t.sel_mask) {
    if (__ldcg(&t.first_key[h]) == pos) return __ldcg(&t.first_val[h]);
  }
}
// True when (list, pos) was inserted before.
__device__ bool InsertPair(const Tables& t, int list, int pos) {
  const unsigned long long key = static_cast<unsigned long long>(list) << 32 | static_cast<unsigned>(pos);
  for (unsigned h = Hash(key) & t.sel_mask;; h = (h + 1) & t.sel_mask) {
    const unsigned long long prev = atomicCAS(&t.pairs[h], kEmptyPair, key);
    if (prev == kEmptyPair) return false;
    if (prev == key) return true;
  }
}
__device__ void InsertResident(const Tables& t, int pos, int slot) {
  for (unsigned h = Hash(static_cast<unsigned>(pos)) & t.res_mask;; h = (h + 1) & t.res_mask) {
    if (atomicCAS(&t.res_key[h], kEmpty, pos) == kEmpty) {
      t.res_val[h] = slot;
      return;
    }
  }
}
// The regular slot holding pos, or -1.
__device__ int ResidentSlot(const Tables& t, int pos) {
  for (unsigned h = Hash(static_cast<unsigned>(pos)) & t.res_mask;; h = (h + 1) & t.res_mask) {
    const int key = __ldcg(&t.res_key[h]);
    if (key == pos) return __ldcg(&t.res_val[h]);
    if (key == kEmpty) return -1;
  }
}

using BlockScan = cub::BlockScan<int, kThreads>;

// Exclusive ranks of flag(i) over i in [0, n), written by write(i, rank) for every i; returns the
// total. Block-wide; every thread must call it.
template <typename Flag, typename Write>
__device__ int RankAll(int n, BlockScan::TempStorage& tmp, Flag flag, Write write) {
  int carry = 0;
  for (int base = 0; base < n; base += kThreads) {
    const int i = base + static_cast<int>(threadIdx.x);
    const int f = i < n ? flag(i) : 0;
    int rank = 0, total = 0;
    BlockScan(tmp).ExclusiveSum(f, rank, total);
    if (i < n) write(i, carry + rank, f);
    carry += total;
    __syncthreads();  // tmp is reused
  }
  return carry;
}

// kPadding in every output of entry i and its plan summary (rejected: row, padding: kPadding).
__device__ void PublishPadding(const ResolveDesc& d, int i, int summary_row, int outs) {
  int* out = d.out_slots + static_cast<size_t>(i) * outs;
  for (int x = threadIdx.x; x < outs; x += kThreads) out[x] = kPadding;
  if (threadIdx.x == 0 && d.plan.summary) {
    int* sum = d.plan.summary + static_cast<size_t>(i) * 3;
    sum[0] = summary_row;
    sum[1] = -1;
    sum[2] = 0;
  }
}

__global__ void __launch_bounds__(kThreads)
    MultiQueryResolveKernel(const ResolveDesc d, uint8_t* scratch_base, const Scratch sc) {
  __shared__ BlockScan::TempStorage tmp;
  __shared__ unsigned s_err;
  __shared__ int s_union, s_misses, s_hits;
  const ArenaView& a = d.arena;
  const int B = a.geometry.slots, K = a.geometry.k, Q = a.geometry.TailSlots();
  const int outs = Q * K;
  const int i = blockIdx.x;
  int batch = *d.batch_size;
  batch = batch < 0 ? 0 : (batch > d.max_batch ? d.max_batch : batch);
  if (i == 0 && threadIdx.x == 0 && d.plan.summary) *d.plan.batch = batch;
  if (i >= batch) {  // rule 7
    PublishPadding(d, i, kPadding, outs);
    return;
  }
  const int row = d.rows[i], seq = d.seq_lens[i];
  const int q = d.query_counts ? d.query_counts[i] : 1;
  // Entry checks, in the reference's order (CheckEntry).
  unsigned err = 0;
  if (d.layer < 0 || d.layer >= a.geometry.num_layers || row < 0 || row >= a.geometry.max_rows) {
    err = kResolveBadRow;
  } else if (q < 1 || q > Q) {
    err = kResolveBadQueryCount;
  } else if (seq < q || seq > d.host.capacity[row]) {
    err = kResolveBadSeqLen;
  }
  if (err) {
    PublishPadding(d, i, row, outs);
    if (threadIdx.x == 0 && d.error_flags) atomicOr(d.error_flags, err);
    return;
  }
  uint8_t* base = scratch_base + static_cast<size_t>(i) * sc.bytes;
  Tables t;
  t.pairs = reinterpret_cast<unsigned long long*>(base + sc.pairs);
  t.first_key = reinterpret_cast<int*>(base + sc.first_key);
  t.first_val = reinterpret_cast<int*>(base + sc.first_val);
  t.res_key = reinterpret_cast<int*>(base + sc.res_key);
  t.res_val = reinterpret_cast<int*>(base + sc.res_val);
  t.kind = reinterpret_cast<int*>(base + sc.kind);
  t.miss_rank = reinterpret_cast<int*>(base + sc.miss_rank);
  t.victim = reinterpret_cast<int*>(base + sc.victim);
  t.is_hit = reinterpret_cast<int*>(base + sc.is_hit);
  t.new_lru = reinterpret_cast<int*>(base + sc.new_lru);
  t.sel_mask = (1u << sc.sel_bits) - 1;
  t.res_mask = (1u << sc.res_bits) - 1;
  const int hs = 1 << sc.sel_bits, hr = 1 << sc.res_bits;
  for (int x = threadIdx.x; x < hs; x += kThreads) {
    t.pairs[x] = kEmptyPair;
    t.first_key[x] = kEmpty;
    t.first_val[x] = 0x7fffffff;
  }
  for (int x = threadIdx.x; x < hr; x += kThreads) t.res_key[x] = kEmpty;
  for (int s = threadIdx.x; s < B; s += kThreads) t.is_hit[s] = 0;
  if (threadIdx.x == 0) {
    s_err = 0;
    s_union = s_misses = s_hits = 0;
  }
  __syncthreads();

  // Phase 1: lists against their lengths, duplicates, first appearances, resident map.
  const int* sel = d.positions + static_cast<size_t>(i) * outs;
  const int* slot_pos = a.SlotPos(row, d.layer);
  unsigned my_err = 0;
  for (int x = threadIdx.x; x < q * K; x += kThreads) {
    const int list = x / K, pos = sel[x];
    if (pos < kPadding || pos >= seq - q + list + 1) {
      my_err |= kResolveBadPosition;
    } else if (pos != kPadding) {
      if (InsertPair(t, list, pos)) my_err |= kResolveDuplicate;
      InsertFirst(t, pos, x);
    }
  }
  if (my_err) atomicOr(&s_err, my_err);
  for (int s = threadIdx.x; s < B; s += kThreads) {
    const int p = slot_pos[s];
    if (p != kEmptySlot) InsertResident(t, p, s);
  }
  __syncthreads();
  if (s_err) {
    PublishPadding(d, i, row, outs);
    if (threadIdx.x == 0 && d.error_flags) atomicOr(d.error_flags, s_err);
    return;
  }

  // Phase 2: classify first appearances.
  const int tail_first = seq - q;
  int my_union = 0, my_misses = 0, my_hits = 0;
  for (int x = threadIdx.x; x < q * K; x += kThreads) {
    const int pos = sel[x];
    int kind = kNone;
    if (pos != kPadding && FirstOf(t, pos) == x) {
      if (pos >= tail_first) {
        kind = kTailFirst;
        ++my_hits;
      } else {
        const int s = ResidentSlot(t, pos);
        ++my_union;
        if (s >= 0) {
          kind = kHitFirst;
          t.is_hit[s] = 1;
          ++my_hits;
        } else {
          kind = kMissFirst;
          ++my_misses;
        }
      }
    }
    t.kind[x] = kind;
  }
  atomicAdd(&s_union, my_union);
  atomicAdd(&s_misses, my_misses);
  atomicAdd(&s_hits, my_hits);
  __syncthreads();
  if (s_union > B) {  // rule 8c
    PublishPadding(d, i, row, outs);
    if (threadIdx.x == 0 && d.error_flags) atomicOr(d.error_flags, static_cast<unsigned>(kResolveUnionTooLarge));
    return;
  }
  const int M = s_misses, H = s_union - s_misses;

  // Phase 3: miss ranks in flat-index order; victims and the new LRU order from the LRU ranks.
  RankAll(
      q * K, tmp, [&](int x) { return t.kind[x] == kMissFirst ? 1 : 0; },
      [&](int x, int r, int f) {
        if (f) t.miss_rank[x] = r;
      });
  int* lru = a.Lru(row, d.layer);
  RankAll(
      B, tmp, [&](int x) { return t.is_hit[lru[x]] ? 0 : 1; },
      [&](int x, int r, int f) {
        const int s = lru[x];
        if (f) {
          if (r < M) t.victim[r] = s;
          t.new_lru[r >= M ? r - M : (B - H - M) + r] = s;
        } else {
          t.new_lru[(B - H) + (x - r)] = s;  // x - r: this hit slot's rank among hit slots
        }
      });
  __syncthreads();

  // Phase 4: tables, outputs, plan, counters, fetch.
  int* sp = a.SlotPos(row, d.layer);
  for (int x = threadIdx.x; x < B; x += kThreads) lru[x] = t.new_lru[x];
  int* out = d.out_slots + static_cast<size_t>(i) * outs;
  int2* plan =
      d.plan.summary ? reinterpret_cast<int2*>(d.plan.entries) + i * MissPlan::EntriesPerRow(a.geometry) : nullptr;
  for (int x = threadIdx.x; x < outs; x += kThreads) {
    const int pos = x < q * K ? sel[x] : kPadding;
    int o = kPadding;
    if (pos != kPadding) {
      if (pos >= tail_first) {
        o = B + (pos - tail_first);
      } else {
        const int f = FirstOf(t, pos);
        o = t.kind[f] == kHitFirst ? ResidentSlot(t, pos) : t.victim[t.miss_rank[f]];
      }
      if (x < q * K && t.kind[x] == kMissFirst) {
        sp[o] = pos;
        if (plan) plan[t.miss_rank[x]] = make_int2(pos, o);
      }
    }
    out[x] = o;
  }
  if (threadIdx.x == 0) {
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
  if (d.flags & kResolveFlagNoFetch) return;
  // Fetch: warp w copies the records of first-miss selections x = w, w + kWarps, ... (16-byte units).
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int units = static_cast<int>(a.geometry.record_bytes / 16);
  uint8_t* const* table = d.host.Table(a.geometry, row, d.layer);
  for (int x = warp; x < q * K; x += kWarps) {
    if (t.kind[x] != kMissFirst) continue;  // warp-uniform
    const int pos = sel[x];
    const int s = t.victim[t.miss_rank[x]];
    const int4* src = reinterpret_cast<const int4*>(d.host.RecordIn(table, pos, a.geometry.record_bytes));
    int4* dst = reinterpret_cast<int4*>(a.Record(row, d.layer, s));
    for (int u = lane; u < units; u += 32) dst[u] = src[u];
  }
}

}  // namespace

size_t MultiQueryWorkspaceBytes(const ArenaGeometry& g, int max_batch) {
  return static_cast<size_t>(max_batch > 0 ? max_batch : 0) * ComputeScratch(g).bytes;
}

cudaError_t LaunchMultiQueryResolve(const ResolveDesc& d, void* workspace, size_t workspace_bytes,
                                    cudaStream_t stream) {
  const size_t need = MultiQueryWorkspaceBytes(d.arena.geometry, d.max_batch);
  if (!workspace || workspace_bytes < need) {
    return FailLaunch("multi-query RESOLVE workspace too small: " + std::to_string(workspace_bytes) + " bytes, needs " +
                      std::to_string(need));
  }
  MultiQueryResolveKernel<<<d.max_batch, kThreads, 0, stream>>>(d, static_cast<uint8_t*>(workspace),
                                                                ComputeScratch(d.arena.geometry));
  return CheckLaunched();
}

}  // namespace internal
}  // namespace hisparse
