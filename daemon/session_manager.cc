// SessionManager: the facade over the request-lifecycle modules (session_manager.h). Each call is
// one module's; what is here is only what spans modules: a session's end (its imports revoked,
// then its requests ended or orphaned, then its group rank and arena freed), the routing of an
// import's admission and release, and what every public call does as it returns (the journal's
// commit, the slab notices).
#include "hisparse/daemon/session_manager.h"

#include <utility>

#include "hisparse/common/log.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/daemon/deferred_log.h"
#include "hisparse/daemon/parking.h"

namespace hisparse {

SessionManager::SessionManager(const Options& options, std::unique_ptr<PagePool> pool)
    : core_(options, std::move(pool)),
      opener_(core_),
      durability_(core_),
      admissions_(core_, durability_),
      imports_(core_, admissions_, durability_),
      batches_(core_, admissions_, imports_, durability_),
      journaling_(core_, durability_, options.journal),
      reports_(core_, durability_, imports_) {
  if (options.journal != nullptr) core_.SetRequestChanges(&journaling_);
}

SessionManager::~SessionManager() = default;

// A durable request's change is journaled before the call answers; an allocation may have retired
// another session's idle slab, whose engine hears of it after the lock.
SessionManager::OnReturn::~OnReturn() {
  manager->FlushJournal();
  if (notify_departures) manager->NotifySlabDepartures();
}

absl::StatusOr<v1::SessionOpened> SessionManager::OpenSession(const v1::OpenSession& open,
                                                              const PeerCredentials& owner) {
  return opener_.Open(open, owner);
}

void SessionManager::CloseSession(uint64_t session_id) {
  const OnReturn on_return{this, false};
  imports_.RevokeOf(session_id);  // before its pages are freed
  std::unique_ptr<SessionEntry> dead;
  size_t released = 0;
  std::function<void()> on_idle;
  DeferredLog log;
  {
    NodeLock lock(core_);
    auto it = core_.sessions_.find(session_id);
    if (it == core_.sessions_.end()) return;
    dead = std::move(it->second);
    core_.sessions_.erase(it);
    // Its requests released, but for durable ones, which stay as an orphan; its idle slabs leave
    // it (dropped outside the lock). Then its rank of a TP group is freed (a group request is
    // never durable, so none went to the orphan).
    durability_.AssertHeld();
    released = durability_.EndSessionLocked(*dead, log);
    if (std::optional<uint64_t> ended = core_.groups_.Leave(*dead)) core_.pool_->RetireIdleOf(*ended);
    core_.arena_bytes_by_device_[dead->device] -= dead->arena_bytes;
    if (dead->arena->in_host_memory()) core_.host_arena_bytes_ -= dead->arena_bytes;
    on_idle = core_.TakeIdleCallbackLocked();
  }
  log.Flush();
  // The arena (memfd and mapping, or the GPU allocation) goes with `dead`, outside the lock: the
  // daemon's GPU memory is released here, and the GPU's once the engine's import is gone too (an
  // engine that died has lost it already). A Stats call in flight may hold the GPU arena a moment.
  dead.reset();
  LOCKED_LOG(INFO) << "session " << session_id << " closed: released " << released << " requests";
  if (on_idle) on_idle();
}

absl::Status SessionManager::CheckOwner(const v1::SessionRef& ref, uint32_t uid) const {
  return opener_.CheckOwner(ref, uid);
}

absl::StatusOr<UniqueFd> SessionManager::DupFdFor(uint64_t session_id, const std::string& token, const FdObject& object,
                                                  const PeerCredentials& peer, uint64_t* bytes,
                                                  std::string* ipc_handle) {
  return opener_.DupFdFor(session_id, token, object, peer, bytes, ipc_handle);
}

absl::StatusOr<UniqueFd> SessionManager::DupFdFor(uint64_t session_id, const std::string& token,
                                                  const std::string& object, const PeerCredentials& peer,
                                                  uint64_t* bytes, std::string* ipc_handle) {
  HS_ASSIGN_OR_RETURN(FdObject decoded, DecodeFdObject(object));
  return opener_.DupFdFor(session_id, token, decoded, peer, bytes, ipc_handle);
}

void SessionManager::SetEventSink(uint64_t session_id, EventSink sink) {
  opener_.SetEventSink(session_id, std::move(sink));
}

absl::StatusOr<v1::AdmitResponse> SessionManager::Admit(const v1::AdmitRequest& req) {
  const OnReturn on_return{this, true};
  if (req.begin_import()) return imports_.Admit(req);
  return admissions_.Admit(req);
}

absl::StatusOr<v1::ExtendResponse> SessionManager::Extend(const v1::ExtendRequest& req) {
  const OnReturn on_return{this, true};
  return admissions_.Extend(req);
}

absl::Status SessionManager::Release(const v1::ReleaseRequest& req) {
  const OnReturn on_return{this, false};
  if (std::optional<absl::Status> released = admissions_.ReleaseHot(req)) return *released;
  if (std::optional<absl::Status> aborted = imports_.ReleaseIfImporting(req)) return *aborted;
  return admissions_.Release(req);
}

absl::StatusOr<v1::AdmitBatchResponse> SessionManager::AdmitBatch(const v1::AdmitBatchRequest& req) {
  const OnReturn on_return{this, true};
  return batches_.AdmitBatch(req);
}

absl::StatusOr<v1::ReleaseBatchResponse> SessionManager::ReleaseBatch(const v1::ReleaseBatchRequest& req) {
  const OnReturn on_return{this, false};
  return batches_.ReleaseBatch(req);
}

absl::StatusOr<v1::ParkResponse> SessionManager::Park(const v1::ParkRequest& req) { return Parking::Park(core_, req); }

absl::StatusOr<v1::ResumeResponse> SessionManager::Resume(const v1::ResumeRequest& req) {
  return Parking::Resume(core_, req);
}

absl::StatusOr<v1::ParkBatchResponse> SessionManager::ParkBatch(const v1::ParkBatchRequest& req) {
  return batches_.ParkBatch(req);
}

absl::StatusOr<v1::ResumeBatchResponse> SessionManager::ResumeBatch(const v1::ResumeBatchRequest& req) {
  return batches_.ResumeBatch(req);
}

absl::StatusOr<v1::EvictResponse> SessionManager::Evict(const v1::EvictRequest& req, std::optional<uint32_t> only_uid) {
  const OnReturn on_return{this, false};
  return admissions_.Evict(req, only_uid);
}

void SessionManager::SetImportTarget(ImportTarget* target) { imports_.SetTarget(target); }

absl::StatusOr<v1::AdmitResponse> SessionManager::AdmitImport(const v1::AdmitRequest& req) {
  const OnReturn on_return{this, true};
  return imports_.Admit(req);
}

absl::Status SessionManager::CommitImport(const v1::CommitImportRequest& req, uint32_t caller_uid) {
  return imports_.Commit(req, caller_uid);
}

absl::Status SessionManager::AbortImport(const v1::AbortImportRequest& req, uint32_t caller_uid) {
  return imports_.Abort(req, caller_uid);
}

size_t SessionManager::ExpireImports() { return imports_.Expire(); }

size_t SessionManager::AbortLostImports(const std::vector<std::string>& grant_ids, const std::string& reason) {
  return imports_.AbortLost(grant_ids, reason);
}

absl::StatusOr<v1::SetLeaseResponse> SessionManager::SetLease(const v1::SetLeaseRequest& req) {
  const OnReturn on_return{this, false};
  return durability_.SetLease(req);
}

absl::StatusOr<v1::ListAdoptableResponse> SessionManager::ListAdoptable(const v1::ListAdoptableRequest& req) {
  return reports_.ListAdoptable(req);
}

absl::StatusOr<v1::AdoptResponse> SessionManager::Adopt(const v1::AdoptRequest& req) {
  const OnReturn on_return{this, false};
  return durability_.Adopt(req);
}

size_t SessionManager::ExpireLeases() {
  const OnReturn on_return{this, false};
  return durability_.ExpireLeases();
}

absl::StatusOr<size_t> SessionManager::RestoreOrphans(const std::vector<journal::Put>& puts) {
  const OnReturn on_return{this, false};  // the releases it makes are forgotten
  return journaling_.RestoreOrphans(puts);
}

void SessionManager::FlushJournal() { journaling_.Flush(); }

v1::StatsResponse SessionManager::Stats(std::optional<uint32_t> only_uid) const { return reports_.Stats(only_uid); }

absl::StatusOr<v1::ListRequestsResponse> SessionManager::ListRequests(const v1::ListRequestsRequest& req,
                                                                      std::optional<uint32_t> only_uid) const {
  return reports_.ListRequests(req, only_uid);
}

absl::Status SessionManager::CheckInvariants() const { return reports_.CheckInvariants(); }

absl::StatusOr<uint8_t*> SessionManager::RecordForTest(uint64_t session_id, uint64_t request_id, uint32_t layer,
                                                       uint32_t position) const {
  return reports_.RecordForTest(session_id, request_id, layer, position);
}

void SessionManager::SetDraining(bool draining, std::function<void()> on_idle) {
  std::function<void()> run_now;
  {
    NodeLock lock(core_);
    core_.draining_ = draining;
    core_.on_idle_ = std::move(on_idle);
    run_now = core_.TakeIdleCallbackLocked();
  }
  if (run_now) run_now();
}

void SessionManager::SetLimits(uint32_t max_sessions, uint32_t max_requests_per_session, const QuotaOptions& quotas,
                               bool evict_on_pool_full) {
  NodeLock lock(core_);
  core_.options_.max_sessions = max_sessions;
  core_.options_.max_requests_per_session = max_requests_per_session;
  core_.ledger_.SetQuotas(quotas);
  core_.options_.evict_on_pool_full = evict_on_pool_full;
}

void SessionManager::SetHostArenaBudget(uint64_t bytes) {
  NodeLock lock(core_);
  core_.options_.host_arena_budget_bytes = bytes;
}

void SessionManager::SetMaxLeaseSeconds(uint32_t seconds) { durability_.SetMaxLeaseSeconds(seconds); }

void SessionManager::SetMaxOrphansPerTenant(uint32_t orphans) { durability_.SetMaxOrphansPerTenant(orphans); }

void SessionManager::WaitPoolIdle() const { core_.pool_unlocked_->WaitIdle(); }

size_t SessionManager::SweepRetiredSlabs() {
  NotifySlabDepartures();
  return core_.pool_unlocked_->SweepRetired();  // punches outside every lock
}

void SessionManager::NotifySlabDepartures() { core_.NotifySlabDepartures(); }

}  // namespace hisparse
