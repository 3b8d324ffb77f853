// The keeper's loop: one thread polls the notify socket and a signalfd; everything happens in
// the order the kernel reports it. Messages are processed in the order they were sent (a datagram
// socket keeps it), which is what makes BARRIER=1 mean "all before me is done".
#include "hisparse/keeper/keeper.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>  // sigabbrev_np
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "hisparse/common/fd_store.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/keeper/notify_protocol.h"

#include "child_launch.h"

namespace hisparse {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxMessageBytes = 4096;    // a notify message is a few short lines
constexpr size_t kMaxFdsPerMessage = 253;    // the kernel's SCM_MAX_FD
constexpr size_t kMaxEnvString = 32 * 4096;  // the kernel's MAX_ARG_STRLEN

// One line on stderr with one write(2), so that the child's lines never cut into it.
void Log(absl::string_view line) {
  const std::string s = absl::StrCat("hisparse-keeper: ", line, "\n");
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(STDERR_FILENO, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

std::string DescribeEnd(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* name = sigabbrev_np(WTERMSIG(status));
    return absl::StrCat("was killed by signal ", WTERMSIG(status),
                        name != nullptr ? absl::StrCat(" (SIG", name, ")") : "");
  }
  return absl::StrCat("ended with wait status ", status);
}

std::string RuntimeBase() {
  // $RUNTIME_DIRECTORY may list several directories, ':'-separated: the first one is ours.
  for (const char* var : {"RUNTIME_DIRECTORY", "TMPDIR"}) {
    const char* v = std::getenv(var);
    if (v == nullptr || v[0] == '\0') continue;
    const absl::string_view value(v);
    return std::string(value.substr(0, value.find(':')));
  }
  return "/tmp";
}

class Keeper {
 public:
  Keeper(const KeeperOptions& options, std::vector<std::string> argv)
      : options_(options), argv_(std::move(argv)), store_(options.max_fds), delay_ms_(options.restart_delay_ms) {}
  ~Keeper();
  int Run();

 private:
  absl::Status SetUp();
  void StartChild();
  void DrainMessages();
  bool ReceiveOne();  // false when nothing is queued
  void Process(absl::string_view payload, std::vector<UniqueFd> fds);
  std::optional<int> HandleSignals();  // the exit status when the keeper is done
  std::optional<int> ReapChildren();
  std::optional<int> OnChildExit(pid_t pid, int status);

  const KeeperOptions options_;
  const std::vector<std::string> argv_;
  std::string dir_, socket_path_;
  UniqueFd sock_, signals_;
  sigset_t old_mask_{};
  bool mask_changed_ = false;
  StoredFds store_;
  pid_t child_ = -1;
  Clock::time_point child_started_;
  bool stopping_ = false;   // SIGTERM/SIGINT: the child's end is the keeper's
  bool upgrading_ = false;  // SIGUSR2: the child's end is followed by a start at once
  std::optional<Clock::time_point> restart_at_;
  int64_t delay_ms_;
  std::set<pid_t> refused_pids_;  // senders already logged as refused
};

Keeper::~Keeper() {
  store_.Clear();
  signals_.Reset();
  sock_.Reset();
  if (!socket_path_.empty()) ::unlink(socket_path_.c_str());
  if (!dir_.empty()) ::rmdir(dir_.c_str());
  if (!options_.child_pid_file.empty()) ::unlink(options_.child_pid_file.c_str());
  if (mask_changed_) ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
}

absl::Status Keeper::SetUp() {
  // A keeper started with stdin, stdout or stderr closed would hand those numbers out to its own
  // descriptors; the child must find 0-2 as the keeper was given them, or /dev/null.
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0 && ::open("/dev/null", O_RDWR) < 0) return ErrnoStatus(errno, "open /dev/null");
  }
  // Every stored descriptor is open in the keeper: raise the soft limit to the hard one.
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &nofile);
  }
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGUSR2}) sigaddset(&mask, sig);
  if (::sigprocmask(SIG_BLOCK, &mask, &old_mask_) != 0) return ErrnoStatus(errno, "sigprocmask");
  mask_changed_ = true;
  signals_.Reset(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!signals_.valid()) return ErrnoStatus(errno, "signalfd");

  std::string tmpl = RuntimeBase() + "/hisparse-keeper.XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return ErrnoStatus(errno, absl::StrCat("mkdtemp ", tmpl));
  dir_ = tmpl;  // mode 0700
  const std::string path = dir_ + "/notify";
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("notify socket path longer than ", sizeof(addr.sun_path) - 1,
                                                   " bytes: ", path, " (set TMPDIR or RUNTIME_DIRECTORY shorter)"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  sock_.Reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!sock_.valid()) return ErrnoStatus(errno, "socket(AF_UNIX, SOCK_DGRAM)");
  if (::bind(sock_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoStatus(errno, absl::StrCat("bind ", path));
  }
  socket_path_ = path;
  const int on = 1;  // every message then carries its sender's credentials
  if (::setsockopt(sock_.get(), SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)) != 0) {
    return ErrnoStatus(errno, "setsockopt(SO_PASSCRED)");
  }
  return absl::OkStatus();
}

