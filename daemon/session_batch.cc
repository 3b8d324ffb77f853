// SessionManager::AdmitBatch and ReleaseBatch: one call for the N requests an engine schedules in a
// step. Part of SessionManager (session_manager.h). Each item is what a single Admit or Release of
// it would do (AdmitLocked, ReleaseRequestLocked, with the same checks and messages); the batch
// adds one lock for all of them, the duplicate check, and, for ALL_OR_NOTHING, the rollback.
//
// What the batch counts (Stats.admissions, .rejections, .rejections_by_reason):
//  - PER_ITEM counts what the same items sent as single Admits, in order, would: an admitted item
//    one admission, a refused item its refusal (a full pool once per try, as Admit counts when it
//    evicts and tries again). Invalid input, as for Admit, is no refusal and counts nothing.
//  - ALL_OR_NOTHING that admits every item counts N admissions. One that fails counts no
//    admission (the items before the failing one were rolled back: they never were admitted) and
//    the failing item's refusal once, as a single Admit of that item would have.
// A rollback returns every page to the pool and every row to the ledger: the pool's used pages and
// the ledger are as before the call. Slabs the pool made for the batch stay the session's, idle
// (its next admission reuses them; another session's allocation may reclaim them), as after an
// admitted request is released.
//
// Eviction (admission.on_pool_full = evict_lru_idle): ALL_OR_NOTHING never evicts. A batch that
// does not fit fails with RESOURCE_EXHAUSTED and takes nothing from anyone: evicting for a batch
// that may fail later anyway would destroy requests for nothing, and an engine that wants room can
// release its own first. PER_ITEM evicts for an item as Admit would (the tenant's least recently
// used request, its session told first, outside the lock), except a request this same batch
// admitted: an item that only that could make room for fails with RESOURCE_EXHAUSTED.
//
// Import items (AdmitItem.begin_import) are admitted and their grants opened (busy) under the
// batch's lock, as AdmitImport's first step; their pages are registered with the import target
// after it, outside the lock, one grant after another, and the grants are published under the
// lock once more (FinishBatchImports). An import item never evicts. ALL_OR_NOTHING whose
// registration fails for one item revokes every grant the batch registered (Unregister, before
// any page goes) and then rolls the whole batch back as above; until then the batch's other items
// are admitted in the daemon (listed, counted), as between two single Admits. PER_ITEM: an item
// whose registration fails is freed and carries the error.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "batch_items.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/daemon/session_manager.h"

