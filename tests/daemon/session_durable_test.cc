// SessionManager's durable requests (durability.cc): a leased request outlives its session's
// end as an orphan (parked, pages kept byte for byte, still in its tenant's quotas), a session of
// the same tenant and engine name lists and adopts it (slabs handed over, fd channel follows),
// every refusal's code changes nothing, leases end by the injected clock and leave the pool empty,
// and shared prefixes stay exact across the move. CheckInvariants runs after every step.
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "hisparse/common/unix_socket.h"
#include "hisparse/daemon/session_manager.h"
#include "session_test_util.h"

namespace hisparse {
namespace session_durable_test {

using session_test::AdmitOf;
using session_test::kMiB;
using session_test::kPage;

constexpr uint32_t kUid = 1000;

// A clock only the test moves.
struct ManualClock {
  absl::Mutex mu;
  absl::Time now = absl::FromUnixSeconds(1000);
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu);
    now += d;
  }
};

class SessionDurableTest : public ::testing::Test {
 protected:
  void Make(const SessionManager::QuotaOptions& quotas = {}, uint32_t max_lease = 600) {
    SessionManager::Options o;
    o.quotas = quotas;
    o.max_sessions = 16;
    o.max_lease_seconds = max_lease;
    o.clock = [this] {
      absl::MutexLock lock(&clock_.mu);
      return clock_.now;
    };
    sm_ = session_test::MakeManager(16 * kMiB, o);
    ASSERT_NE(sm_, nullptr);
  }
  void SetUp() override { Make(); }

  v1::SessionRef Open(uint32_t uid = kUid, const std::string& engine = "engine-a", uint32_t layers = 2,
                      uint32_t record_bytes = 16, uint32_t max_context = 0) {
    return session_test::OpenHost(*sm_, {engine, layers, record_bytes, /*max_requests=*/4, max_context}, uid);
  }
  absl::StatusOr<v1::AdmitResponse> Admit(const v1::SessionRef& ref, uint64_t id, uint32_t tokens, uint32_t lease = 0,
                                          uint64_t parent = 0, uint32_t prefix = 0) {
    v1::AdmitRequest req = AdmitOf(ref, id, tokens);
    req.set_context_tokens(tokens);
    req.set_lease_seconds(lease);
    req.set_parent_request_id(parent);
    req.set_prefix_tokens(prefix);
    return sm_->Admit(req);
  }
  absl::StatusOr<v1::SetLeaseResponse> SetLease(const v1::SessionRef& ref, uint64_t id, uint32_t lease) {
    v1::SetLeaseRequest req;
    *req.mutable_session() = ref;
    req.set_request_id(id);
    req.set_lease_seconds(lease);
    return sm_->SetLease(req);
  }
  absl::StatusOr<v1::AdoptResponse> Adopt(const v1::SessionRef& ref, uint64_t dead) {
    v1::AdoptRequest req;
    *req.mutable_session() = ref;
    req.set_dead_session_id(dead);
    return sm_->Adopt(req);
  }
  std::vector<uint64_t> Adoptable(const v1::SessionRef& ref) {
    v1::ListAdoptableRequest req;
    *req.mutable_session() = ref;
    auto r = sm_->ListAdoptable(req);
    EXPECT_TRUE(r.ok()) << r.status();
    std::vector<uint64_t> ids;
    if (r.ok()) {
      for (const auto& a : r->requests()) ids.push_back(a.request_id());
    }
    return ids;
  }
  absl::Status Resume(const v1::SessionRef& ref, uint64_t id) { return session_test::Resume(*sm_, ref, id).status(); }
  absl::Status Release(const v1::SessionRef& ref, uint64_t id) { return session_test::Release(*sm_, ref, id); }
  // Writes a pattern of `id` into every record of (session, request) and checks it back later.
  void Fill(uint64_t session, uint64_t id, uint32_t tokens, uint32_t layers = 2) {
    for (uint32_t l = 0; l < layers; ++l) {
      for (uint32_t p = 0; p < tokens; ++p) {
        auto rec = sm_->RecordForTest(session, id, l, p);
        ASSERT_TRUE(rec.ok()) << rec.status();
        for (int b = 0; b < 16; ++b) (*rec)[b] = static_cast<uint8_t>(id * 31 + l * 7 + p + b);
      }
    }
  }
  bool Holds(uint64_t session, uint64_t id, uint32_t tokens, uint64_t pattern_id, uint32_t layers = 2) {
    for (uint32_t l = 0; l < layers; ++l) {
      for (uint32_t p = 0; p < tokens; ++p) {
        auto rec = sm_->RecordForTest(session, id, l, p);
        if (!rec.ok()) return false;
        for (int b = 0; b < 16; ++b) {
          if ((*rec)[b] != static_cast<uint8_t>(pattern_id * 31 + l * 7 + p + b)) return false;
        }
      }
    }
    return true;
  }
  void ExpectInvariants() { EXPECT_INVARIANTS(*sm_); }

