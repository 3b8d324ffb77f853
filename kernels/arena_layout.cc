// Geometry validation for the slot arena (arena_layout.h, resolve.h).
#include <cstdint>

#include "hisparse/kernels/arena_layout.h"
#include "hisparse/kernels/resolve.h"

namespace hisparse {

const char* ValidateArenaGeometry(const ArenaGeometry& g) {
  if (g.max_rows < 1) return "max_rows must be >= 1";
  if (g.num_layers < 1) return "num_layers must be >= 1";
  if (g.k < 1) return "k must be >= 1";
  // RESOLVE relies on B >= k: every miss of a step then finds a slot that holds no hit.
  if (g.slots < g.k) return "slots (B) must be >= k";
  if (g.draft_tokens < 0 || g.draft_tokens > kMaxDraftTokens) return "draft_tokens must be in [0, 7]";
  if (g.record_bytes < kRecordAlign || g.record_bytes > kMaxRecordBytes) {
    return "record_bytes must be in [16, 16384]";
  }
  // 16-byte records let a warp move a record with 16-byte loads and keep every slot aligned.
  if (g.record_bytes % kRecordAlign != 0) return "record_bytes must be a multiple of 16";
  return nullptr;
}

const char* ValidatePageTable(const ArenaGeometry& g, int32_t page_records, int32_t page_offset) {
  if (page_records < 1) return "page_records must be >= 1";
  if (page_offset < 0) return "page_offset must be >= 0";
  // Every record slot of every (row, layer), the 1 + draft_tokens tail slots included (rule 9).
  const int64_t records = static_cast<int64_t>(g.max_rows) * g.num_layers * static_cast<int64_t>(g.RecordSlots());
  if (static_cast<int64_t>(page_offset) * page_records + records - 1 > INT32_MAX) {
    return "page table entries overflow int32: page_offset * page_records + the arena's records must be <= 2^31";
  }
  return nullptr;
}

}  // namespace hisparse
