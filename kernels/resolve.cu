// The CUDA RESOLVE kernel: one launch per (layer, decode step) for the whole batch.
//
// Design (one launch, no host round trip):
//   * Grid = min(max_batch, resident capacity) row blocks + helper blocks filling the rest of the
//     capacity (one per SM at most). Row block b plans batch entries b, b + row_blocks, ... alone:
//     it is the only block that reads or writes those rows' slot tables and LRU orders, so no
//     other block can see them half-written. Blocks without rows (padding, helpers) only fetch.
//   * Planning (per row, in shared memory) is a short chain of block-wide steps, one barrier each,
//     because planning latency is the floor of every launch:
//       1. the k selected positions go into an open-addressing hash table of 64-bit entries
//          (position | selection index << 32, one atomicCAS), which also finds duplicates;
//       2. one pass over the slot table looks every resident position up (hits);
//       3. each warp owns one contiguous segment of the selections and one of the LRU order and
//          records, as 32-bit ballot masks, which selections miss and which slots hold no hit,
//          plus its segment's totals;
//       4. every warp sums the totals of the warps before it (a warp reduction, no scan barrier)
//          and ranks its items from the masks: misses numbered in selection order, and non-hit
//          slots numbered in LRU order, which gives the victims (the i-th non-hit slot takes the
//          i-th miss) and the new LRU order in closed form, written straight to global memory:
//            non-hit slot with rank r: r >= M ? r - M : (B - H - M) + r;  hit slot: (B - H) + its
//            rank among hit slots   (M misses, H hit slots = B - non-hit slots);
//       5. outputs, slot_pos of the victims and the fetch plan.
//   * Fetching is spread over the whole GPU: the planner cuts its misses into chunks of a few
//     records (~4 KB), keeps the first chunks for its own warps (no extra round trip) and publishes
//     the rest into a work queue in the workspace (one atomic reserves the entries and counts the
//     row as published); every warp of the grid pulls chunks from the queue and copies them with
//     16-byte non-coherent loads from mapped host memory and 16-byte stores. The warp that
//     publishes the last row writes one END entry for every other warp of the grid and takes
//     none itself, so every other warp waits only on its own queue entry and the queue drains
//     exactly.
//   * The workspace resets itself: consumers clear the entries they take, the last planner zeroes
//     the publish counter and the warp that takes the very last entry the take counter. Graph
//     replays need nothing in between.
//   * Forward progress: consumers wait for the last planner, so every block of the grid must be
//     able to be resident at once: the grid never exceeds the occupancy-derived capacity, row
//     blocks have the lowest indices and never wait before they have published. (A kernel that
//     holds SMs on another stream and itself waits on this one could still starve it.)
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>
#include <string>

#include "hisparse/kernels/resolve_cuda.h"

