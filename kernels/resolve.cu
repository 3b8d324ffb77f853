// The CUDA RESOLVE kernel: one launch per (layer, decode step) for the whole batch.
//
// Design (one launch, no host round trip):
//   * Grid = min(max_batch, resident capacity) row blocks + helper blocks filling the rest of the
//     capacity (one per SM at most). Row block b plans batch entries b, b + row_blocks, ... alone:
//     it is the only block that reads or writes those rows' slot tables and LRU orders, so no
//     other block can see them half-written. Entries of row block b at and past the batch size
//     (CUDA graph padding, rule 7) get kPadding outputs (and a padding MissPlan summary) from b
//     after its planning; apart from that, blocks without rows (padding, helpers) only fetch.
//   * Planning (per row, in shared memory; PlanRow, one __forceinline__ function per step) is a
//     short chain of block-wide steps, one barrier each, because planning latency is the floor of
//     every launch:
//       0. StageRow: the selections, the row's slot table and LRU order are staged into shared
//          memory with every load in flight at once, in three cp.async groups: step 1 waits
//          only for the selections, step 2 for the slot table, step 3 for the LRU order;
//       1. InsertSelections: the k selected positions go into an open-addressing hash table of
//          64-bit entries (position | selection index << 32, one atomicCAS), which also finds
//          duplicates, and sets each one's bit in a filter of 32 bits per selection;
//       2. FindHits: one pass over the slot table looks every resident position up (hits); a
//          position whose filter bit is clear (most unselected ones) skips the table, whose probe
//          chain it would walk to the next empty entry;
//       3. BallotSegments: each warp owns one contiguous segment of the selections and one of the
//          LRU order and records, as 32-bit ballot masks, which selections miss and which slots
//          hold no hit, plus its segment's totals;
//       4. SumTotals: every warp sums the totals of the warps before it (a warp reduction, no scan
//          barrier); RankMisses and PlaceVictims rank its items from the masks: misses numbered
//          in selection order, and non-hit slots numbered in LRU order, which gives the victims
//          (the i-th non-hit slot takes the i-th miss) and the new LRU order in closed form,
//          written straight to global memory:
//            non-hit slot with rank r: r >= M ? r - M : (B - H - M) + r;  hit slot: (B - H) + its
//            rank among hit slots   (M misses, H hit slots = B - non-hit slots);
//       5. WriteOutputs and CountRow: outputs (slots, and rule 9's page-table entries when asked
//          for, computed by the same PageTableEntry as the reference), slot_pos of the victims,
//          the fetch plan and the counters (RejectRow instead for an invalid row);
//       5a. OrderMisses (ResolveLaunchConfig::address_order, rows that queue chunks): the fetch
//          takes the misses in position order, i.e. host-address order, instead of selection
//          order (a counting sort into buckets of positions; every miss keeps its victim);
//       6. PublishChunks and CopyOwnChunks: the fetch, below.
//   * Fetching is spread over the whole GPU: the planner keeps its first misses for its own warps
//     (no extra round trip; a row with few misses keeps them all, each warp as many records as one
//     round of its loads covers, so that they cost one PCIe round trip), cuts the rest into
//     chunks of a few records (~4 KB) and publishes them, from its last warp, into a work queue
//     in the workspace (one atomic reserves the entries and counts the row as published); the
//     consumer warps (the last kConsumerWarps of every block) pull chunks from the queue and copy
//     them with 16-byte non-coherent loads from mapped host memory and 16-byte stores. Few
//     consumers on purpose: the chunks in flight then come from a few rows' address-ordered
//     misses, a narrow span of host addresses, which is what scattered reads need. (A launch on a
//     budget of blocks gives more warps of each block, so that its few blocks keep as many loads
//     in flight as the whole GPU's consumers: ConsumerWarps.) The warp that
//     publishes the last row writes one END entry for every consumer warp of the grid, so every
//     consumer waits only on its own queue entry and the queue drains exactly. A consumer's
//     first entry is fixed (consumer w of W takes entry W - 1 - w: the helpers, which start idle,
//     take the first chunks); only its later ones come from the take counter (entries W, W + 1,
//     ...), so the consumers that end planning together do not all queue on one atomic.
//   * The workspace resets itself: consumers clear the entries they take, the last planner zeroes
//     the publish counter and the warp that takes the very last entry the take counter. Graph
//     replays need nothing in between.
//   * Stream order (ResolveLaunchConfig::order): launched as a programmatic dependent of the
//     kernel before it, the grid is scheduled during that kernel's tail, and every block waits for
//     it (griddepcontrol.wait) before its first global access: the launch latency leaves the
//     layer's critical path, nothing else changes (stream_order.cuh). Beside it (kBeside), the grid
//     is scheduled once that kernel's blocks have all asked for their dependents, runs its whole
//     step while that kernel runs, and every block waits for it last: an engine hides the misses
//     of one range of rows under another range's attention on one stream, and its CUDA graph stays
//     one chain (a side stream's fork and join slowed every other kernel of a captured step). The
//     other way round (ResolveLaunchConfig::early_dependents), every block first lets the next
//     kernel launch: launched as RESOLVE's programmatic dependent, it runs beside RESOLVE on the
//     SMs a budget leaves (an engine's indexer of later rows), and starts only once every RESOLVE
//     block has started, so it cannot keep one from an SM.
//   * Forward progress: consumers wait for the last planner, so every block of the grid must be
//     able to be resident at once: the grid never exceeds the occupancy-derived capacity, row
//     blocks have the lowest indices and never wait before they have published. (A kernel that
//     holds SMs on another stream and itself waits on this one could still starve it.) A
//     programmatic launch starts only once every block of the kernel before has started or
//     exited, so RESOLVE's waiting blocks never keep that kernel's blocks from an SM; its own
//     blocks that find no SM free yet start as that kernel's exit.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "bench_kernels.h"
#include "copy_chunk.cuh"
#include "cp_async.cuh"
#include "hisparse/kernels/resolve_cuda.h"
#include "launch_status.h"
#include "record_dispatch.h"
#include "resolve_multi.h"
#include "stream_order.cuh"

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

cudaError_t LaunchCallFailed(cudaError_t e) {
  (void)cudaGetLastError();
  g_last_error = cudaGetErrorName(e);
  return e;
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

// The page-table shape every launcher needs (arena_layout.h): R >= 1 and a table of >= 1 page.
const char* CheckHostMap(const HostRecordMap& h) {
  if (h.records_per_page < 1 || h.pages_per_entry < 1) {
    return "host map: records_per_page and pages_per_entry must be >= 1";
  }
  return nullptr;
}

}  // namespace internal

const char* LastLaunchError() { return internal::g_last_error.c_str(); }

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
static_assert(kWarps <= 32, "segment totals are summed by one warp reduction");
constexpr int kIlp = 4;                    // hash inserts one thread keeps in flight
constexpr int kIlpLookup = 8;              // hash lookups one thread keeps in flight
constexpr int kMaxHelperBlocks = 1024;     // workspace is sized for up to this many helpers
constexpr int kChunkUnits = 32 * 8;        // 16-byte units one warp moves per round (4 KiB)
constexpr int kMaxChunkRecords = 32;       // a chunk's records are held one per lane
constexpr unsigned kEndTag = 0xffffffffu;  // lo word of an END entry; hi word = final tail
// Step 5a's buckets of positions (two per thread: one scan pass); its counts and the own chunks'
// order live in the hash table, free by then (H >= 2k entries, k >= kAddressOrderMinK).
constexpr int kOrderBuckets = 2 * kThreads;
// 16-byte loads one lane keeps in flight: consumers hold 8 (64 KiB per SM in flight: a whole
// chunk in one round of loads), a planner's own chunks 4 (its warps go on to the queue
// afterwards). A row with few misses sizes its own chunks to one such round (DirectRecords), so
// that they cost one PCIe round trip, not two (SplitFetch).
constexpr int kConsumeUnroll = 8;
constexpr int kDirectUnroll = 4;
// The warp of a row block that publishes its queue chunks and, for the launch's last row, the
// END entries: the last one, so that the first own chunk (warp 0) starts its copy without
// waiting for the publishing atomic.
constexpr int kPublishWarp = kWarps - 1;
// The warps of every block that take queue chunks: its last kConsumerWarps (the first ones copy a
// row block's own chunks); END entries: one per consumer warp of the grid. Two a block (264 on the
// H200) keep ~1 MB of loads in flight, many times the link's bandwidth-delay product, and the
// chunks in flight then come from a few rows' address-ordered misses, not from ~30 rows spread
// over GBs of host memory: scattered reads lose most to how wide a span of host addresses the
// requests in flight cover (hisparse-bench gather), and 20% scattered misses of a 128k context
// run 0.65 -> 0.86 of the link at 1152 B, 0.40 -> 0.51 at 656 B, with the consecutive points
// unchanged (bench/RESULTS.md, "RESOLVE: two consumer warps a block").
// That is the default of a launch on the whole GPU. A launch on a budget of blocks (max_blocks, to
// run beside the engine's kernels) has too few blocks for it: 16 blocks' 32 consumer warps keep
// ~128 KB in flight and fetched at half the rate of 32 blocks (bench/RESULTS.md, "RESOLVE's budget
// of blocks, alone"). There each consumer block gives more of its warps (ConsumerWarps), up to the
// whole GPU's count of consumers.
constexpr int kConsumerWarps = 2;
static_assert(kConsumerWarps >= 1 && kConsumerWarps <= kWarps, "consumers are warps of a block");
static_assert(kMaxConsumerWarps == kWarps, "the contract's bound on consumer warps is a block's warps");
// A consumer polls its queue entry with sleeps doubling from 32 ns up to this. Against 256 ns the
// launch's END reaches the waiting warps a little sooner: no-IO planning 0.07 us faster in the
// median of 348 points on the H200, copy rates unchanged (bench/RESULTS.md, "RESOLVE: a row's
// first misses in one round trip").
constexpr unsigned kPollMaxNs = 64;

