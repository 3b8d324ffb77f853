// The C ABI (hisparse.h) over ClientSession. Every entry point catches what C++ might throw, maps
// absl::Status to hs_result, and keeps the message for hs_last_error() on the calling thread.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client_session.h"
#include "hisparse/common/version.h"
#include "hisparse/hisparse.h"

struct hs_session {
  std::unique_ptr<hisparse::ClientSession> impl;
};

namespace {

thread_local std::string g_last_error;

// The hs_result of a status, without touching hs_last_error.
hs_result CodeOf(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return HS_OK;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return HS_ERR_INVALID_ARGUMENT;
    case absl::StatusCode::kNotFound:
      return HS_ERR_NOT_FOUND;
    case absl::StatusCode::kAlreadyExists:
      return HS_ERR_ALREADY_EXISTS;
    case absl::StatusCode::kResourceExhausted:
      return HS_ERR_RESOURCE_EXHAUSTED;
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      return HS_ERR_PERMISSION_DENIED;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAborted:
      return HS_ERR_FAILED_PRECONDITION;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
      return HS_ERR_UNAVAILABLE;
    case absl::StatusCode::kUnimplemented:
      return HS_ERR_UNIMPLEMENTED;
    default:
      return HS_ERR_INTERNAL;
  }
}

hs_result ToResult(const absl::Status& s) {
  if (s.ok()) return HS_OK;
  g_last_error = std::string(s.message());
  return CodeOf(s);
}

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

// A C caller may pass any int as a mode: read it as one (a load of an out-of-range enum is
// undefined). False for neither mode.
bool ReadMode(hs_batch_mode mode, bool* all_or_nothing) {
  int value = 0;
  static_assert(sizeof value == sizeof mode, "hs_batch_mode is an int");
  std::memcpy(&value, &mode, sizeof value);
  *all_or_nothing = value == HS_BATCH_ALL_OR_NOTHING;
  return value == HS_BATCH_ALL_OR_NOTHING || value == HS_BATCH_PER_ITEM;
}

constexpr const char* kBadMode = "mode must be HS_BATCH_ALL_OR_NOTHING or HS_BATCH_PER_ITEM";

hs_result Fail(hs_result r, const char* msg) {
  g_last_error = msg;
  return r;
}

// Runs `body`, turning any escaping C++ exception into HS_ERR_INTERNAL.
template <typename F>
hs_result Guard(F&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Fail(HS_ERR_RESOURCE_EXHAUSTED, "out of memory");
  } catch (const std::exception& e) {
    return Fail(HS_ERR_INTERNAL, e.what());
  } catch (...) {
    return Fail(HS_ERR_INTERNAL, "unknown C++ exception");
  }
}

// The size of each size-prefixed struct's first version: the smallest struct_size accepted. A
// field added later goes after these, and the struct's old callers keep working.
constexpr size_t kSessionOptionsV1 = offsetof(hs_session_options, layer_anchor);  // ABI 1.0
constexpr size_t kRequestInfoV1 = sizeof(hs_request_info);
constexpr size_t kSessionInfoV1 = offsetof(hs_session_info, arena_kind);  // ABI 1.0
constexpr size_t kStatsV1 = sizeof(hs_stats);
constexpr size_t kResolveArgsV1 = offsetof(hs_resolve_args, page_table);  // ABI 1.0
constexpr size_t kStoreIndexedArgsV1 = sizeof(hs_store_indexed_args);     // ABI 1.3

bool SizeOk(uint32_t struct_size, size_t first_version) { return struct_size >= first_version; }

// An input struct as this library knows it: the caller's bytes up to its struct_size, zero past it.
template <typename T>
T ReadSized(const T& in) {
  T out;
  std::memset(&out, 0, sizeof(out));
  std::memcpy(&out, &in, std::min<size_t>(in.struct_size, sizeof(out)));
  out.struct_size = sizeof(out);
  return out;
}

// Writes `value` to a caller's output struct: only the bytes its struct_size covers (an older
// caller's smaller struct), nothing past this library's sizeof (a newer caller's larger one), and
// struct_size stays the caller's.
template <typename T>
void WriteSized(T value, T* out) {
  const uint32_t size = out->struct_size;
  value.struct_size = size;
  std::memcpy(out, &value, std::min<size_t>(size, sizeof(value)));
}

}  // namespace