namespace hisparse {
namespace internal {

namespace {
thread_local std::string g_last_error;
}  // namespace

void SetLaunchError(const char* msg) { g_last_error = msg ? msg : ""; }

cudaError_t FailLaunch(const std::string& msg) {
  g_last_error = msg;
  return cudaErrorInvalidValue;
}

cudaError_t CheckLaunched() {
  const cudaError_t e = cudaGetLastError();
  g_last_error = e == cudaSuccess ? "" : cudaGetErrorName(e);
  return e;
}

// Host-side checks shared by every launcher: the contract's geometry and the record size.
const char* CheckGeometry(const ArenaGeometry& g, char* buf, size_t n) {
  if (g.record_bytes < kRecordAlign || g.record_bytes > kMaxRecordBytes || g.record_bytes % kRecordAlign != 0) {
    std::snprintf(buf, n, "unsupported record_bytes: %u (a multiple of 16 in [16, 16384])", g.record_bytes);
    return buf;
  }
  if (const char* why = ValidateArenaGeometry(g)) return why;
  return nullptr;
}

}  // namespace internal

const char* LastLaunchError() { return internal::g_last_error.c_str(); }

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
static_assert(kWarps <= 32, "segment totals are summed by one warp reduction");
constexpr int kIlp = 4;                    // hash inserts / lookups one thread keeps in flight
constexpr int kMaxHelperBlocks = 1024;     // workspace is sized for up to this many helpers
constexpr int kChunkUnits = 32 * 8;        // 16-byte units one warp moves per round (4 KiB)
constexpr int kMaxChunkRecords = 32;       // a chunk's records are held one per lane
constexpr unsigned kEndTag = 0xffffffffu;  // lo word of an END entry; hi word = final tail
// 16-byte loads one lane keeps in flight: consumers hold 8 (64 KiB per SM in flight), a
// planner's own chunks 4 (its warps go on to the queue afterwards).
constexpr int kConsumeUnroll = 8;
constexpr int kDirectUnroll = 4;

// Slot-table encoding of a selection during planning.
constexpr int kSelMiss = -2;  // miss before ranking; rank m is stored as -(m + 3)
// Hash table entry: position in the low word, selection index in the high word; all ones = empty
// (no valid entry has a negative position).
constexpr unsigned long long kEmptyEntry = ~0ull;

// pub and qhead sit in different 128-byte lines: ~2000 warps take queue indices (atomics on
// qhead) while planners publish (atomics on pub).
struct WsHeader {
  unsigned long long pub;  // lo: queue entries reserved by planners, hi: rows published
  unsigned pad0[30];
  unsigned qhead;  // next queue entry a consumer takes
  unsigned pad1[31];
};
static_assert(sizeof(WsHeader) == 256, "header is one 256-byte section");
static_assert(offsetof(WsHeader, qhead) == 128, "qhead has its own 128-byte line");

struct ResolveParams {
  ResolveDesc d;
  WsHeader* hdr;
  int2* plan;                 // [max_batch][k] (position, slot) of miss m of batch entry i
  unsigned long long* queue;  // entries: lo = batch index + 1, hi = start << 6 | count; END
  int hash_bits;
  int chunk_records;
  int end_count;       // END entries a launch writes: one per warp of the grid but one
  int planner_blocks;  // blocks [0, planner_blocks) plan rows b, b + planner_blocks, ...
  int seg_k, seg_b;    // selections / LRU entries per warp segment (multiples of 32)
  // Shared-memory carve-up of a row block (byte offsets, 16-byte aligned).
  unsigned off_hit, off_tab_sp, off_tab_lru, off_sel_pos, off_sel_out, off_miss_slot, off_miss_pos, off_masks, off_tot,
      off_misc;
};

struct WsLayout {
  size_t plan, queue, total;
  size_t queue_entries;
};

int ChunkRecords(uint32_t record_bytes) {
  const int upr = static_cast<int>(record_bytes / 16);
  int r = kChunkUnits / upr;
  if (r < 1) r = 1;
  if (r > kMaxChunkRecords) r = kMaxChunkRecords;
  return r;
}

WsLayout ComputeWsLayout(const ArenaGeometry& g, int max_batch) {
  WsLayout w{};
  const size_t mb = max_batch > 0 ? static_cast<size_t>(max_batch) : 0;
  const int rw = ChunkRecords(g.record_bytes);
  const size_t chunks_per_row = (static_cast<size_t>(g.k) + rw - 1) / rw;
  w.plan = sizeof(WsHeader);
  w.queue = AlignUp(w.plan + mb * g.k * sizeof(int2), 256);
  w.queue_entries = mb * chunks_per_row + (mb + kMaxHelperBlocks) * kWarps;
  w.total = AlignUp(w.queue + w.queue_entries * sizeof(unsigned long long), 256);
  return w;
}

int HashBits(int k) {
  int bits = 6;
  while ((1 << bits) < 2 * k) ++bits;
  return bits;
}

// Items per warp segment: n split over the warps, rounded up to whole ballots.
int SegmentItems(int n) {
  const int per = (n + kWarps - 1) / kWarps;
  return (per + 31) / 32 * 32;
}

struct SmemLayout {
  unsigned off_hit, off_tab_sp, off_tab_lru, off_sel_pos, off_sel_out, off_miss_slot, off_miss_pos, off_masks, off_tot,
      off_misc, total;
};

// [hash table] [hit flags] [slot_pos copy] [LRU copy] [selections] [outputs] [victim slots]
// [miss positions] [ballot masks] [segment totals] [misc]
SmemLayout ComputeSmem(const ArenaGeometry& g) {
  SmemLayout s{};
  size_t o = (size_t{1} << HashBits(g.k)) * 8;
  auto take = [&](size_t bytes) {
    const size_t at = o;
    o = AlignUp(o + bytes, 16);
    return static_cast<unsigned>(at);
  };
  const size_t b4 = static_cast<size_t>(g.slots) * 4, k4 = static_cast<size_t>(g.k) * 4;
  s.off_hit = take(g.slots);  // zeroed in 16-byte stores: take() rounds it up to 16
  s.off_tab_sp = take(b4);
  s.off_tab_lru = take(b4);
  s.off_sel_pos = take(k4);
  s.off_sel_out = take(k4);
  s.off_miss_slot = take(k4);
  s.off_miss_pos = take(k4);
  s.off_masks = take(static_cast<size_t>(kWarps) * (SegmentItems(g.k) + SegmentItems(g.slots)) / 8);
  s.off_tot = take(2 * kWarps * 4);
  s.off_misc = take(16 * 4);
  s.total = static_cast<unsigned>(o);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Device helpers.

__device__ __forceinline__ unsigned long long LdAcquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Queue entries are stored relaxed after one __threadfence() per storing warp (a release per
// entry would be a fence per store); consumers read them with ld.acquire.
__device__ __forceinline__ void StRelaxed(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// 16 bytes of a host record: read once, never written during the kernel.
__device__ __forceinline__ int4 LdHost(const uint8_t* p) {
  int4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(gmem) : "memory");
}
__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(a), "l"(gmem) : "memory");
}
__device__ __forceinline__ void CpAsyncWaitAll() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Block-wide asynchronous copy of n ints from global to shared memory (all loads in flight at
// once; completes at CpAsyncWaitAll).
__device__ __forceinline__ void StageInts(int* dst, const int* src, int n) {
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0 && (n & 3) == 0) {
    for (int v = threadIdx.x; v < n / 4; v += kThreads) CpAsync16(dst + 4 * v, src + 4 * v);
  } else {
    for (int e = threadIdx.x; e < n; e += kThreads) CpAsync4(dst + e, src + e);
  }
}

__device__ __forceinline__ unsigned HashOf(int p, int bits) {
  return (static_cast<unsigned>(p) * 2654435761u) >> (32 - bits);
}

// Ballot rounds of 32 items a warp segment [start, start + seg) of n items has.
__device__ __forceinline__ int SegmentRounds(int n, int start, int seg) {
  const int len = n - start < seg ? n - start : seg;
  return len > 0 ? (len + 31) / 32 : 0;
}

// One warp copies `count` (<= 32) records: lane r < count holds record r's source and
// destination byte offsets. Units of 16 bytes are spread over the lanes across record borders.
// When the chunk's records are consecutive in the host pool (a run of positions), the lanes are
// shifted so that every warp-wide load covers a 512-byte window aligned to 128 bytes in host
// memory: fewer, fuller PCIe read requests for record sizes that are not multiples of 128.
template <int UPR, int U>
__device__ __forceinline__ void CopyChunk(const uint8_t* __restrict__ src_base, uint8_t* __restrict__ dst_base,
                                          long long src_off, long long dst_off, int count, int upr_rt) {
  const int upr = UPR ? UPR : upr_rt;
  const int lane = threadIdx.x & 31;
  const int n = count * upr;
  int lead = 0;
  {
    const long long next = __shfl_down_sync(~0u, src_off, 1);
    const bool run = lane + 1 >= count || next == src_off + upr * 16;
    if (__all_sync(~0u, run)) {
      const long long s0 = __shfl_sync(~0u, src_off, 0);
      lead = static_cast<int>((reinterpret_cast<uintptr_t>(src_base + s0) & 127) >> 4);
    }
  }
  for (int base = -lead; base < n; base += 32 * U) {
    int4 v[U];
#pragma unroll
    for (int t = 0; t < U; ++t) {
      const int u = base + t * 32 + lane;
      int rec = static_cast<int>(static_cast<unsigned>(u < 0 ? 0 : u) / static_cast<unsigned>(upr));
      if (rec >= count) rec = count - 1;
      const long long so = __shfl_sync(~0u, src_off, rec);
      if (u >= 0 && u < n) v[t] = LdHost(src_base + so + (u - rec * upr) * 16);
    }
#pragma unroll
    for (int t = 0; t < U; ++t) {
      const int u = base + t * 32 + lane;
      int rec = static_cast<int>(static_cast<unsigned>(u < 0 ? 0 : u) / static_cast<unsigned>(upr));
      if (rec >= count) rec = count - 1;
      const long long dof = __shfl_sync(~0u, dst_off, rec);
      if (u >= 0 && u < n) *reinterpret_cast<int4*>(dst_base + dof + (u - rec * upr) * 16) = v[t];
    }
  }
}

__device__ __forceinline__ void RowBases(const ResolveDesc& d, int row, const uint8_t** src, uint8_t** dst) {
  const ArenaView& a = d.arena;
  *src = d.host.layer_base[a.RowLayer(row, d.layer)];
  *dst = a.Record(row, d.layer, 0);
}

// One warp: an END entry for every other warp of the grid after the last published entry. An
// END carries the final tail, so the warp that takes the very last index can reset qhead. ENDs
// publish no data, so they are plain relaxed stores.
__device__ __forceinline__ void WriteEnds(const ResolveParams& p, unsigned tail) {
  const unsigned long long end = kEndTag | (static_cast<unsigned long long>(tail) << 32);
  for (int w = threadIdx.x & 31; w < p.end_count; w += 32) StRelaxed(&p.queue[tail + w], end);
}

// Plans batch entry i (a row block), publishes its fetch work and copies its first chunks.
// Returns true in warp 0 of the block that published the launch's last row: that warp wrote the
// END entries and must not take one.
template <int UPR>
__device__ bool PlanRow(const ResolveParams& p, int i, int batch, int row, int seq, bool first, unsigned char* smem) {
  const ResolveDesc& d = p.d;
  const ArenaGeometry& g = d.arena.geometry;
  const int B = g.slots, K = g.k;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int bits = p.hash_bits;
  const int H = 1 << bits;
  const unsigned hmask = H - 1;
  const unsigned lt = (1u << lane) - 1u;

  unsigned long long* table = reinterpret_cast<unsigned long long*>(smem);
  uint8_t* hit = smem + p.off_hit;
  int* tab_sp = reinterpret_cast<int*>(smem + p.off_tab_sp);
  int* tab_lru = reinterpret_cast<int*>(smem + p.off_tab_lru);
  int* sel_pos = reinterpret_cast<int*>(smem + p.off_sel_pos);
  int* sel_out = reinterpret_cast<int*>(smem + p.off_sel_out);
  int* miss_slot = reinterpret_cast<int*>(smem + p.off_miss_slot);
  int* miss_pos = reinterpret_cast<int*>(smem + p.off_miss_pos);
  const int rounds_k = p.seg_k / 32, rounds_b = p.seg_b / 32;
  unsigned* mask_k = reinterpret_cast<unsigned*>(smem + p.off_masks);  // [kWarps][rounds_k]
  unsigned* mask_b = mask_k + kWarps * rounds_k;                       // [kWarps][rounds_b]
  int* tot = reinterpret_cast<int*>(smem + p.off_tot);                 // misses per selection segment, then
                                                                       // non-hit slots per LRU segment
  int* misc = reinterpret_cast<int*>(smem + p.off_misc);               // 0 err, 1 newest selected

  if (!first) __syncthreads();  // shared memory of the previous row of this block is free
  // Everything the plan reads is staged into shared memory with all loads in flight at once:
  // the selections first (they need no row), then the row's slot table and LRU order.
  const int* positions = d.positions + static_cast<size_t>(i) * K;
  int* out = d.out_slots + static_cast<size_t>(i) * K;
  StageInts(sel_pos, positions, K);
  uint32_t err = 0;
  int cap = 0;
  if (d.layer < 0 || d.layer >= g.num_layers || row < 0 || row >= g.max_rows) {
    err = kResolveBadRow;
  } else {
    cap = d.host.capacity[row];
    const size_t rl = d.arena.RowLayer(row, d.layer);
    StageInts(tab_sp, d.arena.slot_pos + rl * B, B);
    StageInts(tab_lru, d.arena.lru + rl * B, B);
  }
  {
    uint4* t4 = reinterpret_cast<uint4*>(table);
    const uint4 ones = make_uint4(~0u, ~0u, ~0u, ~0u);
    for (int h = tid; h < H / 2; h += kThreads) t4[h] = ones;
    uint4* h4 = reinterpret_cast<uint4*>(hit);
    for (int s = tid; s < (B + 15) / 16; s += kThreads) h4[s] = make_uint4(0, 0, 0, 0);
  }
  if (tid < 16) misc[tid] = 0;
  if (err == 0 && (seq < 1 || seq > cap)) err = kResolveBadSeqLen;
  CpAsyncWaitAll();
  __syncthreads();

  const int newest = seq - 1;
  if (err == 0) {
    // 1. Selections into the hash table: range checks, duplicates, newest token. kIlp inserts
    //    per thread are issued before any result is looked at (shared-memory atomics are slow
    //    one at a time); collisions are resolved afterwards by linear probing.
    for (int base = 0; base < K; base += kIlp * kThreads) {
      int pj[kIlp];
      unsigned h[kIlp];
      unsigned long long old[kIlp];
#pragma unroll
      for (int t = 0; t < kIlp; ++t) {
        const int j = base + t * kThreads + tid;
        pj[t] = j < K ? sel_pos[j] : kPadding;
      }
#pragma unroll
      for (int t = 0; t < kIlp; ++t) {
        const int j = base + t * kThreads + tid;
        old[t] = kEmptyEntry;
        h[t] = HashOf(pj[t], bits);
        if (pj[t] >= 0 && pj[t] < seq) {
          const unsigned long long e = static_cast<unsigned>(pj[t]) | (static_cast<unsigned long long>(j) << 32);
          old[t] = atomicCAS(&table[h[t]], kEmptyEntry, e);
        }
        if (j < K) {
          int o = kPadding;
          if (pj[t] == kPadding) {
          } else if (pj[t] < -1 || pj[t] >= seq) {
            atomicOr(reinterpret_cast<unsigned*>(&misc[0]), kResolveBadPosition);
          } else if (pj[t] == newest) {
            o = B;
            atomicAdd(&misc[1], 1);
          } else {
            o = kSelMiss;
          }
          sel_out[j] = o;
        }
      }
#pragma unroll
      for (int t = 0; t < kIlp; ++t) {
        while (old[t] != kEmptyEntry) {
          if (static_cast<int>(static_cast<unsigned>(old[t])) == pj[t]) {
            atomicOr(reinterpret_cast<unsigned*>(&misc[0]), kResolveDuplicate);
            break;
          }
          h[t] = (h[t] + 1) & hmask;
          const int j = base + t * kThreads + tid;
          old[t] = atomicCAS(&table[h[t]], kEmptyEntry,
                             static_cast<unsigned>(pj[t]) | (static_cast<unsigned long long>(j) << 32));
        }
      }
    }
    __syncthreads();
    err = static_cast<uint32_t>(misc[0]);
  }

  int M = 0;
  if (err == 0) {
    const size_t rl = d.arena.RowLayer(row, d.layer);
    int* slot_pos = d.arena.slot_pos + rl * B;
    int* lru = d.arena.lru + rl * B;

    // 2. Hits: every resident position looked up once (kIlp lookups in flight per thread). The
    //    newest token never hits a regular slot.
    for (int base = 0; base < B; base += kIlp * kThreads) {
      int ps[kIlp];
      unsigned h[kIlp];
      unsigned long long e[kIlp];
#pragma unroll
      for (int t = 0; t < kIlp; ++t) {
        const int s = base + t * kThreads + tid;
        ps[t] = s < B ? tab_sp[s] : kEmptySlot;
        if (ps[t] == newest) ps[t] = kEmptySlot;
      }
#pragma unroll
      for (int t = 0; t < kIlp; ++t) {
        h[t] = HashOf(ps[t], bits);
        e[t] = ps[t] >= 0 ? table[h[t]] : kEmptyEntry;
      }
#pragma unroll
      for (int t = 0; t < kIlp; ++t) {
        while (e[t] != kEmptyEntry) {
          if (static_cast<int>(static_cast<unsigned>(e[t])) == ps[t]) {
            const int s = base + t * kThreads + tid;
            sel_out[static_cast<int>(e[t] >> 32)] = s;
            hit[s] = 1;
            break;
          }
          h[t] = (h[t] + 1) & hmask;
          e[t] = table[h[t]];
        }
      }
    }
    __syncthreads();

    // 3. Per warp segment: ballot masks of the missing selections and of the LRU entries whose
    //    slot holds no hit, and the segment totals.
    const int k0 = warp * p.seg_k, b0 = warp * p.seg_b;
    const int nrk = SegmentRounds(K, k0, p.seg_k), nrb = SegmentRounds(B, b0, p.seg_b);
    {
      int ck = 0, cb = 0;
#pragma unroll 4
      for (int r = 0; r < nrk; ++r) {
        const int j = k0 + r * 32 + lane;
        const unsigned m = __ballot_sync(~0u, j < K && sel_out[j] == kSelMiss);
        if (lane == 0) mask_k[warp * rounds_k + r] = m;
        ck += __popc(m);
      }
#pragma unroll 4
      for (int r = 0; r < nrb; ++r) {
        const int idx = b0 + r * 32 + lane;
        const unsigned m = __ballot_sync(~0u, idx < B && !hit[tab_lru[idx]]);
        if (lane == 0) mask_b[warp * rounds_b + r] = m;
        cb += __popc(m);
      }
      if (lane == 0) {
        tot[warp] = ck;
        tot[kWarps + warp] = cb;
      }
    }
    __syncthreads();

    // 4. Ranks. Every warp sums the totals itself (a redundant 16-entry reduction beats another
    //    barrier): M misses, NH non-hit slots, and the counts before its own segments.
    const int tk = lane < kWarps ? tot[lane] : 0;
    const int tb = lane < kWarps ? tot[kWarps + lane] : 0;
    M = __reduce_add_sync(~0u, tk);
    const int NH = __reduce_add_sync(~0u, tb);
    int run_k = __reduce_add_sync(~0u, lane < warp ? tk : 0);
    int run_b = __reduce_add_sync(~0u, lane < warp ? tb : 0);
    for (int r = 0; r < nrk; ++r) {
      const unsigned m = mask_k[warp * rounds_k + r];
      if ((m >> lane) & 1u) {
        const int j = k0 + r * 32 + lane;
        const int mi = run_k + __popc(m & lt);
        sel_out[j] = -(mi + 3);
        miss_pos[mi] = sel_pos[j];
      }
      run_k += __popc(m);
    }
    // Victims and the new LRU order (written straight to the arena: the old order is staged).
#pragma unroll 4
    for (int r = 0; r < nrb; ++r) {
      const int idx = b0 + r * 32 + lane;
      const unsigned m = mask_b[warp * rounds_b + r];
      if (idx < B) {
        const int s = tab_lru[idx];
        const int nr = run_b + __popc(m & lt);  // non-hit slots before idx in the old order
        int ni;
        if ((m >> lane) & 1u) {
          if (nr < M) {
            miss_slot[nr] = s;
            ni = NH - M + nr;
          } else {
            ni = nr - M;
          }
        } else {
          ni = NH + (idx - nr);
        }
        lru[ni] = s;
      }
      run_b += __popc(m);
    }
    __syncthreads();

    // 5. Outputs, victims' slot_pos, the fetch plan of the misses that go through the queue.
    const int rw = p.chunk_records;
    const bool fetch = !(d.flags & kResolveFlagNoFetch);
    const int plan_from = fetch && (M + rw - 1) / rw > kWarps ? kWarps * rw : K;
    int2* plan = p.plan + static_cast<size_t>(i) * K;
    // The miss plan for layers that share this selection (ReplayDesc), when asked for.
    int2* miss_plan = d.plan.summary ? reinterpret_cast<int2*>(d.plan.entries) + static_cast<size_t>(i) * K : nullptr;
    for (int j = tid; j < K; j += kThreads) {
      int o = sel_out[j];
      if (o <= -3) {
        const int m = -o - 3;
        o = miss_slot[m];
        const int pos = miss_pos[m];
        slot_pos[o] = pos;
        if (m >= plan_from) plan[m] = make_int2(pos, o);
        if (miss_plan) miss_plan[m] = make_int2(pos, o);
      }
      out[j] = o;
    }
    if (tid == 0) {
      if (d.plan.summary) {
        int* sum = d.plan.summary + static_cast<size_t>(i) * 3;
        sum[0] = row;
        sum[1] = M;
        sum[2] = B - NH + misc[1];
      }
      ArenaCounters* c = d.arena.counters;
      atomicAdd(reinterpret_cast<unsigned long long*>(&c->hits), static_cast<unsigned long long>(B - NH + misc[1]));
      atomicAdd(reinterpret_cast<unsigned long long*>(&c->misses), static_cast<unsigned long long>(M));
      atomicAdd(reinterpret_cast<unsigned long long*>(&c->bytes_fetched),
                static_cast<unsigned long long>(M) * g.record_bytes);
      atomicAdd(reinterpret_cast<unsigned long long*>(&c->steps), 1ull);
    }
  } else {
    for (int j = tid; j < K; j += kThreads) out[j] = kPadding;
    if (tid == 0 && d.error_flags) atomicOr(d.error_flags, err);
    if (tid == 0 && d.plan.summary) {
      int* sum = d.plan.summary + static_cast<size_t>(i) * 3;
      sum[0] = row;
      sum[1] = -1;
      sum[2] = 0;
    }
  }

  // 6. Publish: the first chunks stay with this block's warps, the rest go to the queue. One
  //    atomic reserves the queue entries and counts the row as published; the entries are
  //    written after it (a consumer that takes one of them waits for it, and the END entries
  //    lie past every reservation, so the order does not matter).
  const int rw = p.chunk_records;
  const int nch = (d.flags & kResolveFlagNoFetch) ? 0 : (M + rw - 1) / rw;
  const int ndirect = nch < kWarps ? nch : kWarps;
  const int nq = nch - ndirect;
  if (nq > 0) __syncthreads();  // every thread's plan entries are written
  bool wrote_ends = false;
  if (warp == 0) {
    unsigned long long old = 0;
    if (lane == 0) {
      old = atomicAdd(&p.hdr->pub, (1ull << 32) | static_cast<unsigned long long>(nq));
      // The launch's last row: no planner touches pub again, so the finisher resets it here
      // (after its own atomic in program order). END entries then order nothing and need no
      // fence: the fence would wait for all of this warp's table and output stores.
      if (static_cast<unsigned>(old >> 32) == static_cast<unsigned>(batch - 1)) {
        *reinterpret_cast<volatile unsigned long long*>(&p.hdr->pub) = 0;
      }
    }
    old = __shfl_sync(~0u, old, 0);
    const unsigned qbase = static_cast<unsigned>(old);
    wrote_ends = static_cast<unsigned>(old >> 32) == static_cast<unsigned>(batch - 1);
    if (nq > 0) {
      // Orders the block's plan writes (through the barrier above) before the entries:
      // consumers read them with ld.acquire.
      __threadfence();
      for (int c = lane; c < nq; c += 32) {
        const int start = (ndirect + c) * rw;
        const int cnt = M - start < rw ? M - start : rw;
        const unsigned long long e =
            static_cast<unsigned long long>(i + 1) | (static_cast<unsigned long long>(start << 6 | cnt) << 32);
        StRelaxed(&p.queue[qbase + c], e);
      }
    }
    if (wrote_ends) WriteEnds(p, qbase + static_cast<unsigned>(nq));
  }

  // 7. This block's own chunks, straight from shared memory (written before the last barrier).
  if (warp < ndirect) {
    const int start = warp * rw;
    const int cnt = M - start < rw ? M - start : rw;
    long long so = 0, dof = 0;
    if (lane < cnt) {
      so = static_cast<long long>(miss_pos[start + lane]) * g.record_bytes;
      dof = static_cast<long long>(miss_slot[start + lane]) * g.record_bytes;
    }
    const uint8_t* src;
    uint8_t* dst;
    RowBases(d, row, &src, &dst);
    CopyChunk<UPR, kDirectUnroll>(src, dst, so, dof, cnt, static_cast<int>(g.record_bytes / 16));
  }
  return wrote_ends;
}

// Every warp but the one that wrote the ENDs: take queue entries until its END.
template <int UPR>
__device__ void Consume(const ResolveParams& p) {
  const ResolveDesc& d = p.d;
  const int lane = threadIdx.x & 31;
  const int K = d.arena.geometry.k;
  const uint32_t rb = d.arena.geometry.record_bytes;
  for (;;) {
    unsigned long long e = 0;
    if (lane == 0) {
      const unsigned h = atomicAdd(&p.hdr->qhead, 1u);
      unsigned long long* q = &p.queue[h];
      unsigned ns = 32;
      while ((e = LdAcquire(q)) == 0) {
        __nanosleep(ns);
        if (ns < 256) ns <<= 1;
      }
      *reinterpret_cast<volatile unsigned long long*>(q) = 0;
      if (static_cast<unsigned>(e) == kEndTag &&
          h == static_cast<unsigned>(e >> 32) + static_cast<unsigned>(p.end_count) - 1u) {
        // The last index of this launch: every other take is done (it returned a smaller
        // index). Reset the take counter (the last planner reset pub).
        *reinterpret_cast<volatile unsigned*>(&p.hdr->qhead) = 0;
      }
    }
    __syncwarp();
    e = __shfl_sync(~0u, e, 0);
    if (static_cast<unsigned>(e) == kEndTag) break;
    const int i = static_cast<int>(e & 0xffffffffu) - 1;
    const unsigned hi = static_cast<unsigned>(e >> 32);
    const int start = static_cast<int>(hi >> 6);
    const int cnt = static_cast<int>(hi & 63);
    const int row = __ldg(d.rows + i);
    long long so = 0, dof = 0;
    if (lane < cnt) {
      const int2 pe = __ldcg(p.plan + static_cast<size_t>(i) * K + start + lane);
      so = static_cast<long long>(pe.x) * rb;
      dof = static_cast<long long>(pe.y) * rb;
    }
    const uint8_t* src;
    uint8_t* dst;
    RowBases(d, row, &src, &dst);
    CopyChunk<UPR, kConsumeUnroll>(src, dst, so, dof, cnt, static_cast<int>(rb / 16));
  }
}

template <int UPR>
// One block per SM (shared memory allows no more at k = 2048 anyway; registers stay unbounded).
__global__ void __launch_bounds__(kThreads, 1) ResolveKernel(const ResolveParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int b = blockIdx.x;
  // A row block's first row and seq_len are loaded together with the batch size (b < max_batch,
  // so the loads are in bounds whatever the batch).
  int row = 0, seq = 0;
  if (b < p.planner_blocks) {
    row = p.d.rows[b];
    seq = p.d.seq_lens[b];
  }
  int batch = *p.d.batch_size;
  if (batch < 0) batch = 0;
  if (batch > p.d.max_batch) batch = p.d.max_batch;
  bool wrote_ends = false;  // warp-uniform
  if (b == 0 && threadIdx.x == 0 && p.d.plan.summary) *p.d.plan.batch = batch;
  if (b < p.planner_blocks) {
    for (int i = b; i < batch; i += p.planner_blocks) {
      if (i != b) {
        row = p.d.rows[i];
        seq = p.d.seq_lens[i];
      }
      wrote_ends |= PlanRow<UPR>(p, i, batch, row, seq, i == b, smem);
    }
  }
  if (batch == 0 && b == 0 && threadIdx.x < 32) {
    WriteEnds(p, 0u);
    wrote_ends = true;
  }
  if (!wrote_ends) Consume<UPR>(p);
}

// The RESOLVE kernel for a record size (its 16-byte units per record, 0: any size).
using ResolveKernelFn = void (*)(const ResolveParams);
ResolveKernelFn ResolveKernelFor(uint32_t record_bytes) {
  switch (record_bytes) {
    case 656:
      return ResolveKernel<41>;
    case 1152:
      return ResolveKernel<72>;
    case 512:
      return ResolveKernel<32>;
    default:
      return ResolveKernel<0>;
  }
}

bool PreparedFor(const ResolveLaunchConfig& c, int device, const ArenaGeometry& g) {
  return c.device >= 0 && c.device == device && c.k == g.k && c.slots == g.slots && c.record_bytes == g.record_bytes;
}

// Grid: every block must be able to be resident at once (consumers wait for the last planner),
// so planners are capped at the device's capacity for this kernel and loop over rows; helpers
// fill what capacity is left, one per SM at most.
void LaunchResolveGrid(ResolveParams p, const ResolveLaunchConfig& c, cudaStream_t stream) {
  const int sms = c.sms;
  const int capacity = c.blocks_per_sm * sms;
  const int planners = p.d.max_batch < capacity ? p.d.max_batch : capacity;
  int helpers = capacity - planners;
  if (helpers > sms) helpers = sms;
  if (helpers > kMaxHelperBlocks) helpers = kMaxHelperBlocks;
  const int grid = planners + helpers;
  p.planner_blocks = planners;
  p.end_count = grid * kWarps - 1;
  ResolveKernelFor(p.d.arena.geometry.record_bytes)<<<grid, kThreads, c.smem, stream>>>(p);
}

// ---------------------------------------------------------------------------------------------
// Replay of a miss plan into a layer that shares the anchor's selection (ReplayDesc). No planning.
// A replay runs beside the engine's compute on a side stream, so it must leave the SMs to that
// compute: a small persistent grid (ReplayDesc::blocks, an eighth of the SMs by default) walks every
// batch entry, its blocks splitting each entry's table copy and miss chunks. Chunks are copied
// like RESOLVE's (CopyChunk); 16 blocks of 8 warps keep ~0.5 MB of 16-byte loads in flight, which
// covers the link's bandwidth-delay product many times over.
constexpr int kReplayThreads = 256;
constexpr int kReplayWarps = kReplayThreads / 32;

template <int UPR>
__global__ void __launch_bounds__(kReplayThreads) ReplayKernel(const ReplayDesc d, int chunk_records) {
  int batch = *d.plan.batch;
  if (batch > d.max_batch) batch = d.max_batch;
  const ArenaView& a = d.arena;
  const ArenaGeometry& g = a.geometry;
  const int B = g.slots;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rw = chunk_records;
  const uint32_t rb = g.record_bytes;
  for (int i = 0; i < batch; ++i) {  // block-uniform
    const int* sum = d.plan.summary + static_cast<size_t>(i) * 3;
    const int row = sum[0], misses = sum[1];
    if (misses < 0) continue;  // the anchor rejected this entry and left its state alone
    // The anchor's tables right after its RESOLVE are this layer's tables after the step.
    const int* ssp = a.SlotPos(row, d.anchor_layer);
    const int* slru = a.Lru(row, d.anchor_layer);
    int* dsp = a.SlotPos(row, d.layer);
    int* dlru = a.Lru(row, d.layer);
    for (int x = blockIdx.x * kReplayThreads + tid; x < B; x += gridDim.x * kReplayThreads) {
      dsp[x] = __ldg(ssp + x);
      dlru[x] = __ldg(slru + x);
    }
    const int nch = (misses + rw - 1) / rw;
    const int2* e = reinterpret_cast<const int2*>(d.plan.entries) + static_cast<size_t>(i) * g.k;
    const uint8_t* src = d.host.layer_base[a.RowLayer(row, d.layer)];
    uint8_t* dst = a.Record(row, d.layer, 0);
    for (int c = blockIdx.x * kReplayWarps + warp; c < nch; c += gridDim.x * kReplayWarps) {  // warp-uniform
      const int start = c * rw;
      const int cnt = misses - start < rw ? misses - start : rw;
      long long so = 0, dof = 0;
      if (lane < cnt) {
        const int2 pe = __ldg(e + start + lane);
        so = static_cast<long long>(pe.x) * rb;
        dof = static_cast<long long>(pe.y) * rb;
      }
      CopyChunk<UPR, kConsumeUnroll>(src, dst, so, dof, cnt, static_cast<int>(rb / 16));
    }
    if (blockIdx.x == 0 && tid == 0) {
      ArenaCounters* c = a.counters;
      atomicAdd(reinterpret_cast<unsigned long long*>(&c->hits), static_cast<unsigned long long>(sum[2]));
      atomicAdd(reinterpret_cast<unsigned long long*>(&c->misses), static_cast<unsigned long long>(misses));
      atomicAdd(reinterpret_cast<unsigned long long*>(&c->bytes_fetched), static_cast<unsigned long long>(misses) * rb);
      atomicAdd(reinterpret_cast<unsigned long long*>(&c->steps), 1ull);
    }
  }
}

using ReplayKernelFn = void (*)(const ReplayDesc, int);
ReplayKernelFn ReplayKernelFor(uint32_t record_bytes) {
  switch (record_bytes) {
    case 656:
      return ReplayKernel<41>;
    case 1152:
      return ReplayKernel<72>;
    case 512:
      return ReplayKernel<32>;
    default:
      return ReplayKernel<0>;
  }
}

}  // namespace

