// ClientSession: the engine side of one hisparse session — the C++ implementation behind the
// C ABI (hisparse.h). It holds the gRPC session stream (whose life is the session's), the fd
// channel, this process's mappings of the session's pool slabs and arena, the table of
// admitted requests, and the device backend that runs the data path.
//
// Thread-safe for control calls (Admit/Extend/Release/Stats may come from several threads). The
// lock (mu_) covers this process's tables only: RPCs, fd-channel exchanges, mmap and the device's
// registration of new slabs run outside it (client_slabs.cc), so a control call mapping a slab
// never stalls the data path or another control call. Data-path calls must be ordered by the
// caller and must not run on a request while a control call on that request is in flight.
#ifndef HISPARSE_CLIENT_CLIENT_SESSION_H_
#define HISPARSE_CLIENT_CLIENT_SESSION_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "device_backend.h"
#include "grpc_status.h"
#include "hisparse/common/control_lane.h"
#include "hisparse/common/fd_channel_codec.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/hisparse.h"
#include "hisparse/v1/arena_kind.h"
#include "hisparse/v1/hisparse.grpc.pb.h"

namespace hisparse {

// Seconds from t0 to now (the phase timings of session open and slab mapping).
inline double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

class ClientSession {
 public:
  // Where Open spent its time (seconds), for the session-open benchmark (bench/session_open_cmd).
  // Both, as the C ABI reports them (hs_session_get_timings).
  hs_session_timings Timings() const ABSL_LOCKS_EXCLUDED(mu_);
  struct OpenPhases {
    double open_rpc_s = 0;       // the OpenSession round trip (includes the daemon's arena creation)
    double daemon_create_s = 0;  // of which the daemon allocated, cleared and exported the arena
    double backend_init_s = 0;   // the device backend's setup (CUDA context, workspace)
    double fetch_arena_s = 0;    // the fd channel round trip for the arena (fd or cudaIpc handle)
    double import_s = 0;         // cuMemImportFromShareableHandle / cuIpcOpenMemHandle
    double map_s = 0;            // cuMemAddressReserve + cuMemMap + cuMemSetAccess (VMM only)
    double attach_s = 0;         // the whole attach: import + map (+ host mmap for host arenas)
    double total_s = 0;          // Open, end to end
  };
  // Host-pool slabs this session mapped (mmap) and registered with its device (on Admit/Extend).
  struct HostMapPhases {
    uint32_t slabs = 0;
    uint64_t bytes = 0;
    double fetch_s = 0;     // fd channel round trips
    double mmap_s = 0;      // mmap of the memfds
    double register_s = 0;  // cudaHostRegister (mapped, portable) + device pointer; ~0 on host
  };

  // Wraps the device backend Open made (the options' choice) before the session uses it: the seam
  // by which tests inject device failures. Unset: the backend as made.
  using BackendWrap = std::function<std::unique_ptr<DeviceBackend>(std::unique_ptr<DeviceBackend>)>;
  static absl::StatusOr<std::unique_ptr<ClientSession>> Open(const hs_session_options& options,
                                                             const BackendWrap& wrap = nullptr);
  ~ClientSession();

