// hisparse-ctl: the admin CLI. main.cc holds the one command table (name, synopsis, help, options,
// handler) that also generates the shell completion and the man page; each command lives in its
// own file. Exit codes (every command; sysexits.h's where one fits): 0 ok, 1 the daemon said no,
// 2 cannot reach it, 64 (EX_USAGE) bad usage, 77 (EX_NOPERM) this user may not open the socket.
#ifndef HISPARSE_CLIENT_CTL_CTL_H_
#define HISPARSE_CLIENT_CTL_CTL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "hisparse/v1/hisparse.grpc.pb.h"

namespace hisparse::ctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitRefused = 1;
inline constexpr int kExitUnreachable = 2;
inline constexpr int kExitUsage = 64;         // EX_USAGE: bad flags, arguments or address
inline constexpr int kExitNoPermission = 77;  // EX_NOPERM: outside the socket's group

struct GlobalOptions {
  std::string daemon = "unix:/run/hisparse/hisparsed.sock";  // --daemon, or $HISPARSE_DAEMON
  bool json = false;                                         // --json
  int timeout_ms = 5000;
};

// Every command's own options, filled by the command table's option setup.
struct CommandOptions {
  uint64_t session = 0;        // requests, evict
  uint64_t request = 0;        // evict
  std::string reason;          // evict
  bool no_wait = false;        // drain
  bool cancel = false;         // drain --cancel
  int drain_timeout_s = 600;   // drain
  double interval_s = 2.0;     // watch
  int count = 0;               // watch: 0 = until interrupted
  std::string shell = "bash";  // completion
};

// A stub on the daemon's socket, or nullptr after printing why it cannot be reached.
std::unique_ptr<v1::HiSparse::Stub> Connect(const GlobalOptions& g);
std::shared_ptr<grpc::Channel> ConnectChannel(const GlobalOptions& g);
// A context with the global deadline.
std::unique_ptr<grpc::ClientContext> Context(const GlobalOptions& g);
// Maps a failed RPC to the exit code, printing the daemon's message.
int ReportRpcError(const grpc::Status& s, const char* what);

std::string JsonString(const std::string& s);
std::string Percent(double ratio);

int StatusCommand(const GlobalOptions& g, const CommandOptions& o);
int StatsCommand(const GlobalOptions& g, const CommandOptions& o);
int SessionsCommand(const GlobalOptions& g, const CommandOptions& o);
int RequestsCommand(const GlobalOptions& g, const CommandOptions& o);
int EvictCommand(const GlobalOptions& g, const CommandOptions& o);
int DrainCommand(const GlobalOptions& g, const CommandOptions& o);
int WatchCommand(const GlobalOptions& g, const CommandOptions& o);
int ConfigCommand(const GlobalOptions& g, const CommandOptions& o);
int GroupsCommand(const GlobalOptions& g, const CommandOptions& o);
// The last config reload and the keys pending a restart: as one JSON object, and as lines for
// people, the first starting with `first`, the others with `rest` (`status` puts them in its
// column, `config` makes them YAML comments).
std::string ReloadJson(const v1::ConfigReloadStatus& r);
std::string ReloadLines(const v1::ConfigReloadStatus& r, const std::string& first, const std::string& rest);
// Prints stats (table or JSON); shared by `stats` and `watch`.
void PrintStats(const v1::StatsResponse& s, bool json);

}  // namespace hisparse::ctl

#endif  // HISPARSE_CLIENT_CTL_CTL_H_
