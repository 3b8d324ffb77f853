// SharedPrefixes: a child request admitted over its parent's pages, and the bookkeeping that keeps
// both exact whichever is released first (shared_prefixes.cc says how). A module over SessionCore
// (session_core.h), without state of its own: who holds a shared page, and who pays for it, is each
// session's PageSharers (page_sharers.h).
#ifndef HISPARSE_DAEMON_SHARED_PREFIXES_H_
#define HISPARSE_DAEMON_SHARED_PREFIXES_H_

#include <cstdint>

#include "absl/status/status.h"
#include "hisparse/daemon/session_core.h"
#include "hisparse/v1/hisparse.pb.h"

namespace hisparse {

class SharedPrefixes {
 public:
  using Session = SessionEntry;
  using Request = RequestEntry;
  // Admit of a request naming a parent, after the core admission's own checks: the parent's full
  // prefix pages referenced, the rest fresh, the partial page's prefix records copied (a memcpy of
  // at most one page per layer, under the lock).
  static SessionCore::AdmitOutcome AdmitLocked(SessionCore& core, Session& s, const v1::AdmitRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu_, core.ledger_mu_);
  // Takes `r` out of its session's sharers before its pages are released: a page whose charged
  // holder it was is charged to the next holder.
  // Session-local: a hot Release runs it under its session's lock.
  static void UnshareLocked(SessionCore& core, Session& s, const Request& r) ABSL_SHARED_LOCKS_REQUIRED(core.mu_)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.ledger_mu_);
  // Pages of `r` that another request holds too.
  static uint64_t SharedPagesOf(const Session& s, const Request& r);
  // The sharing half of CheckInvariants for one session; `distinct` receives its distinct pages.
  static absl::Status CheckLocked(const SessionCore& core, const Session& s, uint64_t* distinct)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu_, core.ledger_mu_);
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_SHARED_PREFIXES_H_
