#include "hisparse/daemon/service.h"

#include "hisparse/common/log.h"
#include "absl/strings/str_cat.h"

namespace hisparse {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and grpc share the canonical code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

grpc::Status HiSparseService::Session(grpc::ServerContext* context,
                                      grpc::ServerReaderWriter<v1::SessionEvent, v1::SessionRequest>* stream) {
  v1::SessionRequest first;
  if (!stream->Read(&first)) return grpc::Status(grpc::StatusCode::CANCELLED, "stream ended before open");
  if (first.kind_case() != v1::SessionRequest::kOpen) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the first message of a session must be `open`");
  }
  auto opened = sessions_->OpenSession(first.open(), /*peer_pid=*/0);
  if (!opened.ok()) return ToGrpcStatus(opened.status());
  const uint64_t id = opened->session_id();
  v1::SessionEvent event;
  *event.mutable_opened() = *std::move(opened);
  grpc::Status result = grpc::Status::OK;
  if (stream->Write(event)) {
    // The session lives as long as this stream. Read() returns false when the client half-closes,
    // is cancelled, or its process dies (its socket closes): all end the session at once.
    v1::SessionRequest msg;
    while (stream->Read(&msg)) {
      if (msg.kind_case() == v1::SessionRequest::kClose) break;
      if (msg.kind_case() == v1::SessionRequest::kOpen) {
        result = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "session already open on this stream");
        break;
      }
    }
  }
  if (context->IsCancelled()) LOG(INFO) << "session " << id << ": peer went away";
  sessions_->CloseSession(id);
  return result;
}

grpc::Status HiSparseService::Admit(grpc::ServerContext*, const v1::AdmitRequest* req, v1::AdmitResponse* resp) {
  auto r = sessions_->Admit(*req);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status HiSparseService::Extend(grpc::ServerContext*, const v1::ExtendRequest* req, v1::ExtendResponse* resp) {
  auto r = sessions_->Extend(*req);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status HiSparseService::Release(grpc::ServerContext*, const v1::ReleaseRequest* req, v1::ReleaseResponse*) {
  return ToGrpcStatus(sessions_->Release(*req));
}

grpc::Status HiSparseService::Stats(grpc::ServerContext*, const v1::StatsRequest*, v1::StatsResponse* resp) {
  *resp = sessions_->Stats();
  return grpc::Status::OK;
}

}  // namespace hisparse
