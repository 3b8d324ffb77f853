// SessionManager's park/resume and shared prefixes (parking.cc, shared_prefixes.cc):
// rows freed and retaken, pages kept byte for byte, quotas, parked requests evicted first, shared
// pages referenced and charged once, the charge passing on as holders leave, and every refusal's
// code. CheckInvariants runs after every step.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "hisparse/daemon/session_manager.h"
#include "session_test_util.h"

namespace hisparse {
namespace session_parking_test {

using session_test::AdmitOf;
using session_test::kMiB;
using session_test::kPage;
using session_test::Park;
using session_test::Release;
using session_test::Resume;

constexpr uint32_t kPerPage = 256;

// A clock the test advances: the LRU order of evict_lru_idle is the admission order below.
struct FakeClock {
  absl::Time now = absl::UnixEpoch();
  AdmissionLedger::Clock Fn() {
    return [this] { return now += absl::Seconds(1); };
  }
};

std::unique_ptr<SessionManager> MakeManager(uint64_t pool_bytes, const SessionManager::QuotaOptions& quotas = {},
                                            bool evict = false, FakeClock* clock = nullptr) {
  SessionManager::Options o;
  o.quotas = quotas;
  o.evict_on_pool_full = evict;
  o.max_sessions = 16;
  if (clock != nullptr) o.clock = clock->Fn();
  return session_test::MakeManager(pool_bytes, o);
}

v1::SessionRef Open(SessionManager& sm, uint32_t uid, uint32_t layers, uint32_t rows) {
  session_test::HostSession host;
  host.engine_name = "session-parking-test";
  host.layers = layers;
  host.max_requests = rows;
  return session_test::OpenHost(sm, host, uid);
}

absl::StatusOr<v1::AdmitResponse> Admit(SessionManager& sm, const v1::SessionRef& ref, uint64_t id, uint32_t tokens,
                                        uint64_t parent = 0, uint32_t prefix = 0) {
  v1::AdmitRequest req = AdmitOf(ref, id, tokens);
  req.set_parent_request_id(parent);
  req.set_prefix_tokens(prefix);
  return sm.Admit(req);
}

// Fills every record of (request, layer) below `tokens` with a pattern of (seed, layer, position).
void Fill(SessionManager& sm, uint64_t sid, uint64_t rid, uint32_t layers, uint32_t tokens, uint8_t seed) {
  for (uint32_t l = 0; l < layers; ++l) {
    for (uint32_t p = 0; p < tokens; ++p) {
      auto rec = sm.RecordForTest(sid, rid, l, p);
      ASSERT_TRUE(rec.ok()) << rec.status();
      for (int b = 0; b < 16; ++b) (*rec)[b] = static_cast<uint8_t>(seed + l * 31 + p * 7 + b);
    }
  }
}

// Whether records [0, tokens) of (a, b) are equal in every layer.
bool SameRecords(SessionManager& sm, uint64_t sid, uint64_t a, uint64_t sid_b, uint64_t b, uint32_t layers,
                 uint32_t tokens) {
  for (uint32_t l = 0; l < layers; ++l) {
    for (uint32_t p = 0; p < tokens; ++p) {
      auto ra = sm.RecordForTest(sid, a, l, p);
      auto rb = sm.RecordForTest(sid_b, b, l, p);
      if (!ra.ok() || !rb.ok() || std::memcmp(*ra, *rb, 16) != 0) return false;
    }
  }
  return true;
}

// Expected pattern of Fill at (seed, layer, position).
bool HasPattern(SessionManager& sm, uint64_t sid, uint64_t rid, uint32_t layers, uint32_t tokens, uint8_t seed) {
  for (uint32_t l = 0; l < layers; ++l) {
    for (uint32_t p = 0; p < tokens; ++p) {
      auto rec = sm.RecordForTest(sid, rid, l, p);
      if (!rec.ok()) return false;
      for (int b = 0; b < 16; ++b) {
        if ((*rec)[b] != static_cast<uint8_t>(seed + l * 31 + p * 7 + b)) return false;
      }
    }
  }
  return true;
}

v1::RequestInfo Listed(SessionManager& sm, uint64_t sid, uint64_t rid) {
  auto listed = sm.ListRequests(v1::ListRequestsRequest());
  EXPECT_TRUE(listed.ok());
  for (const auto& r : listed->requests()) {
    if (r.session_id() == sid && r.request_id() == rid) return r;
  }
  ADD_FAILURE() << "request " << rid << " of session " << sid << " is not listed";
  return {};
}

TEST(SessionParkingTest, ParkFreesTheRowAndKeepsEveryPage) {
  auto sm = MakeManager(4 * kMiB);
  const v1::SessionRef s = Open(*sm, 1000, 2, 2);
  const uint64_t sid = s.session_id();
  ASSERT_TRUE(Admit(*sm, s, 1, 600).ok());
  ASSERT_TRUE(Admit(*sm, s, 2, 10).ok());
  Fill(*sm, sid, 1, 2, 600, 3);
  EXPECT_TRUE(absl::IsResourceExhausted(Admit(*sm, s, 3, 10).status()));  // both rows in use
  const uint64_t used = sm->Stats().host_pool().pages_used();

  auto parked = Park(*sm, s, 1);
  ASSERT_TRUE(parked.ok()) << parked.status();
  EXPECT_EQ(parked->row(), 0u);
  EXPECT_INVARIANTS(*sm);
  v1::StatsResponse st = sm->Stats();
  EXPECT_EQ(st.host_pool().pages_used(), used);
  EXPECT_EQ(st.requests(), 2u);
  EXPECT_EQ(st.parked_requests(), 1u);
  EXPECT_EQ(Listed(*sm, sid, 1).state(), v1::REQUEST_STATE_PARKED);
  EXPECT_EQ(Listed(*sm, sid, 2).state(), v1::REQUEST_STATE_LIVE);

  // Another request takes its row; resuming now finds none and leaves it parked.
  auto third = Admit(*sm, s, 3, 10);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->row(), 0u);
  EXPECT_INVARIANTS(*sm);
  absl::StatusOr<v1::ResumeResponse> full = Resume(*sm, s, 1);
  EXPECT_TRUE(absl::IsResourceExhausted(full.status())) << full.status();
  EXPECT_EQ(Listed(*sm, sid, 1).state(), v1::REQUEST_STATE_PARKED);
  EXPECT_INVARIANTS(*sm);

