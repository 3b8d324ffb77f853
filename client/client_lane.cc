// ClientSession's control lane (hisparse/common/control_lane.h): the session's lifecycle calls on
// a SOCK_SEQPACKET connection of its own to the daemon's fd socket, where gRPC's per-call cost
// would otherwise bound how fast an engine admits and releases. Opened once, right after the
// session; a daemon that refuses it (an older one answers INVALID_ARGUMENT) leaves gRPC in place,
// and HISPARSE_CONTROL_LANE=0 keeps gRPC by choice.
#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "client_session.h"
#include "hisparse/common/log.h"
#include "hisparse/common/unix_socket.h"

namespace hisparse {
namespace {

bool LaneWanted() {
  const char* env = std::getenv("HISPARSE_CONTROL_LANE");
  return env == nullptr || std::string(env) != "0";
}

}  // namespace

void ClientSession::OpenLane() {
  if (!LaneWanted() || opened_.fd_socket().empty()) return;
  const int timeout = static_cast<int>(std::min<uint32_t>(timeout_ms_, INT32_MAX));
  absl::StatusOr<UniqueFd> conn = ConnectUnixSeqpacket(opened_.fd_socket(), timeout);
  absl::Status st = conn.status();
  if (st.ok()) st = SendPacket(conn->get(), EncodeLaneHello({opened_.session_id(), opened_.token()}), -1);
  if (st.ok()) {
    absl::StatusOr<Packet> reply = RecvPacket(conn->get(), 1024);
    st = reply.ok() ? DecodeLaneHelloReply(reply->payload) : reply.status();
  }
  if (!st.ok()) {
    // An older daemon, or one that cannot serve a lane now: everything goes over gRPC as before.
    LOG(INFO) << "session " << opened_.session_id() << ": no control lane (" << st.message() << "); using gRPC";
    return;
  }
  absl::MutexLock lock(&lane_mu_);
  lane_ = std::move(*conn);
  on_lane_.store(true);
}

std::optional<absl::Status> ClientSession::CallOnLane(LaneVerb verb, const google::protobuf::MessageLite& req,
                                                      google::protobuf::MessageLite* resp, absl::string_view what) {
  absl::MutexLock lock(&lane_mu_);
  if (!lane_.valid()) return std::nullopt;
  auto drop = [this] {
    lane_mu_.AssertHeld();
    lane_.Reset();
    on_lane_.store(false);
  };
  // The daemon acts on a request only once it has read all of it, so a send that failed reached
  // nothing: gRPC may carry the same call.
  if (!SendLaneMessage(lane_.get(), static_cast<uint8_t>(verb), req.SerializeAsString()).ok()) {
    drop();
    return std::nullopt;
  }
  absl::StatusOr<LaneMessage> reply = RecvLaneMessage(lane_.get(), kLaneMaxReplyBytes);
  if (!reply.ok()) {
    // Sent and not answered: whether the daemon acted is unknown, as after a gRPC deadline. A late
    // reply must never be read as the next call's, so the lane goes.
    drop();
    return FromDaemon(absl::StatusCode::kUnavailable, absl::StrCat("control lane: ", reply.status().message()), what);
  }
  if (reply->tag > static_cast<uint8_t>(absl::StatusCode::kUnauthenticated)) {
    drop();
    return absl::InternalError(absl::StrCat(what, ": the control lane answered an unknown code ", int{reply->tag}));
  }
  const auto code = static_cast<absl::StatusCode>(reply->tag);
  if (code != absl::StatusCode::kOk) return FromDaemon(code, reply->body, what);
  if (!resp->ParseFromString(reply->body)) {
    return absl::InternalError(absl::StrCat(what, ": the control lane's answer does not parse"));
  }
  return absl::OkStatus();
}

}  // namespace hisparse