// Slot-table encoding of a selection during planning.
constexpr int kSelMiss = -2;  // miss before ranking; rank m is stored as -(m + 3)
// A row's "error" when its row index is kPadding (rule 10a): it is rejected as padding, with no
// error bit and a padding summary. Not a ResolveError bit.
constexpr uint32_t kEntryIsPadding = 1u << 31;
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
  int chunk_records;      // records of a queue chunk (ChunkRecords)
  int direct_records;     // records of a row block's own chunk (DirectRecords)
  int end_count;          // END entries a launch writes: one per consumer warp of the grid (W)
  int planner_blocks;     // blocks [0, planner_blocks) plan rows b, b + planner_blocks, ...
  int consumer_blocks;    // blocks [0, consumer_blocks) take queue chunks (ResolveLaunchConfig)
  int consumer_warps;     // the last consumer_warps warps of each of those blocks take them (ConsumerWarps)
  bool beside;            // LaunchOrder::kBeside: wait for the kernel before last, not first
  bool early_dependents;  // let the next kernel, a programmatic dependent, launch at once
  int seg_k, seg_b;       // selections / LRU entries per warp segment (multiples of 32)
  bool address_order;     // step 5a: fetch a row's misses in position order (ResolveLaunchConfig)
  // Shared-memory carve-up of a row block (byte offsets, 16-byte aligned).
  unsigned off_hit, off_tab_sp, off_tab_lru, off_sel_pos, off_sel_out, off_miss_slot, off_miss_pos, off_masks, off_tot,
      off_misc, off_filter;
  int filter_bits;  // the selection filter has 1 << filter_bits bits
};

struct WsLayout {
  size_t plan, queue, total;
  size_t queue_entries;
};

// Whole records of `record_bytes` in `units` 16-byte units, at least 1 and at most a chunk's
// kMaxChunkRecords (one per lane).
int RecordsIn(int units, uint32_t record_bytes) {
  const int r = units / static_cast<int>(record_bytes / 16);
  return r < 1 ? 1 : r > kMaxChunkRecords ? kMaxChunkRecords : r;
}

// Records of a queue chunk (~4 KiB).
int ChunkRecords(uint32_t record_bytes) { return RecordsIn(kChunkUnits, record_bytes); }

// Records of a row block's own chunk: as many as one round of a warp's kDirectUnroll loads
// covers, with room for CopyChunk's shift of up to 7 units that aligns a run to 128 bytes.
int DirectRecords(uint32_t record_bytes) { return RecordsIn(32 * kDirectUnroll - 7, record_bytes); }

WsLayout ComputeWsLayout(const ArenaGeometry& g, int max_batch) {
  WsLayout w{};
  const size_t mb = max_batch > 0 ? static_cast<size_t>(max_batch) : 0;
  const int rw = ChunkRecords(g.record_bytes);
  const size_t chunks_per_row = (static_cast<size_t>(g.k) + rw - 1) / rw;
  w.plan = sizeof(WsHeader);
  w.queue = AlignUp(w.plan + mb * g.k * sizeof(int2), 256);
  w.queue_entries = mb * chunks_per_row + (mb + kMaxHelperBlocks) * kConsumerWarps;
  w.total = AlignUp(w.queue + w.queue_entries * sizeof(unsigned long long), 256);
  return w;
}

// The max_batch a workspace of `bytes` was sized for (the largest whose layout fits; -1: none).
// A launch lays the workspace out for this, not for its own max_batch: the queue must sit at the
// same offset in every launch that shares the workspace, since only the queue is left zeroed. A
// layout per launch put a smaller launch's queue over a larger one's stale plan entries, which
// consumers then took as chunks of garbage batch entries (SGLang's padded batch sizes, 2 then 1).
int WsCapacity(const ArenaGeometry& g, size_t bytes) {
  if (ComputeWsLayout(g, 0).total > bytes) return -1;
  int lo = 0;                                                         // fits
  size_t hi = bytes / (static_cast<size_t>(g.k) * sizeof(int2)) + 1;  // its plan alone does not fit
  if (hi > static_cast<size_t>(INT32_MAX)) hi = INT32_MAX;
  while (static_cast<size_t>(lo) + 1 < hi) {
    const int mid = static_cast<int>((lo + hi) / 2);
    if (ComputeWsLayout(g, mid).total <= bytes) {
      lo = mid;
    } else {
      hi = static_cast<size_t>(mid);
    }
  }
  return lo;
}

// The hash table's size: at least 2k entries (load factor <= 1/2), or at least 4k (<= 1/4) where
// that still fits the device's shared memory (HashBitsFor, below). Selected positions are
// scattered over the context in serving, and linear probing's chains grow fast with the load: at
// 1/2 a warp's slowest lane walks ~12 entries in the slot-table lookups, at 1/4 ~5 (a model of
// random positions; consecutive ones, the default sweep's, hash without collisions at either
// load). Measured on the H200 with the draft benchmark's scattered positions, the 1/4 table and
// the interleaved probes below took planning at B 4096 from 20.6 to 13.9 us (bench/RESULTS.md).
int HashBits(int k, bool roomy) {
  int bits = 6;
  while ((1 << bits) < (roomy ? 4 : 2) * k) ++bits;
  return bits;
}

// Items per warp segment: n split over the warps, rounded up to whole ballots.
int SegmentItems(int n) {
  const int per = (n + kWarps - 1) / kWarps;
  return (per + 31) / 32 * 32;
}

// The selection filter: a bit per hashed position, set for every selection the hash table holds,
// so that a slot whose position was not selected (most of them) is told apart by one 32-bit load
// instead of a probe chain to the next empty entry. At least 32 bits per selection (a false
// positive, ~3%, only costs the probe chain it saves elsewhere).
int FilterBits(int k) {
  int bits = 10;
  while ((1 << bits) < 32 * k) ++bits;
  return bits;
}

struct SmemLayout {
  unsigned off_hit, off_tab_sp, off_tab_lru, off_sel_pos, off_sel_out, off_miss_slot, off_miss_pos, off_masks, off_tot,
      off_misc, off_filter, total;
};

// [hash table] [hit flags] [slot_pos copy] [LRU copy] [selections] [outputs] [victim slots]
// [miss positions] [ballot masks] [segment totals] [misc]
SmemLayout ComputeSmem(const ArenaGeometry& g, int hash_bits) {
  SmemLayout s{};
  size_t o = (size_t{1} << hash_bits) * 8;
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
  s.off_filter = take((size_t{1} << FilterBits(g.k)) / 8);
  s.total = static_cast<unsigned>(o);
  return s;
}

