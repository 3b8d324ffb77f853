// PREWARM: the GPU's translations of a layer's host records, made ahead of the RESOLVE that will
// fetch from them. One 16-byte read in every translation granule (64 KiB by default) of the host
// records that rows' RESOLVE of one layer may fetch: nothing is written, no slot, table or counter
// changes, and the bytes read are discarded (or folded into a digest a test can check).
//
// Why it is here: a RESOLVE whose misses lie in host pages the GPU has not translated lately waits
// for those translations, and on a host where warm reads of mapped memory beat cold ones the fetch
// then runs at ~0.42 of the link instead of ~0.76. The GPU translates host memory 64 KiB at a time
// whatever the host's page size (huge pages included), keeps more than 30,000 translations, and makes
// none while the step's MoE runs. A window's RESOLVE with its pages read ahead took its warm time,
// 121-124 us against 175 cold, even with a whole other window's pages translated in between
// (bench/RESULTS.md, "Translations made ahead shorten RESOLVE to its warm time"). Reading every page
// of the rows' layer needs no prediction of which records will miss. The call itself costs ~37
// translations a us (the GPU makes them one after another), so it pays only off the step's path and
// close before the RESOLVE it serves. In the example engine's serving step no such place was found: a
// side stream forked in a captured graph cost the programmatic overlap; beside a split attention or
// the first expert GEMM the reads outlasted the kernel; leading the MoE they landed on the path, and
// the translations made ~1 ms ahead had gone by the next layer's RESOLVE (docs/INTEGRATION.md,
// "Hiding the misses"; bench/RESULTS.md, "Translations made ahead, in the step" and "Read ahead in
// the MoE").
//
// The contract, for every batch entry i < *batch_size (read at run time, clamped to [0, max_batch],
// so one captured graph serves every batch):
//  1. rows[i] == -1 (padding) reads nothing and is no error. A row outside [-1, max_rows) or with
//     capacity 0 (not admitted) reads nothing and ORs kResolveBadRow; a seq_lens[i] outside
//     [1, min(capacity, max_positions)] reads nothing and ORs kResolveBadSeqLen (resolve.h's bits).
//  2. Otherwise page pg < ceil(seq_len / R) of the table of (rows[i], layer) holds n = min(R,
//     seq_len - pg * R) of the entry's positions, from its address a (bit 0, read-only, cleared) up
//     to a + n * record_bytes = e. The page is read at a, and at every multiple m of granule_bytes
//     with a < m < e: one read in every granule the positions' records touch, each 16 bytes, aligned
//     and inside the records (a, e and m are multiples of 16).
//     Of these reads, only those in a granule g (an address's / granule_bytes) with g % granule_stride
//     == granule_phase are made: one granule in granule_stride, the same ones whatever the launch, so
//     that a read ahead fits the time beside a kernel it runs with (an engine's split attention).
//  3. Entries at or past *batch_size read nothing. Rows may repeat (their reads repeat).
//  4. digest, when given (device memory on the CUDA path), gets digest[0] += the number of reads
//     and digest[1] ^= the XOR of every read's two 64-bit halves: for the same records the CUDA
//     kernel and the CPU reference leave the same digest.
// It may run beside any kernel, RESOLVE, appends and stores included: it writes nothing but the
// error flags and the digest (a digest taken while records change is meaningless, nothing else is).
#ifndef HISPARSE_KERNELS_PREWARM_H_
#define HISPARSE_KERNELS_PREWARM_H_

#include <stddef.h>
#include <stdint.h>

#include "hisparse/kernels/arena_layout.h"
#include "hisparse/kernels/resolve.h"

