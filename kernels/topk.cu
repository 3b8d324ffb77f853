// TOP-K (topk.h) on the GPU: a cluster of thread blocks a row, an exact radix select over ordered
// keys.
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
// A row among the blocks of a cluster. One block a row (the first version) cost ~185 us a row on an
// H100 whatever the row count (bench/RESULTS.md, "A top-k of one block a row"): one SM did all of a
// row's counting. So the row is cut into `blocks` contiguous shares, one a block of a thread-block
// cluster (sm_90), and the launcher gives a call of few rows up to 8 blocks a row, as many as keep
// the call's clusters resident at once (TopkBlocksPerRow). Each pass, every block counts its share,
// the cluster barrier publishes the counts, and every block adds all blocks' counts from their
// shared memory (distributed shared memory) in rank order, so every block chooses the same byte
// without a broadcast; counts alternate between two buffers by pass, so a block that runs ahead
// never overwrites what a slower one is still adding. The counts also give each block, for free,
// how many of its keys lie above the final bucket (`sure`) and in it (`tie`); once the search ends,
// the lower ranks' sums say where a block's positions start in the row's list and how many of the
// bucket's ties the lower positions took, so each block writes its share's positions on its own.
//
// What a row costs. Each pass reads the block's share (from L2, which the indexer has just
// written) until the block's part of the bucket holds at most kCap keys; the pass that finds so
// copies them to shared memory, and the rest of the search reads only those. Scores within a few
// octaves share their leading byte, so pass 0 alone rarely narrows the bucket that far: a serving
// run's indexer scores (positive, nine in ten within [2, 8)) leave it nine tenths of the row
// (bench/RESULTS.md, "How the serving scores' bytes crowd"). So pass 0 also counts the next byte
// of the keys whose leading byte is the block's guess (CountFirst); when the cluster's guesses were
// right, pass 0 chooses two bytes and pass 1, another read and count of the row, is skipped. That
// saved 1.5-6.4 us a call on normal scores (bench/RESULTS.md, "A two-byte pass 0, the second count
// on 32 copies"). On the serving scores it saved 5.7-11.7 us (7-29 rows) once the guess was the
// byte where the row's k-th largest key likely lies rather than the first tile's largest byte,
// which a few hundred scores one byte above the rest made wrong in every block (bench/RESULTS.md,
// "The top-k's guess, and the append beside the indexer").
//
// A whole tile's float4 loads go out back to back, and the next tile's before this one is counted.
// A row that starts between 16-byte boundaries (an engine's rows are as wide as its longest
// context) is read from the boundary before it, the few scores ahead of it unselectable, so it
// gets the same loads: 1.1-4.2 us a call less on a serving run's 133,125-wide rows than scalar
// loads took (bench/RESULTS.md, "The top-k on rows between 16-byte boundaries").
//
// Scores crowd into a few values of the leading bytes, so the counting is shaped against queues
// on one counter: each thread holds the counts of the two bytes it met last in registers
// (ByteCounts), and the shared counters come in 32 copies, one per lane, laid out so that a warp's
// 32 lanes always hit 32 different banks. Measured on an H100, k 2048 of 131,136 scores
// (bench/RESULTS.md, "A top-k of a cluster a row"): 33.4 us a call for one row at 8 blocks a row,
// 52 us for 29 rows at 4; torch.topk 54 and 92.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>

#include "hisparse/kernels/resolve_cuda.h"  // LastLaunchError
#include "hisparse/kernels/topk_cuda.h"
#include "launch_status.h"

