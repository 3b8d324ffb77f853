// ClientSession's batched admission (client_session.h): AdmitBatch / ReleaseBatch, and the install,
// uninstall and release-after-failed-install steps that single Admit shares. One RPC per batch;
// the mapping of each admitted request's slabs (outside the lock, client_slabs.cc) and its
// page-table row are exactly Admit's (InstallAdmittedLocked), and so is the release of what this
// process could not install (ReleaseUninstalled).
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "admit_args.h"
#include "client_session.h"
#include "grpc_status.h"
#include "hisparse/common/status_macros.h"

namespace hisparse {
namespace {

absl::Status ItemError(const v1::ItemStatus& s, uint64_t request_id) {
  return absl::Status(static_cast<absl::StatusCode>(s.code()),
                      absl::StrCat("admit request ", request_id, ": ", s.message()));
}

}  // namespace

absl::Status ClientSession::PublishFreshRowLocked(uint32_t row, const Request& r) {
  absl::Status status = PublishRow(row, &r);
  if (status.ok()) status = backend_->ResetRow(arena_, static_cast<int32_t>(row), nullptr);
  // A row left published with slots the request never filled would let a RESOLVE read another
  // request's slots as its own: unpublish it again.
  if (!status.ok()) (void)PublishRow(row, nullptr);
  return status;
}

absl::StatusOr<hs_request_info> ClientSession::InstallAdmitted(uint64_t request_id, const v1::AdmitResponse& resp) {
  absl::StatusOr<hs_request_info> out = absl::InternalError("not installed");
  std::vector<Slab> retired;  // released after the lock
  WithSlabsLocked(SlabsOf(resp.layers()), [&](const SlabErrors& errors) {
    mu_.AssertHeld();
    out = InstallAdmittedLocked(request_id, resp, errors, &retired);
  });
  return out;
}

absl::StatusOr<hs_request_info> ClientSession::InstallAdmittedLocked(uint64_t request_id, const v1::AdmitResponse& resp,
                                                                     const SlabErrors& errors,
                                                                     std::vector<Slab>* retired) {
  auto r = InstallRequest(resp.row(), resp.capacity_tokens(), resp.layers(), errors);
  if (!r.ok()) return r.status();
  if (absl::Status status = PublishFreshRowLocked(r->row, *r); !status.ok()) {
    DropSlabs(*r, retired);
    return status;
  }
  hs_request_info info = HS_REQUEST_INFO_INIT;
  info.row = r->row;
  info.capacity_tokens = r->capacity;
  requests_[request_id] = std::move(*r);
  return info;
}

absl::Status ClientSession::UninstallLocked(uint64_t request_id, std::vector<Slab>* retired) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return absl::OkStatus();
  // A parked request's old row may be another request's now: leave it alone.
  absl::Status cleared = it->second.parked ? absl::OkStatus() : PublishRow(it->second.row, nullptr);
  DropSlabs(it->second, retired);
  requests_.erase(it);
  lease_end_.erase(request_id);
  return cleared;
}

absl::Status ClientSession::ReleaseUninstalled(const std::vector<uint64_t>& request_ids, const absl::Status& failed) {
  if (request_ids.empty()) return failed;
  // Should this fail too (the daemon gone), the session's end releases them.
  absl::StatusOr<v1::ReleaseBatchResponse> released = ReleaseBatchRpc(request_ids);
  if (released.ok()) return failed;
  return absl::Status(failed.code(),
                      absl::StrCat(failed.message(), " (and releasing the ", request_ids.size(),
                                   " requests the daemon admitted failed: ", released.status().message(), ")"));
}

absl::StatusOr<ClientSession::BatchAdmitted> ClientSession::AdmitBatch(const std::vector<hs_admit_args>& items,
                                                                       bool all_or_nothing) {
  for (size_t i = 0; i < items.size(); ++i) HS_RETURN_IF_ERROR(CheckBatchAdmitArgs(items[i], i));
  HS_RETURN_IF_ERROR(CheckAlive());
  v1::AdmitBatchRequest req;
  *req.mutable_session() = ref_;
  req.set_mode(all_or_nothing ? v1::BATCH_MODE_ALL_OR_NOTHING : v1::BATCH_MODE_PER_ITEM);
  for (const hs_admit_args& item : items) {
    v1::AdmitItem* it = req.add_items();
    it->set_request_id(item.request_id);
    it->set_context_tokens(item.context_tokens);
    it->set_token_budget(item.token_budget);
    it->set_begin_import((item.flags & HS_ADMIT_IMPORT) != 0);
    it->set_lease_seconds(item.lease_seconds);
  }
  v1::AdmitBatchResponse resp;
  HS_RETURN_IF_ERROR(Call(LaneVerb::kAdmitBatch, &v1::HiSparse::Stub::AdmitBatch, req, &resp, "admit batch"));
  if (static_cast<size_t>(resp.results_size()) != items.size()) {
    return absl::InternalError(
        absl::StrCat("the daemon answered ", resp.results_size(), " results for a batch of ", items.size(), " items"));
  }
  SlabIds needed;  // of every item to install: mapped before the lock is taken for the batch
  for (size_t i = 0; i < items.size(); ++i) {
    const v1::AdmitResult& result = resp.results(static_cast<int>(i));
    if (result.has_admitted() && (items[i].flags & HS_ADMIT_IMPORT) == 0) {
      const SlabIds ids = SlabsOf(result.admitted().layers());
      needed.insert(ids.begin(), ids.end());
    }
  }
  BatchAdmitted out;
  out.items.assign(items.size(), absl::AbortedError("not admitted"));
  out.failed_item = static_cast<int>(resp.failed_item()) - 1;
  std::vector<uint64_t> to_release;  // the daemon admitted them; this process could not keep them
  std::vector<Slab> retired;         // released after the lock
  WithSlabsLocked(needed, [&](const SlabErrors& errors) {
    mu_.AssertHeld();
    InstallBatchLocked(items, resp, all_or_nothing, errors, &out, &to_release, &retired);
  });
  for (size_t i = 0; i < items.size(); ++i) {
    if (out.items[i].ok() && items[i].lease_seconds != 0) NoteLease(items[i].request_id, items[i].lease_seconds);
  }
  if (out.failed_item >= 0) {
    absl::StatusOr<hs_request_info>& failed = out.items[out.failed_item];
    failed = ReleaseUninstalled(to_release, failed.status());
  } else {
    (void)ReleaseUninstalled(to_release, absl::OkStatus());  // PER_ITEM: each failed item says why
  }
  return out;
}

