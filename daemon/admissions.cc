// Admissions: a request admitted, extended, released or evicted (admissions.h).
#include "hisparse/daemon/admissions.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "hisparse/common/log.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/daemon/deferred_log.h"
#include "hisparse/daemon/durable_requests.h"
#include "hisparse/daemon/group_requests.h"
#include "hisparse/daemon/shared_prefixes.h"

namespace hisparse {

Admissions::Admissions(SessionCore& core, Durability& durability) : core_(core), durability_(durability) {}

// Admission: a request gets a free row of the session's arena and, for every layer, the pages
// that hold token_budget records. All or nothing. Order of checks: the session, draining,
// the request itself, the tenant's quotas, a free row, then the pool. With
// admission.on_pool_full = evict_lru_idle, a full pool evicts the same tenant's least recently
// admitted (or extended) request — its session is told first, outside the lock — and retries.
// A plain request (no group, no parent) is first tried hot: under its session's lock and the node's
// mutex held shared, so sessions do not wait on each other; the exclusive path below does the rest.
// A new slab the admission needs is made with no lock held (SessionCore::WithSlabsOutsideLocks).
absl::StatusOr<v1::AdmitResponse> Admissions::Admit(const v1::AdmitRequest& req) {
  return core_.WithSlabsOutsideLocks([&](PagePool::SlabsOutsideLocks&) { return AdmitOnce(req); });
}

absl::StatusOr<v1::AdmitResponse> Admissions::AdmitOnce(const v1::AdmitRequest& req) {
  if (!req.group() && req.parent_request_id() == 0 && req.prefix_tokens() == 0 && !req.begin_import()) {
    SessionCore::AdmitOutcome hot = AdmitHot(req);
    if (!hot.deferred) return std::move(hot.result);
  }
  constexpr int kMaxEvictionsPerAdmit = 64;
  for (int evictions = 0;; ++evictions) {
    SessionCore::Victim victim;
    {
      NodeLock lock(core_);
      SessionCore::AdmitOutcome outcome = AdmitLocked(req);
      if (outcome.result.ok() || !outcome.lacked_room || !core_.options_.evict_on_pool_full ||
          evictions == kMaxEvictionsPerAdmit) {
        return std::move(outcome.result);
      }
      // Only when evicting can make this admission succeed: else it fails with nothing evicted.
      auto it = core_.sessions_.find(req.session().session_id());
      if (evictions == 0 &&
          (it == core_.sessions_.end() ||
           !core_.EvictionCouldAdmitLocked(
               *it->second, core_.PagesFor(*it->second, req.token_budget()) * it->second->geometry.num_layers()))) {
        return std::move(outcome.result);
      }
      auto found = core_.PickVictimLocked(req.session().session_id());
      if (!found.has_value()) return std::move(outcome.result);
      // A shared prefix's parent is never evicted for its child: the admission fails instead.
      if (req.parent_request_id() != 0 && found->session_id == req.session().session_id() &&
          found->request_id == req.parent_request_id()) {
        return std::move(outcome.result);
      }
      victim = *found;
    }
    (void)core_.EvictVictim(victim, "evicted to admit another request of the same tenant (host pool full)");
  }
}

SessionCore::AdmitOutcome Admissions::AdmitHot(const v1::AdmitRequest& req) {
  HotSession hot(core_, req.session());
  if (!hot.session().ok()) return {hot.session().status()};
  Session& s = **hot.session();
  if (core_.draining_) {  // refused, and counted
    absl::MutexLock ledger(&core_.ledger_mu_);
    return {CheckRequestLocked(s, req)};
  }
  if (absl::Status checked = ValidRequest(s, req); !checked.ok()) return {checked};
  if (absl::Status checked = CheckOwnLocked(s, req); !checked.ok()) return {checked};
  // The pages are taken outside the ledger's lock, which is every session's. Under the caller's
  // SlabsOutsideLocks (Admit's) the pool gives only the session's own free pages or ready slabs
  // and touches no other owner's; a new slab is made outside every lock and the admission tried
  // again (Unavailable), but not for a request its quota refuses. Reserve checks the quota and a
  // row at the commit and gives the pages back if refused, in the same order of refusals.
  const uint64_t total = SessionCore::PagesFor(s, req.token_budget()) * s.geometry.num_layers();
  absl::StatusOr<std::vector<PagePool::Page>> taken =
      total > UINT32_MAX ? absl::ResourceExhaustedError("more pages than any pool")  // Reserve refuses it first
                         : core_.pool_unlocked_->Allocate(s.id, static_cast<uint32_t>(total));
  if (absl::IsUnavailable(taken.status())) {
    absl::MutexLock ledger(&core_.ledger_mu_);
    return {UnlessRefusedLocked(taken.status(), CheckReserve(core_.ledger_, ReserveSpec{s.id, {s.id}, s.id, total}))};
  }
  Committed committed;
  {
    absl::MutexLock ledger(&core_.ledger_mu_);
    // A want of room always goes to the exclusive path: other sessions' pages taken a moment ago
    // may be on their way back, and only there is the pool still.
    committed = CommitOwnLocked(s, req, /*defer_room=*/true, &taken);
    if (committed.request == nullptr) return std::move(committed.refused);
  }
  return {AnswerLocked(s, committed)};
}

SessionCore::AdmitOutcome Admissions::AdmitLocked(const v1::AdmitRequest& req) {
  absl::StatusOr<Session*> found = core_.FindLocked(req.session());
  if (!found.ok()) return {found.status()};
  Session* s = *found;
  if (absl::Status checked = CheckRequestLocked(*s, req); !checked.ok()) return {checked};
  if (req.group()) {
    if (req.lease_seconds() != 0) {
      return {absl::InvalidArgumentError(
          "lease_seconds with group: a TP-group request is never durable (its pages are the group's, which no "
          "adopter could take over)")};
    }
    return GroupRequests::AdmitLocked(core_, *s, req);
  }
  if (absl::Status checked = CheckOwnLocked(*s, req); !checked.ok()) return {checked};
  if (req.parent_request_id() != 0 || req.prefix_tokens() != 0) return SharedPrefixes::AdmitLocked(core_, *s, req);
  Committed committed = CommitOwnLocked(*s, req, /*defer_room=*/false, /*taken=*/nullptr);
  if (committed.request == nullptr) return std::move(committed.refused);
  return {AnswerLocked(*s, committed)};
}

absl::Status Admissions::CheckRequestLocked(const Session& s, const v1::AdmitRequest& req) {
  if (core_.draining_) {
    return core_.Reject(RejectReason::kDraining,
                        absl::FailedPreconditionError("the daemon is draining: no new admissions"));
  }
  return ValidRequest(s, req);
}

absl::Status Admissions::ValidRequest(const Session& s, const v1::AdmitRequest& req) {
  if (req.request_id() == 0) return absl::InvalidArgumentError("request_id must be non-zero");
  HS_RETURN_IF_ERROR(SessionCore::CheckBudget(s, req.token_budget()));
  if (req.context_tokens() > req.token_budget()) {
    return absl::InvalidArgumentError(
        absl::StrCat("context_tokens (", req.context_tokens(), ") exceeds token_budget (", req.token_budget(), ")"));
  }
  return absl::OkStatus();
}

absl::Status Admissions::CheckOwnLocked(const Session& s, const v1::AdmitRequest& req) {
  if (s.requests.contains(req.request_id())) {
    return absl::AlreadyExistsError(absl::StrCat("request ", req.request_id(), " is already admitted in this session"));
  }
  durability_.AssertReaderHeld();
  return durability_.CheckLeaseLocked(req.lease_seconds(), req.begin_import());
}

Admissions::Committed Admissions::CommitOwnLocked(Session& s, const v1::AdmitRequest& req, bool defer_room,
                                                  absl::StatusOr<std::vector<PagePool::Page>>* taken) {
  // Charged in whole pages. Reserve (the quota, a row, the pages), then commit.
  const uint64_t total = core_.PagesFor(s, req.token_budget()) * s.geometry.num_layers();
  ReserveOutcome reserved = Reserve(core_.ledger_, core_.pages_, ReserveSpec{s.id, {s.id}, s.id, total}, taken);
  Committed out;
  if (!reserved.reservation.has_value()) {
    if (defer_room && reserved.lacked_room) {
      out.refused = {std::move(reserved.status), true, /*deferred=*/true};
    } else {
      out.refused = core_.RefusedLocked(std::move(reserved));
    }
    return out;
  }
  out.pages = reserved.reservation->TakePages();
  Request r;
  r.id = req.request_id();
  r.admitted_at = absl::Now();
  r.capacity_tokens = req.token_budget();
  r.charged_pages = total;
  r.lease_end = DurableRequests::LeaseEnd(core_.Now(), req.lease_seconds());
  out.request = &s.requests.Admit(std::move(r), reserved.reservation->rows()[0]);
  ++core_.admissions_;
  return out;
}

v1::AdmitResponse Admissions::AnswerLocked(Session& s, const Committed& committed) {
  // One allocation for every layer, split in layer order: a fresh slab gives each layer
  // consecutive pages.
  Request& r = *committed.request;
  core_.TouchedLocked(s, r);  // the journal's own lock, after the ledger's on the hot path
  const uint64_t per_layer = committed.pages.size() / s.geometry.num_layers();
  for (uint32_t layer = 0; layer < s.geometry.num_layers(); ++layer) {
    r.pages.emplace_back(committed.pages.begin() + layer * per_layer,
                         committed.pages.begin() + (layer + 1) * per_layer);
  }
  return core_.AdmitAnswerLocked(s, r);
}

// Extend appends pages to every layer (after the layer's last page where that page's slab has the
// next pages free) and never moves a record: the engine's tables keep every page they had. All or
// nothing: a full pool leaves the request exactly as it was. Hot (the session's lock and the node's
// mutex shared) but for a TP group's request, whose Extend grows every rank's share.
absl::StatusOr<v1::ExtendResponse> Admissions::Extend(const v1::ExtendRequest& req) {
  return core_.WithSlabsOutsideLocks([&](PagePool::SlabsOutsideLocks&) { return ExtendOnce(req); });
}

absl::StatusOr<v1::ExtendResponse> Admissions::ExtendOnce(const v1::ExtendRequest& req) {
  {
    HotSession hot(core_, req.session());
    HS_ASSIGN_OR_RETURN(Session * s, hot.session());
    HS_ASSIGN_OR_RETURN(Request * r, SessionCore::RequestOf(*s, req.request_id()));
    HS_RETURN_IF_ERROR(NotImporting(*r));
    if (!r->in_group) {
      HS_ASSIGN_OR_RETURN(const uint64_t extra, ExtraPages(*s, *r, req));
      // The pages first, outside the ledger's lock; without room the exclusive path answers, where
      // the pool is still.
      absl::StatusOr<Layers> added = core_.TakeLayerPages(s->id, r->pages, extra);
      if (absl::IsUnavailable(added.status())) {
        absl::MutexLock ledger(&core_.ledger_mu_);
        return UnlessRefusedLocked(added.status(), core_.ledger_.CheckGrow(s->id, extra * r->pages.size(), 0));
      }
      if (added.ok()) {
        {
          absl::MutexLock ledger(&core_.ledger_mu_);
          if (std::optional<Refusal> refusal = core_.ledger_.CheckGrow(s->id, extra * r->pages.size(), 0)) {
            (void)core_.pool_unlocked_->ReleaseAll(s->id, *added);
            return core_.Reject(*std::move(refusal));
          }
          core_.ledger_.Touch(s->id, r->id);
          CommitExtendLocked(*s, *r, req.token_budget(), extra, *added);
        }
        return ExtendAnswerLocked(*s, *r);
      }
    }
  }
  NodeLock lock(core_);
  HS_ASSIGN_OR_RETURN(Session * s, core_.FindLocked(req.session()));
  HS_ASSIGN_OR_RETURN(Request * r, SessionCore::RequestOf(*s, req.request_id()));
  HS_RETURN_IF_ERROR(NotImporting(*r));                   // the lock was dropped: it may be another one now
  if (!r->in_group) return ExtendOwnLocked(*s, *r, req);  // no room above, or released and admitted again
  return GroupRequests::ExtendLocked(core_, *s, *r, req);
}

absl::Status Admissions::NotImporting(const Request& r) {
  if (!r.importing()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("request ", r.id, " is importing: extend it after CommitImport"));
}

absl::StatusOr<uint64_t> Admissions::ExtraPages(const Session& s, const Request& r, const v1::ExtendRequest& req) {
  HS_RETURN_IF_ERROR(SessionCore::CheckBudget(s, req.token_budget()));
  if (req.token_budget() <= r.capacity_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("token_budget (", req.token_budget(),
                                                   ") must exceed the current capacity (", r.capacity_tokens, ")"));
  }
  return SessionCore::PagesFor(s, req.token_budget()) - r.pages[0].size();
}

