// FdServer: the fd channel. gRPC cannot carry file descriptors, so the memory a session owns (its
// host-pool segments and its slot arena) reaches the engine over this SOCK_SEQPACKET unix socket
// beside the gRPC one, with SCM_RIGHTS.
//
// Protocol, one request and one reply per packet. Version 2 (typed replies):
//   request  "HSFD2 <session_id> <token> arena"  |  "HSFD2 <session_id> <token> segment <N>"
//   reply    "OK fd <bytes>" with the descriptor attached
//          | "OK cuda-ipc <bytes> <handle>": no descriptor; <handle> is the arena's 64-byte cudaIpc
//            handle in lower-case hex (128 characters); only a "cuda-ipc" arena answers so
//          | "ERR <CODE> <message>" (no descriptor)
// Version 1 ("HSFD1 ...", reply "OK <bytes>" + descriptor) is still served; it cannot carry a
// cudaIpc handle, so a "cuda-ipc" arena answers it with ERR FAILED_PRECONDITION.
// The token from SessionOpened is the capability: only the session that owns an object gets it.
//
// Thread-safe. One thread accepts; one thread serves each connection. Stop() ends them all.
#ifndef HISPARSE_DAEMON_FD_SERVER_H_
#define HISPARSE_DAEMON_FD_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/common/unix_socket.h"
#include "hisparse/daemon/access.h"
#include "hisparse/daemon/session_manager.h"

namespace hisparse {

class FdServer {
 public:
  // Listens on `path` with socket mode `mode` and group `gid` (-1: unchanged), admitting peers
  // by `policy`. `sessions` must outlive the server.
  static absl::StatusOr<std::unique_ptr<FdServer>> Start(const std::string& path, mode_t mode, gid_t gid,
                                                         AccessPolicy policy, SessionManager* sessions);
  ~FdServer();
  void Stop();

 private:
  FdServer(UniqueFd listener, AccessPolicy policy, SessionManager* sessions)
      : listener_(std::move(listener)), policy_(std::move(policy)), sessions_(sessions) {}
  void AcceptLoop();
  void Serve(int conn);
  std::string Handle(const std::string& request, const PeerCredentials& peer, UniqueFd* out_fd);

  UniqueFd listener_;
  const AccessPolicy policy_;
  SessionManager* const sessions_;
  std::thread acceptor_;
  std::atomic<bool> stopping_{false};
  absl::Mutex mu_;
  std::vector<int> conns_ ABSL_GUARDED_BY(mu_);  // open connections, shut down on Stop
  std::vector<std::thread> workers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_FD_SERVER_H_
