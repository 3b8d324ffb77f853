// Batches (batches.h): AdmitBatch and ReleaseBatch, one call for the N requests an engine
// schedules in a step, and ParkBatch and ResumeBatch. Each item is what a single Admit or Release of
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
// lock once more (FinishImports). An import item never evicts. ALL_OR_NOTHING whose
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
#include "hisparse/common/log.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/daemon/batches.h"
#include "hisparse/daemon/deferred_log.h"
#include "hisparse/daemon/parking.h"

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

Batches::Batches(SessionCore& core, Admissions& admissions, Imports& imports, Durability& durability)
    : core_(core), admissions_(admissions), imports_(imports), durability_(durability) {}

absl::StatusOr<v1::AdmitBatchResponse> Batches::AdmitBatch(const v1::AdmitBatchRequest& req) {
  HS_RETURN_IF_ERROR(batch::CheckSize(req.items_size(), kMaxItems, "items"));
  HS_RETURN_IF_ERROR(batch::CheckMode(req.mode()));
  OpenedImports opened;
  v1::AdmitBatchResponse resp;
  if (req.mode() == v1::BATCH_MODE_PER_ITEM) {
    HS_ASSIGN_OR_RETURN(resp, AdmitEachItem(req, &opened));
  } else {
    // An item that wanted a new slab rolled the batch back: the slabs for every item are made with
    // no lock held, and the batch is tried again (SessionCore::WithSlabsOutsideLocks).
    HS_ASSIGN_OR_RETURN(resp, core_.WithSlabsOutsideLocks(
                                  [&](PagePool::SlabsOutsideLocks& outside) -> absl::StatusOr<v1::AdmitBatchResponse> {
                                    NodeLock lock(core_);
                                    HS_ASSIGN_OR_RETURN(Session * s, core_.FindLocked(req.session()));
                                    v1::AdmitBatchResponse tried = AdmitAllOrNothingLocked(*s, req, &opened);
                                    if (outside.HasWant()) WantAllItemsLocked(*s, req, 0, outside);
                                    return tried;
                                  }));
  }
  if (!opened.empty()) FinishImports(req, opened, &resp);
  return resp;
}

SessionCore::AdmitOutcome Batches::AdmitItemLocked(const v1::AdmitRequest& one, int index, OpenedImports* opened) {
  admissions_.AssertHeld();
  imports_.AssertHeld();
  durability_.AssertHeld();
  if (!one.begin_import()) return admissions_.AdmitLocked(one);
  // As Admit: a lease with begin_import is bad input, whatever the import target.
  if (one.lease_seconds() != 0) return {durability_.CheckLeaseLocked(one.lease_seconds(), /*importing=*/true)};
  v1::AdmitResponse resp;
  absl::StatusOr<Imports::Opened> o = imports_.OpenLocked(one, &resp);
  if (!o.ok()) return {o.status()};  // no lacked_room: an import never evicts
  opened->emplace_back(index, *std::move(o));
  return {std::move(resp)};
}

void Batches::UndoItemLocked(Session& s, uint64_t request_id) {
  Request* r = s.requests.Find(request_id);
  if (r == nullptr) return;  // released meanwhile (FinishImports runs in two locks)
  imports_.AssertHeld();
  if (r->importing()) imports_.ForgetLocked(r->import_grant());  // not registered (now)
  core_.ReleaseRequestLocked(s, *r);
  --core_.admissions_;
}

