// SessionManager: sessions, admission and release — the daemon's accounting of the whole node.
//
// THE ADMISSION LOGIC LIVES HERE (session_manager.cc, Admit/Extend/Release). A session is the unit
// of ownership: it holds requests, each request holds host-pool pages per layer (page_pool.h; the
// session's slabs are its own, but a TP-group request's pages are its group's: session_groups.cc)
// and one row of the session's slot arena. Ending a session — cleanly or because its engine died — releases all of it
// at once (CloseSession), but for durable requests whose lease runs: those stay, parked, until a session of the same
// tenant and engine name adopts them or the lease ends (session_durable.cc). Requests are named per session: no
// session can see, extend or release another's. A session belongs to the uid that opened it (its tenant): only that
// uid may use its token, and a tenant's view (`only_uid` below) shows and touches its own sessions alone.
// What state a request is in (live, parked, importing, orphaned) is its session's RequestTable's,
// and every change of it goes through that table (request_table.h, which lists the transitions).
//
// Transport-free: the gRPC service (service.cc) and the fd channel (fd_server.cc) are thin maps
// onto these methods. The proto messages are used only as plain data types.
//
// Thread-safe: one mutex guards all state; calls hold it only for the bookkeeping itself.
#ifndef HISPARSE_DAEMON_SESSION_MANAGER_H_
#define HISPARSE_DAEMON_SESSION_MANAGER_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "hisparse/common/fd_channel_codec.h"
#include "hisparse/common/secret.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/common/unix_socket.h"
#include "hisparse/common/version.h"
#include "hisparse/daemon/admission_ledger.h"
#include "hisparse/daemon/arena.h"
#include "hisparse/daemon/config.h"
#include "hisparse/daemon/durable_requests.h"
#include "hisparse/daemon/gpu_arena.h"
#include "hisparse/daemon/import_grants.h"
#include "hisparse/daemon/import_target.h"
#include "hisparse/daemon/page_pool.h"
#include "hisparse/daemon/request_journal.h"
#include "hisparse/daemon/request_table.h"
#include "hisparse/daemon/session_entry.h"
#include "hisparse/daemon/tp_groups.h"
#include "hisparse/v1/hisparse.pb.h"

namespace hisparse {

class DeferredLog;     // deferred_log.h
class RequestJournal;  // request_journal.h

// RejectReason and RejectReasonName live in admission_ledger.h.
class SessionManager {
 public:
  // Hard per-tenant limits (tenant = the uid that opened the session); 0 = unlimited. A tenant's
  // rows are bounded by sessions x max_requests_per_session. See AdmissionLedger::Quotas.
  using QuotaOptions = AdmissionLedger::Quotas;
  struct Options {
    QuotaOptions quotas;
    bool evict_on_pool_full = false;  // admission.on_pool_full = evict_lru_idle
    uint32_t max_sessions = 256;
    uint32_t max_requests_per_session = 4096;
    // limits.max_tokens_per_request: sizes every session's page-table stride (pages_per_entry),
    // fixed for the daemon's life. The default holds a 1M-token context.
    uint32_t max_tokens_per_request = 1u << 20;
    std::string fd_socket_path;       // handed to engines in SessionOpened
    uint64_t arena_budget_bytes = 0;  // per device (GPU index or host), 0 = unlimited
    // Node-wide bytes of host (memfd) slot arenas, all sessions together.
    uint64_t host_arena_budget_bytes = UINT64_MAX;
    DeviceKind device = DeviceKind::kHost;  // the device in use (ChooseDevice): kCuda or kHost, never kAuto
    // Set (device cuda): sessions that declare geometry.gpu >= 0 get their slot arena in that
    // GPU's memory from this allocator (SessionOpened.arena.kind "cuda-vmm" or "cuda-ipc", as the
    // allocator chose). Unset, or for gpu = -1, the arena is a host memfd ("host").
    GpuArenaAllocator gpu_arena_allocator;
    // The UUID (16 bytes) of each GPU the allocator serves, by the daemon's ordinal: a session
    // whose geometry.gpu_uuid names one gets its arena there, whatever ordinal the engine gave
    // (an engine pod given one GPU calls it 0). Empty: ordinals are taken as the daemon's.
    std::vector<std::string> gpu_uuids;
    // This daemon's release: SessionOpened.daemon_version, and the side of the version rule
    // (version_compat.h) that OpenSession holds a client's client_version to.
    std::string version = HISPARSE_VERSION;
    // The time of the LRU order of evict_lru_idle (unset: absl::Now). Tests inject a fake one.
    AdmissionLedger::Clock clock;
    // import.grant_ttl: how long an import grant stays open before the daemon expires it.
    absl::Duration import_grant_ttl = absl::Seconds(30);
    // durability.max_lease_seconds: the longest lease a request may hold (0: no durable requests).
    uint32_t max_lease_seconds = 3600;
    // durability.max_orphans_per_tenant: ended sessions one tenant may have kept as orphans; a
    // session of a tenant at the cap ends as a session without durable requests would (they are
    // released). 0: no cap (the daemon's config sets one by default).
    uint32_t max_orphans_per_tenant = 0;
    // Durable requests journaled across the daemon's restarts (request_journal.h); null: not.
    // Not owned; outlives the manager.
    RequestJournal* journal = nullptr;
    // The first session id (ids are never reused, across the daemon's lives either).
    uint64_t first_session_id = 1;
  };

