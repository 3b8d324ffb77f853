#include "hisparse/daemon/service.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "hisparse/common/log.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/daemon/accept_guard.h"

namespace hisparse {
namespace {

// Times one RPC into the metrics' latency histogram.
class RpcTimer {
 public:
  RpcTimer(Metrics* metrics, Metrics::Method method)
      : metrics_(metrics), method_(method), start_(std::chrono::steady_clock::now()) {}
  ~RpcTimer() {
    if (metrics_ != nullptr) {
      metrics_->ObserveRpc(method_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    }
  }

 private:
  Metrics* metrics_;
  Metrics::Method method_;
  std::chrono::steady_clock::time_point start_;
};

using SessionStream = grpc::ServerReaderWriter<v1::SessionEvent, v1::SessionRequest>;

// One session's notices (evictions). They are posted from other threads — an operator's Evict, a
// sibling's Admit under evict_lru_idle — that must never wait on this stream: an engine that does
// not read it would hold them forever once gRPC's flow-control window is full. So a post only
// queues into a small bounded outbox and returns; a writer thread, started when there is
// something to write and gone when there is not, does the blocking Writes (gRPC allows one at a
// time, beside the handler's Read). A notice that does not fit is dropped, and the post says so.
// The handler Closes the notifier before its stream dies.
class Notifier {
 public:
  static constexpr size_t kOutbox = 64;

  Notifier(uint64_t session_id, grpc::ServerContext* context, SessionStream* stream)
      : session_id_(session_id), context_(context), stream_(stream) {}
  ~Notifier() { Close(); }

  // False, with nothing queued, when the stream is closed or broken or the outbox is full.
  bool Post(const v1::SessionEvent& event) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || broken_ || outbox_.size() >= kOutbox) return false;
    outbox_.push_back(event);
    if (writing_) return true;
    // The last writer has left (writing_ went false before it returned): reap it, start another.
    if (writer_.joinable()) writer_.join();
    try {
      writer_ = std::thread([this] { Drain(); });
    } catch (const std::system_error& e) {
      outbox_.pop_back();
      LOG(WARNING) << "session " << session_id_ << ": cannot start a notice writer: " << e.what();
      return false;
    }
    writing_ = true;
    return true;
  }

  // No more notices. A write still in flight gets a moment to finish; one stuck on a peer that
  // does not read is cancelled (the stream is ending anyway). Then the writer is joined.
  void Close() {
    std::unique_lock<std::mutex> lock(mu_);
    closed_ = true;
    if (const size_t dropped = outbox_.size(); dropped != 0) {
      LOG(WARNING) << "session " << session_id_ << ": " << dropped << " notices undelivered (the stream ended)";
      outbox_.clear();
    }
    if (!idle_.wait_for(lock, std::chrono::milliseconds(500), [this] { return !writing_; })) {
      context_->TryCancel();
      idle_.wait(lock, [this] { return !writing_; });
    }
    std::thread writer = std::move(writer_);
    lock.unlock();
    if (writer.joinable()) writer.join();
  }

 private:
  void Drain() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!outbox_.empty() && !closed_) {
      v1::SessionEvent event = std::move(outbox_.front());
      outbox_.pop_front();
      lock.unlock();
      const bool ok = stream_->Write(event);
      lock.lock();
      if (!ok) {
        broken_ = true;
        LOG(WARNING) << "session " << session_id_ << ": " << outbox_.size() + 1
                     << " notices undelivered (its stream is gone)";
        outbox_.clear();
      }
    }
    writing_ = false;
    idle_.notify_all();
  }

  const uint64_t session_id_;
  grpc::ServerContext* const context_;
  SessionStream* const stream_;
  std::mutex mu_;
  std::condition_variable idle_;
  std::deque<v1::SessionEvent> outbox_;  // guarded by mu_
  bool writing_ = false;                 // a writer thread is draining the outbox
  bool closed_ = false;
  bool broken_ = false;  // a Write failed: the peer is gone
  std::thread writer_;
};

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and grpc share the canonical code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::StatusOr<HiSparseService::Caller> HiSparseService::Identify(grpc::ServerContext* context) const {
  if (peers_ == nullptr) return absl::UnauthenticatedError("this server cannot tell who its callers are");
  HS_ASSIGN_OR_RETURN(PeerCredentials peer, peers_->Lookup(context->peer()));
  // A call of a connection that has closed is cancelled; its descriptor number may already name
  // a newer connection, whose credentials are not this call's.
  if (context->IsCancelled()) return absl::UnauthenticatedError("the caller's connection is gone");
  return Caller{peer, policy_.IsAdmin(peer)};
}

