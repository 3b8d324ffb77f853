// Imports from a prefill node: SessionManager's grants (see session_manager.h and docs/DESIGN.md,
// "Import"). A request admitted with begin_import holds its pages and row like any other but is
// "importing": its pages are registered with the import target (UCX) under a grant, which the
// transfer agent presents to commit or abort. Until then the request cannot be extended or
// evicted; the engine's client publishes its page table only once it hears the commit.
//
// Lock discipline: the grant is checked and marked busy under mu_; registration and revocation
// (transport calls) run outside it; the request is then made live or freed under mu_ again, and
// the session is told outside it. A busy grant cannot be finished twice, and a session waits out
// its busy grants before it closes, so no page is freed while still registered.

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "hisparse/common/log.h"
#include "hisparse/common/secret.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/daemon/session_manager.h"

namespace hisparse {
namespace {

// Enough of a grant id to tell grants apart in messages and logs, never enough to use it.
std::string Short(const std::string& grant_id) { return grant_id.substr(0, 6) + "..."; }

}  // namespace

void SessionManager::SetImportTarget(ImportTarget* target) {
  absl::MutexLock lock(&mu_);
  import_target_ = target;
}

absl::StatusOr<v1::AdmitResponse> SessionManager::AdmitImport(const v1::AdmitRequest& req) {
  v1::AdmitResponse resp;
  absl::StatusOr<OpenedImport> opened;
  {
    absl::MutexLock lock(&mu_);
    opened = OpenImportLocked(req, &resp);
  }
  if (!opened.ok()) return opened.status();
  const absl::Status registered = RegisterImport(*opened);
  // The grant is busy: nobody else removes it, and its session waits for it before closing.
  absl::MutexLock lock(&mu_);
  if (!registered.ok()) {
    DropImportLocked(*opened);
    return registered;
  }
  PublishImportLocked(*opened, &resp);
  return resp;
}

absl::StatusOr<SessionManager::OpenedImport> SessionManager::OpenImportLocked(const v1::AdmitRequest& req,
                                                                              v1::AdmitResponse* resp) {
  OpenedImport o;
  o.target = import_target_;
  if (o.target == nullptr) {
    return absl::FailedPreconditionError(
        "imports are off here: the daemon was built without UCX or import.enabled is false");
  }
  auto sit = sessions_.find(req.session().session_id());
  if (sit != sessions_.end() && sit->second->imports_closed) {
    return absl::FailedPreconditionError("the session is closing");
  }
  AdmitOutcome outcome = AdmitLocked(req);  // an import never evicts to make room
  if (!outcome.result.ok()) return outcome.result.status();
  *resp = *std::move(outcome.result);
  Session& s = *sessions_.at(req.session().session_id());
  Request& r = *s.requests.Find(req.request_id());
  o.pages = r.pages;
  o.pool = pool_.get();
  o.grant_id = NewSecret128();
  o.session_id = s.id;
  o.request_id = r.id;
  o.page_bytes = pool_->page_bytes();
  o.layout.num_layers = s.geometry.num_layers();
  o.layout.capacity_tokens = r.capacity_tokens;
  o.layout.records_per_page = s.records_per_page;
  o.layout.record_bytes = s.geometry.record_bytes();
  if (absl::Status st = s.requests.BeginImport(r, o.grant_id); !st.ok()) {  // kLive -> kImporting
    ReleaseRequestLocked(s, r);
    return st;
  }
  const absl::Time now = options_.clock ? options_.clock() : absl::Now();
  // The target refuses writes by the real clock; the sweep (ExpireImports) goes by options_.clock.
  o.expires = absl::Now() + options_.import_grant_ttl;
  grants_.emplace(o.grant_id, Grant{s.id, r.id, s.tenant_uid, now + options_.import_grant_ttl, /*busy=*/true});
  v1::ImportGrant* g = resp->mutable_grant();
  g->set_grant_id(o.grant_id);
  g->set_session_id(s.id);
  g->set_request_id(r.id);
  g->set_num_layers(s.geometry.num_layers());
  g->set_capacity_tokens(r.capacity_tokens);
  g->set_records_per_page(s.records_per_page);
  g->set_record_bytes(s.geometry.record_bytes());
  g->set_expires_in_seconds(absl::ToDoubleSeconds(options_.import_grant_ttl));
  return o;
}

absl::Status SessionManager::RegisterImport(const OpenedImport& o) {
  ImportTarget::Grant g;
  g.layout = o.layout;
  g.page_bytes = o.page_bytes;
  g.expires = o.expires;
  absl::flat_hash_map<uint64_t, uint32_t> slab_index;  // pool slab id -> index in g.slabs
  for (const auto& layer : o.pages) {
    g.pages.emplace_back();
    g.pages.back().reserve(layer.size());
    for (const PagePool::Page& p : layer) {
      auto [it, added] = slab_index.emplace(p.slab, static_cast<uint32_t>(g.slabs.size()));
      if (added) {
        // The grant is busy, so its session (the slab's owner) waits for it before closing.
        ImportTarget::Slab slab;
        absl::StatusOr<UniqueFd> fd = o.pool->DupSlabFd(o.session_id, p.slab, &slab.bytes);
        if (!fd.ok()) {
          return absl::InternalError(
              absl::StrCat("a slab of the new import is not the session's: ", fd.status().ToString()));
        }
        slab.fd = *std::move(fd);
        g.slabs.push_back(std::move(slab));
      }
      g.pages.back().push_back(ChannelPageRef{it->second, uint64_t{p.index} * o.page_bytes});
    }
  }
  return o.target->Register(o.grant_id, std::move(g));
}

void SessionManager::DropImportLocked(const OpenedImport& o) {
  grants_.erase(o.grant_id);
  auto sit = sessions_.find(o.session_id);
  ReleaseRequestLocked(*sit->second, *sit->second->requests.Find(o.request_id));
}

void SessionManager::PublishImportLocked(const OpenedImport& o, v1::AdmitResponse* resp) {
  grants_.at(o.grant_id).busy = false;
  v1::ImportGrant* g = resp->mutable_grant();
  g->set_worker_address(o.target->WorkerAddress());
  g->set_max_write_bytes(kMaxImportWriteBytes);
  LOG(INFO) << "import grant " << Short(o.grant_id) << " for request " << o.request_id << " of session " << o.session_id
            << ": " << o.layout.num_layers << " layers of " << o.layout.capacity_tokens << " positions, expires in "
            << absl::FormatDuration(options_.import_grant_ttl);
}

absl::Status SessionManager::CheckGrantLocked(const std::string& grant_id, uint64_t session_id, uint64_t request_id,
                                              std::optional<uint32_t> caller_uid) const {
  if (grant_id.empty()) return absl::InvalidArgumentError("grant_id is empty");
  auto it = grants_.find(grant_id);
  if (it == grants_.end()) {
    auto spent = spent_grants_.find(grant_id);
    if (spent == spent_grants_.end()) {
      return absl::NotFoundError(absl::StrCat("no import grant ", Short(grant_id), " (never issued, or long gone)"));
    }
    switch (spent->second.end) {
      case GrantEnd::kCommitted:
        return absl::AlreadyExistsError(
            absl::StrCat("import grant ", Short(grant_id), " was committed already: a grant is used once"));
      case GrantEnd::kExpired:
        return absl::FailedPreconditionError(
            absl::StrCat("import grant ", Short(grant_id), " expired (import.grant_ttl); its pages are free again"));
      case GrantEnd::kAborted:
        return absl::FailedPreconditionError(
            absl::StrCat("import grant ", Short(grant_id), " was aborted; its pages are free again"));
    }
  }
  const Grant& g = it->second;
  if (g.session_id != session_id || g.request_id != request_id) {
    return absl::PermissionDeniedError(absl::StrCat("import grant ", Short(grant_id), " covers request ", g.request_id,
                                                    " of session ", g.session_id, ", not request ", request_id,
                                                    " of session ", session_id));
  }
  if (caller_uid.has_value() && *caller_uid != g.tenant_uid) {
    return absl::PermissionDeniedError(absl::StrCat("import grant ", Short(grant_id), " belongs to uid ", g.tenant_uid,
                                                    ", not to the caller's uid ", *caller_uid));
  }
  if (g.busy) {
    return absl::FailedPreconditionError(
        absl::StrCat("import grant ", Short(grant_id), " is being registered or finished right now"));
  }
  return absl::OkStatus();
}

void SessionManager::RememberSpentLocked(const std::string& grant_id, const Grant& g, GrantEnd end) {
  ++imports_ended_[static_cast<int>(end)];
  if (spent_order_.size() >= kSpentGrants) {
    spent_grants_.erase(spent_order_.front());
    spent_order_.pop_front();
  }
  spent_grants_[grant_id] = SpentGrant{g.session_id, g.request_id, end};
  spent_order_.push_back(grant_id);
}

absl::Status SessionManager::FinishImport(const std::string& grant_id, uint64_t session_id, uint64_t request_id,
                                          std::optional<uint32_t> caller_uid, ImportOutcome outcome,
                                          const std::string& reason) {
  ImportTarget* target;
  {
    absl::MutexLock lock(&mu_);
    HS_RETURN_IF_ERROR(CheckGrantLocked(grant_id, session_id, request_id, caller_uid));
    grants_.at(grant_id).busy = true;
    target = import_target_;
  }
  // Revoked before anything else: from here on no write of the grant lands in these pages.
  target->Unregister(grant_id);
  std::shared_ptr<EventSink> sink;
  v1::SessionEvent event;
  {
    absl::MutexLock lock(&mu_);
    auto git = grants_.find(grant_id);
    const Grant g = git->second;
    grants_.erase(git);
    const bool commit = outcome == ImportOutcome::kCommit;
    RememberSpentLocked(grant_id, g,
                        commit                              ? GrantEnd::kCommitted
                        : outcome == ImportOutcome::kExpire ? GrantEnd::kExpired
                                                            : GrantEnd::kAborted);
    // A session waits out its busy grants before closing: the session and request are here.
    Session& s = *sessions_.at(g.session_id);
    Request& r = *s.requests.Find(g.request_id);
    if (commit) {
      // kImporting -> kLive, used now (request_table.h); it is importing: the grant was open.
      if (absl::Status st = s.requests.CommitImport(r); !st.ok()) LOG(ERROR) << "accounting error: " << st;
    } else {
      ReleaseRequestLocked(s, r);
    }
    sink = s.sink;
    v1::ImportFinished* f = event.mutable_import_finished();
    f->set_request_id(g.request_id);
    f->set_committed(commit);
    f->set_reason(reason);
  }
  LOG(INFO) << "import grant " << Short(grant_id) << " of request " << request_id << " of session " << session_id
            << ": " << reason;
  if (sink != nullptr && !(*sink)(event)) {
    absl::MutexLock lock(&mu_);
    ++undelivered_notices_;
  }
  return absl::OkStatus();
}

absl::Status SessionManager::CommitImport(const v1::CommitImportRequest& req, uint32_t caller_uid) {
  return FinishImport(req.grant_id(), req.session_id(), req.request_id(), caller_uid, ImportOutcome::kCommit,
                      "committed");
}

absl::Status SessionManager::AbortImport(const v1::AbortImportRequest& req, uint32_t caller_uid) {
  return FinishImport(req.grant_id(), req.session_id(), req.request_id(), caller_uid, ImportOutcome::kAbort,
                      absl::StrCat("aborted: ", req.reason().empty() ? "by the transfer agent" : req.reason()));
}

size_t SessionManager::ExpireImports() {
  struct Due {
    std::string id;
    uint64_t session_id, request_id;
  };
  std::vector<Due> due;
  {
    absl::MutexLock lock(&mu_);
    if (grants_.empty()) return 0;
    const absl::Time now = options_.clock ? options_.clock() : absl::Now();
    for (const auto& [id, g] : grants_) {
      if (!g.busy && g.expires <= now) due.push_back({id, g.session_id, g.request_id});
    }
  }
  size_t expired = 0;
  for (const Due& d : due) {
    // A grant committed or aborted meanwhile is refused here, and stays as it ended.
    if (FinishImport(d.id, d.session_id, d.request_id, std::nullopt, ImportOutcome::kExpire, "expired").ok()) {
      ++expired;
    }
  }
  return expired;
}

size_t SessionManager::AbortLostImports(const std::vector<std::string>& grant_ids, const std::string& reason) {
  struct Lost {
    std::string id;
    uint64_t session_id, request_id;
  };
  std::vector<Lost> lost;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : grant_ids) {
      auto it = grants_.find(id);
      if (it != grants_.end()) lost.push_back({id, it->second.session_id, it->second.request_id});
    }
  }
  size_t aborted = 0;
  for (const Lost& l : lost) {
    if (FinishImport(l.id, l.session_id, l.request_id, std::nullopt, ImportOutcome::kAbort,
                     absl::StrCat("aborted: ", reason))
            .ok()) {
      ++aborted;
    }
  }
  return aborted;
}

