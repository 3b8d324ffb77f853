// ControlLanes: the daemon's side of the control lanes (hisparse/common/control_lane.h), each a
// session's own connection that carries its lifecycle calls without gRPC.
//
// The fd channel (fd_server.h) reads a lane's hello, checks it (the session's token, and the
// kernel's word that the peer is its tenant), answers "OK lane" and hands the connection here.
// From then on one thread of its own serves it: reads a request, runs the SessionManager call the
// gRPC service would run for it, times it into the same RPC histogram, and sends the reply. A lane
// acts for its session alone (a request naming another is PermissionDenied). A lane's thread
// blocks only on its own socket, so a peer that stops reading stalls only itself.
//
// Lifetimes. A lane ends when its peer closes it, when it sends something that is not a message
// (then it is dropped), when its session ends (SessionEnded: the daemon calls it as the session's
// stream ends), when a second lane of its session replaces it, or at Stop. At most one lane per
// live session, so lanes are bounded by limits.max_sessions; and a lane handed over just as its
// session ends is caught by the check Open makes after registering it.
//
// Thread-safe. Ending a lane shuts its socket down, which wakes its thread; finished threads are
// joined by the next Open, SessionEnded or Stop, never by themselves.
#ifndef HISPARSE_DAEMON_CONTROL_LANES_H_
#define HISPARSE_DAEMON_CONTROL_LANES_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "hisparse/common/control_lane.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/common/unix_socket.h"
#include "hisparse/daemon/metrics.h"
#include "hisparse/daemon/session_manager.h"

namespace hisparse {

class ControlLanes {
 public:
  // `sessions` must outlive this; `metrics` may be null (nothing timed).
  ControlLanes(SessionManager* sessions, Metrics* metrics) : sessions_(sessions), metrics_(metrics) {}
  ~ControlLanes() { Stop(); }
  ControlLanes(const ControlLanes&) = delete;
  ControlLanes& operator=(const ControlLanes&) = delete;

  // Serves `conn` as the lane of the session `hello` names, on a thread of its own, once it has
  // checked the token and that `peer` (the kernel's word) is the session's tenant; the hello's
  // answer ("OK lane" or the refusal) is sent here. A refusal is returned too: PermissionDenied
  // for a wrong token or tenant or an ended session, Unavailable after Stop or without a thread;
  // `conn` is closed then. A lane the session had is replaced.
  absl::Status Open(UniqueFd conn, const LaneHello& hello, const PeerCredentials& peer) ABSL_LOCKS_EXCLUDED(mu_);
  // limits.control_lanes: off, Open refuses (FAILED_PRECONDITION, so clients keep gRPC); lanes
  // open stay.
  void SetEnabled(bool enabled) { enabled_.store(enabled); }
  // The session has ended: its lane, if any, is shut down.
  void SessionEnded(uint64_t session_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Shuts every lane down and joins every thread; Open is refused from then on. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Lanes being served now.
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

  // One request message of the lane of `session_id` to its reply: the whole protocol but the
  // socket (tests and the fuzzer drive it). The reply's tag is an absl::StatusCode; its body the
  // serialized response (OK) or the error's message.
  static LaneMessage Handle(SessionManager& sessions, Metrics* metrics, uint64_t session_id,
                            const LaneMessage& request);

 private:
  struct Lane {
    UniqueFd fd;
    uint64_t session_id = 0;
    std::thread thread;
  };
  absl::Status Start(std::unique_ptr<Lane> lane, const LaneHello& hello, const PeerCredentials& peer)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Serve(Lane* lane);
  // Moves `lane` from the live lanes (where it may no longer be) to the finished ones.
  void Finish(Lane* lane) ABSL_LOCKS_EXCLUDED(mu_);
  // Joins the threads that have finished; outside mu_.
  void Reap() ABSL_LOCKS_EXCLUDED(mu_);

  SessionManager* const sessions_;
  Metrics* const metrics_;
  std::atomic<bool> enabled_{true};
  mutable absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // Every lane whose thread runs, by its address; `by_session_` names the current one of each session.
  absl::flat_hash_map<Lane*, std::unique_ptr<Lane>> live_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Lane*> by_session_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Lane>> finished_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_CONTROL_LANES_H_