namespace hisparse {
namespace {

namespace cg = cooperative_groups;

// A block's shared variable. tests/kernels/cuda_emulation defines its own: a host build has no
// per-block storage of its own.
#ifndef HS_BLOCK_SHARED
#define HS_BLOCK_SHARED(type, name) __shared__ type name
#endif

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kLoads = 4;             // float4 loads of a thread in one tile
constexpr int kSub = kThreads * 4;    // elements of one sub-tile (one float4 a thread)
constexpr int kTile = kSub * kLoads;  // elements of one tile
constexpr int kCap = 2048;            // bucket keys a block may keep in shared memory
constexpr unsigned kFull = 0xFFFFFFFFu;

struct Search {
  uint32_t prefix;  // the bucket: selectable keys k with (k & mask) == prefix
  uint32_t mask;
  uint32_t want;    // how many of the bucket's keys are still to be taken
  uint32_t bucket;  // how many keys the bucket holds
  int done;         // want == bucket: every key of the bucket is taken
};

// A block's shared memory. The blocks of a row's cluster read one another's `counts`, `guess` and
// `part` (distributed shared memory); everything else is the block's own.
struct Smem {
  uint32_t hist[256][32];  // [byte][lane]: a warp's lanes never share a bank
  // This block's counts of a round, [round & 1], and pass 0's second ones, [2]: the cluster sums
  // them.
  uint32_t counts[3][256];
  uint32_t total[256];  // the cluster's counts of the pass
  union {
    uint32_t kept[kCap];    // this block's share of the bucket's keys, once it fits
    uint32_t lead[256][8];  // pass 0: the leading byte's counts, [byte][lane & 7] (hist: the next byte's)
  };
  uint32_t guess;   // pass 0: the leading byte where the row's k-th largest key likely lies (CountFirst)
  uint32_t at_top;  // pass 0: the keys of the first tile's largest leading byte in that tile
  int two;          // pass 0 chose two bytes (SecondCountIsTheBuckets)
  uint32_t nkept;
  uint32_t sure, tie;          // this block's keys above the bucket, and in it
  uint32_t part[2];            // `sure` and `tie` once the search ends, for the cluster to read
  uint32_t before[2], all[2];  // the sums of `part` over the lower ranks, and over the cluster
  unsigned long long scan[2][kWarps];
  Search s;
};

__device__ __forceinline__ uint32_t KeyOf(float f) {
  const uint32_t key = TopkKey(__float_as_uint(f));
  return TopkSelectable(key) ? key : 0u;
}

__device__ __forceinline__ void KeysOf(const float4 (&v)[kLoads], uint32_t (&key)[kLoads][4]) {
#pragma unroll
  for (int j = 0; j < kLoads; ++j) {
    key[j][0] = KeyOf(v[j].x);
    key[j][1] = KeyOf(v[j].y);
    key[j][2] = KeyOf(v[j].z);
    key[j][3] = KeyOf(v[j].w);
  }
}

// The scores of one tile, -inf outside the row's [lo, end): element (j, e) of this thread is
// base + j * kSub + 4 * threadIdx.x + e. x is 16-byte aligned (TopkKernel starts it at the boundary
// at or before the row's first score, lo scores before it), so a whole tile inside the row is kLoads
// float4 loads with no test between them, all of them in flight at once.
__device__ __forceinline__ void LoadTile(const float* x, int lo, int end, int base, float4 (&v)[kLoads]) {
  const int t4 = 4 * static_cast<int>(threadIdx.x);
  if (base >= lo && base + kTile <= end) {
#pragma unroll
    for (int j = 0; j < kLoads; ++j) v[j] = __ldg(reinterpret_cast<const float4*>(x + base + j * kSub + t4));
    return;
  }
#pragma unroll
  for (int j = 0; j < kLoads; ++j) {
    const int i = base + j * kSub + t4;
    if (i >= lo && i + 4 <= end) {
      v[j] = __ldg(reinterpret_cast<const float4*>(x + i));
    } else {  // the row's first or last few scores
      v[j].x = i >= lo && i < end ? __ldg(x + i) : -INFINITY;
      v[j].y = i + 1 >= lo && i + 1 < end ? __ldg(x + i + 1) : -INFINITY;
      v[j].z = i + 2 >= lo && i + 2 < end ? __ldg(x + i + 2) : -INFINITY;
      v[j].w = i + 3 >= lo && i + 3 < end ? __ldg(x + i + 3) : -INFINITY;
    }
  }
}

// Calls f(base, key) for every tile of [begin, end) in order. The next tile's loads are issued
// before this tile's scores become keys, so that two tiles' loads are in flight while f counts.
template <typename F>
__device__ __forceinline__ void ForEachTile(const float* x, int lo, int begin, int end, F&& f) {
  float4 cur[kLoads], next[kLoads];
  if (begin < end) LoadTile(x, lo, end, begin, cur);
  for (int base = begin; base < end; base += kTile) {
    if (base + kTile < end) LoadTile(x, lo, end, base + kTile, next);
    uint32_t key[kLoads][4];
    KeysOf(cur, key);
    f(base, key);
#pragma unroll
    for (int j = 0; j < kLoads; ++j) cur[j] = next[j];
  }
}

// A thread's counts of the two bytes it met last, added to the shared counters only when a third
// byte displaces one (and at the end). Every increment of one counter is a read-modify-write that
// waits for the one before, so a byte that most keys share (the leading byte of scores within a
// few octaves, or an indexer's many zeros) would otherwise queue the block's whole row on 32
// counters.
// `kStride`: the counters' copies a byte.
template <int kStride = 32>
struct ByteCounts {
  uint32_t d0 = 0xFFFFFFFFu, c0 = 0, d1 = 0xFFFFFFFFu, c1 = 0;
  __device__ __forceinline__ void Add(uint32_t d, uint32_t* row_of_lane) {
    if (d == d0) {
      ++c0;
    } else if (d == d1) {
      ++c1;
    } else {
      if (c1 != 0) atomicAdd(row_of_lane + kStride * d1, c1);
      d1 = d0;
      c1 = c0;
      d0 = d;
      c0 = 1;
    }
  }
  __device__ __forceinline__ void Flush(uint32_t* row_of_lane) const {
    if (c0 != 0) atomicAdd(row_of_lane + kStride * d0, c0);
    if (c1 != 0) atomicAdd(row_of_lane + kStride * d1, c1);
  }
};

// Counts the next byte (at `shift`) of the bucket's keys in [begin, end); with `keep`, also copies
// them (at most kCap: the caller knows this block's share of the bucket) to shared memory.
__device__ void CountRow(const float* x, int lo, int begin, int end, const Search& s, int shift, bool keep, Smem& sm) {
  uint32_t* mine = &sm.hist[0][threadIdx.x & 31];  // byte b's counter of this lane: mine[32 * b]
  ByteCounts<> counts;
  ForEachTile(x, lo, begin, end, [&](int, const uint32_t(&key)[kLoads][4]) {
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

// Pass 0, whose bucket is every selectable key: counts the leading byte of the keys in [begin, end)
// (sm.lead), and, of those whose leading byte is the block's guess, the next byte (sm.hist). A
// serving run's indexer scores (positive, nine in ten of one leading byte) leave pass 0's bucket
// almost the whole row; where every block guessed its byte, the second count is what pass 1 would
// count, and pass 1's read of the row is saved (SecondCountIsTheBuckets). The second count spreads
// over 256 bytes, so it gets the 32 copies a byte; the leading bytes crowd into a few, which
// ByteCounts' registers absorb, so 8 copies do for them.
//
// The guess is where the row's k-th largest key most likely lies, judged from the block's first
// tile, which should hold about `expect` keys above it (k times the tile's share of the row): the
// leading byte of the tile's largest key when the tile holds at least `expect` keys of that byte,
// else the byte below. The largest key alone guessed wrong on the serving scores: a few hundred of
// a row's 131,000 lie one byte above the rest (at 8 and more, where the k-th largest is ~6), so
// most first tiles held one of them, and pass 1 was never skipped there.
__device__ void CountFirst(const float* x, int lo, int begin, int end, uint32_t expect, Smem& sm) {
  uint32_t* lead = &sm.lead[0][threadIdx.x & 7];     // leading byte b's counter of this lane: lead[8 * b]
  uint32_t* second = &sm.hist[0][threadIdx.x & 31];  // next byte b's: second[32 * b]
  float4 cur[kLoads], next[kLoads];
  uint32_t key[kLoads][4];
  if (begin < end) {
    LoadTile(x, lo, end, begin, cur);
    KeysOf(cur, key);
    uint32_t top = 0;  // an unselectable key is 0
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) top = max(top, key[j][e] >> 24);
    }
    atomicMax(&sm.guess, top);
    if (begin + kTile < end) LoadTile(x, lo, end, begin + kTile, next);  // in flight across the barrier
  }
  __syncthreads();
  const uint32_t top = sm.guess;
  if (begin < end && top != 0u) {  // the tile's keys of its largest leading byte, one atomic a warp
    uint32_t at_top = 0;
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) at_top += key[j][e] >> 24 == top ? 1u : 0u;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) at_top += __shfl_down_sync(kFull, at_top, off);
    if ((threadIdx.x & 31) == 0 && at_top != 0) atomicAdd(&sm.at_top, at_top);
  }
  __syncthreads();
  // Every thread reads the same count; thread 0 publishes the guess for the cluster, which reads it
  // only after a cluster barrier.
  const uint32_t guess = top <= 1u || sm.at_top >= expect ? top : top - 1u;
  if (threadIdx.x == 0) sm.guess = guess;
  ByteCounts<8> counts;
  for (int base = begin; base < end; base += kTile) {
    if (base != begin) {
      if (base + kTile < end) LoadTile(x, lo, end, base + kTile, next);
      KeysOf(cur, key);
    }
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t k = key[j][e];
        if (k == 0u) continue;
        counts.Add(k >> 24, lead);
        if (k >> 24 == guess) atomicAdd(second + 32 * ((k >> 16) & 0xFFu), 1u);
      }
    }
#pragma unroll
    for (int j = 0; j < kLoads; ++j) cur[j] = next[j];
  }
  counts.Flush(lead);
}