namespace hisparse {

// The GPU's translation granule of host memory, as measured (bench/RESULTS.md).
inline constexpr uint32_t kPrewarmDefaultGranule = 64u << 10;
// Reads one thread of the kernel makes of one page at most (a page of more granules takes several).
inline constexpr uint32_t kPrewarmReadsPerThread = 8;

struct PrewarmDesc {
  ArenaGeometry geometry;               // the session's (layers, rows, record_bytes)
  HostRecordMap host;                   // where positions live in the host pool
  int32_t layer = 0;                    // in [0, num_layers)
  int32_t max_batch = 0;                // capacity of the arrays below, >= 0
  const int32_t* batch_size = nullptr;  // int32 [1] read at run time; required (a backend supplies max_batch)
  const int32_t* rows = nullptr;        // [max_batch] arena rows, -1: padding
  const int32_t* seq_lens = nullptr;    // [max_batch] positions of each row's records to read
  int32_t max_positions = 0;            // >= 1: no row's capacity exceeds it (the kernel's index space)
  uint32_t granule_bytes = kPrewarmDefaultGranule;  // a power of two in [16, 1 GiB]
  uint32_t granule_stride = 1;                      // >= 1: read one granule in granule_stride (rule 2)
  uint32_t granule_phase = 0;                       // < granule_stride: which one
  int32_t max_blocks = 0;                           // CUDA thread blocks to read with; 0: an eighth of the SMs
  // How the CUDA launch orders itself after the kernel before it in the stream (resolve.h): kBeside
  // runs beside it and completes after it (every block waits for it last), kProgrammatic waits for
  // it first; the reads are the same in every order, and the reference ignores it.
  LaunchOrder order = LaunchOrder::kAfterCompletion;
  uint32_t* error_flags = nullptr;  // OR of ResolveError bits (rule 1); may be null
  uint64_t* digest = nullptr;       // [2] (rule 4); may be null
};

// Null when `d` can run, else a static message naming what is wrong: a layer outside
// [0, num_layers), max_batch < 0, a null array (batch_size, and rows and seq_lens when max_batch >
// 0; the host map's page_base and capacity), max_positions < 1, a granule that is not a power of
// two in [16, 1 GiB], a granule_stride of 0 or a granule_phase not below it, max_blocks < 0, or a
// record size that is not a positive multiple of 16.
const char* CheckPrewarmDesc(const PrewarmDesc& d);

// The contract on host memory: reads what rule 2 reads (plain loads), updates the digest when given,
// and returns the ResolveError bits of rule 1 (also ORed into error_flags when given). `d` must pass
// CheckPrewarmDesc.
uint32_t PrewarmReference(const PrewarmDesc& d);

// Rule 2's reads of one page of `used` bytes from `page` (16-byte aligned, used > 0, a multiple of
// 16): the first at the page itself, then one at each multiple of the granule inside it.
HISPARSE_HD inline uint64_t PrewarmReadsOfPage(uintptr_t page, uint64_t used, uint32_t granule) {
  const uint64_t first_boundary = (static_cast<uint64_t>(page) / granule + 1) * granule;
  const uint64_t end = static_cast<uint64_t>(page) + used;
  return 1 + (first_boundary < end ? (end - first_boundary + granule - 1) / granule : 0);
}
// Read j of that page (j < PrewarmReadsOfPage).
HISPARSE_HD inline uintptr_t PrewarmReadAt(uintptr_t page, uint32_t granule, uint64_t j) {
  return j == 0 ? page : static_cast<uintptr_t>((static_cast<uint64_t>(page) / granule + j) * granule);
}
// Whether rule 2 makes read j at `at` (its granule is one of the stride's).
HISPARSE_HD inline bool PrewarmReadTaken(const PrewarmDesc& d, uintptr_t at) {
  return (static_cast<uint64_t>(at) / d.granule_bytes) % d.granule_stride == d.granule_phase;
}
// Rule 1's check of entry (row, seq_len): 0 when its records are read, else the ResolveError bit.
HISPARSE_HD inline uint32_t PrewarmEntryError(const PrewarmDesc& d, int32_t row, int32_t seq_len) {
  if (row < 0 || row >= d.geometry.max_rows) return kResolveBadRow;
  const int32_t cap = d.host.capacity[row];
  if (cap <= 0) return kResolveBadRow;
  if (seq_len < 1 || seq_len > cap || seq_len > d.max_positions) return kResolveBadSeqLen;
  return 0;
}
// The records of page pg of an entry of seq_len positions, in bytes (0: past its last page).
HISPARSE_HD inline uint64_t PrewarmPageBytes(const PrewarmDesc& d, int32_t seq_len, uint64_t pg) {
  const uint64_t first = pg * d.host.records_per_page;
  if (first >= static_cast<uint64_t>(seq_len)) return 0;
  const uint64_t n = static_cast<uint64_t>(seq_len) - first;
  return (n < d.host.records_per_page ? n : d.host.records_per_page) * d.geometry.record_bytes;
}

// The kernel's index space: the pages of one entry's table that may hold positions below
// max_positions, and the most reads rule 2 makes of one of them.
inline uint64_t PrewarmMaxPages(const PrewarmDesc& d) {
  const uint64_t pages =
      (static_cast<uint64_t>(d.max_positions) + d.host.records_per_page - 1) / d.host.records_per_page;
  return pages < d.host.pages_per_entry ? pages : d.host.pages_per_entry;
}
inline uint64_t PrewarmMaxReadsOfPage(const PrewarmDesc& d) {
  const uint64_t r = static_cast<uint64_t>(d.max_positions) < d.host.records_per_page
                         ? static_cast<uint64_t>(d.max_positions)
                         : d.host.records_per_page;
  return 1 + (r * d.geometry.record_bytes + d.granule_bytes - 1) / d.granule_bytes;
}

}  // namespace hisparse

#endif  // HISPARSE_KERNELS_PREWARM_H_
