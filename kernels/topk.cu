// TOP-K (topk.h) on the GPU: one thread block a row, an exact radix select over ordered keys.
//
// How a row is selected. Its scores become 32-bit keys that order as the floats do (topk.h, rule
// 3), unselectable ones (-inf, NaN, past the row's length) key 0. The k-th largest key is found a
// byte at a time, most significant first: a pass counts, among the selectable keys that share the
// bytes found so far (the bucket), how many have each value of the next byte, and keeps the byte
// at which the count from the top reaches what is still wanted. After at most four passes the
// bucket is the keys equal to the k-th largest and `want` says how many of them to take; a pass
// whose bucket holds exactly what is wanted ends the search early (all of it is taken). Then one
// pass walks the row in position order and writes every selected position at its rank among the
// selected (a block-wide scan a tile): the list comes out ascending, ties go to the lower
// positions, and the bits equal the reference's (kernels/topk_reference.cc).
//
// What a row costs. Each pass reads the whole row (512 KB for 128k scores, mostly from L2, which
// the indexer has just written) until the bucket holds at most kCap keys; the pass that finds so
// copies them to shared memory, and the rest of the search reads only those. Scores within a few
// octaves share their leading byte, so that is typically passes 0-2 and the list's pass: four
// reads. Scores crowd into a few values of the leading bytes, so the counting is shaped against
// queues on one counter: each thread holds the counts of the two bytes it met last in registers
// (ByteCounts), and the shared counters come in 32 copies, one per lane, laid out so that a warp's
// 32 lanes always hit 32 different banks. Measured (bench/RESULTS.md, "A top-k of one block a
// row"): ~185 us a row on an H100 whatever the scores, ~11 GB/s of reads for the block, far below
// what one SM can stream; LoadTile's per-float4 bounds test, which lets each load issue only after
// the one before is used, is the likely cause, not yet measured.
//
// One block a row means a call of a few rows costs about what one row costs, which an engine that
// cuts a layer's rows into ranges, one top-k call each, needs (topk.h). Rows of one call run in
// parallel up to the SM count.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "hisparse/kernels/resolve_cuda.h"  // LastLaunchError
#include "hisparse/kernels/topk_cuda.h"

namespace hisparse {
namespace internal {
void SetLaunchError(const char* msg);
cudaError_t FailLaunch(const std::string& msg);
cudaError_t CheckLaunched();
}  // namespace internal

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kLoads = 4;             // float4 loads of a thread in one tile
constexpr int kSub = kThreads * 4;    // elements of one sub-tile (one float4 a thread)
constexpr int kTile = kSub * kLoads;  // elements of one tile
constexpr int kCap = 2048;            // bucket keys the search may keep in shared memory
constexpr unsigned kFull = 0xFFFFFFFFu;

struct Search {
  uint32_t prefix;  // the bucket: selectable keys k with (k & mask) == prefix
  uint32_t mask;
  uint32_t want;    // how many of the bucket's keys are still to be taken
  uint32_t bucket;  // how many keys the bucket holds
  int done;         // want == bucket: every key of the bucket is taken
};

struct Smem {
  uint32_t hist[256][32];  // [byte][lane]: a warp's lanes never share a bank
  uint32_t counts[256];
  uint32_t kept[kCap];  // the bucket's keys, once they fit
  uint32_t nkept;
  unsigned long long scan[2][kWarps];
  Search s;
};

__device__ __forceinline__ uint32_t KeyOf(float f) {
  const uint32_t key = TopkKey(__float_as_uint(f));
  return TopkSelectable(key) ? key : 0u;
}

// The keys of one tile: element (j, e) of this thread is base + j * kSub + 4 * threadIdx.x + e.
__device__ __forceinline__ void LoadTile(const float* x, int n, bool vec, int base, uint32_t key[kLoads][4]) {
#pragma unroll
  for (int j = 0; j < kLoads; ++j) {
    const int i = base + j * kSub + 4 * static_cast<int>(threadIdx.x);
    if (vec && i + 4 <= n) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(x + i));
      key[j][0] = KeyOf(v.x);
      key[j][1] = KeyOf(v.y);
      key[j][2] = KeyOf(v.z);
      key[j][3] = KeyOf(v.w);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) key[j][e] = i + e < n ? KeyOf(__ldg(x + i + e)) : 0u;
    }
  }
}

// Calls f(base, key) for every tile of the row in order, the next tile's loads issued before f
// runs on this one, so that two tiles' loads are in flight (a block's one SM reads the row).
template <typename F>
__device__ __forceinline__ void ForEachTile(const float* x, int n, bool vec, F&& f) {
  uint32_t key[kLoads][4], next[kLoads][4];
  if (n > 0) LoadTile(x, n, vec, 0, key);
  for (int base = 0; base < n; base += kTile) {
    if (base + kTile < n) LoadTile(x, n, vec, base + kTile, next);
    f(base, key);
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) key[j][e] = next[j][e];
    }
  }
}

