// Daemon: one running hisparsed — the host pool, the session manager, the gRPC control plane
// (hisparse.v1 + grpc.health.v1 + reflection) on a unix socket, and the fd channel beside it.
//
// hisparsed's main() only parses flags into a DaemonConfig and calls Daemon::Start; tests start
// the real binary, and in-process tests may start a Daemon directly. Move-only handle semantics:
// the unique_ptr owns everything; destruction shuts down. Thread-safe.
#ifndef HISPARSE_DAEMON_DAEMON_H_
#define HISPARSE_DAEMON_DAEMON_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "hisparse/daemon/config.h"

namespace hisparse {

class SessionManager;

class Daemon {
 public:
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonConfig& config);
  ~Daemon();

  // Blocks until Shutdown() is called from another thread.
  void Wait();
  // Stops serving: health goes NOT_SERVING, streams end, sessions are released.
  void Shutdown();

  const std::string& grpc_address() const;
  const std::string& fd_socket_path() const;
  SessionManager* sessions();

 private:
  struct Impl;
  explicit Daemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_DAEMON_H_
