// hisparse-keeper: keeps the descriptors a service hands it (sd_notify FDSTORE=1) across the
// service's restarts, where there is no systemd to keep them. main() only parses the command line
// into KeeperOptions; everything else is in the hisparse_keeper library (keeper.h).
#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "hisparse/common/version.h"
#include "hisparse/keeper/keeper.h"

namespace {

constexpr int kExitUsage = 64;  // EX_USAGE: a bad command line

constexpr char kFooter[] = R"(
Usage: hisparse-keeper [OPTIONS] -- PROGRAM [ARGS...]

Runs PROGRAM and keeps the file descriptors it stores with the sd_notify protocol (FDSTORE=1,
FDSTOREREMOVE=1, BARRIER=1 on $NOTIFY_SOCKET), as systemd's file-descriptor store does, and passes
them to PROGRAM's next start with the sd_listen_fds protocol (LISTEN_FDS, LISTEN_FDNAMES,
LISTEN_PID; descriptors 3..). Only messages from PROGRAM's own pid count.

PROGRAM is exec'ed by the path given (no $PATH search): a binary replaced there runs next start.
  PROGRAM exits 0               the keeper exits 0; the store is dropped
  PROGRAM exits non-0 or dies   restarted with the store after --restart-delay-ms, doubled for
                                each quick failure up to 30 s, reset once a start lived 60 s
  SIGTERM, SIGINT               SIGTERM to PROGRAM; the keeper exits 0 once it has exited
  SIGHUP                        forwarded to PROGRAM (a reload)
  SIGUSR2                       an upgrade: SIGTERM to PROGRAM, started again at once, store kept

Exit status: 0 stopped; 1 could not set up; 64 bad usage; 127 PROGRAM is not executable.
Example:
  hisparse-keeper --child-pid-file /run/hisparse/hisparsed.pid -- /usr/bin/hisparsed --config /etc/hisparse/hisparsed.yaml)";

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hisparse-keeper: a file-descriptor store for one service, for where there is no systemd"};
  app.set_version_flag("--version", "hisparse-keeper " HISPARSE_VERSION);
  app.footer(kFooter);
  hisparse::KeeperOptions options;
  std::vector<std::string> command;
  app.add_option("--restart-delay-ms", options.restart_delay_ms, "wait before restarting a failed PROGRAM (ms)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-fds", options.max_fds, "the most descriptors kept; more are closed")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--child-pid-file", options.child_pid_file, "write PROGRAM's pid here at each start");
  app.add_flag("--verbose", options.verbose, "log every descriptor stored or removed");
  app.add_option("command", command, "PROGRAM [ARGS...], after --")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints the help, the version, or what was wrong
    return rc == 0 ? 0 : kExitUsage;
  }
  return hisparse::RunKeeper(options, std::move(command));
}