void Batches::FailAllOrNothingLocked(Session& s, const v1::AdmitBatchRequest& req, int failed, const absl::Status& why,
                                     v1::AdmitBatchResponse* resp) {
  // Roll back, in reverse: every page to the pool, every row to the ledger, no admission counted.
  for (int j = resp->results_size() - 1; j >= 0; --j) {
    if (resp->results(j).has_admitted()) UndoItemLocked(s, req.items(j).request_id());
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

v1::AdmitBatchResponse Batches::AdmitAllOrNothingLocked(Session& s, const v1::AdmitBatchRequest& req,
                                                        OpenedImports* opened) {
  v1::AdmitBatchResponse resp;
  SeenIds seen;
  for (int i = 0; i < req.items_size(); ++i) {
    const v1::AdmitItem& item = req.items(i);
    v1::AdmitResult* result = resp.add_results();
    result->set_request_id(item.request_id());
    absl::Status failed = seen.Add(item.request_id(), i);
    if (failed.ok()) {
      SessionCore::AdmitOutcome outcome = AdmitItemLocked(SingleAdmit(req.session(), item), i, opened);
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

void Batches::FinishImports(const v1::AdmitBatchRequest& req, const OpenedImports& opened,
                            v1::AdmitBatchResponse* resp) {
  // Outside the lock: each grant is busy (nobody finishes it, the session waits for it).
  std::vector<absl::Status> regions;
  int failed = -1;  // the first import whose registration failed
  for (size_t k = 0; k < opened.size(); ++k) {
    regions.push_back(Imports::Register(opened[k].second));
    if (!regions.back().ok() && failed < 0) failed = static_cast<int>(k);
  }
  const bool all_or_nothing = req.mode() == v1::BATCH_MODE_ALL_OR_NOTHING;
  if (all_or_nothing && failed >= 0) {
    // Revoked before any page goes: no grant of the batch outlives it at the target.
    for (size_t k = 0; k < opened.size(); ++k) {
      if (regions[k].ok()) opened[k].second.target->Unregister(opened[k].second.grant_id);
    }
  }
  DeferredLog log;  // written once the lock is released
  NodeLock lock(core_);
  imports_.AssertHeld();
  Session& s = *core_.sessions_.at(req.session().session_id());  // it waits for the busy grants
  if (all_or_nothing && failed >= 0) {
    FailAllOrNothingLocked(s, req, opened[failed].first, regions[failed], resp);
    return;
  }
  uint32_t admitted = resp->admitted();
  for (size_t k = 0; k < opened.size(); ++k) {
    v1::AdmitResult* result = resp->mutable_results(opened[k].first);
    if (regions[k].ok()) {
      imports_.PublishLocked(opened[k].second, result->mutable_admitted(), log);
      continue;
    }
    imports_.DropLocked(opened[k].second);
    SetItemStatus(regions[k], result->mutable_error());
    --admitted;
  }
  resp->set_admitted(admitted);
}

std::optional<SessionCore::Victim> Batches::VictimLocked(const Session& s, const v1::AdmitItem& item, int evictions,
                                                         const absl::flat_hash_set<uint64_t>& batch) const {
  constexpr int kMaxEvictionsPerItem = 64;  // as Admit's
  if (!core_.options_.evict_on_pool_full || evictions == kMaxEvictionsPerItem || item.begin_import())
    return std::nullopt;
  // As Admit: only when evicting can make this admission succeed.
  if (evictions == 0 &&
      !core_.EvictionCouldAdmitLocked(s, core_.PagesFor(s, item.token_budget()) * s.geometry.num_layers())) {
    return std::nullopt;
  }
  std::optional<SessionCore::Victim> victim = core_.PickVictimLocked(s.id);
  if (victim.has_value() && victim->session_id == s.id && batch.contains(victim->request_id)) return std::nullopt;
  return victim;
}

uint64_t Batches::ItemPages(const Session& s, const v1::AdmitBatchRequest& req, int from) {
  uint64_t pages = 0;
  for (int i = from; i < req.items_size(); ++i) {
    if (!SessionCore::CheckBudget(s, req.items(i).token_budget()).ok()) continue;  // refused without pages
    pages += SessionCore::PagesFor(s, req.items(i).token_budget()) * s.geometry.num_layers();
    if (pages > UINT32_MAX) return UINT32_MAX;  // more than any pool: Prepare refuses it
  }
  return pages;
}

void Batches::WantAllItemsLocked(const Session& s, const v1::AdmitBatchRequest& req, int from,
                                 PagePool::SlabsOutsideLocks& outside) {
  const uint64_t pages = ItemPages(s, req, from);
  // Only what the tenant's quota would let it hold: a batch never has more made than it may take.
  if (!core_.ledger_.CheckGrow(s.id, pages, 0).has_value()) outside.WantedLarger({s.id, pages});
}

absl::StatusOr<v1::AdmitBatchResponse> Batches::AdmitEachItem(const v1::AdmitBatchRequest& req, OpenedImports* opened) {
  v1::AdmitBatchResponse resp;
  SeenIds seen;
  absl::flat_hash_set<uint64_t> admitted;  // by this batch: never a victim for it
  int i = 0;
  int evictions = 0;  // for item i
  // An item that wants a new slab has it made for the rest of the batch with no lock held, then is
  // tried again (SessionCore::WithSlabsOutsideLocks, here by hand: the items before it stay).
  PagePool::SlabsOutsideLocks outside;
  bool again = false;  // item i is tried again: its id is in `seen` already
  while (i < req.items_size()) {
    std::optional<SessionCore::Victim> victim;
    bool wants_slab = false;
    {
      NodeLock lock(core_);
      absl::StatusOr<Session*> found = core_.FindLocked(req.session());
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
      for (; i < req.items_size(); ++i, evictions = 0, again = false) {
        const v1::AdmitItem& item = req.items(i);
        if (absl::Status dup = evictions == 0 && !again ? seen.Add(item.request_id(), i) : absl::OkStatus();
            !dup.ok()) {
          record(item, dup);
          continue;
        }
        SessionCore::AdmitOutcome tried = AdmitItemLocked(SingleAdmit(req.session(), item), i, opened);
        if (outside.HasWant()) {
          WantAllItemsLocked(**found, req, i, outside);
          wants_slab = again = true;
          break;  // made outside the lock, then item i again
        }
        if (!tried.result.ok() && tried.lacked_room) {
          victim = VictimLocked(**found, item, evictions, admitted);
          if (victim.has_value()) break;  // evict outside the lock, then try item i again
        }
        record(item, std::move(tried.result));
      }
    }
    if (wants_slab) (void)core_.MakeWantedSlabs(outside);
    if (victim.has_value()) {
      (void)core_.EvictVictim(*victim, "evicted to admit another request of the same tenant (host pool full)");
      ++evictions;
      again = false;  // counted as an eviction's retry
    }
  }
  resp.set_admitted(static_cast<uint32_t>(admitted.size()));
  return resp;
}

absl::StatusOr<std::vector<std::optional<absl::Status>>> Batches::AbortImportingItems(
    const v1::ReleaseBatchRequest& req) {
  std::vector<std::optional<absl::Status>> aborted(req.request_ids_size());
  std::vector<std::pair<int, std::string>> importing;  // (item, grant id): first naming only
  {
    NodeLock lock(core_);
    HS_ASSIGN_OR_RETURN(Session * s, core_.FindLocked(req.session()));
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
    aborted[i] = imports_.AbortReleased(grant_id, req.session().session_id(), req.request_ids(i));
  }
  return aborted;
}

absl::StatusOr<v1::ReleaseBatchResponse> Batches::ReleaseBatch(const v1::ReleaseBatchRequest& req) {
  HS_RETURN_IF_ERROR(batch::CheckSize(req.request_ids_size(), kMaxItems, "request_ids"));
  // An importing item is an abort, as for Release: its grant's memory is revoked outside the lock
  // before its pages go (imports.cc), so those items go first, one by one.
  HS_ASSIGN_OR_RETURN(std::vector<std::optional<absl::Status>> aborted, AbortImportingItems(req));
  v1::ReleaseBatchResponse resp;
  SeenIds seen;
  uint32_t released = 0;
  NodeLock lock(core_);
  HS_ASSIGN_OR_RETURN(Session * s, core_.FindLocked(req.session()));
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
      core_.ReleaseRequestLocked(*s, *r);
      ++released;
    }
    SetItemStatus(status, result);
  }
  resp.set_released(released);
  return resp;
}

// ---- ParkBatch and ResumeBatch: one call for the N requests an engine preempts or brings back
// in a step. Each item is what a single Park or Resume of it would do (Parking::ParkLocked,
// ResumeLocked: the same checks, codes and messages); the batch adds one lock for all of them, the
// duplicate check and, for ALL_OR_NOTHING, the undo.
//
// ALL_OR_NOTHING undoes in reverse order, under the same lock, so nothing else saw the batch's
// middle: a parked item takes back the row it gave (free since: nobody could take it), a resumed
// item is parked again (its row free again). The session's rows, parked set and pages are then as
// before the call; the only trace is the ledger's use time of an unparked item (now), as if it was
// touched. What is counted: a Resume refused for want of a row counts its refusal (Stats
// .rejections) once, in either mode, as the single call of that item would; nothing else counts.
namespace {

// One batch of ids, each item applied by `apply(id)` (a StatusOr of the single call's answer, its
// checks but the duplicate one included) and recorded by `set(result, answer)`. With
// all_or_nothing the first failure stops it and `undo(id, answer)` reverts every item done, in
// reverse. Returns the response (results, failed_item) and how many items stay done.
template <typename Response, typename Apply, typename Undo, typename Set>
std::pair<Response, uint32_t> RunBatch(const google::protobuf::RepeatedField<uint64_t>& ids, bool all_or_nothing,
                                       const char* undone, Apply apply, Undo undo, Set set) {
  using Answer = typename decltype(apply(uint64_t{}))::value_type;
  Response resp;
  batch::SeenIds seen;
  std::vector<std::pair<int, Answer>> done;
  int failed = -1;
  for (int i = 0; i < ids.size(); ++i) {
    auto* result = resp.add_results();
    result->set_request_id(ids[i]);
    absl::Status dup = seen.Add(ids[i], i);
    absl::StatusOr<Answer> answer = dup.ok() ? apply(ids[i]) : absl::StatusOr<Answer>(dup);
    if (answer.ok()) {
      set(result, *answer);
      done.emplace_back(i, *std::move(answer));
      continue;
    }
    batch::SetItemStatus(answer.status(), result->mutable_error());
    if (all_or_nothing) {
      failed = i;
      break;
    }
  }
  if (failed < 0) return {std::move(resp), static_cast<uint32_t>(done.size())};
  for (auto it = done.rbegin(); it != done.rend(); ++it) undo(ids[it->first], it->second);
  for (int j = 0; j < ids.size(); ++j) {
    if (j == failed) continue;
    auto* result = j < resp.results_size() ? resp.mutable_results(j) : resp.add_results();
    result->set_request_id(ids[j]);
    batch::SetItemStatus(batch::Aborted(j, failed, ids[failed], undone), result->mutable_error());
  }
  resp.set_failed_item(static_cast<uint32_t>(failed) + 1);
  return {std::move(resp), 0};
}

template <typename BatchRequest>
absl::Status CheckBatch(const BatchRequest& req) {
  HS_RETURN_IF_ERROR(batch::CheckSize(req.request_ids_size(), Batches::kMaxItems, "request_ids"));
  return batch::CheckMode(req.mode());
}

}  // namespace

absl::StatusOr<v1::ParkBatchResponse> Batches::ParkBatch(const v1::ParkBatchRequest& req) {
  HS_RETURN_IF_ERROR(CheckBatch(req));
  NodeLock lock(core_);
  HS_ASSIGN_OR_RETURN(Session * s, core_.FindLocked(req.session()));
  const auto apply = [this, s](uint64_t id) -> absl::StatusOr<v1::ParkResponse> {
    core_.mu_.AssertHeld();
    core_.ledger_mu_.AssertHeld();
    Request* r = s->requests.Find(id);
    if (r == nullptr) return absl::NotFoundError(absl::StrCat("request ", id, " is not admitted in this session"));
    return Parking::ParkLocked(core_, *s, *r);
  };
  const auto undo = [this, s](uint64_t id, const v1::ParkResponse& parked) {
    core_.mu_.AssertHeld();
    core_.ledger_mu_.AssertHeld();
    // The row it gave back under this lock: still free. Parked by apply, so resumable.
    absl::Status undone = s->requests.Resume(*s->requests.Find(id), parked.row());
    if (!undone.ok()) LOCKED_LOG(ERROR) << "accounting error undoing a park: " << undone;
  };
  const auto set = [](v1::ParkResult* result, const v1::ParkResponse& parked) { *result->mutable_parked() = parked; };
  auto [resp, parked] = RunBatch<v1::ParkBatchResponse>(req.request_ids(), req.mode() == v1::BATCH_MODE_ALL_OR_NOTHING,
                                                        "unparked again", apply, undo, set);
  resp.set_parked(parked);
  return std::move(resp);
}

absl::StatusOr<v1::ResumeBatchResponse> Batches::ResumeBatch(const v1::ResumeBatchRequest& req) {
  HS_RETURN_IF_ERROR(CheckBatch(req));
  NodeLock lock(core_);
  HS_ASSIGN_OR_RETURN(Session * s, core_.FindLocked(req.session()));
  const auto apply = [this, s](uint64_t id) -> absl::StatusOr<v1::ResumeResponse> {
    core_.mu_.AssertHeld();
    core_.ledger_mu_.AssertHeld();
    Request* r = s->requests.Find(id);
    if (r == nullptr) return absl::NotFoundError(absl::StrCat("request ", id, " is not admitted in this session"));
    return Parking::ResumeLocked(core_, *s, *r);
  };
  const auto undo = [this, s](uint64_t id, const v1::ResumeResponse&) {
    core_.mu_.AssertHeld();
    core_.ledger_mu_.AssertHeld();
    absl::Status undone = s->requests.Park(*s->requests.Find(id));  // resumed by apply, so live
    if (!undone.ok()) LOCKED_LOG(ERROR) << "accounting error undoing a resume: " << undone;
  };
  const auto set = [](v1::ResumeResult* result, const v1::ResumeResponse& resumed) {
    *result->mutable_resumed() = resumed;
  };
  auto [resp, resumed] = RunBatch<v1::ResumeBatchResponse>(
      req.request_ids(), req.mode() == v1::BATCH_MODE_ALL_OR_NOTHING, "parked again", apply, undo, set);
  resp.set_resumed(resumed);
  return std::move(resp);
}

}  // namespace hisparse
