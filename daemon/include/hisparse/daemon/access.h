// Access control for the daemon's sockets. Two gates: the sockets' group and mode 0660 (who can
// open them at all), then each connection's peer credentials read with SO_PEERCRED (who is
// admitted). AccessPolicy decides the second, and who is an admin; PeerAcceptor applies it to the
// gRPC socket, whose accepted connections are handed to gRPC one by one; FdServer applies it to
// the fd channel. PeerRegistry remembers, per control connection, who is at the other end, so
// that each RPC knows its caller.
//
// Thread-safe: AccessPolicy is immutable; PeerRegistry locks; PeerAcceptor runs one accept thread.
#ifndef HISPARSE_DAEMON_ACCESS_H_
#define HISPARSE_DAEMON_ACCESS_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/common/unix_socket.h"
#include "hisparse/daemon/accept_guard.h"
#include "hisparse/daemon/http2_refusal.h"

namespace hisparse {

class AccessPolicy {
 public:
  AccessPolicy() = default;
  AccessPolicy(std::vector<uint32_t> uids, std::vector<uint32_t> gids, std::vector<uint32_t> admin_uids = {},
               std::vector<uint32_t> admin_gids = {})
      : uids_(std::move(uids)),
        gids_(std::move(gids)),
        admin_uids_(std::move(admin_uids)),
        admin_gids_(std::move(admin_gids)) {}
  // Admins always pass; with both allowed lists empty, so does anyone who could open the socket.
  bool Allows(const PeerCredentials& peer) const;
  // Root, the daemon's own uid (the operator's tools run as it), and the peers named by
  // access.admin_uids / admin_gids (primary gid, as SO_PEERCRED reports it). Admins see and act on
  // every tenant's sessions and may drain the node; everyone else only on their own.
  bool IsAdmin(const PeerCredentials& peer) const;

