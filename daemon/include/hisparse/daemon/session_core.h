// SessionCore: what every request-lifecycle module shares — the node's sessions (each with the
// RequestTable that alone says what state its requests are in: request_table.h), the host pool, the
// admission ledger and the TP groups, under one mutex, and the primitives every module builds on:
// finding a session or request, counting a refusal, pages for an Extend, the answer of an admitted
// request, releasing a request, choosing and evicting a victim.
//
// The modules over it each have a file and a type of their own and never include each other's
// headers but where one uses another (the arrows below); SessionManager (session_manager.h) is the
// facade that owns them all and maps the public calls onto them:
//
//   SessionOpener (session_opener.h)          open, memory handed out -> GroupRequests
//   Admissions (admissions.h)                 admit, extend, release   -> Durability, SharedPrefixes, GroupRequests
//   SharedPrefixes (shared_prefixes.h)        a child over its parent's pages
//   GroupRequests (group_requests.h)          one copy for every TP rank -> SharedPrefixes
//   Parking (parking.h)                       park and resume
//   Imports (imports.h)                       a prefill node's writes  -> Admissions, Durability
//   Batches (batches.h)                       N items under one lock   -> Admissions, Imports, Parking, Durability
//   Durability (durability.h)                 leases, orphans, adoption -> SharedPrefixes
//   RequestJournaling (request_journaling.h)  across restarts          -> Durability
//   NodeReports (node_reports.h)              reads it all -> Durability, Imports, SharedPrefixes, GroupRequests
//
// SharedPrefixes and GroupRequests are how a request holds pages, so the core's release and
// eviction call them too; RequestJournaling hears of every change to a durable request through
// RequestChanges below. tests/daemon/check_layering.py holds the modules to this map.
//
// Locks (issue 41, item 2), in this order:
//   mu_          the node's: the sessions map, the TP groups, the modules' own state. Held
//                exclusively by every call but the hot ones below, so they see the node still.
//   a session's  SessionEntry::mu: its RequestTable, sharers and requests' data, for the hot calls,
//                which hold mu_ shared and their session's lock: Admit of a plain request,
//                Extend, Release, Park and Resume. Sessions no longer wait on each other there.
//   ledger_mu_   the AdmissionLedger (tenant sums, rows, LRU) and the admission counters, node-wide
//                and short: held from a reservation's quota check to its commit.
// A session's contents are thus written under mu_ exclusively, or under mu_ shared with the
// session's own lock; clang's analysis checks mu_ and ledger_mu_ (NodeLock takes both, for the
// exclusive calls), the session lock is this rule. The pool is thread-safe itself. A *Locked
// function says in its annotation which it needs. Under none of them is a slab made from the OS
// (WithSlabsOutsideLocks below) or a line written (NodeLock and HotSession defer LOCKED_LOG lines
// until they are released: deferred_log.h).
#ifndef HISPARSE_DAEMON_SESSION_CORE_H_
#define HISPARSE_DAEMON_SESSION_CORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "hisparse/common/secret.h"
#include "hisparse/common/version.h"
#include "hisparse/daemon/admission_ledger.h"
#include "hisparse/daemon/config.h"
#include "hisparse/daemon/deferred_log.h"
#include "hisparse/daemon/gpu_arena.h"
#include "hisparse/daemon/page_pool.h"
#include "hisparse/daemon/request_table.h"
#include "hisparse/daemon/session_entry.h"
#include "hisparse/daemon/tp_groups.h"
#include "hisparse/v1/hisparse.pb.h"

