// SessionManager: the daemon's accounting of the node — sessions, admission and release — as one
// facade over the request-lifecycle modules. It owns SessionCore (session_core.h: the sessions,
// pool, ledger and the one lock; its header maps every module) and maps each public call onto the
// module that does it. What state a request is in is its session's RequestTable's (request_table.h).
//
// A session is the unit of ownership: it holds requests, each request holds host-pool pages per
// layer and one row of the session's slot arena. Ending a session releases all of it, but for
// durable requests whose lease runs (durability.h). Requests are named per session; a session
// belongs to the uid that opened it (its tenant), and a tenant's view (`only_uid`) shows and
// touches its own sessions alone. Transport-free: the gRPC service, the control lanes and the fd
// channel are thin maps onto these calls. Thread-safe.
#ifndef HISPARSE_DAEMON_SESSION_MANAGER_H_
#define HISPARSE_DAEMON_SESSION_MANAGER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hisparse/common/fd_channel_codec.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/common/unix_socket.h"
#include "hisparse/daemon/admissions.h"
#include "hisparse/daemon/batches.h"
#include "hisparse/daemon/durability.h"
#include "hisparse/daemon/imports.h"
#include "hisparse/daemon/node_reports.h"
#include "hisparse/daemon/request_journaling.h"
#include "hisparse/daemon/session_core.h"
#include "hisparse/daemon/session_opener.h"
#include "hisparse/v1/hisparse.pb.h"

namespace hisparse {

class SessionManager {
 public:
  using Options = SessionOptions;
  using QuotaOptions = AdmissionLedger::Quotas;
  using EventSink = SessionEventSink;
  static constexpr int kMaxBatchItems = Batches::kMaxItems;
  static constexpr uint32_t kDefaultPageSize = NodeReports::kDefaultPageSize;
  static constexpr uint32_t kMaxPageSize = NodeReports::kMaxPageSize;

  SessionManager(const Options& options, std::unique_ptr<PagePool> pool);
  ~SessionManager();

  // ---- Sessions (session_opener.h). ----
  absl::StatusOr<v1::SessionOpened> OpenSession(const v1::OpenSession& open, const PeerCredentials& owner);
  // Ends a session: its imports revoked, every request, page and arena released but for its
  // durable requests, which stay parked as an orphan. Idempotent.
  void CloseSession(uint64_t session_id);
  absl::Status CheckOwner(const v1::SessionRef& ref, uint32_t uid) const;
  // For the fd channel: a dup of the descriptor of `object` (the arena or a slab) when
  // session_id/token name a live session that `peer` owns (else PermissionDenied); the caller owns
  // it. `bytes` (may be null) receives the object's size where fstat cannot tell it (a GPU arena).
  // A "cuda-ipc" arena has no descriptor: its 64-byte handle goes to `ipc_handle` and the fd is
  // invalid; with `ipc_handle` null such an arena is refused (FailedPrecondition). `object` may be
  // spelled as on the wire ("arena" or "slab N"; fd_channel_codec.h).
  absl::StatusOr<UniqueFd> DupFdFor(uint64_t session_id, const std::string& token, const FdObject& object,
                                    const PeerCredentials& peer, uint64_t* bytes = nullptr,
                                    std::string* ipc_handle = nullptr);
  absl::StatusOr<UniqueFd> DupFdFor(uint64_t session_id, const std::string& token, const std::string& object,
                                    const PeerCredentials& peer, uint64_t* bytes = nullptr,
                                    std::string* ipc_handle = nullptr);
  // Where a session's notices go (its stream); called outside the lock, must not block, false
  // when the notice will not be delivered. Set by the service right after OpenSession.
  void SetEventSink(uint64_t session_id, EventSink sink);

