#include "hisparse/daemon/fd_server.h"

#include <fcntl.h>
#include <linux/sockios.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <errno.h>

#include <chrono>
#include <cstring>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "hisparse/common/control_lane.h"
#include "hisparse/common/fd_channel_codec.h"
#include "hisparse/common/log.h"
#include "hisparse/common/unix_socket.h"

namespace hisparse {
namespace {

constexpr size_t kMaxRequestBytes = 512;
constexpr int kMaxEvents = 64;
constexpr int kMaxAcceptsPerWakeup = 64;  // then the open connections get their turn
constexpr int kLingerSweepMs = 1000;      // lingering connections are looked at this often

// The fd channel's own setup failures (errno read here), named apart from common's
// ErrnoStatus(error, what) so that a unity build sees both.
absl::Status FdChannelError(absl::string_view what) {
  return absl::InternalError(absl::StrCat("fd channel: ", what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<FdServer>> FdServer::Start(const std::string& path, mode_t mode, gid_t gid,
                                                          AccessPolicy policy, SessionManager* sessions,
                                                          Options options) {
  auto listener = ListenUnixSeqpacket(path, mode, gid);
  if (!listener.ok()) return listener.status();
  if (::fcntl(listener->get(), F_SETFL, ::fcntl(listener->get(), F_GETFL) | O_NONBLOCK) != 0) {
    return FdChannelError("O_NONBLOCK on the listener");
  }
  std::unique_ptr<FdServer> server(new FdServer(std::move(*listener), std::move(policy), sessions, std::move(options)));
  server->epoll_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!server->epoll_.valid()) return FdChannelError("epoll_create1");
  server->wake_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!server->wake_.valid()) return FdChannelError("eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = server->wake_.get();
  if (::epoll_ctl(server->epoll_.get(), EPOLL_CTL_ADD, server->wake_.get(), &ev) != 0) {
    return FdChannelError("epoll_ctl(ADD eventfd)");
  }
  auto guard = AcceptGuard::Create(server->listener_.get(), {"fd channel", server->options_.on_serving_change, {}});
  if (!guard.ok()) return guard.status();
  server->guard_ = std::move(*guard);
  try {
    server->loop_ = std::thread([s = server.get()] { s->Loop(); });
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(absl::StrCat("fd channel: cannot start its thread: ", e.what()));
  }
  return server;
}

absl::StatusOr<std::unique_ptr<FdServer>> FdServer::Start(const std::string& path, mode_t mode, gid_t gid,
                                                          AccessPolicy policy, SessionManager* sessions) {
  return Start(path, mode, gid, std::move(policy), sessions, Options());
}

FdServer::~FdServer() { Stop(); }

void FdServer::Stop() {
  if (stopping_.exchange(true)) return;
  if (wake_.valid()) {
    const uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof(one));
  }
  if (loop_.joinable()) loop_.join();
  conns_.clear();  // the loop has ended: its table is ours now
  conns_per_uid_.clear();
  in_flight_.clear();
  in_flight_total_ = 0;
  lingering_ = 0;
}

void FdServer::Loop() {
  epoll_event events[kMaxEvents];
  auto next_sweep = std::chrono::steady_clock::now();
  while (!stopping_.load()) {
    guard_->Probe();
    WatchListener(!guard_->listener_paused());
    int wait_ms = guard_->WaitMs();
    if (lingering_ > 0 && (wait_ms < 0 || wait_ms > kLingerSweepMs)) wait_ms = kLingerSweepMs;
    const int n = ::epoll_wait(epoll_.get(), events, kMaxEvents, wait_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      LOG(ERROR) << "fd channel: epoll_wait failed: " << std::strerror(errno) << "; the channel is down";
      if (options_.on_serving_change) options_.on_serving_change(false);
      return;
    }
    for (int i = 0; i < n && !stopping_.load(); ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_.get()) continue;  // Stop: the loop condition ends it
      if (fd == listener_.get()) {
        AcceptReady();
      } else if ((events[i].events & EPOLLIN) != 0) {
        ServeOne(fd);  // a hang-up with data still queued: serve it; the next read sees the end
      } else {
        Drop(fd);  // a hang-up; a lingering connection (watched for nothing else) may go with it
      }
    }
    // Lingering connections whose peer has read everything since, without closing.
    if (lingering_ > 0 && std::chrono::steady_clock::now() >= next_sweep) {
      SettleAll();
      next_sweep = std::chrono::steady_clock::now() + std::chrono::milliseconds(kLingerSweepMs);
    }
  }
}

void FdServer::WatchListener(bool want) {
  if (want == listener_watched_) return;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listener_.get();
  if (::epoll_ctl(epoll_.get(), want ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, listener_.get(), &ev) != 0) {
    LOG(ERROR) << "fd channel: epoll_ctl on the listener: " << std::strerror(errno);
    return;
  }
  listener_watched_ = want;
}

void FdServer::AcceptReady() {
  guard_->AcceptEach(
      kMaxAcceptsPerWakeup, [this](UniqueFd conn) { Admit(std::move(conn)); }, [] { return true; });
}

void FdServer::Admit(UniqueFd conn) {
  // The kernel vouches for the peer: only the uid that opened a session (its tenant) may fetch
  // its memory, and connections are counted per uid.
  auto peer = GetPeerCredentials(conn.get());
  if (!peer.ok()) return Refuse(absl::StrCat("(", peer.status().message(), ")"));
  if (!policy_.Allows(*peer)) return Refuse(absl::StrCat("from pid ", peer->pid, " uid ", peer->uid));
  const int limit = max_per_peer_.load();
  auto held = conns_per_uid_.find(peer->uid);
  if (held != conns_per_uid_.end() && held->second >= limit) {
    const std::string why = absl::StrCat("uid ", peer->uid, " holds ", held->second,
                                         " fd-channel connections, its limit (limits.max_fd_connections_per_peer)");
    (void)SendPacket(conn.get(), EncodeFdReply(FdErr{absl::StatusCode::kResourceExhausted, why}, FdVersion::kV2),
                     -1);  // best effort
    Refuse(absl::StrCat("from pid ", peer->pid, ": ", why));
    if (refusing_ < kMaxRefusing) Watch(std::move(conn), *peer, /*refused=*/true);
    return;
  }
  if (!Watch(std::move(conn), *peer, /*refused=*/false)) return;
  ++conns_per_uid_[peer->uid];
}

bool FdServer::Watch(UniqueFd conn, const PeerCredentials& peer, bool refused) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.fd = conn.get();
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, conn.get(), &ev) != 0) {
    Refuse(absl::StrCat("from pid ", peer.pid, " (epoll_ctl: ", std::strerror(errno), ")"));
    return false;
  }
  if (refused) ++refusing_;
  const int fd = conn.get();
  conns_.emplace(fd, Conn{std::move(conn), peer, refused});
  return true;
}

