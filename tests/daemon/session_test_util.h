// What the SessionManager tests (tests/daemon/session_*_test.cc) share: a manager over a small
// host page pool, host sessions opened as a given tenant, the one-request calls they make, and
// the checks they repeat. Header-only: every function is inline and returns what it makes (the
// caller owns it); failures of a step a test relies on are reported as gtest failures.
#ifndef HISPARSE_TESTS_DAEMON_SESSION_TEST_UTIL_H_
#define HISPARSE_TESTS_DAEMON_SESSION_TEST_UTIL_H_

#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "hisparse/common/unix_socket.h"
#include "hisparse/daemon/page_pool.h"
#include "hisparse/daemon/session_manager.h"

namespace hisparse {
namespace session_test {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kPage = 4096;  // 256 records of 16 bytes

// A host pool of `pool_bytes` in kPage pages and 1 MiB slabs, none reserved (every byte of the
// budget is the sessions' to take), no hugepages.
inline PagePool::Options TestPoolOptions(uint64_t pool_bytes) {
  PagePool::Options po;
  po.budget_bytes = pool_bytes;
  po.page_bytes = kPage;
  po.slab_bytes = kMiB;
  po.reserve_slabs = 0;
  po.hugepages = PagePool::Hugepages::kOff;
  po.pretouch_threads = 1;
  return po;
}

// A SessionManager of `options` over TestPoolOptions(pool_bytes). Null, with a test failure, when
// the pool cannot be made.
inline std::unique_ptr<SessionManager> MakeManager(uint64_t pool_bytes, const SessionManager::Options& options = {}) {
  auto pool = PagePool::Create(TestPoolOptions(pool_bytes));
  EXPECT_TRUE(pool.ok()) << pool.status();
  if (!pool.ok()) return nullptr;
  return std::make_unique<SessionManager>(options, std::move(*pool));
}

// A fake clock one second a reading, from the epoch (read under the manager's lock): the LRU
// order of evict_lru_idle is the call order.
inline AdmissionLedger::Clock TickingClock() {
  return [t = absl::UnixEpoch()]() mutable { return t += absl::Seconds(1); };
}

// The peer of a Session stream of tenant `uid`, in this process.
inline PeerCredentials Owner(uint32_t uid) {
  PeerCredentials peer;
  peer.uid = uid;
  peer.pid = ::getpid();
  return peer;
}

// A host session (gpu -1, k 1, one slot) as an engine declares it.
struct HostSession {
  std::string engine_name;
  uint32_t layers = 1;
  uint32_t record_bytes = 16;
  uint32_t max_requests = 128;
  uint32_t max_context_tokens = 0;  // 0: the daemon's limit
};

inline v1::OpenSession OpenMessage(const HostSession& s) {
  v1::OpenSession open;
  open.set_engine_name(s.engine_name);
  v1::Geometry* g = open.mutable_geometry();
  g->set_gpu(-1);
  g->set_num_layers(s.layers);
  g->set_record_bytes(s.record_bytes);
  g->set_k(1);
  g->set_slots(1);
  g->set_max_requests(s.max_requests);
  g->set_max_context_tokens(s.max_context_tokens);
  return open;
}

// Opens `open` as tenant `uid`: the session's ref, or OpenSession's error.
inline absl::StatusOr<v1::SessionRef> OpenRef(SessionManager& sm, const v1::OpenSession& open, uint32_t uid) {
  auto opened = sm.OpenSession(open, Owner(uid));
  if (!opened.ok()) return opened.status();
  v1::SessionRef ref;
  ref.set_session_id(opened->session_id());
  ref.set_token(opened->token());
  return ref;
}

// Opens `s` as tenant `uid` and expects it to open: an empty ref, with a test failure, otherwise.
inline v1::SessionRef OpenHost(SessionManager& sm, const HostSession& s, uint32_t uid) {
  auto ref = OpenRef(sm, OpenMessage(s), uid);
  EXPECT_TRUE(ref.ok()) << ref.status();
  return ref.ok() ? *ref : v1::SessionRef();
}

// An AdmitRequest of `ref` for request `id` with a budget of `tokens`; callers set the rest.
inline v1::AdmitRequest AdmitOf(const v1::SessionRef& ref, uint64_t id, uint32_t tokens) {
  v1::AdmitRequest req;
  *req.mutable_session() = ref;
  req.set_request_id(id);
  req.set_token_budget(tokens);
  return req;
}

inline absl::Status Release(SessionManager& sm, const v1::SessionRef& ref, uint64_t id) {
  v1::ReleaseRequest req;
  *req.mutable_session() = ref;
  req.set_request_id(id);
  return sm.Release(req);
}

inline absl::StatusOr<v1::ParkResponse> Park(SessionManager& sm, const v1::SessionRef& ref, uint64_t id) {
  v1::ParkRequest req;
  *req.mutable_session() = ref;
  req.set_request_id(id);
  return sm.Park(req);
}

inline absl::StatusOr<v1::ResumeResponse> Resume(SessionManager& sm, const v1::SessionRef& ref, uint64_t id) {
  v1::ResumeRequest req;
  *req.mutable_session() = ref;
  req.set_request_id(id);
  return sm.Resume(req);
}

inline uint64_t PagesUsed(const SessionManager& sm) { return sm.Stats().host_pool().pages_used(); }

// Each result's code of a batch response (0 for an item that succeeded).
template <typename Response>
std::vector<int> Codes(const Response& resp) {
  std::vector<int> codes;
  for (const auto& r : resp.results()) codes.push_back(r.has_error() ? r.error().code() : 0);
  return codes;
}

}  // namespace session_test
}  // namespace hisparse

// Expects the manager's accounting invariants to hold, showing what broke when they do not.
#define EXPECT_INVARIANTS(sm)                  \
  do {                                         \
    absl::Status st_ = (sm).CheckInvariants(); \
    EXPECT_TRUE(st_.ok()) << st_;              \
  } while (0)

#endif  // HISPARSE_TESTS_DAEMON_SESSION_TEST_UTIL_H_
