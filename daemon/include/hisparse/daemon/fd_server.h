// FdServer: the fd channel. gRPC cannot carry file descriptors, so the memory a session owns (its
// host-pool slabs and its slot arena) reaches the engine over this SOCK_SEQPACKET unix socket
// beside the gRPC one, with SCM_RIGHTS.
//
// Protocol, one request and one reply per packet. Version 2 (typed replies):
//   request  "HSFD2 <session_id> <token> arena"  |  "HSFD2 <session_id> <token> slab <N>"
//   reply    "OK fd <bytes>" with the descriptor attached
//          | "OK cuda-ipc <bytes> <handle>": no descriptor; <handle> is the arena's 64-byte cudaIpc
//            handle in lower-case hex (128 characters); only a "cuda-ipc" arena answers so
//          | "ERR <CODE> <message>" (no descriptor)
// Version 1 ("HSFD1 ...", reply "OK <bytes>" + descriptor) is still served; it cannot carry a
// cudaIpc handle, so a "cuda-ipc" arena answers it with ERR FAILED_PRECONDITION.
// The bytes are made and read by one codec, hisparse/common/fd_channel_codec.h, on both sides.
// The token from SessionOpened is the capability: only the session that owns an object gets it.
// A client reads each reply before it sends the next request: a connection whose replies cannot
// be sent at once (its receive queue is full) is dropped, so no reply is ever queued here.
//
// Connections are capped per peer uid (max_connections_per_peer; the uid is the tenant, and a
// per-pid cap would fall to a fork): one over the cap is answered "ERR RESOURCE_EXHAUSTED ..." at
// once and closed after its first request is read (closing a unix socket with a request unread
// would reset it, and the client would see ECONNRESET instead of the answer); at most
// kMaxRefusing such connections wait, beyond that they are closed at once. Running out of descriptors is survived
// (AcceptGuard): the channel reports itself down through on_serving_change and serves again once descriptors are free.
//
// Thread-safe. One thread serves the listener and every connection from one epoll loop (requests
// are tiny and answered at once); the connection table is that thread's alone. Stop() ends it.
#ifndef HISPARSE_DAEMON_FD_SERVER_H_
#define HISPARSE_DAEMON_FD_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/common/unix_socket.h"
#include "hisparse/daemon/accept_guard.h"
#include "hisparse/daemon/access.h"
#include "hisparse/daemon/session_manager.h"

namespace hisparse {

class FdServer {
 public:
  struct Options {
    int max_connections_per_peer = 1024;                  // limits.max_fd_connections_per_peer
    std::function<void(bool serving)> on_serving_change;  // runs on the server's thread
  };
  // Listens on `path` with socket mode `mode` and group `gid` (-1: unchanged), admitting peers
  // by `policy`. `sessions` must outlive the server.
  static absl::StatusOr<std::unique_ptr<FdServer>> Start(const std::string& path, mode_t mode, gid_t gid,
                                                         AccessPolicy policy, SessionManager* sessions,
                                                         Options options);
  static absl::StatusOr<std::unique_ptr<FdServer>> Start(const std::string& path, mode_t mode, gid_t gid,
                                                         AccessPolicy policy, SessionManager* sessions);
  ~FdServer();
  void Stop();
  // Takes effect for the next connection; connections already open stay.
  void SetMaxConnectionsPerPeer(int n) { max_per_peer_.store(n); }

  // One request packet -> its reply text, and in *out_fd the descriptor to attach (if any). The
  // whole protocol but the socket: the fuzzer drives it directly.
  static std::string HandleRequest(SessionManager& sessions, absl::string_view request, const PeerCredentials& peer,
                                   UniqueFd* out_fd);

 private:
  struct Conn {
    UniqueFd fd;
    PeerCredentials peer;
    bool refused = false;  // answered ERR over the cap: dropped once its request is read
  };
  static constexpr int kMaxRefusing = 64;
  FdServer(UniqueFd listener, AccessPolicy policy, SessionManager* sessions, Options options)
      : listener_(std::move(listener)),
        policy_(std::move(policy)),
        sessions_(sessions),
        options_(std::move(options)),
        max_per_peer_(options_.max_connections_per_peer) {}
  void Loop();
  void WatchListener(bool want);
  void AcceptReady();
  void Admit(UniqueFd conn);
  bool Watch(UniqueFd conn, const PeerCredentials& peer, bool refused);
  void ServeOne(int fd);
  void Drop(int fd);
  void Refuse(const std::string& why);

  UniqueFd listener_, epoll_, wake_;
  const AccessPolicy policy_;
  SessionManager* const sessions_;
  const Options options_;
  std::atomic<int> max_per_peer_;
  std::unique_ptr<AcceptGuard> guard_;             // the loop's
  bool listener_watched_ = false;                  // the loop's: is the listener in the epoll set
  absl::flat_hash_map<int, Conn> conns_;           // the loop's: open connections by fd
  absl::flat_hash_map<uid_t, int> conns_per_uid_;  // the loop's; refused connections not counted
  int refusing_ = 0;                               // the loop's: refused connections still open
  RateLimitedLog refused_log_{absl::Seconds(1)};
  std::thread loop_;
  std::atomic<bool> stopping_{false};
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_FD_SERVER_H_