// A thread's counts of the two bytes it met last, added to the shared counters only when a third
// byte displaces one (and at the end). Every increment of one counter is a read-modify-write that
// waits for the one before, so a byte that most keys share (the leading byte of scores within a
// few octaves, or an indexer's many zeros) would otherwise queue the block's whole row on 32
// counters.
struct ByteCounts {
  uint32_t d0 = 0xFFFFFFFFu, c0 = 0, d1 = 0xFFFFFFFFu, c1 = 0;
  __device__ __forceinline__ void Add(uint32_t d, uint32_t* row_of_lane) {
    if (d == d0) {
      ++c0;
    } else if (d == d1) {
      ++c1;
    } else {
      if (c1 != 0) atomicAdd(row_of_lane + 32 * d1, c1);
      d1 = d0;
      c1 = c0;
      d0 = d;
      c0 = 1;
    }
  }
  __device__ __forceinline__ void Flush(uint32_t* row_of_lane) const {
    if (c0 != 0) atomicAdd(row_of_lane + 32 * d0, c0);
    if (c1 != 0) atomicAdd(row_of_lane + 32 * d1, c1);
  }
};

// Counts the next byte (at `shift`) of the bucket's keys in the row; with `keep`, also copies the
// bucket's keys (at most kCap of them: the caller knows the bucket's size) to shared memory.
__device__ void CountRow(const float* x, int n, bool vec, const Search& s, int shift, bool keep, Smem& sm) {
  uint32_t* mine = &sm.hist[0][threadIdx.x & 31];  // byte b's counter of this lane: mine[32 * b]
  ByteCounts counts;
  ForEachTile(x, n, vec, [&](int, const uint32_t(&key)[kLoads][4]) {
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t k = key[j][e];
        if (k == 0u || (k & s.mask) != s.prefix) continue;
        counts.Add((k >> shift) & 0xFFu, mine);
        if (keep) sm.kept[atomicAdd(&sm.nkept, 1u)] = k;
      }
    }
  });
  counts.Flush(mine);
}

// The same over the keys kept in shared memory.
__device__ void CountKept(const Search& s, int shift, Smem& sm) {
  const int lane = threadIdx.x & 31;
  for (uint32_t i = threadIdx.x; i < sm.nkept; i += kThreads) {
    const uint32_t k = sm.kept[i];
    if ((k & s.mask) == s.prefix) atomicAdd(&sm.hist[(k >> shift) & 0xFFu][lane], 1u);
  }
}

// After a count: narrows the bucket to the byte at `shift` where the count from the top reaches
// `want` (pass 0: or ends the search with every selectable key when there are at most `want`).
// Every thread calls it; it returns with sm.s updated and visible.
__device__ void Choose(int shift, bool first, Smem& sm) {
  const int t = threadIdx.x;
  if (t < 256) {
    uint32_t c = 0;
#pragma unroll 8
    for (int l = 0; l < 32; ++l) c += sm.hist[t][(l + t) & 31];
    sm.counts[t] = c;
  }
  __syncthreads();
  if (t < 32) {
    uint32_t local[8];
    uint32_t sum = 0;
#pragma unroll
    for (int d = 0; d < 8; ++d) {
      local[d] = sm.counts[8 * t + d];
      sum += local[d];
    }
    uint32_t suffix = sum;  // this lane's bytes and every higher lane's
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const uint32_t o = __shfl_down_sync(kFull, suffix, off);
      if (t + off < 32) suffix += o;
    }
    const uint32_t total = __shfl_sync(kFull, suffix, 0);
    const uint32_t want = sm.s.want;
    __syncwarp();  // every lane has read sm.s before one of them writes it
    if (first && total <= want) {
      if (t == 0) sm.s.done = 1;  // prefix and mask stay 0: every selectable key is in the bucket
    } else {
      uint32_t above = suffix - sum;
      if (above < want && want <= suffix) {  // exactly one lane
        int d = 7;
        for (; d > 0 && above + local[d] < want; --d) above += local[d];
        sm.s.prefix |= static_cast<uint32_t>(8 * t + d) << shift;
        sm.s.mask |= 0xFFu << shift;
        sm.s.want = want - above;
        sm.s.bucket = local[d];
        sm.s.done = sm.s.want == sm.s.bucket;
      }
    }
  }
  __syncthreads();
}

