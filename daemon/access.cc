#include "hisparse/daemon/access.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "hisparse/common/log.h"

namespace hisparse {

namespace {
bool Contains(const std::vector<uint32_t>& ids, uint32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}
}  // namespace

bool AccessPolicy::Allows(const PeerCredentials& peer) const {
  if (IsAdmin(peer)) return true;
  if (uids_.empty() && gids_.empty()) return true;
  return Contains(uids_, peer.uid) || Contains(gids_, peer.gid);
}

bool AccessPolicy::IsAdmin(const PeerCredentials& peer) const {
  return peer.uid == 0 || peer.uid == ::getuid() || Contains(admin_uids_, peer.uid) || Contains(admin_gids_, peer.gid);
}

absl::Status PeerRegistry::Record(int fd, const PeerCredentials& peer, int max_per_uid) {
  struct stat st;
  if (::fstat(fd, &st) != 0)
    return absl::InternalError(absl::StrCat("fstat of connection ", fd, ": ", std::strerror(errno)));
  if (max_per_uid > 0) {
    bool at_cap = false;
    {
      absl::MutexLock lock(&mu_);
      auto it = by_uid_.find(peer.uid);
      at_cap = it != by_uid_.end() && static_cast<int>(it->second.size()) >= max_per_uid;
    }
    // Counted connections gRPC has closed since are not held: look before refusing.
    if (const int held = at_cap ? Reap(peer.uid) : 0; held >= max_per_uid) {
      return absl::ResourceExhaustedError(absl::StrCat("uid ", peer.uid, " holds ", held,
                                                       " control connections, its limit "
                                                       "(limits.max_control_connections_per_peer)"));
    }
  }
  absl::MutexLock lock(&mu_);
  EraseLocked(fd);  // a connection closed since, whose number this one took
  entries_[fd] = Entry{st.st_dev, st.st_ino, peer};
  by_uid_[peer.uid].insert(fd);
  return absl::OkStatus();
}

void PeerRegistry::EraseLocked(int fd) {
  auto it = entries_.find(fd);
  if (it == entries_.end()) return;
  auto fds = by_uid_.find(it->second.peer.uid);
  if (fds != by_uid_.end()) {
    fds->second.erase(fd);
    if (fds->second.empty()) by_uid_.erase(fds);
  }
  entries_.erase(it);
}

int PeerRegistry::Reap(uint32_t uid) {
  struct Seen {
    int fd;
    dev_t dev;
    ino_t ino;
  };
  std::vector<Seen> seen;
  {
    absl::MutexLock lock(&mu_);
    auto fds = by_uid_.find(uid);
    if (fds == by_uid_.end()) return 0;
    for (int fd : fds->second) {
      const Entry& e = entries_.at(fd);
      seen.push_back({fd, e.dev, e.ino});
    }
  }
  // fstat outside the lock, as Lookup does.
  std::vector<Seen> dead;
  for (const Seen& s : seen) {
    struct stat st;
    if (::fstat(s.fd, &st) != 0 || st.st_dev != s.dev || st.st_ino != s.ino) dead.push_back(s);
  }
  absl::MutexLock lock(&mu_);
  for (const Seen& s : dead) {
    auto it = entries_.find(s.fd);
    if (it != entries_.end() && it->second.dev == s.dev && it->second.ino == s.ino) EraseLocked(s.fd);
  }
  auto fds = by_uid_.find(uid);
  return fds == by_uid_.end() ? 0 : static_cast<int>(fds->second.size());
}

int PeerRegistry::Connections(uint32_t uid) { return Reap(uid); }

absl::StatusOr<PeerCredentials> PeerRegistry::Lookup(absl::string_view grpc_peer) const {
  int fd = -1;
  if (!absl::ConsumePrefix(&grpc_peer, "fd:") || !absl::SimpleAtoi(grpc_peer, &fd) || fd < 0) {
    return absl::UnauthenticatedError(absl::StrCat("cannot tell who the caller is (peer \"", grpc_peer, "\")"));
  }
  Entry e;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(fd);
    if (it == entries_.end()) return absl::UnauthenticatedError("the caller's connection is unknown");
    e = it->second;
  }
  // fstat outside the lock; a connection at N recorded meanwhile has another inode and fails too.
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_dev != e.dev || st.st_ino != e.ino) {
    return absl::UnauthenticatedError("the caller's connection is gone");
  }
  return e.peer;
}

absl::StatusOr<gid_t> ResolveGroup(const std::string& group) {
  if (group.empty()) return static_cast<gid_t>(-1);
  uint32_t gid = 0;
  if (absl::SimpleAtoi(group, &gid)) return static_cast<gid_t>(gid);
  struct group g;
  struct group* found = nullptr;
  char buf[4096];
  if (::getgrnam_r(group.c_str(), &g, buf, sizeof(buf), &found) != 0 || found == nullptr) {
    return absl::NotFoundError(absl::StrCat("access.socket_group: no group named \"", group, "\""));
  }
  return found->gr_gid;
}

absl::StatusOr<std::unique_ptr<PeerAcceptor>> PeerAcceptor::Start(UniqueFd listener, AccessPolicy policy,
                                                                  PeerRegistry* peers, Adopt adopt, Options options) {
  std::unique_ptr<PeerAcceptor> a(new PeerAcceptor());
  if (::fcntl(listener.get(), F_SETFL, ::fcntl(listener.get(), F_GETFL) | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("control socket: O_NONBLOCK: ", std::strerror(errno)));
  }
  a->listener_ = std::move(listener);
  a->policy_ = std::move(policy);
  a->peers_ = peers;
  a->adopt_ = std::move(adopt);
  a->max_per_peer_.store(options.max_connections_per_peer);
  a->wake_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!a->wake_.valid()) return absl::InternalError(absl::StrCat("control socket: eventfd: ", std::strerror(errno)));
  auto guard = AcceptGuard::Create(a->listener_.get(), {"control socket", std::move(options.on_serving_change), {}});
  if (!guard.ok()) return guard.status();
  a->guard_ = std::move(*guard);
  try {
    a->thread_ = std::thread([p = a.get()] { p->Loop(); });
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(absl::StrCat("control socket: cannot start its accept thread: ", e.what()));
  }
  return a;
}