// The same over the keys kept in shared memory.
__device__ void CountKept(const Search& s, int shift, Smem& sm) {
  const int lane = threadIdx.x & 31;
  for (uint32_t i = threadIdx.x; i < sm.nkept; i += kThreads) {
    const uint32_t k = sm.kept[i];
    if ((k & s.mask) == s.prefix) atomicAdd(&sm.hist[(k >> shift) & 0xFFu][lane], 1u);
  }
}

// This block's counts of a pass, its lanes' copies added, where the cluster can read them.
template <int kCopies>
__device__ void Tally(const uint32_t (&hist)[256][kCopies], uint32_t* counts) {
  const int t = threadIdx.x;
  if (t < 256) {
    uint32_t c = 0;
#pragma unroll 8
    for (int l = 0; l < kCopies; ++l) c += hist[t][(l + t) & (kCopies - 1)];
    counts[t] = c;
  }
}

// The cluster's counts sm.counts[which]: every block's Tally summed, in rank order; with
// `guessed`, only those of the blocks whose guess is `guessed` (the others' second counts are of
// another byte). Called after a cluster barrier; every block computes the same sums, so every
// block chooses the same byte.
__device__ void SumCluster(const cg::cluster_group& cluster, int which, Smem& sm, uint32_t guessed = 256u) {
  const int t = threadIdx.x;
  if (t < 256) {
    uint32_t c = 0;
    const int blocks = static_cast<int>(cluster.num_blocks());
    for (int r = 0; r < blocks; ++r) {
      if (guessed == 256u || *cluster.map_shared_rank(&sm.guess, r) == guessed) {
        c += cluster.map_shared_rank(sm.counts[which], r)[t];
      }
    }
    sm.total[t] = c;
  }
  __syncthreads();
}

