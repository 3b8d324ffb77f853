// ClientSession: the engine side of one hisparse session — the C++ implementation behind the
// C ABI (hisparse.h). It holds the gRPC session stream (whose life is the session's), the fd
// channel, this process's mappings of the session's pool slabs and arena, the table of
// admitted requests, and the device backend that runs the data path.
//
// Thread-safe for control calls (Admit/Extend/Release/Stats may come from several threads; RPCs
// run outside the lock). Data-path calls must be ordered by the caller and must not run on a
// request while a control call on that request is in flight.
#ifndef HISPARSE_CLIENT_CLIENT_SESSION_H_
#define HISPARSE_CLIENT_CLIENT_SESSION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "device_backend.h"
#include "hisparse/common/fd_channel_codec.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/hisparse.h"
#include "hisparse/v1/arena_kind.h"
#include "hisparse/v1/hisparse.grpc.pb.h"

namespace hisparse {

class ClientSession {
 public:
  // Where Open spent its time (seconds), for the session-open benchmark (bench/session_open_cmd).
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

  absl::StatusOr<hs_request_info> Admit(uint64_t request_id, uint32_t context_tokens, uint32_t token_budget)
      ABSL_LOCKS_EXCLUDED(mu_, fd_mu_);
  absl::StatusOr<hs_request_info> Extend(uint64_t request_id, uint32_t token_budget) ABSL_LOCKS_EXCLUDED(mu_, fd_mu_);
  absl::Status Release(uint64_t request_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Batched admission (client_batch.cc): one AdmitBatch RPC for every item; each request the
  // daemon admitted is mapped and its page-table row published as Admit does. The returned error
  // is the batch's own (the session, the item count, the RPC); each item's is in `items`.
  // all_or_nothing: any failure, the daemon's or this process's (mapping a slab after the daemon
  // admitted), leaves nothing admitted, here or in the daemon (what it admitted is released
  // again); the failing item carries its error and every other ABORTED.
  // begin_import: admitted as AdmitImport does (not installed: ImportGrant and AwaitImport as
  // for a single AdmitImport; its result's row and capacity are the daemon's reservation).
  struct BatchItem {
    uint64_t request_id = 0;
    uint32_t context_tokens = 0;
    uint32_t token_budget = 0;
    bool begin_import = false;
  };
  struct BatchAdmitted {
    std::vector<absl::StatusOr<hs_request_info>> items;  // one per item, in order
    int failed_item = -1;                                // all_or_nothing: the item that failed the batch
  };
  absl::StatusOr<BatchAdmitted> AdmitBatch(const std::vector<BatchItem>& items, bool all_or_nothing)
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
  // Park and resume, and Admit with a shared prefix (client_parking.cc). Park unpublishes the
  // request's row (the daemon may give it to another request) and keeps its pages mapped; Resume
  // publishes its pages in the row the daemon gives and resets that row's slot state (every slot
  // EMPTY, as Admit does). A parked request refuses store (FAILED_PRECONDITION); its records stay
  // readable through RecordPtr. AdmitShared's prefix pages are read-only in the child's table
  // and, from then on, in the parent's too (a prefix is immutable once shared).
  absl::Status Park(uint64_t request_id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<hs_request_info> Resume(uint64_t request_id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<hs_request_info> AdmitShared(uint64_t request_id, uint32_t context_tokens, uint32_t token_budget,
                                              uint64_t parent_request_id, uint32_t prefix_tokens)
      ABSL_LOCKS_EXCLUDED(mu_, fd_mu_);
  // Durable requests (client_durable.cc; docs/DESIGN.md, "Durable requests"). AdmitDurable is Admit
  // with a lease; SetLease sets, renews or clears one (0) and returns the seconds left. Adopt takes
  // every durable request the ended session `dead_session_id` left (same uid and engine name) and
  // installs each here parked, its slabs mapped; Resume gives each a row. Returns their ids.
  absl::StatusOr<hs_request_info> AdmitDurable(uint64_t request_id, uint32_t context_tokens, uint32_t token_budget,
                                               uint32_t lease_seconds) ABSL_LOCKS_EXCLUDED(mu_, fd_mu_);
  absl::StatusOr<double> SetLease(uint64_t request_id, uint32_t lease_seconds);
  // Every page of the daemon's ListAdoptable, in (dead session, request) order.
  absl::StatusOr<std::vector<v1::AdoptableRequest>> ListAdoptable();
  absl::StatusOr<std::vector<uint64_t>> Adopt(uint64_t dead_session_id) ABSL_LOCKS_EXCLUDED(mu_, fd_mu_);
  // TP groups (client_groups.cc): Admit for the session's group (OpenSession.group, from
  // hs_session_options.group): the first rank reserves for all, later ranks attach; each gets its
  // own row over the group's pages, installed as Admit installs a request.
  absl::StatusOr<hs_request_info> AdmitGroup(uint64_t request_id, uint32_t context_tokens, uint32_t token_budget)
      ABSL_LOCKS_EXCLUDED(mu_, fd_mu_);
  absl::StatusOr<uint8_t*> RecordPtr(uint64_t request_id, uint32_t layer, uint32_t position) ABSL_LOCKS_EXCLUDED(mu_);
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

  // Imports from a prefill node (client_import.cc; docs/DESIGN.md, "Import"). AdmitImport admits
  // the request as importing: the daemon reserves its pages and row and answers a grant, which
  // ImportGrant returns serialized (v1::ImportGrant) for the transfer agent. The request is not
  // published to the data path (no page table, no row) until AwaitImport sees the daemon's
  // ImportFinished: committed, it is installed as Admit would and returned; aborted or expired,
  // FailedPrecondition with the daemon's reason (the daemon freed it already). A timeout leaves
  // it pending (DeadlineExceeded).
  absl::Status AdmitImport(uint64_t request_id, uint32_t context_tokens, uint32_t token_budget)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::string> ImportGrant(uint64_t request_id) const ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<hs_request_info> AwaitImport(uint64_t request_id, uint32_t timeout_ms)
      ABSL_LOCKS_EXCLUDED(mu_, fd_mu_);

 private:
  // One slab of the session's host pool, mapped and registered once, the first time a request of
  // this session has a page in it.
  struct Slab {
    MappedRegion map;
    uint8_t* kernel_addr = nullptr;  // where kernels see it (device-mapped on CUDA)
    uint64_t live_pages = 0;         // pages of this session's requests in it; unmapped at 0, which
                                     // is when the daemon drops the slab too (its pages are all free)
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
  // The stream's ImportFinished: records the outcome for AwaitImport.
  void OnImportFinished(const v1::ImportFinished& finished) ABSL_LOCKS_EXCLUDED(mu_);
  // One fd-channel object: a descriptor, or (a "cuda-ipc" arena) a cudaIpc handle.
  struct Fetched {
    UniqueFd fd;
    uint64_t bytes = 0;
    std::string ipc_handle;
  };

  ClientSession() = default;
  // Open: runs the steps below in their order and returns the first failure.
  absl::Status Connect(const hs_session_options& options, const BackendWrap& wrap);
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
  absl::Status InitBackend(const hs_session_options& options, const BackendWrap& wrap);
  // The page-table geometry the daemon's SessionOpened announced (records per page, table stride).
  HostPageGeometry HostPages() const;
  // The arena object from the fd channel, at least as large as the geometry needs.
  absl::StatusOr<Fetched> FetchArena();
  // One miss plan per anchor layer that has followers (plans_, plan_max_batch_).
  absl::Status AllocMissPlans();
  // Attaches the fetched arena as its kind (SessionOpened.arena.kind) says: arena_, arena_map_.
  absl::Status AttachArena(const Fetched& arena);

  void WatchStream() ABSL_LOCKS_EXCLUDED(mu_);
  std::unique_ptr<grpc::ClientContext> CallContext() const;
  absl::Status CheckAlive() const;
  // One exchange on the fd channel (fd_channel_codec.h); an ERR reply keeps the daemon's code.
  absl::StatusOr<Fetched> Fetch(const FdObject& object) ABSL_LOCKS_EXCLUDED(fd_mu_);
  absl::StatusOr<UniqueFd> FetchFd(const FdObject& object, uint64_t* bytes) ABSL_LOCKS_EXCLUDED(fd_mu_);
  // Maps the slabs that `r`'s pages name and are not mapped yet, and counts their pages; on
  // failure nothing stays counted.
  absl::Status AcquireSlabs(const Request& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropSlabs(const Request& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Row `row`'s page tables, layer-major: pages[l * n + i] is the kernel address of layer l's page
  // i (bit 0 set: read-only), n the pages of each layer.
  std::vector<const uint8_t*> PageTable(const Request& r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PublishRow(uint32_t row, const Request* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives `r` the row `row` the daemon just handed it (Admit, a committed import, Resume): publishes
  // its page table there and resets the row's slot state (every slot EMPTY). All or nothing: when
  // either step fails the row is unpublished again and the error returned; `r` is not changed.
  absl::Status PublishFreshRowLocked(uint32_t row, const Request& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Maps, publishes and resets the row of a request the daemon admitted (Admit, AdmitBatch, a
  // committed import), and records it; on failure nothing of it stays here (the daemon still
  // holds it).
  absl::StatusOr<hs_request_info> InstallAdmitted(uint64_t request_id, const v1::AdmitResponse& resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets an installed request here: its row unpublished, its slabs' pages uncounted (the
  // error, if any, of clearing the row).
  absl::Status UninstallLocked(uint64_t request_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The ParkBatch / ResumeBatch RPCs alone, their answers' sizes checked (client_batch_parking.cc).
  absl::StatusOr<v1::ParkBatchResponse> ParkBatchRpc(const std::vector<uint64_t>& request_ids, bool all_or_nothing);
  absl::StatusOr<v1::ResumeBatchResponse> ResumeBatchRpc(const v1::ResumeBatchRequest& req);
  // Takes the row the daemon resumed `request_id` into: published and reset, or an error with
  // nothing changed here.
  absl::Status InstallResumedLocked(uint64_t request_id, const v1::ResumeResponse& resumed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The ReleaseBatch RPC alone (this process's table untouched).
  absl::StatusOr<v1::ReleaseBatchResponse> ReleaseBatchRpc(const std::vector<uint64_t>& request_ids);
  // Admit's RPC and installation, for Admit and AdmitShared.
  absl::StatusOr<hs_request_info> AdmitWith(const v1::AdmitRequest& req) ABSL_LOCKS_EXCLUDED(mu_, fd_mu_);
  // Whether a live request of this client other than `except` holds `row`.
  bool RowTakenLocked(uint32_t row, uint64_t except) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Request> InstallRequest(uint32_t row, uint32_t capacity,
                                         const google::protobuf::RepeatedPtrField<v1::LayerPages>& layers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

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

  // Lock order: mu_, then fd_mu_ (Admit and Extend fetch the slabs they map under mu_).
  mutable absl::Mutex mu_;
  absl::Mutex fd_mu_ ABSL_ACQUIRED_AFTER(mu_);
  UniqueFd fd_channel_ ABSL_GUARDED_BY(fd_mu_);

  // mu_ also guards the backend's host map (RegisterHostSegment, SetHostMapRow: exclusive;
  // host_map() for a data-path step: shared), which lives in the backend, out of the analysis' view.
  std::unique_ptr<DeviceBackend> backend_;  // set once in Open
  MappedRegion arena_map_;
  ArenaView arena_{};
  absl::flat_hash_map<uint64_t, Slab> slabs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Request> requests_ ABSL_GUARDED_BY(mu_);
  OpenPhases open_phases_;  // written once, in Open
  HostMapPhases host_map_phases_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> evicted_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, PendingImport> imports_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hisparse

#endif  // HISPARSE_CLIENT_CLIENT_SESSION_H_
