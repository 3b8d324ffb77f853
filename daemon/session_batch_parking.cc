// SessionManager::ParkBatch and ResumeBatch: one call for the N requests an engine preempts or
// brings back in a step. Part of SessionManager (session_manager.h). Each item is what a single
// Park or Resume of it would do (ParkLocked, ResumeLocked: the same checks, codes and messages);
// the batch adds one lock for all of them, the duplicate check and, for ALL_OR_NOTHING, the undo.
//
// ALL_OR_NOTHING undoes in reverse order, under the same lock, so nothing else saw the batch's
// middle: a parked item takes back the row it gave (free since: nobody could take it), a resumed
// item is parked again (its row free again). The session's rows, parked set and pages are then as
// before the call; the only trace is the ledger's use time of an unparked item (now), as if it was
// touched. What is counted: a Resume refused for want of a row counts its refusal (Stats
// .rejections) once, in either mode, as the single call of that item would; nothing else counts.
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "batch_items.h"
#include "hisparse/common/log.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/daemon/session_manager.h"

namespace hisparse {
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
  HS_RETURN_IF_ERROR(batch::CheckSize(req.request_ids_size(), SessionManager::kMaxBatchItems, "request_ids"));
  return batch::CheckMode(req.mode());
}

}  // namespace

absl::StatusOr<v1::ParkBatchResponse> SessionManager::ParkBatch(const v1::ParkBatchRequest& req) {
  HS_RETURN_IF_ERROR(CheckBatch(req));
  absl::MutexLock lock(&mu_);
  HS_ASSIGN_OR_RETURN(Session * s, FindLocked(req.session()));
  const auto apply = [this, s](uint64_t id) -> absl::StatusOr<v1::ParkResponse> {
    mu_.AssertHeld();
    Request* r = s->requests.Find(id);
    if (r == nullptr) return absl::NotFoundError(absl::StrCat("request ", id, " is not admitted in this session"));
    return ParkLocked(*s, *r);
  };
  const auto undo = [this, s](uint64_t id, const v1::ParkResponse& parked) {
    mu_.AssertHeld();
    // The row it gave back under this lock: still free. Parked by apply, so resumable.
    absl::Status undone = s->requests.Resume(*s->requests.Find(id), parked.row());
    if (!undone.ok()) LOG(ERROR) << "accounting error undoing a park: " << undone;
  };
  const auto set = [](v1::ParkResult* result, const v1::ParkResponse& parked) { *result->mutable_parked() = parked; };
  auto [resp, parked] = RunBatch<v1::ParkBatchResponse>(req.request_ids(), req.mode() == v1::BATCH_MODE_ALL_OR_NOTHING,
                                                        "unparked again", apply, undo, set);
  resp.set_parked(parked);
  return std::move(resp);
}

absl::StatusOr<v1::ResumeBatchResponse> SessionManager::ResumeBatch(const v1::ResumeBatchRequest& req) {
  HS_RETURN_IF_ERROR(CheckBatch(req));
  absl::MutexLock lock(&mu_);
  HS_ASSIGN_OR_RETURN(Session * s, FindLocked(req.session()));
  const auto apply = [this, s](uint64_t id) -> absl::StatusOr<v1::ResumeResponse> {
    mu_.AssertHeld();
    Request* r = s->requests.Find(id);
    if (r == nullptr) return absl::NotFoundError(absl::StrCat("request ", id, " is not admitted in this session"));
    return ResumeLocked(*s, *r);
  };
  const auto undo = [this, s](uint64_t id, const v1::ResumeResponse&) {
    mu_.AssertHeld();
    absl::Status undone = s->requests.Park(*s->requests.Find(id));  // resumed by apply, so live
    if (!undone.ok()) LOG(ERROR) << "accounting error undoing a resume: " << undone;
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
