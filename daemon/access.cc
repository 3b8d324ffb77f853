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
#include <climits>
#include <cstring>
#include <system_error>

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

absl::Status PeerRegistry::Record(int fd, const PeerCredentials& peer) {
  struct stat st;
  if (::fstat(fd, &st) != 0)
    return absl::InternalError(absl::StrCat("fstat of connection ", fd, ": ", std::strerror(errno)));
  absl::MutexLock lock(&mu_);
  entries_[fd] = Entry{st.st_dev, st.st_ino, peer};
  return absl::OkStatus();
}

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

absl::StatusOr<std::unique_ptr<PeerAcceptor>> PeerAcceptor::Start(UniqueFd listener, AccessPolicy policy, Adopt adopt,
                                                                  std::function<void(bool serving)> on_serving_change) {
  std::unique_ptr<PeerAcceptor> a(new PeerAcceptor());
  if (::fcntl(listener.get(), F_SETFL, ::fcntl(listener.get(), F_GETFL) | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("control socket: O_NONBLOCK: ", std::strerror(errno)));
  }
  a->listener_ = std::move(listener);
  a->policy_ = std::move(policy);
  a->adopt_ = std::move(adopt);
  a->wake_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!a->wake_.valid()) return absl::InternalError(absl::StrCat("control socket: eventfd: ", std::strerror(errno)));
  auto guard = AcceptGuard::Create(a->listener_.get(), {"control socket", std::move(on_serving_change), {}});
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
  while (!stopping_.load()) {
    guard_->Probe();
    pollfd fds[2] = {{wake_.get(), POLLIN, 0}, {listener_.get(), POLLIN, 0}};
    const nfds_t count = guard_->listener_paused() ? 1 : 2;  // paused: wait on the clock alone
    const int n = ::poll(fds, count, guard_->WaitMs());
    if (n < 0 && errno != EINTR) {
      LOG(ERROR) << "control socket: poll failed: " << std::strerror(errno);
      return;
    }
    if (n > 0 && count == 2 && fds[1].revents != 0) AcceptAll();
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
  LOG(DEBUG) << "control connection from pid " << peer->pid << " uid " << peer->uid << " gid " << peer->gid;
  adopt_(conn.Release(), *peer);
}

}  // namespace hisparse
