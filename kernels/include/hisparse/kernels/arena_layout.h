// The slot arena layout: one documented layout shared by the CUDA kernels, the CPU reference and
// the daemon (which reads the counters for stats).
//
// A session's arena holds, for every (request row r, layer l), B record slots plus 1 + n tail slots
// for the newest tokens (n = draft_tokens, 0 without speculative decoding: one tail slot B), the
// slot -> position table and the LRU order over the B regular slots. Rows are
// the session's request rows (0 .. max_rows-1); the daemon assigns a row when it admits a request.
//
// One arena is one contiguous allocation (a memfd in the host-emulated backend, a CUDA VMM
// allocation on a GPU) laid out as four sections, each 256-byte aligned:
//
//   counters   ArenaCounters                                   (hits, misses, bytes fetched)
//   slot_pos   int32 [max_rows][layers][B]                     position held by a slot, kEmpty = -1
//   lru        int32 [max_rows][layers][B]                     slot ids, least -> most recently used
//   records    uint8 [max_rows][layers][B + 1 + n][record_bytes]  slots B..B+n: the tail slots
//
// Invariants of every (row, layer): lru is a permutation of 0..B-1; EMPTY slots precede every
// filled slot in lru; a position is held by at most one slot; every filled slot's record equals
// the host pool's record for its position, byte for byte.
//
// Plain C-compatible structs only: this header is included by .cu, .cc and the daemon.
#ifndef HISPARSE_KERNELS_ARENA_LAYOUT_H_
#define HISPARSE_KERNELS_ARENA_LAYOUT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define HISPARSE_HD __host__ __device__
#else
#define HISPARSE_HD
#endif

namespace hisparse {

inline constexpr int32_t kEmptySlot = -1;     // slot_pos value of a slot that holds nothing
inline constexpr int32_t kPadding = -1;       // a padding selection, and its output slot
inline constexpr uint32_t kRecordAlign = 16;  // record_bytes is a multiple of this
inline constexpr uint32_t kMaxRecordBytes = 16384;
inline constexpr size_t kArenaSectionAlign = 256;
inline constexpr int32_t kMaxDraftTokens = 7;  // draft_tokens in [0, 7]: up to 8 query tokens a step

// Counters that RESOLVE adds to (atomically on the GPU). Read by the daemon for stats.
struct ArenaCounters {
  uint64_t hits;           // selected positions found resident (newest token included)
  uint64_t misses;         // selected positions fetched from the host pool
  uint64_t bytes_fetched;  // misses * record_bytes
  uint64_t steps;          // RESOLVE row-steps executed (one per (row, layer) per launch)
  uint64_t rejected;       // RESOLVE row-steps refused as invalid (resolve.h; padding is not counted)
  uint64_t reserved[3];
};

// The arena's geometry; everything else about the layout follows from it.
struct ArenaGeometry {
  int32_t max_rows;          // request rows in the session
  int32_t num_layers;        // sparse layers
  int32_t slots;             // B, >= k
  int32_t k;                 // selections per (row, layer, step)
  uint32_t record_bytes;     // bytes of one KV record, multiple of 16, <= 16 KiB
  int32_t draft_tokens = 0;  // n: speculative tokens per step, [0, kMaxDraftTokens]; 0 = one query
                             // token per step. Rows hold 1 + n tail slots B..B+n (resolve.h rule 8)

  // Tail slots of every (row, layer): the newest 1 + n tokens of a step.
  HISPARSE_HD int32_t TailSlots() const { return 1 + draft_tokens; }
  // Record slots of every (row, layer): B regular + tail slots.
  HISPARSE_HD size_t RecordSlots() const { return static_cast<size_t>(slots) + 1 + draft_tokens; }
};

// Byte offsets of the sections inside the arena.
struct ArenaOffsets {
  size_t counters;
  size_t slot_pos;
  size_t lru;
  size_t records;
  size_t total_bytes;
};

HISPARSE_HD inline size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

HISPARSE_HD inline ArenaOffsets ComputeArenaOffsets(const ArenaGeometry& g) {
  ArenaOffsets o{};
  const size_t tables = static_cast<size_t>(g.max_rows) * g.num_layers * g.slots * sizeof(int32_t);
  o.counters = 0;
  o.slot_pos = AlignUp(sizeof(ArenaCounters), kArenaSectionAlign);
  o.lru = AlignUp(o.slot_pos + tables, kArenaSectionAlign);
  o.records = AlignUp(o.lru + tables, kArenaSectionAlign);
  o.total_bytes = AlignUp(o.records + static_cast<size_t>(g.max_rows) * g.num_layers * g.RecordSlots() * g.record_bytes,
                          kArenaSectionAlign);
  return o;
}

// Typed views of one arena in some address space (host or device). Built by ArenaView::Of.
struct ArenaView {
  ArenaGeometry geometry;
  ArenaCounters* counters;
  int32_t* slot_pos;  // [max_rows][layers][B]
  int32_t* lru;       // [max_rows][layers][B]
  uint8_t* records;   // [max_rows][layers][B+1+draft_tokens][record_bytes]

