// RESOLVE: the fused hit / evict / fetch step that runs once per (layer, decode step) for a batch
// of request rows, and the store / append kernels that keep the host pool authoritative.
//
// The contract (docs/ARCHITECTURE.md, "The RESOLVE contract"), per (row r, layer l):
//  1. A selected position resident in a slot is a hit. The newest token (seq_len - 1) always maps
//     to the extra slot B and counts as a hit; it does not touch the LRU order, and a regular slot
//     that happens to hold the same position is left alone.
//  2. Misses, in selection order, take the least recently used slots that hold no hit of this
//     step: the i-th miss takes the i-th such slot (in LRU order). Its record is copied from the
//     host pool into the slot, and slot_pos is updated.
//  3. New LRU order, least to most recent: slots untouched this step (old order), then the slots
//     just filled by misses (miss order), then the hit slots (old relative order).
//     Example: LRU [0,1,2,3]; a hit in slot 1, one miss -> the miss takes slot 0 -> [2,3,0,1].
//  4. Output: for every selected index j, the physical slot that now holds it (B for the newest
//     token; kPadding = -1 for padding).
//  5. B >= k. With seq_len <= B everything is resident after prefill (position = slot).
//  6. Deterministic: the CUDA kernel and the CPU reference produce identical slot tables, LRU
//     orders, outputs and counters for identical inputs.
//  7. Padded batch entries: an entry i with n <= i < max_batch, n = *batch_size clamped to
//     [0, max_batch] (the entries a CUDA graph captured for max_batch carries past the real batch),
//     publishes kPadding in every output column it owns: out_slots[i][0..k) = kPadding and, when
//     the miss plan is recorded, summary[i] = (kPadding, -1, 0) (no row; misses = -1, so a replay
//     skips it as it skips a rejected entry; its plan entries are not written). Its rows,
//     seq_lens and positions are ignored (they may hold garbage), it sets no error bit and touches
//     no other state: no slot table, LRU order, record or counter. An attention kernel reading a
//     whole captured [max_batch][k] table thus sees -1 (nothing to attend) in every padded row.
//  8. Multi-query steps (speculative decoding; ArenaGeometry::draft_tokens = n > 0). With Q = n + 1,
//     positions and out_slots are [max_batch][Q][k]: query row t of entry i at (i * Q + t) * k.
//     Entry i has q_i = query_counts[i] in [1, Q] query tokens this step (query_counts null: 1
//     each), the newest q_i positions of the row: query token t < q_i is position
//     P_t = seq_len - q_i + t (seq_len counts every query token, the drafts too), and its list,
//     query row t, selects over [0, P_t + 1) (duplicates within one list are invalid, across
//     lists expected). With q = 1 (always, for n = 0) rules 1..4 are this rule word for word.
//     a. Tail: position P_t lives in tail slot B + t (written by append, rule 8 of AppendDesc);
//        selecting it gives B + t, a hit that touches no regular slot and no LRU entry.
//     b. The union U: the distinct non-padding positions of the q_i lists that are not tail
//        positions, ordered by first appearance, list 0 in selection order, then list 1, ....
//        All of U becomes resident at once: positions of U resident in a regular slot are hits
//        (their slots are "hit slots"); the others are the misses, in U's order, and the i-th miss
//        takes the i-th least recently used slot holding no hit (rule 2 over U).
//     c. |U| <= B is required (hit slots + misses = |U| must fit in B): a row with a larger union
//        is refused at run time (kResolveUnionTooLarge; rows are checked one by one, so B may be
//        smaller than Q * k when the lists overlap). B >= Q * k makes the refusal impossible; the
//        issue's sizing (n + 2) * k leaves room for the LRU to keep slack.
//     d. New LRU order: rule 3 over U (untouched, then misses in U's order, then hit slots in old
//        relative order).
//     e. Output: out_slots[i][t][j] = the slot that holds positions[i][t][j] after the step (a
//        regular slot or B + t'), kPadding for padding, and kPadding in every column of the query
//        rows t in [q_i, Q) (padded query rows: their positions are ignored).
//     f. Counters: misses += misses of U (records fetched; bytes_fetched = misses * record_bytes);
//        hits += |U| - misses + the distinct tail positions selected (every distinct position of
//        the step that needed no fetch; a position selected by several lists counts once);
//        steps += 1 per (row, layer). The miss plan records the same (row, misses, hits) and U's
//        misses in order (MissPlan::EntriesPerRow = Q * k entries per batch entry).
//     Rejected drafts: after verification the engine advances the row's length by the accepted
//     count a (1 <= a <= q); the next step's query tokens start at the first rejected position, so
//     its append rewrites their host records and tail slots. Regular slots only ever hold
//     positions below a step's first query token, which acceptance never takes back, so no slot
//     can keep a rejected record.
//  9. Page-table output (optional: ResolveDesc::page_table not null), besides out_slots or, with
//     out_slots null, instead of them. page_table is shaped like out_slots ([max_batch][k], and
//     [max_batch][Q][k] with draft tokens: query row t of entry i at (i * Q + t) * k); with S =
//     ArenaGeometry::RecordSlots() = B + 1 + n record slots per (row, layer) (n = draft_tokens),
//     page_table[x] = -1 wherever out_slots[x] is (or would be) kPadding (padding selections,
//     padded query rows t >= q_i, rejected rows, padded entries), and otherwise
//       page_offset * page_records + g,   g = (row * layers + layer) * S + out_slots[x],
//     where g is the index of the record that holds the selected position in the arena's records
//     section viewed as one array [max_rows * layers * S][record_bytes] (ArenaView::Record): a
//     regular slot s < B, or a tail slot B + t (the newest token, and with draft tokens query
//     token t; rule 8a), which lie in the same section. The sum is that record's index in a
//     caller's pool of pages of page_records records whose page page_offset begins at the arena's
//     first record: the page * page_size + offset_in_page convention of FlashMLA's sparse indices
//     and vLLM's slot_mapping (page_records = 1 and page_offset = 0 give g). An attention kernel
//     reads it directly over the arena's records. Every entry must fit in int32
//     (ValidatePageTable). Prefetched followers (ReplayDesc) take the anchor's table: layer f's
//     records lie (f - anchor) * S records after the anchor's, so the attention of f reads the
//     anchor's table from the records base advanced by that many records.
// 10. Padding inside the batch, so that engines pass their buffers straight through:
//     a. An entry i < n whose row is kPadding (-1) is padding, as vLLM pads a batch: it publishes
//        as rule 7's padded entries do (kPadding outputs and page-table entries, summary
//        (kPadding, -1, 0)), sets no error bit, and its seq_len, query count and positions are
//        ignored. Any other row outside [0, max_rows) stays invalid (kResolveBadRow).
//     b. In list t (query token P_t, rule 8; P_0 = seq_len - 1 with one list), only the first
//        P_t + 1 columns can hold a selection: a list over a context shorter than k is padded at
//        its end, and what an engine's buffer holds there (SGLang's top-k buffer keeps the
//        previous step's values) is ignored. Columns j > P_t are padding: they publish kPadding,
//        are neither checked nor counted, and cannot make a duplicate.
//
// Invalid input of a row leaves that row's state untouched, sets all its Q * k outputs to kPadding,
// ORs the matching ResolveError bit into *error_flags and adds one to the arena's
// counters.rejected (its only counter that moves; the daemon exports it). Other rows proceed. Invalid is: a row
// outside [-1, max_rows); a query count outside [1, Q]; seq_len outside [q, capacity of the row]
// (q = 1 without query_counts); in some list t < q, a column j <= P_t holding a position outside
// [-1, P_t + 1) or a position another such column of the list holds; a union larger than B (8c).
//
// Host records (every descriptor's HostRecordMap) are read and written through the host page tables
// of arena_layout.h ("Host page tables"): position p of (row, layer) at page p / R of the row's
// table, offset (p % R) * record_bytes; a record never straddles a page; positions at or past the
// row's capacity are invalid as above. RESOLVE, its multi-query form and prefetch replay read
// read-only (shared) pages like any other; store, indexed store and append refuse to write through
// one (kResolveReadOnlyPage): checked over the whole request before anything is written, so the
// refused row (a store's request, an append's entry) is left untouched and other rows proceed.
//
// Memory spaces: on the CUDA path every pointer in a descriptor is device-accessible (arena in
// device memory, host records in device-mapped pinned host memory); on the host-emulated path all
// are plain host pointers and the CPU reference runs.
#ifndef HISPARSE_KERNELS_RESOLVE_H_
#define HISPARSE_KERNELS_RESOLVE_H_

