// hisparse-ctl: the admin CLI. One file per command; main.cc holds the command table.
// Exit codes (every command): 0 ok, 1 the daemon said no, 2 cannot reach it (or bad usage).
#ifndef HISPARSE_CLIENT_CTL_CTL_H_
#define HISPARSE_CLIENT_CTL_CTL_H_

#include <memory>
#include <string>

#include "hisparse/v1/hisparse.grpc.pb.h"

namespace hisparse::ctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitRefused = 1;
inline constexpr int kExitUnreachable = 2;

struct GlobalOptions {
  std::string daemon = "unix:/run/hisparse/hisparsed.sock";  // --daemon, or $HISPARSE_DAEMON
  bool json = false;                                       // --json
  int timeout_ms = 5000;
};

// A stub on the daemon's socket, or nullptr after printing why it cannot be reached.
std::unique_ptr<v1::HiSparse::Stub> Connect(const GlobalOptions& g);
// Maps a failed RPC to the exit code, printing the daemon's message.
int ReportRpcError(const grpc::Status& s, const char* what);

int StatsCommand(const GlobalOptions& g);

}  // namespace hisparse::ctl

#endif  // HISPARSE_CLIENT_CTL_CTL_H_