  SessionManager(const Options& options, std::unique_ptr<PagePool> pool);
  ~SessionManager();

  // Opens a session for an engine that declared `open`. `owner` (the kernel's word on the peer of
  // the Session stream) binds it: its uid is the session's tenant, its pid shows in stats. The
  // tenant's arena quota is charged here.
  absl::StatusOr<v1::SessionOpened> OpenSession(const v1::OpenSession& open, const PeerCredentials& owner);
  // Ends a session and releases every request, page and arena it held, but for its durable requests,
  // which it leaves parked as an orphan (session_durable.cc). Idempotent.
  void CloseSession(uint64_t session_id);

  // PermissionDenied unless `ref` names a live session that `uid` owns. Session ids are never
  // reused, so a check that passed stays true for as long as the session lives.
  absl::Status CheckOwner(const v1::SessionRef& ref, uint32_t uid) const;
  absl::StatusOr<v1::AdmitResponse> Admit(const v1::AdmitRequest& req);
  absl::StatusOr<v1::ExtendResponse> Extend(const v1::ExtendRequest& req);
  absl::Status Release(const v1::ReleaseRequest& req);
  // Batched admission (session_batch.cc): each item as Admit / Release would do it, the batch
  // under one lock. The call's error concerns the whole batch (the session, the item count, the
  // mode); an item's own is in its result. ALL_OR_NOTHING rolls back every item admitted before a
  // failing one and never evicts; PER_ITEM may evict as Admit does, but never a request of its own
  // batch. What each mode counts in Stats is written at the top of session_batch.cc.
  static constexpr int kMaxBatchItems = 1024;
  absl::StatusOr<v1::AdmitBatchResponse> AdmitBatch(const v1::AdmitBatchRequest& req) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<v1::ReleaseBatchResponse> ReleaseBatch(const v1::ReleaseBatchRequest& req) ABSL_LOCKS_EXCLUDED(mu_);
  // Park and resume (session_parking.cc): a parked request has no row of the session's arena but
  // keeps every host page (and its place in the tenant's quotas); Resume gives it a free row,
  // possibly another. See the Park and Resume RPCs in hisparse.proto for the codes.
  absl::StatusOr<v1::ParkResponse> Park(const v1::ParkRequest& req);
  absl::StatusOr<v1::ResumeResponse> Resume(const v1::ResumeRequest& req);
  // Batched park and resume (session_batch_parking.cc): each item as Park / Resume would do it,
  // the batch under one lock. ALL_OR_NOTHING undoes every item done before a failing one (a
  // parked item takes its old row again, a resumed one is parked again); PER_ITEM leaves each as
  // it came out. Codes: see ParkBatch and ResumeBatch in hisparse.proto.
  absl::StatusOr<v1::ParkBatchResponse> ParkBatch(const v1::ParkBatchRequest& req) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<v1::ResumeBatchResponse> ResumeBatch(const v1::ResumeBatchRequest& req) ABSL_LOCKS_EXCLUDED(mu_);
  // Node figures, and every session (only_uid unset: an admin's view) or only the sessions of
  // tenant `only_uid`; then `sessions` and `requests` count those alone, while the pool, arena
  // and admission counters stay the node's.
  v1::StatsResponse Stats(std::optional<uint32_t> only_uid = std::nullopt) const;