  ManualClock clock_;
  std::unique_ptr<SessionManager> sm_;
};

TEST_F(SessionDurableTest, ADurableRequestOutlivesItsSessionAndIsAdoptedExactly) {
  const v1::SessionRef a = Open();
  ASSERT_TRUE(Admit(a, 1, 600, /*lease=*/60).ok());
  ASSERT_TRUE(Admit(a, 2, 600).ok());  // not durable
  ASSERT_TRUE(Admit(a, 3, 300).ok());
  ASSERT_TRUE(SetLease(a, 3, 120).ok());
  Fill(a.session_id(), 1, 600);
  Fill(a.session_id(), 3, 300);
  EXPECT_EQ(sm_->Stats().durable_requests(), 2u);
  ExpectInvariants();
  const uint64_t pages_1_3 = 2 * (3 + 2);  // 600 and 300 tokens of 256 a page, two layers
  sm_->CloseSession(a.session_id());
  ExpectInvariants();
  v1::StatsResponse st = sm_->Stats();
  EXPECT_EQ(st.sessions(), 0u);
  EXPECT_EQ(st.requests(), 0u);
  EXPECT_EQ(st.orphaned_requests(), 2u);
  EXPECT_EQ(st.orphaned_bytes(), pages_1_3 * kPage);
  EXPECT_EQ(st.host_pool().pages_used(), pages_1_3);
  v1::ListRequestsRequest list;
  auto listed = sm_->ListRequests(list);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->requests_size(), 2);
  EXPECT_EQ(listed->requests(0).state(), v1::REQUEST_STATE_ORPHANED);
  EXPECT_TRUE(listed->requests(0).durable());
  EXPECT_DOUBLE_EQ(listed->requests(0).lease_seconds_left(), 60.0);

  clock_.Advance(absl::Seconds(10));
  const v1::SessionRef b = Open();
  EXPECT_EQ(Adoptable(b), (std::vector<uint64_t>{1, 3}));
  auto adopted = Adopt(b, a.session_id());
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  ExpectInvariants();
  ASSERT_EQ(adopted->requests_size(), 2);
  EXPECT_EQ(adopted->requests(0).request_id(), 1u);
  EXPECT_EQ(adopted->requests(0).capacity_tokens(), 600u);
  EXPECT_DOUBLE_EQ(adopted->requests(0).lease_seconds_left(), 50.0);
  EXPECT_EQ(adopted->requests(1).layers_size(), 2);
  st = sm_->Stats();
  EXPECT_EQ(st.orphaned_requests(), 0u);
  EXPECT_EQ(st.requests(), 2u);
  EXPECT_EQ(st.parked_requests(), 2u);
  EXPECT_TRUE(Adoptable(b).empty());
  // The adopter's fd channel hands it the slabs its pages live in.
  std::set<uint64_t> slabs;
  for (const auto& r : adopted->requests()) {
    for (const auto& layer : r.layers()) {
      for (const auto& p : layer.pages()) slabs.insert(p.slab());
    }
  }
  PeerCredentials peer;
  peer.uid = kUid;
  for (uint64_t slab : slabs) {
    EXPECT_TRUE(sm_->DupFdFor(b.session_id(), b.token(), FdSlab{slab}, peer).ok()) << "slab " << slab;
  }
  // Resumed, they are the records the dead engine left.
  ASSERT_TRUE(Resume(b, 1).ok());
  ASSERT_TRUE(Resume(b, 3).ok());
  ExpectInvariants();
  EXPECT_TRUE(Holds(b.session_id(), 1, 600, 1));
  EXPECT_TRUE(Holds(b.session_id(), 3, 300, 3));
  // Adopted once: the dead session is gone.
  EXPECT_EQ(Adopt(b, a.session_id()).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(Release(b, 1).ok());
  ASSERT_TRUE(Release(b, 3).ok());
  sm_->CloseSession(b.session_id());
  sm_->WaitPoolIdle();
  ExpectInvariants();
  EXPECT_EQ(sm_->Stats().host_pool().pages_used(), 0u);
  EXPECT_EQ(sm_->Stats().host_pool().slabs(), 0u);
}