extern "C" {

const char* hs_result_string(hs_result r) {
  switch (r) {
    case HS_OK:
      return "ok";
    case HS_ERR_INVALID_ARGUMENT:
      return "invalid argument";
    case HS_ERR_NOT_FOUND:
      return "not found";
    case HS_ERR_ALREADY_EXISTS:
      return "already exists";
    case HS_ERR_RESOURCE_EXHAUSTED:
      return "resource exhausted";
    case HS_ERR_PERMISSION_DENIED:
      return "permission denied";
    case HS_ERR_FAILED_PRECONDITION:
      return "failed precondition";
    case HS_ERR_UNAVAILABLE:
      return "unavailable";
    case HS_ERR_UNIMPLEMENTED:
      return "unimplemented";
    case HS_ERR_INTERNAL:
      return "internal error";
    case HS_ERR_ABORTED:
      return "aborted (another item of the batch failed)";
  }
  return "unknown hs_result";
}

const char* hs_last_error(void) { return g_last_error.c_str(); }
int hs_abi_version(void) { return HS_ABI_VERSION; }
void hs_abi_version_get(int* major, int* minor) {
  if (major != nullptr) *major = HS_ABI_VERSION_MAJOR;
  if (minor != nullptr) *minor = HS_ABI_VERSION_MINOR;
}
const char* hs_version(void) { return HISPARSE_VERSION; }

hs_result hs_session_open(const hs_session_options* options, hs_session** out) {
  return Guard([&] {
    if (options == nullptr || out == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "options and out must not be NULL");
    *out = nullptr;  // on every failure below
    // ABI 1.0 callers end before layer_anchor; fields they do not know are zero (NULL).
    if (!SizeOk(options->struct_size, kSessionOptionsV1)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "hs_session_options.struct_size is too small: use HS_SESSION_OPTIONS_INIT");
    }
    const hs_session_options o = ReadSized(*options);
    auto impl = hisparse::ClientSession::Open(o);
    if (!impl.ok()) return ToResult(impl.status());
    *out = new hs_session{std::move(*impl)};
    return HS_OK;
  });
}

void hs_session_close(hs_session* session) {
  try {
    delete session;
  } catch (...) {
  }
}

hs_result hs_admit(hs_session* s, uint64_t request_id, uint32_t context_tokens, uint32_t token_budget,
                   hs_request_info* out) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    if (out != nullptr && !SizeOk(out->struct_size, kRequestInfoV1)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "hs_request_info.struct_size is too small: use HS_REQUEST_INFO_INIT");
    }
    auto r = s->impl->Admit(request_id, context_tokens, token_budget);
    if (!r.ok()) return ToResult(r.status());
    if (out != nullptr) WriteSized(*r, out);
    return HS_OK;
  });
}

hs_result hs_extend(hs_session* s, uint64_t request_id, uint32_t token_budget, hs_request_info* out) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    if (out != nullptr && !SizeOk(out->struct_size, kRequestInfoV1)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "hs_request_info.struct_size is too small: use HS_REQUEST_INFO_INIT");
    }
    auto r = s->impl->Extend(request_id, token_budget);
    if (!r.ok()) return ToResult(r.status());
    if (out != nullptr) WriteSized(*r, out);
    return HS_OK;
  });
}

hs_result hs_release(hs_session* s, uint64_t request_id) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    return ToResult(s->impl->Release(request_id));
  });
}

hs_result hs_admit_shared(hs_session* s, uint64_t request_id, uint32_t context_tokens, uint32_t token_budget,
                          uint64_t parent_request_id, uint32_t prefix_tokens, hs_request_info* out) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    if (out != nullptr && !SizeOk(out->struct_size, kRequestInfoV1)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "hs_request_info.struct_size is too small: use HS_REQUEST_INFO_INIT");
    }
    auto r = s->impl->AdmitShared(request_id, context_tokens, token_budget, parent_request_id, prefix_tokens);
    if (!r.ok()) return ToResult(r.status());
    if (out != nullptr) WriteSized(*r, out);
    return HS_OK;
  });
}

hs_result hs_admit_group(hs_session* s, uint64_t request_id, uint32_t context_tokens, uint32_t token_budget,
                         hs_request_info* out) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    if (out != nullptr && !SizeOk(out->struct_size, kRequestInfoV1)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "hs_request_info.struct_size is too small: use HS_REQUEST_INFO_INIT");
    }
    auto r = s->impl->AdmitGroup(request_id, context_tokens, token_budget);
    if (!r.ok()) return ToResult(r.status());
    if (out != nullptr) WriteSized(*r, out);
    return HS_OK;
  });
}

