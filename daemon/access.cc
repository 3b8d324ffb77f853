#include "hisparse/daemon/access.h"

#include <errno.h>
#include <grp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "hisparse/common/log.h"

namespace hisparse {

bool AccessPolicy::Allows(const PeerCredentials& peer) const {
  if (peer.uid == 0 || peer.uid == ::getuid()) return true;
  if (uids_.empty() && gids_.empty()) return true;
  return std::find(uids_.begin(), uids_.end(), peer.uid) != uids_.end() ||
         std::find(gids_.begin(), gids_.end(), peer.gid) != gids_.end();
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

std::unique_ptr<PeerAcceptor> PeerAcceptor::Start(UniqueFd listener, AccessPolicy policy,
                                                  std::function<void(int fd)> adopt) {
  std::unique_ptr<PeerAcceptor> a(new PeerAcceptor());
  a->listener_ = std::move(listener);
  a->policy_ = std::move(policy);
  a->adopt_ = std::move(adopt);
  a->thread_ = std::thread([p = a.get()] { p->Loop(); });
  return a;
}

PeerAcceptor::~PeerAcceptor() { Stop(); }

void PeerAcceptor::Stop() {
  if (stopping_.exchange(true)) return;
  ::shutdown(listener_.get(), SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
}

void PeerAcceptor::Loop() {
  while (!stopping_.load()) {
    UniqueFd conn(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid()) {
      if (stopping_.load()) break;
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) continue;
      LOG(ERROR) << "accept on the control socket failed: " << std::strerror(errno);
      break;
    }
    auto peer = GetPeerCredentials(conn.get());
    if (!peer.ok() || !policy_.Allows(*peer)) {
      LOG(WARNING) << "refused a control connection from "
                   << (peer.ok() ? absl::StrCat("pid ", peer->pid, " uid ", peer->uid, " gid ", peer->gid)
                                 : std::string(peer.status().message()))
                   << ": not in access.allowed_uids / allowed_gids";
      continue;  // closing it is the answer
    }
    LOG(DEBUG) << "control connection from pid " << peer->pid << " uid " << peer->uid << " gid " << peer->gid;
    adopt_(conn.Release());
  }
}

}  // namespace hisparse
