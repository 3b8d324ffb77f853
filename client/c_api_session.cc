// The C ABI's session calls (hisparse.h): open and close a session, its info, the node's and the
// session's stats, and eviction notices.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "c_api_internal.h"
#include "client_session.h"
#include "hisparse/hisparse.h"

using hisparse::c_api::Fail;
using hisparse::c_api::Guard;
using hisparse::c_api::kRecoveryV1;
using hisparse::c_api::kSessionInfoV1;
using hisparse::c_api::kSessionOptionsV1;
using hisparse::c_api::kStatsV1;
using hisparse::c_api::ReadSized;
using hisparse::c_api::SizeOk;
using hisparse::c_api::ToResult;
using hisparse::c_api::WriteSized;

namespace {

constexpr uint32_t kDefaultRecoverMs = 30000;  // hs_session_recover's timeout_ms 0

// The first `capacity` of `items` into `out` (the last recovery's report); how many.
template <typename T>
size_t CopyPrefix(const std::vector<T>& items, T* out, size_t capacity) {
  const size_t n = std::min(capacity, items.size());
  std::copy(items.begin(), items.begin() + n, out);
  return n;
}

hs_recovery RecoveryOf(const hisparse::ClientSession::Recovery& r) {
  hs_recovery v = HS_RECOVERY_INIT;
  v.attempts = r.attempts;
  v.old_session_id = r.old_session_id;
  v.new_session_id = r.new_session_id;
  v.kept = r.kept.size();
  v.lost = r.lost.size();
  v.seconds = r.seconds;
  v.arena_moved = r.arena_moved ? 1 : 0;
  v.reopen_seconds = r.reopen_seconds;
  return v;
}

}  // namespace

extern "C" {

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

hs_result hs_session_get_timings(hs_session* s, hs_session_timings* out) {
  return Guard([&] {
    if (s == nullptr || out == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session and out must not be NULL");
    if (!SizeOk(out->struct_size, sizeof(hs_session_timings))) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "hs_session_timings.struct_size is too small: use HS_SESSION_TIMINGS_INIT");
    }
    WriteSized(s->Get()->Timings(), out);
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
    WriteSized(s->Get()->Info(), out);
    return HS_OK;
  });
}

hs_result hs_stats_get(hs_session* s, hs_stats* out) {
  return Guard([&] {
    if (s == nullptr || out == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session and out must not be NULL");
    if (!SizeOk(out->struct_size, kStatsV1)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "hs_stats.struct_size is too small: use HS_STATS_INIT");
    }
    const std::shared_ptr<hisparse::ClientSession> impl = s->Get();
    auto st = impl->NodeStats();
    if (!st.ok()) return ToResult(st.status());
    hs_stats r = HS_STATS_INIT;
    r.pool_capacity_bytes = st->host_pool().capacity_bytes();
    r.pool_used_bytes = st->host_pool().used_bytes();
    r.pool_free_bytes = st->host_pool().free_bytes();
    r.pool_fragmentation = st->host_pool().fragmentation();
    r.sessions = st->sessions();
    r.requests = st->requests();
    for (const auto& ss : st->session_stats()) {
      if (ss.session_id() != impl->session_id()) continue;
      r.session_requests = ss.requests();
      r.session_host_bytes = ss.host_bytes();
      r.hits = ss.hits();
      r.misses = ss.misses();
      r.bytes_fetched = ss.bytes_fetched();
    }
    if (impl->backend_kind() == HS_BACKEND_CUDA && impl->arena_kind() == hisparse::v1::ARENA_KIND_HOST) {
      // The CUDA backend keeps a private GPU arena when the daemon serves host arenas (device
      // auto/host): its counters are only here. With daemon GPU arenas the daemon reads them.
      auto c = impl->Counters();
      if (!c.ok()) return ToResult(c.status());
      r.hits = c->hits;
      r.misses = c->misses;
      r.bytes_fetched = c->bytes_fetched;
    }
    WriteSized(r, out);
    return HS_OK;
  });
}

hs_result hs_poll_evicted(hs_session* s, uint64_t* ids, size_t capacity, size_t* count) {
  return Guard([&] {
    if (s == nullptr || count == nullptr || (ids == nullptr && capacity > 0)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "session and count must not be NULL, nor ids when capacity > 0");
    }
    const std::shared_ptr<hisparse::ClientSession> impl = s->Get();
    std::vector<uint64_t> evicted = impl->TakeEvicted();
    const size_t n = std::min(capacity, evicted.size());
    std::copy(evicted.begin(), evicted.begin() + n, ids);
    impl->ReturnEvicted(std::vector<uint64_t>(evicted.begin() + n, evicted.end()));
    *count = n;
    return HS_OK;
  });
}

hs_result hs_session_get_state(hs_session* s, hs_session_state* out) {
  return Guard([&] {
    if (s == nullptr || out == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session and out must not be NULL");
    *out = s->Get()->alive() ? HS_SESSION_LIVE : HS_SESSION_ENDED;
    return HS_OK;
  });
}

hs_result hs_session_recover(hs_session* s, uint32_t timeout_ms, hs_recovery* out) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session must not be NULL");
    if (out != nullptr && !SizeOk(out->struct_size, kRecoveryV1)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "hs_recovery.struct_size is too small: use HS_RECOVERY_INIT");
    }
    absl::MutexLock lock(&s->recovery_mu);
    std::shared_ptr<hisparse::ClientSession> ended = s->Get();
    auto recovered = ended->Recover(absl::Milliseconds(timeout_ms != 0 ? timeout_ms : kDefaultRecoverMs));
    if (!recovered.ok()) return ToResult(recovered.status());
    s->Set(std::move(recovered->session));
    s->last_recovery = std::move(recovered->recovery);
    ended.reset();  // the ended session goes here, or when the last call still running on it returns
    if (out != nullptr) WriteSized(RecoveryOf(s->last_recovery), out);
    return HS_OK;
  });
}

hs_result hs_recovery_kept(hs_session* s, hs_recovered_request* out, size_t capacity, size_t* count) {
  return Guard([&] {
    if (s == nullptr || count == nullptr || (out == nullptr && capacity > 0)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "session and count must not be NULL, nor out when capacity > 0");
    }
    absl::MutexLock lock(&s->recovery_mu);
    *count = CopyPrefix(s->last_recovery.kept, out, capacity);
    return HS_OK;
  });
}

hs_result hs_recovery_lost(hs_session* s, uint64_t* ids, size_t capacity, size_t* count) {
  return Guard([&] {
    if (s == nullptr || count == nullptr || (ids == nullptr && capacity > 0)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "session and count must not be NULL, nor ids when capacity > 0");
    }
    absl::MutexLock lock(&s->recovery_mu);
    *count = CopyPrefix(s->last_recovery.lost, ids, capacity);
    return HS_OK;
  });
}

}  // extern "C"