grpc::Status HiSparseService::Session(grpc::ServerContext* context,
                                      grpc::ServerReaderWriter<v1::SessionEvent, v1::SessionRequest>* stream) {
  auto caller = Identify(context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  // The stream holds a gRPC thread from now on: the gate bounds such streams before they are
  // sessions (stream_gate.h), and cancels this one if its `open` does not come in time. The
  // ticket lives as long as this handler, and gives the stream's place back as it returns.
  std::optional<SessionStreamGate::Ticket> ticket;
  if (gate_ != nullptr) {
    auto admitted = gate_->Enter(caller->peer.uid, caller->admin, [context] { context->TryCancel(); });
    if (!admitted.ok()) {
      uint64_t suppressed = 0;
      if (refused_log_.ShouldLog(&suppressed)) {
        LOG(WARNING) << "refused a Session stream of pid " << caller->peer.pid << ": " << admitted.status().message()
                     << SuppressedNote(suppressed);
      }
      return ToGrpcStatus(admitted.status());
    }
    ticket.emplace(*std::move(admitted));
  }
  v1::SessionRequest first;
  const bool got_first = stream->Read(&first);
  if (ticket.has_value() && !ticket->Opened()) {
    uint64_t suppressed = 0;
    if (refused_log_.ShouldLog(&suppressed)) {
      LOG(WARNING) << "cancelled a Session stream of pid " << caller->peer.pid << " uid " << caller->peer.uid
                   << ": no `open` within limits.session_open_timeout_ms" << SuppressedNote(suppressed);
    }
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        "no `open` arrived within limits.session_open_timeout_ms: the stream was cancelled");
  }
  if (!got_first) return grpc::Status(grpc::StatusCode::CANCELLED, "stream ended before open");
  if (first.kind_case() != v1::SessionRequest::kOpen) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the first message of a session must be `open`");
  }
  auto opened = sessions_->OpenSession(first.open(), caller->peer);
  if (!opened.ok()) return ToGrpcStatus(opened.status());
  const uint64_t id = opened->session_id();
  v1::SessionEvent event;
  *event.mutable_opened() = *std::move(opened);
  grpc::Status result = grpc::Status::OK;
  // The opened event is written before any notice can be posted (the sink is not set yet).
  const bool opened_written = stream->Write(event);
  // Notices are written from other threads while this one waits in Read(); `stream` dies with
  // this frame, so the notifier is closed (and turns late notices away) before it returns.
  auto notifier = std::make_shared<Notifier>(id, context, stream);
  sessions_->SetEventSink(id, [notifier](const v1::SessionEvent& e) { return notifier->Post(e); });
  if (opened_written) {
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
  notifier->Close();
  sessions_->CloseSession(id);
  if (hooks_.session_ended) hooks_.session_ended(id);
  return result;
}