void FdServer::Refuse(const std::string& why) {
  uint64_t suppressed = 0;
  if (refused_log_.ShouldLog(&suppressed)) {
    LOG(WARNING) << "refused an fd-channel connection " << why << SuppressedNote(suppressed);
  }
}

void FdServer::ServeOne(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  auto packet = RecvPacket(fd, kMaxRequestBytes);
  if (it->second.refused) {
    if (!absl::IsDeadlineExceeded(packet.status())) Drop(fd);  // its request is read: close quietly
    return;
  }
  if (!packet.ok()) {
    if (!absl::IsDeadlineExceeded(packet.status())) Drop(fd);  // else a spurious wake-up
    return;                                                    // peer gone or garbage: drop the connection
  }
  if (IsLaneHello(packet->payload)) return OpenLane(fd, packet->payload);
  UniqueFd out;
  std::string reply = HandleRequest(*sessions_, packet->payload, it->second.peer, &out);
  if (out.valid()) {
    if (std::string why = InFlightRefusal(fd, it->second); !why.empty()) {
      out.Reset();
      absl::StatusOr<FdRequest> req = DecodeFdRequest(packet->payload);  // it decoded: a descriptor was granted
      reply = EncodeFdReply(FdErr{absl::StatusCode::kResourceExhausted, std::move(why)},
                            req.ok() ? req->version : FdVersion::kV2);
    }
  }
  if (!SendPacket(fd, reply, out.get()).ok()) return Drop(fd);  // gone, or not reading its replies
  if (out.valid()) CountSent(fd, it->second);
}

void FdServer::OpenLane(int fd, absl::string_view hello_packet) {
  auto it = conns_.find(fd);
  Conn& c = it->second;
  auto answer = [&](const absl::Status& why) {
    if (!SendPacket(fd, EncodeLaneHelloReply(why), -1).ok()) Drop(fd);
  };
  if (options_.lanes == nullptr) return answer(absl::FailedPreconditionError("this daemon serves no control lanes"));
  absl::StatusOr<LaneHello> hello = DecodeLaneHello(hello_packet);
  if (!hello.ok()) return answer(hello.status());
  Settle(fd, c);
  if (c.in_flight != 0) {
    return answer(absl::FailedPreconditionError(
        "descriptors sent on this connection are still unread: open a control lane on a connection of its own"));
  }
  // Handed over: out of this loop and its uid's count (lanes are bounded by sessions instead).
  UniqueFd conn = std::move(c.fd);
  const PeerCredentials peer = c.peer;
  Close(fd);                                                  // forgets the connection; `conn` keeps it open
  (void)options_.lanes->Open(std::move(conn), *hello, peer);  // answers the hello itself
}

void FdServer::Drop(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  Conn& c = it->second;
  Settle(fd, c);
  if (c.in_flight == 0) return Close(fd);
  if (c.lingering) return;
  // Its peer has not read every descriptor sent: they are in flight still, and stay counted, with
  // the connection, until the peer reads them or closes. Edge-triggered: a hang-up wakes the loop
  // once; the sweep and the bounds' checks look again.
  c.lingering = true;
  ++lingering_;
  epoll_event ev{};
  ev.events = EPOLLET;  // EPOLLHUP and EPOLLERR are always reported
  ev.data.fd = fd;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &ev);
}

