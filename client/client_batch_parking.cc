// ClientSession's batched park and resume (client_session.h): one ParkBatch or ResumeBatch RPC
// for the batch; each item is then what a single Park or Resume does here (the row unpublished;
// the new row published and reset by PublishFreshRowLocked), and a resumed item this process
// cannot install is parked again in the daemon, as a single Resume does, with one more RPC.
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client_session.h"
#include "grpc_status.h"
#include "hisparse/common/status_macros.h"

namespace hisparse {
namespace {

absl::Status ItemError(const v1::ItemStatus& s, const char* verb, uint64_t request_id) {
  return absl::Status(static_cast<absl::StatusCode>(s.code()),
                      absl::StrCat(verb, " request ", request_id, ": ", s.message()));
}

template <typename BatchRequest>
BatchRequest MakeBatch(const v1::SessionRef& ref, const std::vector<uint64_t>& ids, bool all_or_nothing) {
  BatchRequest req;
  *req.mutable_session() = ref;
  req.set_mode(all_or_nothing ? v1::BATCH_MODE_ALL_OR_NOTHING : v1::BATCH_MODE_PER_ITEM);
  for (uint64_t id : ids) req.add_request_ids(id);
  return req;
}

}  // namespace

absl::StatusOr<ClientSession::BatchParked> ClientSession::ParkBatch(const std::vector<uint64_t>& request_ids,
                                                                    bool all_or_nothing) {
  HS_RETURN_IF_ERROR(CheckAlive());
  HS_ASSIGN_OR_RETURN(v1::ParkBatchResponse resp, ParkBatchRpc(request_ids, all_or_nothing));
  BatchParked out;
  out.failed_item = static_cast<int>(resp.failed_item()) - 1;
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < request_ids.size(); ++i) {
    const v1::ParkResult& result = resp.results(static_cast<int>(i));
    const uint64_t id = request_ids[i];
    if (result.has_error()) {
      out.items.push_back(ItemError(result.error(), "park", id));
      continue;
    }
    auto it = requests_.find(id);
    if (it == requests_.end()) {
      out.items.push_back(
          absl::InternalError(absl::StrCat("parked request ", id, ", which this client does not know")));
      continue;
    }
    it->second.parked = true;
    // As Park: the pages stay mapped; the row leaves the host map unless another request took it.
    out.items.push_back(RowTakenLocked(it->second.row, id) ? absl::OkStatus() : PublishRow(it->second.row, nullptr));
  }
  return out;
}