namespace hisparse {

class RequestJournal;  // request_journal.h

// SessionManager::Options: the daemon's limits and seams for the request-lifecycle modules.
struct SessionOptions {
  // Hard per-tenant limits (tenant = the uid that opened the session); 0 = unlimited. A tenant's
  // rows are bounded by sessions x max_requests_per_session. See AdmissionLedger::Quotas.
  AdmissionLedger::Quotas quotas;
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
  // The time of the LRU order of evict_lru_idle, leases and grants (unset: absl::Now). Tests
  // inject a fake one. Read under the ledger's lock or the node's mutex held exclusively.
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

// Told of every change to a request that may be durable (admitted, extended, leased, adopted,
// about to be released), under SessionCore's mutex: RequestJournaling (request_journaling.h).
class RequestChanges {
 public:
  virtual ~RequestChanges() = default;
  virtual void TouchedLocked(const SessionEntry& s, const RequestEntry& r) = 0;
  // By name, for a request that left its session (adopted elsewhere).
  virtual void LeftLocked(uint64_t session_id, uint64_t request_id) = 0;
};

class SessionCore {
 public:
  using Session = SessionEntry;
  using Request = RequestEntry;
  using EventSink = SessionEventSink;

  SessionCore(const SessionOptions& options, std::unique_ptr<PagePool> pool);
  SessionCore(const SessionCore&) = delete;
  SessionCore& operator=(const SessionCore&) = delete;

  // A request chosen for eviction under the lock and evicted after it (EvictVictim): named by
  // its generation too, so that one released and admitted again meanwhile is not the one evicted.
  struct Victim {
    uint64_t session_id = 0;
    uint64_t request_id = 0;
    uint64_t generation = 0;
    std::shared_ptr<EventSink> sink;
  };
  // An admission's answer, and whether it failed for want of room in the pool: the one refusal
  // that evicting the tenant's own requests can cure.
  struct AdmitOutcome {
    absl::StatusOr<v1::AdmitResponse> result;
    bool lacked_room = false;
    // A hot try (Admissions) that lacked room: not counted, for the exclusive path, where the pool
    // is still, to try again (evicting, under evict_lru_idle) and count.
    bool deferred = false;
  };

  // The clock (options.clock, else absl::Now).
  absl::Time Now() const;
  absl::StatusOr<Session*> FindLocked(const v1::SessionRef& ref) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The request `request_id` of the session `ref` names, or PermissionDenied / NotFound.
  absl::StatusOr<Request*> FindRequestLocked(const v1::SessionRef& ref, uint64_t request_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Request `request_id` of `s`, or NotFound (under `s`'s lock, or mu_ exclusively).
  static absl::StatusOr<Request*> RequestOf(Session& s, uint64_t request_id);
  // Counts a refused admission under `reason` and returns `status`.
  absl::Status Reject(RejectReason reason, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ledger_mu_);
  absl::Status Reject(Refusal refusal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ledger_mu_);
  // A Reserve (request_table.h) that failed, as an admission answers it: its refusal counted (when
  // it is one), and whether it lacked room in the pool.
  AdmitOutcome RefusedLocked(ReserveOutcome outcome) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ledger_mu_);
  // Pages a request of `s` needs per layer to hold `tokens` positions.
  static uint64_t PagesFor(const Session& s, uint64_t tokens);
  static absl::Status CheckBudget(const Session& s, uint32_t token_budget);
  // An Extend's pages: `extra` more for every layer of `layers` (a request's, of pool owner
  // `owner`: a session, or a TP group's owner), each continuing after its layer's last page where
  // that slab has the next ones free; all or nothing. ResourceExhausted without room (an exclusive
  // caller counts it as kPoolFull, a hot one leaves it to the exclusive path); Unavailable when a
  // slab must be made outside the locks first (WithSlabsOutsideLocks), and then the slabs for every
  // layer are what is made. The pool's own locks only. An admission's pages come from Reserve
  // (request_table.h) instead.
  using Layers = std::vector<std::vector<PagePool::Page>>;
  absl::StatusOr<Layers> TakeLayerPages(uint64_t owner, const Layers& layers, uint64_t extra) const;
  // The request's pages as the wire lists them (slab, offset), one LayerPages per layer.
  // A page shared with another request now is read_only there.
  void FillLayers(const Session& s, const Request& r, google::protobuf::RepeatedPtrField<v1::LayerPages>* out) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // An admitted request's answer: its row, capacity and pages.
  v1::AdmitResponse AdmitAnswerLocked(const Session& s, const Request& r) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Releases `r`'s pages (its group share, its shared pages' charges) and forgets it: `r` is gone.
  void ReleaseRequestLocked(Session& s, Request& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, ledger_mu_);
  // The same for a request that is not a TP group's share (its pages are its session's), in two
  // steps a hot Release runs under its session's lock: the pages back to the pool (the pool's lock
  // only) and the journal told (TouchedLocked: its own lock), then the request forgotten (its
  // charges passed on, its row freed: the ledger's lock).
  void ReleaseOwnLocked(Session& s, Request& r) ABSL_SHARED_LOCKS_REQUIRED(mu_)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ledger_mu_);
  void ReleasePagesLocked(const Session& s, const Request& r) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void ForgetOwnLocked(Session& s, Request& r) ABSL_SHARED_LOCKS_REQUIRED(mu_)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ledger_mu_);
  // `r` of `s` may have changed as a durable request: RequestChanges hears of it (a no-op without one).
  void TouchedLocked(const Session& s, const Request& r) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void LeftLocked(uint64_t session_id, uint64_t request_id) ABSL_SHARED_LOCKS_REQUIRED(mu_);