  // ---- Requests (admissions.h, imports.h, parking.h, batches.h). ----
  absl::StatusOr<v1::AdmitResponse> Admit(const v1::AdmitRequest& req);  // begin_import: Imports
  absl::StatusOr<v1::ExtendResponse> Extend(const v1::ExtendRequest& req);
  absl::Status Release(const v1::ReleaseRequest& req);  // an importing request's: an abort
  absl::StatusOr<v1::AdmitBatchResponse> AdmitBatch(const v1::AdmitBatchRequest& req);
  absl::StatusOr<v1::ReleaseBatchResponse> ReleaseBatch(const v1::ReleaseBatchRequest& req);
  absl::StatusOr<v1::ParkResponse> Park(const v1::ParkRequest& req);
  absl::StatusOr<v1::ResumeResponse> Resume(const v1::ResumeRequest& req);
  absl::StatusOr<v1::ParkBatchResponse> ParkBatch(const v1::ParkBatchRequest& req);
  absl::StatusOr<v1::ResumeBatchResponse> ResumeBatch(const v1::ResumeBatchRequest& req);
  // The session hears of it (RequestEvicted) before its memory is released.
  absl::StatusOr<v1::EvictResponse> Evict(const v1::EvictRequest& req, std::optional<uint32_t> only_uid = std::nullopt);

  // ---- Imports from a prefill node (imports.h; docs/DESIGN.md, "Import"). ----
  void SetImportTarget(ImportTarget* target);
  absl::StatusOr<v1::AdmitResponse> AdmitImport(const v1::AdmitRequest& req);
  absl::Status CommitImport(const v1::CommitImportRequest& req, uint32_t caller_uid);
  absl::Status AbortImport(const v1::AbortImportRequest& req, uint32_t caller_uid);
  size_t ExpireImports();
  size_t AbortLostImports(const std::vector<std::string>& grant_ids, const std::string& reason);

  // ---- Durable requests and restarts (durability.h, request_journaling.h). ----
  absl::StatusOr<v1::SetLeaseResponse> SetLease(const v1::SetLeaseRequest& req);
  absl::StatusOr<v1::ListAdoptableResponse> ListAdoptable(const v1::ListAdoptableRequest& req);
  absl::StatusOr<v1::AdoptResponse> Adopt(const v1::AdoptRequest& req);
  size_t ExpireLeases();
  absl::StatusOr<size_t> RestoreOrphans(const std::vector<journal::Put>& puts);
  void FlushJournal();

  // ---- Reports (node_reports.h). ----
  v1::StatsResponse Stats(std::optional<uint32_t> only_uid = std::nullopt) const;
  absl::StatusOr<v1::ListRequestsResponse> ListRequests(const v1::ListRequestsRequest& req,
                                                        std::optional<uint32_t> only_uid = std::nullopt) const;
  absl::Status CheckInvariants() const;
  absl::StatusOr<uint8_t*> RecordForTest(uint64_t session_id, uint64_t request_id, uint32_t layer,
                                         uint32_t position) const;

  // ---- The node's limits and the pool's upkeep. ----
  // Stop admitting (drain); `on_idle` (may be empty) runs, outside the lock, once no session is left.
  void SetDraining(bool draining, std::function<void()> on_idle = {});
  // Live-changeable limits (SIGHUP). Existing sessions keep their geometry, arenas, leases, orphans.
  void SetLimits(uint32_t max_sessions, uint32_t max_requests_per_session, const QuotaOptions& quotas,
                 bool evict_on_pool_full);
  void SetHostArenaBudget(uint64_t bytes);
  void SetMaxLeaseSeconds(uint32_t seconds);
  void SetMaxOrphansPerTenant(uint32_t orphans);
  // Blocks until the pool's worker has dropped every slab left so far (and filled its reserve).
  void WaitPoolIdle() const;
  // Retired slabs an engine touched again are punched again, those found empty stop counting
  // against their tenant (PagePool::SweepRetired); returns how many. Run with the lease sweep.
  size_t SweepRetiredSlabs();
  // Tells each engine which slabs left its session (or TP group) since the last call.
  void NotifySlabDepartures();

 private:
  // Declared first in a public call: the journal and the slab notices run as it returns.
  struct OnReturn {
    SessionManager* manager;
    bool notify_departures;
    ~OnReturn();
  };

  SessionCore core_;
  SessionOpener opener_;
  Durability durability_;
  Admissions admissions_;
  Imports imports_;
  Batches batches_;
  RequestJournaling journaling_;
  NodeReports reports_;
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_SESSION_MANAGER_H_
