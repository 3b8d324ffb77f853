// ClientSession's imports from a prefill node: see client_session.h and docs/DESIGN.md, "Import".
// The request stays out of the data path (no page table published, no row reset) until the
// daemon says on the session stream that the transfer agent committed it.
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client_session.h"
#include "hisparse/common/status_macros.h"

namespace hisparse {

absl::Status ClientSession::AdmitImport(uint64_t request_id, uint32_t context_tokens, uint32_t token_budget) {
  HS_RETURN_IF_ERROR(CheckAlive());
  v1::AdmitRequest req;
  *req.mutable_session() = ref_;
  req.set_request_id(request_id);
  req.set_context_tokens(context_tokens);
  req.set_token_budget(token_budget);
  req.set_begin_import(true);
  v1::AdmitResponse resp;
  if (grpc::Status s = stub_->Admit(CallContext().get(), req, &resp); !s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("admit import: ", s.error_message()));
  }
  absl::MutexLock lock(&mu_);
  return PendImportLocked(request_id, std::move(resp)).status();
}

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

absl::StatusOr<hs_request_info> ClientSession::AwaitImport(uint64_t request_id, uint32_t timeout_ms) {
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
  const v1::AdmitResponse admit = std::move(p.admit);
  imports_.erase(request_id);
  // Now as Admit: map the pages' slabs, publish the page table, reset the row (undone on failure).
  return InstallAdmitted(request_id, admit);
}

}  // namespace hisparse