  // For the fd channel: a dup of the descriptor of `object` (the arena or a slab) when
  // session_id/token name a live session that owns it. The caller owns the returned fd.
  // `peer` must be the session's owner (uid), else PermissionDenied. `bytes` (may be
  // null) receives the object's size where fstat cannot tell it (a GPU arena); else 0.
  // A "cuda-ipc" arena has no descriptor: its 64-byte cudaIpc handle goes to `ipc_handle` and the
  // returned fd is invalid; with `ipc_handle` null such an arena is refused (FailedPrecondition).
  absl::StatusOr<UniqueFd> DupFdFor(uint64_t session_id, const std::string& token, const FdObject& object,
                                    const PeerCredentials& peer, uint64_t* bytes = nullptr,
                                    std::string* ipc_handle = nullptr);
  // The same for `object` spelled as on the wire ("arena" or "slab N"; fd_channel_codec.h).
  absl::StatusOr<UniqueFd> DupFdFor(uint64_t session_id, const std::string& token, const std::string& object,
                                    const PeerCredentials& peer, uint64_t* bytes = nullptr,
                                    std::string* ipc_handle = nullptr);

  // Stop admitting (drain). Existing sessions keep what they hold. `on_idle` (may be empty) runs,
  // outside the lock, once no session is left while draining.
  void SetDraining(bool draining, std::function<void()> on_idle = {});

  // Where a session's notices go (its stream). Set by the service right after OpenSession. The
  // sink is called outside the lock and must not block (the service queues); it returns false
  // when the notice will not be delivered (the stream is gone, or its outbox is full).
  using EventSink = SessionEventSink;
  void SetEventSink(uint64_t session_id, EventSink sink);

  // Administration. Requests in (session_id, request_id) order, one page at a time: at most
  // page_size (0: kDefaultPageSize; above kMaxPageSize: kMaxPageSize), after page_token. With
  // `only_uid` set (a tenant's view), only that tenant's requests, and a session of another tenant
  // is PermissionDenied.
  static constexpr uint32_t kDefaultPageSize = 1000;
  static constexpr uint32_t kMaxPageSize = 10000;
  absl::StatusOr<v1::ListRequestsResponse> ListRequests(const v1::ListRequestsRequest& req,
                                                        std::optional<uint32_t> only_uid = std::nullopt) const;
  // Tells the session (RequestEvicted on its stream) before its memory is released. With
  // `only_uid` set, a request of another tenant's session is PermissionDenied.
  absl::StatusOr<v1::EvictResponse> Evict(const v1::EvictRequest& req, std::optional<uint32_t> only_uid = std::nullopt);
  // Live-changeable limits (SIGHUP). Existing sessions keep their geometry.
  void SetLimits(uint32_t max_sessions, uint32_t max_requests_per_session, const QuotaOptions& quotas,
                 bool evict_on_pool_full);
  // The node-wide host slot-arena budget, live; sessions already open keep their arenas.
  void SetHostArenaBudget(uint64_t bytes);
  // durability.max_lease_seconds, live (SIGHUP): bounds later SetLease and admissions; leases
  // already granted keep their deadline. 0 turns durable requests off for what comes next.
  void SetMaxLeaseSeconds(uint32_t seconds) ABSL_LOCKS_EXCLUDED(mu_);
  // durability.max_orphans_per_tenant, live (SIGHUP): applies to sessions that end from now on;
  // orphans kept already stay (until adopted or expired) when it is lowered.
  void SetMaxOrphansPerTenant(uint32_t orphans) ABSL_LOCKS_EXCLUDED(mu_);