absl::StatusOr<ClientSession::BatchResumed> ClientSession::ResumeBatch(const std::vector<uint64_t>& request_ids,
                                                                       bool all_or_nothing) {
  HS_RETURN_IF_ERROR(CheckAlive());
  HS_ASSIGN_OR_RETURN(v1::ResumeBatchResponse resp,
                      ResumeBatchRpc(MakeBatch<v1::ResumeBatchRequest>(ref_, request_ids, all_or_nothing)));
  BatchResumed out;
  out.failed_item = static_cast<int>(resp.failed_item()) - 1;
  out.items.assign(request_ids.size(), absl::AbortedError("not resumed"));
  std::vector<uint64_t> repark;     // the daemon resumed them; this process could not take the row
  std::vector<size_t> failed_here;  // items whose install failed in this process
  {
    absl::MutexLock lock(&mu_);
    std::vector<size_t> installed;
    for (size_t i = 0; i < request_ids.size(); ++i) {
      const v1::ResumeResult& result = resp.results(static_cast<int>(i));
      const uint64_t id = request_ids[i];
      if (result.has_error()) {
        out.items[i] = ItemError(result.error(), "resume", id);
        continue;
      }
      if (all_or_nothing && out.failed_item >= 0) {  // after an item that failed here: not tried
        repark.push_back(id);
        continue;
      }
      absl::Status failed = InstallResumedLocked(id, result.resumed());
      if (!failed.ok()) {
        repark.push_back(id);
        failed_here.push_back(i);
        out.items[i] = absl::Status(failed.code(), absl::StrCat("resume request ", id, ": ", failed.message()));
        if (all_or_nothing) out.failed_item = static_cast<int>(i);
        continue;
      }
      installed.push_back(i);
      const Request& r = requests_.at(id);
      hs_request_info info = HS_REQUEST_INFO_INIT;
      info.row = r.row;
      info.capacity_tokens = r.capacity;
      out.items[i] = info;
    }
    if (all_or_nothing && out.failed_item >= 0) {
      const std::string why =
          absl::StrCat("items[", out.failed_item, "] (request ", request_ids[out.failed_item], ") failed the batch");
      for (size_t i = 0; i < request_ids.size(); ++i) {
        if (static_cast<int>(i) != out.failed_item)
          out.items[i] = absl::AbortedError(absl::StrCat("not resumed: ", why));
      }
      for (size_t i : installed) {
        Request& r = requests_.at(request_ids[i]);
        if (!RowTakenLocked(r.row, request_ids[i])) (void)PublishRow(r.row, nullptr);
        r.parked = true;
        repark.push_back(request_ids[i]);
      }
    }
  }
  if (!repark.empty()) {
    // Outside the lock, one RPC: both sides then hold them parked, and a later resume may retry.
    absl::StatusOr<v1::ParkBatchResponse> parked = ParkBatchRpc(repark, /*all_or_nothing=*/false);
    for (size_t i : failed_here) {
      absl::StatusOr<hs_request_info>& item = out.items[i];
      item = absl::Status(item.status().code(),
                          absl::StrCat(item.status().message(),
                                       parked.ok() ? " (it stays parked)"
                                                   : absl::StrCat(" (and parking it again failed: ",
                                                                  parked.status().message(), "; release it)")));
    }
  }
  return out;
}

absl::Status ClientSession::InstallResumedLocked(uint64_t request_id, const v1::ResumeResponse& resumed) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return absl::InternalError("resumed a request this client does not know");
  if (resumed.row() >= geometry_.max_requests()) {
    return absl::InternalError(absl::StrCat("the daemon resumed into row ", resumed.row(), ", beyond the geometry's ",
                                            geometry_.max_requests()));
  }
  Request& r = it->second;
  // As Resume: the row's slots are EMPTIED, as for a fresh Admit.
  HS_RETURN_IF_ERROR(PublishFreshRowLocked(resumed.row(), r));
  r.row = resumed.row();
  r.parked = false;
  return absl::OkStatus();
}

absl::StatusOr<v1::ParkBatchResponse> ClientSession::ParkBatchRpc(const std::vector<uint64_t>& request_ids,
                                                                  bool all_or_nothing) {
  const v1::ParkBatchRequest req = MakeBatch<v1::ParkBatchRequest>(ref_, request_ids, all_or_nothing);
  v1::ParkBatchResponse resp;
  HS_RETURN_IF_ERROR(Call(LaneVerb::kParkBatch, &v1::HiSparse::Stub::ParkBatch, req, &resp, "park batch"));
  if (static_cast<size_t>(resp.results_size()) != request_ids.size()) {
    return absl::InternalError(
        absl::StrCat("the daemon answered ", resp.results_size(), " results for ", request_ids.size(), " ids"));
  }
  return resp;
}

absl::StatusOr<v1::ResumeBatchResponse> ClientSession::ResumeBatchRpc(const v1::ResumeBatchRequest& req) {
  v1::ResumeBatchResponse resp;
  HS_RETURN_IF_ERROR(Call(LaneVerb::kResumeBatch, &v1::HiSparse::Stub::ResumeBatch, req, &resp, "resume batch"));
  if (resp.results_size() != req.request_ids_size()) {
    return absl::InternalError(
        absl::StrCat("the daemon answered ", resp.results_size(), " results for ", req.request_ids_size(), " ids"));
  }
  return resp;
}

}  // namespace hisparse