size_t ResolveWorkspaceBytes(const ArenaGeometry& g, int max_batch) {
  if (g.k < 1 || g.record_bytes < 16 || max_batch < 0) return 0;
  return ComputeWsLayout(g, max_batch).total;
}

cudaError_t InitResolveWorkspace(void* workspace, size_t bytes, cudaStream_t stream) {
  internal::SetLaunchError("");
  const cudaError_t e = cudaMemsetAsync(workspace, 0, bytes, stream);
  if (e != cudaSuccess) internal::SetLaunchError(cudaGetErrorName(e));
  return e;
}

cudaError_t PrepareResolveLaunch(const ArenaGeometry& g, ResolveLaunchConfig* config) {
  char buf[192];
  if (config == nullptr) return internal::FailLaunch("PrepareResolveLaunch: config is null");
  if (const char* why = internal::CheckGeometry(g, buf, sizeof buf)) return internal::FailLaunch(why);
  ResolveLaunchConfig c;
  c.k = g.k;
  c.slots = g.slots;
  c.record_bytes = g.record_bytes;
  cudaError_t e = cudaGetDevice(&c.device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, c.device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&c.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, c.device);
  if (e != cudaSuccess) {
    internal::SetLaunchError(cudaGetErrorName(e));
    return e;
  }
  const SmemLayout sm = ComputeSmem(g);
  if (sm.total > static_cast<unsigned>(c.smem_optin)) {
    std::snprintf(buf, sizeof buf,
                  "unsupported geometry: k=%d, B=%d needs %u bytes of shared memory per row "
                  "block, the device has %d",
                  g.k, g.slots, sm.total, c.smem_optin);
    return internal::FailLaunch(buf);
  }
  c.smem = sm.total;
  const ResolveKernelFn kernel = ResolveKernelFor(g.record_bytes);
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, c.smem_optin);
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c.blocks_per_sm, kernel, kThreads, c.smem);
  if (e == cudaSuccess && c.blocks_per_sm < 1) e = cudaErrorInvalidConfiguration;
  if (e != cudaSuccess) {
    internal::SetLaunchError(cudaGetErrorName(e));
    return e;
  }
  *config = c;
  internal::SetLaunchError("");
  return cudaSuccess;
}