 private:
  std::vector<uint32_t> uids_, gids_, admin_uids_, admin_gids_;
};

// Who is at the other end of each control connection that gRPC serves. gRPC 1.51 names a
// connection handed to it with AddInsecureChannelFromFd "fd:N" (ServerContext::peer()), N being
// the descriptor, and tells nothing else about it; the acceptor records N's credentials here
// before handing N over, and every RPC looks its caller up by that name.
//
// Descriptor numbers are reused: an entry also holds the socket's device and inode (fstat), and
// a lookup holds only while descriptor N is still that very socket. A connection gRPC has closed
// thus answers no lookup, whatever N is now (another socket, a memfd, nothing), until the next
// accepted connection at N replaces the entry. A call of a closed connection that reaches its
// handler after N went to a new, recorded connection would see the new peer; gRPC cancels such a
// call as it closes the connection, and the service refuses cancelled calls. What is left is the
// moment between gRPC closing N and marking the call cancelled (the same gRPC thread, right
// after): a new connection would have to be accepted and recorded at N, and the old call's
// handler look up, within it. Holding a closed number back from reuse for a grace period would
// close that too (not done).
//
// The registry also counts each uid's connections, for the per-uid cap of the control socket
// (limits.max_control_connections_per_peer). gRPC tells nobody when it closes a connection, so an
// entry is known dead only when looked at: Record, when a uid reaches its cap, first drops that
// uid's entries whose descriptor is no longer the recorded socket (the same fstat test as Lookup),
// and refuses only if the cap still holds. A uid's count is thus exact whenever it matters.
class PeerRegistry {
 public:
  // Records `fd`'s peer as one of its uid's connections. Call before the connection is handed to
  // gRPC (its first RPC may come at once). Fails (and records nothing) when `fd` cannot be
  // fstat'ed (Internal), or when `max_per_uid` > 0 and the peer's uid holds that many live
  // connections already (ResourceExhausted, naming limits.max_control_connections_per_peer).
  absl::Status Record(int fd, const PeerCredentials& peer, int max_per_uid = 0) ABSL_LOCKS_EXCLUDED(mu_);
  // The credentials of the connection gRPC names `grpc_peer` ("fd:N"). Unauthenticated when the
  // name is not of that form, N was never recorded, or N is no longer the recorded socket.
  absl::StatusOr<PeerCredentials> Lookup(absl::string_view grpc_peer) const ABSL_LOCKS_EXCLUDED(mu_);
  // `uid`'s live recorded connections (closed ones are dropped first).
  int Connections(uint32_t uid) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    dev_t dev = 0;
    ino_t ino = 0;
    PeerCredentials peer;
  };
  // Drops `uid`'s entries whose descriptor is no longer their socket; returns the live count.
  int Reap(uint32_t uid) ABSL_LOCKS_EXCLUDED(mu_);
  void EraseLocked(int fd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, Entry> entries_ ABSL_GUARDED_BY(mu_);                         // one per descriptor number
  absl::flat_hash_map<uint32_t, absl::flat_hash_set<int>> by_uid_ ABSL_GUARDED_BY(mu_);  // entries_' fds per uid
};

// "hisparse" or "10001" -> gid; "" -> -1 (keep the daemon's group).
absl::StatusOr<gid_t> ResolveGroup(const std::string& group);

// Accepts connections on a listening stream socket, admits them by policy (logging who connected;
// refusals at most once a second, with a count), records each admitted one's peer in `peers`, and
// hands it, with its credentials, to `adopt` (which takes ownership of the fd). Each uid but the
// admins' may hold at most max_connections_per_peer connections (limits.max_control_connections_
// per_peer; counted by `peers`): one over it never reaches gRPC: its first call is answered
// RESOURCE_EXHAUSTED, saying why (Http2Refusal), and it is closed, so that idle connections of
// one tenant cannot spend the descriptors every other tenant's calls need. Running out of descriptors is survived
// (AcceptGuard, in accept_guard.h): `on_serving_change(false)` while it cannot accept, `(true)`
// once it can again; both run on the acceptor's thread. One thread, woken for Stop by an eventfd.
class PeerAcceptor {
 public:
  using Adopt = std::function<void(int fd, const PeerCredentials& peer)>;
  struct Options {
    int max_connections_per_peer = 1024;                  // limits.max_control_connections_per_peer
    std::function<void(bool serving)> on_serving_change;  // may be empty
  };
  // `peers` must outlive the acceptor.
  static absl::StatusOr<std::unique_ptr<PeerAcceptor>> Start(UniqueFd listener, AccessPolicy policy,
                                                             PeerRegistry* peers, Adopt adopt, Options options);
  ~PeerAcceptor();
  void Stop();
  // Takes effect for the next connection; connections already open stay.
  void SetMaxConnectionsPerPeer(int n) { max_per_peer_.store(n); }

 private:
  PeerAcceptor() = default;
  void Loop();
  void AcceptAll();
  void Admit(UniqueFd conn);
  void Refuse(UniqueFd conn, const PeerCredentials& peer, absl::string_view why);
  using Clock = std::chrono::steady_clock;
  struct Refused {
    UniqueFd conn;
    Clock::time_point until;  // closed then, if its client has not closed it first
    Http2Refusal answer;      // what the client is told, on its first call
  };
  static constexpr size_t kMaxRefused = 16;  // more are closed at once: refusals must cost few descriptors
  static constexpr std::chrono::milliseconds kRefusedLinger{1000};
  UniqueFd listener_, wake_;
  AccessPolicy policy_;
  PeerRegistry* peers_ = nullptr;
  Adopt adopt_;
  std::atomic<int> max_per_peer_{1024};
  std::unique_ptr<AcceptGuard> guard_;  // the acceptor thread's
  std::vector<Refused> refused_;        // the acceptor thread's; in refusal order
  RateLimitedLog refused_log_{absl::Seconds(1)};
  std::thread thread_;
  std::atomic<bool> stopping_{false};
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_ACCESS_H_
