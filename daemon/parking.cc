// Parking (parking.h): Park and Resume, preemption without re-prefill. Both are hot calls: the
// session's lock under the node's mutex held shared, then the ledger's (session_core.h, "Locks").
//
// A parked request gives its row of the session's slot arena back to the ledger (another request
// may take it) and keeps every host page, so resuming costs no prefill: the engine resets the new
// row's slot state (every slot EMPTY, as after Admit) and the first RESOLVE fetches what it
// selects from the pages the request kept. While parked it counts against its tenant's host
// bytes, pages and requests quotas (it is still a request the tenant holds, and a request that
// will later outlive its session must stay bounded by them), but not against the rows, which are
// bounded by the arena alone. Under admission.on_pool_full = evict_lru_idle a parked request is
// evicted before any live one (AdmissionLedger::PickVictim).
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/daemon/parking.h"

namespace hisparse {

absl::StatusOr<v1::ParkResponse> Parking::Park(SessionCore& core, const v1::ParkRequest& req) {
  HotSession hot(core, req.session());
  HS_ASSIGN_OR_RETURN(Session * s, hot.session());
  HS_ASSIGN_OR_RETURN(Request * r, SessionCore::RequestOf(*s, req.request_id()));
  absl::MutexLock ledger(&core.ledger_mu_);
  return ParkLocked(core, *s, *r);
}

absl::StatusOr<v1::ParkResponse> Parking::ParkLocked(SessionCore& /*core*/, Session& s, Request& r) {
  if (r.parked()) {
    return absl::FailedPreconditionError(absl::StrCat("request ", r.id, " is parked already"));
  }
  if (r.importing()) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", r.id, " is importing: its records are not there yet; park it after CommitImport"));
  }
  HS_RETURN_IF_ERROR(s.requests.Park(r));
  v1::ParkResponse resp;
  resp.set_row(r.row());
  return resp;
}

absl::StatusOr<v1::ResumeResponse> Parking::Resume(SessionCore& core, const v1::ResumeRequest& req) {
  HotSession hot(core, req.session());
  HS_ASSIGN_OR_RETURN(Session * s, hot.session());
  HS_ASSIGN_OR_RETURN(Request * r, SessionCore::RequestOf(*s, req.request_id()));
  absl::MutexLock ledger(&core.ledger_mu_);
  return ResumeLocked(core, *s, *r);
}

absl::StatusOr<v1::ResumeResponse> Parking::ResumeLocked(SessionCore& core, Session& s, Request& r) {
  if (!r.parked()) {
    return absl::FailedPreconditionError(absl::StrCat("request ", r.id, " is not parked (it holds row ", r.row(), ")"));
  }
  uint32_t row = 0;
  if (std::optional<Refusal> refusal = core.ledger_.FreeRow(s.id, &row)) {
    return core.Reject(Refusal{
        refusal->reason, absl::ResourceExhaustedError(absl::StrCat("cannot resume request ", r.id, ": ",
                                                                   refusal->status.message(), "; it stays parked"))});
  }
  HS_RETURN_IF_ERROR(s.requests.Resume(r, row));
  v1::ResumeResponse resp;
  resp.set_row(row);
  resp.set_capacity_tokens(r.capacity_tokens);
  return resp;
}

}  // namespace hisparse
