// FdServer: the fd channel. gRPC cannot carry file descriptors, so the memory a session owns (its
// host-pool slabs and its slot arena) reaches the engine over this SOCK_SEQPACKET unix socket
// beside the gRPC one, with SCM_RIGHTS.
//
// Protocol, one request and one reply per packet. Version 2 (typed replies):
//   request  "HSFD2 <session_id> <token> arena"  |  "HSFD2 <session_id> <token> slab <N>"
//   reply    "OK fd <bytes>" with the descriptor attached
//          | "OK cuda-ipc <bytes> <handle>": no descriptor; <handle> is the arena's 64-byte cudaIpc
//            handle in lower-case hex (128 characters); only a "cuda-ipc" arena answers so
//          | "ERR <CODE> <message>" (no descriptor)
// Version 1 ("HSFD1 ...", reply "OK <bytes>" + descriptor) is still served; it cannot carry a
// cudaIpc handle, so a "cuda-ipc" arena answers it with ERR FAILED_PRECONDITION.
// The bytes are made and read by one codec, hisparse/common/fd_channel_codec.h, on both sides.
// The token from SessionOpened is the capability: only the session that owns an object gets it.
// A client reads each reply before it sends the next request: a connection whose replies cannot
// be sent at once (its receive queue is full) is dropped, so no reply is ever queued here.
//
// Connections are capped per peer uid (max_connections_per_peer; the uid is the tenant, and a
// per-pid cap would fall to a fork): one over the cap is answered "ERR RESOURCE_EXHAUSTED ..." at
// once and closed after its first request is read (closing a unix socket with a request unread
// would reset it, and the client would see ECONNRESET instead of the answer); at most
// kMaxRefusing such connections wait, beyond that they are closed at once. Running out of descriptors is survived
// (AcceptGuard): the channel reports itself down through on_serving_change and serves again once descriptors are free.
//
// Descriptors in flight. A descriptor sent with SCM_RIGHTS lives in the peer's receive queue until
// the peer reads it, and Linux counts every one in flight against the sender's RLIMIT_NOFILE (per
// user: all of the daemon's connections together); past it, sendmsg fails ETOOMANYREFS for every
// descriptor to every tenant. A peer that asks for descriptors and never reads them could thus
// stop fd passing for everyone; nor did dropping its connection help, since the descriptors stay
// queued at a peer that keeps its socket open, and it reconnects. So descriptors in flight are
// bounded: per connection (max_fds_in_flight_per_connection) and per peer uid, all its
// connections together (max_fds_in_flight_per_peer), and all peers together below an eighth short
// of the daemon's RLIMIT_NOFILE (read at each check). A fetch past a bound is answered "ERR
// RESOURCE_EXHAUSTED ..." without a descriptor: only the tenant that does not read is refused.
//   How the daemon knows what its peer has read: the socket's send queue. A packet sent on a unix
// socket is charged to the sender's socket until the receiver consumes it, so SIOCOUTQ (the bytes
// sent and not yet read) is 0 exactly when the peer has read every reply, its descriptors with it.
// Each connection counts the descriptors sent since its queue was last seen empty, and forgets
// them when it is seen empty again; a partly read queue still counts them all, which errs toward
// refusing the peer that reads late. (Counting until the peer's next request, the other way, would
// trust a peer that sends requests and never reads.) A connection dropped with descriptors still
// unread is kept, counted, without being served (lingering), until its peer reads them or closes:
// its descriptors are still in flight, and counting them is the point. Lingering connections are
// looked at again when their uid or the daemon is at a bound, and once a second.
//
// Control lanes. A connection whose first packet is a lane's hello ("HSLANE1 ...",
// hisparse/common/control_lane.h) leaves this loop, and its uid's connection count, for
// ControlLanes, which serves it on a thread of its own; it must have no descriptor in flight.
//
// Thread-safe. One thread serves the listener and every connection from one epoll loop (requests
// are tiny and answered at once); the connection table is that thread's alone. Stop() ends it.
#ifndef HISPARSE_DAEMON_FD_SERVER_H_
#define HISPARSE_DAEMON_FD_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/common/unix_socket.h"
#include "hisparse/daemon/accept_guard.h"
#include "hisparse/daemon/access.h"
#include "hisparse/daemon/control_lanes.h"
#include "hisparse/daemon/session_manager.h"