TEST_F(SessionDurableTest, RefusedAdoptionsChangeNothing) {
  const v1::SessionRef a = Open();
  ASSERT_TRUE(Admit(a, 1, 300, 60).ok());
  ASSERT_TRUE(Admit(a, 2, 300, 60).ok());
  sm_->CloseSession(a.session_id());
  const uint64_t dead = a.session_id();
  const v1::StatsResponse before = sm_->Stats();
  const auto code = [&](const v1::SessionRef& who) { return Adopt(who, dead).status().code(); };
  EXPECT_EQ(code(Open(kUid + 1)), absl::StatusCode::kPermissionDenied);                        // another tenant
  EXPECT_EQ(code(Open(kUid, "engine-b")), absl::StatusCode::kPermissionDenied);                // another engine
  EXPECT_EQ(code(Open(kUid, "engine-a", 3)), absl::StatusCode::kFailedPrecondition);           // num_layers
  EXPECT_EQ(code(Open(kUid, "engine-a", 2, 32)), absl::StatusCode::kFailedPrecondition);       // record_bytes
  EXPECT_EQ(code(Open(kUid, "engine-a", 2, 16, 256)), absl::StatusCode::kFailedPrecondition);  // page tables
  const v1::SessionRef taken = Open();
  ASSERT_TRUE(Admit(taken, 2, 10).ok());
  EXPECT_EQ(code(taken), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Adopt(taken, dead + 100).status().code(), absl::StatusCode::kNotFound);
  v1::SessionRef forged = taken;
  forged.set_token("forged");
  EXPECT_EQ(code(forged), absl::StatusCode::kPermissionDenied);
  ExpectInvariants();
  const v1::StatsResponse after = sm_->Stats();
  EXPECT_EQ(after.orphaned_requests(), before.orphaned_requests());
  EXPECT_EQ(after.orphaned_bytes(), before.orphaned_bytes());
  // The other tenant does not even see them.
  EXPECT_TRUE(Adoptable(Open(kUid + 1)).empty());
  ASSERT_TRUE(Release(taken, 2).ok());
  ASSERT_TRUE(Adopt(taken, dead).ok());
  ExpectInvariants();
}