  // A row frees up: it resumes into that one (another than it had), its records untouched.
  ASSERT_TRUE(Release(*sm, s, 2).ok());
  auto resumed = Resume(*sm, s, 1);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->row(), 1u);
  EXPECT_EQ(resumed->capacity_tokens(), 600u);
  EXPECT_EQ(Listed(*sm, sid, 1).state(), v1::REQUEST_STATE_LIVE);
  EXPECT_EQ(Listed(*sm, sid, 1).row(), 1u);
  EXPECT_TRUE(HasPattern(*sm, sid, 1, 2, 600, 3));
  EXPECT_EQ(sm->Stats().parked_requests(), 0u);
  EXPECT_INVARIANTS(*sm);

  // A parked request is released (and its session closed) like any other.
  ASSERT_TRUE(Park(*sm, s, 1).ok());
  ASSERT_TRUE(Release(*sm, s, 1).ok());
  EXPECT_INVARIANTS(*sm);
  ASSERT_TRUE(Park(*sm, s, 3).ok());
  sm->CloseSession(sid);
  EXPECT_INVARIANTS(*sm);
  EXPECT_EQ(sm->Stats().host_pool().pages_used(), 0u);
}

TEST(SessionParkingTest, BadParkAndResumeChangeNothing) {
  auto sm = MakeManager(4 * kMiB);
  const v1::SessionRef s = Open(*sm, 1000, 1, 4);
  const v1::SessionRef other = Open(*sm, 1000, 1, 4);
  ASSERT_TRUE(Admit(*sm, s, 1, 10).ok());
  ASSERT_TRUE(Admit(*sm, other, 7, 10).ok());
  const std::string before = sm->Stats().host_pool().DebugString();

  absl::StatusOr<v1::ParkResponse> p = Park(*sm, s, 99);
  EXPECT_TRUE(absl::IsNotFound(p.status())) << p.status();
  p = Park(*sm, s, 7);  // another session's request is not visible here
  EXPECT_TRUE(absl::IsNotFound(p.status())) << p.status();
  absl::StatusOr<v1::ResumeResponse> r = Resume(*sm, s, 99);
  EXPECT_TRUE(absl::IsNotFound(r.status())) << r.status();
  r = Resume(*sm, s, 1);  // live
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("not parked"), std::string::npos) << r.status();
  ASSERT_TRUE(Park(*sm, s, 1).ok());
  p = Park(*sm, s, 1);  // parked already
  EXPECT_TRUE(absl::IsFailedPrecondition(p.status())) << p.status();
  EXPECT_NE(p.status().message().find("parked already"), std::string::npos) << p.status();
  v1::SessionRef forged = s;
  forged.set_token("not-the-token");
  EXPECT_TRUE(absl::IsPermissionDenied(Resume(*sm, forged, 1).status()));
  EXPECT_TRUE(absl::IsPermissionDenied(Park(*sm, forged, 1).status()));
  EXPECT_EQ(Listed(*sm, s.session_id(), 1).state(), v1::REQUEST_STATE_PARKED);
  EXPECT_EQ(sm->Stats().host_pool().DebugString(), before);
  EXPECT_INVARIANTS(*sm);
}

