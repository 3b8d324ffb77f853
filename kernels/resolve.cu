// The CUDA RESOLVE kernel: one launch per (layer, decode step) for the whole batch.
//
// Design (one launch, no host round trip):
//   * Grid = min(max_batch, resident capacity) row blocks + helper blocks filling the rest of the
//     capacity (one per SM at most). Row block b plans batch entries b, b + row_blocks, ... alone:
//     it is the only block that reads or writes those rows' slot tables and LRU orders, so no
//     other block can see them half-written. Blocks without rows (padding, helpers) only fetch.
//   * Planning (per row, in shared memory): the k selected positions go into an open-addressing
//     hash table (position -> selection index), which also finds duplicates; one pass over the
//     slot table looks every resident position up (hits); a block-wide rank over the selections
//     numbers the misses in selection order; a block-wide rank over the LRU order numbers the
//     slots that hold no hit, which gives the victims (the i-th such slot takes the i-th miss) and
//     the new LRU order in closed form:
//         non-hit slot with rank r: r >= M ? r - M : (B - H - M) + r;   hit slot: (B - H) + its rank
//     (M misses, H hit slots). Outputs, slot_pos of the victims and the new LRU are written at once.
//   * Fetching is spread over the whole GPU: the planner cuts its misses into chunks of a few
//     records (~4 KB), keeps the first chunks for its own warps (no extra round trip) and publishes
//     the rest into a work queue in the workspace; every warp of the grid pulls chunks from the
//     queue and copies them with 16-byte non-coherent loads from mapped host memory and 16-byte
//     stores. The last planner to finish writes one END entry per warp of the grid, so every warp
//     waits only on its own queue entry and the queue drains exactly.
//   * The workspace resets itself: consumers clear the entries they take, the last block to
//     finish zeroes the counters. Graph replays need nothing in between.
//   * Forward progress: consumers wait for the last planner, so every block of the grid must be
//     able to be resident at once: the grid never exceeds the occupancy-derived capacity, row
//     blocks have the lowest indices and never wait before they have published. (A kernel that
//     holds SMs on another stream and itself waits on this one could still starve it.)
#include <cuda_runtime.h>

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
  if (g.record_bytes < kRecordAlign || g.record_bytes > kMaxRecordBytes ||
      g.record_bytes % kRecordAlign != 0) {
    std::snprintf(buf, n, "unsupported record_bytes: %u (a multiple of 16 in [16, 16384])",
                  g.record_bytes);
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
constexpr int kTileItems = 8;  // items per thread in one ranking tile
constexpr int kTile = kThreads * kTileItems;
constexpr int kMaxHelperBlocks = 1024;  // workspace is sized for up to this many helpers
constexpr int kChunkUnits = 32 * 8;     // 16-byte units one warp moves per round (4 KiB)
constexpr int kMaxChunkRecords = 32;    // a chunk's records are held one per lane
constexpr unsigned kEndTag = 0xffffffffu;  // lo word of an END entry; hi word = final tail

// Slot-table encoding of a selection during planning.
constexpr int kSelMiss = -2;  // miss before ranking; rank m is stored as -(m + 3)

struct WsHeader {
  unsigned long long pub;  // lo: queue entries reserved by planners, hi: rows published
  unsigned qhead;          // next queue entry a consumer takes
  unsigned pad[61];
};
static_assert(sizeof(WsHeader) == 256, "header is one 256-byte section");

struct ResolveParams {
  ResolveDesc d;
  WsHeader* hdr;
  int2* plan;                  // [max_batch][k] (position, slot) of miss m of batch entry i
  unsigned long long* queue;   // entries: lo = batch index + 1, hi = start << 6 | count; END
  int hash_bits;
  int chunk_records;
  int total_warps;
  int planner_blocks;          // blocks [0, planner_blocks) plan rows b, b + planner_blocks, ...
  // Shared-memory carve-up of a row block (byte offsets, 16-byte aligned).
  unsigned off_hit, off_tab_sp, off_tab_lru, off_sel_pos, off_sel_out, off_miss_slot,
      off_miss_pos, off_scratch, off_misc;
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

struct SmemLayout {
  unsigned off_hit, off_tab_sp, off_tab_lru, off_sel_pos, off_sel_out, off_miss_slot,
      off_miss_pos, off_scratch, off_misc, total;
};

// [hash table | new LRU] [hit flags] [slot_pos copy] [LRU copy] [selections] [outputs]
// [victim slots] [miss positions] [rank scratch] [misc]
SmemLayout ComputeSmem(const ArenaGeometry& g) {
  SmemLayout s{};
  const size_t hash = (size_t{1} << HashBits(g.k)) * 8;
  const size_t lru = static_cast<size_t>(g.slots) * 4;
  size_t o = AlignUp(hash > lru ? hash : lru, 16);
  auto take = [&](size_t bytes) {
    const size_t at = o;
    o = AlignUp(o + bytes, 16);
    return static_cast<unsigned>(at);
  };
  const size_t b4 = static_cast<size_t>(g.slots) * 4, k4 = static_cast<size_t>(g.k) * 4;
  s.off_hit = take(g.slots);
  s.off_tab_sp = take(b4);
  s.off_tab_lru = take(b4);
  s.off_sel_pos = take(k4);
  s.off_sel_out = take(k4);
  s.off_miss_slot = take(k4);
  s.off_miss_pos = take(k4);
  s.off_scratch = take((kTileItems * kWarps + 1) * 4);
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

__device__ __forceinline__ void StRelease(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
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
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0 &&
      (n & 3) == 0) {
    for (int v = threadIdx.x; v < n / 4; v += kThreads) CpAsync16(dst + 4 * v, src + 4 * v);
  } else {
    for (int e = threadIdx.x; e < n; e += kThreads) CpAsync4(dst + e, src + e);
  }
}

__device__ __forceinline__ unsigned HashOf(int p, int bits) {
  return (static_cast<unsigned>(p) * 2654435761u) >> (32 - bits);
}

// Exclusive rank of the set flags of one tile (item t of thread x is item t * kThreads + x),
// returns the tile's count. Three block barriers; scratch holds kTileItems * kWarps + 1 ints.
__device__ __forceinline__ int TileRank(const bool (&f)[kTileItems], int (&rank)[kTileItems],
                                        int* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned lt = (1u << lane) - 1u;
#pragma unroll
  for (int t = 0; t < kTileItems; ++t) {
    const unsigned m = __ballot_sync(~0u, f[t]);
    rank[t] = __popc(m & lt);
    if (lane == 0) scratch[t * kWarps + warp] = __popc(m);
  }
  __syncthreads();
  if (warp == 0) {
    constexpr int kN = kTileItems * kWarps;
    constexpr int kPer = (kN + 31) / 32;
    int v[kPer];
    int sum = 0;
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      const int idx = lane * kPer + q;
      v[q] = idx < kN ? scratch[idx] : 0;
      sum += v[q];
    }
    int incl = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(~0u, incl, o);
      if (lane >= o) incl += y;
    }
    int run = incl - sum;
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      const int idx = lane * kPer + q;
      if (idx < kN) scratch[idx] = run;
      run += v[q];
    }
    if (lane == 31) scratch[kN] = incl;
  }
  __syncthreads();
