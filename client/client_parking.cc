// ClientSession's park and resume: see client_session.h.
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
  HS_RETURN_IF_ERROR(Call(LaneVerb::kPark, &v1::HiSparse::Stub::Park, req, &resp, "park"));
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
  HS_RETURN_IF_ERROR(Call(LaneVerb::kResume, &v1::HiSparse::Stub::Resume, req, &resp, "resume"));
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
  absl::Status reparked = Call(LaneVerb::kPark, &v1::HiSparse::Stub::Park, park, &parked, "park again");
  return absl::Status(failed.code(), absl::StrCat("resume request ", request_id, ": ", failed.message(),
                                                  reparked.ok() ? " (it stays parked)"
                                                                : absl::StrCat(" (and parking it again failed: ",
                                                                               reparked.message(), "; release it)")));
}

}  // namespace hisparse
