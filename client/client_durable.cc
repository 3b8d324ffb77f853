// ClientSession's durable requests (client_session.h; docs/DESIGN.md, "Durable requests"): a
// lease at admission or later, the list of what ended sessions of this tenant and engine name
// left, and their adoption. An adopted request is installed here parked (its slabs fetched over
// the fd channel, which now serves them to this session); Resume gives it a row.
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client_session.h"
#include "grpc_status.h"
#include "hisparse/common/status_macros.h"

namespace hisparse {
namespace {

// ListAdoptable's page: the daemon's largest (SessionManager::kMaxPageSize), few round trips.
constexpr uint32_t kAdoptablePageSize = 10000;

std::chrono::steady_clock::time_point LeaseEnd(double seconds) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace

void ClientSession::NoteLease(uint64_t request_id, double seconds) {
  absl::MutexLock lock(&mu_);
  if (seconds <= 0) {
    lease_end_.erase(request_id);
  } else if (requests_.contains(request_id)) {
    lease_end_[request_id] = LeaseEnd(seconds);
  }
}

absl::StatusOr<double> ClientSession::SetLease(uint64_t request_id, uint32_t lease_seconds) {
  HS_RETURN_IF_ERROR(CheckAlive());
  v1::SetLeaseRequest req;
  *req.mutable_session() = ref_;
  req.set_request_id(request_id);
  req.set_lease_seconds(lease_seconds);
  v1::SetLeaseResponse resp;
  HS_RETURN_IF_ERROR(FromGrpc(stub_->SetLease(CallContext().get(), req, &resp), "set lease"));
  NoteLease(request_id, resp.lease_seconds_left());
  return resp.lease_seconds_left();
}

absl::StatusOr<std::vector<v1::AdoptableRequest>> ClientSession::ListAdoptable() {
  HS_RETURN_IF_ERROR(CheckAlive());
  // The daemon answers a page at a time: every page, in order, for the caller. A daemon that
  // does not page answers everything at once with no next token.
  std::vector<v1::AdoptableRequest> all;
  v1::ListAdoptableRequest req;
  *req.mutable_session() = ref_;
  req.set_page_size(kAdoptablePageSize);
  do {
    v1::ListAdoptableResponse resp;
    HS_RETURN_IF_ERROR(FromGrpc(stub_->ListAdoptable(CallContext().get(), req, &resp), "list adoptable"));
    all.insert(all.end(), resp.requests().begin(), resp.requests().end());
    if (!resp.next_page_token().empty() && resp.next_page_token() == req.page_token()) {
      return absl::InternalError("list adoptable: the daemon handed out the same page token twice");
    }
    req.set_page_token(resp.next_page_token());
  } while (!req.page_token().empty());
  return all;
}

absl::StatusOr<std::vector<uint64_t>> ClientSession::Adopt(uint64_t dead_session_id) {
  HS_RETURN_IF_ERROR(CheckAlive());
  v1::AdoptRequest req;
  *req.mutable_session() = ref_;
  req.set_dead_session_id(dead_session_id);
  v1::AdoptResponse resp;
  HS_RETURN_IF_ERROR(FromGrpc(stub_->Adopt(CallContext().get(), req, &resp), "adopt"));
  SlabIds needed;  // every adopted request's slabs, mapped before the lock is taken
  for (const v1::AdoptedRequest& a : resp.requests()) {
    const SlabIds ids = SlabsOf(a.layers());
    needed.insert(ids.begin(), ids.end());
  }
  absl::StatusOr<std::vector<uint64_t>> out;
  WithSlabsLocked(needed, [&](const SlabErrors& errors) {
    mu_.AssertHeld();
    out = InstallAdoptedLocked(resp, errors);
  });
  return out;
}

absl::StatusOr<std::vector<uint64_t>> ClientSession::InstallAdoptedLocked(const v1::AdoptResponse& resp,
                                                                          const SlabErrors& errors) {
  std::vector<uint64_t> ids;
  for (const v1::AdoptedRequest& a : resp.requests()) {
    // Row 0 stands in: a parked request has none, and Resume publishes the one the daemon gives.
    absl::StatusOr<Request> r = InstallRequest(0, a.capacity_tokens(), a.layers(), errors);
    if (!r.ok()) {
      return absl::Status(
          r.status().code(),
          absl::StrCat("adopt: request ", a.request_id(), " (", ids.size(), " of ", resp.requests_size(),
                       " installed before it): ", r.status().message(),
                       "; the daemon holds it and those after it parked in this session: release them"));
    }
    r->parked = true;
    requests_[a.request_id()] = *std::move(r);
    lease_end_[a.request_id()] = LeaseEnd(a.lease_seconds_left());
    ids.push_back(a.request_id());
  }
  return ids;
}

}  // namespace hisparse