  // evict_lru_idle: whether evicting the tenant's requests could make room for `need_pages`.
  bool EvictionCouldAdmitLocked(const Session& s, uint64_t need_pages) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, ledger_mu_);
  std::optional<Victim> PickVictimLocked(uint64_t session_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, ledger_mu_);
  // Tells the victim's session, then releases the request: the same request that was chosen (its
  // generation), and one that is not importing. NotFound when it was released (or released and
  // admitted again, or its session ended) meanwhile, FailedPrecondition when it is importing
  // now. Takes the lock itself; returns the bytes freed.
  absl::StatusOr<uint64_t> EvictVictim(const Victim& v, const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);

  // New slabs are made outside the node's locks (PagePool::SlabsOutsideLocks): a call whose
  // allocation under its locks wanted one answers Unavailable; this runs `attempt(outside)` (which
  // takes and releases its locks) and, while it wanted a slab, makes it with no lock held and runs
  // it again; the last of kSlabRounds tries makes slabs inline, as before (MakeWantedSlabs counts
  // them). An attempt that knows its whole need (a batch's items) records it in `outside` itself
  // (SlabsOutsideLocks::WantedLarger; an Extend, TakeLayerPages).
  static constexpr int kSlabRounds = 3;
  template <typename Attempt>
  auto WithSlabsOutsideLocks(Attempt&& attempt) ABSL_LOCKS_EXCLUDED(mu_) {
    PagePool::SlabsOutsideLocks outside;
    for (;;) {
      auto result = attempt(outside);
      if (!MakeWantedSlabs(outside)) return result;
    }
  }
  // The want of `outside`, made (PagePool::Prepare) with no lock held; an owner that ended
  // meanwhile has its idle slabs retired again (nobody else would). After kSlabRounds - 1 wants
  // made in one scope it lifts the scope: the next try makes its slabs inline (progress before
  // purity). False when there was no want.
  bool MakeWantedSlabs(PagePool::SlabsOutsideLocks& outside) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether pool owner `owner` is a session or a TP group's.
  bool OwnerLiveLocked(uint64_t owner) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  // Tells each engine which slabs left its session (or its TP group) since the last call
  // (PagePool::Departure): one SlabRetired on the session's stream, sent outside the lock.
  void NotifySlabDepartures() ABSL_LOCKS_EXCLUDED(mu_);
  // The on-idle callback to run (outside the lock) if draining left no session.
  std::function<void()> TakeIdleCallbackLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // RequestJournaling, set once before any session (not owned); null: no journal.
  void SetRequestChanges(RequestChanges* changes) ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  mutable absl::Mutex ledger_mu_ ABSL_ACQUIRED_AFTER(mu_);
  // The limits SetLimits changes are written under mu_; the rest is fixed at construction.
  SessionOptions options_;
  const absl::Time start_time_ = absl::Now();
  const std::string instance_ = NewSecret128();  // SessionOpened.daemon_instance: this process's life
  // Thread-safe itself; guarded so that a request's pages and the ledger change together.
  std::unique_ptr<PagePool> pool_ ABSL_GUARDED_BY(mu_);
  // The same pool (set at construction, never replaced; thread-safe itself), for its calls that
  // need none of the core's state: HasDepartures, SweepRetired, WaitIdle.
  PagePool* const pool_unlocked_;
  // Tenants' sums, rows, LRU order and quota decisions; pool_ and sessions_ are its edges.
  AdmissionLedger ledger_ ABSL_GUARDED_BY(ledger_mu_);
  // pool_ as the PageSource admissions reserve from (Reserve, request_table.h).
  PoolPages pages_ ABSL_GUARDED_BY(ledger_mu_);
  absl::flat_hash_map<uint64_t, std::unique_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  // TP groups and their members (tp_groups.h); their requests' pages are GroupRequests'.
  TpGroups groups_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int32_t, uint64_t> arena_bytes_by_device_ ABSL_GUARDED_BY(mu_);
  uint64_t host_arena_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // against options_.host_arena_budget_bytes
  uint64_t next_session_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t admissions_ ABSL_GUARDED_BY(ledger_mu_) = 0;
  uint64_t rejections_ ABSL_GUARDED_BY(ledger_mu_) = 0;
  std::map<std::string, uint64_t> rejections_by_reason_ ABSL_GUARDED_BY(ledger_mu_);
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t undelivered_notices_ ABSL_GUARDED_BY(mu_) = 0;  // eviction notices the sink turned away
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> on_idle_ ABSL_GUARDED_BY(mu_);

 private:
  RequestChanges* changes_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// The lock of every call but the hot ones: the node's mutex exclusively, then the ledger's.