namespace hisparse {
namespace {

using batch::SeenIds;
using batch::SetItemStatus;

v1::AdmitRequest SingleAdmit(const v1::SessionRef& session, const v1::AdmitItem& item) {
  v1::AdmitRequest one;
  *one.mutable_session() = session;
  one.set_request_id(item.request_id());
  one.set_context_tokens(item.context_tokens());
  one.set_token_budget(item.token_budget());
  one.set_begin_import(item.begin_import());
  one.set_lease_seconds(item.lease_seconds());
  return one;
}

}  // namespace

absl::StatusOr<v1::AdmitBatchResponse> SessionManager::AdmitBatch(const v1::AdmitBatchRequest& req) {
  const FlushJournalOnReturn flush{this};       // a durable request's change is journaled before the answer
  const NotifyDeparturesOnReturn notify{this};  // an allocation may retire another session's idle slab
  HS_RETURN_IF_ERROR(batch::CheckSize(req.items_size(), kMaxBatchItems, "items"));
  HS_RETURN_IF_ERROR(batch::CheckMode(req.mode()));
  BatchImports opened;
  v1::AdmitBatchResponse resp;
  if (req.mode() == v1::BATCH_MODE_PER_ITEM) {
    HS_ASSIGN_OR_RETURN(resp, AdmitEachItem(req, &opened));
  } else {
    absl::MutexLock lock(&mu_);
    HS_ASSIGN_OR_RETURN(Session * s, FindLocked(req.session()));
    resp = AdmitAllOrNothingLocked(*s, req, &opened);
  }
  if (!opened.empty()) FinishBatchImports(req, opened, &resp);
  return resp;
}

SessionManager::AdmitOutcome SessionManager::AdmitItemLocked(const v1::AdmitRequest& one, int index,
                                                             BatchImports* opened) {
  if (!one.begin_import()) return AdmitLocked(one);
  // As Admit: a lease with begin_import is bad input, whatever the import target.
  if (one.lease_seconds() != 0) return {durable_.CheckLease(one.lease_seconds(), /*importing=*/true)};
  v1::AdmitResponse resp;
  absl::StatusOr<OpenedImport> o = OpenImportLocked(one, &resp);
  if (!o.ok()) return {o.status()};  // no lacked_room: an import never evicts
  opened->emplace_back(index, *std::move(o));
  return {std::move(resp)};
}

void SessionManager::UndoBatchItemLocked(Session& s, uint64_t request_id) {
  Request* r = s.requests.Find(request_id);
  if (r == nullptr) return;                               // released meanwhile (FinishBatchImports runs in two locks)
  if (r->importing()) grants_.Forget(r->import_grant());  // not registered (now)
  ReleaseRequestLocked(s, *r);
  --admissions_;
}

void SessionManager::FailAllOrNothingLocked(Session& s, const v1::AdmitBatchRequest& req, int failed,
                                            const absl::Status& why, v1::AdmitBatchResponse* resp) {
  // Roll back, in reverse: every page to the pool, every row to the ledger, no admission counted.
  for (int j = resp->results_size() - 1; j >= 0; --j) {
    if (resp->results(j).has_admitted()) UndoBatchItemLocked(s, req.items(j).request_id());
  }
  for (int j = 0; j < req.items_size(); ++j) {
    v1::AdmitResult* result = j < resp->results_size() ? resp->mutable_results(j) : resp->add_results();
    result->set_request_id(req.items(j).request_id());
    SetItemStatus(j == failed ? why : batch::Aborted(j, failed, req.items(failed).request_id(), "rolled back"),
                  result->mutable_error());
  }
  resp->set_admitted(0);
  resp->set_failed_item(static_cast<uint32_t>(failed) + 1);
}

v1::AdmitBatchResponse SessionManager::AdmitAllOrNothingLocked(Session& s, const v1::AdmitBatchRequest& req,
                                                               BatchImports* opened) {
  v1::AdmitBatchResponse resp;
  SeenIds seen;
  for (int i = 0; i < req.items_size(); ++i) {
    const v1::AdmitItem& item = req.items(i);
    v1::AdmitResult* result = resp.add_results();
    result->set_request_id(item.request_id());
    absl::Status failed = seen.Add(item.request_id(), i);
    if (failed.ok()) {
      AdmitOutcome outcome = AdmitItemLocked(SingleAdmit(req.session(), item), i, opened);
      if (outcome.result.ok()) {
        *result->mutable_admitted() = *std::move(outcome.result);
        continue;
      }
      failed = outcome.result.status();
    }
    FailAllOrNothingLocked(s, req, i, failed, &resp);  // frees the opened grants too: none registered
    opened->clear();
    return resp;
  }
  resp.set_admitted(static_cast<uint32_t>(req.items_size()));
  return resp;
}

void SessionManager::FinishBatchImports(const v1::AdmitBatchRequest& req, const BatchImports& opened,
                                        v1::AdmitBatchResponse* resp) {
  // Outside the lock: each grant is busy (nobody finishes it, the session waits for it).
  std::vector<absl::Status> regions;
  int failed = -1;  // the first import whose registration failed
  for (size_t k = 0; k < opened.size(); ++k) {
    regions.push_back(RegisterImport(opened[k].second));
    if (!regions.back().ok() && failed < 0) failed = static_cast<int>(k);
  }
  const bool all_or_nothing = req.mode() == v1::BATCH_MODE_ALL_OR_NOTHING;
  if (all_or_nothing && failed >= 0) {
    // Revoked before any page goes: no grant of the batch outlives it at the target.
    for (size_t k = 0; k < opened.size(); ++k) {
      if (regions[k].ok()) opened[k].second.target->Unregister(opened[k].second.grant_id);
    }
  }
  absl::MutexLock lock(&mu_);
  Session& s = *sessions_.at(req.session().session_id());  // it waits for the busy grants
  if (all_or_nothing && failed >= 0) {
    FailAllOrNothingLocked(s, req, opened[failed].first, regions[failed], resp);
    return;
  }
  uint32_t admitted = resp->admitted();
  for (size_t k = 0; k < opened.size(); ++k) {
    v1::AdmitResult* result = resp->mutable_results(opened[k].first);
    if (regions[k].ok()) {
      PublishImportLocked(opened[k].second, result->mutable_admitted());
      continue;
    }
    DropImportLocked(opened[k].second);
    SetItemStatus(regions[k], result->mutable_error());
    --admitted;
  }
  resp->set_admitted(admitted);
}

std::optional<SessionManager::Victim> SessionManager::BatchVictimLocked(
    const Session& s, const v1::AdmitItem& item, int evictions, const absl::flat_hash_set<uint64_t>& batch) const {
  constexpr int kMaxEvictionsPerItem = 64;  // as Admit's
  if (!options_.evict_on_pool_full || evictions == kMaxEvictionsPerItem || item.begin_import()) return std::nullopt;
  // As Admit: only when evicting can make this admission succeed.
  if (evictions == 0 && !EvictionCouldAdmitLocked(s, PagesFor(s, item.token_budget()) * s.geometry.num_layers())) {
    return std::nullopt;
  }
  std::optional<Victim> victim = PickVictimLocked(s.id);
  if (victim.has_value() && victim->session_id == s.id && batch.contains(victim->request_id)) return std::nullopt;
  return victim;
}

absl::StatusOr<v1::AdmitBatchResponse> SessionManager::AdmitEachItem(const v1::AdmitBatchRequest& req,
                                                                     BatchImports* opened) {
  v1::AdmitBatchResponse resp;
  SeenIds seen;
  absl::flat_hash_set<uint64_t> admitted;  // by this batch: never a victim for it
  int i = 0;
  int evictions = 0;  // for item i
  while (i < req.items_size()) {
    std::optional<Victim> victim;
    {
      absl::MutexLock lock(&mu_);
      absl::StatusOr<Session*> found = FindLocked(req.session());
      if (!found.ok() && i == 0) return found.status();
      for (; !found.ok() && i < req.items_size(); ++i) {
        // The session ended while this batch evicted for it: the rest fail as a single Admit would.
        v1::AdmitResult* result = resp.add_results();
        result->set_request_id(req.items(i).request_id());
        SetItemStatus(found.status(), result->mutable_error());
      }
      auto record = [&](const v1::AdmitItem& item, absl::StatusOr<v1::AdmitResponse> outcome) {
        v1::AdmitResult* result = resp.add_results();
        result->set_request_id(item.request_id());
        if (outcome.ok()) {
          *result->mutable_admitted() = *std::move(outcome);
          admitted.insert(item.request_id());
        } else {
          SetItemStatus(outcome.status(), result->mutable_error());
        }
      };
      for (; i < req.items_size(); ++i, evictions = 0) {
        const v1::AdmitItem& item = req.items(i);
        if (absl::Status dup = evictions == 0 ? seen.Add(item.request_id(), i) : absl::OkStatus(); !dup.ok()) {
          record(item, dup);
          continue;
        }
        AdmitOutcome tried = AdmitItemLocked(SingleAdmit(req.session(), item), i, opened);
        if (!tried.result.ok() && tried.lacked_room) {
          victim = BatchVictimLocked(**found, item, evictions, admitted);
          if (victim.has_value()) break;  // evict outside the lock, then try item i again
        }
        record(item, std::move(tried.result));
      }
    }
    if (victim.has_value()) {
      (void)EvictVictim(*victim, "evicted to admit another request of the same tenant (host pool full)");
      ++evictions;
    }
  }
  resp.set_admitted(static_cast<uint32_t>(admitted.size()));
  return resp;
}

absl::StatusOr<std::vector<std::optional<absl::Status>>> SessionManager::AbortImportingItems(
    const v1::ReleaseBatchRequest& req) {
  std::vector<std::optional<absl::Status>> aborted(req.request_ids_size());
  std::vector<std::pair<int, std::string>> importing;  // (item, grant id): first naming only
  {
    absl::MutexLock lock(&mu_);
    HS_ASSIGN_OR_RETURN(Session * s, FindLocked(req.session()));
    absl::flat_hash_set<uint64_t> named;
    for (int i = 0; i < req.request_ids_size(); ++i) {
      const uint64_t id = req.request_ids(i);
      if (!named.insert(id).second) continue;  // a repeat: refused as such by the caller
      const Request* r = s->requests.Find(id);
      if (r != nullptr && r->importing()) importing.emplace_back(i, r->import_grant());
    }
  }
  // Outside the lock, as Release's abort (FinishImport revokes the grant's memory first).
  for (const auto& [i, grant_id] : importing) {
    aborted[i] = FinishImport(grant_id, req.session().session_id(), req.request_ids(i), std::nullopt,
                              ImportOutcome::kAbort, "aborted: released by the session");
  }
  return aborted;
}

absl::StatusOr<v1::ReleaseBatchResponse> SessionManager::ReleaseBatch(const v1::ReleaseBatchRequest& req) {
  const FlushJournalOnReturn flush{this};  // a durable request's change is journaled before the answer
  HS_RETURN_IF_ERROR(batch::CheckSize(req.request_ids_size(), kMaxBatchItems, "request_ids"));
  // An importing item is an abort, as for Release: its grant's memory is revoked outside the lock
  // before its pages go (session_import.cc), so those items go first, one by one.
  HS_ASSIGN_OR_RETURN(std::vector<std::optional<absl::Status>> aborted, AbortImportingItems(req));
  v1::ReleaseBatchResponse resp;
  SeenIds seen;
  uint32_t released = 0;
  absl::MutexLock lock(&mu_);
  HS_ASSIGN_OR_RETURN(Session * s, FindLocked(req.session()));
  for (int i = 0; i < req.request_ids_size(); ++i) {
    const uint64_t id = req.request_ids(i);
    v1::ItemStatus* result = resp.add_results();
    absl::Status status = seen.Add(id, i);
    if (status.ok() && aborted[i].has_value()) {
      status = *aborted[i];
      released += status.ok() ? 1 : 0;
      SetItemStatus(status, result);
      continue;
    }
    Request* r = s->requests.Find(id);
    if (status.ok() && r == nullptr) {
      status = absl::NotFoundError(absl::StrCat("request ", id, " is not admitted in this session"));
    }
    if (status.ok()) {
      ReleaseRequestLocked(*s, *r);
      ++released;
    }
    SetItemStatus(status, result);
  }
  resp.set_released(released);
  return resp;
}

}  // namespace hisparse
