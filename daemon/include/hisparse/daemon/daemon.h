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
#include <vector>

#include "absl/status/statusor.h"
#include "hisparse/daemon/config.h"

namespace hisparse {

class SessionManager;

// hisparsed's exit status after a drain with exit_when_idle went idle (`hisparse-ctl drain`):
// EX_TEMPFAIL, "come back". The systemd unit restarts on it (RestartForceExitStatus=75), while a
// stop (SIGTERM, exit 0) stays stopped.
inline constexpr int kDrainedExitCode = 75;

class Daemon {
 public:
  // `node`: the node's name where known (Kubernetes' NODE_NAME), for the logs and the metrics'
  // hisparse_build_info{node}; empty leaves it out.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonConfig& config, const std::string& node = "");
  ~Daemon();

  // Blocks until Shutdown() is called from another thread.
  void Wait();
  // Stops serving: health goes NOT_SERVING, streams end, sessions are released.
  void Shutdown();
  // Stops admitting and turns health NOT_SERVING; with exit_when_idle, shuts down once the last
  // session has ended.
  void Drain(bool exit_when_idle);
  // Ends a drain: admits again, health SERVING, and a drain with exit_when_idle no longer exits.
  // FailedPrecondition once the daemon is stopping (that drain went idle already, or Shutdown ran).
  // Without a drain it changes nothing.
  absl::Status CancelDrain();
  // After Wait(): whether the daemon stopped because a drain with exit_when_idle went idle.
  bool drained() const;
  // Applies what can change live (log level, limits) from `next`; returns the keys that differ
  // but need a restart (they keep their old values).
  std::vector<std::string> Reload(const DaemonConfig& next);
  // A reload whose file did not load or validate: logs why and counts it (the config stays).
  void ReloadRefused(const absl::Status& why);
  DaemonConfig config() const;

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
