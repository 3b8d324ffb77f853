// DaemonProcess: a hisparsed child process on a private temporary socket, for the demo and the
// integration tests. It finds the binary at $HISPARSE_DAEMON_BIN, else beside the running
// executable (never a path baked in at build time, so bundles run anywhere). The destructor stops
// the daemon (SIGTERM, then SIGKILL) and removes the temporary directory. Move-only, one owner.
#ifndef HISPARSE_COMMON_DAEMON_PROCESS_H_
#define HISPARSE_COMMON_DAEMON_PROCESS_H_

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
  ~DaemonProcess();

  const std::string& address() const { return address_; }  // "unix:/tmp/.../hisparsed.sock"
  const std::string& socket_path() const { return socket_path_; }
  pid_t pid() const { return pid_; }
  // Sends a signal; with SIGKILL/SIGTERM, waits for the process to end and returns its status.
  int Signal(int sig);

 private:
  DaemonProcess() = default;
  std::string dir_, socket_path_, address_;
  pid_t pid_ = -1;
};

// $HISPARSE_DAEMON_BIN, else "hisparsed" beside /proc/self/exe. NotFound with what was tried.
absl::StatusOr<std::string> FindDaemonBinary();

}  // namespace hisparse

#endif  // HISPARSE_COMMON_DAEMON_PROCESS_H_