// Parked requests hold pages and count as requests of their tenant; they hold no row.
TEST(SessionParkingTest, ParkedRequestsCountAgainstTheTenantsQuotas) {
  SessionManager::QuotaOptions q;
  q.requests = 2;
  q.pages = 4;
  auto sm = MakeManager(4 * kMiB, q);
  const v1::SessionRef s = Open(*sm, 1000, 1, 1);
  ASSERT_TRUE(Admit(*sm, s, 1, 2 * kPerPage).ok());  // 2 pages, the only row
  ASSERT_TRUE(Park(*sm, s, 1).ok());
  absl::StatusOr<v1::AdmitResponse> big = Admit(*sm, s, 2, 3 * kPerPage);  // 5 pages > 4
  EXPECT_TRUE(absl::IsResourceExhausted(big.status())) << big.status();
  EXPECT_NE(big.status().message().find("quotas.pages"), std::string::npos) << big.status();
  ASSERT_TRUE(Admit(*sm, s, 2, kPerPage).ok());  // the row is free: 3 pages, 2 requests
  ASSERT_TRUE(Park(*sm, s, 2).ok());
  absl::StatusOr<v1::AdmitResponse> third = Admit(*sm, s, 3, 1);
  EXPECT_TRUE(absl::IsResourceExhausted(third.status())) << third.status();
  EXPECT_NE(third.status().message().find("quotas.requests"), std::string::npos) << third.status();
  EXPECT_INVARIANTS(*sm);
}

// evict_lru_idle: a parked request goes before any live one, even a less recently used one.
TEST(SessionParkingTest, EvictionTakesParkedRequestsFirst) {
  FakeClock clock;
  auto sm = MakeManager(1 * kMiB, {}, /*evict=*/true, &clock);  // 256 pages
  const v1::SessionRef s = Open(*sm, 1000, 1, 8);
  std::vector<uint64_t> told;
  absl::Mutex told_mu;
  sm->SetEventSink(s.session_id(), [&](const v1::SessionEvent& e) {
    absl::MutexLock lock(&told_mu);
    if (e.has_evicted()) told.push_back(e.evicted().request_id());
    return true;
  });
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(Admit(*sm, s, id, 64 * kPerPage).ok());  // the pool, full
  ASSERT_TRUE(Park(*sm, s, 3).ok());
  ASSERT_TRUE(Park(*sm, s, 4).ok());
  ASSERT_TRUE(Admit(*sm, s, 5, 64 * kPerPage).ok());  // evicts 3 (LRU of the parked), not 1
  ASSERT_TRUE(Admit(*sm, s, 6, 64 * kPerPage).ok());  // then 4
  ASSERT_TRUE(Admit(*sm, s, 7, 64 * kPerPage).ok());  // then the live ones, LRU first: 1
  {
    absl::MutexLock lock(&told_mu);
    EXPECT_EQ(told, (std::vector<uint64_t>{3, 4, 1}));
  }
  EXPECT_EQ(sm->Stats().evictions(), 3u);
  EXPECT_EQ(sm->Stats().parked_requests(), 0u);
  EXPECT_INVARIANTS(*sm);
}

// evict_lru_idle never evicts a child's parent to admit the child: the admission is refused and
// the parent stays whole.
TEST(SessionSharingTest, AParentIsNotEvictedForItsChild) {
  FakeClock clock;
  auto sm = MakeManager(1 * kMiB, {}, /*evict=*/true, &clock);  // 256 pages
  const v1::SessionRef s = Open(*sm, 1000, 1, 8);
  ASSERT_TRUE(Admit(*sm, s, 1, 128 * kPerPage).ok());
  ASSERT_TRUE(Admit(*sm, s, 2, 64 * kPerPage).ok());
  ASSERT_TRUE(Park(*sm, s, 1).ok());  // the first victim
  absl::StatusOr<v1::AdmitResponse> child = Admit(*sm, s, 3, 192 * kPerPage + 1, 1, 64 * kPerPage);
  EXPECT_TRUE(absl::IsResourceExhausted(child.status())) << child.status();
  EXPECT_EQ(sm->Stats().evictions(), 0u);
  EXPECT_EQ(sm->Stats().requests(), 2u);
  EXPECT_INVARIANTS(*sm);
}

