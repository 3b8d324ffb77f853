#include "hisparse/common/fd_store.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "hisparse/common/unix_socket.h"

namespace hisparse {
namespace {

constexpr size_t kMaxFdNameLength = 255;
constexpr int kNotifySendTimeoutMs = 2000;  // the longest a send waits for room in the manager's queue
constexpr int kListenFdsStart = 3;          // SD_LISTEN_FDS_START

// `what: strerror(errno)` as a status, with the codes a caller can act on: nothing listens
// (Unavailable), the manager's queue stayed full (DeadlineExceeded), not ours to reach
// (PermissionDenied).
absl::Status FdStoreErrno(absl::string_view what) {
  const int e = errno;
  switch (e) {
    case ENOENT:
    case ECONNREFUSED:
      return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(e)));
    case EAGAIN:
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": the service manager's queue stayed full for ", kNotifySendTimeoutMs, " ms"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(absl::StrCat(what, ": ", std::strerror(e)));
    default:
      return ErrnoStatus(e, what);
  }
}

// The socket address of $NOTIFY_SOCKET and its exact length: a path, or "@name" for the abstract
// name "\0name", whose length counts no terminator (the kernel compares every byte of it).
absl::Status NotifySocketAddress(const std::string& address, sockaddr_un* addr, socklen_t* len) {
  *addr = sockaddr_un{};
  addr->sun_family = AF_UNIX;
  const bool abstract = !address.empty() && address[0] == '@';
  if (address.size() < 2 || (!abstract && address[0] != '/')) {
    return absl::InvalidArgumentError(
        absl::StrCat("notify socket must be an absolute path or @name, got \"", address, "\""));
  }
  // A path needs room for its terminator; an abstract name may use every byte.
  const size_t room = abstract ? sizeof(addr->sun_path) : sizeof(addr->sun_path) - 1;
  if (address.size() > room) {
    return absl::InvalidArgumentError(
        absl::StrCat("notify socket address is longer than ", room, " bytes: \"", address, "\""));
  }
  std::memcpy(addr->sun_path, address.data(), address.size());
  if (abstract) addr->sun_path[0] = '\0';
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address.size() + (abstract ? 0 : 1));
  return absl::OkStatus();
}

absl::Status CheckFdName(absl::string_view name) {
  if (IsValidFdName(name)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("fd store name must be 1..", kMaxFdNameLength,
                                                 " printable ASCII characters without ':', got \"", absl::CEscape(name),
                                                 "\""));
}

}  // namespace

bool IsValidFdName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxFdNameLength) return false;
  for (const char c : name) {
    if (c < ' ' || c > '~' || c == ':') return false;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<FdStore>> FdStore::FromEnvironment() {
  const char* env = std::getenv("NOTIFY_SOCKET");
  if (env == nullptr || env[0] == '\0') {
    return absl::NotFoundError("NOTIFY_SOCKET is not set: no service manager keeps descriptors for this process");
  }
  return Connect(env);
}

absl::StatusOr<std::unique_ptr<FdStore>> FdStore::Connect(const std::string& notify_socket) {
  sockaddr_un addr;
  socklen_t len = 0;
  if (absl::Status st = NotifySocketAddress(notify_socket, &addr, &len); !st.ok()) return st;
  UniqueFd sock(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return FdStoreErrno("socket(AF_UNIX, SOCK_DGRAM)");
  const timeval tv{kNotifySendTimeoutMs / 1000, (kNotifySendTimeoutMs % 1000) * 1000};
  if (::setsockopt(sock.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) {
    return FdStoreErrno("setsockopt(SO_SNDTIMEO) on the notify socket");
  }
  int rc;
  do {
    rc = ::connect(sock.get(), reinterpret_cast<const sockaddr*>(&addr), len);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return FdStoreErrno(absl::StrCat("connect to notify socket ", notify_socket));
  return std::unique_ptr<FdStore>(new FdStore(std::move(sock), notify_socket));
}

absl::Status FdStore::Send(absl::string_view what, absl::string_view payload, int fd_to_pass) {
  absl::Status st = SendPacket(sock_.get(), payload, fd_to_pass);
  if (st.ok()) return st;
  return absl::Status(st.code(), absl::StrCat(what, ": to ", address_, ": ", st.message()));
}

absl::Status FdStore::Put(absl::string_view name, int fd) {
  if (absl::Status st = CheckFdName(name); !st.ok()) return st;
  if (fd < 0) return absl::InvalidArgumentError(absl::StrCat("fd store: cannot store fd ", fd, " as ", name));
  return Send(absl::StrCat("storing ", name), absl::StrCat("FDSTORE=1\nFDNAME=", name, "\nFDPOLL=0\n"), fd);
}

absl::Status FdStore::Remove(absl::string_view name) {
  if (absl::Status st = CheckFdName(name); !st.ok()) return st;
  return Send(absl::StrCat("removing ", name), absl::StrCat("FDSTOREREMOVE=1\nFDNAME=", name, "\n"), -1);
}

absl::Status FdStore::Barrier(absl::Duration timeout) {
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0) return FdStoreErrno("barrier: pipe2");
  UniqueFd read_end(ends[0]);
  UniqueFd write_end(ends[1]);
  if (absl::Status st = Send("barrier", "BARRIER=1\n", write_end.get()); !st.ok()) return st;
  write_end.Reset();  // the manager's copy is now the only one: its close hangs the pipe up
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    const int wait_ms = left <= absl::ZeroDuration()
                            ? 0
                            : static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, INT_MAX));
    pollfd p{read_end.get(), 0, 0};  // POLLHUP is reported whatever is asked for
    const int rc = ::poll(&p, 1, wait_ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return FdStoreErrno("barrier: poll");
    if (rc > 0 && (p.revents & POLLHUP) != 0) return absl::OkStatus();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("barrier: the service manager at ", address_,
                                                      " did not process our messages within ",
                                                      absl::FormatDuration(timeout)));
    }
  }
}