TEST_F(SessionDurableTest, LeasesEndByTheClockAndLeaveThePoolEmpty) {
  SessionManager::QuotaOptions quotas;
  quotas.requests = 2;
  quotas.sessions = 1;
  quotas.pages = 8;
  Make(quotas);
  const v1::SessionRef a = Open();
  ASSERT_TRUE(Admit(a, 1, 512, 30).ok());  // 4 pages
  sm_->CloseSession(a.session_id());
  ExpectInvariants();
  // Still the tenant's: pages and requests count, the dead session does not (a new one opens).
  const v1::SessionRef b = Open();
  EXPECT_EQ(Admit(b, 2, 1024).status().code(), absl::StatusCode::kResourceExhausted);  // 8 pages more
  ASSERT_TRUE(Admit(b, 2, 512).ok());
  EXPECT_EQ(Admit(b, 3, 1).status().code(), absl::StatusCode::kResourceExhausted);  // requests: 2
  ASSERT_TRUE(Release(b, 2).ok());
  clock_.Advance(absl::Seconds(29));
  EXPECT_EQ(sm_->ExpireLeases(), 0u);
  clock_.Advance(absl::Seconds(1));
  // Ended, not swept yet: neither listed nor adoptable.
  EXPECT_TRUE(Adoptable(b).empty());
  EXPECT_EQ(Adopt(b, a.session_id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(sm_->ExpireLeases(), 0u);  // Adopt released it already
  sm_->WaitPoolIdle();
  ExpectInvariants();
  v1::StatsResponse st = sm_->Stats();
  EXPECT_EQ(st.orphaned_requests(), 0u);
  EXPECT_EQ(st.lease_expiries(), 1u);
  EXPECT_EQ(st.host_pool().pages_used(), 0u);
  EXPECT_EQ(st.host_pool().slabs_by_session().count(a.session_id()), 0u);
  // The quota is free again: all 8 pages.
  ASSERT_TRUE(Admit(b, 4, 1024).ok());
  ASSERT_TRUE(Release(b, 4).ok());
  sm_->CloseSession(b.session_id());
  // The sweep alone: nobody asks.
  const v1::SessionRef c = Open();
  ASSERT_TRUE(Admit(c, 5, 512, 5).ok());
  sm_->CloseSession(c.session_id());
  clock_.Advance(absl::Seconds(5));
  EXPECT_EQ(sm_->ExpireLeases(), 1u);
  sm_->WaitPoolIdle();
  ExpectInvariants();
  st = sm_->Stats();
  EXPECT_EQ(st.lease_expiries(), 2u);
  EXPECT_EQ(st.host_pool().pages_used(), 0u);
  EXPECT_EQ(st.host_pool().slabs(), 0u);
}

TEST_F(SessionDurableTest, AnOperatorMayEvictAnOrphanedRequest) {
  const v1::SessionRef a = Open();
  ASSERT_TRUE(Admit(a, 1, 300, 60).ok());
  ASSERT_TRUE(Admit(a, 2, 300, 60).ok());
  sm_->CloseSession(a.session_id());
  v1::EvictRequest ev;
  ev.set_session_id(a.session_id());
  ev.set_request_id(1);
  EXPECT_EQ(sm_->Evict(ev, kUid + 1).status().code(), absl::StatusCode::kPermissionDenied);
  ev.set_request_id(9);
  EXPECT_EQ(sm_->Evict(ev).status().code(), absl::StatusCode::kNotFound);
  ExpectInvariants();
  EXPECT_EQ(sm_->Stats().orphaned_requests(), 2u);
  for (uint64_t id : {1, 2}) {
    ev.set_request_id(id);
    auto freed = sm_->Evict(ev, kUid);  // its own tenant may too
    ASSERT_TRUE(freed.ok()) << freed.status();
    EXPECT_EQ(freed->freed_bytes(), 2 * 2 * kPage);
    ExpectInvariants();
  }
  sm_->WaitPoolIdle();
  EXPECT_EQ(sm_->Stats().orphaned_requests(), 0u);
  EXPECT_EQ(sm_->Stats().host_pool().pages_used(), 0u);
  EXPECT_EQ(sm_->Stats().host_pool().slabs(), 0u);
}

TEST_F(SessionDurableTest, LeaseBoundsAndClearing) {
  Make({}, /*max_lease=*/100);
  const v1::SessionRef a = Open();
  EXPECT_EQ(Admit(a, 1, 10, 101).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(Admit(a, 1, 10, 100).ok());
  EXPECT_EQ(SetLease(a, 1, 101).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SetLease(a, 9, 10).status().code(), absl::StatusCode::kNotFound);
  v1::AdmitRequest import;
  *import.mutable_session() = a;
  import.set_request_id(2);
  import.set_token_budget(10);
  import.set_begin_import(true);
  import.set_lease_seconds(10);
  EXPECT_EQ(sm_->Admit(import).status().code(), absl::StatusCode::kInvalidArgument);
  auto cleared = SetLease(a, 1, 0);
  ASSERT_TRUE(cleared.ok());
  EXPECT_EQ(cleared->lease_seconds_left(), 0.0);
  EXPECT_EQ(sm_->Stats().durable_requests(), 0u);
  sm_->CloseSession(a.session_id());  // not durable any more: released at once
  ExpectInvariants();
  EXPECT_EQ(sm_->Stats().orphaned_requests(), 0u);
  EXPECT_EQ(sm_->Stats().host_pool().pages_used(), 0u);
  Make({}, /*max_lease=*/0);
  const v1::SessionRef off = Open();
  EXPECT_EQ(Admit(off, 1, 10, 1).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Admit(off, 1, 10).ok());
  EXPECT_EQ(SetLease(off, 1, 1).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(SessionDurableTest, SharedPrefixesStayExactAcrossTheMove) {
  const v1::SessionRef a = Open();
  ASSERT_TRUE(Admit(a, 1, 1024, 60).ok());  // the parent, durable
  Fill(a.session_id(), 1, 1024);
  ASSERT_TRUE(Admit(a, 2, 1024, 60, /*parent=*/1, /*prefix=*/700).ok());  // durable child
  ASSERT_TRUE(Admit(a, 3, 1024, 0, 1, 512).ok());                         // not durable
  ASSERT_TRUE(Admit(a, 4, 1024, 60, 3, 300).ok());                        // durable child of the non-durable one
  ExpectInvariants();
  sm_->CloseSession(a.session_id());
  ExpectInvariants();
  EXPECT_EQ(sm_->Stats().orphaned_requests(), 3u);
  const v1::SessionRef b = Open();
  auto adopted = Adopt(b, a.session_id());
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  ExpectInvariants();
  EXPECT_GT(sm_->Stats().host_pool().pages_shared(), 0u);
  ASSERT_TRUE(Resume(b, 2).ok());
  ASSERT_TRUE(Release(b, 1).ok());  // the parent goes: the child keeps its prefix
  ExpectInvariants();
  EXPECT_TRUE(Holds(b.session_id(), 2, 700, 1));
  EXPECT_TRUE(Holds(b.session_id(), 4, 300, 1));
  ASSERT_TRUE(Release(b, 2).ok());
  ASSERT_TRUE(Release(b, 4).ok());
  ExpectInvariants();
  EXPECT_EQ(sm_->Stats().host_pool().pages_used(), 0u);
}

}  // namespace session_durable_test
}  // namespace hisparse