hs_result hs_park(hs_session* s, uint64_t request_id) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    return ToResult(s->impl->Park(request_id));
  });
}

hs_result hs_resume(hs_session* s, uint64_t request_id, hs_request_info* out) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    if (out != nullptr && !SizeOk(out->struct_size, kRequestInfoV1)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "hs_request_info.struct_size is too small: use HS_REQUEST_INFO_INIT");
    }
    auto r = s->impl->Resume(request_id);
    if (!r.ok()) return ToResult(r.status());
    if (out != nullptr) WriteSized(*r, out);
    return HS_OK;
  });
}

hs_result hs_record_ptr(hs_session* s, uint64_t request_id, uint32_t layer, uint32_t position, void** out) {
  return Guard([&] {
    if (s == nullptr || out == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session and out must not be NULL");
    auto p = s->impl->RecordPtr(request_id, layer, position);
    if (!p.ok()) return ToResult(p.status());
    *out = *p;
    return HS_OK;
  });
}

hs_result hs_session_get_info(hs_session* s, hs_session_info* out) {
  return Guard([&] {
    if (s == nullptr || out == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session and out must not be NULL");
    // Callers built before arena_kind was added pass the older, smaller struct: they get the
    // fields they know of.
    if (!SizeOk(out->struct_size, kSessionInfoV1)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "hs_session_info.struct_size is too small: use HS_SESSION_INFO_INIT");
    }
    WriteSized(s->impl->Info(), out);
    return HS_OK;
  });
}

hs_result hs_stats_get(hs_session* s, hs_stats* out) {
  return Guard([&] {
    if (s == nullptr || out == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session and out must not be NULL");
    if (!SizeOk(out->struct_size, kStatsV1)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "hs_stats.struct_size is too small: use HS_STATS_INIT");
    }
    auto st = s->impl->NodeStats();
    if (!st.ok()) return ToResult(st.status());
    hs_stats r = HS_STATS_INIT;
    r.pool_capacity_bytes = st->host_pool().capacity_bytes();
    r.pool_used_bytes = st->host_pool().used_bytes();
    r.pool_free_bytes = st->host_pool().free_bytes();
    r.pool_fragmentation = st->host_pool().fragmentation();
    r.sessions = st->sessions();
    r.requests = st->requests();
    for (const auto& ss : st->session_stats()) {
      if (ss.session_id() != s->impl->session_id()) continue;
      r.session_requests = ss.requests();
      r.session_host_bytes = ss.host_bytes();
      r.hits = ss.hits();
      r.misses = ss.misses();
      r.bytes_fetched = ss.bytes_fetched();
    }
    if (s->impl->backend_kind() == HS_BACKEND_CUDA && s->impl->arena_kind() == hisparse::v1::ARENA_KIND_HOST) {
      // The CUDA backend keeps a private GPU arena when the daemon serves host arenas (device
      // auto/host): its counters are only here. With daemon GPU arenas the daemon reads them.
      auto c = s->impl->Counters();
      if (!c.ok()) return ToResult(c.status());
      r.hits = c->hits;
      r.misses = c->misses;
      r.bytes_fetched = c->bytes_fetched;
    }
    WriteSized(r, out);
    return HS_OK;
  });
}

hs_result hs_resolve(hs_session* s, const hs_resolve_args* args) {
  return Guard([&] {
    if (s == nullptr || args == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session and args must not be NULL");
    if (!SizeOk(args->struct_size, kResolveArgsV1)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "hs_resolve_args.struct_size is too small: use HS_RESOLVE_ARGS_INIT");
    }
    return ToResult(s->impl->Resolve(ReadSized(*args)));
  });
}

hs_result hs_store(hs_session* s, uint64_t request_id, int32_t start_pos, int32_t num_tokens, int32_t seq_len_after,
                   const void* src, int64_t src_layer_stride, int64_t src_token_stride, void* stream) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    return ToResult(s->impl->Store(request_id, start_pos, num_tokens, seq_len_after, src, src_layer_stride,
                                   src_token_stride, stream));
  });
}

hs_result hs_store_indexed(hs_session* s, const hs_store_indexed_args* args) {
  return Guard([&] {
    if (s == nullptr || args == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session and args must not be NULL");
    if (!SizeOk(args->struct_size, kStoreIndexedArgsV1)) {
      return Fail(HS_ERR_INVALID_ARGUMENT,
                  "hs_store_indexed_args.struct_size is too small: use HS_STORE_INDEXED_ARGS_INIT");
    }
    return ToResult(s->impl->StoreIndexed(ReadSized(*args)));
  });
}

hs_result hs_append(hs_session* s, uint32_t layer, int32_t max_batch, const int32_t* batch_size, const int32_t* rows,
                    const int32_t* seq_lens, const void* src, int64_t src_stride, void* stream) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    return ToResult(s->impl->Append(layer, max_batch, batch_size, rows, seq_lens, nullptr, src, src_stride, stream));
  });
}