absl::StatusOr<std::vector<ListenFd>> TakeListenFds() {
  // Unset on every path out, as sd_listen_fds(unset_environment = 1) does: whatever they said,
  // they were for this process only.
  struct UnsetOnReturn {
    ~UnsetOnReturn() {
      ::unsetenv("LISTEN_PID");
      ::unsetenv("LISTEN_FDS");
      ::unsetenv("LISTEN_FDNAMES");
    }
  } unset;
  std::vector<ListenFd> taken;
  const char* pid_env = std::getenv("LISTEN_PID");
  if (pid_env == nullptr) return taken;
  int pid = 0;
  if (!absl::SimpleAtoi(pid_env, &pid) || pid <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("LISTEN_PID is not a pid: \"", pid_env, "\""));
  }
  if (pid != ::getpid()) return taken;  // inherited from a parent: not ours
  const char* fds_env = std::getenv("LISTEN_FDS");
  if (fds_env == nullptr) return taken;
  int n = 0;
  if (!absl::SimpleAtoi(fds_env, &n) || n < 0 || n > INT_MAX - kListenFdsStart) {
    return absl::InvalidArgumentError(absl::StrCat("LISTEN_FDS is not a count: \"", fds_env, "\""));
  }
  std::vector<std::string> names(static_cast<size_t>(n), "unknown");
  const char* names_env = std::getenv("LISTEN_FDNAMES");
  if (names_env != nullptr && n > 0) {
    const std::vector<absl::string_view> given = absl::StrSplit(names_env, ':');
    if (given.size() != names.size()) {
      return absl::InvalidArgumentError(absl::StrCat("LISTEN_FDNAMES names ", given.size(),
                                                     " descriptors, LISTEN_FDS says ", n, ": \"", names_env, "\""));
    }
    for (size_t i = 0; i < given.size(); ++i) {
      if (!given[i].empty()) names[i] = std::string(given[i]);
    }
  }
  // Check every descriptor before taking any, so that an error leaves them all as they were.
  for (int i = 0; i < n; ++i) {
    if (::fcntl(kListenFdsStart + i, F_GETFD) < 0) {
      return absl::FailedPreconditionError(absl::StrCat("LISTEN_FDS=", n, " but descriptor ", kListenFdsStart + i,
                                                        " is not open: ", std::strerror(errno)));
    }
  }
  taken.reserve(names.size());
  for (int i = 0; i < n; ++i) {
    const int fd = kListenFdsStart + i;
    const int flags = ::fcntl(fd, F_GETFD);
    if (flags < 0 || ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC) != 0) {
      return FdStoreErrno(absl::StrCat("fcntl(FD_CLOEXEC) on passed descriptor ", fd));
    }
    taken.push_back(ListenFd{std::move(names[static_cast<size_t>(i)]), UniqueFd(fd)});
  }
  return taken;
}

}  // namespace hisparse
