// hisparse-import-worker: started by hisparsed only (worker.h). main() confines the process and
// runs the channel; everything else is in the hisparse_import_worker library.
//
// Confinement, before UCX starts: the worker dies with the daemon (PR_SET_PDEATHSIG), gains no
// privileges (PR_SET_NO_NEW_PRIVS), cannot be ptraced or dumped by others of its uid
// (PR_SET_DUMPABLE 0: its mappings are granted pages), and keeps no descriptor but stdio and the
// channel (close_range).
#include <linux/close_range.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "CLI/CLI.hpp"
#include "hisparse/common/log.h"
#include "hisparse/common/version.h"
#include "import_worker/worker.h"

namespace {

// Every descriptor but 0, 1, 2 and `keep`.
void CloseAllBut(int keep) {
  if (keep > 3) ::syscall(SYS_close_range, 3u, static_cast<unsigned>(keep - 1), 0u);
  ::syscall(SYS_close_range, static_cast<unsigned>(keep + 1), ~0u, 0u);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hisparse-import-worker: the UCX side of hisparsed's imports; started by hisparsed, not by hand"};
  app.set_version_flag("--version", "hisparse-import-worker " HISPARSE_VERSION);
  hisparse::ImportWorkerOptions o;
  int parent = 0;
  bool quiet = false;
  app.add_option("--channel-fd", o.channel_fd, "the daemon's socket")->required();
  app.add_option("--parent", parent, "the daemon's pid: the worker exits when it is no longer its parent")->required();
  app.add_option("--ucx-tls", o.ucx_tls, "UCX_TLS");
  app.add_option("--ucx-net-devices", o.ucx_net_devices, "UCX_NET_DEVICES");
  app.add_option("--memory-limit-bytes", o.memory_limit_bytes, "RLIMIT_DATA in bytes (0: none)");
  app.add_flag("--quiet", quiet, "log warnings and errors only");
  hisparse::LogOptions log;
  bool json = false;
  app.add_flag("--log-json", json, "log lines as JSON objects (hisparsed's log_format: json)");
  app.add_flag("--log-priority-prefix", log.priority_prefix, "journald's <N> before each line");
  CLI11_PARSE(app, argc, argv);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) return 1;  // the daemon died before the line above
  ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  CloseAllBut(o.channel_fd);
  if (quiet) hisparse::SetLogThreshold(hisparse::LogSeverity::kWarning);
  log.format = json ? hisparse::LogFormat::kJson : hisparse::LogFormat::kText;
  if (const char* node = std::getenv("NODE_NAME"); node != nullptr) log.node = node;
  hisparse::SetLogOptions(log);
  const absl::Status served = hisparse::RunImportWorker(o);
  if (!served.ok()) {
    LOG(ERROR) << "import worker: " << served.message();
    return 1;
  }
  return 0;
}
