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
#include "hisparse/daemon/accept_guard.h"

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

// Accepts connections on a listening stream socket, admits them by policy (logging who connected;
// refusals at most once a second, with a count) and hands each admitted one to `adopt` (which
// takes ownership of the fd). Running out of descriptors is survived (AcceptGuard, in
// accept_guard.h): `on_serving_change(false)` while it cannot accept, `(true)` once it can again;
// both run on the acceptor's thread. One thread, woken for Stop by an eventfd.
class PeerAcceptor {
 public:
  static absl::StatusOr<std::unique_ptr<PeerAcceptor>> Start(UniqueFd listener, AccessPolicy policy,
                                                             std::function<void(int fd)> adopt,
                                                             std::function<void(bool serving)> on_serving_change = {});
  ~PeerAcceptor();
  void Stop();

 private:
  PeerAcceptor() = default;
  void Loop();
  void AcceptAll();
  void Admit(UniqueFd conn);
  UniqueFd listener_, wake_;
  AccessPolicy policy_;
  std::function<void(int)> adopt_;
  std::unique_ptr<AcceptGuard> guard_;  // the acceptor thread's
  RateLimitedLog refused_log_{absl::Seconds(1)};
  std::thread thread_;
  std::atomic<bool> stopping_{false};
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_ACCESS_H_
