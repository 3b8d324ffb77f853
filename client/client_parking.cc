// ClientSession's park/resume and shared-prefix admission: see client_session.h.
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client_session.h"
#include "grpc_status.h"
#include "hisparse/common/status_macros.h"

namespace hisparse {

bool ClientSession::RowTakenLocked(uint32_t row, uint64_t except) const {
  for (const auto& [id, r] : requests_) {
    if (id != except && !r.parked && r.row == row) return true;
  }
  return false;
}

absl::Status ClientSession::Park(uint64_t request_id) {
  HS_RETURN_IF_ERROR(CheckAlive());
  v1::ParkRequest req;
  *req.mutable_session() = ref_;
  req.set_request_id(request_id);
  v1::ParkResponse resp;
  HS_RETURN_IF_ERROR(FromGrpc(stub_->Park(CallContext().get(), req, &resp), "park"));
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return absl::InternalError("parked a request this client does not know");
  it->second.parked = true;
  // Its slabs stay mapped (the pages are still the request's); the row leaves the host map
  // unless an Admit or Resume of another thread took it between the RPC and this lock.
  if (!RowTakenLocked(it->second.row, request_id)) HS_RETURN_IF_ERROR(PublishRow(it->second.row, nullptr));
  return absl::OkStatus();
}

absl::StatusOr<hs_request_info> ClientSession::Resume(uint64_t request_id) {
  HS_RETURN_IF_ERROR(CheckAlive());
  v1::ResumeRequest req;
  *req.mutable_session() = ref_;
  req.set_request_id(request_id);
  v1::ResumeResponse resp;
  HS_RETURN_IF_ERROR(FromGrpc(stub_->Resume(CallContext().get(), req, &resp), "resume"));
  absl::Status failed;
  {
    absl::MutexLock lock(&mu_);
    auto it = requests_.find(request_id);
    if (it == requests_.end()) return absl::InternalError("resumed a request this client does not know");
    if (resp.row() >= geometry_.max_requests()) {
      return absl::InternalError(absl::StrCat("the daemon resumed into row ", resp.row(), ", beyond the geometry's ",
                                              geometry_.max_requests()));
    }
    Request& r = it->second;
    // The row's slots hold whatever its last request left: they are EMPTIED, as for a fresh Admit,
    // so the first RESOLVE fetches what it selects from the pages the request kept.
    failed = PublishFreshRowLocked(resp.row(), r);
    if (failed.ok()) {
      r.row = resp.row();
      r.parked = false;
      hs_request_info info = HS_REQUEST_INFO_INIT;
      info.row = r.row;
      info.capacity_tokens = r.capacity;
      return info;
    }
  }
  // This process could not take the row: park the request again in the daemon too, so that both
  // sides hold it parked and a later Resume may retry.
  v1::ParkRequest park;
  *park.mutable_session() = ref_;
  park.set_request_id(request_id);
  v1::ParkResponse parked;
  absl::Status reparked = FromGrpc(stub_->Park(CallContext().get(), park, &parked), "park again");
  return absl::Status(failed.code(), absl::StrCat("resume request ", request_id, ": ", failed.message(),
                                                  reparked.ok() ? " (it stays parked)"
                                                                : absl::StrCat(" (and parking it again failed: ",
                                                                               reparked.message(), "; release it)")));
}

absl::StatusOr<hs_request_info> ClientSession::AdmitShared(uint64_t request_id, uint32_t context_tokens,
                                                           uint32_t token_budget, uint64_t parent_request_id,
                                                           uint32_t prefix_tokens) {
  HS_RETURN_IF_ERROR(CheckAlive());
  v1::AdmitRequest req;
  *req.mutable_session() = ref_;
  req.set_request_id(request_id);
  req.set_context_tokens(context_tokens);
  req.set_token_budget(token_budget);
  req.set_parent_request_id(parent_request_id);
  req.set_prefix_tokens(prefix_tokens);
  HS_ASSIGN_OR_RETURN(hs_request_info info, AdmitWith(req));
  // The shared pages become read-only in the parent's table too: the child reads them as they
  // are now.
  absl::MutexLock lock(&mu_);
  auto child = requests_.find(request_id);
  auto parent = requests_.find(parent_request_id);
  if (child == requests_.end() || parent == requests_.end()) return info;
  bool changed = false;
  for (size_t l = 0; l < child->second.layers.size() && l < parent->second.layers.size(); ++l) {
    auto& mine = parent->second.layers[l];
    const auto& theirs = child->second.layers[l];
    for (size_t i = 0; i < mine.size() && i < theirs.size(); ++i) {
      if (theirs[i].read_only() && !mine[i].read_only() && theirs[i].slab() == mine[i].slab() &&
          theirs[i].offset() == mine[i].offset()) {
        mine[i].set_read_only(true);
        changed = true;
      }
    }
  }
  if (changed && !parent->second.parked) {
    HS_RETURN_IF_ERROR(PublishRow(parent->second.row, &parent->second));
  }
  return info;
}

}  // namespace hisparse