absl::Status Admissions::UnlessRefusedLocked(absl::Status wanted, std::optional<Refusal> refusal) {
  if (!refusal.has_value()) return wanted;
  PagePool::SlabsOutsideLocks::DropWant();
  return core_.Reject(*std::move(refusal));
}

void Admissions::CommitExtendLocked(Session& s, Request& r, uint32_t token_budget, uint64_t extra,
                                    const Layers& added) {
  for (size_t layer = 0; layer < r.pages.size(); ++layer) {
    r.pages[layer].insert(r.pages[layer].end(), added[layer].begin(), added[layer].end());
  }
  r.capacity_tokens = token_budget;
  r.charged_pages += extra * r.pages.size();
  core_.ledger_.SetPages(s.id, r.id, r.charged_pages);
}

v1::ExtendResponse Admissions::ExtendAnswerLocked(const Session& s, const Request& r) {
  core_.TouchedLocked(s, r);  // the journal's own lock, after the ledger's on the hot path
  v1::ExtendResponse resp;
  resp.set_capacity_tokens(r.capacity_tokens);
  resp.set_moved(false);
  core_.FillLayers(s, r, resp.mutable_layers());
  return resp;
}

absl::StatusOr<v1::ExtendResponse> Admissions::ExtendOwnLocked(Session& s, Request& r, const v1::ExtendRequest& req) {
  HS_ASSIGN_OR_RETURN(const uint64_t extra, ExtraPages(s, r, req));
  if (std::optional<Refusal> refusal = core_.ledger_.CheckGrow(s.id, extra * r.pages.size(), 0)) {
    return core_.Reject(*std::move(refusal));
  }
  core_.ledger_.Touch(s.id, r.id);
  absl::StatusOr<Layers> added = core_.TakeLayerPages(s.id, r.pages, extra);
  if (absl::IsResourceExhausted(added.status())) return core_.Reject(RejectReason::kPoolFull, added.status());
  HS_RETURN_IF_ERROR(added.status());
  CommitExtendLocked(s, r, req.token_budget(), extra, *added);
  return ExtendAnswerLocked(s, r);
}

