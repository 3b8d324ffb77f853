// The C ABI's batch calls (hisparse.h): admit (hs_admit_batch2, and hs_admit_batch and
// hs_admit_import_batch as wrappers that fill its items), park, resume and release up to
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
using hisparse::c_api::kAdmitArgsV1;
using hisparse::c_api::kRequestInfoV1;
using hisparse::c_api::ReadSized;
using hisparse::c_api::SizeOk;
using hisparse::c_api::ToResult;
using hisparse::c_api::WriteSized;

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

// The path of every batched admission (hs_admit_batch2's body): `items` as this library knows
// them; an admitted item's info goes to `admitted(i, info)`.
template <typename Admitted>
hs_result AdmitBatchItems(hs_session* s, const std::vector<hs_admit_args>& items, int mode, hs_result* out_results,
                          Admitted&& admitted) {
  return Guard([&] {
    if (s == nullptr || out_results == nullptr) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "session and out_results must not be NULL");
    }
    bool all_or_nothing = false;
    if (!ReadMode(mode, &all_or_nothing)) return Fail(HS_ERR_INVALID_ARGUMENT, kBadMode);
    auto batch = s->Get()->AdmitBatch(items, all_or_nothing);
    if (!batch.ok()) return ToResult(batch.status());
    for (size_t i = 0; i < items.size(); ++i) {
      const absl::StatusOr<hs_request_info>& item = batch->items[i];
      out_results[i] = item.ok() ? HS_OK : ItemCode(item.status());
      if (item.ok()) admitted(i, *item);
    }
    if (batch->failed_item < 0) return HS_OK;
    return FailedBatch(batch->failed_item, batch->items[batch->failed_item].status());
  });
}

// hs_admit_batch and hs_admit_import_batch: their arrays as hs_admit_batch2's items.
hs_result AdmitBatchArrays(hs_session* s, size_t n, const uint64_t* request_ids, const uint32_t* context_tokens,
                           const uint32_t* token_budgets, int mode, uint32_t flags, hs_result* out_results,
                           uint32_t* out_rows, uint32_t* out_capacity_tokens) {
  return Guard([&] {
    if (const char* bad = BatchArgsError(s, n, request_ids, out_results)) return Fail(HS_ERR_INVALID_ARGUMENT, bad);
    if (token_budgets == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "token_budgets must not be NULL");
    std::vector<hs_admit_args> items(n, hs_admit_args(HS_ADMIT_ARGS_INIT));
    for (size_t i = 0; i < n; ++i) {
      items[i].request_id = request_ids[i];
      items[i].context_tokens = context_tokens == nullptr ? 0 : context_tokens[i];
      items[i].token_budget = token_budgets[i];
      items[i].flags = flags;
    }
    return AdmitBatchItems(s, items, mode, out_results, [&](size_t i, const hs_request_info& info) {
      if (out_rows != nullptr) out_rows[i] = info.row;
      if (out_capacity_tokens != nullptr) out_capacity_tokens[i] = info.capacity_tokens;
    });
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
  return AdmitBatchArrays(s, n, request_ids, context_tokens, token_budgets, ModeOf(&mode), /*flags=*/0, out_results,
                          out_rows, out_capacity_tokens);
}

// Since ABI 1.10: items and out_infos are arrays of size-prefixed structs whose stride is their
// first element's struct_size.
hs_result hs_admit_batch2(hs_session* s, size_t n, const hs_admit_args* items, hs_batch_mode mode,
                          hs_result* out_results, hs_request_info* out_infos) {
  const int mode_value = ModeOf(&mode);
  return Guard([&] {
    if (s == nullptr || items == nullptr || out_results == nullptr) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "session, items and out_results must not be NULL");
    }
    if (n == 0 || n > HS_BATCH_MAX_ITEMS)
      return Fail(HS_ERR_INVALID_ARGUMENT, "n must be 1..HS_BATCH_MAX_ITEMS (1024)");
    const uint32_t stride = items[0].struct_size;
    if (!SizeOk(stride, kAdmitArgsV1)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "items[0].struct_size is too small: use HS_ADMIT_ARGS_INIT");
    }
    const uint32_t info_stride = out_infos == nullptr ? 0 : out_infos[0].struct_size;
    if (out_infos != nullptr && !SizeOk(info_stride, kRequestInfoV1)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "out_infos[0].struct_size is too small: use HS_REQUEST_INFO_INIT");
    }
    std::vector<hs_admit_args> read(n);
    for (size_t i = 0; i < n; ++i) {
      const auto* item = reinterpret_cast<const hs_admit_args*>(reinterpret_cast<const char*>(items) + i * stride);
      if (item->struct_size != stride) {
        return ToResult(absl::InvalidArgumentError("items[" + std::to_string(i) + "].struct_size " +
                                                   std::to_string(item->struct_size) + " differs from items[0]'s " +
                                                   std::to_string(stride) + " (every item carries the same)"));
      }
      read[i] = ReadSized(*item);
    }
    return AdmitBatchItems(s, read, mode_value, out_results, [&](size_t i, const hs_request_info& info) {
      if (out_infos == nullptr) return;
      auto* out = reinterpret_cast<hs_request_info*>(reinterpret_cast<char*>(out_infos) + i * info_stride);
      out->struct_size = info_stride;  // each entry as the caller's first says
      WriteSized(info, out);
    });
  });
}

// Since ABI 1.8: batched park, resume and import.
hs_result hs_admit_import_batch(hs_session* s, size_t n, const uint64_t* request_ids, const uint32_t* context_tokens,
                                const uint32_t* token_budgets, hs_batch_mode mode, hs_result* out_results) {
  return AdmitBatchArrays(s, n, request_ids, context_tokens, token_budgets, ModeOf(&mode), HS_ADMIT_IMPORT, out_results,
                          nullptr, nullptr);
}

hs_result hs_park_batch(hs_session* s, size_t n, const uint64_t* request_ids, hs_batch_mode mode,
                        hs_result* out_results) {
  const int mode_value = ModeOf(&mode);
  return Guard([&] {
    if (const char* bad = BatchArgsError(s, n, request_ids, out_results)) return Fail(HS_ERR_INVALID_ARGUMENT, bad);
    bool all_or_nothing = false;
    if (!ReadMode(mode_value, &all_or_nothing)) return Fail(HS_ERR_INVALID_ARGUMENT, kBadMode);
    auto parked = s->Get()->ParkBatch(std::vector<uint64_t>(request_ids, request_ids + n), all_or_nothing);
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
    auto resumed = s->Get()->ResumeBatch(std::vector<uint64_t>(request_ids, request_ids + n), all_or_nothing);
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
    auto released = s->Get()->ReleaseBatch(std::vector<uint64_t>(request_ids, request_ids + n));
    if (!released.ok()) return ToResult(released.status());
    for (size_t i = 0; i < n; ++i) out_results[i] = ItemCode((*released)[i]);
    return HS_OK;
  });
}

}  // extern "C"
