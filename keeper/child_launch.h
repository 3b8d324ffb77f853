// ChildLaunch: one start of the keeper's child, put together before fork() (every string, every
// vector) so that the forked child only makes system calls: it restores the signal mask, asks for
// SIGTERM should the keeper die, writes its pid to the pid file, moves the stored descriptors to
// 3..3+n-1, closes every other descriptor above 2, fills in LISTEN_PID with its own pid and execs.
// The pid file is written by the child so that it names the new pid before the program runs. Internal to
// hisparse_keeper. Not thread-safe (the keeper has one thread, which is also what makes fork() safe here).
#ifndef HISPARSE_KEEPER_CHILD_LAUNCH_H_
#define HISPARSE_KEEPER_CHILD_LAUNCH_H_

#include <signal.h>
#include <sys/types.h>

#include <string>
#include <vector>

namespace hisparse {

class ChildLaunch {
 public:
  // `fds` (descriptors the keeper keeps open, close-on-exec or not) are passed at 3.. in order,
  // named by `names`; `child_mask` is the signal mask the program starts with. The environment is
  // the keeper's, less any NOTIFY_SOCKET and LISTEN_*, plus NOTIFY_SOCKET=`notify_socket` and,
  // when fds is not empty, LISTEN_FDS, LISTEN_FDNAMES and LISTEN_PID. A non-empty `pid_file` is
  // replaced (`pid_file`.tmp, renamed) by one holding the child's pid.
  ChildLaunch(const std::vector<std::string>& argv, const std::string& notify_socket,
              const std::vector<std::string>& names, std::vector<int> fds, const sigset_t& child_mask,
              const std::string& pid_file);
  ChildLaunch(const ChildLaunch&) = delete;
  ChildLaunch& operator=(const ChildLaunch&) = delete;

  // Forks: the child's pid, or -1 with errno set. In the child it does not return: the program
  // runs, or the child reports why not on stderr and exits 127.
  pid_t Fork();

 private:
  [[noreturn]] void InChild(pid_t keeper);

  std::vector<std::string> strings_;  // what argv_ and envp_ point into
  std::vector<char*> argv_, envp_;
  std::vector<int> fds_, moved_;
  std::string pid_file_, pid_file_tmp_;
  char listen_pid_[32] = "LISTEN_PID=";  // the pid is written in by the child
  bool pass_listen_pid_ = false;
  sigset_t mask_;
};

}  // namespace hisparse

#endif  // HISPARSE_KEEPER_CHILD_LAUNCH_H_
