// hisparse-keeper: a service manager's file-descriptor store for one child process, for where
// there is no systemd (a Kubernetes container, the tests). It keeps what the child hands it with
// the sd_notify protocol (FDSTORE=1, FDSTOREREMOVE=1, BARRIER=1; hisparse/common/fd_store.h is the
// child's side) while the child restarts, and passes it to the next start with the sd_listen_fds
// protocol, as systemd does for a unit with NotifyAccess=main and FileDescriptorStoreMax=.
//
// RunKeeper, the whole keeper but for the command line, in one process, one thread:
//  - Makes a private directory (mode 0700, under $RUNTIME_DIRECTORY, else $TMPDIR, else /tmp)
//    holding the datagram socket `notify`, and removes both (and the pid file) when it returns.
//  - Starts the program (execve of argv[0] as given, so a binary replaced there runs on the next
//    start) with NOTIFY_SOCKET=<that socket>, and the stored descriptors at 3..3+n-1 with
//    LISTEN_FDS=n, LISTEN_FDNAMES=<their names, ':'-joined> and LISTEN_PID=<the child's pid> (no
//    LISTEN_* when none is stored). The child gets stdin, stdout and stderr, those descriptors and
//    nothing else, the keeper's environment and signal mask, its RLIMIT_NOFILE (whose soft limit
//    the keeper raises to the hard one: it holds every stored descriptor), and SIGTERM should the
//    keeper die.
//  - Accepts messages from the child's pid only (SCM_CREDENTIALS); the descriptors of any other
//    message are closed.
//  - The child exits: every message still queued is processed first (a child that stored a
//    descriptor and then crashed keeps it). Status 0 is a stop: RunKeeper returns 0, and the store
//    is dropped. Any other end (an exit status, 75 "come back" included, or a signal) is restarted
//    with the store after restart_delay_ms, doubled for each consecutive failure that came sooner
//    than stable_after_ms after its start, up to max_restart_delay_ms.
//  - SIGTERM, SIGINT: SIGTERM to the child, then returns 0 once it has exited. SIGHUP: forwarded
//    (a reload). SIGUSR2: an upgrade: SIGTERM to the child, and a new start as soon as it has
//    exited, whatever its status, with the store.
//  - Logs one line per event on stderr, "hisparse-keeper: ...".
// Stored descriptors are not polled (systemd drops a stored descriptor that reports POLLHUP unless
// FDPOLL=0; hisparse stores memory and files, which never do).
#ifndef HISPARSE_KEEPER_KEEPER_H_
#define HISPARSE_KEEPER_KEEPER_H_

#include <cstddef>
#include <string>
#include <vector>

namespace hisparse {

struct KeeperOptions {
  int restart_delay_ms = 500;        // the wait before restarting a child that failed
  int max_restart_delay_ms = 30000;  // the doubling's ceiling
  int stable_after_ms = 60000;       // a child that lived this long resets the delay
  size_t max_fds = 65536;            // the store's size; descriptors beyond it are closed
  std::string child_pid_file;        // written (tmp + rename) at each start, before exec; empty: none
  bool verbose = false;              // a line per descriptor stored or removed (a daemon stores thousands)
};

// Exit statuses of RunKeeper besides 0 (a stop).
inline constexpr int kKeeperSetupFailed = 1;   // the directory, socket or signals could not be set up
inline constexpr int kKeeperCannotExec = 127;  // argv[0] is not an executable file (at the first start)

// Runs `argv` (argv[0] the program's path) under the keeper until it stops; the keeper's exit
// status. Blocks SIGCHLD, SIGTERM, SIGINT, SIGHUP and SIGUSR2 in the calling thread for its own
// use (the child starts with the mask as it was) and reaps every child of the process, so it wants
// the process to itself: call it from main.
int RunKeeper(const KeeperOptions& options, std::vector<std::string> argv);

}  // namespace hisparse

#endif  // HISPARSE_KEEPER_KEEPER_H_
