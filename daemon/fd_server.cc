#include "hisparse/daemon/fd_server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <errno.h>

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "hisparse/common/log.h"
#include "hisparse/common/unix_socket.h"

namespace hisparse {

absl::StatusOr<std::unique_ptr<FdServer>> FdServer::Start(const std::string& path, mode_t mode, gid_t gid,
                                                          AccessPolicy policy, SessionManager* sessions) {
  auto listener = ListenUnixSeqpacket(path, mode, gid);
  if (!listener.ok()) return listener.status();
  std::unique_ptr<FdServer> server(new FdServer(std::move(*listener), std::move(policy), sessions));
  server->acceptor_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

FdServer::~FdServer() { Stop(); }

void FdServer::Stop() {
  if (stopping_.exchange(true)) return;
  ::shutdown(listener_.get(), SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::thread> workers;
  {
    absl::MutexLock lock(&mu_);
    for (int c : conns_) ::shutdown(c, SHUT_RDWR);
    workers.swap(workers_);
  }
  for (auto& w : workers) w.join();
}

void FdServer::AcceptLoop() {
  while (!stopping_.load()) {
    const int conn = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) {
      if (stopping_.load()) break;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      LOG(ERROR) << "fd channel accept failed: " << std::strerror(errno);
      break;
    }
    absl::MutexLock lock(&mu_);
    conns_.push_back(conn);
    workers_.emplace_back([this, conn] { Serve(conn); });
  }
}

void FdServer::Serve(int conn) {
  UniqueFd owned(conn);
  // The kernel vouches for the peer: its uid becomes the session's tenant (quotas), its pid is
  // what stats show.
  auto peer = GetPeerCredentials(conn);
  if (!peer.ok() || !policy_.Allows(*peer)) {
    LOG(WARNING) << "refused an fd-channel connection"
                 << (peer.ok() ? absl::StrCat(" from pid ", peer->pid, " uid ", peer->uid) : std::string());
  } else {
    while (!stopping_.load()) {
      auto packet = RecvPacket(conn, 512);
      if (!packet.ok()) break;  // peer gone or garbage: drop the connection
      UniqueFd fd;
      const std::string reply = Handle(packet->payload, *peer, &fd);
      if (!SendPacket(conn, reply, fd.get()).ok()) break;
    }
  }
  absl::MutexLock lock(&mu_);
  conns_.erase(std::remove(conns_.begin(), conns_.end(), conn), conns_.end());
}

std::string FdServer::Handle(const std::string& request, const PeerCredentials& peer, UniqueFd* out_fd) {
  std::vector<std::string> parts = absl::StrSplit(request, absl::MaxSplits(' ', 3));
  uint64_t session_id = 0;
  const bool v2 = !parts.empty() && parts[0] == "HSFD2";
  if (parts.size() != 4 || (parts[0] != "HSFD1" && !v2) || !absl::SimpleAtoi(parts[1], &session_id)) {
    return "ERR INVALID_ARGUMENT malformed request: want \"HSFD2 <session_id> <token> <object>\"";
  }
  uint64_t known_bytes = 0;
  std::string ipc_handle;
  auto fd = sessions_->DupFdFor(session_id, parts[2], parts[3], peer, &known_bytes, v2 ? &ipc_handle : nullptr);
  if (!fd.ok()) {
    return absl::StrCat("ERR ", absl::StatusCodeToString(fd.status().code()), " ", fd.status().message());
  }
  if (!ipc_handle.empty()) return absl::StrCat("OK cuda-ipc ", known_bytes, " ", absl::BytesToHexString(ipc_handle));
  // A GPU arena's fd has no size to fstat; the session manager knows the allocation's.
  absl::StatusOr<size_t> size = known_bytes != 0 ? absl::StatusOr<size_t>(known_bytes) : FileSize(fd->get());
  if (!size.ok()) return absl::StrCat("ERR INTERNAL ", size.status().message());
  *out_fd = std::move(*fd);
  return absl::StrCat(v2 ? "OK fd " : "OK ", *size);
}

}  // namespace hisparse
