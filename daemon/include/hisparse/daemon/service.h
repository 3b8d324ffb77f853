// HiSparseService: the gRPC edge of hisparsed. A thin map from hisparse.v1 RPCs onto
// SessionManager; the one place where absl::Status becomes grpc::Status. Thread-safe.
#ifndef HISPARSE_DAEMON_SERVICE_H_
#define HISPARSE_DAEMON_SERVICE_H_

#include <functional>
#include <string>

#include "hisparse/daemon/metrics.h"
#include "hisparse/daemon/session_manager.h"
#include "hisparse/v1/hisparse.grpc.pb.h"

namespace hisparse {

grpc::Status ToGrpcStatus(const absl::Status& status);

class HiSparseService final : public v1::HiSparse::Service {
 public:
  // What the service needs from the daemon around it (all called outside any service lock).
  struct Hooks {
    std::function<bool(bool exit_when_idle)> drain;  // stop admitting, health NOT_SERVING; false: not yet
    std::function<std::string()> config_yaml;        // the effective configuration
  };
  HiSparseService(SessionManager* sessions, Metrics* metrics, Hooks hooks)
      : sessions_(sessions), metrics_(metrics), hooks_(std::move(hooks)) {}

  grpc::Status Session(grpc::ServerContext* context,
                       grpc::ServerReaderWriter<v1::SessionEvent, v1::SessionRequest>* stream) override;
  grpc::Status Admit(grpc::ServerContext*, const v1::AdmitRequest* req, v1::AdmitResponse* resp) override;
  grpc::Status Extend(grpc::ServerContext*, const v1::ExtendRequest* req, v1::ExtendResponse* resp) override;
  grpc::Status Release(grpc::ServerContext*, const v1::ReleaseRequest* req, v1::ReleaseResponse* resp) override;
  grpc::Status Stats(grpc::ServerContext*, const v1::StatsRequest* req, v1::StatsResponse* resp) override;
  grpc::Status ListRequests(grpc::ServerContext*, const v1::ListRequestsRequest* req,
                            v1::ListRequestsResponse* resp) override;
  grpc::Status Evict(grpc::ServerContext*, const v1::EvictRequest* req, v1::EvictResponse* resp) override;
  grpc::Status Drain(grpc::ServerContext*, const v1::DrainRequest* req, v1::DrainResponse* resp) override;
  grpc::Status GetConfig(grpc::ServerContext*, const v1::GetConfigRequest* req, v1::GetConfigResponse* resp) override;

 private:
  SessionManager* const sessions_;
  Metrics* const metrics_;  // may be null
  const Hooks hooks_;
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_SERVICE_H_
