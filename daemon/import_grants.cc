#include "hisparse/daemon/import_grants.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace hisparse {

std::string ShortGrantId(const std::string& grant_id) { return grant_id.substr(0, 6) + "..."; }

void ImportGrants::Open(const std::string& id, const Grant& grant) {
  Grant g = grant;
  g.busy = true;
  open_.emplace(id, g);
}

void ImportGrants::Publish(const std::string& id) { open_.at(id).busy = false; }

void ImportGrants::Forget(const std::string& id) { open_.erase(id); }

absl::Status ImportGrants::Check(const std::string& id, uint64_t session_id, uint64_t request_id,
                                 std::optional<uint32_t> caller_uid) const {
  if (id.empty()) return absl::InvalidArgumentError("grant_id is empty");
  auto it = open_.find(id);
  if (it == open_.end()) {
    auto spent = spent_.find(id);
    if (spent == spent_.end()) {
      return absl::NotFoundError(absl::StrCat("no import grant ", ShortGrantId(id), " (never issued, or long gone)"));
    }
    switch (spent->second.end) {
      case End::kCommitted:
        return absl::AlreadyExistsError(
            absl::StrCat("import grant ", ShortGrantId(id), " was committed already: a grant is used once"));
      case End::kExpired:
        return absl::FailedPreconditionError(
            absl::StrCat("import grant ", ShortGrantId(id), " expired (import.grant_ttl); its pages are free again"));
      case End::kAborted:
        return absl::FailedPreconditionError(
            absl::StrCat("import grant ", ShortGrantId(id), " was aborted; its pages are free again"));
    }
  }
  const Grant& g = it->second;
  if (g.session_id != session_id || g.request_id != request_id) {
    return absl::PermissionDeniedError(absl::StrCat("import grant ", ShortGrantId(id), " covers request ", g.request_id,
                                                    " of session ", g.session_id, ", not request ", request_id,
                                                    " of session ", session_id));
  }
  if (caller_uid.has_value() && *caller_uid != g.tenant_uid) {
    return absl::PermissionDeniedError(absl::StrCat("import grant ", ShortGrantId(id), " belongs to uid ", g.tenant_uid,
                                                    ", not to the caller's uid ", *caller_uid));
  }
  if (g.busy) {
    return absl::FailedPreconditionError(
        absl::StrCat("import grant ", ShortGrantId(id), " is being registered or finished right now"));
  }
  return absl::OkStatus();
}

void ImportGrants::MarkBusy(const std::string& id) { open_.at(id).busy = true; }

ImportGrants::Grant ImportGrants::Finish(const std::string& id, End end) {
  auto it = open_.find(id);
  const Grant g = it->second;
  open_.erase(it);
  ++ended_[static_cast<int>(end)];
  if (spent_order_.size() >= kSpent) {
    spent_.erase(spent_order_.front());
    spent_order_.pop_front();
  }
  spent_[id] = Spent{g.session_id, g.request_id, end};
  spent_order_.push_back(id);
  return g;
}

std::vector<std::string> ImportGrants::FinishAllOf(uint64_t session_id, End end) {
  std::vector<std::string> ids;
  for (const auto& [id, g] : open_) {
    if (g.session_id == session_id) ids.push_back(id);
  }
  for (const std::string& id : ids) Finish(id, end);
  return ids;
}

std::vector<ImportGrants::Ref> ImportGrants::Due(absl::Time now) const {
  std::vector<Ref> due;
  for (const auto& [id, g] : open_) {
    if (!g.busy && g.expires <= now) due.push_back({id, g.session_id, g.request_id});
  }
  return due;
}

std::vector<ImportGrants::Ref> ImportGrants::StillOpen(const std::vector<std::string>& ids) const {
  std::vector<Ref> open;
  for (const std::string& id : ids) {
    auto it = open_.find(id);
    if (it != open_.end()) open.push_back({id, it->second.session_id, it->second.request_id});
  }
  return open;
}

bool ImportGrants::AnyBusyOf(uint64_t session_id) const {
  for (const auto& [id, g] : open_) {
    if (g.session_id == session_id && g.busy) return true;
  }
  return false;
}

}  // namespace hisparse