void Keeper::StartChild() {
  // One environment string may hold at most 32 pages (MAX_ARG_STRLEN): a longer LISTEN_FDNAMES
  // makes the exec fail (E2BIG), start after start.
  size_t names_bytes = 0;
  for (const std::string& name : store_.names()) names_bytes += name.size() + 1;
  if (names_bytes + sizeof("LISTEN_FDNAMES=") > kMaxEnvString) {
    Log(absl::StrCat("LISTEN_FDNAMES would be ", names_bytes, " bytes, more than one environment string may hold (",
                     kMaxEnvString, "): the exec will fail; the child must store fewer fds or shorter names"));
  }
  ChildLaunch launch(argv_, socket_path_, store_.names(), store_.fds(), old_mask_, options_.child_pid_file);
  const pid_t pid = launch.Fork();
  if (pid < 0) {
    Log(absl::StrCat("fork failed: ", std::strerror(errno), "; trying again in ", delay_ms_, " ms"));
    restart_at_ = Clock::now() + std::chrono::milliseconds(delay_ms_);
    return;
  }
  child_ = pid;
  child_started_ = Clock::now();
  Log(absl::StrCat("started pid ", pid, " (", argv_[0], ") with ", store_.count(), " fds"));
}

void Keeper::DrainMessages() {
  while (ReceiveOne()) {
  }
}

bool Keeper::ReceiveOne() {
  char buf[kMaxMessageBytes];
  iovec iov{buf, sizeof(buf)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred)) + CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(sock_.get(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK) Log(absl::StrCat("recvmsg: ", std::strerror(errno)));
    return false;
  }
  // Own every descriptor that arrived before judging the message, so that none leaks.
  std::vector<UniqueFd> fds;
  std::optional<ucred> sender;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET) continue;
    if (c->cmsg_type == SCM_RIGHTS) {
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds.emplace_back(fd);
      }
    } else if (c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len >= CMSG_LEN(sizeof(ucred))) {
      ucred cred;
      std::memcpy(&cred, CMSG_DATA(c), sizeof(cred));
      sender = cred;
    }
  }
  const pid_t pid = sender ? sender->pid : 0;
  if ((msg.msg_flags & MSG_CTRUNC) != 0) {
    Log(absl::StrCat("a message from pid ", pid, " lost descriptors in transit (MSG_CTRUNC: more than ",
                     kMaxFdsPerMessage, ", or the keeper is out of descriptors): dropped it, closing the ", fds.size(),
                     " that arrived"));
    return true;
  }
  if ((msg.msg_flags & MSG_TRUNC) != 0) {
    Log(absl::StrCat("a message from pid ", pid, " is longer than ", kMaxMessageBytes, " bytes: dropped it"));
    return true;
  }
  if (child_ <= 0 || pid != child_) {
    if (refused_pids_.insert(pid).second) {
      Log(absl::StrCat("ignoring messages from pid ", pid, ", which is not the child (",
                       child_ > 0 ? absl::StrCat("pid ", child_) : std::string("none running"), ")"));
    }
    return true;  // their descriptors close here
  }
  Process(absl::string_view(buf, static_cast<size_t>(n)), std::move(fds));
  return true;
}

void Keeper::Process(absl::string_view payload, std::vector<UniqueFd> fds) {
  const NotifyMessage m = ParseNotifyMessage(payload);
  if (m.fdstore_remove) {
    if (!IsValidFdName(m.fdname)) {
      Log(absl::StrCat("FDSTOREREMOVE=1 without a valid FDNAME (\"", absl::CEscape(m.fdname), "\"): ignored"));
    } else {
      const size_t removed = store_.Remove(m.fdname);
      if (options_.verbose)
        Log(absl::StrCat("removed ", m.fdname, " (", removed, " fds; ", store_.count(), " stored in all)"));
    }
  }
  if (m.barrier) {
    // Closing the barrier's descriptor (when `fds` goes) is the answer: every message sent
    // before it has been processed.
    if (m.fdstore) Log("a message with both BARRIER=1 and FDSTORE=1: its descriptors are not stored");
    return;
  }
  if (!m.fdstore) {
    if (!fds.empty()) Log(absl::StrCat("closed ", fds.size(), " fds passed without FDSTORE=1"));
    return;
  }
  const std::string name = m.fdname.empty() ? std::string(kDefaultFdName) : m.fdname;
  if (!IsValidFdName(name)) {
    Log(absl::StrCat("FDSTORE=1 with an invalid FDNAME (\"", absl::CEscape(name), "\"): closed its ", fds.size(),
                     " fds"));
    return;
  }
  if (fds.empty()) {
    Log(absl::StrCat("FDSTORE=1 for ", name, " without a descriptor: nothing stored"));
    return;
  }
  size_t refused = 0;
  for (UniqueFd& fd : fds) {
    if (!store_.Add(name, std::move(fd)).ok()) ++refused;
  }
  if (refused > 0) {
    Log(absl::StrCat("the store is full (--max-fds ", store_.max_fds(), "): closed ", refused, " fds of ", name));
  }
  if (refused < fds.size() && options_.verbose) {
    Log(absl::StrCat("stored ", name, " (", store_.count(name), " under that name; ", store_.count(),
                     " stored in all)"));
  }
}

