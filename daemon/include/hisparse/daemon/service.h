// HiSparseService: the gRPC edge of hisparsed. A thin map from hisparse.v1 RPCs onto
// SessionManager; the one place where absl::Status becomes grpc::Status. Thread-safe.
#ifndef HISPARSE_DAEMON_SERVICE_H_
#define HISPARSE_DAEMON_SERVICE_H_

#include "hisparse/daemon/session_manager.h"
#include "hisparse/v1/hisparse.grpc.pb.h"

namespace hisparse {

grpc::Status ToGrpcStatus(const absl::Status& status);

class HiSparseService final : public v1::HiSparse::Service {
 public:
  explicit HiSparseService(SessionManager* sessions) : sessions_(sessions) {}

  grpc::Status Session(grpc::ServerContext* context,
                       grpc::ServerReaderWriter<v1::SessionEvent, v1::SessionRequest>* stream) override;
  grpc::Status Admit(grpc::ServerContext*, const v1::AdmitRequest* req, v1::AdmitResponse* resp) override;
  grpc::Status Extend(grpc::ServerContext*, const v1::ExtendRequest* req, v1::ExtendResponse* resp) override;
  grpc::Status Release(grpc::ServerContext*, const v1::ReleaseRequest* req, v1::ReleaseResponse* resp) override;
  grpc::Status Stats(grpc::ServerContext*, const v1::StatsRequest* req, v1::StatsResponse* resp) override;

 private:
  SessionManager* const sessions_;
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_SERVICE_H_