  // One admission as `args` says (hs_admit_args, hisparse.h; client_admit.cc): plain, with a
  // shared prefix, durable, for the TP group, or importing. Contradictory args are InvalidArgument
  // before any RPC (CheckAdmitArgs). An admitted request is mapped, published and its row reset
  // (importing: kept pending instead, and the result is the daemon's reservation); one this
  // process cannot install is released in the daemon again before the install's error returns.
  // A shared prefix's pages become read-only in the parent's table too.
  absl::StatusOr<hs_request_info> Admit(const hs_admit_args& args) ABSL_LOCKS_EXCLUDED(mu_, fd_mu_);
  // A plain admission: Admit with only these fields set.
  absl::StatusOr<hs_request_info> Admit(uint64_t request_id, uint32_t context_tokens, uint32_t token_budget)
      ABSL_LOCKS_EXCLUDED(mu_, fd_mu_);
  absl::StatusOr<hs_request_info> Extend(uint64_t request_id, uint32_t token_budget) ABSL_LOCKS_EXCLUDED(mu_, fd_mu_);
  absl::Status Release(uint64_t request_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Batched admission (client_batch.cc): one AdmitBatch RPC for every item; each request the
  // daemon admitted is mapped and its page-table row published as Admit does. The returned error
  // is the batch's own (the session, the item count, an item the batch cannot carry
  // (CheckBatchAdmitArgs), the RPC); each item's is in `items`.
  // all_or_nothing: any failure, the daemon's or this process's (mapping a slab after the daemon
  // admitted), leaves nothing admitted, here or in the daemon (what it admitted is released
  // again); the failing item carries its error and every other ABORTED. PER_ITEM: an item this
  // process cannot install is released in the daemon, as Admit does.
  // HS_ADMIT_IMPORT items: admitted importing as Admit does (not installed: ImportGrant and
  // AwaitImport; the result's row and capacity are the daemon's reservation).
  struct BatchAdmitted {
    std::vector<absl::StatusOr<hs_request_info>> items;  // one per item, in order
    int failed_item = -1;                                // all_or_nothing: the item that failed the batch
  };
  absl::StatusOr<BatchAdmitted> AdmitBatch(const std::vector<hs_admit_args>& items, bool all_or_nothing)
      ABSL_LOCKS_EXCLUDED(mu_, fd_mu_);
  // One ReleaseBatch RPC: each id's status (NOT_FOUND, or INVALID_ARGUMENT for a repeated id); the
  // others are released, here and in the daemon.
  absl::StatusOr<std::vector<absl::Status>> ReleaseBatch(const std::vector<uint64_t>& request_ids)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Batched park and resume (client_batch_parking.cc): one ParkBatch / ResumeBatch RPC, then each
  // item as Park / Resume does here. all_or_nothing: any failure, the daemon's or this process's
  // (installing a resumed row), leaves every item as it was, here and in the daemon (what the
  // daemon resumed is parked again); the failing item carries its error, every other ABORTED.
  // PER_ITEM: a resumed item this process cannot install is parked again, as Resume does.
  struct BatchParked {
    std::vector<absl::Status> items;  // one per id, in order
    int failed_item = -1;
  };
  absl::StatusOr<BatchParked> ParkBatch(const std::vector<uint64_t>& request_ids, bool all_or_nothing)
      ABSL_LOCKS_EXCLUDED(mu_);
  struct BatchResumed {
    std::vector<absl::StatusOr<hs_request_info>> items;  // one per id, in order
    int failed_item = -1;
  };
  absl::StatusOr<BatchResumed> ResumeBatch(const std::vector<uint64_t>& request_ids, bool all_or_nothing)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Park and resume (client_parking.cc). Park unpublishes the request's row (the daemon may give
  // it to another request) and keeps its pages mapped; Resume publishes its pages in the row the
  // daemon gives and resets that row's slot state (every slot EMPTY, as Admit does). A parked
  // request refuses store (FAILED_PRECONDITION); its records stay readable through RecordPtr.
  absl::Status Park(uint64_t request_id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<hs_request_info> Resume(uint64_t request_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Durable requests (client_durable.cc; docs/DESIGN.md, "Durable requests"). SetLease sets,
  // renews or clears one (0) and returns the seconds left (Admit takes one at admission). Adopt
  // takes every durable request the ended session `dead_session_id` left (same uid and engine
  // name) and installs each here parked, its slabs mapped; Resume gives each a row. Returns their ids.
  absl::StatusOr<double> SetLease(uint64_t request_id, uint32_t lease_seconds);
  // Every page of the daemon's ListAdoptable, in (dead session, request) order.
  absl::StatusOr<std::vector<v1::AdoptableRequest>> ListAdoptable();
  absl::StatusOr<std::vector<uint64_t>> Adopt(uint64_t dead_session_id) ABSL_LOCKS_EXCLUDED(mu_, fd_mu_);
  absl::StatusOr<uint8_t*> RecordPtr(uint64_t request_id, uint32_t layer, uint32_t position) ABSL_LOCKS_EXCLUDED(mu_);

  // Riding through a daemon's restart (client_recover.cc; docs/DESIGN.md, "Engines ride through a
  // restart"). Whether the session stream is up: false once the daemon ended it, went away, or
  // restarted. From then on every call that needs the daemon, and every data-path call, is
  // UNAVAILABLE, and every row is unpublished: a RESOLVE row whose state is unknown is refused
  // (kResolveBadSeqLen), even from a captured graph, never served from stale memory.
  bool alive() const { return alive_; }
  // What Recover kept and lost, each list in request-id order.
  struct Recovery {
    // request_id; row, its row in the new session (-1: parked, as it was, or no row was free);
    // capacity_tokens. The C ABI's struct: hs_recovery_kept copies it out as it is.
    using Kept = hs_recovered_request;
    uint64_t old_session_id = 0;
    uint64_t new_session_id = 0;
    std::vector<Kept> kept;      // durable requests of this session, adopted with the same pages
    std::vector<uint64_t> lost;  // every other request this session held (or was importing)
    // The slot arena is at another address (a daemon of another arena kind or page geometry, or a
    // cuda-ipc arena): CUDA graphs captured over the old one must be captured again.
    bool arena_moved = false;
    uint32_t attempts = 0;      // sessions tried before one opened
    double seconds = 0;         // Recover, end to end
    double reopen_seconds = 0;  // of which until a session opened (the daemon coming back)
  };
  struct Recovered {
    std::unique_ptr<ClientSession> session;
    Recovery recovery;
  };
  // After this session ended (!alive(); FailedPrecondition before): opens a new session with the
  // same options on whatever daemon now answers at the address, retrying with backoff (20 ms
  // doubling to 1 s) while it cannot be reached, until `timeout`; adopts this session's durable
  // requests there (the same pages: nothing is prefilled again), resumes those that were live,
  // and says which requests were kept and which were lost. This session is not changed: the
  // caller puts the new one in its place once the kernels it launched on this one are done.
  // A failed Recover returns its error with this session unchanged and may be called again: a
  // session it opened and lost on the way (the daemon went away again) is adopted from next time.
  absl::StatusOr<Recovered> Recover(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_, recover_mu_);

  absl::StatusOr<v1::StatsResponse> NodeStats();
  hs_session_info Info() const;
  // RESOLVE counters as the data path left them (the daemon reads the same for host arenas).
  absl::StatusOr<ArenaCounters> Counters() { return backend_->ReadCounters(); }
  hs_backend backend_kind() const { return backend_->kind(); }
  // How the daemon shares the slot arena (SessionOpened.arena; an old daemon's string read too).
  v1::ArenaKind arena_kind() const { return v1::ArenaKindOf(opened_.arena()); }
  const OpenPhases& open_phases() const { return open_phases_; }
  // The slot arena as kernels see it (device addresses on the CUDA backend), for benchmarks.
  const ArenaView& arena_view() const { return arena_; }
  HostMapPhases host_map_phases() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return host_map_phases_;
  }
  uint64_t session_id() const { return opened_.session_id(); }

  absl::Status Resolve(const hs_resolve_args& args) ABSL_LOCKS_EXCLUDED(mu_);
  // hs_prewarm: the GPU's translations of rows' host records of a layer, made ahead (PrewarmDesc).
  absl::Status Prewarm(const hs_prewarm_args& args) ABSL_LOCKS_EXCLUDED(mu_);
  // hs_prefetch: replays `layer`'s anchor's last miss plan into `layer` (ReplayDesc).
  absl::Status Prefetch(uint32_t layer, void* stream) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Store(uint64_t request_id, int32_t start_pos, int32_t num_tokens, int32_t seq_len_after, const void* src,
                     int64_t layer_stride, int64_t token_stride, void* stream) ABSL_LOCKS_EXCLUDED(mu_);
  // hs_store_indexed: every argument the host can see is checked here (nothing written otherwise).
  absl::Status StoreIndexed(const hs_store_indexed_args& args) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Append(uint32_t layer, int32_t max_batch, const int32_t* batch_size, const int32_t* rows,
                      const int32_t* seq_lens, const int32_t* token_counts, const void* src, int64_t src_stride,
                      void* stream) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CheckErrors();
  // Requests the daemon evicted since the last call (their memory is gone; re-prefill or fail them).
  std::vector<uint64_t> TakeEvicted() ABSL_LOCKS_EXCLUDED(mu_);
  // Puts back ids the caller had no room for (they come first next time).
  void ReturnEvicted(std::vector<uint64_t> ids) ABSL_LOCKS_EXCLUDED(mu_);

  // Imports from a prefill node (client_import.cc; docs/DESIGN.md, "Import"). Admit with
  // HS_ADMIT_IMPORT admits the request as importing: the daemon reserves its pages and row and
  // answers a grant, which ImportGrant returns serialized (v1::ImportGrant) for the transfer
  // agent. The request is not published to the data path (no page table, no row) until
  // AwaitImport sees the daemon's ImportFinished: committed, it is installed as Admit would and
  // returned (one this process cannot install is released in the daemon); aborted or expired,
  // FailedPrecondition with the daemon's reason (the daemon freed it already). A timeout leaves
  // it pending (DeadlineExceeded).
  absl::StatusOr<std::string> ImportGrant(uint64_t request_id) const ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<hs_request_info> AwaitImport(uint64_t request_id, uint32_t timeout_ms)
      ABSL_LOCKS_EXCLUDED(mu_, fd_mu_);

 private:
  // One slab of the session's host pool, mapped and registered once, the first time a request of
  // this session has a page in it. Owns its mapping and registration: destroying it unregisters
  // the mapping from the device (when registered) and unmaps it, which the session does after
  // letting go of mu_ (a dropped slab is moved out of slabs_ first).
  struct Slab {
    Slab() = default;
    Slab(MappedRegion m, uint8_t* addr, DeviceBackend* backend)
        : map(std::move(m)), kernel_addr(addr), registered_with(backend) {}
    Slab(Slab&& o) noexcept
        : map(std::move(o.map)),
          kernel_addr(std::exchange(o.kernel_addr, nullptr)),
          live_pages(std::exchange(o.live_pages, 0)),
          left(o.left),
          file(o.file),
          registered_with(std::exchange(o.registered_with, nullptr)) {}
    Slab& operator=(Slab&& o) noexcept {
      if (this != &o) {
        Unregister();
        map = std::move(o.map);
        kernel_addr = std::exchange(o.kernel_addr, nullptr);
        live_pages = std::exchange(o.live_pages, 0);
        left = o.left;
        file = o.file;
        registered_with = std::exchange(o.registered_with, nullptr);
      }
      return *this;
    }
    ~Slab() { Unregister(); }
    void Unregister() {
      if (registered_with != nullptr) std::exchange(registered_with, nullptr)->UnregisterHostSegment(map.data());
    }

    MappedRegion map;
    uint8_t* kernel_addr = nullptr;  // where kernels see it (device-mapped on CUDA)
    // Pages of this session's requests in it. At 0 the slab stays mapped (idle: the daemon keeps an
    // idle slab for the session's next request) until the daemon says it left (SlabRetired), or at
    // once when this daemon sends no such notice (SessionOpened.slab_retired_notices).
    uint64_t live_pages = 0;
    bool left = false;                         // the daemon's SlabRetired named it: dropped at 0
    std::pair<uint64_t, uint64_t> file{0, 0};  // the memfd's (st_dev, st_ino): which memory it maps
    DeviceBackend* registered_with = nullptr;  // the backend holding its registration (none: null)
  };
  using SlabIds = absl::flat_hash_set<uint64_t>;
  // Why a slab a step needs is not in slabs_: its fetch, mmap or registration failed.
  using SlabErrors = absl::flat_hash_map<uint64_t, absl::Status>;
  // What MapSlabs did outside mu_: mappings not yet published, and the slabs it could not map.
  struct SlabWork {
    std::vector<std::pair<uint64_t, Slab>> fresh;
    SlabErrors failed;
    HostMapPhases phases;  // fetch, mmap and registration time of this work
  };
  struct Request {
    uint32_t row = 0;  // meaningless while parked
    bool parked = false;
    uint32_t capacity = 0;
    std::vector<std::vector<v1::PageRef>> layers;  // per layer, in position order
  };
  // An import between AdmitImport and AwaitImport. The daemon's ImportFinished may come first.
  struct PendingImport {
    bool admitted = false;
    v1::AdmitResponse admit;  // its row, capacity, pages and grant
    bool finished = false;
    bool committed = false;
    std::string reason;
  };
  // An import the daemon admitted (AdmitImport, an AdmitBatch import item): kept pending for
  // ImportGrant and AwaitImport, not installed. InternalError when the answer has no grant for it.
  absl::StatusOr<hs_request_info> PendImportLocked(uint64_t request_id, v1::AdmitResponse resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // AwaitImport's wait: the committed import's answer (taken out of imports_), or its error.
  absl::StatusOr<v1::AdmitResponse> AwaitImportOutcome(uint64_t request_id, uint32_t timeout_ms)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The stream's ImportFinished: records the outcome for AwaitImport.
  void OnImportFinished(const v1::ImportFinished& finished) ABSL_LOCKS_EXCLUDED(mu_);
  // One fd-channel object: a descriptor, or (a "cuda-ipc" arena) a cudaIpc handle.
  struct Fetched {
    UniqueFd fd;
    uint64_t bytes = 0;
    std::string ipc_handle;
  };

  // The options this session was opened with, owned (its pointers point into the strings here),
  // for Recover to open the next session with.
  struct SavedOptions {
    hs_session_options options{};
    std::string address;  // resolved: the option, $HISPARSE_DAEMON or the default
    std::string engine_name;
    std::string group;
    std::vector<int32_t> layer_anchor;
    BackendWrap wrap;
  };
  static SavedOptions Save(const hs_session_options& options, std::string address, const BackendWrap& wrap);

  ClientSession() = default;
  // Open: runs the steps below in their order and returns the first failure. `predecessor`
  // (Recover's): the session this one follows, whose backend, miss plans and arena addresses it
  // keeps where it can.
  absl::Status Connect(const hs_session_options& options, const BackendWrap& wrap,
                       ClientSession* predecessor = nullptr);
  // Recover's steps (client_recover.cc). Opens the next session, retrying while the daemon is
  // unreachable until `deadline`.
  absl::StatusOr<std::unique_ptr<ClientSession>> Reopen(absl::Time deadline, uint32_t* attempts);
  // Moves this (ended) session's slab mappings to `successor`, which takes those the new daemon
  // names by the same memory (memfd inode) instead of mapping and registering them again.
  void HandSlabsTo(ClientSession* successor) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends Recover's success: the arena (and its host mapping) is the successor's from now on.
  void HandArenaTo(ClientSession* successor);
  // A session whose durable requests the next one adopts: this one, and any Recover opened and
  // lost (its adoption may have happened before the daemon went away again).
  struct Predecessor {
    uint64_t session_id = 0;
    std::string daemon_instance;  // SessionOpened.daemon_instance: which daemon process held it
  };
  // What this session held when it ended: each request (live, parked or importing) and whether
  // it was parked, which had a lease (and whether one is running still), and eviction notices
  // the engine has not taken yet.
  struct Held {
    absl::flat_hash_map<uint64_t, bool> parked;  // every request; true: parked
    absl::flat_hash_set<uint64_t> leased;
    bool lease_running = false;
    std::vector<uint64_t> evicted;
  };
  Held HeldRequests() const ABSL_LOCKS_EXCLUDED(mu_);
  // Adopts every predecessor's durable requests into this (new) session, releases those `held`
  // does not name (not this engine's), resumes those that were live, and fills `out`'s kept and
  // lost. A predecessor of this same daemon process may not have ended yet when this session
  // opened: NotFound is retried for a while then.
  absl::Status AdoptPredecessors(const std::vector<Predecessor>& predecessors, const Held& held, absl::Time deadline,
                                 Recovery* out) ABSL_LOCKS_EXCLUDED(mu_, fd_mu_);
  // Unpublishes every live request's row (the stream ended: their state is unknown).
  void UnpublishAllLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records that `request_id`'s lease has `seconds` left from now (0: none).
  void NoteLease(uint64_t request_id, double seconds) ABSL_LOCKS_EXCLUDED(mu_);
  // The geometry as the daemon gets it (geometry_), as kernels see it, and the layer anchors.
  void SetGeometry(const hs_session_options& options);
  // The TP group the options name (group_), if any (client_groups.cc).
  void SetGroup(const hs_session_options& options);
  // The gRPC channel, connected within timeout_ms: UNAVAILABLE when the daemon is not reached.
  absl::Status OpenStream(const std::string& address);
  // Opens the session stream, sends OpenSession and waits at most timeout_ms for SessionOpened
  // (a watchdog cancels the stream); starts the stream's watcher. The daemon's refusal is
  // returned with its code.
  absl::Status AwaitOpened(const std::string& engine_name);
  // The device backend the options ask for (CUDA falls back to host under HS_BACKEND_AUTO).
  absl::Status InitBackend(const hs_session_options& options, const BackendWrap& wrap, ClientSession* predecessor);
  // The page-table geometry the daemon's SessionOpened announced (records per page, table stride).
  HostPageGeometry HostPages() const;
  // The arena object from the fd channel, at least as large as the geometry needs.
  absl::StatusOr<Fetched> FetchArena();
  // One miss plan per anchor layer that has followers (plans_, plan_max_batch_).
  absl::Status AllocMissPlans(const ClientSession* predecessor);
  // Attaches the fetched arena as its kind (SessionOpened.arena.kind) says: arena_, arena_map_
  // (a predecessor's host mapping, in place, when of the same size).
  absl::Status AttachArena(const Fetched& arena, ClientSession* predecessor);

  void WatchStream() ABSL_LOCKS_EXCLUDED(mu_);
  std::unique_ptr<grpc::ClientContext> CallContext() const;
  // A lifecycle call (client_lane.cc): over the session's control lane when it has one
  // (hisparse/common/control_lane.h), else as the gRPC call `rpc`; errors as FromGrpc makes them.
  template <typename Req, typename Resp>
  absl::Status Call(LaneVerb verb, grpc::Status (v1::HiSparse::Stub::*rpc)(grpc::ClientContext*, const Req&, Resp*),
                    const Req& req, Resp* resp, absl::string_view what) ABSL_LOCKS_EXCLUDED(lane_mu_) {
    if (std::optional<absl::Status> done = CallOnLane(verb, req, resp, what)) return *done;
    return FromGrpc((stub_.get()->*rpc)(CallContext().get(), req, resp), what);
  }
  // The call on the lane; nullopt when it did not reach the daemon (no lane, or its send failed,
  // which drops the lane): then gRPC carries it. A reply that does not come drops the lane too.
  std::optional<absl::Status> CallOnLane(LaneVerb verb, const google::protobuf::MessageLite& req,
                                         google::protobuf::MessageLite* resp, absl::string_view what)
      ABSL_LOCKS_EXCLUDED(lane_mu_);
  // Opens the control lane after the session opened; where the daemon refuses it (an older one,
  // or HISPARSE_CONTROL_LANE=0 here), gRPC carries every call. Never fails the open.
  void OpenLane() ABSL_LOCKS_EXCLUDED(lane_mu_);
  absl::Status CheckAlive() const;
  // One exchange on the fd channel (fd_channel_codec.h); an ERR reply keeps the daemon's code.
  absl::StatusOr<Fetched> Fetch(const FdObject& object) ABSL_LOCKS_EXCLUDED(fd_mu_);
  absl::StatusOr<UniqueFd> FetchFd(const FdObject& object, uint64_t* bytes) ABSL_LOCKS_EXCLUDED(fd_mu_);
  // Slab handling outside the lock (client_slabs.cc). WithSlabsLocked runs `step` under mu_ once
  // every slab of `needed` is in slabs_ or in the errors `step` gets: the missing ones are fetched
  // over the fd channel, mapped and registered with the device first, outside mu_. Two threads
  // mapping one slab at once: the first to publish wins; the other's mapping is released, after
  // the lock. A slab published for `step` that it left without a page is released again, after
  // the lock. A slab that another thread dropped between the mapping and the publish is mapped
  // again (a few times; then it is an error for `step`).
  void WithSlabsLocked(const SlabIds& needed, absl::FunctionRef<void(const SlabErrors&)> step)
      ABSL_LOCKS_EXCLUDED(mu_, fd_mu_);
  // The slabs a daemon answer's pages name.
  static SlabIds SlabsOf(const google::protobuf::RepeatedPtrField<v1::LayerPages>& layers);
  // Ids of `needed` neither in slabs_ nor in `work`.
  std::vector<uint64_t> MissingSlabsLocked(const SlabIds& needed, const SlabWork& work) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fetches, maps and registers each slab of `ids` into work->fresh (or its error into work->failed).
  void MapSlabs(const std::vector<uint64_t>& ids, SlabWork* work) ABSL_LOCKS_EXCLUDED(mu_, fd_mu_);
  // A predecessor's mapping of the memory `file` (Slab::file) of `bytes`, taken out of reusable_.
  std::optional<Slab> TakeReusable(std::pair<uint64_t, uint64_t> file, uint64_t bytes) ABSL_LOCKS_EXCLUDED(reuse_mu_);
  // Moves work->fresh's slabs that slabs_ lacks into it, and returns their ids; those another
  // thread published first stay in work->fresh for the caller to release after the lock.
  std::vector<uint64_t> PublishSlabsLocked(SlabWork* work) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts the pages of `r` in their slabs, which must be in slabs_ (errors: `errors`' entry for a
  // missing one); on failure nothing stays counted.
  absl::Status AcquireSlabs(const Request& r, const SlabErrors& errors) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Uncounts the pages of `r`; a slab left without a page moves out of slabs_ into `retired`, for
  // the caller to destroy (unregister and unmap) after the lock.
  void DropSlabs(const Request& r, std::vector<Slab>* retired) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a slab none of whose pages this session's requests hold now stays mapped (see Slab).
  bool KeepIdleLocked(const Slab& slab) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SlabRetired: each named slab is dropped (into `retired`) when idle, else marked to be at 0.
  void OnSlabsRetiredLocked(const v1::SlabRetired& event, std::vector<Slab>* retired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Row `row`'s page tables, layer-major: pages[l * n + i] is the kernel address of layer l's page
  // i (bit 0 set: read-only), n the pages of each layer.
  std::vector<const uint8_t*> PageTable(const Request& r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PublishRow(uint32_t row, const Request* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives `r` the row `row` the daemon just handed it (Admit, a committed import, Resume): publishes
  // its page table there and resets the row's slot state (every slot EMPTY). All or nothing: when
  // either step fails the row is unpublished again and the error returned; `r` is not changed.
  absl::Status PublishFreshRowLocked(uint32_t row, const Request& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publishes and resets the row of a request the daemon admitted (Admit, AdmitBatch, a committed
  // import), its slabs mapped already (WithSlabsLocked; `errors` for those that are not), and
  // records it; on failure nothing of it stays here (the daemon still holds it).
  absl::StatusOr<hs_request_info> InstallAdmittedLocked(uint64_t request_id, const v1::AdmitResponse& resp,
                                                        const SlabErrors& errors, std::vector<Slab>* retired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // AdmitBatch's install of every item the daemon admitted (its slabs mapped already): the items'
  // outcomes into `out`, what the daemon must release again into `to_release`.
  void InstallBatchLocked(const std::vector<hs_admit_args>& items, const v1::AdmitBatchResponse& resp,
                          bool all_or_nothing, const SlabErrors& errors, BatchAdmitted* out,
                          std::vector<uint64_t>* to_release, std::vector<Slab>* retired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // InstallAdmittedLocked with the slabs mapped first, outside the lock.
  absl::StatusOr<hs_request_info> InstallAdmitted(uint64_t request_id, const v1::AdmitResponse& resp)
      ABSL_LOCKS_EXCLUDED(mu_, fd_mu_);
  // The daemon admitted `request_ids` and this process could not keep them: releases them there
  // (one ReleaseBatch), and returns `failed` (the install's error), naming a release that failed
  // too (the session's end releases them then).
  absl::Status ReleaseUninstalled(const std::vector<uint64_t>& request_ids, const absl::Status& failed)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets an installed request here: its row unpublished, its slabs' pages uncounted (the
  // error, if any, of clearing the row).
  absl::Status UninstallLocked(uint64_t request_id, std::vector<Slab>* retired) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Extend's install: the request's new pages counted (their slabs mapped already) and its row
  // published again.
  absl::StatusOr<hs_request_info> ExtendLocked(uint64_t request_id, const v1::ExtendResponse& resp,
                                               const SlabErrors& errors, std::vector<Slab>* retired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adopt's install of every adopted request, parked (its slabs mapped already); stops at the
  // first that fails, naming it.
  absl::StatusOr<std::vector<uint64_t>> InstallAdoptedLocked(const v1::AdoptResponse& resp, const SlabErrors& errors)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The ParkBatch / ResumeBatch RPCs alone, their answers' sizes checked (client_batch_parking.cc).
  absl::StatusOr<v1::ParkBatchResponse> ParkBatchRpc(const std::vector<uint64_t>& request_ids, bool all_or_nothing);
  absl::StatusOr<v1::ResumeBatchResponse> ResumeBatchRpc(const v1::ResumeBatchRequest& req);
  // Takes the row the daemon resumed `request_id` into: published and reset, or an error with
  // nothing changed here.
  absl::Status InstallResumedLocked(uint64_t request_id, const v1::ResumeResponse& resumed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The ReleaseBatch RPC alone (this process's table untouched).
  absl::StatusOr<v1::ReleaseBatchResponse> ReleaseBatchRpc(const std::vector<uint64_t>& request_ids);
  // After Admit with a shared prefix: the parent's pages the child shares become read-only in the
  // parent's table too (a prefix is immutable once shared).
  absl::Status SealSharedPrefix(uint64_t request_id, uint64_t parent_request_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a live request of this client other than `except` holds `row`.
  bool RowTakenLocked(uint32_t row, uint64_t except) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Request> InstallRequest(uint32_t row, uint32_t capacity,
                                         const google::protobuf::RepeatedPtrField<v1::LayerPages>& layers,
                                         const SlabErrors& errors) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  v1::Geometry geometry_;
  std::optional<v1::TpGroup> group_;  // sent with OpenSession; set once in Open
  ArenaGeometry arena_geometry_{};
  // Shared indexers: anchor_[l] is the layer whose selection l reuses (l itself for most layers).
  // An anchor with followers records its miss plan at every RESOLVE into plans_[l]; the data path
  // is ordered by the caller, so these are written by Resolve and read by Prefetch without a lock.
  std::vector<int32_t> anchor_;
  std::vector<MissPlan> plans_;          // [layers]; summary == null: not an anchor with followers
  std::vector<int32_t> plan_max_batch_;  // [layers] max_batch of the anchor's last RESOLVE; -1: none
  uint32_t timeout_ms_ = 10000;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::HiSparse::Stub> stub_;
  grpc::ClientContext stream_context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionEvent>> stream_;
  std::thread watcher_;
  std::atomic<bool> alive_{false};
  v1::SessionOpened opened_;
  v1::SessionRef ref_;

  // mu_ and fd_mu_ are never held together: slabs are fetched (fd_mu_) outside mu_.
  mutable absl::Mutex mu_;
  absl::Mutex fd_mu_;
  UniqueFd fd_channel_ ABSL_GUARDED_BY(fd_mu_);
  // The control lane (client_lane.cc): one call at a time, held across its exchange; never held
  // with mu_ or fd_mu_. Invalid: gRPC carries the lifecycle calls.
  absl::Mutex lane_mu_;
  UniqueFd lane_ ABSL_GUARDED_BY(lane_mu_);
  std::atomic<bool> on_lane_{false};  // lane_.valid(), readable without lane_mu_ (Info)

  // mu_ also guards the backend's host map (SetHostMapRow: exclusive; host_map() for a data-path
  // step: shared), which lives in the backend, out of the analysis' view. Registering and
  // unregistering host segments touch no state of the backend's and run outside mu_.
  // Set once in Open; a session Recover opens shares its predecessor's (the same host map, miss
  // plans and arena addresses: what captured graphs kept) when the geometry is the same.
  std::shared_ptr<DeviceBackend> backend_;
  // Whether this session lets go of the arena at its end (ReleaseArena): the one that opened it,
  // until Recover hands it on to its successor.
  bool owns_arena_ = true;
  // Recover's successor mapped the new daemon's host arena in place of this session's mapping
  // (arena_map_ of its predecessor), which it takes over once the recovery is done.
  bool arena_in_place_ = false;
  MappedRegion arena_map_;
  ArenaView arena_{};
  absl::flat_hash_map<uint64_t, Slab> slabs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Request> requests_ ABSL_GUARDED_BY(mu_);
  OpenPhases open_phases_;  // written once, in Open
  HostMapPhases host_map_phases_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> evicted_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, PendingImport> imports_ ABSL_GUARDED_BY(mu_);
  // A predecessor's slab mappings by memory (Slab::file), during Recover (HandSlabsTo).
  absl::Mutex reuse_mu_;
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, Slab> reusable_ ABSL_GUARDED_BY(reuse_mu_);
  // When each leased request's lease ends (a request ended without one is lost with the session).
  absl::flat_hash_map<uint64_t, std::chrono::steady_clock::time_point> lease_end_ ABSL_GUARDED_BY(mu_);
  SavedOptions saved_;                         // written once, in Connect
  bool closing_ ABSL_GUARDED_BY(mu_) = false;  // the destructor runs
  // Recover's calls one at a time, and the sessions an earlier, failed one opened and lost.
  absl::Mutex recover_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::vector<Predecessor> lost_successors_ ABSL_GUARDED_BY(recover_mu_);
};

}  // namespace hisparse

#endif  // HISPARSE_CLIENT_CLIENT_SESSION_H_