std::optional<int> Keeper::HandleSignals() {
  signalfd_siginfo si;
  while (::read(signals_.get(), &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
    switch (si.ssi_signo) {
      case SIGCHLD:
        if (std::optional<int> done = ReapChildren()) return done;
        break;
      case SIGTERM:
      case SIGINT:
        if (child_ <= 0) {
          Log(absl::StrCat(si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT", ": stopping (no child running)"));
          return 0;
        }
        Log(absl::StrCat(si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT", ": stopping; SIGTERM to pid ", child_));
        stopping_ = true;
        ::kill(child_, SIGTERM);
        break;
      case SIGHUP:
        if (child_ > 0) {
          Log(absl::StrCat("SIGHUP: forwarded to pid ", child_, " (a reload)"));
          ::kill(child_, SIGHUP);
        } else {
          Log("SIGHUP: no child running to reload");
        }
        break;
      case SIGUSR2:
        if (stopping_) break;
        if (child_ > 0) {
          Log(absl::StrCat("SIGUSR2: restarting (an upgrade); SIGTERM to pid ", child_));
          upgrading_ = true;
          ::kill(child_, SIGTERM);
        } else if (restart_at_) {
          Log("SIGUSR2: starting now");
          restart_at_ = Clock::now();
        }
        break;
      default:
        break;
    }
  }
  return std::nullopt;
}

std::optional<int> Keeper::ReapChildren() {
  int status = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
    if (pid != child_) continue;  // an orphan the keeper inherited as a container's pid 1
    // What the child sent just before its end still counts: it is all queued by now, and is
    // accepted while child_ still names the sender.
    DrainMessages();
    child_ = -1;
    if (std::optional<int> done = OnChildExit(pid, status)) return done;
  }
  return std::nullopt;
}

std::optional<int> Keeper::OnChildExit(pid_t pid, int status) {
  const std::string end = absl::StrCat("pid ", pid, " ", DescribeEnd(status));
  const auto lived = Clock::now() - child_started_;
  if (stopping_) {
    Log(absl::StrCat("child ", end, ": stopped, dropping ", store_.count(), " stored fds"));
    return 0;
  }
  if (upgrading_) {
    upgrading_ = false;
    Log(absl::StrCat("child ", end, ": restarting now with ", store_.count(), " fds"));
    StartChild();
    return std::nullopt;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    Log(absl::StrCat("child ", end, ": stopping, dropping ", store_.count(), " stored fds"));
    return 0;
  }
  if (lived >= std::chrono::milliseconds(options_.stable_after_ms)) delay_ms_ = options_.restart_delay_ms;
  Log(absl::StrCat("child ", end, " after ", std::chrono::duration_cast<std::chrono::milliseconds>(lived).count(),
                   " ms: restarting in ", delay_ms_, " ms with ", store_.count(), " fds"));
  restart_at_ = Clock::now() + std::chrono::milliseconds(delay_ms_);
  const int64_t ceiling = std::max(options_.max_restart_delay_ms, options_.restart_delay_ms);
  delay_ms_ = std::min<int64_t>(delay_ms_ * 2, ceiling);
  return std::nullopt;
}

int Keeper::Run() {
  if (argv_.empty()) {
    Log("no program to run");
    return kKeeperCannotExec;
  }
  if (absl::Status st = SetUp(); !st.ok()) {
    Log(absl::StrCat("cannot set up: ", st.message()));
    return kKeeperSetupFailed;
  }
  if (::access(argv_[0].c_str(), X_OK) != 0) {
    Log(absl::StrCat("cannot run ", argv_[0], ": ", std::strerror(errno)));
    return kKeeperCannotExec;
  }
  Log(absl::StrCat("notify socket ", socket_path_));
  StartChild();
  while (true) {
    int timeout_ms = -1;
    if (restart_at_) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*restart_at_ - Clock::now()).count();
      timeout_ms = static_cast<int>(std::max<int64_t>(left, 0));
    }
    pollfd p[2] = {{sock_.get(), POLLIN, 0}, {signals_.get(), POLLIN, 0}};
    if (::poll(p, 2, timeout_ms) < 0 && errno != EINTR) {
      Log(absl::StrCat("poll: ", std::strerror(errno)));
      return kKeeperSetupFailed;
    }
    if ((p[0].revents & POLLIN) != 0) DrainMessages();
    if ((p[1].revents & POLLIN) != 0) {
      if (std::optional<int> done = HandleSignals()) return *done;
    }
    if (restart_at_ && Clock::now() >= *restart_at_) {
      restart_at_.reset();
      StartChild();
    }
  }
}

}  // namespace

int RunKeeper(const KeeperOptions& options, std::vector<std::string> argv) {
  Keeper keeper(options, std::move(argv));
  return keeper.Run();
}

}  // namespace hisparse
