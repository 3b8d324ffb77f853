/* hisparse.h — the C ABI of libhisparse, the engine-side client of hisparsed.
 *
 * An engine (SGLang, vLLM, the demo) links libhisparse, opens a session with the node's daemon,
 * admits and releases requests (control path: gRPC, milliseconds, never per step) and runs the
 * data path (RESOLVE, store, append) in its own stream against memory the daemon owns and the
 * session has mapped (no RPC per step).
 *
 * Conventions (after NCCL's nccl.h and LevelDB's c.h):
 *  - Opaque handles; every call returns hs_result; on failure hs_last_error() gives a message for
 *    the calling thread (valid until that thread's next failing call).
 *  - Option and info structs open with `struct_size` (set it to sizeof, or use the _INIT macros)
 *    so that later versions can grow them without breaking callers: the library accepts any
 *    struct_size from the struct's first version's size up (smaller is HS_ERR_INVALID_ARGUMENT),
 *    reads only the bytes an input struct's struct_size covers (fields past it are zero), writes
 *    only those of an output struct, and leaves struct_size as the caller set it.
 *  - No C++ types and no exceptions cross this boundary.
 *  - Thread-safety: one hs_session may be used from several threads for control calls; data-path
 *    calls on one session must be ordered by the caller (they run in the caller's stream).
 */