cudaError_t LaunchResolve(const ResolveDesc& d, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  return LaunchResolve(d, workspace, workspace_bytes, ResolveLaunchConfig{}, stream);
}

cudaError_t LaunchResolve(const ResolveDesc& d, void* workspace, size_t workspace_bytes,
                          const ResolveLaunchConfig& config, cudaStream_t stream) {
  char buf[192];
  const ArenaGeometry& g = d.arena.geometry;
  if (const char* why = internal::CheckGeometry(g, buf, sizeof buf)) return internal::FailLaunch(why);
  // A layer outside [0, num_layers) is not rejected here: as in the reference, every active row
  // of the launch then reports kResolveBadRow on the device.
  if (d.max_batch < 0) return internal::FailLaunch("max_batch < 0");
  if (!d.batch_size || !d.rows || !d.seq_lens || !d.positions || !d.out_slots || !d.host.layer_base ||
      !d.host.capacity || !d.arena.slot_pos || !d.arena.lru || !d.arena.records || !d.arena.counters) {
    return internal::FailLaunch("a RESOLVE descriptor pointer is null");
  }
  if (d.plan.summary && (!d.plan.batch || !d.plan.entries || d.plan.max_batch < d.max_batch)) {
    return internal::FailLaunch("the miss plan is incomplete or smaller than max_batch");
  }
  if (d.max_batch == 0) {
    internal::SetLaunchError("");
    return cudaSuccess;
  }
  const WsLayout ws = ComputeWsLayout(g, d.max_batch);
  if (!workspace || workspace_bytes < ws.total) {
    std::snprintf(buf, sizeof buf, "RESOLVE workspace too small: %zu bytes, needs %zu", workspace_bytes, ws.total);
    return internal::FailLaunch(buf);
  }
  // The device's figures: the session's, or asked for now (no config, another device or geometry).
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) {
    internal::SetLaunchError(cudaGetErrorName(e));
    return e;
  }
  ResolveLaunchConfig asked;
  const ResolveLaunchConfig* c = &config;
  if (!PreparedFor(config, dev, g)) {
    if ((e = PrepareResolveLaunch(g, &asked)) != cudaSuccess) return e;
    c = &asked;
  }
  const SmemLayout sm = ComputeSmem(g);
  ResolveParams p{};
  p.d = d;
  uint8_t* base = static_cast<uint8_t*>(workspace);
  p.hdr = reinterpret_cast<WsHeader*>(base);
  p.plan = reinterpret_cast<int2*>(base + ws.plan);
  p.queue = reinterpret_cast<unsigned long long*>(base + ws.queue);
  p.hash_bits = HashBits(g.k);
  p.chunk_records = ChunkRecords(g.record_bytes);
  p.off_hit = sm.off_hit;
  p.off_tab_sp = sm.off_tab_sp;
  p.off_tab_lru = sm.off_tab_lru;
  p.off_sel_pos = sm.off_sel_pos;
  p.off_sel_out = sm.off_sel_out;
  p.off_miss_slot = sm.off_miss_slot;
  p.off_miss_pos = sm.off_miss_pos;
  p.off_masks = sm.off_masks;
  p.off_tot = sm.off_tot;
  p.off_misc = sm.off_misc;
  p.seg_k = SegmentItems(g.k);
  p.seg_b = SegmentItems(g.slots);

  LaunchResolveGrid(p, *c, stream);
  return internal::CheckLaunched();
}