class ABSL_SCOPED_LOCKABLE NodeLock {
 public:
  explicit NodeLock(SessionCore& core) ABSL_EXCLUSIVE_LOCK_FUNCTION(core.mu_, core.ledger_mu_) : core_(core) {
    core.mu_.Lock();
    core.ledger_mu_.Lock();
  }
  ~NodeLock() ABSL_UNLOCK_FUNCTION() {
    core_.ledger_mu_.Unlock();
    core_.mu_.Unlock();
  }
  NodeLock(const NodeLock&) = delete;
  NodeLock& operator=(const NodeLock&) = delete;

 private:
  LogDeferral deferral_;  // before the locks, gone after them: LOCKED_LOG lines wait for the release
  SessionCore& core_;
};

// A hot call's locks (see "Locks"): the node's mutex held shared, then the session `ref` names
// under its own lock, both for the scope. session() is that session, or FindLocked's refusal.
class ABSL_SCOPED_LOCKABLE HotSession {
 public:
  HotSession(SessionCore& core, const v1::SessionRef& ref) ABSL_SHARED_LOCK_FUNCTION(core.mu_) : core_(core) {
    core.mu_.ReaderLock();
    session_ = core.FindLocked(ref);
    if (session_.ok()) (*session_)->mu->Lock();
  }
  ~HotSession() ABSL_UNLOCK_FUNCTION() {
    if (session_.ok()) (*session_)->mu->Unlock();
    core_.mu_.ReaderUnlock();
  }
  HotSession(const HotSession&) = delete;
  HotSession& operator=(const HotSession&) = delete;

  const absl::StatusOr<SessionEntry*>& session() const { return session_; }

 private:
  LogDeferral deferral_;  // as NodeLock's
  SessionCore& core_;
  absl::StatusOr<SessionEntry*> session_;
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_SESSION_CORE_H_