// After a pass: narrows the bucket to the byte at `shift` where the cluster's count from the top
// reaches `want` (pass 0: or ends the search with every selectable key when there are at most
// `want`), and this block's `sure` and `tie` with it (its counts: sm.counts[which]). Every thread
// calls it; it returns with sm.s updated and visible.
__device__ void Choose(int shift, bool first, int which, Smem& sm) {
  const int t = threadIdx.x;
  if (t < 32) {
    uint32_t local[8];
    uint32_t sum = 0;
#pragma unroll
    for (int d = 0; d < 8; ++d) {
      local[d] = sm.total[8 * t + d];
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
    const bool all = first && total <= want;
    if (all) {
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
    __syncwarp();  // the chosen byte written before every lane reads it
    const uint32_t chosen = all ? 256u : (sm.s.prefix >> shift) & 0xFFu;
    uint32_t sure = 0, tie = 0;  // this block's keys of the pass above the chosen byte, and at it
#pragma unroll
    for (int d = 0; d < 8; ++d) {
      const uint32_t byte = 8 * t + d, c = sm.counts[which][byte];
      if (all || byte == chosen) {
        tie += c;
      } else if (byte > chosen) {
        sure += c;
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      sure += __shfl_down_sync(kFull, sure, off);
      tie += __shfl_down_sync(kFull, tie, off);
    }
    if (t == 0) {
      sm.sure += sure;
      sm.tie = tie;
    }
  }
  __syncthreads();
}

// After pass 0's Choose: whether the cluster's second counts (CountFirst) are pass 1's, so that
// they choose the next byte without a read of the row. They are when the search goes on and every
// block guessed the chosen leading byte or holds no key with it; such a block's second counts, of
// another byte, are then zeroed here, and the cluster's sum leaves them out. Every block reads the
// same values (the cluster's pass-0 counts and guesses, unchanged until round 2), so every block
// decides alike.
__device__ bool SecondCountIsTheBuckets(const cg::cluster_group& cluster, Smem& sm) {
  const uint32_t chosen = sm.s.prefix >> 24;
  if (threadIdx.x == 0) {
    bool ok = !sm.s.done;
    const int blocks = static_cast<int>(cluster.num_blocks());
    for (int r = 0; r < blocks && ok; ++r) {
      ok = *cluster.map_shared_rank(&sm.guess, r) == chosen || cluster.map_shared_rank(sm.counts[0], r)[chosen] == 0;
    }
    sm.two = ok;
  }
  __syncthreads();
  if (sm.two == 0) return false;
  if (sm.guess != chosen && threadIdx.x < 256) sm.counts[2][threadIdx.x] = 0;  // it holds none at `chosen`
  __syncthreads();
  return true;
}

// Where this block's positions go in the row's list: the other blocks' `sure` and `tie` once the
// search ends, summed over the lower ranks (`before`) and over the cluster (`all`).
__device__ void PlaceBlock(const cg::cluster_group& cluster, Smem& sm) {
  if (threadIdx.x == 0) {
    sm.part[0] = sm.sure;
    sm.part[1] = sm.tie;
  }
  cluster.sync();
  if (threadIdx.x == 0) {
    const int rank = static_cast<int>(cluster.block_rank()), blocks = static_cast<int>(cluster.num_blocks());
    uint32_t before[2] = {0, 0}, all[2] = {0, 0};
    for (int r = 0; r < blocks; ++r) {
      const uint32_t* part = cluster.map_shared_rank(sm.part, r);
      for (int i = 0; i < 2; ++i) {
        all[i] += part[i];
        if (r < rank) before[i] += part[i];
      }
    }
    for (int i = 0; i < 2; ++i) {
      sm.before[i] = before[i];
      sm.all[i] = all[i];
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

// Writes this block's selected positions of [begin, end), each at its rank in the row's list: the
// keys above the bucket all, the bucket's first `want` in the row's position order. The lower ranks'
// blocks hold the lower positions, so their counts (PlaceBlock) start this block's.
__device__ void WriteSelected(const float* x, int lo, int begin, int end, const Search& s, int32_t* out, Smem& sm) {
  uint32_t sure_before = sm.before[0], tie_before = sm.before[1];
  ForEachTile(x, lo, begin, end, [&](int base, const uint32_t(&key)[kLoads][4]) {
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
      const int i = base + j * kSub + 4 * static_cast<int>(threadIdx.x) - lo;  // the row's position of e = 0
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
}

// TopkDesc::after_count: every block waits until the kernels writing the scores have counted
// after_target programs (an acquire, so their writes are visible to the whole block after the
// barrier), instead of waiting for every grid before it in the stream.
__device__ __forceinline__ void WaitForCount(const int32_t* count, int32_t target) {
  if (threadIdx.x == 0) {
    for (;;) {
#if defined(__CUDA_ARCH__)
      int32_t n;
      asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(n) : "l"(count) : "memory");
      if (n >= target) break;
      __nanosleep(64);
#else
      if (__atomic_load_n(count, __ATOMIC_ACQUIRE) >= target) break;
#endif
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads) TopkKernel(TopkDesc d) {
  HS_BLOCK_SHARED(Smem, sm);
  if (d.after_count != nullptr) WaitForCount(d.after_count, d.after_target);
  const cg::cluster_group cluster = cg::this_cluster();
  const int blocks = static_cast<int>(cluster.num_blocks()), rank = static_cast<int>(cluster.block_rank());
  const int row = static_cast<int>(blockIdx.x) / blocks;
  int32_t* out = d.positions + static_cast<int64_t>(row) * d.k;
  const int active = d.batch_size ? max(0, min(*d.batch_size, d.rows)) : d.rows;
  uint32_t written = 0;
  if (row < active) {  // the same for every block of the cluster, as is every branch on sm.s below
    const int n = d.seq_lens ? max(0, min(d.seq_lens[row], d.cols)) : d.cols;
    // The row seen from the 16-byte boundary at or before its first score (lo scores before it,
    // never selected): every float4 load is then aligned, whatever the row's stride. Positions below
    // are from x; WriteSelected takes lo off.
    const float* first = d.scores + static_cast<int64_t>(row) * d.ld;
    const int lo = static_cast<int>((reinterpret_cast<uintptr_t>(first) & 15u) / sizeof(float));
    const float* x = first - lo;
    const int64_t span = static_cast<int64_t>(n) + lo;
    // This block's share of the span: a multiple of 4 scores, so that its float4 loads stay aligned.
    const int64_t share = ((span + blocks - 1) / blocks + 3) / 4 * 4;
    const int begin = static_cast<int>(min(span, rank * share));
    const int end = static_cast<int>(min(span, begin + share));
    if (threadIdx.x == 0) {
      sm.s = Search{0u, 0u, static_cast<uint32_t>(d.k), 0u, 0};
      sm.nkept = 0;
      sm.sure = sm.tie = 0;
      sm.guess = 0;
      sm.at_top = 0;
    }
    bool kept = false;
    // A round is a pass that counts and the cluster barrier after it; its counts go to
    // sm.counts[round & 1], so that a block a round ahead never overwrites what a slower one still
    // adds. Pass 0's second counts go to sm.counts[2], and round 1 (pass 1, or pass 2 when pass 0
    // chose two bytes) to [1]: neither overwrites them while they may be read.
    int round = 0;
    for (int pass = 0; pass < 4; ++pass, ++round) {
      for (int i = threadIdx.x; i < 256 * 32; i += kThreads) (&sm.hist[0][0])[i] = 0;
      if (pass == 0) {
        for (int i = threadIdx.x; i < 256 * 8; i += kThreads) (&sm.lead[0][0])[i] = 0;
      }
      __syncthreads();  // the counters zeroed, sm.s, sm.tie, sm.guess and sm.nkept set
      const Search s = sm.s;
      if (s.done) break;
      const int shift = 24 - 8 * pass;
      if (kept) {
        CountKept(s, shift, sm);
      } else if (pass == 0) {
        // The first tile's expected share of the k largest keys (at least 1).
        const int64_t tile = min(static_cast<int64_t>(kTile), static_cast<int64_t>(end - begin));
        const int64_t share_of_k = n > 0 ? (static_cast<int64_t>(d.k) * tile + n - 1) / n : 1;
        const uint32_t expect = static_cast<uint32_t>(share_of_k > 1 ? share_of_k : 1);
        CountFirst(x, lo, begin, end, expect, sm);
      } else {
        const bool keep = sm.tie <= kCap;  // sm.tie: this block's share of the bucket
        CountRow(x, lo, begin, end, s, shift, keep, sm);
        kept = keep;
      }
      __syncthreads();
      if (pass == 0) {
        Tally(sm.lead, sm.counts[0]);
        Tally(sm.hist, sm.counts[2]);
      } else {
        Tally(sm.hist, sm.counts[round & 1]);
      }
      cluster.sync();  // every block's counts of this round written (and the round before last's read)
      SumCluster(cluster, round & 1, sm);
      Choose(shift, pass == 0, round & 1, sm);
      if (pass == 0 && SecondCountIsTheBuckets(cluster, sm)) {
        SumCluster(cluster, 2, sm, sm.s.prefix >> 24);
        Choose(16, false, 2, sm);
        pass = 1;  // the next pass counts the third byte
      }
    }
    PlaceBlock(cluster, sm);
    const Search s = sm.s;
    WriteSelected(x, lo, begin, end, s, out, sm);
    written = sm.all[0] + min(sm.all[1], s.want);
    cluster.sync();  // no block exits while another may still read its shared memory
  }
  for (uint32_t i = written + rank * kThreads + threadIdx.x; i < static_cast<uint32_t>(d.k); i += blocks * kThreads) {
    out[i] = -1;
  }
}

}  // namespace

int TopkBlocksPerRow(int rows, const int (&resident)[4]) {
  for (int i = 3; i > 0; --i) {
    if (rows <= resident[i]) return 1 << i;
  }
  return 1;
}

namespace {

// A launch of `rows` rows, a cluster of `blocks` blocks a row; `attr` holds the cluster's size.
cudaLaunchConfig_t ClusterLaunch(int64_t rows, int blocks, cudaStream_t stream, cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(rows * blocks));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(blocks);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  return config;
}

// How many clusters of 1, 2, 4 and 8 blocks the current device runs at once, asked once a device.
// A cluster's blocks share a GPC, so this is not the SM count over the cluster's size: an H100's 132
// SMs hold fewer than 33 clusters of 4 of these blocks.
cudaError_t ResidentClusters(int (&resident)[4]) {
  constexpr int kDevices = 64;
  static std::atomic<int> known[kDevices][4];  // the count + 1; 0: not yet asked
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  for (int i = 0; i < 4; ++i) {
    int n = device < kDevices ? known[device][i].load(std::memory_order_relaxed) - 1 : -1;
    if (n < 0) {
      cudaLaunchAttribute attr;
      const cudaLaunchConfig_t config = ClusterLaunch(1, 1 << i, nullptr, attr);
      err = cudaOccupancyMaxActiveClusters(&n, TopkKernel, &config);
      if (err != cudaSuccess) return err;
      if (device < kDevices) known[device][i].store(n + 1, std::memory_order_relaxed);
    }
    resident[i] = n;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t LaunchTopk(const TopkDesc& d, cudaStream_t stream, int blocks_per_row) {
  const std::string why = CheckTopkDesc(d);
  if (!why.empty()) return internal::FailLaunch("top-k: " + why);
  if (blocks_per_row != 0 && blocks_per_row != 1 && blocks_per_row != 2 && blocks_per_row != 4 && blocks_per_row != 8) {
    return internal::FailLaunch("top-k: blocks_per_row " + std::to_string(blocks_per_row) +
                                " is not 0 (chosen), 1, 2, 4 or 8");
  }
  if (d.rows == 0) {
    internal::SetLaunchError("");
    return cudaSuccess;
  }
  if (blocks_per_row == 0) {
    int resident[4];
    const cudaError_t err = ResidentClusters(resident);
    if (err != cudaSuccess) return internal::LaunchCallFailed(err);
    blocks_per_row = TopkBlocksPerRow(d.rows, resident);
  }
  if (static_cast<int64_t>(d.rows) * blocks_per_row > 0x7FFFFFFF) {
    return internal::FailLaunch("top-k: " + std::to_string(d.rows) + " rows are too many blocks");
  }
  cudaLaunchAttribute attr[2];
  cudaLaunchConfig_t config = ClusterLaunch(d.rows, blocks_per_row, stream, attr[0]);
  if (d.after_count != nullptr) {  // a programmatic dependent that waits for the count, not for the grids before
    config.attrs = attr;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    config.numAttrs = 2;
  }
  const cudaError_t err = cudaLaunchKernelEx(&config, TopkKernel, d);
  if (err != cudaSuccess) return internal::LaunchCallFailed(err);
  return internal::CheckLaunched();
}

}  // namespace hisparse