hs_result hs_append_tokens(hs_session* s, uint32_t layer, int32_t max_batch, const int32_t* batch_size,
                           const int32_t* rows, const int32_t* seq_lens, const int32_t* token_counts, const void* src,
                           int64_t src_stride, void* stream) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    return ToResult(
        s->impl->Append(layer, max_batch, batch_size, rows, seq_lens, token_counts, src, src_stride, stream));
  });
}

hs_result hs_poll_evicted(hs_session* s, uint64_t* ids, size_t capacity, size_t* count) {
  return Guard([&] {
    if (s == nullptr || count == nullptr || (ids == nullptr && capacity > 0)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "session and count must not be NULL, nor ids when capacity > 0");
    }
    std::vector<uint64_t> evicted = s->impl->TakeEvicted();
    const size_t n = std::min(capacity, evicted.size());
    std::copy(evicted.begin(), evicted.begin() + n, ids);
    s->impl->ReturnEvicted(std::vector<uint64_t>(evicted.begin() + n, evicted.end()));
    *count = n;
    return HS_OK;
  });
}

hs_result hs_prefetch(hs_session* s, uint32_t layer, void* stream) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session must not be NULL");
    return ToResult(s->impl->Prefetch(layer, stream));
  });
}

hs_result hs_check_errors(hs_session* s) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    return ToResult(s->impl->CheckErrors());
  });
}

}  // extern "C"

namespace {

// hs_admit_batch and hs_admit_import_batch.
hs_result AdmitBatchItems(hs_session* s, size_t n, const uint64_t* request_ids, const uint32_t* context_tokens,
                          const uint32_t* token_budgets, hs_batch_mode mode, bool begin_import, hs_result* out_results,
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
    const absl::Status& failed = batch->items[batch->failed_item].status();
    return ToResult(absl::Status(failed.code(), "items[" + std::to_string(batch->failed_item) + "] failed the batch (" +
                                                    std::string(failed.message()) + ")"));
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
  const absl::Status& failed = StatusOf(items[failed_item]);
  return ToResult(absl::Status(failed.code(), "items[" + std::to_string(failed_item) + "] failed the batch (" +
                                                  std::string(failed.message()) + ")"));
}

}  // namespace

extern "C" {

hs_result hs_admit_batch(hs_session* s, size_t n, const uint64_t* request_ids, const uint32_t* context_tokens,
                         const uint32_t* token_budgets, hs_batch_mode mode, hs_result* out_results, uint32_t* out_rows,
                         uint32_t* out_capacity_tokens) {
  return AdmitBatchItems(s, n, request_ids, context_tokens, token_budgets, mode, /*begin_import=*/false, out_results,
                         out_rows, out_capacity_tokens);
}

// Since ABI 1.8: batched park, resume and import.
hs_result hs_admit_import_batch(hs_session* s, size_t n, const uint64_t* request_ids, const uint32_t* context_tokens,
                                const uint32_t* token_budgets, hs_batch_mode mode, hs_result* out_results) {
  return AdmitBatchItems(s, n, request_ids, context_tokens, token_budgets, mode, /*begin_import=*/true, out_results,
                         nullptr, nullptr);
}

hs_result hs_park_batch(hs_session* s, size_t n, const uint64_t* request_ids, hs_batch_mode mode,
                        hs_result* out_results) {
  return Guard([&] {
    if (const char* bad = BatchArgsError(s, n, request_ids, out_results)) return Fail(HS_ERR_INVALID_ARGUMENT, bad);
    bool all_or_nothing = false;
    if (!ReadMode(mode, &all_or_nothing)) return Fail(HS_ERR_INVALID_ARGUMENT, kBadMode);
    auto parked = s->impl->ParkBatch(std::vector<uint64_t>(request_ids, request_ids + n), all_or_nothing);
    if (!parked.ok()) return ToResult(parked.status());
    return BatchOutcome(parked->items, parked->failed_item, out_results);
  });
}

hs_result hs_resume_batch(hs_session* s, size_t n, const uint64_t* request_ids, hs_batch_mode mode,
                          hs_result* out_results, uint32_t* out_rows, uint32_t* out_capacity_tokens) {
  return Guard([&] {
    if (const char* bad = BatchArgsError(s, n, request_ids, out_results)) return Fail(HS_ERR_INVALID_ARGUMENT, bad);
    bool all_or_nothing = false;
    if (!ReadMode(mode, &all_or_nothing)) return Fail(HS_ERR_INVALID_ARGUMENT, kBadMode);
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

// Since ABI 1.6: imports.
hs_result hs_admit_import(hs_session* s, uint64_t request_id, uint32_t context_tokens, uint32_t token_budget) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    return ToResult(s->impl->AdmitImport(request_id, context_tokens, token_budget));
  });
}

hs_result hs_import_grant(hs_session* s, uint64_t request_id, void* buf, size_t capacity, size_t* grant_bytes) {
  return Guard([&] {
    if (s == nullptr || grant_bytes == nullptr || (buf == nullptr && capacity > 0)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "session and grant_bytes must not be NULL, nor buf when capacity > 0");
    }
    auto grant = s->impl->ImportGrant(request_id);
    if (!grant.ok()) return ToResult(grant.status());
    *grant_bytes = grant->size();
    if (capacity < grant->size()) {
      return Fail(HS_ERR_RESOURCE_EXHAUSTED, "the grant does not fit: capacity is smaller than *grant_bytes");
    }
    std::memcpy(buf, grant->data(), grant->size());
    return HS_OK;
  });
}