void FdServer::Close(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  if (it->second.lingering) --lingering_;
  if (it->second.refused) {
    --refusing_;
  } else if (auto held = conns_per_uid_.find(it->second.peer.uid); held != conns_per_uid_.end()) {
    if (--held->second <= 0) conns_per_uid_.erase(held);
  }
  conns_.erase(it);  // closes the connection
}

void FdServer::Settle(int fd, Conn& c) {
  if (c.in_flight == 0) return;
  int queued = 0;
  if (::ioctl(fd, SIOCOUTQ, &queued) != 0 || queued > 0) return;  // unknown, or not all read yet
  auto peer = in_flight_.find(c.peer.uid);
  if (peer != in_flight_.end()) {
    peer->second.fds -= c.in_flight;
    peer->second.conns.erase(fd);
    if (peer->second.conns.empty()) in_flight_.erase(peer);
  }
  in_flight_total_ -= c.in_flight;
  c.in_flight = 0;
}

void FdServer::SettlePeer(uid_t uid) {
  auto peer = in_flight_.find(uid);
  if (peer == in_flight_.end()) return;
  const std::vector<int> fds(peer->second.conns.begin(), peer->second.conns.end());  // Settle edits the set
  for (int fd : fds) {
    auto it = conns_.find(fd);
    if (it == conns_.end()) continue;
    Settle(fd, it->second);
    if (it->second.lingering && it->second.in_flight == 0) Close(fd);
  }
}

void FdServer::SettleAll() {
  std::vector<uid_t> uids;
  uids.reserve(in_flight_.size());
  for (const auto& [uid, peer] : in_flight_) uids.push_back(uid);
  for (uid_t uid : uids) SettlePeer(uid);
}

std::string FdServer::InFlightRefusal(int fd, Conn& c) {
  Settle(fd, c);
  const int per_conn = max_in_flight_per_conn_.load();
  if (c.in_flight >= per_conn) {
    return absl::StrCat("this connection holds ", c.in_flight,
                        " descriptors its peer has not read, its limit (limits.max_fds_in_flight_per_connection): read "
                        "each reply before the next request");
  }
  const uid_t uid = c.peer.uid;
  const int per_peer = max_in_flight_per_peer_.load();
  auto held = [this, uid] {
    auto peer = in_flight_.find(uid);
    return peer == in_flight_.end() ? 0 : peer->second.fds;
  };
  if (held() >= per_peer) SettlePeer(uid);
  if (const int n = held(); n >= per_peer) {
    return absl::StrCat("uid ", uid, " holds ", n,
                        " descriptors sent over the fd channel and not yet read, its limit "
                        "(limits.max_fds_in_flight_per_peer)");
  }
  // The kernel's own bound, below which the daemon must stay for every tenant: the descriptors in
  // flight of all the daemon user's processes against RLIMIT_NOFILE (an eighth is left to others).
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY) {
    const int64_t ceiling = static_cast<int64_t>(nofile.rlim_cur - nofile.rlim_cur / 8);
    if (in_flight_total_ >= ceiling) SettleAll();
    if (in_flight_total_ >= ceiling) {
      return absl::StrCat("the daemon has ", in_flight_total_,
                          " descriptors in flight to peers that have not read them, ",
                          "its bound (seven eighths of its RLIMIT_NOFILE, ", nofile.rlim_cur, ")");
    }
  }
  return std::string();
}

void FdServer::CountSent(int fd, Conn& c) {
  ++c.in_flight;
  PeerInFlight& peer = in_flight_[c.peer.uid];
  ++peer.fds;
  peer.conns.insert(fd);
  ++in_flight_total_;
}

std::string FdServer::HandleRequest(SessionManager& sessions, absl::string_view request, const PeerCredentials& peer,
                                    UniqueFd* out_fd) {
  absl::StatusOr<FdRequest> req = DecodeFdRequest(request);
  if (!req.ok()) return EncodeFdReply(FdErr{req.status().code(), std::string(req.status().message())}, FdVersion::kV2);
  const FdVersion version = req->version;
  FdOk ok;
  const bool v2 = version == FdVersion::kV2;
  auto fd = sessions.DupFdFor(req->session_id, req->token, req->object, peer, &ok.bytes, v2 ? &ok.handle : nullptr);
  if (!fd.ok()) return EncodeFdReply(FdErr{fd.status().code(), std::string(fd.status().message())}, version);
  if (!ok.handle.empty()) {
    ok.form = FdForm::kCudaIpc;
    return EncodeFdReply(ok, version);
  }
  // A GPU arena's fd has no size to fstat; the session manager knows the allocation's.
  if (ok.bytes == 0) {
    absl::StatusOr<size_t> size = FileSize(fd->get());
    if (!size.ok())
      return EncodeFdReply(FdErr{absl::StatusCode::kInternal, std::string(size.status().message())}, version);
    ok.bytes = *size;
  }
  *out_fd = std::move(*fd);
  return EncodeFdReply(ok, version);
}

}  // namespace hisparse
