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
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/daemon/session_manager.h"

namespace hisparse {
namespace {

absl::Status CheckBatchSize(int size, const char* field) {
  if (size < 1 || size > SessionManager::kMaxBatchItems) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must hold 1..", SessionManager::kMaxBatchItems, " entries, got ", size));
  }
  return absl::OkStatus();
}

void SetItemStatus(const absl::Status& status, v1::ItemStatus* out) {
  out->set_code(static_cast<int32_t>(status.code()));
  out->set_message(std::string(status.message()));
}

// The first index at which each request id appears; InvalidArgument for a later one.
class SeenIds {
 public:
  absl::Status Add(uint64_t request_id, int index) {
    auto [it, inserted] = first_.emplace(request_id, index);
    if (inserted) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("request_id ", request_id, " is named twice in this batch (items ",
                                                   it->second, " and ", index, ")"));
  }

 private:
  absl::flat_hash_map<uint64_t, int> first_;
};

v1::AdmitRequest SingleAdmit(const v1::SessionRef& session, const v1::AdmitItem& item) {
  v1::AdmitRequest one;
  *one.mutable_session() = session;
  one.set_request_id(item.request_id());
  one.set_context_tokens(item.context_tokens());
  one.set_token_budget(item.token_budget());
  return one;
}

}  // namespace

absl::StatusOr<v1::AdmitBatchResponse> SessionManager::AdmitBatch(const v1::AdmitBatchRequest& req) {
  HS_RETURN_IF_ERROR(CheckBatchSize(req.items_size(), "items"));
  if (req.mode() == v1::BATCH_MODE_PER_ITEM) return AdmitEachItem(req);
  if (req.mode() != v1::BATCH_MODE_ALL_OR_NOTHING) {
    return absl::InvalidArgumentError(
        absl::StrCat("mode must be BATCH_MODE_ALL_OR_NOTHING or BATCH_MODE_PER_ITEM, got ", req.mode()));
  }
  absl::MutexLock lock(&mu_);
  HS_ASSIGN_OR_RETURN(Session * s, FindLocked(req.session()));
  return AdmitAllOrNothingLocked(*s, req);
}

v1::AdmitBatchResponse SessionManager::AdmitAllOrNothingLocked(Session& s, const v1::AdmitBatchRequest& req) {
  v1::AdmitBatchResponse resp;
  SeenIds seen;
  int i = 0;
  absl::Status failed;
  for (; i < req.items_size(); ++i) {
    const v1::AdmitItem& item = req.items(i);
    v1::AdmitResult* result = resp.add_results();
    result->set_request_id(item.request_id());
    failed = seen.Add(item.request_id(), i);
    if (!failed.ok()) break;
    AdmitOutcome outcome = AdmitLocked(SingleAdmit(req.session(), item));
    if (!outcome.result.ok()) {
      failed = outcome.result.status();
      break;
    }
    *result->mutable_admitted() = *std::move(outcome.result);
  }
  if (failed.ok()) {
    resp.set_admitted(static_cast<uint32_t>(req.items_size()));
    return resp;
  }
  // Roll back, in reverse: every page to the pool, every row to the ledger, no admission counted.
  for (int j = i - 1; j >= 0; --j) {
    auto it = s.requests.find(req.items(j).request_id());
    ReleaseRequestLocked(s, it->second);
    s.requests.erase(it);
    --admissions_;
  }
  const std::string why = absl::StrCat("items[", i, "] (request ", req.items(i).request_id(), ") failed the batch");
  for (int j = 0; j < req.items_size(); ++j) {
    v1::AdmitResult* result = j < resp.results_size() ? resp.mutable_results(j) : resp.add_results();
    result->set_request_id(req.items(j).request_id());
    if (j == i) {
      SetItemStatus(failed, result->mutable_error());
    } else {
      SetItemStatus(absl::AbortedError(absl::StrCat(j < i ? "rolled back: " : "not tried: ", why)),
                    result->mutable_error());
    }
  }
  resp.set_failed_item(static_cast<uint32_t>(i) + 1);
  return resp;
}

std::optional<SessionManager::Victim> SessionManager::BatchVictimLocked(
    const Session& s, const v1::AdmitItem& item, int evictions, const absl::flat_hash_set<uint64_t>& batch) const {
  constexpr int kMaxEvictionsPerItem = 64;  // as Admit's
  if (!options_.evict_on_pool_full || evictions == kMaxEvictionsPerItem) return std::nullopt;
  // As Admit: only when evicting can make this admission succeed.
  if (evictions == 0 && !EvictionCouldAdmitLocked(s, PagesFor(s, item.token_budget()) * s.geometry.num_layers())) {
    return std::nullopt;
  }
  std::optional<Victim> victim = PickVictimLocked(s.id);
  if (victim.has_value() && victim->session_id == s.id && batch.contains(victim->request_id)) return std::nullopt;
  return victim;
}

absl::StatusOr<v1::AdmitBatchResponse> SessionManager::AdmitEachItem(const v1::AdmitBatchRequest& req) {
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
        AdmitOutcome tried = AdmitLocked(SingleAdmit(req.session(), item));
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
      auto it = s->requests.find(id);
      if (it != s->requests.end() && !it->second.import_grant.empty())
        importing.emplace_back(i, it->second.import_grant);
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
  HS_RETURN_IF_ERROR(CheckBatchSize(req.request_ids_size(), "request_ids"));
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
    auto it = s->requests.find(id);
    if (status.ok() && it == s->requests.end()) {
      status = absl::NotFoundError(absl::StrCat("request ", id, " is not admitted in this session"));
    }
    if (status.ok()) {
      ReleaseRequestLocked(*s, it->second);
      s->requests.erase(it);
      ++released;
    }
    SetItemStatus(status, result);
  }
  resp.set_released(released);
  return resp;
}

}  // namespace hisparse