// A prefix that ends inside a page: the full pages below it are the parent's (read_only, one more
// reference, charged once), the partial one a copy; either may go first.
TEST(SessionSharingTest, PrefixInsideAPageSharesFullPagesAndCopiesThePartialOne) {
  auto sm = MakeManager(4 * kMiB);
  const v1::SessionRef s = Open(*sm, 1000, 2, 4);
  const uint64_t sid = s.session_id();
  auto parent = Admit(*sm, s, 1, 4 * kPerPage);  // 4 pages per layer
  ASSERT_TRUE(parent.ok());
  Fill(*sm, sid, 1, 2, 4 * kPerPage, 11);
  constexpr uint32_t kPrefix = 2 * kPerPage + 88;
  auto child = Admit(*sm, s, 2, 3 * kPerPage + 5, 1, kPrefix);  // 4 pages: 2 shared, 2 fresh
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_EQ(child->layers_size(), 2);
  for (int l = 0; l < 2; ++l) {
    ASSERT_EQ(child->layers(l).pages_size(), 4);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(child->layers(l).pages(i).slab(), parent->layers(l).pages(i).slab());
      EXPECT_EQ(child->layers(l).pages(i).offset(), parent->layers(l).pages(i).offset());
      EXPECT_TRUE(child->layers(l).pages(i).read_only());
    }
    for (int i = 2; i < 4; ++i) {
      EXPECT_FALSE(child->layers(l).pages(i).read_only());
      for (int j = 0; j < 4; ++j) {
        EXPECT_FALSE(child->layers(l).pages(i).slab() == parent->layers(l).pages(j).slab() &&
                     child->layers(l).pages(i).offset() == parent->layers(l).pages(j).offset());
      }
    }
  }
  EXPECT_TRUE(SameRecords(*sm, sid, 1, sid, 2, 2, kPrefix));
  EXPECT_INVARIANTS(*sm);
  v1::StatsResponse st = sm->Stats();
  EXPECT_EQ(st.host_pool().pages_used(), 8u + 4u);  // distinct pages
  EXPECT_EQ(st.host_pool().pages_shared(), 4u);
  EXPECT_EQ(st.host_pool().shared_bytes(), 4 * kPage);
  EXPECT_EQ(st.session_stats(0).host_bytes(), 12 * kPage);
  EXPECT_EQ(Listed(*sm, sid, 1).shared_bytes(), 4 * kPage);
  EXPECT_EQ(Listed(*sm, sid, 2).shared_bytes(), 4 * kPage);

  // The child writes its own tail; the parent's records past the prefix stay its own.
  Fill(*sm, sid, 2, 2, 1, 11);  // position 0 is shared: same bytes, nothing changes
  for (uint32_t p = kPrefix; p < 3 * kPerPage; ++p) {
    auto rec = sm->RecordForTest(sid, 2, 0, p);
    ASSERT_TRUE(rec.ok());
    std::memset(*rec, 0xee, 16);
  }
  EXPECT_TRUE(HasPattern(*sm, sid, 1, 2, 4 * kPerPage, 11));

  // The parent goes: the child is charged for the shared pages and stays exact.
  ASSERT_TRUE(Release(*sm, s, 1).ok());
  EXPECT_INVARIANTS(*sm);
  st = sm->Stats();
  EXPECT_EQ(st.host_pool().pages_used(), 8u);
  EXPECT_EQ(st.host_pool().pages_shared(), 0u);
  EXPECT_EQ(Listed(*sm, sid, 2).shared_bytes(), 0u);
  EXPECT_TRUE(HasPattern(*sm, sid, 2, 2, kPrefix, 11));
  ASSERT_TRUE(Release(*sm, s, 2).ok());
  EXPECT_INVARIANTS(*sm);
  EXPECT_EQ(sm->Stats().host_pool().pages_used(), 0u);
}

