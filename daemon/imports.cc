// Imports from a prefill node: the grants (imports.h and docs/DESIGN.md, "Import"). A request admitted with
// begin_import holds its pages and row like any other but is "importing": its pages are registered with the import
// target (UCX) under a grant, which the transfer agent presents to commit or abort. Until then the request cannot be
// extended or evicted; the engine's client publishes its page table only once it hears the commit.
//
// Lock discipline: the grant is checked and marked busy under the core's mutex; registration and
// revocation (transport calls) run outside it; the request is then made live or freed under it
// again, and the session is told outside it. A busy grant cannot be finished twice, and a session waits out
// its busy grants before it closes, so no page is freed while still registered.

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "hisparse/common/log.h"
#include "hisparse/common/secret.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/daemon/deferred_log.h"
#include "hisparse/daemon/imports.h"

namespace hisparse {

Imports::Imports(SessionCore& core, Admissions& admissions, Durability& durability)
    : core_(core), admissions_(admissions), durability_(durability) {}

void Imports::SetTarget(ImportTarget* target) {
  NodeLock lock(core_);
  target_ = target;
}

absl::StatusOr<v1::AdmitResponse> Imports::Admit(const v1::AdmitRequest& req) {
  if (req.lease_seconds() != 0) {  // before any import check: bad input, whatever the target
    NodeLock lock(core_);
    durability_.AssertHeld();
    return durability_.CheckLeaseLocked(req.lease_seconds(), /*importing=*/true);
  }
  v1::AdmitResponse resp;
  // A new slab for its pages is made with no lock held (SessionCore::WithSlabsOutsideLocks).
  absl::StatusOr<Opened> opened = core_.WithSlabsOutsideLocks([&](PagePool::SlabsOutsideLocks&) {
    NodeLock lock(core_);
    return OpenLocked(req, &resp);
  });
  if (!opened.ok()) return opened.status();
  const absl::Status registered = Register(*opened);
  DeferredLog log;  // written once the lock is released
  // The grant is busy: nobody else removes it, and its session waits for it before closing.
  NodeLock lock(core_);
  if (!registered.ok()) {
    DropLocked(*opened);
    return registered;
  }
  PublishLocked(*opened, &resp, log);
  return resp;
}

absl::StatusOr<Imports::Opened> Imports::OpenLocked(const v1::AdmitRequest& req, v1::AdmitResponse* resp) {
  Opened o;
  o.target = target_;
  if (o.target == nullptr) {
    return absl::FailedPreconditionError(
        "imports are off here: the daemon was built without UCX or import.enabled is false");
  }
  auto sit = core_.sessions_.find(req.session().session_id());
  if (sit != core_.sessions_.end() && sit->second->imports_closed) {
    return absl::FailedPreconditionError("the session is closing");
  }
  admissions_.AssertHeld();
  SessionCore::AdmitOutcome outcome = admissions_.AdmitLocked(req);  // an import never evicts to make room
  if (!outcome.result.ok()) return outcome.result.status();
  *resp = *std::move(outcome.result);
  Session& s = *core_.sessions_.at(req.session().session_id());
  Request& r = *s.requests.Find(req.request_id());
  o.pages = r.pages;
  o.pool = core_.pool_.get();
  o.grant_id = NewSecret128();
  o.session_id = s.id;
  o.request_id = r.id;
  o.page_bytes = core_.pool_->page_bytes();
  o.layout.num_layers = s.geometry.num_layers();
  o.layout.capacity_tokens = r.capacity_tokens;
  o.layout.records_per_page = s.records_per_page;
  o.layout.record_bytes = s.geometry.record_bytes();
  if (absl::Status st = s.requests.BeginImport(r, o.grant_id); !st.ok()) {  // kLive -> kImporting
    core_.ReleaseRequestLocked(s, r);
    return st;
  }
  const absl::Time now = core_.options_.clock ? core_.options_.clock() : absl::Now();
  // The target refuses writes by the real clock; the sweep (ExpireImports) goes by core_.options_.clock.
  o.expires = absl::Now() + core_.options_.import_grant_ttl;
  grants_.Open(o.grant_id, ImportGrants::Grant{s.id, r.id, s.tenant_uid, now + core_.options_.import_grant_ttl});
  v1::ImportGrant* g = resp->mutable_grant();
  g->set_grant_id(o.grant_id);
  g->set_session_id(s.id);
  g->set_request_id(r.id);
  g->set_num_layers(s.geometry.num_layers());
  g->set_capacity_tokens(r.capacity_tokens);
  g->set_records_per_page(s.records_per_page);
  g->set_record_bytes(s.geometry.record_bytes());
  g->set_expires_in_seconds(absl::ToDoubleSeconds(core_.options_.import_grant_ttl));
  return o;
}

absl::Status Imports::Register(const Opened& o) {
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

void Imports::DropLocked(const Opened& o) {
  grants_.Forget(o.grant_id);
  auto sit = core_.sessions_.find(o.session_id);
  core_.ReleaseRequestLocked(*sit->second, *sit->second->requests.Find(o.request_id));
}

void Imports::PublishLocked(const Opened& o, v1::AdmitResponse* resp, DeferredLog& log) {
  grants_.Publish(o.grant_id);
  v1::ImportGrant* g = resp->mutable_grant();
  g->set_worker_address(o.target->WorkerAddress());
  g->set_max_write_bytes(kMaxImportWriteBytes);
  DEFERRED_LOG(log, INFO) << "import grant " << ShortGrantId(o.grant_id) << " for request " << o.request_id
                          << " of session " << o.session_id << ": " << o.layout.num_layers << " layers of "
                          << o.layout.capacity_tokens << " positions, expires in "
                          << absl::FormatDuration(core_.options_.import_grant_ttl);
}

absl::Status Imports::Finish(const std::string& grant_id, uint64_t session_id, uint64_t request_id,
                             std::optional<uint32_t> caller_uid, Outcome outcome, const std::string& reason) {
  ImportTarget* target;
  {
    NodeLock lock(core_);
    HS_RETURN_IF_ERROR(grants_.Check(grant_id, session_id, request_id, caller_uid));
    grants_.MarkBusy(grant_id);
    target = target_;
  }
  // Revoked before anything else: from here on no write of the grant lands in these pages.
  target->Unregister(grant_id);
  std::shared_ptr<SessionEventSink> sink;
  v1::SessionEvent event;
  {
    NodeLock lock(core_);
    const bool commit = outcome == Outcome::kCommit;
    const ImportGrants::Grant g = grants_.Finish(grant_id, commit                        ? ImportGrants::End::kCommitted
                                                           : outcome == Outcome::kExpire ? ImportGrants::End::kExpired
                                                                                         : ImportGrants::End::kAborted);
    // A session waits out its busy grants before closing: the session and request are here.
    Session& s = *core_.sessions_.at(g.session_id);
    Request& r = *s.requests.Find(g.request_id);
    if (commit) {
      // kImporting -> kLive, used now (request_table.h); it is importing: the grant was open.
      if (absl::Status st = s.requests.CommitImport(r); !st.ok()) LOCKED_LOG(ERROR) << "accounting error: " << st;
    } else {
      core_.ReleaseRequestLocked(s, r);
    }
    sink = s.sink;
    v1::ImportFinished* f = event.mutable_import_finished();
    f->set_request_id(g.request_id);
    f->set_committed(commit);
    f->set_reason(reason);
  }
  LOCKED_LOG(INFO) << "import grant " << ShortGrantId(grant_id) << " of request " << request_id << " of session "
                   << session_id << ": " << reason;
  if (sink != nullptr && !(*sink)(event)) {
    NodeLock lock(core_);
    ++core_.undelivered_notices_;
  }
  return absl::OkStatus();
}

absl::Status Imports::Commit(const v1::CommitImportRequest& req, uint32_t caller_uid) {
  return Finish(req.grant_id(), req.session_id(), req.request_id(), caller_uid, Outcome::kCommit, "committed");
}

absl::Status Imports::Abort(const v1::AbortImportRequest& req, uint32_t caller_uid) {
  return Finish(req.grant_id(), req.session_id(), req.request_id(), caller_uid, Outcome::kAbort,
                absl::StrCat("aborted: ", req.reason().empty() ? "by the transfer agent" : req.reason()));
}

size_t Imports::Expire() {
  std::vector<ImportGrants::Ref> due;
  {
    NodeLock lock(core_);
    if (grants_.empty()) return 0;
    due = grants_.Due(core_.options_.clock ? core_.options_.clock() : absl::Now());
  }
  return FinishEach(due, Outcome::kExpire, "expired");
}

size_t Imports::AbortLost(const std::vector<std::string>& grant_ids, const std::string& reason) {
  std::vector<ImportGrants::Ref> lost;
  {
    NodeLock lock(core_);
    lost = grants_.StillOpen(grant_ids);
  }
  return FinishEach(lost, Outcome::kAbort, absl::StrCat("aborted: ", reason));
}

size_t Imports::FinishEach(const std::vector<ImportGrants::Ref>& grants, Outcome outcome, const std::string& reason) {
  size_t finished = 0;
  for (const ImportGrants::Ref& g : grants) {
    // A grant committed or aborted meanwhile is refused here, and stays as it ended.
    if (Finish(g.id, g.session_id, g.request_id, std::nullopt, outcome, reason).ok()) ++finished;
  }
  return finished;
}

std::optional<absl::Status> Imports::ReleaseIfImporting(const v1::ReleaseRequest& req) {
  std::string grant_id;
  {
    NodeLock lock(core_);
    auto sit = core_.sessions_.find(req.session().session_id());
    if (sit == core_.sessions_.end()) return std::nullopt;  // Release answers that
    const Request* r = sit->second->requests.Find(req.request_id());
    if (r == nullptr || !r->importing()) return std::nullopt;
    grant_id = r->import_grant();
  }
  return AbortReleased(grant_id, req.session().session_id(), req.request_id());
}

absl::Status Imports::AbortReleased(const std::string& grant_id, uint64_t session_id, uint64_t request_id) {
  // The caller is the session's owner (the service checked): no uid check here.
  return Finish(grant_id, session_id, request_id, std::nullopt, Outcome::kAbort, "aborted: released by the session");
}

void Imports::ForgetLocked(const std::string& grant_id) { grants_.Forget(grant_id); }

void Imports::FillStatsLocked(v1::StatsResponse* out) const {
  out->set_imports_committed(grants_.ended(ImportGrants::End::kCommitted));
  out->set_imports_aborted(grants_.ended(ImportGrants::End::kAborted));
  out->set_imports_expired(grants_.ended(ImportGrants::End::kExpired));
}

void Imports::RevokeOf(uint64_t session_id) {
  std::vector<std::string> revoked;
  ImportTarget* target;
  {
    // The node's mutex alone: Await releases it while busy grants finish, and no other lock may be
    // held meanwhile.
    absl::MutexLock lock(&core_.mu_);
    auto sit = core_.sessions_.find(session_id);
    if (sit == core_.sessions_.end()) return;
    sit->second->imports_closed = true;  // no new grant from here on (AdmitImport refuses)
    const auto none_busy = [this, session_id]() {
      core_.mu_.AssertHeld();
      return !grants_.AnyBusyOf(session_id);
    };
    core_.mu_.Await(absl::Condition(&none_busy));
    revoked = grants_.FinishAllOf(session_id, ImportGrants::End::kAborted);
    target = target_;
  }
  // The requests go with the session (CloseSession), after this.
  for (const std::string& id : revoked) target->Unregister(id);
}

}  // namespace hisparse
