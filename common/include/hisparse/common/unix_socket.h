// Unix-domain sockets and file-descriptor passing (SCM_RIGHTS), the carrier of hisparse's fd
// channel: the gRPC socket cannot carry descriptors, so memory (memfd segments, arenas) travels
// over a SOCK_SEQPACKET socket beside it, one message per packet.
//
// Free functions; each returned UniqueFd has one owner. Thread-safe as the syscalls are.
#ifndef HISPARSE_COMMON_UNIX_SOCKET_H_
#define HISPARSE_COMMON_UNIX_SOCKET_H_

#include <sys/types.h>

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "hisparse/common/unique_fd.h"

namespace hisparse {

// Binds and listens on `path` (an existing socket file there is replaced, so the caller must own
// the path: hisparsed holds PathLock on `<socket>.lock` first), mode `mode`, owned by group `gid`
// unless it is -1.
absl::StatusOr<UniqueFd> ListenUnixSeqpacket(const std::string& path, mode_t mode, gid_t gid = static_cast<gid_t>(-1));
absl::StatusOr<UniqueFd> ListenUnixStream(const std::string& path, mode_t mode, gid_t gid = static_cast<gid_t>(-1));
// With timeout_ms > 0, the connect (which on a unix socket waits while the listener's backlog
// is full) and every later send and receive on the socket give up after timeout_ms with
// DeadlineExceeded; with 0 they wait as long as it takes.
absl::StatusOr<UniqueFd> ConnectUnixSeqpacket(const std::string& path, int timeout_ms = 0);

// Sends one packet, with `fd_to_pass` attached when >= 0. A send that would block (a full
// non-blocking socket, or SO_SNDTIMEO ran out) is DeadlineExceeded.
absl::Status SendPacket(int sock, absl::string_view payload, int fd_to_pass);

struct Packet {
  std::string payload;
  UniqueFd fd;  // invalid when none was attached
};
// Receives one packet (at most max_bytes; longer ones are an error). Closed peer -> Unavailable;
// nothing to read on a non-blocking socket, or SO_RCVTIMEO ran out -> DeadlineExceeded.
absl::StatusOr<Packet> RecvPacket(int sock, size_t max_bytes);
// The same into `buf`, which must hold max_bytes + 1 bytes: the packet's length, and in `fd` the
// descriptor that came with it (reset when none did; a packet's further ones are closed).
absl::StatusOr<size_t> RecvPacketInto(int sock, char* buf, size_t max_bytes, UniqueFd* fd);

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
absl::StatusOr<PeerCredentials> GetPeerCredentials(int sock);

// "unix:/path" -> "/path"; anything else is InvalidArgument.
absl::StatusOr<std::string> UnixPathFromAddress(absl::string_view address);

}  // namespace hisparse

#endif  // HISPARSE_COMMON_UNIX_SOCKET_H_
