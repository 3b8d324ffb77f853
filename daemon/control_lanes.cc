#include "hisparse/daemon/control_lanes.h"

#include <fcntl.h>
#include <sys/socket.h>

#include <chrono>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "hisparse/common/log.h"
#include "hisparse/daemon/deferred_log.h"

namespace hisparse {
namespace {

LaneMessage Reply(const absl::Status& status) {
  return LaneMessage{static_cast<uint8_t>(status.code()), std::string(status.message())};
}

// One verb: parse the request, hold it to the lane's session, run the manager's call, time it as
// the gRPC service times the same RPC, and frame the answer.
template <typename Request, typename Call>
LaneMessage Run(Metrics* metrics, Metrics::Method method, uint64_t session_id, const LaneMessage& m, Call&& call) {
  const auto start = std::chrono::steady_clock::now();
  Request req;
  LaneMessage out;
  if (!req.ParseFromString(m.body)) {
    out = Reply(absl::InvalidArgumentError(
        absl::StrCat("control lane: the ", LaneVerbName(LaneVerb{m.tag}), " request does not parse")));
  } else if (req.session().session_id() != session_id) {
    out = Reply(absl::PermissionDeniedError(
        absl::StrCat("this control lane serves session ", session_id, ", not session ", req.session().session_id())));
  } else if (auto resp = std::forward<Call>(call)(req); !resp.ok()) {
    out = Reply(resp.status());
  } else {
    out = LaneMessage{0, resp->SerializeAsString()};
  }
  if (metrics != nullptr) {
    metrics->ObserveRpc(method, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return out;
}

}  // namespace

LaneMessage ControlLanes::Handle(SessionManager& sessions, Metrics* metrics, uint64_t session_id,
                                 const LaneMessage& m) {
  switch (static_cast<LaneVerb>(m.tag)) {
    case LaneVerb::kAdmit:
      return Run<v1::AdmitRequest>(metrics, Metrics::kAdmit, session_id, m,
                                   [&](const v1::AdmitRequest& r) { return sessions.Admit(r); });
    case LaneVerb::kExtend:
      return Run<v1::ExtendRequest>(metrics, Metrics::kExtend, session_id, m,
                                    [&](const v1::ExtendRequest& r) { return sessions.Extend(r); });
    case LaneVerb::kRelease:
      return Run<v1::ReleaseRequest>(metrics, Metrics::kRelease, session_id, m,
                                     [&](const v1::ReleaseRequest& r) -> absl::StatusOr<v1::ReleaseResponse> {
                                       if (absl::Status st = sessions.Release(r); !st.ok()) return st;
                                       return v1::ReleaseResponse();
                                     });
    case LaneVerb::kAdmitBatch:
      return Run<v1::AdmitBatchRequest>(metrics, Metrics::kAdmitBatch, session_id, m,
                                        [&](const v1::AdmitBatchRequest& r) { return sessions.AdmitBatch(r); });
    case LaneVerb::kReleaseBatch:
      return Run<v1::ReleaseBatchRequest>(metrics, Metrics::kReleaseBatch, session_id, m,
                                          [&](const v1::ReleaseBatchRequest& r) { return sessions.ReleaseBatch(r); });
    case LaneVerb::kPark:
      return Run<v1::ParkRequest>(metrics, Metrics::kPark, session_id, m,
                                  [&](const v1::ParkRequest& r) { return sessions.Park(r); });
    case LaneVerb::kResume:
      return Run<v1::ResumeRequest>(metrics, Metrics::kResume, session_id, m,
                                    [&](const v1::ResumeRequest& r) { return sessions.Resume(r); });
    case LaneVerb::kParkBatch:
      return Run<v1::ParkBatchRequest>(metrics, Metrics::kParkBatch, session_id, m,
                                       [&](const v1::ParkBatchRequest& r) { return sessions.ParkBatch(r); });
    case LaneVerb::kResumeBatch:
      return Run<v1::ResumeBatchRequest>(metrics, Metrics::kResumeBatch, session_id, m,
                                         [&](const v1::ResumeBatchRequest& r) { return sessions.ResumeBatch(r); });
  }
  return Reply(absl::InvalidArgumentError(absl::StrCat("control lane: unknown verb ", int{m.tag})));
}

absl::Status ControlLanes::Open(UniqueFd conn, const LaneHello& hello, const PeerCredentials& peer) {
  Reap();
  auto lane = std::make_unique<Lane>();
  lane->fd = std::move(conn);
  lane->session_id = hello.session_id;
  absl::Status st = Start(std::move(lane), hello, peer);
  if (metrics_ != nullptr) metrics_->ObserveLaneHello(st.ok());
  return st;
}

absl::Status ControlLanes::Start(std::unique_ptr<Lane> lane, const LaneHello& hello, const PeerCredentials& peer) {
  Lane* raw = lane.get();
  // Every refusal is answered on the connection (best effort, never waiting) before it closes.
  auto refuse = [raw](absl::Status why) {
    const std::string reply = EncodeLaneHelloReply(why);
    (void)::send(raw->fd.get(), reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    return why;
  };
  // The lane's thread blocks on its socket; the fd channel's are non-blocking.
  const int flags = ::fcntl(raw->fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(raw->fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return refuse(absl::InternalError("control lane: cannot make its socket blocking"));
  }
  if (!enabled_.load()) {
    return refuse(absl::FailedPreconditionError("this daemon serves no control lanes now (limits.control_lanes)"));
  }
  DeferredLog log;  // written once the lock is released
  absl::MutexLock lock(&mu_);
  if (stopped_) return refuse(absl::UnavailableError("the daemon is stopping"));
  // Checked here, under mu_, so that a session ending now either fails this check or finds the lane
  // in by_session_ when SessionEnded runs (it runs after the session left the manager).
  v1::SessionRef ref;
  ref.set_session_id(hello.session_id);
  ref.set_token(hello.token);
  if (absl::Status owner = sessions_->CheckOwner(ref, peer.uid); !owner.ok()) return refuse(owner);
  // The answer goes before the thread reads: the peer sends nothing until it has it. Its receive
  // queue is empty (it waits for this), so the send does not block.
  const std::string ok = EncodeLaneHelloReply(absl::OkStatus());
  if (::send(raw->fd.get(), ok.data(), ok.size(), MSG_NOSIGNAL | MSG_DONTWAIT) != static_cast<ssize_t>(ok.size())) {
    return absl::UnavailableError("control lane: the peer did not take the hello's answer");
  }
  try {
    raw->thread = std::thread([this, raw] { Serve(raw); });
  } catch (const std::system_error& e) {
    // The peer was told OK; the lane closing tells it otherwise (it keeps gRPC).
    DEFERRED_LOG(log, WARNING) << "session " << hello.session_id
                               << ": cannot start a control lane thread: " << e.what();
    return absl::UnavailableError("no thread for the control lane");
  }
  if (auto old = by_session_.find(hello.session_id); old != by_session_.end()) {
    ::shutdown(old->second->fd.get(), SHUT_RDWR);  // its thread finishes it
  }
  by_session_[hello.session_id] = raw;
  live_.emplace(raw, std::move(lane));
  if (metrics_ != nullptr) metrics_->SetControlLanes(live_.size());
  return absl::OkStatus();
}

void ControlLanes::Serve(Lane* lane) {
  // The socket is this lane's alone; it is shut down (never closed) by others while this runs.
  const int fd = lane->fd.get();
  while (true) {
    absl::StatusOr<LaneMessage> request = RecvLaneMessage(fd, kLaneMaxRequestBytes);
    if (!request.ok()) {
      if (!absl::IsUnavailable(request.status())) {
        LOG(WARNING) << "session " << lane->session_id << ": control lane dropped: " << request.status().message();
      }
      break;
    }
    const LaneMessage reply = Handle(*sessions_, metrics_, lane->session_id, *request);
    if (!SendLaneMessage(fd, reply.tag, reply.body).ok()) break;  // the peer is gone, or the lane was ended
  }
  Finish(lane);
}

void ControlLanes::Finish(Lane* lane) {
  absl::MutexLock lock(&mu_);
  if (auto it = by_session_.find(lane->session_id); it != by_session_.end() && it->second == lane) {
    by_session_.erase(it);
  }
  auto it = live_.find(lane);
  if (it == live_.end()) return;  // cannot happen: only Finish takes a lane out of live_
  lane->fd.Reset();               // under mu_: nobody shuts a closed descriptor's number down
  finished_.push_back(std::move(it->second));
  live_.erase(it);
  if (metrics_ != nullptr) metrics_->SetControlLanes(live_.size());
}

void ControlLanes::Reap() {
  std::vector<std::unique_ptr<Lane>> done;
  {
    absl::MutexLock lock(&mu_);
    done.swap(finished_);
  }
  for (auto& lane : done) {
    if (lane->thread.joinable()) lane->thread.join();
  }
}

void ControlLanes::SessionEnded(uint64_t session_id) {
  {
    absl::MutexLock lock(&mu_);
    if (auto it = by_session_.find(session_id); it != by_session_.end()) {
      ::shutdown(it->second->fd.get(), SHUT_RDWR);
      by_session_.erase(it);
    }
  }
  Reap();
}

void ControlLanes::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    for (auto& [raw, lane] : live_) ::shutdown(lane->fd.get(), SHUT_RDWR);
    mu_.Await(absl::Condition(
        +[](absl::flat_hash_map<Lane*, std::unique_ptr<Lane>>* live) { return live->empty(); }, &live_));
  }
  Reap();
}

size_t ControlLanes::size() const {
  absl::MutexLock lock(&mu_);
  return live_.size();
}

}  // namespace hisparse
