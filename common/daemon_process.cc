#include "hisparse/common/daemon_process.h"

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "hisparse/common/unique_fd.h"

namespace hisparse {
namespace {

bool CanConnect(const std::string& path, int type) {
  UniqueFd fd(::socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  return ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
}

// The inodes of the sockets among `pid`'s descriptors (/proc/<pid>/fd/N -> "socket:[INODE]").
std::set<std::string> SocketInodes(pid_t pid) {
  std::set<std::string> inodes;
  const std::string dir = absl::StrCat("/proc/", pid, "/fd");
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return inodes;
  while (const dirent* e = ::readdir(d)) {
    char target[256];
    const ssize_t n = ::readlink((dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    absl::string_view t(target, static_cast<size_t>(n));
    if (absl::ConsumePrefix(&t, "socket:[") && absl::ConsumeSuffix(&t, "]")) inodes.emplace(t);
  }
  ::closedir(d);
  return inodes;
}

// Local ports of the LISTEN entries (state 0A) of a /proc/net/tcp-format table whose inode is in
// `inodes`. A line: "sl local_address(HEXIP:HEXPORT) rem_address st tx:rx tr:when retrnsmt uid
// timeout inode ...".
std::set<int> ListeningPorts(const std::string& table, const std::set<std::string>& inodes) {
  std::set<int> ports;
  std::ifstream in(table);
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string sl, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
    if (!(f >> sl >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode)) continue;
    const size_t colon = local.rfind(':');
    int port = 0;
    if (state != "0A" || inodes.count(inode) == 0 || colon == std::string::npos ||
        !absl::SimpleHexAtoi(absl::string_view(local).substr(colon + 1), &port)) {
      continue;
    }
    ports.insert(port);
  }
  return ports;
}

}  // namespace

bool WaitForChildExit(pid_t pid, int timeout_ms, int* status, struct rusage* usage) {
  int st = 0;
  rusage ru{};
  const auto reaped = [&](int options) {
    if (::wait4(pid, &st, options, &ru) != pid) return false;
    if (status != nullptr) *status = st;
    if (usage != nullptr) *usage = ru;
    return true;
  };
  if (reaped(WNOHANG)) return true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
#ifdef SYS_pidfd_open
  // A pidfd turns readable when the process exits: poll() sleeps until then or the deadline.
  if (UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0))); pidfd.valid()) {
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{pidfd.get(), POLLIN, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
      if (r > 0) return reaped(0);
      if (r == 0 || errno != EINTR) return reaped(WNOHANG);
    }
  }
#endif
  while (std::chrono::steady_clock::now() < deadline) {  // no pidfd: look every 5 ms
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (reaped(WNOHANG)) return true;
  }
  return false;
}