// Exclusive block scan of two packed counters (four 16-bit fields each); also their totals.
__device__ __forceinline__ void BlockScan2(unsigned long long& a, unsigned long long& c, unsigned long long& ta,
                                           unsigned long long& tc, Smem& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned long long ia = a, ic = c;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const unsigned long long x = __shfl_up_sync(kFull, ia, off), y = __shfl_up_sync(kFull, ic, off);
    if (lane >= off) {
      ia += x;
      ic += y;
    }
  }
  if (lane == 31) {
    sm.scan[0][warp] = ia;
    sm.scan[1][warp] = ic;
  }
  __syncthreads();
  unsigned long long wa = 0, wc = 0;
  ta = tc = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const unsigned long long x = sm.scan[0][w], y = sm.scan[1][w];
    if (w < warp) {
      wa += x;
      wc += y;
    }
    ta += x;
    tc += y;
  }
  __syncthreads();  // the next tile's scan overwrites sm.scan
  a = wa + ia - a;
  c = wc + ic - c;
}

__device__ __forceinline__ uint32_t Field(unsigned long long v, int j) {
  return static_cast<uint32_t>(v >> (16 * j)) & 0xFFFFu;
}

// Writes the selected positions ascending, each at its rank: the keys above the bucket all, the
// bucket's first `want` (in position order). Returns how many it wrote.
__device__ uint32_t WriteSelected(const float* x, int n, bool vec, const Search& s, int32_t* out, Smem& sm) {
  uint32_t sure_before = 0, tie_before = 0;
  ForEachTile(x, n, vec, [&](int base, const uint32_t(&key)[kLoads][4]) {
    unsigned long long a = 0, c = 0;
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      uint32_t sure = 0, tie = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t k = key[j][e], m = k & s.mask;
        sure += k != 0u && m > s.prefix;
        tie += k != 0u && m == s.prefix;
      }
      a |= static_cast<unsigned long long>(sure) << (16 * j);
      c |= static_cast<unsigned long long>(tie) << (16 * j);
    }
    unsigned long long ta, tc;
    BlockScan2(a, c, ta, tc, sm);
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      uint32_t sa = sure_before + Field(a, j), tcount = tie_before + Field(c, j);
      for (int jj = 0; jj < j; ++jj) {
        sa += Field(ta, jj);
        tcount += Field(tc, jj);
      }
      const int i = base + j * kSub + 4 * static_cast<int>(threadIdx.x);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t k = key[j][e];
        if (k == 0u) continue;
        const uint32_t m = k & s.mask;
        if (m > s.prefix) {
          out[sa + min(tcount, s.want)] = i + e;
          ++sa;
        } else if (m == s.prefix) {
          if (tcount < s.want) out[sa + tcount] = i + e;
          ++tcount;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      sure_before += Field(ta, j);
      tie_before += Field(tc, j);
    }
  });
  return sure_before + min(tie_before, s.want);
}

__global__ void __launch_bounds__(kThreads) TopkKernel(TopkDesc d) {
  __shared__ Smem sm;
  const int row = blockIdx.x;
  int32_t* out = d.positions + static_cast<int64_t>(row) * d.k;
  const int active = d.batch_size ? max(0, min(*d.batch_size, d.rows)) : d.rows;
  uint32_t written = 0;
  if (row < active) {
    const int n = d.seq_lens ? max(0, min(d.seq_lens[row], d.cols)) : d.cols;
    const float* x = d.scores + static_cast<int64_t>(row) * d.ld;
    const bool vec = (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
    if (threadIdx.x == 0) {
      sm.s = Search{0u, 0u, static_cast<uint32_t>(d.k), 0u, 0};
      sm.nkept = 0;
    }
    bool kept = false;
    for (int pass = 0; pass < 4; ++pass) {
      for (int i = threadIdx.x; i < 256 * 32; i += kThreads) (&sm.hist[0][0])[i] = 0;
      __syncthreads();  // the counters zeroed, sm.s and sm.nkept set
      const Search s = sm.s;
      if (s.done) break;
      const int shift = 24 - 8 * pass;
      if (kept) {
        CountKept(s, shift, sm);
      } else {
        const bool keep = pass > 0 && s.bucket <= kCap;
        CountRow(x, n, vec, s, shift, keep, sm);
        kept = keep;
      }
      __syncthreads();
      Choose(shift, pass == 0, sm);
    }
    __syncthreads();
    const Search s = sm.s;
    written = WriteSelected(x, n, vec, s, out, sm);
  }
  for (uint32_t i = written + threadIdx.x; i < static_cast<uint32_t>(d.k); i += kThreads) out[i] = -1;
}

}  // namespace

cudaError_t LaunchTopk(const TopkDesc& d, cudaStream_t stream) {
  const std::string why = CheckTopkDesc(d);
  if (!why.empty()) return internal::FailLaunch("top-k: " + why);
  if (d.rows == 0) {
    internal::SetLaunchError("");
    return cudaSuccess;
  }
#ifndef HISPARSE_CUDA_EMULATION
  TopkKernel<<<d.rows, kThreads, 0, stream>>>(d);
#else  // tests/kernels/topk_emulated_test.cc: the device code on the host
  (void)stream;
  EmulateLaunch(d.rows, kThreads, [&] { TopkKernel(d); });
#endif
  return internal::CheckLaunched();
}

}  // namespace hisparse
