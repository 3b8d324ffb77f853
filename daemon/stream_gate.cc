#include "hisparse/daemon/stream_gate.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace hisparse {

SessionStreamGate::Ticket& SessionStreamGate::Ticket::operator=(Ticket&& other) noexcept {
  if (this == &other) return *this;
  if (gate_ != nullptr) gate_->Leave(this);
  gate_ = std::exchange(other.gate_, nullptr);
  id_ = other.id_;
  uid_ = other.uid_;
  deadline_ = other.deadline_;
  opening_ = other.opening_;
  in_time_ = other.in_time_;
  return *this;
}

SessionStreamGate::Ticket::~Ticket() {
  if (gate_ != nullptr) gate_->Leave(this);
}

bool SessionStreamGate::Ticket::Opened() { return gate_ == nullptr || gate_->Opened(this); }

SessionStreamGate::SessionStreamGate(Limits limits) : limits_(limits), watchdog_([this] { Watch(); }) {}

SessionStreamGate::~SessionStreamGate() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    wake_.Signal();
  }
  watchdog_.join();
}

void SessionStreamGate::SetLimits(const Limits& limits) {
  absl::MutexLock lock(&mu_);
  limits_ = limits;
}

SessionStreamGate::Limits SessionStreamGate::limits() const {
  absl::MutexLock lock(&mu_);
  return limits_;
}

absl::StatusOr<SessionStreamGate::Ticket> SessionStreamGate::Enter(uint32_t uid, bool admin,
                                                                   std::function<void()> cancel) {
  absl::MutexLock lock(&mu_);
  if (streams_ >= limits_.max_streams) {
    return absl::ResourceExhaustedError(absl::StrCat("the daemon holds ", streams_,
                                                     " Session streams, its limit (limits.max_sessions; a stream "
                                                     "counts from its start, before its `open`)"));
  }
  int& opening = opening_[uid];
  if (!admin && opening >= limits_.max_opening_per_uid) {
    const int held = opening;
    if (held == 0) opening_.erase(uid);
    return absl::ResourceExhaustedError(absl::StrCat("uid ", uid, " holds ", held,
                                                     " Session streams that have not sent `open`, its limit "
                                                     "(limits.max_opening_sessions_per_peer)"));
  }
  ++opening;
  ++streams_;
  const uint64_t id = next_id_++;
  const absl::Time deadline = absl::Now() + limits_.open_timeout;
  const bool earliest = deadlines_.empty() || DeadlineKey{deadline, id} < deadlines_.begin()->first;
  deadlines_.emplace(DeadlineKey{deadline, id}, std::move(cancel));
  if (earliest) wake_.Signal();
  return Ticket(this, id, uid, deadline);
}

void SessionStreamGate::StopOpeningLocked(Ticket* t) {
  if (!t->opening_) return;
  t->opening_ = false;
  t->in_time_ = deadlines_.erase(DeadlineKey{t->deadline_, t->id_}) == 1;  // else the watchdog took it
  auto it = opening_.find(t->uid_);
  if (it != opening_.end() && --it->second <= 0) opening_.erase(it);
}

bool SessionStreamGate::Opened(Ticket* t) {
  absl::MutexLock lock(&mu_);
  StopOpeningLocked(t);
  return t->in_time_;
}

void SessionStreamGate::Leave(Ticket* t) {
  absl::MutexLock lock(&mu_);
  StopOpeningLocked(t);
  --streams_;
}

void SessionStreamGate::Watch() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    if (deadlines_.empty()) {
      wake_.Wait(&mu_);
      continue;
    }
    const absl::Time next = deadlines_.begin()->first.first;
    if (absl::Now() < next) {
      wake_.WaitWithDeadline(&mu_, next);
      continue;
    }
    // Under the lock: the stream's ticket cannot leave (and its context go) meanwhile.
    auto node = deadlines_.extract(deadlines_.begin());
    ++timed_out_;
    if (node.mapped()) node.mapped()();
  }
}

int SessionStreamGate::streams() const {
  absl::MutexLock lock(&mu_);
  return streams_;
}

int SessionStreamGate::opening(uint32_t uid) const {
  absl::MutexLock lock(&mu_);
  auto it = opening_.find(uid);
  return it == opening_.end() ? 0 : it->second;
}

uint64_t SessionStreamGate::timed_out() const {
  absl::MutexLock lock(&mu_);
  return timed_out_;
}

}  // namespace hisparse