cudaError_t LaunchReplay(const ReplayDesc& d, cudaStream_t stream) {
  return LaunchReplay(d, ResolveLaunchConfig{}, stream);
}

cudaError_t LaunchReplay(const ReplayDesc& d, const ResolveLaunchConfig& config, cudaStream_t stream) {
  char buf[192];
  const ArenaGeometry& g = d.arena.geometry;
  if (const char* why = internal::CheckGeometry(g, buf, sizeof buf)) return internal::FailLaunch(why);
  if (d.layer < 0 || d.layer >= g.num_layers || d.anchor_layer < 0 || d.anchor_layer >= g.num_layers ||
      d.layer == d.anchor_layer) {
    std::snprintf(buf, sizeof buf, "replay: layer %d of anchor %d (layers must differ and lie in [0, %d))", d.layer,
                  d.anchor_layer, g.num_layers);
    return internal::FailLaunch(buf);
  }
  if (d.max_batch < 0 || d.max_batch > d.plan.max_batch) {
    return internal::FailLaunch("replay: max_batch outside [0, the plan's max_batch]");
  }
  if (!d.plan.batch || !d.plan.summary || !d.plan.entries || !d.host.layer_base || !d.arena.slot_pos || !d.arena.lru ||
      !d.arena.records || !d.arena.counters) {
    return internal::FailLaunch("a replay descriptor pointer is null");
  }
  if (d.max_batch == 0) {
    internal::SetLaunchError("");
    return cudaSuccess;
  }
  int dev = 0, sms = config.sms;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess && (config.device < 0 || config.device != dev)) {
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  }
  if (e != cudaSuccess) {
    internal::SetLaunchError(cudaGetErrorName(e));
    return e;
  }
  const int rw = ChunkRecords(g.record_bytes);
  int blocks = d.blocks > 0 ? d.blocks : sms / 8;
  if (blocks < 1) blocks = 1;
  if (blocks > sms) blocks = sms;
  ReplayKernelFor(g.record_bytes)<<<blocks, kReplayThreads, 0, stream>>>(d, rw);
  return internal::CheckLaunched();
}

}  // namespace hisparse
