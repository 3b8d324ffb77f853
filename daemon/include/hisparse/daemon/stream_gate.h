// SessionStreamGate: what a Session stream may hold before it is a session.
//
// gRPC's sync server runs each Session stream on a thread of its own from the stream's start, and
// a stream is no session until its first message, `open`, arrives: no session limit counted it.
// Streams that never sent `open` held every thread the server may have (its ResourceQuota), and
// every caller, root and health probes included, was answered RESOURCE_EXHAUSTED (issue 39, item
// 2). The gate counts each stream from its start:
//   - every Session stream, opening or open, takes one of `max_streams` (limits.max_sessions) until
//     its handler returns, so streams hold at most that many of the server's 2 x max_sessions + 16
//     threads, and the rest stay free for unary calls, health checks and admins (daemon.cc);
//   - one uid may hold at most `max_opening_per_uid` streams that have not sent `open`
//     (limits.max_opening_sessions_per_peer); admins have no such cap;
//   - a stream's `open` must arrive within `open_timeout` (limits.session_open_timeout_ms): a
//     watchdog thread runs the stream's cancel callback (ServerContext::TryCancel, which ends the
//     handler's Read) when it has not.
// A stream over a bound is refused at once (RESOURCE_EXHAUSTED, naming the key), so it holds its
// thread no longer than the refusal takes.
//
// Thread-safe. One watchdog thread, from construction to destruction. A cancel callback runs on
// it under the gate's lock, and a ticket's Opened() and destructor take that lock: the stream a
// callback cancels (its ServerContext) cannot be gone while the callback runs. The callback must
// not call back into the gate.
#ifndef HISPARSE_DAEMON_STREAM_GATE_H_
#define HISPARSE_DAEMON_STREAM_GATE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace hisparse {

class SessionStreamGate {
 public:
  struct Limits {
    int max_streams = 256;                           // limits.max_sessions
    int max_opening_per_uid = 16;                    // limits.max_opening_sessions_per_peer
    absl::Duration open_timeout = absl::Seconds(5);  // limits.session_open_timeout_ms
  };

  // One admitted stream. Move-only; destroying it (when the handler returns) gives its place back.
  class Ticket {
   public:
    Ticket(Ticket&& other) noexcept { *this = std::move(other); }
    Ticket& operator=(Ticket&& other) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket();
    // The first message arrived (or the stream ended before it): the stream is no longer opening
    // and its deadline is off. False when the deadline had passed and the stream was cancelled.
    bool Opened();

   private:
    friend class SessionStreamGate;
    Ticket(SessionStreamGate* gate, uint64_t id, uint32_t uid, absl::Time deadline)
        : gate_(gate), id_(id), uid_(uid), deadline_(deadline) {}
    SessionStreamGate* gate_ = nullptr;  // null once moved from
    uint64_t id_ = 0;
    uint32_t uid_ = 0;
    absl::Time deadline_;
    bool opening_ = true;
    bool in_time_ = true;
  };

  explicit SessionStreamGate(Limits limits);
  ~SessionStreamGate();
  SessionStreamGate(const SessionStreamGate&) = delete;
  SessionStreamGate& operator=(const SessionStreamGate&) = delete;

  // Takes effect for streams that start from now on; streams already admitted keep their place
  // and their deadline.
  void SetLimits(const Limits& limits) ABSL_LOCKS_EXCLUDED(mu_);
  Limits limits() const ABSL_LOCKS_EXCLUDED(mu_);

  // Admits a stream of `uid` (`admin`: no opening cap): a ticket, or RESOURCE_EXHAUSTED saying
  // which bound it met. `cancel` runs (on the watchdog) if the ticket is not Opened() in time.
  absl::StatusOr<Ticket> Enter(uint32_t uid, bool admin, std::function<void()> cancel) ABSL_LOCKS_EXCLUDED(mu_);

  int streams() const ABSL_LOCKS_EXCLUDED(mu_);              // admitted streams, opening or open
  int opening(uint32_t uid) const ABSL_LOCKS_EXCLUDED(mu_);  // of them, `uid`'s still opening
  uint64_t timed_out() const ABSL_LOCKS_EXCLUDED(mu_);       // streams cancelled at their deadline

 private:
  using DeadlineKey = std::pair<absl::Time, uint64_t>;  // (deadline, ticket id)
  void Watch() ABSL_LOCKS_EXCLUDED(mu_);
  bool Opened(Ticket* t) ABSL_LOCKS_EXCLUDED(mu_);
  void Leave(Ticket* t) ABSL_LOCKS_EXCLUDED(mu_);
  void StopOpeningLocked(Ticket* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  absl::CondVar wake_;  // the watchdog's: an earlier deadline, or stop
  Limits limits_ ABSL_GUARDED_BY(mu_);
  int streams_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint32_t, int> opening_ ABSL_GUARDED_BY(mu_);              // uid -> opening streams
  std::map<DeadlineKey, std::function<void()>> deadlines_ ABSL_GUARDED_BY(mu_);  // opening streams' cancels
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t timed_out_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watchdog_;  // last: starts once the state above exists
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_STREAM_GATE_H_
