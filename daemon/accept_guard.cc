#include "hisparse/daemon/accept_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "hisparse/common/log.h"

namespace hisparse {
namespace {

constexpr std::chrono::milliseconds kMinBackoff{10};
constexpr std::chrono::milliseconds kMaxBackoff{1000};

UniqueFd OpenReserve() { return UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC)); }

}  // namespace

bool RateLimitedLog::ShouldLog(uint64_t* suppressed) {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  if (now - last_ < interval_) {
    ++suppressed_;
    return false;
  }
  *suppressed = std::exchange(suppressed_, 0);
  last_ = now;
  return true;
}

std::string SuppressedNote(uint64_t suppressed) {
  return suppressed == 0 ? std::string() : absl::StrCat(" (", suppressed, " more since the last such line)");
}

absl::StatusOr<std::unique_ptr<AcceptGuard>> AcceptGuard::Create(int listener, Options options) {
  UniqueFd reserve = OpenReserve();
  if (!reserve.valid()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(options.channel, ": cannot open its reserve descriptor: ", std::strerror(errno)));
  }
  return std::unique_ptr<AcceptGuard>(new AcceptGuard(listener, std::move(options), std::move(reserve)));
}

AcceptGuard::Outcome AcceptGuard::Accept(UniqueFd* conn) {
  if (paused_) return Outcome::kPaused;
  const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd >= 0) {
    conn->Reset(fd);
    SetServing(true, "a connection was accepted");
    return Outcome::kAccepted;
  }
  const int err = errno;
  switch (err) {
    case EAGAIN:
      return Outcome::kIdle;
    case EINTR:
    case ECONNABORTED:
    case EPROTO:
      return Outcome::kAgain;
    case EMFILE:
    case ENFILE:
    case ENOBUFS:
    case ENOMEM:
      return OutOfDescriptors();
    default:
      // Not a known transient: pause and retry with backoff rather than spin or give up for good.
      SetServing(false, absl::StrCat("accept failed: ", std::strerror(err)));
      paused_ = true;
      return Outcome::kPaused;
  }
}

AcceptGuard::Outcome AcceptGuard::OutOfDescriptors() {
  const int err = errno;
  SetServing(false, absl::StrCat("accept failed: ", std::strerror(err)));
  if (reserve_.valid()) {
    // The reserve's slot takes the pending connection, which is closed at once: its client learns
    // now, instead of waiting in the backlog, and the listener stops being readable.
    reserve_.Reset();
    UniqueFd pending(::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC));
    const bool consumed = pending.valid();
    pending.Reset();
    reserve_ = OpenReserve();
    if (consumed) {
      ++shed_;
      uint64_t suppressed = 0;
      if (shed_log_.ShouldLog(&suppressed)) {
        LOG(WARNING) << options_.channel << ": out of descriptors (" << std::strerror(err)
                     << "): closed a connection unserved" << SuppressedNote(suppressed);
      }
    }
    if (reserve_.valid()) return consumed ? Outcome::kAgain : Outcome::kIdle;
  }
  // Someone else took the slot: wait on the clock, not on the listener, so as not to spin.
  paused_ = true;
  return Outcome::kPaused;
}

void AcceptGuard::Probe() {
  if (serving_ && !paused_) return;
  if (Now() < next_probe_) return;
  if (!reserve_.valid()) reserve_ = OpenReserve();
  if (reserve_.valid()) {
    paused_ = false;
    // Serving needs a descriptor besides the reserve (the connection's own).
    UniqueFd spare(::fcntl(reserve_.get(), F_DUPFD_CLOEXEC, 0));
    if (spare.valid()) {
      SetServing(true, "descriptors are free again");
      return;
    }
  }
  ScheduleProbe();
}

int AcceptGuard::WaitMs() const {
  if (serving_ && !paused_) return -1;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(next_probe_ - Now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

void AcceptGuard::ScheduleProbe() {
  backoff_ = backoff_.count() == 0 ? kMinBackoff : std::min(backoff_ * 2, kMaxBackoff);
  next_probe_ = Now() + backoff_;
}

void AcceptGuard::SetServing(bool serving, const std::string& why) {
  if (serving == serving_) return;
  serving_ = serving;
  if (serving) {
    backoff_ = std::chrono::milliseconds(0);
    LOG(INFO) << options_.channel << " serves again (" << why << ")";
  } else {
    ScheduleProbe();
    LOG(WARNING) << options_.channel << " cannot accept (" << why << "): health is NOT_SERVING until it can";
  }
  if (options_.on_serving_change) options_.on_serving_change(serving);
}

}  // namespace hisparse
