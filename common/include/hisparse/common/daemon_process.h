// DaemonProcess: a hisparsed child process on a private temporary socket, for the demo and the
// integration tests. It finds the binary at $HISPARSE_DAEMON_BIN, else beside the running
// executable (never a path baked in at build time, so bundles run anywhere). The destructor stops
// the daemon (SIGTERM, then SIGKILL) and removes the temporary directory. Move-only, one owner.
#ifndef HISPARSE_COMMON_DAEMON_PROCESS_H_
#define HISPARSE_COMMON_DAEMON_PROCESS_H_

#include <sys/resource.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace hisparse {

class DaemonProcess {
 public:
  // Starts hisparsed with `--listen unix:<tmp>/hisparsed.sock` plus `extra_args` (metrics off
  // unless they say `--metrics-listen`), and waits until it accepts connections (or fails with
  // the daemon's exit status).
  static absl::StatusOr<std::unique_ptr<DaemonProcess>> Start(const std::vector<std::string>& extra_args,
                                                              int timeout_ms = 20000);
  // How the process is started, beyond its arguments: the limits it runs under as deployed.
  struct Launch {
    // RLIMIT_NOFILE, soft and hard, set before exec; 0 keeps this process's.
    rlim_t max_open_files = 0;
    // Capabilities dropped from the bounding set before exec, so that a daemon started by root
    // runs without them (e.g. CAP_SYS_RESOURCE and CAP_SYS_ADMIN, which exempt a process from the
    // kernel's count of descriptors in flight, as the deployed daemon is not).
    std::vector<int> drop_capabilities;
  };
  static absl::StatusOr<std::unique_ptr<DaemonProcess>> Start(const std::vector<std::string>& extra_args,
                                                              int timeout_ms, const Launch& launch);
  ~DaemonProcess();

  const std::string& address() const { return address_; }  // "unix:/tmp/.../hisparsed.sock"
  const std::string& socket_path() const { return socket_path_; }
  pid_t pid() const { return pid_; }
  // The TCP port the daemon listens on (its metrics server, asked for as `--metrics-listen
  // 127.0.0.1:0`), read back from the kernel's socket tables (/proc/<pid>/net/tcp and tcp6: the
  // LISTEN sockets among the daemon's descriptors): the kernel picks a free port and no other
  // process can take it between a test's choice and the daemon's bind. Waits up to timeout_ms for
  // the socket to listen; NotFound when none does, FailedPrecondition when several do.
  absl::StatusOr<int> ListeningTcpPort(int timeout_ms = 20000) const;
  // Sends a signal; with SIGKILL/SIGTERM, waits for the process to end and returns its status.
  int Signal(int sig);
  // Waits up to timeout_ms for the daemon to exit by itself (a drain), and reaps it: its wait
  // status, or DeadlineExceeded while it still runs.
  absl::StatusOr<int> WaitExit(int timeout_ms);

 private:
  DaemonProcess() = default;
  std::string dir_, socket_path_, address_;
  pid_t pid_ = -1;
};

// Waits up to timeout_ms (0: only looks) for the child `pid` to exit, and reaps it: true with its
// wait status in *status (and its resource usage in *usage, when not null). Woken by the exit
// itself (a pidfd), not by polling, on kernels that have pidfd_open (5.3+).
bool WaitForChildExit(pid_t pid, int timeout_ms, int* status, struct rusage* usage = nullptr);

// $HISPARSE_DAEMON_BIN, else "hisparsed" beside /proc/self/exe. NotFound with what was tried.
absl::StatusOr<std::string> FindDaemonBinary();

// The directory of this process's executable (/proc/self/exe): where the build puts hisparsed,
// hisparse-keeper and the test programs beside each other. Empty when it cannot be read.
std::string ExecutableDir();

}  // namespace hisparse

#endif  // HISPARSE_COMMON_DAEMON_PROCESS_H_