  // Accounting invariants, exact: the pool's and the ledger's own; pool used pages == the
  // ledger's == the distinct pages of every request; each page's reference count == the requests
  // of its session that hold it; a shared page's holders are the session's sharers list, the
  // first of which is charged for it; each request's row (none when parked) is the ledger's;
  // each session's pages in the pool are the ledger's count for it.
  absl::Status CheckInvariants() const;
  // Blocks until the pool's worker has dropped every slab left so far (and filled its reserve):
  // for tests that count descriptors or memory.
  void WaitPoolIdle() const ABSL_LOCKS_EXCLUDED(mu_);
  // Retired slabs an engine touched again after their punch are punched again, and those found
  // empty stop counting against their tenant (PagePool::SweepRetired); returns how many. The
  // daemon runs it periodically, with the lease sweep; tests call it.
  size_t SweepRetiredSlabs() ABSL_LOCKS_EXCLUDED(mu_);
  // Tells each engine which slabs left its session (or its TP group) since the last call
  // (PagePool::Departure): one SlabRetired on the session's stream, sent outside the lock. The
  // calls that allocate pages run it as they return, and SweepRetiredSlabs runs it too.
  void NotifySlabDepartures() ABSL_LOCKS_EXCLUDED(mu_);
  // ---- Import from a prefill node (session_import.cc; docs/DESIGN.md, "Import"). ----
  // Where granted memory is registered for remote writes; null (the default): imports are
  // refused with FailedPrecondition. Not owned; must outlive every call that can reach it.
  void SetImportTarget(ImportTarget* target) ABSL_LOCKS_EXCLUDED(mu_);
  // Admit with begin_import (Admit forwards here): admits as Admit does (without evicting), marks
  // the request importing, registers its pages with the target and answers the grant.
  absl::StatusOr<v1::AdmitResponse> AdmitImport(const v1::AdmitRequest& req) ABSL_LOCKS_EXCLUDED(mu_);
  // The transfer agent's calls, by grant; `caller_uid` must be the session's tenant. Codes: see
  // CommitImport in hisparse.proto.
  absl::Status CommitImport(const v1::CommitImportRequest& req, uint32_t caller_uid) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status AbortImport(const v1::AbortImportRequest& req, uint32_t caller_uid) ABSL_LOCKS_EXCLUDED(mu_);
  // Aborts every open grant whose expiry (options.clock) has passed; returns how many.
  size_t ExpireImports() ABSL_LOCKS_EXCLUDED(mu_);
  // The import target lost these grants (its worker died): each open one is aborted with `reason`
  // as AbortImport would. A grant busy at that moment (being registered) stays open and expires
  // (import.grant_ttl): its writes are refused meanwhile, by a worker that does not know it.
  // Returns how many were aborted.
  size_t AbortLostImports(const std::vector<std::string>& grant_ids, const std::string& reason)
      ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Durable requests (session_durable.cc; docs/DESIGN.md, "Durable requests"). ----
  // A request whose lease runs when its session ends stays, parked, in an orphan (the ended
  // session's requests, pages and slabs, without arena, token or rows) until a session of the
  // same tenant and engine name adopts the orphan or the lease ends. Codes: see SetLease,
  // ListAdoptable and Adopt in hisparse.proto.
  absl::StatusOr<v1::SetLeaseResponse> SetLease(const v1::SetLeaseRequest& req) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<v1::ListAdoptableResponse> ListAdoptable(const v1::ListAdoptableRequest& req) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<v1::AdoptResponse> Adopt(const v1::AdoptRequest& req) ABSL_LOCKS_EXCLUDED(mu_);
  // Releases every orphaned request whose lease has ended (options.clock) and retires the slabs
  // that leaves idle; returns how many. The daemon runs it periodically; tests call it.
  size_t ExpireLeases() ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Restarts without loss (session_journal.cc; request_journal.h). ----
  // At start, before any session: every durable request a former life journaled (validated by
  // PlanRecovery, its slabs already in the pool) becomes an orphan of its old session again,
  // adoptable as if its engine had died. Sessions of a tenant beyond max_orphans_per_tenant are
  // released. Returns the requests restored.
  absl::StatusOr<size_t> RestoreOrphans(const std::vector<journal::Put>& puts) ABSL_LOCKS_EXCLUDED(mu_);
  // Commits what this thread's call decided for the journal (and waits for what other calls
  // decided before): every public call that can change a durable request runs it as it returns.
  void FlushJournal() ABSL_LOCKS_EXCLUDED(mu_);

