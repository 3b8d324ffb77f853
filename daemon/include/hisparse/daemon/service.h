// HiSparseService: the gRPC edge of hisparsed. A thin map from hisparse.v1 RPCs onto
// SessionManager; the one place where absl::Status becomes grpc::Status. Thread-safe.
//
// Every RPC first learns its caller from the PeerRegistry (the kernel's SO_PEERCRED, recorded
// when the connection was accepted); a caller that cannot be told is refused (UNAUTHENTICATED),
// never served as anyone. Then:
//   Session                 opens a session owned by the caller's uid (its tenant); the stream is
//                           bounded by the gate (stream_gate.h) from its start, before its `open`.
//   Admit, Extend, Release, Park, Resume, AdmitBatch, ReleaseBatch, ParkBatch, ResumeBatch, SetLease, ListAdoptable,
//   Adopt
//                           only the session's owner uid, token or not (PERMISSION_DENIED).
//   Stats, ListRequests     an admin sees every session; a tenant only its own.
//   Evict                   an admin any request; a tenant only its own (PERMISSION_DENIED).
//   Drain                   admins only (PERMISSION_DENIED).
//   CommitImport, AbortImport  whoever holds the grant (the capability), from the session's uid
//                           (PERMISSION_DENIED otherwise); no session token.
//   GetConfig               any admitted caller: limits and quotas are what an engine sizes itself
//                           by, and the file holds no secret.
#ifndef HISPARSE_DAEMON_SERVICE_H_
#define HISPARSE_DAEMON_SERVICE_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "hisparse/daemon/accept_guard.h"
#include "hisparse/daemon/access.h"
#include "hisparse/daemon/metrics.h"
#include "hisparse/daemon/session_manager.h"
#include "hisparse/daemon/stream_gate.h"
#include "hisparse/v1/hisparse.grpc.pb.h"

namespace hisparse {

grpc::Status ToGrpcStatus(const absl::Status& status);

class HiSparseService final : public v1::HiSparse::Service {
 public:
  // What the service needs from the daemon around it (all called outside any service lock).
  struct Hooks {
    std::function<bool(bool exit_when_idle)> drain;  // stop admitting, health NOT_SERVING; false: not yet
    std::function<absl::Status()> cancel_drain;      // admit again, health SERVING, no exit once idle
    std::function<std::string()> config_yaml;        // the effective configuration
    std::function<v1::ConfigReloadStatus()> reload;  // the last reload, the keys pending a restart
    // A session's stream has ended and the session is closed (its control lane ends with it).
    std::function<void(uint64_t session_id)> session_ended;
  };
  // `peers` (who is at the other end of each connection) must outlive the service; `policy`
  // says who among them is an admin.
  // `gate` (may be null: Session streams are not bounded before `open`) must outlive the service.
  HiSparseService(SessionManager* sessions, Metrics* metrics, const PeerRegistry* peers, AccessPolicy policy,
                  Hooks hooks, SessionStreamGate* gate = nullptr)
      : sessions_(sessions),
        metrics_(metrics),
        peers_(peers),
        policy_(std::move(policy)),
        hooks_(std::move(hooks)),
        gate_(gate) {}

  grpc::Status Session(grpc::ServerContext* context,
                       grpc::ServerReaderWriter<v1::SessionEvent, v1::SessionRequest>* stream) override;
  grpc::Status Admit(grpc::ServerContext*, const v1::AdmitRequest* req, v1::AdmitResponse* resp) override;
  grpc::Status Extend(grpc::ServerContext*, const v1::ExtendRequest* req, v1::ExtendResponse* resp) override;
  grpc::Status Release(grpc::ServerContext*, const v1::ReleaseRequest* req, v1::ReleaseResponse* resp) override;
  grpc::Status Park(grpc::ServerContext*, const v1::ParkRequest* req, v1::ParkResponse* resp) override;
  grpc::Status Resume(grpc::ServerContext*, const v1::ResumeRequest* req, v1::ResumeResponse* resp) override;
  grpc::Status Stats(grpc::ServerContext*, const v1::StatsRequest* req, v1::StatsResponse* resp) override;
  grpc::Status ListRequests(grpc::ServerContext*, const v1::ListRequestsRequest* req,
                            v1::ListRequestsResponse* resp) override;
  grpc::Status Evict(grpc::ServerContext*, const v1::EvictRequest* req, v1::EvictResponse* resp) override;
  grpc::Status Drain(grpc::ServerContext*, const v1::DrainRequest* req, v1::DrainResponse* resp) override;
  grpc::Status GetConfig(grpc::ServerContext*, const v1::GetConfigRequest* req, v1::GetConfigResponse* resp) override;
  grpc::Status AdmitBatch(grpc::ServerContext*, const v1::AdmitBatchRequest* req,
                          v1::AdmitBatchResponse* resp) override;
  grpc::Status ReleaseBatch(grpc::ServerContext*, const v1::ReleaseBatchRequest* req,
                            v1::ReleaseBatchResponse* resp) override;
  grpc::Status ParkBatch(grpc::ServerContext*, const v1::ParkBatchRequest* req, v1::ParkBatchResponse* resp) override;
  grpc::Status ResumeBatch(grpc::ServerContext*, const v1::ResumeBatchRequest* req,
                           v1::ResumeBatchResponse* resp) override;
  grpc::Status CommitImport(grpc::ServerContext*, const v1::CommitImportRequest* req,
                            v1::CommitImportResponse* resp) override;
  grpc::Status AbortImport(grpc::ServerContext*, const v1::AbortImportRequest* req,
                           v1::AbortImportResponse* resp) override;
  // Durable requests: the session's own tenant, as for Park.
  grpc::Status SetLease(grpc::ServerContext*, const v1::SetLeaseRequest* req, v1::SetLeaseResponse* resp) override;
  grpc::Status ListAdoptable(grpc::ServerContext*, const v1::ListAdoptableRequest* req,
                             v1::ListAdoptableResponse* resp) override;
  grpc::Status Adopt(grpc::ServerContext*, const v1::AdoptRequest* req, v1::AdoptResponse* resp) override;

 private:
  struct Caller {
    PeerCredentials peer;
    bool admin = false;
    // What the caller may see: everything (an admin), or its own uid's sessions.
    std::optional<uint32_t> scope() const { return admin ? std::nullopt : std::optional<uint32_t>(peer.uid); }
  };
  absl::StatusOr<Caller> Identify(grpc::ServerContext* context) const;
  // One unary RPC's shared body (timed, caller identified, absl::Status mapped at the edge):
  // `call(const Caller&)` returns an absl::Status. ServeOwner first checks that the caller's uid
  // owns `req.session()`, then runs `call()`. Defined, and only used, in service.cc.
  template <typename Call>
  grpc::Status Serve(grpc::ServerContext* context, Metrics::Method method, Call&& call) const;
  template <typename Request, typename Call>
  grpc::Status ServeOwner(grpc::ServerContext* context, Metrics::Method method, const Request& req, Call&& call) const;

  SessionManager* const sessions_;
  Metrics* const metrics_;  // may be null
  const PeerRegistry* const peers_;
  const AccessPolicy policy_;
  const Hooks hooks_;
  SessionStreamGate* const gate_;                 // may be null
  RateLimitedLog refused_log_{absl::Seconds(1)};  // streams refused or cancelled by the gate
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_SERVICE_H_