std::string ExecutableDir() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "";
  const std::string path(self, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

absl::StatusOr<std::string> FindDaemonBinary() {
  if (const char* env = std::getenv("HISPARSE_DAEMON_BIN"); env != nullptr && *env) {
    if (::access(env, X_OK) != 0)
      return absl::NotFoundError(absl::StrCat("HISPARSE_DAEMON_BIN=", env, " is not executable"));
    return std::string(env);
  }
  if (const std::string dir = ExecutableDir(); !dir.empty()) {
    const std::string candidate = dir + "/hisparsed";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    return absl::NotFoundError(
        absl::StrCat("no hisparsed beside this program (", candidate, "); set HISPARSE_DAEMON_BIN"));
  }
  return absl::NotFoundError("cannot locate hisparsed: set HISPARSE_DAEMON_BIN");
}

absl::StatusOr<std::unique_ptr<DaemonProcess>> DaemonProcess::Start(const std::vector<std::string>& extra_args,
                                                                    int timeout_ms) {
  return Start(extra_args, timeout_ms, Launch());
}

absl::StatusOr<std::unique_ptr<DaemonProcess>> DaemonProcess::Start(const std::vector<std::string>& extra_args,
                                                                    int timeout_ms, const Launch& launch) {
  auto binary = FindDaemonBinary();
  if (!binary.ok()) return binary.status();
  std::unique_ptr<DaemonProcess> d(new DaemonProcess());
  char tmpl[] = "/tmp/hisparse-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return absl::InternalError(absl::StrCat("mkdtemp: ", std::strerror(errno)));
  d->dir_ = tmpl;
  d->socket_path_ = d->dir_ + "/hisparsed.sock";
  d->address_ = "unix:" + d->socket_path_;
  std::vector<std::string> args = {*binary, "--listen", d->address_};
  // A private daemon serves no metrics unless asked: the default port would clash between
  // daemons running side by side (tests in parallel).
  if (std::find(extra_args.begin(), extra_args.end(), "--metrics-listen") == extra_args.end()) {
    args.insert(args.end(), {"--metrics-listen", ""});
  }
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    // The daemon must not outlive its owner: a test that aborts (a sanitizer report, a crash)
    // would otherwise leave it running, holding the test runner's output pipe open, and the
    // runner would wait for that pipe until its timeout.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(126);  // the owner died before prctl took effect
    // Only async-signal-safe calls from here on (the parent may have threads).
    if (launch.max_open_files != 0) {
      const rlimit nofile{launch.max_open_files, launch.max_open_files};
      if (::setrlimit(RLIMIT_NOFILE, &nofile) != 0) ::_exit(124);
    }
    for (const int cap : launch.drop_capabilities) {
      if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) ::_exit(123);
    }
    ::execv(argv[0], argv.data());
    std::fprintf(stderr, "exec %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  d->pid_ = pid;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      d->pid_ = -1;
      return absl::UnavailableError(absl::StrCat("hisparsed exited during start (status ", status, ")"));
    }
    if (CanConnect(d->socket_path_ + ".fd", SOCK_SEQPACKET) && CanConnect(d->socket_path_, SOCK_STREAM)) return d;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return absl::DeadlineExceededError(absl::StrCat("hisparsed did not start listening within ", timeout_ms, " ms"));
}

absl::StatusOr<int> DaemonProcess::ListeningTcpPort(int timeout_ms) const {
  if (pid_ <= 0) return absl::FailedPreconditionError("the daemon is not running");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const std::set<std::string> inodes = SocketInodes(pid_);
    std::set<int> ports = ListeningPorts(absl::StrCat("/proc/", pid_, "/net/tcp"), inodes);
    for (int p : ListeningPorts(absl::StrCat("/proc/", pid_, "/net/tcp6"), inodes)) ports.insert(p);
    if (ports.size() == 1) return *ports.begin();
    if (ports.size() > 1) {
      return absl::FailedPreconditionError(absl::StrCat("hisparsed (pid ", pid_, ") listens on ", ports.size(),
                                                        " TCP ports; which one is meant is not known"));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::NotFoundError(
          absl::StrCat("hisparsed (pid ", pid_, ") listens on no TCP port after ", timeout_ms, " ms"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

int DaemonProcess::Signal(int sig) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, sig);
  if (sig != SIGKILL && sig != SIGTERM) return 0;
  int status = 0;
  if (!WaitForChildExit(pid_, 5000, &status)) {  // up to 5 s for a clean stop, then force it
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
  }
  pid_ = -1;
  return status;
}

absl::StatusOr<int> DaemonProcess::WaitExit(int timeout_ms) {
  if (pid_ <= 0) return absl::FailedPreconditionError("the daemon is not running");
  int status = 0;
  if (!WaitForChildExit(pid_, timeout_ms, &status)) {
    return absl::DeadlineExceededError(absl::StrCat("hisparsed (pid ", pid_, ") still runs after ", timeout_ms, " ms"));
  }
  pid_ = -1;
  return status;
}

DaemonProcess::~DaemonProcess() {
  Signal(SIGTERM);  // returns once the daemon has exited: nothing writes into dir_ after this
  if (!dir_.empty()) {
    // The folder is this object's (mkdtemp): it goes whole, with whatever the daemon left (the
    // lock of a killed daemon) or a test put there (a socket moved aside).
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

}  // namespace hisparse