#ifndef HISPARSE_HISPARSE_H_
#define HISPARSE_HISPARSE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ABI version major.minor. A minor release only adds (struct fields at the end, enum values,
 * functions), so a library of the same major and at least the caller's minor serves it; a new
 * major breaks callers. 1.0: the first ABI; 1.1: hs_session_options.layer_anchor, hs_prefetch,
 * hs_session_info.arena_kind; 1.2: hs_abi_version_get, hs_version, HS_ARENA_PRIVATE_GPU; 1.3:
 * hs_store_indexed, hs_resolve_args.page_table (.page_records, .page_offset); 1.4: speculative
 * decoding: hs_session_options.draft_tokens, hs_session_info.draft_tokens,
 * hs_resolve_args.query_counts, hs_append_tokens;
 * 1.5: the paged host pool: a request's records live in host pages (no longer one run per layer),
 * so hs_record_ptr is the one way to a host record, valid for one record only, and
 * hs_session_info.max_tokens_per_request comes from limits.max_tokens_per_request; 1.6:
 * hs_session_options.max_context_tokens, hs_admit_batch, hs_release_batch, HS_ERR_ABORTED, hs_park,
 * hs_resume, hs_admit_shared, hs_admit_import, hs_import_grant, hs_await_import; 1.7: TP groups:
 * hs_session_options.group (.group_rank, .group_size), hs_admit_group; durable requests:
 * hs_admit_durable, hs_set_lease, hs_list_adoptable, hs_adopt; 1.8: batched lifecycle calls:
 * hs_park_batch, hs_resume_batch, hs_admit_import_batch; 1.9: hs_resolve_args.launch_flags
 * (HS_RESOLVE_LAUNCH_PROGRAMMATIC); 1.10: one admission verb: hs_admit_args, hs_admit2 and
 * hs_admit_batch2 (the seven hs_admit* calls are wrappers over them), and every admission whose
 * install in this process fails is released in the daemon (before, a single hs_admit kept it); 1.11:
 * riding through a daemon's restart: hs_session_get_state, hs_session_recover, hs_recovery_kept,
 * hs_recovery_lost (and every data-path call is HS_ERR_UNAVAILABLE once the session ended); 1.12:
 * the control lane: lifecycle calls leave gRPC for a connection of the session's own where the
 * daemon serves one, and hs_session_info.control_lane says which carries them;
 * hs_session_get_timings; 1.13: hs_resolve_args.max_blocks (a RESOLVE launch's budget of thread
 * blocks, for running it beside the engine's kernels); 1.14: HS_RESOLVE_LAUNCH_BESIDE (RESOLVE
 * beside the previous kernel in the stream, one stream for the whole overlap); 1.15:
 * hs_resolve_args.consumer_warps (the warps of each of RESOLVE's blocks that fetch) and
 * HS_RESOLVE_LAUNCH_EARLY_DEPENDENTS (the next kernel may run beside RESOLVE); 1.16: hs_topk (the
 * top-k of rows of scores as RESOLVE's positions, no session needed); 1.17: hs_topk_args.after_count
 * (the top-k waits for the kernels that count on it, not for every kernel before it); 1.18:
 * hs_append's kernel lets its programmatic dependent (an engine's indexer) start at once; 1.19:
 * hs_prewarm (the GPU's translations of a layer's host records, made ahead of its RESOLVE). */
#define HS_ABI_VERSION_MAJOR 1
#define HS_ABI_VERSION_MINOR 19
/* The major version alone: what HS_ABI_VERSION and hs_abi_version() have always meant. */
#define HS_ABI_VERSION HS_ABI_VERSION_MAJOR

typedef enum hs_result {
  HS_OK = 0,
  HS_ERR_INVALID_ARGUMENT = 1,
  HS_ERR_NOT_FOUND = 2,
  HS_ERR_ALREADY_EXISTS = 3,
  HS_ERR_RESOURCE_EXHAUSTED = 4,
  HS_ERR_PERMISSION_DENIED = 5,
  HS_ERR_FAILED_PRECONDITION = 6,
  HS_ERR_UNAVAILABLE = 7, /* the daemon cannot be reached, or the session ended */
  HS_ERR_UNIMPLEMENTED = 8,
  HS_ERR_INTERNAL = 9,
  HS_ERR_ABORTED = 10 /* since ABI 1.6: a batch item not done because another item failed the batch */
} hs_result;

const char* hs_result_string(hs_result result);
/* Message of the calling thread's last failed call ("" if none). */
const char* hs_last_error(void);
/* HS_ABI_VERSION (the major) of the library actually loaded. */
int hs_abi_version(void);
/* Since ABI 1.2. The loaded library's HS_ABI_VERSION_MAJOR and _MINOR; either pointer may be NULL. */
void hs_abi_version_get(int* major, int* minor);
/* Since ABI 1.2. The release of the loaded library ("0.1.0"): the build's project version, the
 * same string hisparsed reports. */
const char* hs_version(void);

typedef struct hs_session hs_session;

typedef enum hs_backend {
  HS_BACKEND_AUTO = 0, /* CUDA when built with it and gpu >= 0, else host */
  HS_BACKEND_HOST = 1, /* host-emulated device: the arena in host memory, RESOLVE by the CPU reference */
  HS_BACKEND_CUDA = 2  /* CUDA kernels on the caller's stream */
} hs_backend;

typedef struct hs_session_options {
  uint32_t struct_size;       /* sizeof(hs_session_options) */
  const char* daemon_address; /* "unix:PATH"; NULL: $HISPARSE_DAEMON, else unix:/run/hisparse/hisparsed.sock */
  const char* engine_name;    /* for logs and stats; may be NULL */
  int32_t gpu;                /* GPU index, -1 for the host-emulated device */
  uint32_t num_layers;        /* sparse layers */
  uint32_t record_bytes;      /* bytes of one KV record: multiple of 16, <= 16384 */
  uint32_t k;                 /* selections per (request, layer, step) */
  uint32_t slots;             /* B >= k: GPU slots per (request, layer) */
  uint32_t max_requests;      /* rows: requests admitted at once */
  hs_backend backend;
  uint32_t timeout_ms; /* deadline of each control call; 0: 10000 */
  /* Since ABI 1.1 (callers built against 1.0 pass a smaller struct_size and get NULL here).
   * Shared indexers: [num_layers], layer l reuses the top-k selection of layer layer_anchor[l]
   * (0 <= layer_anchor[l] <= l, and an anchor is its own anchor); NULL: every layer selects on its
   * own. A layer that shares an anchor can be prefetched exactly with hs_prefetch. Copied at open. */
  const int32_t* layer_anchor;
  /* Since ABI 1.4. Speculative decoding: n draft tokens per step (0..7; 0: one query token per
   * step, as before). Each (row, layer) gets 1 + n tail slots B..B+n, hs_resolve takes up to n + 1
   * selection lists per row (hs_resolve_args.query_counts) and hs_append_tokens appends up to
   * n + 1 tokens per row (resolve.h rule 8). */
  uint32_t draft_tokens;
  /* Since ABI 1.6. The longest context one request will hold, in tokens; 0: the daemon's
   * limits.max_tokens_per_request. Sizes the session's host page tables, which live in GPU memory
   * on the CUDA backend (layers x max_requests x ceil(tokens / records per page) x 8 bytes), so a
   * value near the engine's real maximum (its max model length) saves that memory. Above the
   * daemon's limit: HS_ERR_INVALID_ARGUMENT. hs_session_info.max_tokens_per_request is the bound. */
  uint32_t max_context_tokens;
  /* Since ABI 1.7. Tensor-parallel group (docs/DESIGN.md, "TP groups"; NULL: none): the sessions of
   * one engine's TP ranks join the group `group` (1..128 bytes of UTF-8, unique on the node) as rank
   * group_rank of group_size (1..64), one session per rank, all of one uid, with equal num_layers,
   * record_bytes and max_context_tokens. A request admitted with hs_admit_group then holds ONE set
   * of host pages for every rank. hs_session_open fails with HS_ERR_ALREADY_EXISTS (the rank is
   * held by a live session), HS_ERR_PERMISSION_DENIED (the group is another uid's),
   * HS_ERR_FAILED_PRECONDITION (another group_size or geometry than the members') or
   * HS_ERR_INVALID_ARGUMENT (a bad name, size, or rank >= size). */
  const char* group;
  uint32_t group_rank;
  uint32_t group_size;
} hs_session_options;

#define HS_SESSION_OPTIONS_INIT \
  { sizeof(hs_session_options), NULL, NULL, -1, 0, 0, 0, 0, 0, HS_BACKEND_AUTO, 0, NULL, 0, 0, NULL, 0, 0 }

/* Opens a session: attaches to the daemon, declares the geometry, receives and maps the session's
 * memory. On success *out owns the session; close it with hs_session_close. On failure *out is NULL. */
hs_result hs_session_open(const hs_session_options* options, hs_session** out);
/* Ends the session and frees the handle. NULL is a no-op. The daemon releases everything the
 * session held but its durable requests (hs_admit_durable, hs_set_lease), which stay parked until
 * their lease ends or another session adopts them (hs_adopt). */
void hs_session_close(hs_session* session);

typedef struct hs_request_info {
  uint32_t struct_size;     /* sizeof(hs_request_info) */
  uint32_t row;             /* the request's row in the slot arena (the `rows` of resolve/append) */
  uint32_t capacity_tokens; /* positions its host runs hold */
  uint32_t moved;           /* hs_extend: 1 when runs moved (host pointers changed) */
} hs_request_info;

#define HS_REQUEST_INFO_INIT \
  { sizeof(hs_request_info), 0, 0, 0 }

/* hs_admit2 with only these fields set (since ABI 1.10 a wrapper over it; see hs_admit_args). */
hs_result hs_admit(hs_session* session, uint64_t request_id, uint32_t context_tokens, uint32_t token_budget,
                   hs_request_info* out);
hs_result hs_extend(hs_session* session, uint64_t request_id, uint32_t token_budget, hs_request_info* out);
hs_result hs_release(hs_session* session, uint64_t request_id);

/* Host address of the record of (request, layer, position) in this process's mapping of the pool.
 * Since ABI 1.5 a layer's records lie in pages: the address holds that one record only. */
hs_result hs_record_ptr(hs_session* session, uint64_t request_id, uint32_t layer, uint32_t position, void** out);

/* How the daemon shares the session's slot arena with this process (SessionOpened.arena.kind). */
typedef enum hs_arena_kind {
  HS_ARENA_HOST = 0,     /* a host memfd, on the host backend (gpu = -1, or a daemon without GPU arenas) */
  HS_ARENA_CUDA_VMM = 1, /* GPU memory: a CUDA VMM allocation imported from a POSIX fd */
  HS_ARENA_CUDA_IPC = 2, /* GPU memory: the legacy cudaIpc fallback (no VMM fd export on the GPU) */
  /* The daemon served a host memfd (device host, or auto where it sees no GPU) to the CUDA
   * backend, which keeps a private GPU arena instead: only when the engine asked, with
   * HISPARSE_PRIVATE_GPU_ARENA=1 in its environment (hs_session_open fails with
   * HS_ERR_FAILED_PRECONDITION otherwise). The daemon does not see this arena: its stats read 0
   * RESOLVE counters for the session; hs_stats_get reads them here. */
  HS_ARENA_PRIVATE_GPU = 3 /* since ABI 1.2 */
} hs_arena_kind;

typedef struct hs_session_info {
  uint32_t struct_size;
  uint64_t session_id;
  hs_backend backend;     /* the backend actually in use */
  void* slot_base;        /* record of (row, layer, slot s) at
                            slot_base + ((row*layers + layer)*(slots+1+draft_tokens) + s) * record_stride */
  uint64_t record_stride; /* bytes between consecutive slots */
  uint32_t slots;         /* B; slot B of each (row, layer) holds the newest token */
  uint32_t max_tokens_per_request;
  uint64_t arena_bytes;
  hs_arena_kind arena_kind; /* since ABI 1.1: how the arena reached this process */
  uint32_t draft_tokens;    /* since ABI 1.4: the session's n; tail slots B..B+n */
  /* Since ABI 1.12: 1 while the lifecycle calls (admit, extend, release, park, resume and their
   * batches) go over the session's control lane, a connection of its own to the daemon's fd
   * socket; 0 when they go over gRPC (an older daemon, HISPARSE_CONTROL_LANE=0, or a lane that
   * broke). Both give the same answers. */
  uint32_t control_lane;
} hs_session_info;

#define HS_SESSION_INFO_INIT \
  { sizeof(hs_session_info), 0, HS_BACKEND_AUTO, NULL, 0, 0, 0, 0, HS_ARENA_HOST, 0, 0 }

hs_result hs_session_get_info(hs_session* session, hs_session_info* out);

typedef struct hs_stats {
  uint32_t struct_size;
  uint64_t pool_capacity_bytes;
  uint64_t pool_used_bytes;
  uint64_t pool_free_bytes;
  double pool_fragmentation;
  uint32_t sessions;         /* on the node */
  uint32_t requests;         /* on the node */
  uint32_t session_requests; /* of this session */
  uint64_t session_host_bytes;
  uint64_t hits; /* this session's RESOLVE counters */
  uint64_t misses;
  uint64_t bytes_fetched;
} hs_stats;

#define HS_STATS_INIT \
  { sizeof(hs_stats), 0, 0, 0, 0.0, 0, 0, 0, 0, 0, 0, 0 }

hs_result hs_stats_get(hs_session* session, hs_stats* out);

/* Since ABI 1.12. Where this session's time went, in seconds: its open phase by phase, and the
 * host-pool slabs it has mapped so far (on admissions and extends). For benchmarks and
 * diagnosis; nothing in it changes what the session does. */
typedef struct hs_session_timings {
  uint32_t struct_size;
  double open_rpc_s;      /* the OpenSession round trip (includes the daemon's arena creation) */
  double daemon_create_s; /* of which the daemon allocated, cleared and exported the arena */
  double backend_init_s;  /* the device backend's setup (CUDA context, workspace) */
  double fetch_arena_s;   /* the fd channel round trip for the arena (fd or cudaIpc handle) */
  double import_s;        /* cuMemImportFromShareableHandle / cuIpcOpenMemHandle */
  double map_s;           /* cuMemAddressReserve + cuMemMap + cuMemSetAccess (VMM only) */
  double attach_s;        /* the whole attach: import + map (+ mmap for a host arena) */
  double open_total_s;    /* hs_session_open, end to end */
  uint32_t slabs_mapped;  /* host-pool slabs mapped (mmap) and registered with the device */
  uint64_t slab_bytes_mapped;
  double slab_fetch_s;    /* their fd channel round trips */
  double slab_mmap_s;     /* their mmap */
  double slab_register_s; /* their cudaHostRegister (mapped, portable); about 0 on the host backend */
} hs_session_timings;

#define HS_SESSION_TIMINGS_INIT \
  { sizeof(hs_session_timings), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }

hs_result hs_session_get_timings(hs_session* session, hs_session_timings* out);

/* Requests the daemon evicted (an operator's `hisparse-ctl evict`, or admission under pressure)
 * since the last call: their memory is gone and the engine must re-prefill or fail them. Writes up
 * to `capacity` ids to `ids` and their number to *count; ids that did not fit stay for the next
 * call. */
hs_result hs_poll_evicted(hs_session* session, uint64_t* ids, size_t capacity, size_t* count);

/* ---- Riding through a daemon's restart (since ABI 1.11; docs/INTEGRATION.md, "When the daemon
 * restarts") ----
 * A session ends when its daemon stops, crashes, restarts or closes it. From then on every call
 * that needs the daemon and every data-path call (hs_resolve, hs_prefetch, hs_store,
 * hs_store_indexed, hs_append_tokens) returns HS_ERR_UNAVAILABLE, and every row is unpublished:
 * a kernel already captured in a CUDA graph refuses its rows (HS_RESOLVE_ERR_BAD_SEQ_LEN in
 * hs_check_errors), never serving memory whose state is unknown. The engine then, at a step
 * boundary with the kernels it launched on this session done (cudaStreamSynchronize), calls
 * hs_session_recover: the handle gets a new session on whatever daemon answers at the address, with
 * the durable requests (hs_admit_durable, hs_set_lease) it held adopted on the same pages, and
 * reports which requests were kept (with their new rows) and which were lost (re-prefill or fail
 * them). The arena stays where it was unless hs_recovery.arena_moved says otherwise. */
typedef enum hs_session_state {
  HS_SESSION_LIVE = 0,
  HS_SESSION_ENDED = 1 /* recover it (hs_session_recover) or close it */
} hs_session_state;

/* The session's state: one atomic load, cheap enough to read every step. */
hs_result hs_session_get_state(hs_session* session, hs_session_state* out);

typedef struct hs_recovery {
  uint32_t struct_size;    /* sizeof(hs_recovery) */
  uint32_t attempts;       /* sessions tried before one opened (the daemon coming back) */
  uint64_t old_session_id; /* the ended session */
  uint64_t new_session_id; /* the handle's session now */
  size_t kept;             /* requests kept: hs_recovery_kept */
  size_t lost;             /* requests lost: hs_recovery_lost */
  double seconds;          /* the recovery, end to end */
  /* 0: the slot arena, the host page tables and the miss plans kept their device addresses (the
   * new daemon's arena is mapped where the old one was), so CUDA graphs captured over them replay
   * as they are. 1: the arena moved (the daemon now serves another arena kind or page geometry,
   * or a cuda-ipc arena): read hs_session_get_info again and capture such graphs again. */
  uint32_t arena_moved;
  double reopen_seconds; /* of `seconds`, until a session opened (the daemon coming back); the rest
                          * is the adoption */
} hs_recovery;

#define HS_RECOVERY_INIT \
  { sizeof(hs_recovery), 0, 0, 0, 0, 0, 0.0, 0, 0.0 }

/* One kept request: its new row (-1: parked, as it was, or because no row was free: hs_resume
 * it) and capacity, the same as before. Its pages are those it had: no record is prefilled again. */
typedef struct hs_recovered_request {
  uint64_t request_id;
  int32_t row;
  uint32_t capacity_tokens;
} hs_recovered_request;

/* After the session ended (else HS_ERR_FAILED_PRECONDITION): opens a session with the handle's
 * options, retrying with backoff (20 ms doubling to 1 s) while no daemon answers, for at most
 * timeout_ms (0: 30000; past it HS_ERR_UNAVAILABLE); adopts every durable
 * request the ended session held, resumes those that were live into new rows (each reset: every
 * slot EMPTY), and puts the new session in the handle. Every other request of the ended session
 * (plain, importing, evicted and not yet polled, or a durable one the daemon did not keep) is
 * lost. On failure the handle keeps the ended session and recover may be called again. The engine
 * must have finished the kernels it launched on the session (their arena is released) and must
 * not run other calls on the handle meanwhile; calls already running finish on the ended session.
 * `out` may be NULL. */
hs_result hs_session_recover(hs_session* session, uint32_t timeout_ms, hs_recovery* out);

/* The last recovery's kept requests (in request-id order): up to `capacity` into `out`, their
 * number into *count (hs_recovery.kept says how many there are). */
hs_result hs_recovery_kept(hs_session* session, hs_recovered_request* out, size_t capacity, size_t* count);

/* The last recovery's lost request ids (in order): up to `capacity` into `ids`, their number into
 * *count. */
hs_result hs_recovery_lost(hs_session* session, uint64_t* ids, size_t capacity, size_t* count);

/* ---- Data path: kernels in the caller's stream (a cudaStream_t, or NULL; ignored on the host
 * backend). Pointers are device pointers on the CUDA backend, host pointers on the host backend. */

typedef struct hs_resolve_args {
  uint32_t struct_size; /* sizeof(hs_resolve_args) */
  uint32_t layer;
  int32_t max_batch;         /* capacity of the arrays below */
  const int32_t* batch_size; /* rows in this step (<= max_batch), read by the kernel at run time so
                                one CUDA graph serves every batch; NULL: all max_batch rows. Entries
                                at and past *batch_size are padding: their out_slots rows become -1
                                in every column, their rows/seq_lens/positions are ignored and no
                                state changes (resolve.h, rule 7) */
  const int32_t* rows;       /* [max_batch] arena rows (hs_request_info.row); -1: a padded entry
                                inside the batch (as vLLM pads), published like the entries past
                                *batch_size, no error (resolve.h, rule 10a) */
  const int32_t* seq_lens;   /* [max_batch] */
  const int32_t* positions;  /* [max_batch][n+1][k], -1 = padding (n = draft_tokens; [max_batch][k] for n = 0).
                                Only list t's first seq_len - q + t + 1 columns are read (seq_len
                                for a single list): the columns past them are padding whatever
                                they hold, so an engine's reused top-k buffer passes straight
                                through (resolve.h, rule 10b) */
  int32_t* out_slots;        /* [max_batch][n+1][k]; may be NULL when page_table is set (since ABI 1.3) */
  void* stream;
  /* Since ABI 1.3 (callers built against 1.2 pass a smaller struct_size and get NULL here).
   * page_table: shaped like out_slots ([max_batch][n+1][k]) or NULL; RESOLVE also writes, for
   * every selection, the index of the record that holds it in the slot arena viewed as one array
   * of records (slot_base + index * record_stride, see hs_session_info):
   *   page_offset * page_records + (row * num_layers + layer) * (slots + 1 + n) + out_slot,
   * -1 where out_slots is -1 (resolve.h, rule 9; n = draft_tokens, a tail slot B + t indexes its
   * record like a regular slot). That is the record's index in a pool of pages of page_records
   * records whose page page_offset begins at slot_base (FlashMLA's sparse indices, vLLM's
   * slot_mapping); page_records 1 and page_offset 0 give the plain record index. A layer served
   * by hs_prefetch reads its anchor's table against slot_base advanced by
   * (layer - anchor) * (slots + 1 + n) records. page_records >= 1, page_offset >= 0, and every
   * entry must fit int32 (else HS_ERR_INVALID_ARGUMENT). With draft tokens (n > 0) too; the first
   * libraries of ABI 1.4 refused that combination with HS_ERR_INVALID_ARGUMENT. */
  int32_t* page_table;
  int32_t page_records;
  int32_t page_offset;
  /* Since ABI 1.4: [max_batch] query tokens of each row this step, 1..n+1, read at run time like
   * batch_size; NULL: 1 each. Query token t of a row is position seq_len - q + t (seq_len counts the
   * drafts), its list positions[i][t] selects over [0, seq_len - q + t + 1) (resolve.h rule 8). */
  const int32_t* query_counts;
  /* Since ABI 1.9: how the launch orders itself after the previous kernel in `stream`, a set of
   * HS_RESOLVE_LAUNCH_* bits (0: an ordinary launch; other bits: HS_ERR_INVALID_ARGUMENT). The
   * results are the same either way; ignored on the host backend. */
  uint32_t launch_flags;
  /* Since ABI 1.13: the most thread blocks this launch may occupy (0: as many as the GPU holds at
   * once; negative: HS_ERR_INVALID_ARGUMENT). RESOLVE otherwise spreads its fetch over the whole
   * GPU. An engine that hides the misses by running RESOLVE on a side stream beside its own kernels
   * (docs/INTEGRATION.md, "Hiding the misses") gives it a few SMs' worth and leaves the rest to
   * them. The results are the same with any value; fewer blocks fetch more slowly. With draft
   * tokens it bounds the fetch kernel's grid (the planner keeps one block a row). Ignored on the
   * host backend. */
  int32_t max_blocks;
  /* Since ABI 1.15: the warps of each of the launch's blocks that take its fetch's queued chunks,
   * 1 to 16 (0: the library's choice: two on the whole GPU, more on a budget of max_blocks, so that
   * its few blocks keep as many loads in flight as the whole GPU; other values:
   * HS_ERR_INVALID_ARGUMENT). Tuning, not contract: the results are the same with any value. Without
   * draft tokens only; ignored on the host backend. */
  int32_t consumer_warps;
} hs_resolve_args;

/* Launch RESOLVE as a programmatic dependent of the previous kernel in the stream (CUDA's
 * programmatic dependent launch; GPUs of compute capability 9.0 and later, an ordinary launch on
 * others): its launch and scheduling overlap that kernel's tail, and every block waits for that
 * kernel to complete before it reads or writes anything, so nothing the kernel writes (the
 * selections, say) can be missed. Behind a kernel it takes 1.0-2.2 us (median 1.6) off RESOLVE's
 * time in the stream on an H200 (bench/RESULTS.md); after a copy or an event it is an ordinary
 * launch. */
#define HS_RESOLVE_LAUNCH_PROGRAMMATIC 0x1u

/* Since ABI 1.14. Launch RESOLVE beside the previous kernel in the stream (programmatic dependent
 * launch, compute capability 9.0 and later; an ordinary launch on others, and after a copy or an
 * event): it starts once that kernel's blocks have all started and asked for their dependents
 * (griddepcontrol.launch_dependents; a kernel that never asks lets it start at its end), does its
 * whole step while that kernel runs, and completes only after it, so what follows in the stream
 * sees both complete. The caller guarantees that the previous kernel neither writes what this
 * RESOLVE reads (its rows, seq_lens, batch size and selections must be written before that
 * kernel) nor touches what it writes (its rows' slots and records, out_slots, page_table, and the
 * session's RESOLVE workspace: the previous kernel must not be another of its RESOLVE launches): the
 * sparse attention of other rows, say. An engine hides one range of rows' misses under another
 * range's attention this way on one stream, and its CUDA graph stays one chain
 * (docs/INTEGRATION.md, "Hiding the misses"). Pair it with max_blocks, so that the previous kernel
 * keeps its SMs. With draft tokens it launches as HS_RESOLVE_LAUNCH_PROGRAMMATIC (waiting first).
 * Not with HS_RESOLVE_LAUNCH_PROGRAMMATIC (HS_ERR_INVALID_ARGUMENT). The results are the same. */
#define HS_RESOLVE_LAUNCH_BESIDE 0x2u

/* Since ABI 1.15. Let the next kernel in the stream, where the engine launches it as RESOLVE's
 * programmatic dependent (compute capability 9.0 and later), start as soon as every RESOLVE block
 * has started (griddepcontrol.launch_dependents first thing), not at RESOLVE's end: it then runs
 * beside RESOLVE on the SMs that max_blocks leaves, as an engine's indexer of the next rows would
 * (docs/INTEGRATION.md, "Hiding the misses"). A dependent that waits for RESOLVE
 * (griddepcontrol.wait) sees it complete as ever; one that does not must neither read what this
 * RESOLVE writes nor write what it reads, nor touch what the kernel before RESOLVE writes (with
 * HS_RESOLVE_LAUNCH_PROGRAMMATIC RESOLVE's blocks start, and let it launch, before that kernel has
 * completed), and should make its own completion wait for RESOLVE's (one of its blocks waits
 * last), so that what follows it in the stream finds both complete.
 * Combines with either flag above; without draft tokens only (ignored with them, and on the host
 * backend). The results are the same. */
#define HS_RESOLVE_LAUNCH_EARLY_DEPENDENTS 0x4u

#define HS_RESOLVE_ARGS_INIT \
  { sizeof(hs_resolve_args), 0, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 0, NULL, 0, 0, 0 }

/* RESOLVE for one layer: after it, out_slots[i][j] names the slot that holds positions[i][j]. On
 * the host backend, invalid rows fail the call with HS_ERR_INVALID_ARGUMENT (other rows proceed);
 * on the CUDA backend the error surfaces at the next hs_check_errors. */
hs_result hs_resolve(hs_session* session, const hs_resolve_args* args);

/* Prefill store: tokens [start_pos, start_pos+num_tokens) of a request, every layer; record of
 * (layer l, token t) at src + l*src_layer_stride + t*src_token_stride. A store, indexed store or
 * append that would write a host page the request maps read-only (a shared page) writes nothing of
 * that request: HS_ERR_INVALID_ARGUMENT at once on the host backend, at hs_check_errors on CUDA. */
hs_result hs_store(hs_session* session, uint64_t request_id, int32_t start_pos, int32_t num_tokens,
                   int32_t seq_len_after, const void* src, int64_t src_layer_stride, int64_t src_token_stride,
                   void* stream);

/* Since ABI 1.3. Indexed prefill store: tokens [start_pos, start_pos + num_tokens) of a request,
 * layers [first_layer, first_layer + num_layers), gathered from the engine's paged KV pool (its
 * token pool: SGLang's req_to_token row, vLLM's slot_mapping) in one launch for every layer of the
 * chunk, on `stream`. The record of (layer first_layer + l, position start_pos + t) is read at
 *   src_base + l * src_layer_stride + src_index[t] * src_token_stride
 * (src_base: the pool of layer first_layer; src_index: int32 [num_tokens], device memory on the
 * CUDA backend). Otherwise exactly hs_store restricted to those layers: the result equals hs_store
 * of the same records (store every layer of a chunk, in one call or several, before the request's
 * next hs_resolve). Pools allocated per layer apart: one call per layer (num_layers = 1).
 * Bad input writes nothing: a request not admitted here (HS_ERR_NOT_FOUND), a layer range outside
 * [0, num_layers) or empty, a token range outside the request's capacity or past seq_len_after,
 * a stride below record_bytes (HS_ERR_INVALID_ARGUMENT at once), and a src_index entry outside
 * [0, src_tokens): HS_ERR_INVALID_ARGUMENT at once on the host backend; on the CUDA backend the
 * check runs on the device, the copy is skipped and the error surfaces at hs_check_errors. */
typedef struct hs_store_indexed_args {
  uint32_t struct_size; /* sizeof(hs_store_indexed_args) */
  uint64_t request_id;
  uint32_t first_layer;
  uint32_t num_layers; /* >= 1 */
  int32_t start_pos;
  int32_t num_tokens;
  int32_t seq_len_after;    /* the request's sequence length once these tokens are stored */
  const void* src_base;     /* 16-byte aligned on the CUDA backend */
  const int32_t* src_index; /* [num_tokens] pool slot of each token */
  int64_t src_tokens;       /* records in each layer's pool: every src_index entry is below it */
  int64_t src_layer_stride; /* bytes; a multiple of 16 on the CUDA backend */
  int64_t src_token_stride; /* bytes, >= record_bytes; a multiple of 16 on the CUDA backend */
  void* stream;
} hs_store_indexed_args;

#define HS_STORE_INDEXED_ARGS_INIT \
  { sizeof(hs_store_indexed_args), 0, 0, 0, 0, 0, 0, NULL, NULL, 0, 0, 0, NULL }

hs_result hs_store_indexed(hs_session* session, const hs_store_indexed_args* args);

/* Since ABI 1.16. TOP-K: for every row of a batch of float32 scores (an indexer's, one per earlier
 * position), the positions of its k largest, as RESOLVE's positions list. No session: the engine
 * may run it in every mode it compares, full HBM included, so that their selections are the same
 * bits. For an engine that cuts a layer's rows into ranges to hide RESOLVE's misses
 * (docs/INTEGRATION.md, "Hiding the misses"): each row gets a cluster of up to 8 thread blocks, so a
 * call of a few rows costs about one row's time (k 2048 of 131,136 scores on an H100: ~34 us at
 * 1-7 rows, ~52 at 22-29, torch.topk 54-92: bench/RESULTS.md, "A top-k of a cluster a row"). The contract
 * (kernels/include/hisparse/kernels/topk.h), per row i < *batch_size: the first min(seq_lens[i], cols) scores are
 * considered (cols each when seq_lens is NULL); -inf and NaN are never selected; scores compare by the IEEE total order
 * of their bits (-0 below +0); of more than k selectable scores the k largest are taken, and of those equal to the k-th
 * largest the lowest positions; positions[i] holds them ascending, then -1 to column k. Rows past *batch_size get -1 in
 * every column. A row's list depends on its scores alone, and the CUDA kernel and the CPU reference write the same
 * bits. */
typedef struct hs_topk_args {
  uint32_t struct_size;      /* sizeof(hs_topk_args) */
  int32_t device;            /* -1: every pointer is host memory, and the CPU reference runs on the
                                calling thread; >= 0: the CUDA device whose memory they are, and one
                                kernel is enqueued on `stream` (graph-capturable; a library built
                                without CUDA: HS_ERR_UNIMPLEMENTED) */
  int32_t max_batch;         /* rows of the arrays below, >= 0 */
  int32_t k;                 /* >= 1 */
  int32_t cols;              /* scores a row may hold, 0 .. 2^30 */
  int64_t ld;                /* elements between rows of scores, >= cols */
  const float* scores;       /* [max_batch][ld] */
  const int32_t* batch_size; /* int32 [1] read at run time (one CUDA graph serves every batch), or
                                NULL: all max_batch rows */
  const int32_t* seq_lens;   /* int32 [max_batch] or NULL */
  int32_t* positions;        /* [max_batch][k], written */
  void* stream;              /* a cudaStream_t, or NULL; ignored for device -1 */
  /* Since ABI 1.17 (callers built against 1.16 pass a smaller struct_size and get NULL here).
   * after_count: NULL, or an int32 in device memory that the programs of the kernels writing
   * `scores` add 1 to as each finishes (a release: its writes before it). The top-k is then launched
   * as the programmatic dependent of the previous kernel in `stream`, and its blocks read nothing
   * until *after_count reaches after_target (an acquire), instead of waiting for that kernel and for
   * every grid still running before it: a kernel launched before it that it does not depend on (a
   * RESOLVE of other rows, HS_RESOLVE_LAUNCH_EARLY_DEPENDENTS) goes on beside it. The caller
   * guarantees that the counting kernels start before the top-k does (the previous kernel in the
   * stream counts, or one before it), that nothing the top-k may run beside writes its scores,
   * seq_lens or batch_size or touches its positions, and that the count is reset before its next use;
   * an ordinary launch after the top-k waits for everything before it as ever (docs/INTEGRATION.md,
   * "Hiding the misses"). Device memory only (device -1 with after_count: HS_ERR_INVALID_ARGUMENT);
   * after_target >= 0. The lists are the same. */
  const int32_t* after_count;
  int32_t after_target;
} hs_topk_args;

#define HS_TOPK_ARGS_INIT \
  { sizeof(hs_topk_args), -1, 0, 0, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL, 0 }

hs_result hs_topk(const hs_topk_args* args);

/* Decode append: the newest token (position seq_len-1) of every row of the batch, one layer; record
 * of batch entry i at src + i*src_stride. Since ABI 1.18 the append's kernel lets a kernel launched
 * as its programmatic dependent start at once (griddepcontrol.launch_dependents at its start), so an
 * engine's kernel that reads none of what it writes (an indexer) can run beside it; such a kernel
 * must wait for it (griddepcontrol.wait) before the stream's next kernel may rely on the records,
 * or complete only after that wait. An ordinary launch after it waits for it as before. The same
 * holds for hs_append_tokens. */
hs_result hs_append(hs_session* session, uint32_t layer, int32_t max_batch, const int32_t* batch_size,
                    const int32_t* rows, const int32_t* seq_lens, const void* src, int64_t src_stride, void* stream);
/* Since ABI 1.4. Speculative decoding append: row i appends its token_counts[i] = q newest tokens
 * (1..draft_tokens+1, read at run time; NULL: 1 each), token t being position seq_len - q + t, into
 * tail slot B + t and the host pool; record of (entry i, token t) at
 * src + (i*(draft_tokens+1) + t)*src_stride. hs_append is this with token_counts NULL. */
hs_result hs_append_tokens(hs_session* session, uint32_t layer, int32_t max_batch, const int32_t* batch_size,
                           const int32_t* rows, const int32_t* seq_lens, const int32_t* token_counts, const void* src,
                           int64_t src_stride, void* stream);

/* Exact layer-wise prefetch for a layer that shares an anchor's selection (layer_anchor at open).
 * The anchor's last hs_resolve recorded its miss plan (which records it fetched into which slots);
 * this replays it for `layer`: copies the same positions of `layer`'s own records from the host pool
 * into the same slots, and leaves `layer`'s slot table, LRU order and counters exactly as an
 * hs_resolve of `layer` with the anchor's arguments would. The anchor's out_slots then serve `layer`.
 * No planning: only copies, meant for a side stream, so they overlap the anchor layer's compute.
 * Ordering (the caller's, with events): after the anchor's hs_resolve of this step and before its
 * next one; `layer`'s hs_append and attention of the step after this. Capturable in a CUDA graph
 * (fork the side stream from the captured stream with an event, join it back before the end).
 * The copies take a few thread blocks (an eighth of the SMs; $HISPARSE_PREFETCH_BLOCKS overrides it),
 * leaving the rest of the GPU to the engine's kernels they overlap.
 * HS_ERR_FAILED_PRECONDITION when `layer` has no other anchor or the anchor was not resolved yet. */
hs_result hs_prefetch(hs_session* session, uint32_t layer, void* stream);

/* Since ABI 1.19. PREWARM: makes the GPU's translations of the host records that a RESOLVE of
 * `layer` for these rows may fetch, ahead of it, by one 16-byte read in every granule_bytes of them
 * (one in every 64 KiB by default: the GPU translates host memory 64 KiB at a time, huge pages
 * included). It writes nothing: no slot, table, record or counter changes, so it may run beside
 * anything. A RESOLVE whose misses lie in pages the GPU has not translated lately
 * waits for their translations; with them made ahead a window of 15 rows at 23% misses took 121-124
 * us instead of 175 on an H100, with a whole other window's pages translated in between
 * (bench/RESULTS.md, "Translations made ahead"). It pays only where the reads are off the step's
 * path and close before that RESOLVE: in the example engine's serving step no such place was found
 * (a side stream, beside an attention or an expert GEMM, leading the MoE: bench/RESULTS.md, "Read
 * ahead in the MoE"; docs/INTEGRATION.md, "Hiding the misses"). It helps on hosts where reads of warm
 * host pages beat cold ones; on others it costs its reads and changes nothing. Graph-capturable (batch_size is read
 * at run time); max_blocks thread blocks (0: an eighth of the SMs).
 * Entry i < *batch_size (NULL: all max_batch) reads positions [0, seq_lens[i]) of row rows[i]; -1
 * pads. A row that is not admitted or out of range, or a seq_len outside [1, its capacity], reads
 * nothing and surfaces at hs_check_errors on the CUDA backend (at once on the host backend, where it
 * reads host memory and buys nothing). layer out of range, max_batch < 0 or over the session's rows,
 * NULL rows or seq_lens, max_blocks < 0 or a granule_bytes that is not 0 or a power of two in
 * [16, 1 GiB]: HS_ERR_INVALID_ARGUMENT, nothing launched. */
typedef struct hs_prewarm_args {
  uint32_t struct_size; /* sizeof(hs_prewarm_args) */
  uint32_t layer;
  int32_t max_batch;         /* capacity of the arrays below */
  const int32_t* batch_size; /* int32 [1] read at run time, or NULL: all max_batch entries */
  const int32_t* rows;       /* [max_batch] arena rows (hs_request_info.row), -1: padding */
  const int32_t* seq_lens;   /* [max_batch] positions to read of each row, as its next RESOLVE's */
  int32_t max_blocks;        /* thread blocks to read with; 0: an eighth of the SMs */
  uint32_t granule_bytes;    /* 0: 64 KiB */
  void* stream;
  /* Read only the granules g (an address / granule_bytes) with g % granule_stride == granule_phase
   * (stride 0 or 1: every one; phase >= a stride above 1: HS_ERR_INVALID_ARGUMENT): a share that fits
   * the time beside the kernel it runs with. */
  uint32_t granule_stride;
  uint32_t granule_phase;
  /* 0, HS_RESOLVE_LAUNCH_PROGRAMMATIC (waits for the kernel before it first) or
   * HS_RESOLVE_LAUNCH_BESIDE: runs beside the kernel before it in the stream and completes after
   * it, so that one stream and one graph chain carry it (a side stream's fork in a captured graph
   * cost the example engine's whole overlap: bench/RESULTS.md, "Translations made ahead, in the
   * step"). Beside, the kernel before must ask for its dependents (griddepcontrol.launch_dependents)
   * for the reads to start before its end, and must not write rows, seq_lens or batch_size; the
   * kernel after, an ordinary launch, waits for both. Other bits: HS_ERR_INVALID_ARGUMENT. */
  uint32_t launch_flags;
} hs_prewarm_args;

#define HS_PREWARM_ARGS_INIT \
  { sizeof(hs_prewarm_args), 0, 0, NULL, NULL, NULL, 0, 0, NULL, 0, 0, 0 }

hs_result hs_prewarm(hs_session* session, const hs_prewarm_args* args);

/* Reports (and clears) data-path errors that kernels flagged since the last call. On the CUDA
 * backend it synchronizes the session's GPU (cudaDeviceSynchronize: waits for the work of every
 * stream this process has on that GPU, not only the session's), so call it off the hot path; on
 * the host backend the data path ran synchronously and errors were returned at once. */
hs_result hs_check_errors(hs_session* session);

/* Since ABI 1.6. Batched admission: n requests of the session in one round trip to the daemon
 * (an engine scheduling 64 new requests in a step makes one call, not 64). Item i is request
 * request_ids[i] with context_tokens[i] (NULL: 0 for every item) and token_budgets[i], each with
 * hs_admit's rules; an id named twice is HS_ERR_INVALID_ARGUMENT for the later item. Every
 * admitted request is mapped and its row reset exactly as hs_admit does; out_rows[i] and
 * out_capacity_tokens[i] (either may be NULL) are then set, and out_results[i] (required) holds
 * each item's code.
 *  - HS_BATCH_ALL_OR_NOTHING: HS_OK with every item admitted, or the code of the item that failed
 *    the batch, with nothing admitted (what the daemon had admitted is released again): that item's
 *    out_results entry is its code, every other item's HS_ERR_ABORTED, and hs_last_error() names
 *    the item. The daemon never evicts for such a batch: a full pool fails it.
 *  - HS_BATCH_PER_ITEM: each item on its own; HS_OK once the batch ran, whatever its items' codes.
 *    Under the daemon's evict_lru_idle an item may evict as hs_admit would, never a request of its
 *    own batch.
 * Errors of the whole call (out_results then untouched): HS_ERR_INVALID_ARGUMENT (n 0 or above
 * HS_BATCH_MAX_ITEMS, NULL arrays, an unknown mode), HS_ERR_PERMISSION_DENIED, HS_ERR_UNAVAILABLE. */
#define HS_BATCH_MAX_ITEMS 1024
typedef enum hs_batch_mode { HS_BATCH_ALL_OR_NOTHING = 1, HS_BATCH_PER_ITEM = 2 } hs_batch_mode;
hs_result hs_admit_batch(hs_session* session, size_t n, const uint64_t* request_ids, const uint32_t* context_tokens,
                         const uint32_t* token_budgets, hs_batch_mode mode, hs_result* out_results, uint32_t* out_rows,
                         uint32_t* out_capacity_tokens);
/* Since ABI 1.6. Releases n requests (1..HS_BATCH_MAX_ITEMS) in one round trip: out_results[i]
 * (required) is HS_OK (released), HS_ERR_NOT_FOUND (not admitted in this session) or
 * HS_ERR_INVALID_ARGUMENT (an id named twice); the others are released all the same. Returns HS_OK
 * once the batch ran; errors of the whole call as hs_admit_batch's. */
hs_result hs_release_batch(hs_session* session, size_t n, const uint64_t* request_ids, hs_result* out_results);
/* Since ABI 1.6 */

/* Parks a request (preemption without re-prefill): its row of the slot arena is given back (the
 * daemon may hand it to another request at once) and every host page stays. Parked, it counts
 * against the tenant's quotas (host bytes, pages, requests), is listed as parked, and is the first
 * to be evicted under admission.on_pool_full = evict_lru_idle. No data-path call may name its old
 * row; hs_store refuses it (HS_ERR_FAILED_PRECONDITION); hs_record_ptr still reads its records.
 * HS_ERR_NOT_FOUND: not admitted in this session. HS_ERR_FAILED_PRECONDITION: parked already. */
hs_result hs_park(hs_session* session, uint64_t request_id);
/* Gives a parked request a row again (out->row; possibly another than before), whose slot state
 * is reset as after hs_admit (every slot EMPTY): the first hs_resolve fetches what it selects. As
 * after hs_admit, the newest token's slot (B) is written by the next hs_append or hs_store: a decode
 * step appends before it resolves, so resume, then append the step's token, then resolve.
 * HS_ERR_RESOURCE_EXHAUSTED: every row is in use (it stays parked). HS_ERR_NOT_FOUND: not admitted.
 * HS_ERR_FAILED_PRECONDITION: not parked. `out` may be NULL. */
hs_result hs_resume(hs_session* session, uint64_t request_id, hs_request_info* out);
/* hs_admit whose first prefix_tokens positions start as those of request parent_request_id (of
 * this session, live or parked): the parent's full pages below prefix_tokens are shared, read-only
 * in both tables from now on (a store or append into them fails), and a page the prefix ends inside
 * is the new request's own copy. The tenant is charged each shared page once; releasing either
 * request leaves the other exact. HS_ERR_NOT_FOUND: no such parent here. HS_ERR_INVALID_ARGUMENT:
 * prefix_tokens 0, above the parent's capacity or above token_budget, or the parent is the request
 * itself. Otherwise as hs_admit. */
hs_result hs_admit_shared(hs_session* session, uint64_t request_id, uint32_t context_tokens, uint32_t token_budget,
                          uint64_t parent_request_id, uint32_t prefix_tokens, hs_request_info* out);
// Since ABI 1.6
/* Import from a prefill node (docs/DESIGN.md, "Import"). hs_admit_import admits the request as
 * importing: the daemon reserves its pages and row and issues a transfer grant for them, which
 * hs_import_grant copies out (a serialized hisparse.v1.ImportGrant) for the transfer agent (e.g.
 * `hisparse-bench import`): it writes the records over UCX and commits with the grant. Until then
 * the request is not usable here: no page table is published, hs_record_ptr and hs_resolve do not
 * know it. hs_await_import waits up to timeout_ms for the outcome: committed, the request is
 * installed as hs_admit would (out as hs_admit's); aborted or expired (import.grant_ttl),
 * HS_ERR_FAILED_PRECONDITION (the daemon freed it already); still pending, HS_ERR_UNAVAILABLE.
 * hs_release of an importing request aborts the import (so does the daemon when its import worker
 * dies: the reason says so). hs_admit_import: hs_admit's errors, HS_ERR_FAILED_PRECONDITION when
 * the daemon serves no imports (built without UCX, or import.enabled false), and
 * HS_ERR_UNAVAILABLE while its import worker restarts (retry). */
hs_result hs_admit_import(hs_session* session, uint64_t request_id, uint32_t context_tokens, uint32_t token_budget);
/* Copies the grant into buf when capacity suffices; *grant_bytes gets its size either way (buf may
 * be NULL with capacity 0 to ask the size). HS_ERR_RESOURCE_EXHAUSTED when capacity is too small;
 * HS_ERR_NOT_FOUND when no import of request_id is pending. */
hs_result hs_import_grant(hs_session* session, uint64_t request_id, void* buf, size_t capacity, size_t* grant_bytes);
hs_result hs_await_import(hs_session* session, uint64_t request_id, uint32_t timeout_ms, hs_request_info* out);
/* Since ABI 1.7 */
/* hs_admit for the session's TP group (hs_session_options.group): every rank calls it for the same
 * request_id and token_budget, as TP ranks running one scheduler do. The first call reserves the
 * request for the whole group or for none of it: one set of host pages, owned by the group, and a
 * free row in every rank's session; each later rank's call attaches, getting its own row (out->row)
 * and the same pages. Pages are writable from every rank: ranks of a replicated (MLA) layout append
 * the same bytes, and one rank may store the prefill for all once the engine orders that store
 * before the others' first hs_resolve, which each rank precedes with its own hs_append of the step's
 * token (the newest token's slot B is in each rank's arena). Each rank releases its own share with hs_release (or by
 * closing); the pages go with the last. hs_extend of a group request grows its pages for every rank
 * (all or nothing); each other rank then calls hs_extend with the same budget, which maps them.
 * Errors besides hs_admit's: HS_ERR_FAILED_PRECONDITION (the session is in no group, a rank has no
 * session yet, or the group holds request_id without a row of this rank), HS_ERR_INVALID_ARGUMENT
 * (token_budget differs from the first rank's), HS_ERR_RESOURCE_EXHAUSTED (the pool, the quota or
 * any rank's rows: nothing is reserved), HS_ERR_ALREADY_EXISTS (this rank attached it already). */
hs_result hs_admit_group(hs_session* session, uint64_t request_id, uint32_t context_tokens, uint32_t token_budget,
                         hs_request_info* out);

/* Since ABI 1.7 */
/* Durable requests (docs/DESIGN.md, "Durable requests"): survive the engine. A request with a
 * running lease is not released when its session ends (hs_session_close, or the process's death):
 * it stays in the daemon, parked, with its host pages (counting against the tenant's quotas), until
 * a new session of the same uid and engine_name adopts it or the lease ends. hs_admit_durable is
 * hs_admit with a lease of lease_seconds from now (0: not durable); hs_set_lease sets, renews or
 * clears (0) one. Errors besides hs_admit's: HS_ERR_INVALID_ARGUMENT (above the daemon's
 * durability.max_lease_seconds), HS_ERR_FAILED_PRECONDITION (durability off, or the request is
 * importing: set its lease after hs_await_import). */
hs_result hs_admit_durable(hs_session* session, uint64_t request_id, uint32_t context_tokens, uint32_t token_budget,
                           uint32_t lease_seconds, hs_request_info* out);
hs_result hs_set_lease(hs_session* session, uint64_t request_id, uint32_t lease_seconds);
/* What ended sessions of this uid and engine_name left, whose lease runs, in (dead session,
 * request) order (every page the daemon answers, fetched here): entry i is request request_ids[i] of
 * ended session dead_session_ids[i], with
 * lease_seconds_left[i] (each array may be NULL). Up to capacity entries are written; *count (not
 * NULL) gets how many there are: HS_ERR_RESOURCE_EXHAUSTED when capacity is smaller. */
hs_result hs_list_adoptable(hs_session* session, uint64_t* dead_session_ids, uint64_t* request_ids,
                            double* lease_seconds_left, size_t capacity, size_t* count);
/* Adopts every durable request of the ended session dead_session_id (all at once: they share its
 * slabs): each becomes this session's under its own id, parked, with its pages, shared prefixes and
 * lease; hs_resume each to get a row (reset: the old row's slot state died with the old arena), then
 * append and resolve as usual: the records are where the dead engine left them. Their ids go to
 * out_request_ids (up to capacity; may be NULL with capacity 0) and their number to *count (not
 * NULL); the adoption is done whatever the capacity. HS_ERR_NOT_FOUND: no such ended session, or
 * every lease ended. HS_ERR_PERMISSION_DENIED: another uid or engine_name.
 * HS_ERR_FAILED_PRECONDITION: another geometry (num_layers, record_bytes, records per page) or page
 * tables too small (max_context_tokens). HS_ERR_ALREADY_EXISTS: this session uses one of the ids. */
hs_result hs_adopt(hs_session* session, uint64_t dead_session_id, uint64_t* out_request_ids, size_t capacity,
                   size_t* count);

/* Since ABI 1.8 */
/* Batched park and resume: n requests (1..HS_BATCH_MAX_ITEMS) of the session in one round trip
 * (an engine preempting 64 requests in a step makes one call, not 64). Item i is request_ids[i],
 * parked as hs_park or resumed as hs_resume would; out_results[i] (required) holds its code: those
 * of hs_park / hs_resume, and HS_ERR_INVALID_ARGUMENT for an id an earlier item names. A resumed
 * item's row and capacity go to out_rows[i] and out_capacity_tokens[i] (either may be NULL), its
 * row reset as after hs_resume; one this process cannot install is parked again, as hs_resume does.
 *  - HS_BATCH_ALL_OR_NOTHING: HS_OK with every item done, or the failing item's code with nothing
 *    changed (parked items unparked again in their rows; resumed ones parked again): that item's
 *    out_results entry is its code, every other item's HS_ERR_ABORTED, and hs_last_error() names it.
 *  - HS_BATCH_PER_ITEM: each item on its own; HS_OK once the batch ran, whatever its items' codes.
 * Errors of the whole call (out_results then untouched): as hs_admit_batch's. */
hs_result hs_park_batch(hs_session* session, size_t n, const uint64_t* request_ids, hs_batch_mode mode,
                        hs_result* out_results);
hs_result hs_resume_batch(hs_session* session, size_t n, const uint64_t* request_ids, hs_batch_mode mode,
                          hs_result* out_results, uint32_t* out_rows, uint32_t* out_capacity_tokens);
/* hs_admit_batch whose every item is admitted as hs_admit_import admits it (importing: each with
 * its own grant, which hs_import_grant copies out; hs_await_import installs each once committed).
 * An import never evicts. HS_ERR_FAILED_PRECONDITION for each item where the daemon serves no
 * imports. HS_BATCH_ALL_OR_NOTHING that fails leaves no import open: every grant the batch had
 * registered is revoked before its pages are freed. Modes, codes and errors as hs_admit_batch's. */
hs_result hs_admit_import_batch(hs_session* session, size_t n, const uint64_t* request_ids,
                                const uint32_t* context_tokens, const uint32_t* token_budgets, hs_batch_mode mode,
                                hs_result* out_results);

/* Since ABI 1.10: one admission verb. hs_admit_args says everything about one admission; zero in
 * every field but struct_size (HS_ADMIT_ARGS_INIT) is a plain hs_admit, and each option selects
 * what one of the older calls did:
 *  - parent_request_id (non-zero) with prefix_tokens >= 1: a shared prefix, as hs_admit_shared;
 *  - lease_seconds >= 1: durable from admission, as hs_admit_durable (with a parent too);
 *  - HS_ADMIT_GROUP in flags: for the session's TP group, as hs_admit_group;
 *  - HS_ADMIT_IMPORT in flags: importing, as hs_admit_import (out gets the daemon's reservation:
 *    the row and capacity hs_await_import will install; hs_import_grant copies the grant out).
 * Combinations the daemon cannot serve are HS_ERR_INVALID_ARGUMENT before any RPC, with
 * hs_last_error() naming the fields: a parent without prefix_tokens or prefix_tokens without a
 * parent; HS_ADMIT_GROUP with a parent, lease_seconds or HS_ADMIT_IMPORT; HS_ADMIT_IMPORT with a
 * parent or lease_seconds; unknown flag bits. Every other error is the older call's.
 * A request the daemon admitted but this process cannot install (mapping its slabs, registering
 * them with the device, publishing its page table) is released in the daemon again before the
 * call returns the install's error, by hs_admit2 as by hs_admit_batch2. */
#define HS_ADMIT_GROUP 0x1u  /* hs_admit_args.flags: for the session's TP group */
#define HS_ADMIT_IMPORT 0x2u /* hs_admit_args.flags: importing (a transfer grant; hs_await_import) */

typedef struct hs_admit_args {
  uint32_t struct_size; /* sizeof(hs_admit_args) */
  uint32_t flags;       /* HS_ADMIT_GROUP, HS_ADMIT_IMPORT; 0: neither */
  uint64_t request_id;
  uint32_t context_tokens;
  uint32_t token_budget;
  uint64_t parent_request_id; /* shared prefix: the parent (of this session); 0: none */
  uint32_t prefix_tokens;     /* shared prefix: its length (>= 1 with a parent, 0 without) */
  uint32_t lease_seconds;     /* durable from admission for this long; 0: not durable */
} hs_admit_args;

#define HS_ADMIT_ARGS_INIT \
  { sizeof(hs_admit_args), 0, 0, 0, 0, 0, 0, 0 }

/* One admission as `args` says; out (may be NULL) as hs_admit's. */
hs_result hs_admit2(hs_session* session, const hs_admit_args* args, hs_request_info* out);
/* n admissions (1..HS_BATCH_MAX_ITEMS) in one round trip, with hs_admit_batch's modes, rollback
 * and codes. items is an array of n hs_admit_args laid out with the stride items[0].struct_size
 * (every item must carry that struct_size); out_infos (may be NULL) one of n hs_request_info with
 * the stride out_infos[0].struct_size, whose admitted entries are written as hs_admit2 writes
 * out. An item may be importing (HS_ADMIT_IMPORT) or durable (lease_seconds) beside plain ones;
 * a shared prefix or HS_ADMIT_GROUP is HS_ERR_INVALID_ARGUMENT for the whole call (the daemon's
 * batch serves neither: admit those with hs_admit2), as is a contradictory item (hs_admit2's
 * rules); hs_last_error() names the item and its fields. */
hs_result hs_admit_batch2(hs_session* session, size_t n, const hs_admit_args* items, hs_batch_mode mode,
                          hs_result* out_results, hs_request_info* out_infos);

#ifdef __cplusplus
}
#endif

#endif /* HISPARSE_HISPARSE_H_ */
