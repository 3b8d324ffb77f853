#include "hisparse/common/unix_socket.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace hisparse {
namespace {

absl::Status Errno(absl::string_view what) {
  const int e = errno;
  std::string msg = absl::StrCat(what, ": ", std::strerror(e));
  if (e == ECONNREFUSED || e == ENOENT || e == EPIPE || e == ECONNRESET) return absl::UnavailableError(msg);
  // A socket timeout (SO_SNDTIMEO / SO_RCVTIMEO) ran out, or a non-blocking socket would block.
  if (e == EAGAIN || e == EWOULDBLOCK) return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
  return absl::InternalError(msg);
}

absl::StatusOr<sockaddr_un> MakeAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unix socket path must be 1..", sizeof(addr.sun_path) - 1, " bytes: \"", path, "\""));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

}  // namespace

absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, int type, mode_t mode, gid_t gid) {
  auto addr = MakeAddress(path);
  if (!addr.ok()) return addr.status();
  UniqueFd fd(::socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Errno("socket(AF_UNIX)");
  ::unlink(path.c_str());
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    return Errno(absl::StrCat("bind ", path));
  }
  if (gid != static_cast<gid_t>(-1) && ::chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0) {
    return Errno(absl::StrCat("chown ", path, " to group ", gid));
  }
  if (::chmod(path.c_str(), mode) != 0) return Errno(absl::StrCat("chmod ", path));
  if (::listen(fd.get(), 128) != 0) return Errno(absl::StrCat("listen ", path));
  return fd;
}

absl::StatusOr<UniqueFd> ListenUnixSeqpacket(const std::string& path, mode_t mode, gid_t gid) {
  return ListenUnix(path, SOCK_SEQPACKET, mode, gid);
}

absl::StatusOr<UniqueFd> ListenUnixStream(const std::string& path, mode_t mode, gid_t gid) {
  return ListenUnix(path, SOCK_STREAM, mode, gid);
}

absl::StatusOr<UniqueFd> ConnectUnixSeqpacket(const std::string& path, int timeout_ms) {
  auto addr = MakeAddress(path);
  if (!addr.ok()) return addr.status();
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Errno("socket(AF_UNIX, SOCK_SEQPACKET)");
  if (timeout_ms > 0) {
    // A unix connect waits on a full backlog for up to SO_SNDTIMEO; sends and receives on the
    // socket are bounded by the same timeouts from then on.
    const timeval tv{timeout_ms / 1000, static_cast<suseconds_t>((timeout_ms % 1000) * 1000)};
    if (::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0 ||
        ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0) {
      return Errno("setsockopt(SO_SNDTIMEO / SO_RCVTIMEO)");
    }
  }
  int rc;
  do {
    rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    if (errno == EAGAIN) {
      return absl::DeadlineExceededError(
          absl::StrCat("connect ", path, ": no answer in ", timeout_ms, " ms (its listener is not accepting)"));
    }
    return Errno(absl::StrCat("connect ", path));
  }
  return fd;
}

absl::Status SendPacket(int sock, absl::string_view payload, int fd_to_pass) {
  iovec iov{const_cast<char*>(payload.data()), payload.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd_to_pass >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd_to_pass, sizeof(int));
  }
  ssize_t n;
  do {
    n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Errno("sendmsg");  // DeadlineExceeded when SO_SNDTIMEO ran out
  return absl::OkStatus();
}

absl::StatusOr<size_t> RecvPacketInto(int sock, char* buf, size_t max_bytes, UniqueFd* fd) {
  fd->Reset();
  // One byte more than allowed: a packet that fills it is too long (MSG_TRUNC says so too).
  iovec iov{buf, max_bytes + 1};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Errno("recvmsg");
  // Take ownership of every descriptor that arrived before judging the packet, so none leaks.
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int received;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (!fd->valid()) {
        fd->Reset(received);
      } else {
        ::close(received);  // the protocols pass at most one descriptor a packet
      }
    }
  }
  if (n == 0) return absl::UnavailableError("peer closed the socket");
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || static_cast<size_t>(n) > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("packet longer than ", max_bytes, " bytes"));
  }
  return static_cast<size_t>(n);
}

absl::StatusOr<Packet> RecvPacket(int sock, size_t max_bytes) {
  std::vector<char> buf(max_bytes + 1);
  Packet p;
  absl::StatusOr<size_t> n = RecvPacketInto(sock, buf.data(), max_bytes, &p.fd);
  if (!n.ok()) return n.status();
  p.payload.assign(buf.data(), *n);
  return p;
}

absl::StatusOr<PeerCredentials> GetPeerCredentials(int sock) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return Errno("SO_PEERCRED");
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

absl::StatusOr<std::string> UnixPathFromAddress(absl::string_view address) {
  if (!absl::StartsWith(address, "unix:") || address.size() == 5) {
    return absl::InvalidArgumentError(absl::StrCat("address must be unix:PATH, got \"", address, "\""));
  }
  return std::string(address.substr(5));
}

}  // namespace hisparse