// The body every unary RPC shares: time it into the metrics, learn the caller (or refuse it),
// run `call` with the caller, and turn its absl::Status into the grpc::Status at the edge.
template <typename Call>
grpc::Status HiSparseService::Serve(grpc::ServerContext* context, Metrics::Method method, Call&& call) const {
  RpcTimer t(metrics_, method);
  auto caller = Identify(context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return ToGrpcStatus(std::forward<Call>(call)(*caller));
}

// As Serve, for the calls only the owner uid of `req.session()` may make (token or not).
template <typename Request, typename Call>
grpc::Status HiSparseService::ServeOwner(grpc::ServerContext* context, Metrics::Method method, const Request& req,
                                         Call&& call) const {
  return Serve(context, method, [&](const Caller& caller) -> absl::Status {
    HS_RETURN_IF_ERROR(sessions_->CheckOwner(req.session(), caller.peer.uid));
    return std::forward<Call>(call)();
  });
}

namespace {

// A SessionManager result into the RPC's response: the value when there is one, else its error.
template <typename T>
absl::Status Fill(absl::StatusOr<T> result, T* resp) {
  if (!result.ok()) return result.status();
  *resp = *std::move(result);
  return absl::OkStatus();
}

}  // namespace

grpc::Status HiSparseService::Admit(grpc::ServerContext* context, const v1::AdmitRequest* req,
                                    v1::AdmitResponse* resp) {
  return ServeOwner(context, Metrics::kAdmit, *req, [&] { return Fill(sessions_->Admit(*req), resp); });
}

grpc::Status HiSparseService::Extend(grpc::ServerContext* context, const v1::ExtendRequest* req,
                                     v1::ExtendResponse* resp) {
  return ServeOwner(context, Metrics::kExtend, *req, [&] { return Fill(sessions_->Extend(*req), resp); });
}

grpc::Status HiSparseService::Release(grpc::ServerContext* context, const v1::ReleaseRequest* req,
                                      v1::ReleaseResponse*) {
  return ServeOwner(context, Metrics::kRelease, *req, [&] { return sessions_->Release(*req); });
}

grpc::Status HiSparseService::Park(grpc::ServerContext* context, const v1::ParkRequest* req, v1::ParkResponse* resp) {
  return ServeOwner(context, Metrics::kPark, *req, [&] { return Fill(sessions_->Park(*req), resp); });
}

grpc::Status HiSparseService::Resume(grpc::ServerContext* context, const v1::ResumeRequest* req,
                                     v1::ResumeResponse* resp) {
  return ServeOwner(context, Metrics::kResume, *req, [&] { return Fill(sessions_->Resume(*req), resp); });
}

grpc::Status HiSparseService::Stats(grpc::ServerContext* context, const v1::StatsRequest*, v1::StatsResponse* resp) {
  return Serve(context, Metrics::kStats, [&](const Caller& caller) {
    *resp = sessions_->Stats(caller.scope());
    if (hooks_.reload) *resp->mutable_reload() = hooks_.reload();
    return absl::OkStatus();
  });
}

grpc::Status HiSparseService::ListRequests(grpc::ServerContext* context, const v1::ListRequestsRequest* req,
                                           v1::ListRequestsResponse* resp) {
  return Serve(context, Metrics::kListRequests,
               [&](const Caller& caller) { return Fill(sessions_->ListRequests(*req, caller.scope()), resp); });
}

grpc::Status HiSparseService::Evict(grpc::ServerContext* context, const v1::EvictRequest* req,
                                    v1::EvictResponse* resp) {
  return Serve(context, Metrics::kEvict,
               [&](const Caller& caller) { return Fill(sessions_->Evict(*req, caller.scope()), resp); });
}

grpc::Status HiSparseService::Drain(grpc::ServerContext* context, const v1::DrainRequest* req,
                                    v1::DrainResponse* resp) {
  return Serve(context, Metrics::kDrain, [&](const Caller& caller) {
    if (!caller.admin) {
      return absl::PermissionDeniedError(absl::StrCat("draining the node needs the admin role (uid ", caller.peer.uid,
                                                      " is not root, the daemon's uid, or in access.admin_uids / "
                                                      "admin_gids)"));
    }
    const v1::StatsResponse before = sessions_->Stats();
    resp->set_sessions(before.sessions());
    resp->set_was_draining(before.draining());
    if (req->cancel()) {
      if (!hooks_.cancel_drain) return absl::UnavailableError("the daemon is still starting");
      return hooks_.cancel_drain();
    }
    if (!hooks_.drain || !hooks_.drain(req->exit_when_idle())) {
      return absl::UnavailableError("the daemon is still starting; retry the drain");
    }
    return absl::OkStatus();
  });
}

grpc::Status HiSparseService::GetConfig(grpc::ServerContext* context, const v1::GetConfigRequest*,
                                        v1::GetConfigResponse* resp) {
  return Serve(context, Metrics::kGetConfig, [&](const Caller&) {
    if (hooks_.config_yaml) resp->set_yaml(hooks_.config_yaml());
    if (hooks_.reload) *resp->mutable_reload() = hooks_.reload();
    return absl::OkStatus();
  });
}

// Batched admission: the same owner check as Admit and Release, then one SessionManager call.
grpc::Status HiSparseService::AdmitBatch(grpc::ServerContext* context, const v1::AdmitBatchRequest* req,
                                         v1::AdmitBatchResponse* resp) {
  return ServeOwner(context, Metrics::kAdmitBatch, *req, [&] { return Fill(sessions_->AdmitBatch(*req), resp); });
}

grpc::Status HiSparseService::ReleaseBatch(grpc::ServerContext* context, const v1::ReleaseBatchRequest* req,
                                           v1::ReleaseBatchResponse* resp) {
  return ServeOwner(context, Metrics::kReleaseBatch, *req, [&] { return Fill(sessions_->ReleaseBatch(*req), resp); });
}

grpc::Status HiSparseService::ParkBatch(grpc::ServerContext* context, const v1::ParkBatchRequest* req,
                                        v1::ParkBatchResponse* resp) {
  return ServeOwner(context, Metrics::kParkBatch, *req, [&] { return Fill(sessions_->ParkBatch(*req), resp); });
}

grpc::Status HiSparseService::ResumeBatch(grpc::ServerContext* context, const v1::ResumeBatchRequest* req,
                                          v1::ResumeBatchResponse* resp) {
  return ServeOwner(context, Metrics::kResumeBatch, *req, [&] { return Fill(sessions_->ResumeBatch(*req), resp); });
}

// The transfer agent's calls: the grant is the capability, the caller's uid must be its tenant's.
grpc::Status HiSparseService::CommitImport(grpc::ServerContext* context, const v1::CommitImportRequest* req,
                                           v1::CommitImportResponse*) {
  return Serve(context, Metrics::kCommitImport,
               [&](const Caller& caller) { return sessions_->CommitImport(*req, caller.peer.uid); });
}

grpc::Status HiSparseService::AbortImport(grpc::ServerContext* context, const v1::AbortImportRequest* req,
                                          v1::AbortImportResponse*) {
  return Serve(context, Metrics::kAbortImport,
               [&](const Caller& caller) { return sessions_->AbortImport(*req, caller.peer.uid); });
}

// Durable requests: the session's own tenant calls them, as Park (CheckOwner binds the token to the uid).
grpc::Status HiSparseService::SetLease(grpc::ServerContext* context, const v1::SetLeaseRequest* req,
                                       v1::SetLeaseResponse* resp) {
  return ServeOwner(context, Metrics::kSetLease, *req, [&] { return Fill(sessions_->SetLease(*req), resp); });
}

grpc::Status HiSparseService::ListAdoptable(grpc::ServerContext* context, const v1::ListAdoptableRequest* req,
                                            v1::ListAdoptableResponse* resp) {
  return ServeOwner(context, Metrics::kListAdoptable, *req, [&] { return Fill(sessions_->ListAdoptable(*req), resp); });
}

grpc::Status HiSparseService::Adopt(grpc::ServerContext* context, const v1::AdoptRequest* req,
                                    v1::AdoptResponse* resp) {
  return ServeOwner(context, Metrics::kAdopt, *req, [&] { return Fill(sessions_->Adopt(*req), resp); });
}

}  // namespace hisparse
