// ClientSession::Admit: the one admission (client_session.h; hs_admit_args in hisparse.h). Every
// single admission of the C ABI and the Python package comes here: plain, with a shared prefix,
// durable, for the TP group, importing. One AdmitRequest carries the options; the answer is
// installed as AdmitBatch installs each item (InstallAdmitted), and what this process cannot
// install is released in the daemon as AdmitBatch releases it (ReleaseUninstalled): an admission
// never stays in the daemon when the caller was told it failed.
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "admit_args.h"
#include "client_session.h"
#include "grpc_status.h"
#include "hisparse/common/status_macros.h"

namespace hisparse {

absl::StatusOr<hs_request_info> ClientSession::Admit(uint64_t request_id, uint32_t context_tokens,
                                                     uint32_t token_budget) {
  hs_admit_args args = HS_ADMIT_ARGS_INIT;
  args.request_id = request_id;
  args.context_tokens = context_tokens;
  args.token_budget = token_budget;
  return Admit(args);
}

absl::StatusOr<hs_request_info> ClientSession::Admit(const hs_admit_args& a) {
  HS_RETURN_IF_ERROR(CheckAdmitArgs(a));
  HS_RETURN_IF_ERROR(CheckAlive());
  const bool import = (a.flags & HS_ADMIT_IMPORT) != 0;
  v1::AdmitRequest req;
  *req.mutable_session() = ref_;
  req.set_request_id(a.request_id);
  req.set_context_tokens(a.context_tokens);
  req.set_token_budget(a.token_budget);
  req.set_parent_request_id(a.parent_request_id);
  req.set_prefix_tokens(a.prefix_tokens);
  req.set_lease_seconds(a.lease_seconds);
  req.set_group((a.flags & HS_ADMIT_GROUP) != 0);
  req.set_begin_import(import);
  v1::AdmitResponse resp;
  HS_RETURN_IF_ERROR(Call(LaneVerb::kAdmit, &v1::HiSparse::Stub::Admit, req, &resp, import ? "admit import" : "admit"));
  absl::StatusOr<hs_request_info> info = absl::InternalError("not installed");
  if (import) {
    absl::MutexLock lock(&mu_);
    info = PendImportLocked(a.request_id, std::move(resp));
  } else {
    info = InstallAdmitted(a.request_id, resp);
  }
  if (!info.ok()) return ReleaseUninstalled({a.request_id}, info.status());
  if (a.lease_seconds != 0) NoteLease(a.request_id, a.lease_seconds);
  if (a.parent_request_id != 0) HS_RETURN_IF_ERROR(SealSharedPrefix(a.request_id, a.parent_request_id));
  return info;
}

absl::Status ClientSession::SealSharedPrefix(uint64_t request_id, uint64_t parent_request_id) {
  // The shared pages become read-only in the parent's table too: the child reads them as they
  // are now.
  absl::MutexLock lock(&mu_);
  auto child = requests_.find(request_id);
  auto parent = requests_.find(parent_request_id);
  if (child == requests_.end() || parent == requests_.end()) return absl::OkStatus();
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
  if (changed && !parent->second.parked) return PublishRow(parent->second.row, &parent->second);
  return absl::OkStatus();
}

}  // namespace hisparse
