// Parking: preemption without re-prefill (parking.cc says how). A parked request gives its row of
// the session's arena back and keeps every host page; Resume gives it a free row, possibly
// another. A module over SessionCore (session_core.h) without state of its own: the state is the
// RequestTable's (kLive <-> kParked). Codes: the Park and Resume RPCs in hisparse.proto.
#ifndef HISPARSE_DAEMON_PARKING_H_
#define HISPARSE_DAEMON_PARKING_H_

#include "absl/status/statusor.h"
#include "hisparse/daemon/session_core.h"
#include "hisparse/v1/hisparse.pb.h"

namespace hisparse {

class Parking {
 public:
  using Session = SessionEntry;
  using Request = RequestEntry;
  static absl::StatusOr<v1::ParkResponse> Park(SessionCore& core, const v1::ParkRequest& req)
      ABSL_LOCKS_EXCLUDED(core.mu_);
  static absl::StatusOr<v1::ResumeResponse> Resume(SessionCore& core, const v1::ResumeRequest& req)
      ABSL_LOCKS_EXCLUDED(core.mu_);
  // Park and Resume of one found request of `s`, under `s`'s lock (or the node's mutex exclusively).
  static absl::StatusOr<v1::ParkResponse> ParkLocked(SessionCore& core, Session& s, Request& r)
      ABSL_SHARED_LOCKS_REQUIRED(core.mu_) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.ledger_mu_);
  static absl::StatusOr<v1::ResumeResponse> ResumeLocked(SessionCore& core, Session& s, Request& r)
      ABSL_SHARED_LOCKS_REQUIRED(core.mu_) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.ledger_mu_);
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_PARKING_H_