hs_result hs_await_import(hs_session* s, uint64_t request_id, uint32_t timeout_ms, hs_request_info* out) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    if (out != nullptr && !SizeOk(out->struct_size, kRequestInfoV1)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "hs_request_info.struct_size is too small: use HS_REQUEST_INFO_INIT");
    }
    auto r = s->impl->AwaitImport(request_id, timeout_ms);
    if (!r.ok()) return ToResult(r.status());
    if (out != nullptr) WriteSized(*r, out);
    return HS_OK;
  });
}

// ---- Durable requests (ABI 1.7) ----

hs_result hs_admit_durable(hs_session* s, uint64_t request_id, uint32_t context_tokens, uint32_t token_budget,
                           uint32_t lease_seconds, hs_request_info* out) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    if (out != nullptr && !SizeOk(out->struct_size, kRequestInfoV1)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "hs_request_info.struct_size is too small: use HS_REQUEST_INFO_INIT");
    }
    auto r = s->impl->AdmitDurable(request_id, context_tokens, token_budget, lease_seconds);
    if (!r.ok()) return ToResult(r.status());
    if (out != nullptr) WriteSized(*r, out);
    return HS_OK;
  });
}

hs_result hs_set_lease(hs_session* s, uint64_t request_id, uint32_t lease_seconds) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    return ToResult(s->impl->SetLease(request_id, lease_seconds).status());
  });
}

hs_result hs_list_adoptable(hs_session* s, uint64_t* dead_session_ids, uint64_t* request_ids,
                            double* lease_seconds_left, size_t capacity, size_t* count) {
  return Guard([&] {
    if (s == nullptr || count == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session and count must not be NULL");
    auto listed = s->impl->ListAdoptable();
    if (!listed.ok()) return ToResult(listed.status());
    *count = listed->size();
    for (size_t i = 0; i < listed->size() && i < capacity; ++i) {
      if (dead_session_ids != nullptr) dead_session_ids[i] = (*listed)[i].dead_session_id();
      if (request_ids != nullptr) request_ids[i] = (*listed)[i].request_id();
      if (lease_seconds_left != nullptr) lease_seconds_left[i] = (*listed)[i].lease_seconds_left();
    }
    if (capacity < listed->size()) {
      return Fail(HS_ERR_RESOURCE_EXHAUSTED, "more adoptable requests than capacity: see *count");
    }
    return HS_OK;
  });
}

hs_result hs_adopt(hs_session* s, uint64_t dead_session_id, uint64_t* out_request_ids, size_t capacity, size_t* count) {
  return Guard([&] {
    if (s == nullptr || count == nullptr || (out_request_ids == nullptr && capacity > 0)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "session and count must not be NULL, nor out_request_ids when capacity > 0");
    }
    auto ids = s->impl->Adopt(dead_session_id);
    if (!ids.ok()) return ToResult(ids.status());
    *count = ids->size();
    for (size_t i = 0; i < ids->size() && i < capacity; ++i) out_request_ids[i] = (*ids)[i];
    return HS_OK;
  });
}

}  // extern "C"
