// ClientSession's imports from a prefill node: see client_session.h and docs/DESIGN.md, "Import".
// The request stays out of the data path (no page table published, no row reset) until the
// daemon says on the session stream that the transfer agent committed it.
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client_session.h"
#include "hisparse/common/status_macros.h"

namespace hisparse {

absl::StatusOr<hs_request_info> ClientSession::PendImportLocked(uint64_t request_id, v1::AdmitResponse resp) {
  if (!resp.has_grant() || resp.grant().request_id() != request_id) {
    return absl::InternalError("the daemon's import answer carries no grant for this request");
  }
  hs_request_info info = HS_REQUEST_INFO_INIT;
  info.row = resp.row();
  info.capacity_tokens = resp.capacity_tokens();
  PendingImport& p = imports_[request_id];  // ImportFinished may have come first
  p.admitted = true;
  p.admit = std::move(resp);
  return info;
}

absl::StatusOr<std::string> ClientSession::ImportGrant(uint64_t request_id) const {
  absl::MutexLock lock(&mu_);
  auto it = imports_.find(request_id);
  if (it == imports_.end() || !it->second.admitted) {
    return absl::NotFoundError(absl::StrCat("request ", request_id, " has no import pending here"));
  }
  return it->second.admit.grant().SerializeAsString();
}

void ClientSession::OnImportFinished(const v1::ImportFinished& finished) {
  absl::MutexLock lock(&mu_);
  PendingImport& p = imports_[finished.request_id()];
  p.finished = true;
  p.committed = finished.committed();
  p.reason = finished.reason();
}

absl::StatusOr<v1::AdmitResponse> ClientSession::AwaitImportOutcome(uint64_t request_id, uint32_t timeout_ms) {
  absl::MutexLock lock(&mu_);
  auto it = imports_.find(request_id);
  if (it == imports_.end() || !it->second.admitted) {
    return absl::NotFoundError(absl::StrCat("request ", request_id, " has no import pending here"));
  }
  const auto done = [this, request_id] {
    mu_.AssertHeld();
    auto found = imports_.find(request_id);
    return found == imports_.end() || found->second.finished || !alive_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(timeout_ms));
  it = imports_.find(request_id);
  if (it == imports_.end()) return absl::FailedPreconditionError("the import was released while awaited");
  PendingImport& p = it->second;
  if (!p.finished) {
    if (!alive_) return absl::UnavailableError("the session ended before the import finished");
    return absl::DeadlineExceededError(absl::StrCat("the import of request ", request_id, " has not finished yet"));
  }
  if (!p.committed) {
    const std::string reason = p.reason;
    imports_.erase(request_id);
    return absl::FailedPreconditionError(absl::StrCat("the import of request ", request_id, " ended without a commit (",
                                                      reason, "): the daemon freed the request"));
  }
  v1::AdmitResponse admit = std::move(p.admit);
  imports_.erase(request_id);
  return admit;
}

absl::StatusOr<hs_request_info> ClientSession::AwaitImport(uint64_t request_id, uint32_t timeout_ms) {
  HS_ASSIGN_OR_RETURN(v1::AdmitResponse admit, AwaitImportOutcome(request_id, timeout_ms));
  // Now as Admit: map the pages' slabs (outside the lock), publish the page table, reset the row;
  // what this process cannot install is released in the daemon too.
  absl::StatusOr<hs_request_info> info = InstallAdmitted(request_id, admit);
  if (!info.ok()) return ReleaseUninstalled({request_id}, info.status());
  return info;
}

}  // namespace hisparse
