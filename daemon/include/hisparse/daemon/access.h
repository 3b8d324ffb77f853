// Access control for the daemon's sockets. Two gates: the sockets' group and mode 0660 (who can
// open them at all), then each connection's peer credentials read with SO_PEERCRED (who is
// admitted). AccessPolicy decides the second; PeerAcceptor applies it to the gRPC socket, whose
// accepted connections are handed to gRPC one by one; FdServer applies it to the fd channel.
//
// Thread-safe: AccessPolicy is immutable; PeerAcceptor runs one accept thread.
#ifndef HISPARSE_DAEMON_ACCESS_H_
#define HISPARSE_DAEMON_ACCESS_H_

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/common/unix_socket.h"

namespace hisparse {

class AccessPolicy {
 public:
  AccessPolicy() = default;
  AccessPolicy(std::vector<uint32_t> uids, std::vector<uint32_t> gids)
      : uids_(std::move(uids)), gids_(std::move(gids)) {}
  // Root and the daemon's own uid always pass (operators, and the daemon's own tools); with both
  // lists empty, so does anyone who could open the socket.
  bool Allows(const PeerCredentials& peer) const;

 private:
  std::vector<uint32_t> uids_, gids_;
};

// "hisparse" or "10001" -> gid; "" -> -1 (keep the daemon's group).
absl::StatusOr<gid_t> ResolveGroup(const std::string& group);

// Accepts connections on a listening stream socket, admits them by policy (logging who connected)
// and hands each admitted one to `adopt` (which takes ownership of the fd).
class PeerAcceptor {
 public:
  static std::unique_ptr<PeerAcceptor> Start(UniqueFd listener, AccessPolicy policy, std::function<void(int fd)> adopt);
  ~PeerAcceptor();
  void Stop();

 private:
  PeerAcceptor() = default;
  void Loop();
  UniqueFd listener_;
  AccessPolicy policy_;
  std::function<void(int)> adopt_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_ACCESS_H_