void ClientSession::InstallBatchLocked(const std::vector<hs_admit_args>& items, const v1::AdmitBatchResponse& resp,
                                       bool all_or_nothing, const SlabErrors& errors, BatchAdmitted* out,
                                       std::vector<uint64_t>* to_release, std::vector<Slab>* retired) {
  std::vector<size_t> installed;
  for (size_t i = 0; i < items.size(); ++i) {
    const v1::AdmitResult& result = resp.results(static_cast<int>(i));
    const uint64_t id = items[i].request_id;
    if (result.has_error()) {
      out->items[i] = ItemError(result.error(), id);
      continue;
    }
    if (all_or_nothing && out->failed_item >= 0) {
      to_release->push_back(id);  // after an item that failed here: not tried
      continue;
    }
    absl::StatusOr<hs_request_info> info = (items[i].flags & HS_ADMIT_IMPORT)
                                               ? PendImportLocked(id, result.admitted())
                                               : InstallAdmittedLocked(id, result.admitted(), errors, retired);
    if (!info.ok()) {
      to_release->push_back(id);
      out->items[i] =
          absl::Status(info.status().code(), absl::StrCat("admit request ", id, ": ", info.status().message()));
      if (all_or_nothing) out->failed_item = static_cast<int>(i);
      continue;
    }
    installed.push_back(i);
    out->items[i] = *info;
  }
  if (!all_or_nothing || out->failed_item < 0) return;
  const std::string why =
      absl::StrCat("items[", out->failed_item, "] (request ", items[out->failed_item].request_id, ") failed the batch");
  for (size_t i = 0; i < items.size(); ++i) {
    if (static_cast<int>(i) != out->failed_item)
      out->items[i] = absl::AbortedError(absl::StrCat("not admitted: ", why));
  }
  for (size_t i : installed) {
    imports_.erase(items[i].request_id);
    (void)UninstallLocked(items[i].request_id, retired);  // its row is the daemon's to hand out again
    to_release->push_back(items[i].request_id);
  }
}

absl::StatusOr<v1::ReleaseBatchResponse> ClientSession::ReleaseBatchRpc(const std::vector<uint64_t>& request_ids) {
  v1::ReleaseBatchRequest req;
  *req.mutable_session() = ref_;
  for (uint64_t id : request_ids) req.add_request_ids(id);
  v1::ReleaseBatchResponse resp;
  HS_RETURN_IF_ERROR(Call(LaneVerb::kReleaseBatch, &v1::HiSparse::Stub::ReleaseBatch, req, &resp, "release batch"));
  if (static_cast<size_t>(resp.results_size()) != request_ids.size()) {
    return absl::InternalError(
        absl::StrCat("the daemon answered ", resp.results_size(), " results for ", request_ids.size(), " ids"));
  }
  return resp;
}

absl::StatusOr<std::vector<absl::Status>> ClientSession::ReleaseBatch(const std::vector<uint64_t>& request_ids) {
  HS_RETURN_IF_ERROR(CheckAlive());
  HS_ASSIGN_OR_RETURN(v1::ReleaseBatchResponse resp, ReleaseBatchRpc(request_ids));
  std::vector<absl::Status> out;
  out.reserve(request_ids.size());
  std::vector<Slab> retired;  // released after the lock
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < request_ids.size(); ++i) {
    const v1::ItemStatus& s = resp.results(static_cast<int>(i));
    if (s.code() != 0) {
      out.push_back(absl::Status(static_cast<absl::StatusCode>(s.code()),
                                 absl::StrCat("release request ", request_ids[i], ": ", s.message())));
      continue;
    }
    out.push_back(UninstallLocked(request_ids[i], &retired));
  }
  return out;
}

}  // namespace hisparse
