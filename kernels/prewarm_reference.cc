// PREWARM's CPU reference (prewarm.h): the contract's reads, rule by rule, on host memory.
#include <cstdint>
#include <cstring>

#include "hisparse/kernels/prewarm.h"

namespace hisparse {

const char* CheckPrewarmDesc(const PrewarmDesc& d) {
  const ArenaGeometry& g = d.geometry;
  if (g.record_bytes == 0 || g.record_bytes % 16 != 0) return "record_bytes must be a positive multiple of 16";
  if (d.layer < 0 || d.layer >= g.num_layers) return "layer outside [0, num_layers)";
  if (d.max_batch < 0) return "max_batch < 0";
  if (d.batch_size == nullptr) return "batch_size is null";
  if (d.max_batch > 0 && (d.rows == nullptr || d.seq_lens == nullptr)) return "rows or seq_lens is null";
  if (d.host.page_base == nullptr || d.host.capacity == nullptr) return "the host map has no tables";
  if (d.host.records_per_page == 0 || d.host.pages_per_entry == 0) return "the host map has no pages";
  if (d.max_positions < 1) return "max_positions < 1";
  if (d.granule_bytes < 16 || d.granule_bytes > (1u << 30) || (d.granule_bytes & (d.granule_bytes - 1)) != 0) {
    return "granule_bytes must be a power of two in [16, 1 GiB]";
  }
  if (d.granule_stride == 0 || d.granule_phase >= d.granule_stride) {
    return "granule_stride must be >= 1 and granule_phase below it";
  }
  if (d.max_blocks < 0) return "max_blocks < 0";
  return nullptr;
}

uint32_t PrewarmReference(const PrewarmDesc& d) {
  const int32_t batch = *d.batch_size < 0 ? 0 : (*d.batch_size > d.max_batch ? d.max_batch : *d.batch_size);
  uint32_t bits = 0;
  uint64_t reads = 0, folded = 0;
  for (int32_t i = 0; i < batch; ++i) {  // rule 3: entries past the batch read nothing
    const int32_t row = d.rows[i], seq_len = d.seq_lens[i];
    if (row == kPadding) continue;  // rule 1
    if (const uint32_t e = PrewarmEntryError(d, row, seq_len); e != 0) {
      bits |= e;
      continue;
    }
    uint8_t* const* table = d.host.Table(d.geometry, row, d.layer);
    for (uint64_t pg = 0;; ++pg) {  // rule 2
      const uint64_t used = PrewarmPageBytes(d, seq_len, pg);
      if (used == 0) break;
      const uint8_t* base = HostRecordMap::PageAddress(table[pg]);
      const uintptr_t page = reinterpret_cast<uintptr_t>(base);
      const uint64_t n = PrewarmReadsOfPage(page, used, d.granule_bytes);
      for (uint64_t j = 0; j < n; ++j) {
        const uintptr_t at = PrewarmReadAt(page, d.granule_bytes, j);
        if (!PrewarmReadTaken(d, at)) continue;
        uint64_t half[2];
        std::memcpy(half, base + (at - page), sizeof half);  // the read's address, from the page's pointer
        folded ^= half[0] ^ half[1];
        ++reads;
      }
    }
  }
  if (d.digest != nullptr) {  // rule 4
    d.digest[0] += reads;
    d.digest[1] ^= folded;
  }
  if (d.error_flags != nullptr) *d.error_flags |= bits;
  return bits;
}

}  // namespace hisparse