std::optional<absl::Status> Admissions::ReleaseHot(const v1::ReleaseRequest& req) {
  HotSession hot(core_, req.session());
  const absl::StatusOr<Session*>& s = hot.session();
  if (!s.ok()) return s.status();
  absl::StatusOr<Request*> r = SessionCore::RequestOf(**s, req.request_id());
  if (!r.ok()) return r.status();
  if ((*r)->importing() || (*r)->in_group) return std::nullopt;  // an abort, or every rank's pages
  core_.ReleasePagesLocked(**s, **r);                            // the pool's own lock, not the ledger's
  core_.TouchedLocked(**s, **r);                                 // a Forget, when the journal holds it
  absl::MutexLock ledger(&core_.ledger_mu_);
  core_.ForgetOwnLocked(**s, **r);
  return absl::OkStatus();
}

absl::Status Admissions::Release(const v1::ReleaseRequest& req) {
  NodeLock lock(core_);
  HS_ASSIGN_OR_RETURN(Session * s, core_.FindLocked(req.session()));
  HS_ASSIGN_OR_RETURN(Request * r, SessionCore::RequestOf(*s, req.request_id()));
  core_.ReleaseRequestLocked(*s, *r);
  return absl::OkStatus();
}

// Eviction by an operator: the session hears of it before its memory is released.
absl::StatusOr<v1::EvictResponse> Admissions::Evict(const v1::EvictRequest& req, std::optional<uint32_t> only_uid) {
  SessionCore::Victim v;
  DeferredLog log;  // written once the lock is released
  {
    NodeLock lock(core_);
    durability_.AssertHeld();
    if (durability_.orphans().contains(req.session_id())) return durability_.EvictOrphanLocked(req, only_uid, log);
    auto it = core_.sessions_.find(req.session_id());
    if (it != core_.sessions_.end() && only_uid.has_value() && it->second->tenant_uid != *only_uid) {
      return absl::PermissionDeniedError(
          absl::StrCat("session ", req.session_id(), " belongs to another tenant; only an admin may evict from it"));
    }
    if (it == core_.sessions_.end() || !it->second->requests.contains(req.request_id())) {
      return absl::NotFoundError(absl::StrCat("no request ", req.request_id(), " in session ", req.session_id()));
    }
    const Request& r = *it->second->requests.Find(req.request_id());
    if (r.importing()) {
      return absl::FailedPreconditionError(
          absl::StrCat("request ", req.request_id(), " is importing: abort its import (AbortImport) instead"));
    }
    v = SessionCore::Victim{req.session_id(), req.request_id(), r.generation, it->second->sink};
  }
  HS_ASSIGN_OR_RETURN(uint64_t freed,
                      core_.EvictVictim(v, req.reason().empty() ? "evicted by an operator" : req.reason()));
  v1::EvictResponse resp;
  resp.set_freed_bytes(freed);
  return resp;
}

}  // namespace hisparse