namespace hisparse {

class FdServer {
 public:
  struct InFlightLimits {
    int per_connection = 4;  // limits.max_fds_in_flight_per_connection
    int per_peer = 64;       // limits.max_fds_in_flight_per_peer
  };
  struct Options {
    int max_connections_per_peer = 1024;                  // limits.max_fd_connections_per_peer
    InFlightLimits in_flight;                             // descriptors sent and not yet read
    std::function<void(bool serving)> on_serving_change;  // runs on the server's thread
    // Where a control lane's hello hands its connection (control_lanes.h); null: hellos are
    // refused with FAILED_PRECONDITION. Not owned; must outlive the server.
    ControlLanes* lanes = nullptr;
  };
  // Listens on `path` with socket mode `mode` and group `gid` (-1: unchanged), admitting peers
  // by `policy`. `sessions` must outlive the server.
  static absl::StatusOr<std::unique_ptr<FdServer>> Start(const std::string& path, mode_t mode, gid_t gid,
                                                         AccessPolicy policy, SessionManager* sessions,
                                                         Options options);
  static absl::StatusOr<std::unique_ptr<FdServer>> Start(const std::string& path, mode_t mode, gid_t gid,
                                                         AccessPolicy policy, SessionManager* sessions);
  ~FdServer();
  void Stop();
  // Takes effect for the next connection; connections already open stay.
  void SetMaxConnectionsPerPeer(int n) { max_per_peer_.store(n); }
  // Takes effect at the next descriptor sent; descriptors already in flight stay counted.
  void SetInFlightLimits(InFlightLimits limits) {
    max_in_flight_per_conn_.store(limits.per_connection);
    max_in_flight_per_peer_.store(limits.per_peer);
  }

  // One request packet -> its reply text, and in *out_fd the descriptor to attach (if any). The
  // whole protocol but the socket: the fuzzer drives it directly.
  static std::string HandleRequest(SessionManager& sessions, absl::string_view request, const PeerCredentials& peer,
                                   UniqueFd* out_fd);

 private:
  struct Conn {
    UniqueFd fd;
    PeerCredentials peer;
    bool refused = false;    // answered ERR over the cap: dropped once its request is read
    int in_flight = 0;       // descriptors sent since its send queue was last seen empty
    bool lingering = false;  // dropped with descriptors unread: kept, unserved, until they are read
  };
  struct PeerInFlight {
    int fds = 0;                     // the sum of its connections' in_flight
    absl::flat_hash_set<int> conns;  // its connections with in_flight > 0
  };
  static constexpr int kMaxRefusing = 64;
  FdServer(UniqueFd listener, AccessPolicy policy, SessionManager* sessions, Options options)
      : listener_(std::move(listener)),
        policy_(std::move(policy)),
        sessions_(sessions),
        options_(std::move(options)),
        max_per_peer_(options_.max_connections_per_peer),
        max_in_flight_per_conn_(options_.in_flight.per_connection),
        max_in_flight_per_peer_(options_.in_flight.per_peer) {}
  void Loop();
  void WatchListener(bool want);
  void AcceptReady();
  void Admit(UniqueFd conn);
  bool Watch(UniqueFd conn, const PeerCredentials& peer, bool refused);
  void ServeOne(int fd);
  // A lane's hello: the connection leaves this loop for `options_.lanes`, or is answered ERR.
  void OpenLane(int fd, absl::string_view hello);
  void Drop(int fd);
  void Close(int fd);
  void Refuse(const std::string& why);
  // Descriptors in flight (the class comment has the design).
  void Settle(int fd, Conn& c);  // forgets c's descriptors once its send queue is empty
  void SettlePeer(uid_t uid);    // Settle for each of uid's connections with descriptors in flight
  void SettleAll();
  std::string InFlightRefusal(int fd, Conn& c);  // why no descriptor may go to c now; "" if one may
  void CountSent(int fd, Conn& c);

  UniqueFd listener_, epoll_, wake_;
  const AccessPolicy policy_;
  SessionManager* const sessions_;
  const Options options_;
  std::atomic<int> max_per_peer_;
  std::atomic<int> max_in_flight_per_conn_;
  std::atomic<int> max_in_flight_per_peer_;
  std::unique_ptr<AcceptGuard> guard_;                  // the loop's
  bool listener_watched_ = false;                       // the loop's: is the listener in the epoll set
  absl::flat_hash_map<int, Conn> conns_;                // the loop's: open connections by fd
  absl::flat_hash_map<uid_t, int> conns_per_uid_;       // the loop's; refused connections not counted
  int refusing_ = 0;                                    // the loop's: refused connections still open
  absl::flat_hash_map<uid_t, PeerInFlight> in_flight_;  // the loop's: descriptors in flight per uid
  int in_flight_total_ = 0;                             // the loop's: all uids'
  int lingering_ = 0;                                   // the loop's: lingering connections
  RateLimitedLog refused_log_{absl::Seconds(1)};
  std::thread loop_;
  std::atomic<bool> stopping_{false};
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_FD_SERVER_H_