std::optional<absl::Status> SessionManager::ReleaseIfImporting(const v1::ReleaseRequest& req) {
  std::string grant_id;
  {
    absl::MutexLock lock(&mu_);
    auto sit = sessions_.find(req.session().session_id());
    if (sit == sessions_.end()) return std::nullopt;  // Release answers that
    const Request* r = sit->second->requests.Find(req.request_id());
    if (r == nullptr || !r->importing()) return std::nullopt;
    grant_id = r->import_grant();
  }
  // The caller is the session's owner (the service checked): no uid check here.
  return FinishImport(grant_id, req.session().session_id(), req.request_id(), std::nullopt, ImportOutcome::kAbort,
                      "aborted: released by the session");
}

void SessionManager::RevokeImportsOf(uint64_t session_id) {
  std::vector<std::string> revoked;
  ImportTarget* target;
  {
    absl::MutexLock lock(&mu_);
    auto sit = sessions_.find(session_id);
    if (sit == sessions_.end()) return;
    sit->second->imports_closed = true;  // no new grant from here on (AdmitImport refuses)
    const auto none_busy = [this, session_id]() {
      mu_.AssertHeld();
      for (const auto& [id, g] : grants_) {
        if (g.session_id == session_id && g.busy) return false;
      }
      return true;
    };
    mu_.Await(absl::Condition(&none_busy));
    for (auto it = grants_.begin(); it != grants_.end();) {
      if (it->second.session_id != session_id) {
        ++it;
        continue;
      }
      RememberSpentLocked(it->first, it->second, GrantEnd::kAborted);
      revoked.push_back(it->first);
      grants_.erase(it++);
    }
    target = import_target_;
  }
  // The requests go with the session (CloseSession), after this.
  for (const std::string& id : revoked) target->Unregister(id);
}

}  // namespace hisparse
