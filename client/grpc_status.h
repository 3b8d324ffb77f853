// FromGrpc: the client's one conversion of a gRPC status into absl::Status (ClientSession's
// control calls, client_session.cc and client_batch.cc; FromDaemon for a control lane's reply). A daemon that does not
// answer reads as UNAVAILABLE; every other code is kept, the message prefixed with what was being done.
#ifndef HISPARSE_CLIENT_GRPC_STATUS_H_
#define HISPARSE_CLIENT_GRPC_STATUS_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace hisparse {

// The daemon's answer `code` and `message` to the call `what`, whichever way it came (a gRPC
// status, or a control lane's reply: control_lane.h).
inline absl::Status FromDaemon(absl::StatusCode code, absl::string_view message, absl::string_view what) {
  if (code == absl::StatusCode::kOk) return absl::OkStatus();
  if (code == absl::StatusCode::kDeadlineExceeded || code == absl::StatusCode::kUnavailable) {
    return absl::UnavailableError(absl::StrCat(what, ": the daemon did not answer (", message, ")"));
  }
  return absl::Status(code, absl::StrCat(what, ": ", message));
}

inline absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return FromDaemon(static_cast<absl::StatusCode>(s.error_code()), s.error_message(), what);
}

}  // namespace hisparse

#endif  // HISPARSE_CLIENT_GRPC_STATUS_H_