#pragma unroll
  for (int t = 0; t < kTileItems; ++t) rank[t] += scratch[t * kWarps + warp];
  const int total = scratch[kTileItems * kWarps];
  __syncthreads();
  return total;
}

// One warp copies `count` (<= 32) records: lane r < count holds record r's source and
// destination byte offsets. Units of 16 bytes are spread over the lanes across record borders.
// When the chunk's records are consecutive in the host pool (a run of positions), the lanes are
// shifted so that every warp-wide load covers a 512-byte window aligned to 128 bytes in host
// memory: fewer, fuller PCIe read requests for record sizes that are not multiples of 128.
template <int UPR, int U>
__device__ __forceinline__ void CopyChunk(const uint8_t* __restrict__ src_base,
                                          uint8_t* __restrict__ dst_base, long long src_off,
                                          long long dst_off, int count, int upr_rt) {
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

__device__ __forceinline__ void RowBases(const ResolveDesc& d, int row, const uint8_t** src,
                                         uint8_t** dst) {
  const ArenaView& a = d.arena;
  *src = d.host.layer_base[a.RowLayer(row, d.layer)];
  *dst = a.Record(row, d.layer, 0);
}

// Block-wide: one END entry per warp of the grid after the last published entry. An END carries
// the final tail, so the warp that takes the very last index can reset the queue header.
__device__ void WriteEnds(const ResolveParams& p, unsigned tail) {
  const unsigned long long end = kEndTag | (static_cast<unsigned long long>(tail) << 32);
  for (int w = threadIdx.x; w < p.total_warps; w += kThreads) StRelease(&p.queue[tail + w], end);
}

// Plans batch entry i (a row block), publishes its fetch work and copies its first chunks.
template <int UPR>
__device__ void PlanRow(const ResolveParams& p, int i, int batch, int row, int seq,
                        unsigned char* smem) {
  const ResolveDesc& d = p.d;
  const ArenaGeometry& g = d.arena.geometry;
  const int B = g.slots, K = g.k;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int H = 1 << p.hash_bits;
  const unsigned hmask = H - 1;

  int* keys = reinterpret_cast<int*>(smem);
  int* vals = keys + H;
  int* new_lru = reinterpret_cast<int*>(smem);  // reuses the hash table once lookups are done
  uint8_t* hit = smem + p.off_hit;
  int* tab_sp = reinterpret_cast<int*>(smem + p.off_tab_sp);
  int* tab_lru = reinterpret_cast<int*>(smem + p.off_tab_lru);
  int* sel_pos = reinterpret_cast<int*>(smem + p.off_sel_pos);
  int* sel_out = reinterpret_cast<int*>(smem + p.off_sel_out);
  int* miss_slot = reinterpret_cast<int*>(smem + p.off_miss_slot);
  int* miss_pos = reinterpret_cast<int*>(smem + p.off_miss_pos);
  int* scratch = reinterpret_cast<int*>(smem + p.off_scratch);
  int* misc = reinterpret_cast<int*>(smem + p.off_misc);  // 0 err, 1 hit slots, 2 newest, 4 queue base, 5 finisher, 6 tail

  __syncthreads();  // shared memory of the previous row of this block is free
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
  for (int h = tid; h < H; h += kThreads) keys[h] = -1;
  for (int s = tid; s < (B + 3) / 4; s += kThreads) reinterpret_cast<unsigned*>(hit)[s] = 0;
  if (tid < 16) misc[tid] = 0;
  if (err == 0 && (seq < 1 || seq > cap)) err = kResolveBadSeqLen;
  CpAsyncWaitAll();
  __syncthreads();

  int M = 0;
  if (err == 0) {
    const int newest = seq - 1;
    // 1. Selections into the hash table: range checks, duplicates, newest token.
    for (int j = tid; j < K; j += kThreads) {
      const int pj = sel_pos[j];
      int o = kPadding;
      if (pj == kPadding) {
      } else if (pj < -1 || pj >= seq) {
        atomicOr(reinterpret_cast<unsigned*>(&misc[0]), kResolveBadPosition);
      } else {
        unsigned h = HashOf(pj, p.hash_bits);
        for (;;) {
          const int old = atomicCAS(&keys[h], -1, pj);
          if (old == -1) {
            vals[h] = j;
            break;
          }
          if (old == pj) {
            atomicOr(reinterpret_cast<unsigned*>(&misc[0]), kResolveDuplicate);
            break;
          }
          h = (h + 1) & hmask;
        }
        if (pj == newest) {
          o = B;
          atomicAdd(&misc[2], 1);
        } else {
          o = kSelMiss;
        }
      }
      sel_out[j] = o;
    }
    __syncthreads();
    err = static_cast<uint32_t>(misc[0]);
  }

  if (err == 0) {
    const size_t rl = d.arena.RowLayer(row, d.layer);
    int* slot_pos = d.arena.slot_pos + rl * B;
    int* lru = d.arena.lru + rl * B;
    const int newest = seq - 1;

    // 2. Hits: every resident position looked up once.
    for (int s = tid; s < B; s += kThreads) {
      const int ps = tab_sp[s];
      if (ps >= 0 && ps != newest) {
        unsigned h = HashOf(ps, p.hash_bits);
        for (;;) {
          const int key = keys[h];
          if (key == ps) {
            sel_out[vals[h]] = s;
            hit[s] = 1;
            break;
          }
          if (key == -1) break;
          h = (h + 1) & hmask;
        }
      }
    }
    __syncthreads();

    // 3. Misses numbered in selection order; hit selections counted.
    int carry = 0;
    for (int base = 0; base < K; base += kTile) {
      bool f[kTileItems];
      int r[kTileItems];
      int hits = 0;
#pragma unroll
      for (int t = 0; t < kTileItems; ++t) {
        const int j = base + t * kThreads + tid;
        const int o = j < K ? sel_out[j] : kPadding;
        f[t] = o == kSelMiss;
        hits += (o >= 0 && o < B);
      }
      hits += __shfl_xor_sync(~0u, hits, 16);
      hits += __shfl_xor_sync(~0u, hits, 8);
      hits += __shfl_xor_sync(~0u, hits, 4);
      hits += __shfl_xor_sync(~0u, hits, 2);
      hits += __shfl_xor_sync(~0u, hits, 1);
      if (lane == 0 && hits) atomicAdd(&misc[1], hits);
      const int total = TileRank(f, r, scratch);
#pragma unroll
      for (int t = 0; t < kTileItems; ++t) {
        const int j = base + t * kThreads + tid;
        if (f[t]) sel_out[j] = -(carry + r[t] + 3);
      }
      carry += total;
    }
    M = carry;
    __syncthreads();
    const int hit_slots = misc[1];
    const int non_hit = B - hit_slots;

    // 4. Victims and the new LRU order from one ranking pass over the old order.
    int icarry = 0;
    for (int base = 0; base < B; base += kTile) {
      int lr[kTileItems];
#pragma unroll
      for (int t = 0; t < kTileItems; ++t) {
        const int idx = base + t * kThreads + tid;
        lr[t] = idx < B ? tab_lru[idx] : 0;
      }
      bool f[kTileItems];
      int r[kTileItems];
#pragma unroll
      for (int t = 0; t < kTileItems; ++t) {
        const int idx = base + t * kThreads + tid;
        f[t] = idx < B && !hit[lr[t]];
      }
      const int total = TileRank(f, r, scratch);
#pragma unroll
      for (int t = 0; t < kTileItems; ++t) {
        const int idx = base + t * kThreads + tid;
        if (idx < B) {
          const int s = lr[t];
          const int nr = icarry + r[t];
          int ni;
          if (f[t]) {
            ni = nr >= M ? nr - M : non_hit - M + nr;
            if (nr < M) miss_slot[nr] = s;
          } else {
            ni = non_hit + (idx - nr);
          }
          new_lru[ni] = s;
        }
      }
      icarry += total;
    }
    __syncthreads();

    // 5. Outputs, victims' slot_pos, the fetch plan, the new LRU order.
    int2* plan = p.plan + static_cast<size_t>(i) * K;
    for (int j = tid; j < K; j += kThreads) {
      int o = sel_out[j];
      if (o <= -3) {
        const int m = -o - 3;
        o = miss_slot[m];
        const int pos = sel_pos[j];
        slot_pos[o] = pos;
        miss_pos[m] = pos;
        plan[m] = make_int2(pos, o);
      }
      out[j] = o;
    }
    for (int idx = tid; idx < B; idx += kThreads) lru[idx] = new_lru[idx];
    if (tid == 0) {
      ArenaCounters* c = d.arena.counters;
      atomicAdd(reinterpret_cast<unsigned long long*>(&c->hits),
                static_cast<unsigned long long>(hit_slots + misc[2]));
      atomicAdd(reinterpret_cast<unsigned long long*>(&c->misses),
                static_cast<unsigned long long>(M));
      atomicAdd(reinterpret_cast<unsigned long long*>(&c->bytes_fetched),
                static_cast<unsigned long long>(M) * g.record_bytes);
      atomicAdd(reinterpret_cast<unsigned long long*>(&c->steps), 1ull);
    }
  } else {
    for (int j = tid; j < K; j += kThreads) out[j] = kPadding;
    if (tid == 0 && d.error_flags) atomicOr(d.error_flags, err);
    M = 0;
  }

  // 6. Publish: the first chunks stay with this block's warps, the rest go to the queue.
  const int rw = p.chunk_records;
  const int nch = (d.flags & kResolveFlagNoFetch) ? 0 : (M + rw - 1) / rw;
  const int ndirect = nch < kWarps ? nch : kWarps;
  const int nq = nch - ndirect;
  __syncthreads();
  if (nq > 0) {
    if (tid == 0) {
      misc[4] = static_cast<int>(static_cast<unsigned>(
          atomicAdd(&p.hdr->pub, static_cast<unsigned long long>(nq))));
    }
    __syncthreads();
    const unsigned qbase = static_cast<unsigned>(misc[4]);
    for (int c = tid; c < nq; c += kThreads) {
      const int start = (ndirect + c) * rw;
      const int cnt = M - start < rw ? M - start : rw;
      const unsigned long long e = static_cast<unsigned long long>(i + 1) |
                                   (static_cast<unsigned long long>(start << 6 | cnt) << 32);
      StRelease(&p.queue[qbase + c], e);
    }
    __syncthreads();
  }
  if (tid == 0) {
    __threadfence();
    const unsigned long long old = atomicAdd(&p.hdr->pub, 1ull << 32);
    misc[5] = static_cast<unsigned>(old >> 32) == static_cast<unsigned>(batch - 1);
    misc[6] = static_cast<int>(static_cast<unsigned>(old));
  }
  __syncthreads();
  if (misc[5]) WriteEnds(p, static_cast<unsigned>(misc[6]));

  // 7. This block's own chunks, straight from shared memory.
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
    CopyChunk<UPR, 4>(src, dst, so, dof, cnt, static_cast<int>(g.record_bytes / 16));
  }
}

