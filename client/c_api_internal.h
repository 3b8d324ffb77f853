// What the C ABI's files (client/c_api_*.cc) share: the hs_session handle, the one conversion of
// absl::Status into hs_result and hs_last_error(), the exception guard every entry point runs
// its body in, and the reading and writing of size-prefixed structs.
//
// Ownership: an hs_session owns its ClientSession; hs_session_open makes one, hs_session_recover
// puts its successor in its place (the ended one goes when the last call on it returns), and
// hs_session_close deletes it. hs_last_error()'s message belongs to the calling thread (thread_local), so these
// helpers are as thread-safe as the ClientSession calls they wrap.
//
// Everything here has hidden visibility: libhisparse.so exports the hs_* functions of hisparse.h
// and nothing of this header (`nm -D --defined-only build/lib/libhisparse.so` shows the list).
#ifndef HISPARSE_CLIENT_C_API_INTERNAL_H_
#define HISPARSE_CLIENT_C_API_INTERNAL_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "client_session.h"
#include "hisparse/hisparse.h"

// The handle holds the session now in place; hs_session_recover puts a new one there. Each call
// takes the session it runs on once (Get), so a call that began before a swap finishes on the
// session it began on, which lives until the last such call returns.
struct hs_session {
  explicit hs_session(std::unique_ptr<hisparse::ClientSession> session) : impl(std::move(session)) {}
  std::shared_ptr<hisparse::ClientSession> Get() const { return std::atomic_load(&impl); }
  void Set(std::shared_ptr<hisparse::ClientSession> session) { std::atomic_store(&impl, std::move(session)); }

  std::shared_ptr<hisparse::ClientSession> impl;  // read and written through Get and Set only
  absl::Mutex recovery_mu;                        // one hs_session_recover at a time
  hisparse::ClientSession::Recovery last_recovery ABSL_GUARDED_BY(recovery_mu);
};

// Hidden visibility (see the top of this file), by pragma: clang-format 14 mangles a namespace
// attribute.
#pragma GCC visibility push(hidden)
namespace hisparse {
namespace c_api {

// The hs_result of a status, without touching hs_last_error.
hs_result CodeOf(const absl::Status& s);

// Keeps `message` for hs_last_error() on the calling thread.
void SetLastError(absl::string_view message);

// The hs_result of `s`; a failure's message becomes hs_last_error().
inline hs_result ToResult(const absl::Status& s) {
  if (s.ok()) return HS_OK;
  SetLastError(s.message());
  return CodeOf(s);
}

// Returns `r` with `msg` as hs_last_error().
hs_result Fail(hs_result r, const char* msg);

// Runs `body`, turning any escaping C++ exception into HS_ERR_INTERNAL (HS_ERR_RESOURCE_EXHAUSTED
// for std::bad_alloc): no exception crosses the C ABI.
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
constexpr size_t kAdmitArgsV1 = sizeof(hs_admit_args);                    // ABI 1.10
constexpr size_t kRecoveryV1 = sizeof(hs_recovery);                       // ABI 1.11
constexpr size_t kTopkArgsV1 = offsetof(hs_topk_args, after_count);       // ABI 1.16
constexpr size_t kPrewarmArgsV1 = sizeof(hs_prewarm_args);                // ABI 1.19

inline bool SizeOk(uint32_t struct_size, size_t first_version) { return struct_size >= first_version; }

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

}  // namespace c_api
}  // namespace hisparse
#pragma GCC visibility pop

#endif  // HISPARSE_CLIENT_C_API_INTERNAL_H_