  HISPARSE_HD static ArenaView Of(void* base, const ArenaGeometry& g) {
    const ArenaOffsets o = ComputeArenaOffsets(g);
    uint8_t* b = static_cast<uint8_t*>(base);
    ArenaView v;
    v.geometry = g;
    v.counters = reinterpret_cast<ArenaCounters*>(b + o.counters);
    v.slot_pos = reinterpret_cast<int32_t*>(b + o.slot_pos);
    v.lru = reinterpret_cast<int32_t*>(b + o.lru);
    v.records = b + o.records;
    return v;
  }
  // Index of (row, layer) in the [max_rows][layers] grid.
  HISPARSE_HD size_t RowLayer(int32_t row, int32_t layer) const {
    return static_cast<size_t>(row) * geometry.num_layers + layer;
  }
  HISPARSE_HD int32_t* SlotPos(int32_t row, int32_t layer) const {
    return slot_pos + RowLayer(row, layer) * geometry.slots;
  }
  HISPARSE_HD int32_t* Lru(int32_t row, int32_t layer) const { return lru + RowLayer(row, layer) * geometry.slots; }
  // Slot s of (row, layer); s in [B, B + 1 + draft_tokens) is a tail slot (B: the newest token).
  HISPARSE_HD uint8_t* Record(int32_t row, int32_t layer, int32_t s) const {
    return records + (RowLayer(row, layer) * geometry.RecordSlots() + s) * geometry.record_bytes;
  }
  // Stride between consecutive slots of one (row, layer): what the attention kernel needs.
  HISPARSE_HD size_t RecordStride() const { return geometry.record_bytes; }
};

// Host page tables: where the host records of one session live, as the data path sees them.
// Every (row, layer) has a table of pages_per_entry page addresses; a page holds R =
// records_per_page consecutive positions, and the record of position p is at
//     page_base[(row * layers + layer) * pages_per_entry + p / R] + (p % R) * record_bytes.
// A record never straddles a page (R = page_bytes / record_bytes, floor). Only positions below the
// row's capacity are valid (as before: a seq_len or position past capacity is the row's error); the
// table entries past the row's pages are null, and capacity <= pages * R. Page addresses are
// 16-byte aligned, so bit 0 is free: bit 0 set marks a read-only page (one shared with another
// table): RESOLVE, prefetch replay and the reference read it like any other, and store, indexed
// store and append refuse to write through it (kResolveReadOnlyPage, the whole request unwritten).
// One contiguous run per (row, layer) is the table R = kContiguousRecordsPerPage, pages_per_entry =
// 1 (every position on page 0), the defaults. The addresses must be readable (and, unless marked
// read-only, writable) by whoever runs the kernel: device-mapped host memory on a GPU. A map
// borrows its arrays (the device backend owns them); kernels only read them.
inline constexpr uint32_t kContiguousRecordsPerPage = 0x7fffffffu;  // > every int32 position
inline constexpr uintptr_t kReadOnlyPageBit = 1;

struct HostRecordMap {
  uint8_t* const* page_base;  // [max_rows * layers * pages_per_entry] page addresses (bit 0: read-only)
  const int32_t* capacity;    // [max_rows] positions the row's pages hold (0: not admitted)
  uint32_t records_per_page = kContiguousRecordsPerPage;  // R > 0
  uint32_t pages_per_entry = 1;                           // table stride of one (row, layer)

  // The table of (row, layer): pages_per_entry entries.
  HISPARSE_HD uint8_t* const* Table(const ArenaGeometry& g, int32_t row, int32_t layer) const {
    return page_base + (static_cast<size_t>(row) * g.num_layers + layer) * pages_per_entry;
  }
  // A table entry's page address (bit 0 cleared) and whether it may be written through.
  HISPARSE_HD static uint8_t* PageAddress(const uint8_t* entry) {
    return const_cast<uint8_t*>(entry) - (reinterpret_cast<uintptr_t>(entry) & kReadOnlyPageBit);
  }
  // The table entry that maps a (16-byte aligned) page read-only.
  HISPARSE_HD static uint8_t* ReadOnlyEntry(const uint8_t* page) { return PageAddress(page) + kReadOnlyPageBit; }
  HISPARSE_HD static bool PageWritable(const uint8_t* entry) {
    return (reinterpret_cast<uintptr_t>(entry) & kReadOnlyPageBit) == 0;
  }
  // Record of position pos in [0, capacity of row) in a table (one division per record).
  HISPARSE_HD uint8_t* RecordIn(uint8_t* const* table, int32_t pos, uint32_t record_bytes) const {
    const uint32_t p = static_cast<uint32_t>(pos);
    return PageAddress(table[p / records_per_page]) + static_cast<size_t>(p % records_per_page) * record_bytes;
  }
  // The host record of (row, layer, pos).
  HISPARSE_HD uint8_t* Record(const ArenaGeometry& g, int32_t row, int32_t layer, int32_t pos) const {
    return RecordIn(Table(g, row, layer), pos, g.record_bytes);
  }
  // Whether the record of (row, layer, pos) may be written (its page is not read-only).
  HISPARSE_HD bool Writable(const ArenaGeometry& g, int32_t row, int32_t layer, int32_t pos) const {
    return PageWritable(Table(g, row, layer)[static_cast<uint32_t>(pos) / records_per_page]);
  }
  // Whether positions [first, end) of (row, layer) all lie on writable pages: one test per page.
  HISPARSE_HD bool RangeWritable(const ArenaGeometry& g, int32_t row, int32_t layer, int32_t first, int32_t end) const {
    if (end <= first) return true;
    uint8_t* const* t = Table(g, row, layer);
    const uint32_t last_page = static_cast<uint32_t>(end - 1) / records_per_page;
    for (uint32_t pg = static_cast<uint32_t>(first) / records_per_page; pg <= last_page; ++pg) {
      if (!PageWritable(t[pg])) return false;
    }
    return true;
  }
};

}  // namespace hisparse

#endif  // HISPARSE_KERNELS_ARENA_LAYOUT_H_
