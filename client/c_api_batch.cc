// The C ABI's batch calls (hisparse.h): admit, import, park, resume and release up to
// HS_BATCH_MAX_ITEMS requests in one call, each item with its own hs_result, and for
// HS_BATCH_ALL_OR_NOTHING the failing item's code with hs_last_error() naming it.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "c_api_internal.h"
#include "client_session.h"
#include "hisparse/hisparse.h"

using hisparse::c_api::CodeOf;
using hisparse::c_api::Fail;
using hisparse::c_api::Guard;
using hisparse::c_api::ToResult;

namespace {

// A batch item's code: ABORTED (not done because another item failed the batch) has its own.
hs_result ItemCode(const absl::Status& s) { return absl::IsAborted(s) ? HS_ERR_ABORTED : CodeOf(s); }

// hs_admit_batch / hs_release_batch's checks of the whole call.
const char* BatchArgsError(hs_session* s, size_t n, const uint64_t* ids, const hs_result* out_results) {
  if (s == nullptr || ids == nullptr || out_results == nullptr) {
    return "session, request_ids and out_results must not be NULL";
  }
  if (n == 0 || n > HS_BATCH_MAX_ITEMS) return "n must be 1..HS_BATCH_MAX_ITEMS (1024)";
  return nullptr;
}

// A C caller may pass any int as a mode, and a load of an out-of-range enum is undefined (UBSan
// stops there): each entry point copies the parameter's bytes into an int first (ModeOf(&mode))
// and never reads `mode` itself again, not even to pass it on.
int ModeOf(const hs_batch_mode* mode) {
  int value = 0;
  static_assert(sizeof value == sizeof *mode, "hs_batch_mode is an int");
  std::memcpy(&value, mode, sizeof value);
  return value;
}

// False for neither mode.
bool ReadMode(int value, bool* all_or_nothing) {
  *all_or_nothing = value == HS_BATCH_ALL_OR_NOTHING;
  return value == HS_BATCH_ALL_OR_NOTHING || value == HS_BATCH_PER_ITEM;
}

constexpr const char* kBadMode = "mode must be HS_BATCH_ALL_OR_NOTHING or HS_BATCH_PER_ITEM";

// The answer of an ALL_OR_NOTHING batch that item `failed_item` failed: that item's code, with
// hs_last_error naming the item.
hs_result FailedBatch(int failed_item, const absl::Status& failed) {
  return ToResult(absl::Status(failed.code(), "items[" + std::to_string(failed_item) + "] failed the batch (" +
                                                  std::string(failed.message()) + ")"));
}

// hs_admit_batch and hs_admit_import_batch.
hs_result AdmitBatchItems(hs_session* s, size_t n, const uint64_t* request_ids, const uint32_t* context_tokens,
                          const uint32_t* token_budgets, int mode, bool begin_import, hs_result* out_results,
                          uint32_t* out_rows, uint32_t* out_capacity_tokens) {
  return Guard([&] {
    if (const char* bad = BatchArgsError(s, n, request_ids, out_results)) return Fail(HS_ERR_INVALID_ARGUMENT, bad);
    if (token_budgets == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "token_budgets must not be NULL");
    bool all_or_nothing = false;
    if (!ReadMode(mode, &all_or_nothing)) return Fail(HS_ERR_INVALID_ARGUMENT, kBadMode);
    std::vector<hisparse::ClientSession::BatchItem> items(n);
    for (size_t i = 0; i < n; ++i) {
      items[i].request_id = request_ids[i];
      items[i].context_tokens = context_tokens == nullptr ? 0 : context_tokens[i];
      items[i].token_budget = token_budgets[i];
      items[i].begin_import = begin_import;
    }
    auto batch = s->impl->AdmitBatch(items, all_or_nothing);
    if (!batch.ok()) return ToResult(batch.status());
    for (size_t i = 0; i < n; ++i) {
      const absl::StatusOr<hs_request_info>& item = batch->items[i];
      out_results[i] = item.ok() ? HS_OK : ItemCode(item.status());
      if (!item.ok()) continue;
      if (out_rows != nullptr) out_rows[i] = item->row;
      if (out_capacity_tokens != nullptr) out_capacity_tokens[i] = item->capacity_tokens;
    }
    if (batch->failed_item < 0) return HS_OK;
    return FailedBatch(batch->failed_item, batch->items[batch->failed_item].status());
  });
}

const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

// A batch's answer: out_results from `items`, and for ALL_OR_NOTHING that failed, the failing
// item's code with hs_last_error naming it.
template <typename Item>
hs_result BatchOutcome(const std::vector<Item>& items, int failed_item, hs_result* out_results) {
  for (size_t i = 0; i < items.size(); ++i) out_results[i] = items[i].ok() ? HS_OK : ItemCode(StatusOf(items[i]));
  if (failed_item < 0) return HS_OK;
  return FailedBatch(failed_item, StatusOf(items[failed_item]));
}

}  // namespace