// At a page boundary nothing is copied; a grandchild shares the same pages; the charge passes
// along the holders as they leave, in any order.
TEST(SessionSharingTest, PrefixAtAPageBoundaryAndTheChargePassesOn) {
  auto sm = MakeManager(4 * kMiB);
  const v1::SessionRef s = Open(*sm, 1000, 1, 4);
  const uint64_t sid = s.session_id();
  ASSERT_TRUE(Admit(*sm, s, 1, 3 * kPerPage).ok());
  Fill(*sm, sid, 1, 1, 3 * kPerPage, 5);
  ASSERT_TRUE(Admit(*sm, s, 2, 2 * kPerPage, 1, 2 * kPerPage).ok());  // nothing fresh at all
  EXPECT_EQ(sm->Stats().host_pool().pages_used(), 3u);
  EXPECT_INVARIANTS(*sm);
  ASSERT_TRUE(Admit(*sm, s, 3, 2 * kPerPage + 1, 2, 2 * kPerPage).ok());  // holders 1, 2, 3
  EXPECT_EQ(sm->Stats().host_pool().pages_used(), 4u);
  EXPECT_TRUE(SameRecords(*sm, sid, 1, sid, 3, 1, 2 * kPerPage));
  EXPECT_INVARIANTS(*sm);
  // The child is parked and shared from: a parked parent's pages are whole.
  ASSERT_TRUE(Park(*sm, s, 2).ok());
  ASSERT_TRUE(Admit(*sm, s, 4, kPerPage + 1, 2, kPerPage + 1).ok());  // 1 shared, 1 copied
  EXPECT_TRUE(SameRecords(*sm, sid, 1, sid, 4, 1, kPerPage + 1));
  EXPECT_INVARIANTS(*sm);
  ASSERT_TRUE(Release(*sm, s, 2).ok());  // the middle one
  EXPECT_INVARIANTS(*sm);
  ASSERT_TRUE(Release(*sm, s, 1).ok());  // the payer
  EXPECT_INVARIANTS(*sm);
  EXPECT_TRUE(HasPattern(*sm, sid, 3, 1, 2 * kPerPage, 5));
  EXPECT_TRUE(HasPattern(*sm, sid, 4, 1, kPerPage + 1, 5));
  EXPECT_EQ(sm->Stats().host_pool().pages_used(), 2u + 1u + 1u);
  sm->CloseSession(sid);
  EXPECT_INVARIANTS(*sm);
  EXPECT_EQ(sm->Stats().host_pool().pages_used(), 0u);
}

TEST(SessionSharingTest, SharedPagesAreChargedOnce) {
  SessionManager::QuotaOptions q;
  q.pages = 6;
  auto sm = MakeManager(4 * kMiB, q);
  const v1::SessionRef s = Open(*sm, 1000, 1, 4);
  ASSERT_TRUE(Admit(*sm, s, 1, 4 * kPerPage).ok());
  // 4 pages, of which 2 shared: 2 more charged, 6 in all.
  ASSERT_TRUE(Admit(*sm, s, 2, 4 * kPerPage, 1, 2 * kPerPage).ok());
  EXPECT_TRUE(absl::IsResourceExhausted(Admit(*sm, s, 3, 1, 1, 1).status()));  // a fresh page: 7
  ASSERT_TRUE(Admit(*sm, s, 3, kPerPage, 1, kPerPage).ok());                   // all shared
  EXPECT_INVARIANTS(*sm);
}

TEST(SessionSharingTest, BadPrefixesAreRefusedAndChangeNothing) {
  auto sm = MakeManager(4 * kMiB);
  const v1::SessionRef s = Open(*sm, 1000, 1, 8);
  const v1::SessionRef other = Open(*sm, 1000, 1, 8);
  ASSERT_TRUE(Admit(*sm, s, 1, 300).ok());
  ASSERT_TRUE(Admit(*sm, other, 5, 300).ok());
  const std::string before = sm->Stats().host_pool().DebugString();
  auto code = [&](uint64_t id, uint32_t budget, uint64_t parent, uint32_t prefix) {
    return Admit(*sm, s, id, budget, parent, prefix).status();
  };
  absl::Status st = code(2, 400, 9, 10);
  EXPECT_TRUE(absl::IsNotFound(st)) << st;
  st = code(2, 400, 5, 10);  // another session's request
  EXPECT_TRUE(absl::IsNotFound(st)) << st;
  st = code(2, 400, 1, 301);  // longer than the parent
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find("parent's capacity"), std::string::npos) << st;
  st = code(2, 100, 1, 200);  // longer than the child
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  st = code(2, 400, 1, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  st = code(2, 400, 0, 10);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  st = code(2, 400, 2, 10);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  st = code(1, 400, 1, 10);  // the id is taken
  EXPECT_TRUE(absl::IsAlreadyExists(st)) << st;
  EXPECT_EQ(sm->Stats().host_pool().DebugString(), before);
  EXPECT_EQ(sm->Stats().requests(), 2u);
  EXPECT_INVARIANTS(*sm);
}

}  // namespace session_parking_test
}  // namespace hisparse