#include <stddef.h>
#include <stdint.h>

#include "hisparse/kernels/arena_layout.h"

namespace hisparse {

enum ResolveError : uint32_t {
  kResolveOk = 0,
  kResolveBadPosition = 1u << 0,    // a position < -1 or >= seq_len (in a column < seq_len, rule 10b)
  kResolveDuplicate = 1u << 1,      // a position selected twice in one row (columns < seq_len)
  kResolveBadSeqLen = 1u << 2,      // seq_len < 1 or > the row's capacity
  kResolveBadRow = 1u << 3,         // row index outside [-1, max_rows) (-1: padding, rule 10a)
  kResolveBadIndex = 1u << 4,       // an indexed store's source index outside [0, src_tokens)
  kResolveBadQueryCount = 1u << 5,  // query (or appended token) count outside [1, draft_tokens + 1]
  kResolveUnionTooLarge = 1u << 6,  // a multi-query step's union of selections exceeds B (rule 8c)
  kResolveReadOnlyPage = 1u << 7,   // a store or append into a read-only (shared) host page
};

// The miss plan of one RESOLVE launch: what it fetched, where to, and what it counted, per batch
// entry. Layers that share an anchor layer's selection (shared indexers: the anchor's top-k is
// reused by the layers after it) replay it instead of running RESOLVE themselves (ReplayDesc).
// One contiguous buffer of MissPlanBytes(g, max_batch) bytes; MissPlan::Of carves it. Written by
// RESOLVE only when ResolveDesc::plan.summary is not null; nothing in it needs initializing.
struct MissPlan {
  int32_t* batch;    // [1] batch entries the launch covered (*batch_size clamped to [0, max_batch])
  int32_t* summary;  // [max_batch][3] (row, misses, hits) of batch entry i; misses = -1: the entry
                     // was invalid (its state was left untouched; error_flags told) or padding
                     // (row = kPadding, rule 7)
  int32_t* entries;  // [max_batch][EntriesPerRow][2] (position, slot) of miss m of entry i, in miss
                     // order
  int32_t max_batch;