extern "C" {

hs_result hs_admit_batch(hs_session* s, size_t n, const uint64_t* request_ids, const uint32_t* context_tokens,
                         const uint32_t* token_budgets, hs_batch_mode mode, hs_result* out_results, uint32_t* out_rows,
                         uint32_t* out_capacity_tokens) {
  return AdmitBatchItems(s, n, request_ids, context_tokens, token_budgets, ModeOf(&mode), /*begin_import=*/false,
                         out_results, out_rows, out_capacity_tokens);
}

// Since ABI 1.8: batched park, resume and import.
hs_result hs_admit_import_batch(hs_session* s, size_t n, const uint64_t* request_ids, const uint32_t* context_tokens,
                                const uint32_t* token_budgets, hs_batch_mode mode, hs_result* out_results) {
  return AdmitBatchItems(s, n, request_ids, context_tokens, token_budgets, ModeOf(&mode), /*begin_import=*/true,
                         out_results, nullptr, nullptr);
}

hs_result hs_park_batch(hs_session* s, size_t n, const uint64_t* request_ids, hs_batch_mode mode,
                        hs_result* out_results) {
  const int mode_value = ModeOf(&mode);
  return Guard([&] {
    if (const char* bad = BatchArgsError(s, n, request_ids, out_results)) return Fail(HS_ERR_INVALID_ARGUMENT, bad);
    bool all_or_nothing = false;
    if (!ReadMode(mode_value, &all_or_nothing)) return Fail(HS_ERR_INVALID_ARGUMENT, kBadMode);
    auto parked = s->impl->ParkBatch(std::vector<uint64_t>(request_ids, request_ids + n), all_or_nothing);
    if (!parked.ok()) return ToResult(parked.status());
    return BatchOutcome(parked->items, parked->failed_item, out_results);
  });
}

hs_result hs_resume_batch(hs_session* s, size_t n, const uint64_t* request_ids, hs_batch_mode mode,
                          hs_result* out_results, uint32_t* out_rows, uint32_t* out_capacity_tokens) {
  const int mode_value = ModeOf(&mode);
  return Guard([&] {
    if (const char* bad = BatchArgsError(s, n, request_ids, out_results)) return Fail(HS_ERR_INVALID_ARGUMENT, bad);
    bool all_or_nothing = false;
    if (!ReadMode(mode_value, &all_or_nothing)) return Fail(HS_ERR_INVALID_ARGUMENT, kBadMode);
    auto resumed = s->impl->ResumeBatch(std::vector<uint64_t>(request_ids, request_ids + n), all_or_nothing);
    if (!resumed.ok()) return ToResult(resumed.status());
    for (size_t i = 0; i < n; ++i) {
      if (!resumed->items[i].ok()) continue;
      if (out_rows != nullptr) out_rows[i] = resumed->items[i]->row;
      if (out_capacity_tokens != nullptr) out_capacity_tokens[i] = resumed->items[i]->capacity_tokens;
    }
    return BatchOutcome(resumed->items, resumed->failed_item, out_results);
  });
}

hs_result hs_release_batch(hs_session* s, size_t n, const uint64_t* request_ids, hs_result* out_results) {
  return Guard([&] {
    if (const char* bad = BatchArgsError(s, n, request_ids, out_results)) return Fail(HS_ERR_INVALID_ARGUMENT, bad);
    auto released = s->impl->ReleaseBatch(std::vector<uint64_t>(request_ids, request_ids + n));
    if (!released.ok()) return ToResult(released.status());
    for (size_t i = 0; i < n; ++i) out_results[i] = ItemCode((*released)[i]);
    return HS_OK;
  });
}

}  // extern "C"
