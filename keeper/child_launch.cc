#include "child_launch.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <climits>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

extern char** environ;

namespace hisparse {
namespace {

constexpr int kFirstFd = 3;  // SD_LISTEN_FDS_START

void WriteAll(absl::string_view s) {
  while (!s.empty()) {
    const ssize_t n = ::write(STDERR_FILENO, s.data(), s.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    s.remove_prefix(static_cast<size_t>(n));
  }
}

// In the child: says what failed, with errno's text, on stderr.
void Report(const char* what, const char* subject) {
  const char* error = std::strerror(errno);
  WriteAll("hisparse-keeper: child: ");
  WriteAll(what);
  WriteAll(" ");
  WriteAll(subject);
  WriteAll(": ");
  WriteAll(error);
  WriteAll("\n");
}

// Reports and exits 127, as a shell does for a program it cannot run.
[[noreturn]] void Fail(const char* what, const char* program) {
  Report(what, program);
  ::_exit(127);
}

// The decimal digits of `value` (> 0) at `out`, NUL-terminated, without allocating; their count.
size_t FormatPid(pid_t value, char* out) {
  char digits[16];
  size_t len = 0;
  for (; value > 0; value /= 10) digits[len++] = static_cast<char>('0' + value % 10);
  for (size_t i = 0; i < len; ++i) out[i] = digits[len - 1 - i];
  out[len] = '\0';
  return len;
}

bool IsOurs(const char* entry) {
  for (const char* key : {"NOTIFY_SOCKET=", "LISTEN_PID=", "LISTEN_FDS=", "LISTEN_FDNAMES="}) {
    if (absl::StartsWith(entry, key)) return true;
  }
  return false;
}

}  // namespace

ChildLaunch::ChildLaunch(const std::vector<std::string>& argv, const std::string& notify_socket,
                         const std::vector<std::string>& names, std::vector<int> fds, const sigset_t& child_mask,
                         const std::string& pid_file)
    : fds_(std::move(fds)),
      moved_(fds_.size(), -1),
      pid_file_(pid_file),
      pid_file_tmp_(pid_file.empty() ? "" : pid_file + ".tmp"),
      mask_(child_mask) {
  strings_ = argv;
  const size_t argc = strings_.size();
  for (char** e = environ; *e != nullptr; ++e) {
    if (!IsOurs(*e)) strings_.emplace_back(*e);
  }
  strings_.push_back(absl::StrCat("NOTIFY_SOCKET=", notify_socket));
  if (!fds_.empty()) {
    strings_.push_back(absl::StrCat("LISTEN_FDS=", fds_.size()));
    strings_.push_back(absl::StrCat("LISTEN_FDNAMES=", absl::StrJoin(names, ":")));
    pass_listen_pid_ = true;
  }
  // strings_ no longer grows: pointers into it stay valid.
  for (size_t i = 0; i < strings_.size(); ++i) (i < argc ? argv_ : envp_).push_back(strings_[i].data());
  if (pass_listen_pid_) envp_.push_back(listen_pid_);
  argv_.push_back(nullptr);
  envp_.push_back(nullptr);
}

pid_t ChildLaunch::Fork() {
  const pid_t keeper = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) InChild(keeper);
  return pid;
}

void ChildLaunch::InChild(pid_t keeper) {
  const char* program = argv_[0];
  if (::sigprocmask(SIG_SETMASK, &mask_, nullptr) != 0) Fail("sigprocmask for", program);
  // Without its keeper the child has lost its store; it stops, as under systemd, which stops a
  // unit's every process when its main process dies. The check closes the race with an early death.
  if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) Fail("prctl(PR_SET_PDEATHSIG) for", program);
  if (::getppid() != keeper) ::_exit(127);
  if (!pid_file_.empty()) {
    char text[24];
    const size_t len = FormatPid(::getpid(), text);
    text[len] = '\n';
    const int fd = ::open(pid_file_tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const bool written = fd >= 0 && ::write(fd, text, len + 1) == static_cast<ssize_t>(len + 1);
    if (fd >= 0) ::close(fd);
    if (!written || ::rename(pid_file_tmp_.c_str(), pid_file_.c_str()) != 0) {
      Report("cannot write the pid file", pid_file_.c_str());  // the program runs all the same
    }
  }
  // A stored descriptor may sit anywhere, 3..3+n-1 included: first a copy of each above that
  // range, then each copy onto its place (dup2 clears close-on-exec on the new descriptor), then
  // every descriptor above the range closes, the copies with them.
  const int n = static_cast<int>(fds_.size());
  for (int i = 0; i < n; ++i) {
    moved_[i] = ::fcntl(fds_[i], F_DUPFD_CLOEXEC, kFirstFd + n);
    if (moved_[i] < 0) Fail("cannot move the stored descriptors for", program);
  }
  for (int i = 0; i < n; ++i) {
    if (::dup2(moved_[i], kFirstFd + i) < 0) Fail("cannot move the stored descriptors for", program);
  }
  if (::close_range(static_cast<unsigned>(kFirstFd + n), UINT_MAX, 0) != 0) {
    rlimit limit{};  // kernels before 5.9: one by one
    const long top = ::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
                         ? static_cast<long>(limit.rlim_cur)
                         : 1L << 20;
    for (long fd = kFirstFd + n; fd < top; ++fd) ::close(static_cast<int>(fd));
  }
  if (pass_listen_pid_) FormatPid(::getpid(), listen_pid_ + std::strlen("LISTEN_PID="));
  ::execve(program, argv_.data(), envp_.data());
  Fail("cannot exec", program);
}

}  // namespace hisparse
