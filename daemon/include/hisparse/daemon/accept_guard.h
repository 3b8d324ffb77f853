// What hisparsed's two acceptors (the fd channel's event loop, FdServer, and the control socket's
// PeerAcceptor) share: surviving accept(2) failures for want of descriptors, and logging refused
// connections without letting a flood of them flood the journal.
//
// AcceptGuard runs accept4 on a borrowed non-blocking listener. It holds one spare descriptor
// (the reserve). When accept fails with EMFILE / ENFILE (or ENOBUFS / ENOMEM), the channel is
// down: the guard reports it (on_serving_change(false)), closes the reserve, accepts the pending
// connection into the freed slot and closes it at once (the client sees the connection end instead
// of waiting in the backlog forever), and reopens the reserve. When even that fails, the listener
// is paused (the caller stops waiting on it) and retried with exponential backoff, 10 ms to 1 s.
// The channel is up again when a connection is accepted or a probe finds a descriptor free
// besides the reserve: on_serving_change(true).
//
// RateLimitedLog says whether to log now: at most one line per interval, the next one carrying the
// count of those suppressed. Both clocks are injected.
//
// Thread-safety: AcceptGuard is confined to its acceptor's thread (not thread-safe); its callback
// runs on that thread. RateLimitedLog is thread-safe.
#ifndef HISPARSE_DAEMON_ACCEPT_GUARD_H_
#define HISPARSE_DAEMON_ACCEPT_GUARD_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "hisparse/common/unique_fd.h"

namespace hisparse {

class RateLimitedLog {
 public:
  explicit RateLimitedLog(
      absl::Duration interval, std::function<absl::Time()> clock = [] { return absl::Now(); })
      : interval_(interval), clock_(std::move(clock)) {}
  // True when the caller should log this occurrence; *suppressed is then how many occurrences
  // since the last logged one were not.
  bool ShouldLog(uint64_t* suppressed) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const absl::Duration interval_;
  const std::function<absl::Time()> clock_;
  absl::Mutex mu_;
  absl::Time last_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t suppressed_ ABSL_GUARDED_BY(mu_) = 0;
};

// ", 12 more since the last line" for a count of suppressed lines; "" for none.
std::string SuppressedNote(uint64_t suppressed);

class AcceptGuard {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    std::string channel;                                  // "fd channel", "control socket": for logs
    std::function<void(bool serving)> on_serving_change;  // may be empty
    std::function<Clock::time_point()> now;               // the backoff's clock; empty: Clock::now
  };
  enum class Outcome {
    kAccepted,  // *conn holds a new connection
    kAgain,     // nothing accepted, but more may be pending: call Accept again
    kIdle,      // nothing pending: wait for the listener to become readable (at most WaitMs())
    kPaused,    // the listener is paused: do not wait on it; wait WaitMs(), then call Probe()
  };

  // `listener` is borrowed, must be non-blocking, and must outlive the guard.
  static absl::StatusOr<std::unique_ptr<AcceptGuard>> Create(int listener, Options options);

  Outcome Accept(UniqueFd* conn);
  // Accepts what is waiting, at most `max` connections, handing each to `admit(UniqueFd)`; returns
  // once nothing is pending, the listener is paused, `max` is reached or `keep_going()` is false.
  template <typename Admit, typename KeepGoing>
  void AcceptEach(int max, Admit&& admit, KeepGoing&& keep_going) {
    for (int i = 0; i < max && keep_going(); ++i) {
      UniqueFd conn;
      switch (Accept(&conn)) {
        case Outcome::kAccepted:
          admit(std::move(conn));
          break;
        case Outcome::kAgain:
          break;
        case Outcome::kIdle:
        case Outcome::kPaused:
          return;
      }
    }
  }
  // While the channel is down, checks whether it can serve again (call it once WaitMs() has
  // passed; earlier calls do nothing).
  void Probe();
  // How long the caller may block before calling Probe (milliseconds, for poll/epoll_wait);
  // -1 (forever) while serving.
  int WaitMs() const;
  bool serving() const { return serving_; }
  bool listener_paused() const { return paused_; }
  uint64_t shed() const { return shed_; }  // connections closed unserved for want of descriptors

 private:
  AcceptGuard(int listener, Options options, UniqueFd reserve)
      : listener_(listener), options_(std::move(options)), reserve_(std::move(reserve)) {}
  Outcome OutOfDescriptors();
  void SetServing(bool serving, const std::string& why);
  void ScheduleProbe();
  Clock::time_point Now() const { return options_.now ? options_.now() : Clock::now(); }

  int listener_;
  Options options_;
  UniqueFd reserve_;
  bool serving_ = true;
  bool paused_ = false;
  std::chrono::milliseconds backoff_{0};
  Clock::time_point next_probe_{};
  uint64_t shed_ = 0;
  RateLimitedLog shed_log_{absl::Seconds(1)};
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_ACCEPT_GUARD_H_