PeerAcceptor::~PeerAcceptor() { Stop(); }

void PeerAcceptor::Stop() {
  if (stopping_.exchange(true)) return;
  if (wake_.valid()) {
    const uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
}

void PeerAcceptor::Loop() {
  std::vector<pollfd> fds;
  while (!stopping_.load()) {
    guard_->Probe();
    const bool listening = !guard_->listener_paused();  // paused: wait on the clock alone
    fds.assign({{wake_.get(), POLLIN, 0}, {listening ? listener_.get() : -1, POLLIN, 0}});  // -1: not polled
    for (const Refused& r : refused_) fds.push_back({r.conn.get(), POLLIN | POLLRDHUP, 0});
    int wait_ms = guard_->WaitMs();
    if (!refused_.empty()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(refused_.front().until - Clock::now());
      const int until_first = static_cast<int>(std::max<int64_t>(0, left.count()));
      wait_ms = wait_ms < 0 ? until_first : std::min(wait_ms, until_first);
    }
    const int n = ::poll(fds.data(), fds.size(), wait_ms);
    if (n < 0 && errno != EINTR) {
      LOG(ERROR) << "control socket: poll failed: " << std::strerror(errno);
      return;
    }
    // Refused connections whose client has read its answer and closed, or has had its time.
    const auto now = Clock::now();
    size_t kept = 0;
    for (size_t i = 0; i < refused_.size(); ++i) {
      const short revents = n > 0 ? fds[2 + i].revents : 0;
      bool done = now >= refused_[i].until;
      if (revents != 0) {
        Refused& r = refused_[i];
        char chunk[4096];
        ssize_t got;
        while ((got = ::recv(r.conn.get(), chunk, sizeof(chunk), MSG_DONTWAIT)) > 0) {
          const bool was_answered = r.answer.answered();
          const std::string reply = r.answer.Feed(absl::string_view(chunk, static_cast<size_t>(got)));
          if (!reply.empty()) (void)!::send(r.conn.get(), reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
          if (r.answer.answered() && !was_answered) ::shutdown(r.conn.get(), SHUT_WR);
        }
        // Kept until the client closes: closing with its bytes unread would reset the connection,
        // and the client could see ECONNRESET before the answer.
        done = done || r.answer.failed() || got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR);
      }
      if (done) continue;
      if (kept != i) refused_[kept] = std::move(refused_[i]);
      ++kept;
    }
    refused_.erase(refused_.begin() + static_cast<std::ptrdiff_t>(kept), refused_.end());  // closes the rest
    if (n > 0 && listening && fds[1].revents != 0) AcceptAll();
  }
}

void PeerAcceptor::AcceptAll() {
  guard_->AcceptEach(
      INT_MAX, [this](UniqueFd conn) { Admit(std::move(conn)); }, [this] { return !stopping_.load(); });
}

void PeerAcceptor::Admit(UniqueFd conn) {
  auto peer = GetPeerCredentials(conn.get());
  if (!peer.ok() || !policy_.Allows(*peer)) {
    uint64_t suppressed = 0;
    if (refused_log_.ShouldLog(&suppressed)) {
      LOG(WARNING) << "refused a control connection from "
                   << (peer.ok() ? absl::StrCat("pid ", peer->pid, " uid ", peer->uid, " gid ", peer->gid)
                                 : std::string(peer.status().message()))
                   << ": not in access.allowed_uids / allowed_gids" << SuppressedNote(suppressed);
    }
    return;  // closing it is the answer
  }
  // Admins have no cap: the operator's tools and probes must reach a daemon that tenants crowd.
  const int cap = policy_.IsAdmin(*peer) ? 0 : max_per_peer_.load();
  if (absl::Status recorded = peers_->Record(conn.get(), *peer, cap); !recorded.ok()) {
    return Refuse(std::move(conn), *peer, recorded.message());
  }
  LOG(DEBUG) << "control connection from pid " << peer->pid << " uid " << peer->uid << " gid " << peer->gid;
  adopt_(conn.Release(), *peer);
}

void PeerAcceptor::Refuse(UniqueFd conn, const PeerCredentials& peer, absl::string_view why) {
  uint64_t suppressed = 0;
  if (refused_log_.ShouldLog(&suppressed)) {
    LOG(WARNING) << "refused a control connection from pid " << peer.pid << ": " << why << SuppressedNote(suppressed);
  }
  // The client is told why on its first call (http2_refusal.h): the connection is kept, kMaxRefused
  // at most and for kRefusedLinger at most, while the refusal reads the client's frames and
  // answers. Past those it is closed at once, and the client sees only the connection end.
  // Best effort: a fresh socket's send buffer takes these few bytes without blocking.
  const std::string preface = Http2Refusal::ServerPreface();
  (void)!::send(conn.get(), preface.data(), preface.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (refused_.size() < kMaxRefused) {
    refused_.push_back({std::move(conn), Clock::now() + kRefusedLinger, Http2Refusal(std::string(why))});
  }
}

}  // namespace hisparse