  // Miss entries of one batch entry: (draft_tokens + 1) * k (one list per query token; k for n = 0).
  HISPARSE_HD static size_t EntriesPerRow(const ArenaGeometry& g) {
    return static_cast<size_t>(g.TailSlots()) * static_cast<size_t>(g.k);
  }

  // Layout: batch (16 bytes), summary, entries (16-byte aligned).
  static size_t SummaryBytes(int32_t max_batch) {
    const size_t b = (max_batch > 0 ? static_cast<size_t>(max_batch) : 0) * 3 * sizeof(int32_t);
    return (b + 15) / 16 * 16;
  }
  static size_t Bytes(const ArenaGeometry& g, int32_t max_batch) {
    const size_t mb = max_batch > 0 ? static_cast<size_t>(max_batch) : 0;
    return 16 + SummaryBytes(max_batch) + mb * EntriesPerRow(g) * 2 * sizeof(int32_t);
  }
  static MissPlan Of(void* base, int32_t max_batch) {
    uint8_t* b = static_cast<uint8_t*>(base);
    MissPlan p;
    p.batch = reinterpret_cast<int32_t*>(b);
    p.summary = reinterpret_cast<int32_t*>(b + 16);
    p.entries = reinterpret_cast<int32_t*>(b + 16 + SummaryBytes(max_batch));
    p.max_batch = max_batch;
    return p;
  }
};

// One RESOLVE launch: one layer, a batch of rows.
struct ResolveDesc {
  ArenaView arena;                        // the session's arena (geometry gives B, k, record_bytes)
  HostRecordMap host;                     // where positions live in the host pool
  int32_t layer;                          // which layer's state
  int32_t max_batch;                      // capacity of the per-batch arrays; the grid is sized from it
  const int32_t* batch_size;              // device scalar: rows actually in this step (<= max_batch);
                                          // entries at index >= *batch_size publish kPadding (rule 7)
  const int32_t* rows;                    // [max_batch] arena row of batch entry i; kPadding: a
                                          // padded entry (rule 10a)
  const int32_t* seq_lens;                // [max_batch] sequence length of batch entry i at this step
  const int32_t* positions;               // [max_batch][Q][k] selected positions, kPadding = -1 for padding
                                          // (Q = draft_tokens + 1; [max_batch][k] for draft_tokens = 0)
  int32_t* out_slots;                     // [max_batch][Q][k] slot that holds positions[i][t][j] after the step
  uint32_t* error_flags;                  // OR of ResolveError bits; may be null
  uint32_t flags;                         // ResolveFlags; 0 for the real data path
  MissPlan plan;                          // where to record the miss plan; summary == null: not recorded.
                                          // plan.max_batch must be >= max_batch
  int32_t* page_table;                    // [max_batch][Q][k] rule 9's record indices (shaped like
                                          // out_slots), or null (not written); out_slots may then be null
  int32_t page_records;                   // P >= 1 when page_table is set
  int32_t page_offset;                    // O >= 0 when page_table is set
  const int32_t* query_counts = nullptr;  // [max_batch] query tokens q of entry i (rule 8), device
                                          // memory on the CUDA path; null: 1 for every entry
};

// Checks rule 9's parameters for a geometry: page_records >= 1, page_offset >= 0 and every entry
// (up to page_offset * page_records + max_rows * layers * RecordSlots() - 1, tail slots included)
// within int32. Returns null when valid, else a static message naming what is wrong.
const char* ValidatePageTable(const ArenaGeometry& g, int32_t page_records, int32_t page_offset);

// Rule 9's entry for a slot of (row, d.layer), s in [0, B + n] (tail slots included): the CUDA
// kernels and the CPU reference all compute it here.
HISPARSE_HD inline int32_t PageTableEntry(const ResolveDesc& d, int32_t row, int32_t s) {
  const ArenaView& a = d.arena;
  const int64_t g = static_cast<int64_t>(a.RowLayer(row, d.layer)) * static_cast<int64_t>(a.geometry.RecordSlots()) + s;
  return static_cast<int32_t>(static_cast<int64_t>(d.page_offset) * d.page_records + g);
}

// Exact layer-wise prefetch: replays the miss plan that `anchor_layer`'s RESOLVE recorded into
// `layer`, a layer that shares the anchor's selection. For every batch entry the plan covers
// whose row was valid: the plan's records are copied from `layer`'s host records into `layer`'s
// slots, `layer`'s slot table and LRU order become the anchor's (a copy of the anchor's state
// right after its RESOLVE), and the counters grow as a RESOLVE of `layer` would make them grow
// (an entry the anchor rejected adds one to counters.rejected, as `layer`'s RESOLVE would).
//
// Why that is exact: RESOLVE's result depends only on the selection, seq_len and the (row, layer)
// tables, never on record bytes. A shared layer that starts a step with the anchor's tables and
// sees the anchor's selection ends it with the anchor's tables, the anchor's outputs and the
// anchor's victims. Store and reset write every layer's tables alike and append touches only slot
// B, so the tables of a layer driven only by replays of its anchor (or by RESOLVEs with the
// anchor's inputs) never diverge from the anchor's. The anchor's out_slots serve the layer too.
//
// Ordering: after the anchor's RESOLVE (it reads the plan and the anchor's new tables) and before
// the anchor's next RESOLVE; before `layer`'s append and attention of the step.
//
// Padding (rule 7): a replay has no outputs of its own (the anchor's out_slots, already kPadding
// in padded entries, serve the layer); entries at and past *plan.batch, and entries whose summary
// says misses = -1 (rejected or padding), touch nothing.
struct ReplayDesc {
  ArenaView arena;
  HostRecordMap host;
  int32_t anchor_layer;
  int32_t layer;      // != anchor_layer
  int32_t max_batch;  // the anchor launch's max_batch; <= plan.max_batch
  MissPlan plan;      // read only
  int32_t blocks;     // CUDA thread blocks of 256 to copy with; 0: an eighth of the SMs. A replay
                      // runs beside compute, so it takes few SMs (a few suffice for the link)
};

// How a RESOLVE launch orders itself after the kernel before it in the stream
// (hs_resolve_args.launch_flags; ResolveLaunchConfig::order). The programmatic orders use
// programmatic dependent launch (PDL; compute capability 9.0 and later, an ordinary launch before,
// and after a copy or an event). Results are the same in every order; the CPU reference and the
// host backend run in order.
enum class LaunchOrder {
  // An ordinary launch: RESOLVE starts once that kernel has completed.
  kAfterCompletion,
  // RESOLVE's launch and block scheduling overlap that kernel's tail. Every block waits for that
  // kernel to complete before its first global access, so nothing it writes can be missed.
  // bench/RESULTS.md, "RESOLVE as a programmatic dependent", has what it buys.
  kProgrammatic,
  // RESOLVE runs beside that kernel: it starts once that kernel's blocks have all started and
  // asked for their dependents (griddepcontrol.launch_dependents), does its whole step without
  // waiting for it, and completes only after it (every block waits for it last). What follows in
  // the stream therefore sees both complete, and a CUDA graph of such a stream stays one chain.
  // The caller guarantees that the kernel before neither writes what this RESOLVE reads (its
  // selections, rows, seq_lens and batch size, written before that kernel) nor reads or writes
  // what it writes (its rows' slot tables and records, its outputs, the workspace, so it is not
  // another RESOLVE on the same workspace): e.g. the sparse attention of other rows
  // (docs/INTEGRATION.md, "Hiding the misses"). The multi-query form (draft tokens) launches as
  // kProgrammatic: its planner waits first.
  kBeside,
};

// The most warps of one RESOLVE block that take its fetch's queued chunks (a block's warps;
// hs_resolve_args.consumer_warps, ResolveLaunchConfig::consumer_warps).
inline constexpr int kMaxConsumerWarps = 16;

enum ResolveFlags : uint32_t {
  // Plan and update tables and outputs exactly as usual but move no record bytes. Only for the
  // benchmark's no-IO bound; never in the data path (slots would not hold their positions).
  kResolveFlagNoFetch = 1u << 0,
};

// Prefill store: tokens [start_pos, start_pos + num_tokens) of one row, every layer, from the
// engine's buffer into the host pool. If seq_len_after <= B the records also land in the slots
// (position p in slot p), the slot table and the LRU order are rewritten so that the row holds
// exactly positions 0..seq_len_after-1 (empty slots first in the LRU, then slots in order).
struct StoreDesc {
  ArenaView arena;
  HostRecordMap host;
  int32_t row;
  int32_t start_pos;
  int32_t num_tokens;
  int32_t seq_len_after;            // the row's sequence length once these tokens are stored
  const uint8_t* src;               // record of (layer l, token t) at src + l*layer_stride + t*token_stride
  int64_t src_layer_stride;         // bytes
  int64_t src_token_stride;         // bytes, >= record_bytes
  uint32_t* check = nullptr;        // CUDA only (required there): IndexedStoreDesc::check
  uint32_t* error_flags = nullptr;  // may be null; the CUDA path ORs kResolveReadOnlyPage here
};

// Indexed prefill store (hs_store_indexed): the store above for layers [first_layer, first_layer +
// num_layers) only, gathering each token's record by index from an engine's paged KV pool. The
// record of (layer first_layer + l, position start_pos + t) is at
//   src_base + l * src_layer_stride + src_index[t] * src_token_stride,
// so src_base points at the pool of layer first_layer and src_index[t] is the pool slot of token t
// (SGLang's req_to_token row, vLLM's slot_mapping). Everything else is StoreDesc's, restricted to
// the layer range: the host pool, slot B, the refresh of resident slots and, when seq_len_after <=
// B, the layers' slot tables. A plain store is exactly the indexed store with every layer and
// src_index[t] = t (StoreReference and LaunchStore run the same code with src_index null). To keep
// layers that share an anchor equal (ReplayDesc), store every layer of a token range with the same
// seq_len_after before the row's next RESOLVE.
//
// Validity, all checked before anything is written (an invalid store writes nothing): row in
// [0, max_rows) and a layer range of >= 1 layers inside [0, num_layers) (else kResolveBadRow);
// start_pos, num_tokens >= 0 (else kResolveBadPosition); seq_len_after as for StoreDesc (else
// kResolveBadSeqLen); every src_index[t] in [0, src_tokens) (else kResolveBadIndex); every host
// page of positions [start_pos, start_pos + num_tokens) in every layer of the range writable, not
// marked read-only (else kResolveReadOnlyPage: a shared page is never written through a table).
struct IndexedStoreDesc {
  ArenaView arena;
  HostRecordMap host;
  int32_t row;
  int32_t first_layer;
  int32_t num_layers;  // layers stored, >= 1
  int32_t start_pos;
  int32_t num_tokens;
  int32_t seq_len_after;
  const uint8_t* src_base;   // the pool of layer first_layer (16-byte aligned on the CUDA path)
  const int32_t* src_index;  // [num_tokens] pool slot of position start_pos + t; null: t (plain store)
  int64_t src_tokens;        // records in each layer's pool: every src_index[t] must be below it
  int64_t src_layer_stride;  // bytes between layer l and l + 1 of the pool
  int64_t src_token_stride;  // bytes between pool slots, >= record_bytes
  uint32_t* check;           // CUDA only, required: a device word the store's check kernel writes
                             // and the copy reads (launches that share it must be ordered); unused
                             // by the reference
  uint32_t* error_flags;     // may be null; the CUDA path ORs kResolveBadIndex or
                             // kResolveReadOnlyPage here (the host checks everything else before
                             // launching)
};

// The plain store as an indexed store: every layer, pool slot t for position start_pos + t. The
// CPU reference and the CUDA launcher both run it through the indexed path, so they cannot drift.
inline IndexedStoreDesc IndexedStoreOf(const StoreDesc& d) {
  IndexedStoreDesc x{};
  x.arena = d.arena;
  x.host = d.host;
  x.row = d.row;
  x.first_layer = 0;
  x.num_layers = d.arena.geometry.num_layers;
  x.start_pos = d.start_pos;
  x.num_tokens = d.num_tokens;
  x.seq_len_after = d.seq_len_after;
  x.src_base = d.src;
  x.src_index = nullptr;
  x.src_layer_stride = d.src_layer_stride;
  x.src_token_stride = d.src_token_stride;
  x.check = d.check;
  x.error_flags = d.error_flags;
  return x;
}

// Decode append: the newest token (position seq_len - 1) of every row in the batch, one layer:
// into the row's newest-token slot B and into the host pool. Multi-query (rule 8): entry i appends
// its q = token_counts[i] newest tokens (null: 1), token t < q being position seq_len - q + t, into
// tail slot B + t and the host pool (and a regular slot that holds the position, should one), read
// from src + (i * (draft_tokens + 1) + t) * src_stride. An entry with q outside [1, draft_tokens +
// 1] (kResolveBadQueryCount), a bad row, a seq_len outside [q, capacity] or a position of
// [seq_len - q, seq_len) on a read-only host page (kResolveReadOnlyPage) writes nothing; the
// other entries proceed.
struct AppendDesc {
  ArenaView arena;
  HostRecordMap host;
  int32_t layer;
  int32_t max_batch;
  const int32_t* batch_size;              // device scalar, as in ResolveDesc; entries at index >= *batch_size
                                          // do nothing (append has no outputs to pad)
  const int32_t* rows;                    // [max_batch]
  const int32_t* seq_lens;                // [max_batch] the newest token is at seq_len - 1
  const uint8_t* src;                     // record of (batch entry i, token t) at src + (i * Q + t) * src_stride
  int64_t src_stride;                     // bytes, >= record_bytes
  uint32_t* error_flags;                  // may be null; kResolveBadSeqLen / kResolveBadRow /
                                          // kResolveBadQueryCount / kResolveReadOnlyPage
  const int32_t* token_counts = nullptr;  // [max_batch] tokens appended by entry i; null: 1 each
};

// Checks a geometry: B >= k >= 1, record_bytes a multiple of 16 in [16, 16384], rows and
// layers >= 1, draft_tokens in [0, kMaxDraftTokens]. Returns null when valid, else a static message naming what is
// wrong.
const char* ValidateArenaGeometry(const ArenaGeometry& g);

// ---- CPU reference (kernels/resolve_reference.cc): the oracle, and the host-emulated backend. ----
// Each returns the OR of ResolveError bits it set (0 when every row was valid). Counters in the
// arena are updated exactly as the CUDA kernel updates them.
uint32_t ResolveReference(const ResolveDesc& d);
uint32_t StoreReference(const StoreDesc& d);  // IndexedStoreReference of every layer, index t
uint32_t IndexedStoreReference(const IndexedStoreDesc& d);
uint32_t AppendReference(const AppendDesc& d);
// Returns kResolveBadRow (and does nothing) when a layer is outside [0, num_layers) or the two
// layers are equal, else 0.
uint32_t ReplayReference(const ReplayDesc& d);
// Resets one row: every layer's slots EMPTY, LRU = identity. Used when a row is (re)admitted.
void ResetRowReference(const ArenaView& arena, int32_t row);

}  // namespace hisparse

#endif  // HISPARSE_KERNELS_RESOLVE_H_