  // The daemon's mapping of the record of (request, layer, position) of a session, for tests.
  absl::StatusOr<uint8_t*> RecordForTest(uint64_t session_id, uint64_t request_id, uint32_t layer,
                                         uint32_t position) const;

 private:
  // A request's state is the RequestTable's (request_table.h); its data is RequestEntry.
  using Request = RequestEntry;
  // What the manager keeps of a session (session_entry.h).
  using Session = SessionEntry;
  // A tensor-parallel group (tp_groups.h).
  using Group = TpGroup;
  // The session's slot arena of `layout`: on GPU `gpu` from the allocator, else a host memfd.
  // Touches no shared state: called outside the lock.
  absl::StatusOr<std::unique_ptr<Arena>> CreateArena(bool on_gpu, int gpu, const ArenaOffsets& layout) const;
  // This daemon's ordinal of the GPU a session's geometry names: the one whose UUID is
  // geometry.gpu_uuid (FailedPrecondition when it sees none such), else geometry.gpu.
  absl::StatusOr<int> DaemonGpuOf(const v1::Geometry& g, bool on_gpu) const;

  // A request chosen for eviction under the lock and evicted after it (EvictVictim): named by
  // its generation too, so that one released and admitted again meanwhile is not the one evicted.
  struct Victim {
    uint64_t session_id = 0;
    uint64_t request_id = 0;
    uint64_t generation = 0;
    std::shared_ptr<EventSink> sink;
  };
  // AdmitLocked's answer, and whether it failed for want of room in the pool: the one refusal that
  // evicting the tenant's own requests can cure.
  struct AdmitOutcome {
    absl::StatusOr<v1::AdmitResponse> result;
    bool lacked_room = false;
  };
  AdmitOutcome AdmitLocked(const v1::AdmitRequest& req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An import admitted under mu_ whose pages are not registered yet (AdmitImport's first step,
  // and an AdmitBatch import item's): its grant is busy, so nothing else finishes it and its
  // session waits for it before closing.
  struct OpenedImport {
    std::string grant_id;
    uint64_t session_id = 0;
    uint64_t request_id = 0;
    ImportTarget* target = nullptr;                  // not owned (SetImportTarget's)
    PagePool* pool = nullptr;                        // pool_ (thread-safe itself): dups the slabs' memfds
    std::vector<std::vector<PagePool::Page>> pages;  // per layer, in position order
    uint64_t page_bytes = 0;
    ImportLayout layout;  // what the grant covers (the target checks every write against it)
    absl::Time expires;
  };
  // AdmitBatch's modes (session_batch.cc). Both collect the import items they admitted (item index, opened grant) for
  // FinishBatchImports.
  using BatchImports = std::vector<std::pair<int, OpenedImport>>;
  v1::AdmitBatchResponse AdmitAllOrNothingLocked(Session& s, const v1::AdmitBatchRequest& req, BatchImports* opened)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<v1::AdmitBatchResponse> AdmitEachItem(const v1::AdmitBatchRequest& req, BatchImports* opened)
      ABSL_LOCKS_EXCLUDED(mu_);
  // One item: AdmitLocked, or for an import item (begin_import) OpenImportLocked, recorded in
  // `opened` under `index`.
  AdmitOutcome AdmitItemLocked(const v1::AdmitRequest& one, int index, BatchImports* opened)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ALL_OR_NOTHING failed at item `failed` (with `why`): every other item the batch admitted is
  // released again (an import's grant forgotten: the caller revoked any registration first) and
  // every result rewritten, the others ABORTED.
  void FailAllOrNothingLocked(Session& s, const v1::AdmitBatchRequest& req, int failed, const absl::Status& why,
                              v1::AdmitBatchResponse* resp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UndoBatchItemLocked(Session& s, uint64_t request_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Registers the batch's opened imports outside the lock, then publishes them (PER_ITEM: a failed
  // one is freed; ALL_OR_NOTHING: any failure revokes them all and rolls the batch back).
  void FinishBatchImports(const v1::AdmitBatchRequest& req, const BatchImports& opened, v1::AdmitBatchResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  // PER_ITEM under evict_lru_idle: the victim whose eviction may admit `item` after `evictions`
  // tries, or none (then the item fails as it is). Never a request in `batch` (admitted by it).
  std::optional<Victim> BatchVictimLocked(const Session& s, const v1::AdmitItem& item, int evictions,
                                          const absl::flat_hash_set<uint64_t>& batch) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `count` more pages of pool owner `owner` (a session, or a TP group's owner), continuing after
  // `after`: an Extend's. A full pool is counted as a kPoolFull refusal. An admission's pages come
  // from Reserve (request_table.h) instead.
  absl::StatusOr<std::vector<PagePool::Page>> AllocatePagesLocked(uint64_t owner, uint64_t count,
                                                                  const PagePool::Page* after)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A Reserve that failed as AdmitLocked answers it: its refusal counted (when it is one), and
  // whether it lacked room in the pool.
  AdmitOutcome RefusedLocked(ReserveOutcome outcome) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An admitted request's answer: its row, capacity and pages.
  v1::AdmitResponse AdmitAnswerLocked(const Session& s, const Request& r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pages a request of `s` needs per layer to hold `tokens` positions.
  static uint64_t PagesFor(const Session& s, uint64_t tokens);
  // evict_lru_idle: whether evicting the tenant's requests could make room for `need_pages`.
  bool EvictionCouldAdmitLocked(const Session& s, uint64_t need_pages) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<Victim> PickVictimLocked(uint64_t session_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the victim's session, then releases the request: the same request that was chosen (its
  // generation), and one that is not importing. NotFound when it was released (or released and
  // admitted again, or its session ended) meanwhile, FailedPrecondition when it is importing
  // now. Takes the lock itself.
  absl::StatusOr<uint64_t> EvictVictim(const Victim& v, const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<Session*> FindLocked(const v1::SessionRef& ref) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The request `request_id` of the session `ref` names, or PermissionDenied / NotFound.
  absl::StatusOr<Request*> FindRequestLocked(const v1::SessionRef& ref, uint64_t request_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Park and Resume of one found request of session `session_id` (session_parking.cc).
  absl::StatusOr<v1::ParkResponse> ParkLocked(Session& s, Request& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<v1::ResumeResponse> ResumeLocked(Session& s, Request& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Shared prefixes (session_sharing.cc). Admit of a request naming a parent: the checks after
  // AdmitLocked's own, the parent's full prefix pages referenced, the rest fresh, the partial
  // page's prefix records copied (a memcpy of at most one page per layer, under the lock).
  AdmitOutcome AdmitSharedLocked(Session& s, const v1::AdmitRequest& req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `r` out of its session's sharers before its pages are released: a page whose charged
  // holder it was is charged to the next holder.
  void UnshareLocked(Session& s, const Request& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pages of `r` that another request holds too.
  static uint64_t SharedPagesOf(const Session& s, const Request& r);
  // The sharing half of CheckInvariants for one session; `distinct` receives its distinct pages.
  absl::Status CheckSharingLocked(const Session& s, uint64_t* distinct) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases `r`'s pages (its group share, its shared pages' charges) and forgets it: `r` is gone.
  void ReleaseRequestLocked(Session& s, Request& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The request's pages as the wire lists them (slab, offset), one LayerPages per layer.
  // A page shared with another request now is read_only there.
  void FillLayers(const Session& s, const Request& r, google::protobuf::RepeatedPtrField<v1::LayerPages>* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckBudget(const Session& s, uint32_t token_budget) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a refused admission under `reason` and returns `status`.
  absl::Status Reject(RejectReason reason, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Reject(Refusal refusal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Imports (session_import.cc): the grants' lives are ImportGrants' (import_grants.h).
  enum class ImportOutcome { kCommit, kAbort, kExpire };
  // Commit, abort or expire one grant: checks it (session, request, tenant) and marks it busy
  // under the lock, revokes its memory outside it, then makes the request live or frees it and
  // tells the session. `caller_uid` unset: the daemon itself (expiry).
  absl::Status FinishImport(const std::string& grant_id, uint64_t session_id, uint64_t request_id,
                            std::optional<uint32_t> caller_uid, ImportOutcome outcome, const std::string& reason)
      ABSL_LOCKS_EXCLUDED(mu_);
  // FinishImport of each of `grants` (those finished meanwhile are refused and skipped); how many
  // it finished.
  size_t FinishEach(const std::vector<ImportGrants::Ref>& grants, ImportOutcome outcome, const std::string& reason)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Refuses where imports are off or the session closes, admits as AdmitLocked (never evicting),
  // marks the request importing under a new busy grant and fills resp (the grant's header).
  absl::StatusOr<OpenedImport> OpenImportLocked(const v1::AdmitRequest& req, v1::AdmitResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens the grant's pages for checked writes at its target (outside the lock): hands it a dup
  // of each slab's memfd and the pages' offsets (the target's worker maps them itself).
  static absl::Status RegisterImport(const OpenedImport& o);
  // After RegisterImport, under the lock again: Publish makes the grant usable (not busy) and
  // adds the worker address to resp; Drop forgets the grant and frees the request (its pages no
  // longer open to writes: never registered, or Unregister'ed by the caller first).
  void PublishImportLocked(const OpenedImport& o, v1::AdmitResponse* resp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropImportLocked(const OpenedImport& o) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Release of an importing request: an abort. Unset when the request is not importing.
  std::optional<absl::Status> ReleaseIfImporting(const v1::ReleaseRequest& req) ABSL_LOCKS_EXCLUDED(mu_);
  // ReleaseBatch's importing items, each aborted as Release aborts it (session_batch.cc): per item
  // the abort's result, or nullopt for an item that is not importing. One lock finds them (and
  // checks the session); only they pay a FinishImport.
  absl::StatusOr<std::vector<std::optional<absl::Status>>> AbortImportingItems(const v1::ReleaseBatchRequest& req)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Before a session closes: waits out its busy grants and revokes the rest (their requests are
  // released with the session).
  void RevokeImportsOf(uint64_t session_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Durable requests (session_durable.cc). The clock (options.clock, else absl::Now).
  absl::Time Now() const;
  // CloseSession's step for a session that has ended (out of sessions_, its imports revoked):
  // releases every request that is not durable now (every one, when its tenant holds
  // max_orphans_per_tenant orphans already), then, when durable ones are left, parks them
  // and moves them (with their sharers) into a new orphan of the same id; else the session leaves
  // the ledger. `dead` keeps its arena and sink, for the caller to drop outside the lock.
  // Returns the requests released.
  size_t EndSessionLocked(Session& dead, DeferredLog& log) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases the orphan's requests whose lease ended by `now` (counted as lease expiries) and
  // forgets the orphan once empty. Returns how many were released.
  size_t ExpireOrphanLocked(uint64_t orphan_id, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CheckInvariants' part for orphans: ledger, pool and requests agree; returns their pages.
  absl::StatusOr<uint64_t> CheckOrphansLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evict of an orphaned request (an operator's, or its tenant's): released at once, nobody to tell.
  absl::StatusOr<v1::EvictResponse> EvictOrphanLocked(const v1::EvictRequest& req, std::optional<uint32_t> only_uid,
                                                      DeferredLog& log) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stats' durable and orphan figures (of `only_uid`'s sessions alone, when set).
  void OrphanStatsLocked(std::optional<uint32_t> only_uid, v1::StatsResponse* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ---- TP groups (session_groups.cc). ----
  // Admit with AdmitRequest.group: reserve for every rank, or attach this rank's share.
  AdmitOutcome AdmitGroupLocked(Session& s, const v1::AdmitRequest& req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Extend of a group request: the first rank's grows the group's pages for every share (all or
  // nothing); a rank's Extend to the capacity the request has already answers its pages.
  absl::StatusOr<v1::ExtendResponse> ExtendGroupLocked(Session& s, Request& r, const v1::ExtendRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases `s`'s share of a group request: its row, one reference to each page, the charge
  // passed to the next holder; the pages go with the last share.
  void ReleaseGroupShareLocked(Session& s, Request& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pages of `r` that releasing it leaves held (shared with another request, or another rank).
  uint64_t UnfreedPagesOfLocked(const Session& s, const Request& r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A dup of slab `slab` of the group of `s` (a member), as DupSlabFd.
  absl::StatusOr<UniqueFd> DupGroupSlabLocked(const Session& s, uint64_t slab, uint64_t* bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stats' group figures: GroupStats, HostPoolStats.group_bytes, each member's SessionStats.group.
  void FillGroupStatsLocked(std::optional<uint32_t> only_uid, v1::StatsResponse* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The group half of CheckInvariants: members, shares, references and charges; `paid` receives
  // the group pages each session is charged for, `pages` the groups' distinct pages.
  absl::Status CheckGroupsLocked(absl::flat_hash_map<uint64_t, uint64_t>* paid, uint64_t* pages) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The on-idle callback to run (outside the lock) if draining left no session.
  std::function<void()> TakeIdleCallbackLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Declared first in a call that allocates pages: NotifySlabDepartures as it returns, after its lock.
  struct NotifyDeparturesOnReturn {
    SessionManager* manager;
    ~NotifyDeparturesOnReturn() { manager->NotifySlabDepartures(); }
  };
  // Declared first in a call that can change a durable request: FlushJournal as it returns.
  struct FlushJournalOnReturn {
    SessionManager* manager;
    ~FlushJournalOnReturn() { manager->FlushJournal(); }
  };
  // The journal (session_journal.cc): `r` of `s` may have changed as a durable request
  // (admitted, extended, leased, about to be released); the next FlushJournal decides its record.
  // A no-op without a journal, and for a request neither durable nor journaled.
  void JournalTouchLocked(const Session& s, const Request& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same by name, for a request that left its session (adopted elsewhere): a Forget when
  // the journal holds it.
  void JournalTouchLocked(uint64_t session_id, uint64_t request_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The records for the touched requests (a Put for one durable now, a Forget for one journaled
  // before and not now), and the new slabs they reference.
  JournalBatch DecideJournalLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Options options_;
  const absl::Time start_time_ = absl::Now();
  mutable absl::Mutex mu_;
  // Thread-safe itself; guarded so that a request's pages and the ledger change together.
  std::unique_ptr<PagePool> pool_ ABSL_GUARDED_BY(mu_);
  // The same pool (set at construction, never replaced; thread-safe itself), for its calls that
  // need none of the manager's state: HasDepartures, SweepRetired, WaitIdle.
  PagePool* const pool_unlocked_;
  // Tenants' sums, rows, LRU order and quota decisions; pool_ and sessions_ are its edges.
  AdmissionLedger ledger_ ABSL_GUARDED_BY(mu_);
  // pool_ as the PageSource admissions reserve from (Reserve, request_table.h).
  PoolPages pages_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::unique_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int32_t, uint64_t> arena_bytes_by_device_ ABSL_GUARDED_BY(mu_);
  uint64_t host_arena_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // against options_.host_arena_budget_bytes
  uint64_t next_session_id_ ABSL_GUARDED_BY(mu_) = 1;
  const std::string instance_ = NewSecret128();  // SessionOpened.daemon_instance: this process's life
  uint64_t admissions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rejections_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, uint64_t> rejections_by_reason_ ABSL_GUARDED_BY(mu_);
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t undelivered_notices_ ABSL_GUARDED_BY(mu_) = 0;  // eviction notices the sink turned away
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> on_idle_ ABSL_GUARDED_BY(mu_);
  ImportTarget* import_target_ ABSL_GUARDED_BY(mu_) = nullptr;
  ImportGrants grants_ ABSL_GUARDED_BY(mu_);  // open and spent import grants
  // Leases, the orphans that keep durable requests and their figures (durable_requests.h).
  DurableRequests durable_ ABSL_GUARDED_BY(mu_);
  // TP groups and their members (tp_groups.h); their requests' pages are admitted here.
  TpGroups groups_ ABSL_GUARDED_BY(mu_);
  // The journal's side here (session_journal.cc): requests touched since the last decision, those
  // the journal holds, the records' sequence, and the newest ticket decided.
  std::vector<JournalKey> journal_touched_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<JournalKey> journaled_ ABSL_GUARDED_BY(mu_);
  uint64_t journal_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<bool> journal_pending_{false};  // !journal_touched_.empty(), readable without mu_
  std::atomic<uint64_t> journal_decided_{0};  // the ticket of the newest batch decided
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_SESSION_MANAGER_H_