// Every warp: take queue entries until its END.
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
          h == static_cast<unsigned>(e >> 32) + static_cast<unsigned>(p.total_warps) - 1u) {
        // The last index of this launch: every other take and publish is done. Reset the header.
        volatile WsHeader* hd = p.hdr;
        hd->pub = 0;
        hd->qhead = 0;
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
    CopyChunk<UPR, 8>(src, dst, so, dof, cnt, static_cast<int>(rb / 16));
  }
}

template <int UPR>
// One block per SM: the planner wants ~110 registers, and capping it at 64 (two blocks per SM)
// spills and measured slower.
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
  if (b < p.planner_blocks) {
    for (int i = b; i < batch; i += p.planner_blocks) {
      if (i != b) {
        row = p.d.rows[i];
        seq = p.d.seq_lens[i];
      }
      PlanRow<UPR>(p, i, batch, row, seq, smem);
    }
  }
  if (batch == 0 && b == 0) WriteEnds(p, 0u);
  Consume<UPR>(p);
}

// Grid: every block must be able to be resident at once (consumers wait for the last planner),
// so planners are capped at the device's capacity for this kernel and loop over rows; helpers
// fill what capacity is left, one per SM at most.
template <int UPR>
cudaError_t LaunchResolveT(ResolveParams p, int sms, unsigned smem, int optin,
                           cudaStream_t stream) {
  cudaError_t e = cudaFuncSetAttribute(ResolveKernel<UPR>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
  if (e != cudaSuccess) return e;
  int per_sm = 0;
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, ResolveKernel<UPR>, kThreads, smem);
  if (e != cudaSuccess) return e;
  if (per_sm < 1) return cudaErrorInvalidConfiguration;
  const int capacity = per_sm * sms;
  const int planners = p.d.max_batch < capacity ? p.d.max_batch : capacity;
  int helpers = capacity - planners;
  if (helpers > sms) helpers = sms;
  if (helpers > kMaxHelperBlocks) helpers = kMaxHelperBlocks;
  const int grid = planners + helpers;
  p.planner_blocks = planners;
  p.total_warps = grid * kWarps;
  ResolveKernel<UPR><<<grid, kThreads, smem, stream>>>(p);
  return cudaSuccess;
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

cudaError_t LaunchResolve(const ResolveDesc& d, void* workspace, size_t workspace_bytes,
                          cudaStream_t stream) {
  char buf[192];
  const ArenaGeometry& g = d.arena.geometry;
  if (const char* why = internal::CheckGeometry(g, buf, sizeof buf)) return internal::FailLaunch(why);
  // A layer outside [0, num_layers) is not rejected here: as in the reference, every active row
  // of the launch then reports kResolveBadRow on the device.
  if (d.max_batch < 0) return internal::FailLaunch("max_batch < 0");
  if (!d.batch_size || !d.rows || !d.seq_lens || !d.positions || !d.out_slots ||
      !d.host.layer_base || !d.host.capacity || !d.arena.slot_pos || !d.arena.lru ||
      !d.arena.records || !d.arena.counters) {
    return internal::FailLaunch("a RESOLVE descriptor pointer is null");
  }
  if (d.max_batch == 0) {
    internal::SetLaunchError("");
    return cudaSuccess;
  }
  const WsLayout ws = ComputeWsLayout(g, d.max_batch);
  if (!workspace || workspace_bytes < ws.total) {
    std::snprintf(buf, sizeof buf, "RESOLVE workspace too small: %zu bytes, needs %zu",
                  workspace_bytes, ws.total);
    return internal::FailLaunch(buf);
  }
  int dev = 0, sms = 0, optin = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess) {
    e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  }
  if (e != cudaSuccess) {
    internal::SetLaunchError(cudaGetErrorName(e));
    return e;
  }
  const SmemLayout sm = ComputeSmem(g);
  if (sm.total > static_cast<unsigned>(optin)) {
    std::snprintf(buf, sizeof buf,
                  "unsupported geometry: k=%d, B=%d needs %u bytes of shared memory per row "
                  "block, the device has %d",
                  g.k, g.slots, sm.total, optin);
    return internal::FailLaunch(buf);
  }
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
  p.off_scratch = sm.off_scratch;
  p.off_misc = sm.off_misc;

  switch (g.record_bytes) {
    case 656: e = LaunchResolveT<41>(p, sms, sm.total, optin, stream); break;
    case 1152: e = LaunchResolveT<72>(p, sms, sm.total, optin, stream); break;
    case 512: e = LaunchResolveT<32>(p, sms, sm.total, optin, stream); break;
    default: e = LaunchResolveT<0>(p, sms, sm.total, optin, stream); break;
  }
  if (e != cudaSuccess) {
    internal::SetLaunchError(cudaGetErrorName(e));
    return e;
  }
  return internal::CheckLaunched();
}

}  // namespace hisparse