// The roomy table where the row block's shared memory then fits `smem_optin`, else the plain one.
int HashBitsFor(const ArenaGeometry& g, int smem_optin) {
  const int roomy = HashBits(g.k, true);
  return ComputeSmem(g, roomy).total <= static_cast<unsigned>(smem_optin) ? roomy : HashBits(g.k, false);
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

using internal::CopyChunk;  // one warp copies a chunk of host records (copy_chunk.cuh)

using internal::CpAsyncCommit;  // cp_async.cuh
using internal::CpAsyncWaitAll;
using internal::CpAsyncWaitGroup;
// Block-wide asynchronous copy of n ints from global to shared memory (cp_async.cuh).
__device__ __forceinline__ void StageInts(int* dst, const int* src, int n) {
  internal::StageInts<kThreads>(dst, src, n);
}

__device__ __forceinline__ unsigned HashOf(int p, int bits) {
  return (static_cast<unsigned>(p) * 2654435761u) >> (32 - bits);
}

// Ballot rounds of 32 items a warp segment [start, start + seg) of n items has.
__device__ __forceinline__ int SegmentRounds(int n, int start, int seg) {
  const int len = n - start < seg ? n - start : seg;
  return len > 0 ? (len + 31) / 32 : 0;
}

// Where a chunk of (row, layer) reads from: the row's page table and, for a one-page table (a
// contiguous run: every valid position lies on page 0, capacity <= R), that page, loaded once up
// front so that its source addresses need no further load (the chain the contiguous runs had).
struct ChunkSource {
  uint8_t* const* table;
  const uint8_t* page0;  // null: several pages, looked up per record
};
__device__ __forceinline__ ChunkSource SourceTable(const HostRecordMap& h, const ArenaGeometry& g, int row, int layer) {
  ChunkSource c;
  c.table = h.Table(g, row, layer);
  c.page0 = h.pages_per_entry == 1 ? HostRecordMap::PageAddress(c.table[0]) : nullptr;
  return c;
}
// A chunk lane's source: the host address of position `pos`, as the integer CopyChunk reads from
// (one division by R per record on paged tables; the copy loops see only addresses).
__device__ __forceinline__ long long SourceOf(const HostRecordMap& h, const ChunkSource& c, int pos, uint32_t rb) {
  const uint8_t* rec = c.page0 ? c.page0 + static_cast<size_t>(pos) * rb : h.RecordIn(c.table, pos, rb);
  return static_cast<long long>(reinterpret_cast<uintptr_t>(rec));
}

// One warp: an END entry for every consumer warp of the grid after the last published entry. An
// END carries the final tail, so the warp that takes the very last index can reset qhead. ENDs
// publish no data, so they are plain relaxed stores.
__device__ __forceinline__ void WriteEnds(const ResolveParams& p, unsigned tail) {
  const unsigned long long end = kEndTag | (static_cast<unsigned long long>(tail) << 32);
  for (int w = threadIdx.x & 31; w < p.end_count; w += 32) StRelaxed(&p.queue[tail + w], end);
}

// ---------------------------------------------------------------------------------------------
// Planning one row: the steps of the design above, one function each. "Rule n" is rule n of the
// RESOLVE contract in kernels/include/hisparse/kernels/resolve.h, "invalid input" its paragraph
// on invalid rows. Every step is __forceinline__ and PlanRow computes what they share once
// (PlanCtx): the compiler still sees one body, and the registers, shared memory and spills of
// every instantiation are those of the function before the split (ptxas -v).

// What every step reads: the geometry, this thread's place in the block, the hash table's size
// and the row block's shared memory (ComputeSmem's carve-up) as typed pointers.
struct PlanCtx {
  int B, K;                   // slots, selections
  int tid, lane, warp;        // this thread in the block
  int bits, H;                // the hash table has H = 1 << bits entries
  unsigned hmask;             // H - 1
  unsigned lt;                // mask of the lanes below this one
  unsigned long long* table;  // [H] the selections' hash table
  uint8_t* hit;               // [B] 1: the slot holds a hit of this step
  int* tab_sp;                // [B] the row's slot table, staged (read only)
  int* tab_lru;               // [B] the row's LRU order, staged (read only)
  int* sel_pos;               // [k] the selections
  int* sel_out;               // [k] output of selection j, or kSelMiss / -(miss rank + 3)
  int* miss_slot;             // [k] victim slot of miss m
  int* miss_pos;              // [k] position of miss m
  int rounds_k, rounds_b;     // ballot rounds per warp segment
  unsigned* mask_k;           // [kWarps][rounds_k] ballots of the missing selections
  unsigned* mask_b;           // [kWarps][rounds_b] ballots of the LRU entries without a hit
  int* tot;                   // [kWarps] misses per selection segment, then [kWarps] non-hit slots
                              // per LRU segment
  int* misc;                  // [16] 0: error bits, 1: times the newest token is selected
  unsigned* filter;           // [1 << filter_bits / 32] the selection filter
  int filter_bits;
};

__device__ __forceinline__ PlanCtx MakePlanCtx(const ResolveParams& p, unsigned char* smem) {
  PlanCtx c;
  c.B = p.d.arena.geometry.slots;
  c.K = p.d.arena.geometry.k;
  c.tid = threadIdx.x;
  c.lane = c.tid & 31;
  c.warp = c.tid >> 5;
  c.bits = p.hash_bits;
  c.H = 1 << c.bits;
  c.hmask = c.H - 1;
  c.lt = (1u << c.lane) - 1u;
  c.table = reinterpret_cast<unsigned long long*>(smem);
  c.hit = smem + p.off_hit;
  c.tab_sp = reinterpret_cast<int*>(smem + p.off_tab_sp);
  c.tab_lru = reinterpret_cast<int*>(smem + p.off_tab_lru);
  c.sel_pos = reinterpret_cast<int*>(smem + p.off_sel_pos);
  c.sel_out = reinterpret_cast<int*>(smem + p.off_sel_out);
  c.miss_slot = reinterpret_cast<int*>(smem + p.off_miss_slot);
  c.miss_pos = reinterpret_cast<int*>(smem + p.off_miss_pos);
  c.rounds_k = p.seg_k / 32;
  c.rounds_b = p.seg_b / 32;
  c.mask_k = reinterpret_cast<unsigned*>(smem + p.off_masks);
  c.mask_b = c.mask_k + kWarps * c.rounds_k;
  c.tot = reinterpret_cast<int*>(smem + p.off_tot);
  c.misc = reinterpret_cast<int*>(smem + p.off_misc);
  c.filter = reinterpret_cast<unsigned*>(smem + p.off_filter);
  c.filter_bits = p.filter_bits;
  return c;
}

// This warp's segments: selections [k0, k0 + seg_k) and LRU entries [b0, b0 + seg_b).
struct WarpSegments {
  int k0, b0;    // first item
  int nrk, nrb;  // ballot rounds that hold items
};

// Step 4's totals, the same in every warp.
struct RowTotals {
  int M, NH;         // misses; slots that hold no hit
  int run_k, run_b;  // misses / non-hit slots in the segments before this warp's
};

// Step 0, staging. Everything the plan reads goes into shared memory with all loads in flight
// at once, in three cp.async groups that later steps wait for one by one: the selections (they
// need no row; step 1 reads them), the row's slot table (step 2, so it lands while step 1
// inserts) and its LRU order (step 3, so it lands while steps 1 and 2 run); the hash table, hit
// flags and misc are cleared. Returns after the selections have landed. Every thread commits
// the three groups, empty ones for a bad row, so that the waits count alike. Invalid input: a
// layer or row outside its range, or seq_len outside [1, the row's capacity], is the row's error;
// a row of kPadding is padding (rule 10a: kEntryIsPadding).
__device__ __forceinline__ uint32_t StageRow(const ResolveParams& p, const PlanCtx& c, int i, int row, int seq) {
  const ResolveDesc& d = p.d;
  const ArenaGeometry& g = d.arena.geometry;
  const int B = c.B, K = c.K, tid = c.tid;
  StageInts(c.sel_pos, d.positions + static_cast<size_t>(i) * K, K);
  CpAsyncCommit();
  uint32_t err = 0;
  int cap = 0;
  if (row == kPadding || d.layer < 0 || d.layer >= g.num_layers || row < 0 || row >= g.max_rows) {
    err = row == kPadding ? kEntryIsPadding : static_cast<uint32_t>(kResolveBadRow);
    CpAsyncCommit();
    CpAsyncCommit();
  } else {
    cap = d.host.capacity[row];
    const size_t rl = d.arena.RowLayer(row, d.layer);
    StageInts(c.tab_sp, d.arena.slot_pos + rl * B, B);
    CpAsyncCommit();
    StageInts(c.tab_lru, d.arena.lru + rl * B, B);
    CpAsyncCommit();
  }
  {
    uint4* t4 = reinterpret_cast<uint4*>(c.table);
    const uint4 ones = make_uint4(~0u, ~0u, ~0u, ~0u);
    for (int h = tid; h < c.H / 2; h += kThreads) t4[h] = ones;
    uint4* h4 = reinterpret_cast<uint4*>(c.hit);
    for (int s = tid; s < (B + 15) / 16; s += kThreads) h4[s] = make_uint4(0, 0, 0, 0);
    uint4* f4 = reinterpret_cast<uint4*>(c.filter);
    for (int w = tid; w < (1 << c.filter_bits) / 128; w += kThreads) f4[w] = make_uint4(0, 0, 0, 0);
  }
  if (tid < 16) c.misc[tid] = 0;
  if (err == 0 && (seq < 1 || seq > cap)) err = kResolveBadSeqLen;
  CpAsyncWaitGroup<2>();  // the selections
  __syncthreads();
  return err;
}

// Step 1: the selections into the hash table. Invalid input: a position outside [-1, seq_len)
// or selected twice is the row's error. Rule 1: the newest token maps to slot B (a hit); rule 4:
// padding stays kPadding, and so do columns j >= seq_len whatever they hold (rule 10b); every
// other selection is a miss until FindHits finds it. kIlp inserts
// per thread are issued before any result is looked at (shared-memory atomics are slow one at a
// time); collisions are resolved afterwards by linear probing. Returns the row's error bits
// (read after a barrier: the whole block agrees).
__device__ __forceinline__ uint32_t InsertSelections(const PlanCtx& c, int seq, int newest) {
  const int B = c.B, K = c.K, tid = c.tid;
  for (int base = 0; base < K; base += kIlp * kThreads) {
    int pj[kIlp];
    unsigned h[kIlp];
    unsigned long long old[kIlp];
#pragma unroll
    for (int t = 0; t < kIlp; ++t) {
      const int j = base + t * kThreads + tid;
      pj[t] = j < K && j < seq ? c.sel_pos[j] : kPadding;
    }
#pragma unroll
    for (int t = 0; t < kIlp; ++t) {
      const int j = base + t * kThreads + tid;
      old[t] = kEmptyEntry;
      h[t] = HashOf(pj[t], c.bits);
      if (pj[t] >= 0 && pj[t] < seq) {
        const unsigned long long e = static_cast<unsigned>(pj[t]) | (static_cast<unsigned long long>(j) << 32);
        old[t] = atomicCAS(&c.table[h[t]], kEmptyEntry, e);
        const unsigned fb = HashOf(pj[t], c.filter_bits);
        atomicOr(&c.filter[fb >> 5], 1u << (fb & 31));
      }
      if (j < K) {
        int o = kPadding;
        if (pj[t] == kPadding) {
        } else if (pj[t] < -1 || pj[t] >= seq) {
          atomicOr(reinterpret_cast<unsigned*>(&c.misc[0]), kResolveBadPosition);
        } else if (pj[t] == newest) {
          o = B;
          atomicAdd(&c.misc[1], 1);
        } else {
          o = kSelMiss;
        }
        c.sel_out[j] = o;
      }
    }
    // Collisions: every insert still pending probes one entry further per round, the rounds'
    // CASes all in flight together (the warp waits for its longest chain, not for the sum of
    // its items' chains).
    bool pending = true;
    while (pending) {
      pending = false;
#pragma unroll
      for (int t = 0; t < kIlp; ++t) {
        if (old[t] == kEmptyEntry) continue;
        if (static_cast<int>(static_cast<unsigned>(old[t])) == pj[t]) {
          atomicOr(reinterpret_cast<unsigned*>(&c.misc[0]), kResolveDuplicate);
          old[t] = kEmptyEntry;
          continue;
        }
        h[t] = (h[t] + 1) & c.hmask;
        const int j = base + t * kThreads + tid;
        old[t] = atomicCAS(&c.table[h[t]], kEmptyEntry,
                           static_cast<unsigned>(pj[t]) | (static_cast<unsigned long long>(j) << 32));
        pending = true;
      }
    }
  }
  CpAsyncWaitGroup<1>();  // the slot table, for step 2 (visible after the barrier)
  __syncthreads();
  return static_cast<uint32_t>(c.misc[0]);
}

// Step 2, rule 1: a selected position resident in a slot is a hit. Every resident position is
// looked up once (kIlpLookup lookups in flight per thread); a hit sets its selection's output to the
// slot and flags the slot. A regular slot that holds the newest token is left alone. Only positions
// the selection filter may hold probe the table: with real selections most slots hold positions not
// selected this step, whose probes ran to the end of their cluster (planning at batch 128 with real
// positions 16.1 -> 15.0 us on the H200; with the default sweep's consecutive positions, which
// never collide, the filter costs 0.0-0.3 us: bench/RESULTS.md, "The selection filter").
__device__ __forceinline__ void FindHits(const PlanCtx& c, int newest) {
  const int B = c.B, tid = c.tid;
  for (int base = 0; base < B; base += kIlpLookup * kThreads) {
    int ps[kIlpLookup];
    unsigned h[kIlpLookup];
    unsigned long long e[kIlpLookup];
#pragma unroll
    for (int t = 0; t < kIlpLookup; ++t) {
      const int s = base + t * kThreads + tid;
      ps[t] = s < B ? c.tab_sp[s] : kEmptySlot;
      if (ps[t] == newest) ps[t] = kEmptySlot;
    }
#pragma unroll
    for (int t = 0; t < kIlpLookup; ++t) {
      h[t] = HashOf(ps[t], c.bits);
      const unsigned fb = HashOf(ps[t], c.filter_bits);
      const bool maybe = ps[t] >= 0 && ((c.filter[fb >> 5] >> (fb & 31)) & 1u);
      e[t] = maybe ? c.table[h[t]] : kEmptyEntry;
    }
    // Probe chains advance one entry per round for every pending lookup together, as in
    // InsertSelections.
    bool pending = true;
    while (pending) {
      pending = false;
#pragma unroll
      for (int t = 0; t < kIlpLookup; ++t) {
        if (e[t] == kEmptyEntry) continue;
        if (static_cast<int>(static_cast<unsigned>(e[t])) == ps[t]) {
          const int s = base + t * kThreads + tid;
          c.sel_out[static_cast<int>(e[t] >> 32)] = s;
          c.hit[s] = 1;
          e[t] = kEmptyEntry;
          continue;
        }
        h[t] = (h[t] + 1) & c.hmask;
        e[t] = c.table[h[t]];
        pending = true;
      }
    }
  }
  CpAsyncWaitGroup<0>();  // the LRU order, for step 3 (visible after the barrier)
  __syncthreads();
}

// Step 3, what rules 2 and 3 rank: per warp segment, ballot masks of the selections that miss
// and of the LRU entries whose slot holds no hit of this step, and the segments' totals.
__device__ __forceinline__ WarpSegments BallotSegments(const ResolveParams& p, const PlanCtx& c) {
  const int B = c.B, K = c.K, lane = c.lane, warp = c.warp;
  WarpSegments w;
  w.k0 = warp * p.seg_k;
  w.b0 = warp * p.seg_b;
  w.nrk = SegmentRounds(K, w.k0, p.seg_k);
  w.nrb = SegmentRounds(B, w.b0, p.seg_b);
  int ck = 0, cb = 0;
#pragma unroll 4
  for (int r = 0; r < w.nrk; ++r) {
    const int j = w.k0 + r * 32 + lane;
    const unsigned m = __ballot_sync(~0u, j < K && c.sel_out[j] == kSelMiss);
    if (lane == 0) c.mask_k[warp * c.rounds_k + r] = m;
    ck += __popc(m);
  }
#pragma unroll 4
  for (int r = 0; r < w.nrb; ++r) {
    const int idx = w.b0 + r * 32 + lane;
    const unsigned m = __ballot_sync(~0u, idx < B && !c.hit[c.tab_lru[idx]]);
    if (lane == 0) c.mask_b[warp * c.rounds_b + r] = m;
    cb += __popc(m);
  }
  if (lane == 0) {
    c.tot[warp] = ck;
    c.tot[kWarps + warp] = cb;
  }
  __syncthreads();
  return w;
}

// Step 4's sums: every warp adds up the segment totals itself (a redundant 16-entry reduction
// beats another barrier).
__device__ __forceinline__ RowTotals SumTotals(const PlanCtx& c) {
  const int lane = c.lane, warp = c.warp;
  const int tk = lane < kWarps ? c.tot[lane] : 0;
  const int tb = lane < kWarps ? c.tot[kWarps + lane] : 0;
  RowTotals t;
  t.M = __reduce_add_sync(~0u, tk);
  t.NH = __reduce_add_sync(~0u, tb);
  t.run_k = __reduce_add_sync(~0u, lane < warp ? tk : 0);
  t.run_b = __reduce_add_sync(~0u, lane < warp ? tb : 0);
  return t;
}

// Step 4, rule 2's "misses, in selection order": the m-th missing selection is miss m; its
// output becomes -(m + 3) and its position is recorded.
__device__ __forceinline__ void RankMisses(const PlanCtx& c, const WarpSegments& w, int run_k) {
  const int lane = c.lane, warp = c.warp;
  for (int r = 0; r < w.nrk; ++r) {
    const unsigned m = c.mask_k[warp * c.rounds_k + r];
    if ((m >> lane) & 1u) {
      const int j = w.k0 + r * 32 + lane;
      const int mi = run_k + __popc(m & c.lt);
      c.sel_out[j] = -(mi + 3);
      c.miss_pos[mi] = c.sel_pos[j];
    }
    run_k += __popc(m);
  }
}

// Step 4, rules 2 and 3: the i-th slot without a hit, in LRU order, is the i-th miss's victim,
// and the new LRU order in closed form (the design above), written straight to the arena's
// `lru` (the old order is staged).
__device__ __forceinline__ void PlaceVictims(const PlanCtx& c, const WarpSegments& w, const RowTotals& t, int* lru) {
  const int B = c.B, lane = c.lane, warp = c.warp, M = t.M, NH = t.NH;
  int run_b = t.run_b;
#pragma unroll 4
  for (int r = 0; r < w.nrb; ++r) {
    const int idx = w.b0 + r * 32 + lane;
    const unsigned m = c.mask_b[warp * c.rounds_b + r];
    if (idx < B) {
      const int s = c.tab_lru[idx];
      const int nr = run_b + __popc(m & c.lt);  // non-hit slots before idx in the old order
      int ni;
      if ((m >> lane) & 1u) {
        if (nr < M) {
          c.miss_slot[nr] = s;
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
}

// Step 5a (ResolveParams::address_order, rows whose misses go through the queue): the fetch takes
// the row's misses in position order, which is host-address order within every page run, instead
// of selection order (a top-k list is in score order: random addresses). Each miss keeps its
// victim, so outputs and tables are unchanged; only the order of the copies changes. The order is
// a counting sort into kOrderBuckets buckets of consecutive positions (exact for contexts up to
// kOrderBuckets positions, within a bucket in arrival order beyond). The own chunks' share
// (ranks < own) goes to own_pos / own_slot in shared memory, the rest into the queue's plan.
// Uses the hash table (counts, own order), tab_sp (each miss's place in its bucket) and tot (the
// scan's warp totals), all free after step 4. Five barriers.
__device__ __forceinline__ void OrderMisses(const PlanCtx& c, int M, int seq, int2* plan, int own, int* own_pos,
                                            int* own_slot) {
  int* cnt = reinterpret_cast<int*>(c.table);
  int* place = c.tab_sp;
  const int span = seq > 1 ? seq - 1 : 1;
  int shift = 32 - __clz(span) - 10;  // kOrderBuckets = 1024 buckets: 10 bits
  if (shift < 0) shift = 0;
  for (int x = c.tid; x < kOrderBuckets; x += kThreads) cnt[x] = 0;
  __syncthreads();
  for (int m = c.tid; m < M; m += kThreads) place[m] = atomicAdd(&cnt[c.miss_pos[m] >> shift], 1);
  __syncthreads();
  // Exclusive scan of the counts: two per thread, a warp scan, the warp totals summed per warp.
  const int a = cnt[2 * c.tid], b = cnt[2 * c.tid + 1];
  int incl = a + b;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(~0u, incl, o);
    if (c.lane >= o) incl += v;
  }
  if (c.lane == 31) c.tot[c.warp] = incl;
  __syncthreads();
  const int wt = c.lane < kWarps ? c.tot[c.lane] : 0;
  const int excl = __reduce_add_sync(~0u, c.lane < c.warp ? wt : 0) + incl - (a + b);
  cnt[2 * c.tid] = excl;
  cnt[2 * c.tid + 1] = excl + a;
  __syncthreads();
  for (int m = c.tid; m < M; m += kThreads) {
    const int pos = c.miss_pos[m], slot = c.miss_slot[m];
    const int r = cnt[pos >> shift] + place[m];
    if (r < own) {
      own_pos[r] = pos;
      own_slot[r] = slot;
    } else {
      plan[r] = make_int2(pos, slot);
    }
  }
  __syncthreads();
}

// Step 6's split of a row's M misses (the same in every thread of the block): the block's own
// warps copy misses [0, direct), warp w < ndirect those of own chunk w (per records each); the
// rest go through the queue in nq chunks of chunk_records. A row whose misses all fit its warps'
// one-round chunks (direct_records each) keeps them all: one PCIe round trip, no queue. A row
// with more keeps kWarps chunks of queue size, as many records as its warps can hold in flight,
// and queues the rest. No fetch: all zero.
struct FetchSplit {
  int per, ndirect, direct, nq;
};
__device__ __forceinline__ FetchSplit SplitFetch(const ResolveParams& p, int M) {
  FetchSplit f{1, 0, 0, 0};
  if (p.d.flags & kResolveFlagNoFetch) return f;
  const int rw = p.chunk_records;
  f.per = M <= kWarps * p.direct_records ? p.direct_records : rw;
  const int own = (M + f.per - 1) / f.per;
  f.ndirect = own < kWarps ? own : kWarps;
  f.direct = f.ndirect * f.per < M ? f.ndirect * f.per : M;
  f.nq = (M - f.direct + rw - 1) / rw;
  return f;
}

// Step 5, rules 4, 8 and 2: every selection's output slot and (when asked for) page-table entry;
// each victim's slot_pos gets its miss's position; the fetch plan of the misses that go through
// the queue (past the block's own share) and, when asked for, the MissPlan entries that replays
// of this layer copy. out or pt may be null (not asked for).
__device__ __forceinline__ void WriteOutputs(const ResolveParams& p, const PlanCtx& c, int i, int row, int* out,
                                             int* pt, int* slot_pos, const FetchSplit& f, bool ordered) {
  const ResolveDesc& d = p.d;
  const int K = c.K;
  // An ordered fetch plan was written by step 5a.
  const int plan_from = f.nq > 0 && !ordered ? f.direct : K;
  int2* plan = p.plan + static_cast<size_t>(i) * K;
  int2* miss_plan = d.plan.summary ? reinterpret_cast<int2*>(d.plan.entries) + static_cast<size_t>(i) * K : nullptr;
  for (int j = c.tid; j < K; j += kThreads) {
    int o = c.sel_out[j];
    if (o <= -3) {
      const int m = -o - 3;
      o = c.miss_slot[m];
      const int pos = c.miss_pos[m];
      slot_pos[o] = pos;
      if (m >= plan_from) plan[m] = make_int2(pos, o);
      if (miss_plan) miss_plan[m] = make_int2(pos, o);
    }
    if (out) out[j] = o;
    if (pt) pt[j] = o < 0 ? kPadding : PageTableEntry(d, row, o);
  }
}

// Step 5, the counters (rule 6: the CPU reference counts alike) and the MissPlan summary. Hits
// are the hit slots plus the newest-token selections. One thread.
__device__ __forceinline__ void CountRow(const ResolveParams& p, const PlanCtx& c, int i, int row, const RowTotals& t) {
  const ResolveDesc& d = p.d;
  const int B = c.B, M = t.M, NH = t.NH;
  if (d.plan.summary) {
    int* sum = d.plan.summary + static_cast<size_t>(i) * 3;
    sum[0] = row;
    sum[1] = M;
    sum[2] = B - NH + c.misc[1];
  }
  ArenaCounters* ctr = d.arena.counters;
  atomicAdd(reinterpret_cast<unsigned long long*>(&ctr->hits), static_cast<unsigned long long>(B - NH + c.misc[1]));
  atomicAdd(reinterpret_cast<unsigned long long*>(&ctr->misses), static_cast<unsigned long long>(M));
  atomicAdd(reinterpret_cast<unsigned long long*>(&ctr->bytes_fetched),
            static_cast<unsigned long long>(M) * d.arena.geometry.record_bytes);
  atomicAdd(reinterpret_cast<unsigned long long*>(&ctr->steps), 1ull);
}

// Invalid input: the row's outputs (and page-table entries) become kPadding, its error bits are
// ORed into error_flags, counters.rejected counts it and its state is left untouched; its MissPlan summary says misses
// = -1 (replays skip the row). A padded row (err == kEntryIsPadding, rule 10a) publishes the same with no error bit and
// a padding summary.
__device__ __forceinline__ void RejectRow(const ResolveParams& p, const PlanCtx& c, int i, int row, int* out, int* pt,
                                          uint32_t err) {
  const ResolveDesc& d = p.d;
  const int tid = c.tid;
  const bool padding = err == kEntryIsPadding;
  for (int j = tid; j < c.K; j += kThreads) {
    if (out) out[j] = kPadding;
    if (pt) pt[j] = kPadding;
  }
  if (tid == 0 && !padding) {
    if (d.error_flags) atomicOr(d.error_flags, err);
    atomicAdd(reinterpret_cast<unsigned long long*>(&d.arena.counters->rejected), 1ull);
  }
  if (tid == 0 && d.plan.summary) {
    int* sum = d.plan.summary + static_cast<size_t>(i) * 3;
    sum[0] = padding ? kPadding : row;
    sum[1] = -1;
    sum[2] = 0;
  }
}

// Rule 7: row block b's entries at and past the batch (b, b + planner_blocks, ... below
// max_batch) publish kPadding outputs (and page-table entries) and a padding MissPlan summary;
// their rows, seq_lens and positions are ignored. No barrier: nothing else of the block reads or
// writes these entries.
__device__ __forceinline__ void PadEntries(const ResolveParams& p, int b, int batch) {
  const ResolveDesc& d = p.d;
  const int K = d.arena.geometry.k;
  const int stride = p.planner_blocks;
  int i = b;
  if (i < batch) i += (batch - b + stride - 1) / stride * stride;  // this block's first padded entry
  for (; i < d.max_batch; i += stride) {
    const size_t at = static_cast<size_t>(i) * K;
    for (int j = threadIdx.x; j < K; j += kThreads) {
      if (d.out_slots) d.out_slots[at + j] = kPadding;
      if (d.page_table) d.page_table[at + j] = kPadding;
    }
    if (threadIdx.x == 0 && d.plan.summary) {
      int* sum = d.plan.summary + static_cast<size_t>(i) * 3;
      sum[0] = kPadding;
      sum[1] = -1;
      sum[2] = 0;
    }
  }
}

// Step 6 (rule 2's copy, spread over the grid): publishes the row's queue chunks, those after
// its own share. One atomic reserves the queue entries and counts the row as published; the
// entries are written after it (a consumer that takes one of them waits for it, and the END
// entries lie past every reservation, so the order does not matter). The publishing warp of the
// block that publishes the launch's last row also writes the END entries.
__device__ __forceinline__ void PublishChunks(const ResolveParams& p, const PlanCtx& c, int i, int batch, int M,
                                              const FetchSplit& f) {
  const int rw = p.chunk_records;
  const int lane = c.lane;
  const int nq = f.nq;
  if (nq > 0) __syncthreads();  // every thread's plan entries are written
  if (c.warp == kPublishWarp) {
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
    const bool last = static_cast<unsigned>(old >> 32) == static_cast<unsigned>(batch - 1);
    if (nq > 0) {
      // Orders the block's plan writes (through the barrier above) before the entries:
      // consumers read them with ld.acquire.
      __threadfence();
      for (int ch = lane; ch < nq; ch += 32) {
        const int start = f.direct + ch * rw;
        const int cnt = M - start < rw ? M - start : rw;
        const unsigned long long e =
            static_cast<unsigned long long>(i + 1) | (static_cast<unsigned long long>(start << 6 | cnt) << 32);
        StRelaxed(&p.queue[qbase + ch], e);
      }
    }
    if (last) WriteEnds(p, qbase + static_cast<unsigned>(nq));
  }
}

// Step 6, the block's own share (rule 2's copy): warp w < ndirect copies the row's own chunk w,
// whose records shared memory names (written before the last barrier).
template <int UPR>
__device__ __forceinline__ void CopyOwnChunks(const ResolveParams& p, const PlanCtx& c, int row, const FetchSplit& f,
                                              const int* fetch_pos, const int* fetch_slot) {
  const ResolveDesc& d = p.d;
  const ArenaGeometry& g = d.arena.geometry;
  const int lane = c.lane, warp = c.warp;
  if (warp < f.ndirect) {
    const int start = warp * f.per;
    const int cnt = f.direct - start < f.per ? f.direct - start : f.per;
    const ChunkSource src = SourceTable(d.host, g, row, d.layer);
    long long so = 0, dof = 0;
    if (lane < cnt) {
      so = SourceOf(d.host, src, fetch_pos[start + lane], g.record_bytes);
      dof = static_cast<long long>(fetch_slot[start + lane]) * g.record_bytes;
    }
    CopyChunk<UPR, kDirectUnroll>(d.arena.Record(row, d.layer, 0), so, dof, cnt, static_cast<int>(g.record_bytes / 16));
  }
}

// Plans batch entry i (a row block), publishes its fetch work and copies its first chunks.
template <int UPR>
__device__ void PlanRow(const ResolveParams& p, int i, int batch, int row, int seq, bool first, unsigned char* smem) {
  const ResolveDesc& d = p.d;
  const PlanCtx c = MakePlanCtx(p, smem);
  if (!first) __syncthreads();  // shared memory of the previous row of this block is free
  int* out = d.out_slots ? d.out_slots + static_cast<size_t>(i) * c.K : nullptr;
  int* pt = d.page_table ? d.page_table + static_cast<size_t>(i) * c.K : nullptr;
  uint32_t err = StageRow(p, c, i, row, seq);
  const int newest = seq - 1;
  if (err == 0) err = InsertSelections(c, seq, newest);
  RowTotals t{};
  const size_t rl = d.arena.RowLayer(row, d.layer);
  if (err == 0) {
    FindHits(c, newest);
    const WarpSegments w = BallotSegments(p, c);
    t = SumTotals(c);
    RankMisses(c, w, t.run_k);
    PlaceVictims(c, w, t, d.arena.lru + rl * c.B);
    __syncthreads();
  } else {
    CpAsyncWaitAll();  // tables still in flight must land before shared memory is reused
    RejectRow(p, c, i, row, out, pt, err);
  }
  const int M = t.M;
  const FetchSplit f = SplitFetch(p, M);
  // Step 5a when the row queues chunks (M is the block's: the branch is uniform).
  const bool ordered = p.address_order && f.nq > 0 && c.K >= kAddressOrderMinK;
  const int* fetch_pos = c.miss_pos;
  const int* fetch_slot = c.miss_slot;
  if (ordered) {
    int* own_pos = reinterpret_cast<int*>(c.table) + kOrderBuckets;
    int* own_slot = own_pos + kWarps * kMaxChunkRecords;
    OrderMisses(c, M, seq, p.plan + static_cast<size_t>(i) * c.K, f.direct, own_pos, own_slot);
    fetch_pos = own_pos;
    fetch_slot = own_slot;
  }
  if (err == 0) {
    WriteOutputs(p, c, i, row, out, pt, d.arena.slot_pos + rl * c.B, f, ordered);
    if (c.tid == 0) CountRow(p, c, i, row, t);
  }
  PublishChunks(p, c, i, batch, M, f);
  CopyOwnChunks<UPR>(p, c, row, f, fetch_pos, fetch_slot);
}

// Consumer warp `consumer` of the grid's W: take queue entries until its END. The first entry is
// this warp's fixed one (W - 1 - consumer); the later ones are W + the take counter.
template <int UPR>
__device__ void Consume(const ResolveParams& p, unsigned consumer) {
  const ResolveDesc& d = p.d;
  const int lane = threadIdx.x & 31;
  const int K = d.arena.geometry.k;
  const uint32_t rb = d.arena.geometry.record_bytes;
  const unsigned warps = static_cast<unsigned>(p.end_count);
  bool first = true;
  for (;;) {
    unsigned long long e = 0;
    if (lane == 0) {
      const unsigned h = first ? warps - 1u - consumer : warps + atomicAdd(&p.hdr->qhead, 1u);
      unsigned long long* q = &p.queue[h];
      unsigned ns = 32;
      while ((e = LdAcquire(q)) == 0) {
        __nanosleep(ns);
        if (ns < kPollMaxNs) ns <<= 1;
      }
      *reinterpret_cast<volatile unsigned long long*>(q) = 0;
      if (!first && static_cast<unsigned>(e) == kEndTag && h == static_cast<unsigned>(e >> 32) + warps - 1u) {
        // The last index of this launch, taken from the counter: every other take from it is
        // done (it returned a smaller index). Reset the take counter (the last planner reset
        // pub). Without chunks the last index is a fixed one and the counter was never taken.
        *reinterpret_cast<volatile unsigned*>(&p.hdr->qhead) = 0;
      }
    }
    first = false;
    __syncwarp();
    e = __shfl_sync(~0u, e, 0);
    if (static_cast<unsigned>(e) == kEndTag) break;
    const int i = static_cast<int>(e & 0xffffffffu) - 1;
    const unsigned hi = static_cast<unsigned>(e >> 32);
    const int start = static_cast<int>(hi >> 6);
    const int cnt = static_cast<int>(hi & 63);
    const int row = __ldg(d.rows + i);
    const ChunkSource src = SourceTable(d.host, d.arena.geometry, row, d.layer);
    long long so = 0, dof = 0;
    if (lane < cnt) {
      const int2 pe = __ldcg(p.plan + static_cast<size_t>(i) * K + start + lane);
      so = SourceOf(d.host, src, pe.x, rb);
      dof = static_cast<long long>(pe.y) * rb;
    }
    CopyChunk<UPR, kConsumeUnroll>(d.arena.Record(row, d.layer, 0), so, dof, cnt, static_cast<int>(rb / 16));
  }
}

template <int UPR>
// One block per SM (shared memory allows no more at k = 2048 anyway; registers stay unbounded).
__global__ void __launch_bounds__(kThreads, 1) ResolveKernel(const ResolveParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int b = blockIdx.x;
  if (p.early_dependents) internal::LetDependentsLaunch();  // ResolveLaunchConfig::early_dependents
  if (!p.beside) internal::WaitForPriorGrid();              // before any global access (a programmatic launch)
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
  if (b == 0 && threadIdx.x == 0 && p.d.plan.summary) *p.d.plan.batch = batch;
  if (b < p.planner_blocks) {
    for (int i = b; i < batch; i += p.planner_blocks) {
      if (i != b) {
        row = p.d.rows[i];
        seq = p.d.seq_lens[i];
      }
      PlanRow<UPR>(p, i, batch, row, seq, i == b, smem);
    }
    PadEntries(p, b, batch);
  }
  if (batch == 0 && b == 0 && threadIdx.x < 32) WriteEnds(p, 0u);
  const int consumer = static_cast<int>(threadIdx.x >> 5) - (kWarps - p.consumer_warps);  // the block's last warps
  if (consumer >= 0 && b < p.consumer_blocks) Consume<UPR>(p, static_cast<unsigned>(b * p.consumer_warps + consumer));
  // Beside the kernel before (LaunchOrder::kBeside): this grid completes only after that one, so
  // the stream's order holds for whatever comes next.
  if (p.beside) internal::WaitForPriorGrid();
}

// The RESOLVE kernel for a record size (its 16-byte units per record, 0: any size).
using ResolveKernelFn = void (*)(const ResolveParams);
ResolveKernelFn ResolveKernelFor(uint32_t record_bytes) {
  return internal::DispatchRecordBytes(record_bytes,
                                       [](auto upr) -> ResolveKernelFn { return ResolveKernel<decltype(upr)::value>; });
}

bool PreparedFor(const ResolveLaunchConfig& c, int device, const ArenaGeometry& g) {
  return c.device >= 0 && c.device == device && c.k == g.k && c.slots == g.slots && c.record_bytes == g.record_bytes &&
         c.draft_tokens == g.draft_tokens;
}

// Grid: every block must be able to be resident at once (consumers wait for the last planner),
// so planners are capped at the device's capacity for this kernel and loop over rows; helpers
// fill what capacity is left, one per SM at most; a budget (ResolveLaunchConfig::max_blocks) lowers
// the capacity. Helpers only consume, so none is added past ResolveLaunchConfig::consumer_blocks.
// Returns the grid; *planners gets the row blocks and *consumers the blocks that take queue chunks.
int GridBlocks(const ResolveLaunchConfig& c, int max_batch, int* planners, int* consumers) {
  const int sms = c.sms;
  int capacity = c.blocks_per_sm * sms;
  if (c.max_blocks > 0 && c.max_blocks < capacity) capacity = c.max_blocks;  // the caller's budget
  *planners = max_batch < capacity ? max_batch : capacity;
  int helpers = capacity - *planners;
  if (helpers > sms) helpers = sms;
  if (helpers > kMaxHelperBlocks) helpers = kMaxHelperBlocks;
  if (c.consumer_blocks > 0 && *planners + helpers > c.consumer_blocks) {
    helpers = c.consumer_blocks > *planners ? c.consumer_blocks - *planners : 0;
  }
  const int grid = *planners + helpers;
  *consumers = c.consumer_blocks > 0 && c.consumer_blocks < grid ? c.consumer_blocks : grid;
  return grid;
}

// Consumer warps a consumer block gives (kConsumerWarps above): the config's where set, else the
// default, raised under a budget of blocks (max_blocks) until the grid has as many consumers as a
// launch on the whole GPU would (fewer consumer blocks, asked for, stay fewer consumers). A
// workspace has END entries for kConsumerWarps a block of the grid it was sized for: `end_room`.
int ConsumerWarps(const ResolveLaunchConfig& c, int consumer_blocks, int end_room) {
  int w = c.consumer_warps;
  if (w <= 0) {
    w = kConsumerWarps;
    if (c.max_blocks > 0 && c.consumer_blocks <= 0) {
      const int whole = kConsumerWarps * c.sms;
      w = (whole + consumer_blocks - 1) / consumer_blocks;
    }
  }
  if (w > kMaxConsumerWarps) w = kMaxConsumerWarps;
  if (w * consumer_blocks > end_room) w = end_room / consumer_blocks;
  return w < 1 ? 1 : w;
}

cudaError_t LaunchResolveGrid(ResolveParams p, const ResolveLaunchConfig& c, int ws_capacity, cudaStream_t stream) {
  const int grid = GridBlocks(c, p.d.max_batch, &p.planner_blocks, &p.consumer_blocks);
  p.consumer_warps = ConsumerWarps(c, p.consumer_blocks, (ws_capacity + kMaxHelperBlocks) * kConsumerWarps);
  p.end_count = p.consumer_blocks * p.consumer_warps;
  p.beside = internal::Beside(c);
  p.early_dependents = c.early_dependents;
  const cudaError_t e = internal::LaunchInOrder(ResolveKernelFor(p.d.arena.geometry.record_bytes), dim3(grid),
                                                dim3(kThreads), c.smem, stream, internal::Programmatic(c), p);
  return e != cudaSuccess ? internal::LaunchCallFailed(e) : internal::CheckLaunched();
}

// LaunchResolveShapeOnly's kernel: nothing but the launch.
__global__ void __launch_bounds__(kThreads, 1) ShapeOnlyKernel() {}

// LaunchResolveMemoryFloor's kernel: a row block's global traffic of a no-IO step, no planning.
// It stages what StageRow stages (selections, slot table, LRU order; the row and its capacity
// first), then writes the LRU order back unchanged and k outputs, computed from both staged tables
// so that no load can be skipped, into `scratch`. Blocks without rows return at once.
__global__ void __launch_bounds__(kThreads, 1) MemoryFloorKernel(const ResolveDesc d, int planners, int* scratch) {
  extern __shared__ __align__(16) unsigned char smem[];
  internal::WaitForPriorGrid();
  if (static_cast<int>(blockIdx.x) >= planners) return;
  const ArenaGeometry& g = d.arena.geometry;
  const int B = g.slots, K = g.k;
  int* sel = reinterpret_cast<int*>(smem);
  int* sp = sel + AlignUp(K, 4);
  int* lru = sp + AlignUp(B, 4);
  int batch = *d.batch_size;
  if (batch > d.max_batch) batch = d.max_batch;
  for (int i = blockIdx.x; i < batch; i += planners) {
    const int row = d.rows[i];
    if (row < 0 || row >= g.max_rows || d.layer < 0 || d.layer >= g.num_layers) continue;
    const int cap = d.host.capacity[row];
    const size_t rl = d.arena.RowLayer(row, d.layer);
    StageInts(sel, d.positions + static_cast<size_t>(i) * K, K);
    StageInts(sp, d.arena.slot_pos + rl * B, B);
    StageInts(lru, d.arena.lru + rl * B, B);
    CpAsyncWaitAll();
    __syncthreads();
    int* out = d.arena.lru + rl * B;
    for (int s = threadIdx.x; s < B; s += kThreads) out[s] = lru[s];
    int* o = scratch + static_cast<size_t>(i) * K;
    for (int j = threadIdx.x; j < K; j += kThreads) o[j] = (sel[j] ^ sp[j % B]) + cap;
    __syncthreads();  // shared memory is reused by the block's next row
  }
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
// At most one block per SM runs (blocks <= SMs), so the bound lets ptxas use the registers it
// needs (no spills).
__global__ void __launch_bounds__(kReplayThreads, 1) ReplayKernel(const ReplayDesc d, int chunk_records) {
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
    if (misses < 0) {  // the anchor rejected this entry (or it is padding) and left its state alone
      // A rejected entry counts as this layer's RESOLVE would count it (rule 6): rejected.
      if (row != kPadding && blockIdx.x == 0 && tid == 0) {
        atomicAdd(reinterpret_cast<unsigned long long*>(&a.counters->rejected), 1ull);
      }
      continue;
    }
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
    const int2* e = reinterpret_cast<const int2*>(d.plan.entries) + i * MissPlan::EntriesPerRow(g);
    const ChunkSource src = SourceTable(d.host, g, row, d.layer);
    uint8_t* dst = a.Record(row, d.layer, 0);
    for (int c = blockIdx.x * kReplayWarps + warp; c < nch; c += gridDim.x * kReplayWarps) {  // warp-uniform
      const int start = c * rw;
      const int cnt = misses - start < rw ? misses - start : rw;
      long long so = 0, dof = 0;
      if (lane < cnt) {
        const int2 pe = __ldg(e + start + lane);
        so = SourceOf(d.host, src, pe.x, rb);
        dof = static_cast<long long>(pe.y) * rb;
      }
      CopyChunk<UPR, kConsumeUnroll>(dst, so, dof, cnt, static_cast<int>(rb / 16));
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
  return internal::DispatchRecordBytes(record_bytes,
                                       [](auto upr) -> ReplayKernelFn { return ReplayKernel<decltype(upr)::value>; });
}

}  // namespace

size_t ResolveWorkspaceBytes(const ArenaGeometry& g, int max_batch) {
  if (g.k < 1 || g.record_bytes < 16 || max_batch < 0) return 0;
  if (g.draft_tokens != 0) return internal::MultiQueryWorkspaceBytes(g, max_batch);
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
  c.draft_tokens = g.draft_tokens;
  cudaError_t e = cudaGetDevice(&c.device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, c.device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&c.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, c.device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&c.cc_major, cudaDevAttrComputeCapabilityMajor, c.device);
  if (e != cudaSuccess) {
    internal::SetLaunchError(cudaGetErrorName(e));
    return e;
  }
  if (g.draft_tokens != 0) {  // the multi-query kernels (resolve_multi.cu)
    if ((e = internal::PrepareMultiQueryLaunch(g, &c)) != cudaSuccess) return e;
    *config = c;
    internal::SetLaunchError("");
    return cudaSuccess;
  }
  const SmemLayout sm = ComputeSmem(g, HashBitsFor(g, c.smem_optin));
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
  if (!d.batch_size || !d.rows || !d.seq_lens || !d.positions || (!d.out_slots && !d.page_table) || !d.host.page_base ||
      !d.host.capacity || !d.arena.slot_pos || !d.arena.lru || !d.arena.records || !d.arena.counters) {
    return internal::FailLaunch("a RESOLVE descriptor pointer is null");
  }
  if (const char* why = internal::CheckHostMap(d.host)) return internal::FailLaunch(why);
  if (d.page_table) {
    if (const char* why = ValidatePageTable(g, d.page_records, d.page_offset)) return internal::FailLaunch(why);
  }
  if (d.plan.summary && (!d.plan.batch || !d.plan.entries || d.plan.max_batch < d.max_batch)) {
    return internal::FailLaunch("the miss plan is incomplete or smaller than max_batch");
  }
  if (d.max_batch == 0) {
    internal::SetLaunchError("");
    return cudaSuccess;
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
    asked.address_order = config.address_order;
    asked.order = config.order;
    asked.max_blocks = config.max_blocks;
    asked.consumer_blocks = config.consumer_blocks;
    asked.consumer_warps = config.consumer_warps;
    asked.early_dependents = config.early_dependents;
    c = &asked;
  }
  // Multi-query steps (rule 8) have their own kernels (resolve_multi.cu); this one stays n = 0's.
  if (g.draft_tokens != 0) return internal::LaunchMultiQueryResolve(d, workspace, workspace_bytes, *c, stream);
  const int capacity = WsCapacity(g, workspace_bytes);
  if (!workspace || capacity < d.max_batch) {
    std::snprintf(buf, sizeof buf, "RESOLVE workspace too small: %zu bytes, needs %zu", workspace_bytes,
                  ComputeWsLayout(g, d.max_batch).total);
    return internal::FailLaunch(buf);
  }
  const WsLayout ws = ComputeWsLayout(g, capacity);
  const int hash_bits = HashBitsFor(g, c->smem_optin);
  const SmemLayout sm = ComputeSmem(g, hash_bits);
  ResolveParams p{};
  p.d = d;
  uint8_t* base = static_cast<uint8_t*>(workspace);
  p.hdr = reinterpret_cast<WsHeader*>(base);
  p.plan = reinterpret_cast<int2*>(base + ws.plan);
  p.queue = reinterpret_cast<unsigned long long*>(base + ws.queue);
  p.hash_bits = hash_bits;
  p.chunk_records = ChunkRecords(g.record_bytes);
  p.direct_records = DirectRecords(g.record_bytes);
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
  p.off_filter = sm.off_filter;
  p.filter_bits = FilterBits(g.k);
  p.seg_k = SegmentItems(g.k);
  p.seg_b = SegmentItems(g.slots);
  p.address_order = c->address_order && d.max_batch >= kAddressOrderMinBatch;
  return LaunchResolveGrid(p, *c, capacity, stream);
}

cudaError_t LaunchResolveShapeOnly(const ResolveLaunchConfig& config, int max_batch, cudaStream_t stream) {
  if (config.device < 0 || config.draft_tokens != 0 || config.blocks_per_sm < 1 || max_batch < 1) {
    return internal::FailLaunch("LaunchResolveShapeOnly: a prepared single-query config and max_batch >= 1");
  }
  cudaError_t e = cudaFuncSetAttribute(ShapeOnlyKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, config.smem_optin);
  if (e != cudaSuccess) {
    internal::SetLaunchError(cudaGetErrorName(e));
    return e;
  }
  int planners = 0, consumers = 0;
  ShapeOnlyKernel<<<GridBlocks(config, max_batch, &planners, &consumers), kThreads, config.smem, stream>>>();
  return internal::CheckLaunched();
}

cudaError_t LaunchResolveMemoryFloor(const ResolveDesc& d, const ResolveLaunchConfig& config, int32_t* scratch,
                                     cudaStream_t stream) {
  const ArenaGeometry& g = d.arena.geometry;
  if (!PreparedFor(config, config.device, g) || config.draft_tokens != 0 || config.blocks_per_sm < 1 ||
      d.max_batch < 1 || !scratch || !d.batch_size || !d.rows || !d.positions || !d.arena.slot_pos || !d.arena.lru ||
      !d.host.capacity) {
    return internal::FailLaunch(
        "LaunchResolveMemoryFloor: a single-query config prepared for d's geometry, max_batch >= 1, scratch and "
        "d's inputs and tables");
  }
  const size_t need = (AlignUp(static_cast<size_t>(g.k), 4) + 2 * AlignUp(static_cast<size_t>(g.slots), 4)) * 4;
  if (need > config.smem) {
    return internal::FailLaunch("LaunchResolveMemoryFloor: the staged tables exceed RESOLVE's shared memory");
  }
  cudaError_t e =
      cudaFuncSetAttribute(MemoryFloorKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, config.smem_optin);
  if (e != cudaSuccess) {
    internal::SetLaunchError(cudaGetErrorName(e));
    return e;
  }
  int planners = 0, consumers = 0;
  const int grid = GridBlocks(config, d.max_batch, &planners, &consumers);
  e = internal::LaunchInOrder(MemoryFloorKernel, dim3(grid), dim3(kThreads), config.smem, stream,
                              internal::Programmatic(config), d, planners, static_cast<int*>(scratch));
  return e != cudaSuccess ? internal::LaunchCallFailed(e) : internal::CheckLaunched();
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
  if (!d.plan.batch || !d.plan.summary || !d.plan.entries || !d.host.page_base || !d.arena.slot_pos || !d.arena.lru ||
      !d.arena.records || !d.arena.counters) {
    return internal::FailLaunch("a replay descriptor pointer is null");
  }
  if (const char* why = internal::CheckHostMap(d.host)) return internal::FailLaunch(why);
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
