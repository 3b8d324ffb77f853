// SessionManager's admission and accounting, with tenants as parameters (the uid a session is
// bound to through DupFdFor): whole pages charged, Extend that appends pages and never moves a
// record, per-tenant caps that keep one tenant from
// locking out another, evict_lru_idle evicting only when that can admit, ListRequests' pages,
// rejection reasons in the metrics, and the codes of a refused session open.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hisparse/common/unix_socket.h"
#include "hisparse/common/version.h"
#include "hisparse/common/version_compat.h"
#include "hisparse/daemon/metrics.h"
#include "hisparse/daemon/session_manager.h"
#include "session_test_util.h"

namespace hisparse {
namespace session_manager_test {

using ::testing::HasSubstr;

using session_test::AdmitOf;
using session_test::HostSession;
using session_test::kMiB;
using session_test::kPage;
using session_test::OpenMessage;
using session_test::Owner;

std::unique_ptr<SessionManager> MakeManager(uint64_t pool_bytes, const SessionManager::QuotaOptions& quotas = {},
                                            bool evict = false) {
  SessionManager::Options o;
  o.quotas = quotas;
  o.evict_on_pool_full = evict;
  o.max_sessions = 64;
  return session_test::MakeManager(pool_bytes, o);
}

struct Opened {
  v1::SessionRef ref;
  absl::Status bind;  // of the OpenSession that made `uid` its tenant, then of its arena fetch
};

// Opens a host session as `uid` (its tenant, as the Session stream's peer would be) and fetches
// its arena as the engine would.
Opened Open(SessionManager& sm, uint32_t uid, uint32_t layers = 1, uint32_t record_bytes = 16,
            uint32_t max_requests = 128) {
  auto ref = session_test::OpenRef(sm, OpenMessage({"session-manager-test", layers, record_bytes, max_requests}), uid);
  Opened out;
  out.bind = ref.status();
  if (!ref.ok()) return out;
  out.ref = *ref;
  out.bind = sm.DupFdFor(ref->session_id(), ref->token(), "arena", Owner(uid)).status();
  return out;
}

absl::Status Admit(SessionManager& sm, const v1::SessionRef& ref, uint64_t request_id, uint32_t tokens) {
  return sm.Admit(AdmitOf(ref, request_id, tokens)).status();
}

uint64_t SumOfSessionHostBytes(const v1::StatsResponse& st) {
  uint64_t sum = 0;
  for (const auto& ss : st.session_stats()) sum += ss.host_bytes();
  return sum;
}

TEST(SessionManagerTest, TinyRequestsAreChargedWholePages) {
  SessionManager::QuotaOptions q;
  q.host_bytes = 4 * kPage;
  auto sm = MakeManager(4 * kMiB, q);
  const Opened s = Open(*sm, 1000);
  ASSERT_TRUE(s.bind.ok()) << s.bind;
  int admitted = 0;
  absl::Status last;
  for (uint64_t id = 1; id <= 100; ++id) {
    last = Admit(*sm, s.ref, id, 1);  // 16 bytes asked, a page held
    if (!last.ok()) break;
    ++admitted;
  }
  EXPECT_EQ(admitted, 4);
  EXPECT_TRUE(absl::IsResourceExhausted(last)) << last;
  const v1::StatsResponse st = sm->Stats();
  EXPECT_EQ(st.host_pool().used_bytes(), 4 * kPage);
  EXPECT_EQ(st.host_pool().pages_used(), 4u);
  EXPECT_EQ(SumOfSessionHostBytes(st), st.host_pool().used_bytes());
  auto listed = sm->ListRequests(v1::ListRequestsRequest());
  ASSERT_TRUE(listed.ok());
  uint64_t listed_bytes = 0;
  for (const auto& r : listed->requests()) listed_bytes += r.host_bytes();
  EXPECT_EQ(listed_bytes, st.host_pool().used_bytes());
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();

  // Growing within its page costs nothing; one record past it takes a second page.
  v1::ExtendRequest ext;
  *ext.mutable_session() = s.ref;
  ext.set_request_id(1);
  ext.set_token_budget(256);
  ASSERT_TRUE(sm->Extend(ext).ok());
  ext.set_token_budget(257);
  EXPECT_TRUE(absl::IsResourceExhausted(sm->Extend(ext).status()));  // 5 pages > the quota's 4
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
  v1::ReleaseRequest rel;
  *rel.mutable_session() = s.ref;
  rel.set_request_id(2);
  ASSERT_TRUE(sm->Release(rel).ok());
  absl::StatusOr<v1::ExtendResponse> grown = sm->Extend(ext);
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_FALSE(grown->moved());
  ASSERT_EQ(grown->layers_size(), 1);
  EXPECT_EQ(grown->layers(0).pages_size(), 2);
  const v1::StatsResponse after = sm->Stats();
  EXPECT_EQ(after.host_pool().used_bytes(), 4 * kPage);
  EXPECT_EQ(SumOfSessionHostBytes(after), after.host_pool().used_bytes());
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
}

// OpenSession holds the client's client_version to the daemon's (version_compat.h): this
// release's clients and the previous minor's are served; the next minor and another major are
// refused, opening nothing, with a message naming both versions.
TEST(SessionManagerTest, OpenSessionServesOlderMinorsOfItsMajorOnly) {
  auto sm = MakeManager(8 * kMiB);
  const std::string daemon = HISPARSE_VERSION;
  absl::StatusOr<SemVer> mine = ParseSemVer(daemon);
  ASSERT_TRUE(mine.ok()) << mine.status();
  auto open_as = [&](const std::string& client) {
    v1::OpenSession open = OpenMessage({"versioned", 1, 16, 4});
    open.set_client_version(client);
    return sm->OpenSession(open, Owner(1000));
  };
  EXPECT_TRUE(open_as(daemon).ok());
  EXPECT_TRUE(open_as("").ok());  // a client older than the field
  if (mine->minor > 0) {
    EXPECT_TRUE(open_as(absl::StrCat(mine->major, ".", mine->minor - 1, ".9")).ok());
  }
  for (const std::string& client :
       {absl::StrCat(mine->major, ".", mine->minor + 1, ".0"), absl::StrCat(mine->major + 1, ".", mine->minor, ".0")}) {
    absl::StatusOr<v1::SessionOpened> refused = open_as(client);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << client;
    EXPECT_THAT(std::string(refused.status().message()),
                testing::AllOf(HasSubstr("client hisparse " + client), HasSubstr("daemon hisparse " + daemon)));
  }
  EXPECT_EQ(open_as("next").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sm->Stats().sessions(), mine->minor > 0 ? 3u : 2u);  // the refused opened nothing
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
}

// Extend appends pages: every record stays where it was, byte for byte, and the old pages lead
// the new list (the segmented pool copied a run that could not grow in place).
// geometry.max_context_tokens sizes the session's page tables (the GPU keeps them); admission then
// holds requests to it, and a value above the daemon's limit is refused at open.
TEST(SessionManagerTest, MaxContextTokensSizesThePageTables) {
  auto sm = MakeManager(8 * kMiB);
  auto open_with = [&](uint32_t max_context) {
    // 16-byte records: 256 a page.
    return sm->OpenSession(OpenMessage({"max-context", 1, 16, 4, max_context}), Owner(1000));
  };
  absl::StatusOr<v1::SessionOpened> dflt = open_with(0);
  ASSERT_TRUE(dflt.ok()) << dflt.status();
  EXPECT_EQ(dflt->pages_per_entry(), (1u << 20) / 256);  // limits.max_tokens_per_request
  absl::StatusOr<v1::SessionOpened> small = open_with(1000);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->pages_per_entry(), 4u);  // ceil(1000 / 256)
  EXPECT_EQ(small->max_tokens_per_request(), 1024u);
  v1::SessionRef ref;
  ref.set_session_id(small->session_id());
  ref.set_token(small->token());
  EXPECT_TRUE(Admit(*sm, ref, 1, 1024).ok());
  const absl::Status over = Admit(*sm, ref, 2, 1025);
  EXPECT_EQ(over.code(), absl::StatusCode::kInvalidArgument) << over;
  EXPECT_THAT(std::string(over.message()), HasSubstr("max_context_tokens"));
  absl::StatusOr<v1::SessionOpened> big = open_with((1u << 20) + 1);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(big.status().message()), HasSubstr("limits.max_tokens_per_request"));
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
}

TEST(SessionManagerTest, ExtendAppendsPagesAndNeverMovesARecord) {
  auto sm = MakeManager(8 * kMiB);
  const Opened s = Open(*sm, 1000, /*layers=*/3);
  const Opened other = Open(*sm, 1000, /*layers=*/1);
  ASSERT_TRUE(s.bind.ok() && other.bind.ok());
  v1::AdmitRequest adm;
  *adm.mutable_session() = s.ref;
  adm.set_request_id(1);
  adm.set_token_budget(300);  // two pages a layer
  absl::StatusOr<v1::AdmitResponse> admitted = sm->Admit(adm);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  ASSERT_TRUE(Admit(*sm, s.ref, 2, 256).ok());  // takes the pages right after, where it can
  ASSERT_TRUE(Admit(*sm, other.ref, 1, 1).ok());
  std::vector<uint8_t*> before;
  for (uint32_t layer = 0; layer < 3; ++layer) {
    for (uint32_t p = 0; p < 300; ++p) {
      absl::StatusOr<uint8_t*> rec = sm->RecordForTest(s.ref.session_id(), 1, layer, p);
      ASSERT_TRUE(rec.ok()) << rec.status();
      std::memset(*rec, static_cast<int>((layer * 131 + p) & 0xff), 16);
      before.push_back(*rec);
    }
  }
  v1::ExtendRequest ext;
  *ext.mutable_session() = s.ref;
  ext.set_request_id(1);
  ext.set_token_budget(5000);
  absl::StatusOr<v1::ExtendResponse> grown = sm->Extend(ext);
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_FALSE(grown->moved());
  ASSERT_EQ(grown->layers_size(), 3);
  for (int layer = 0; layer < 3; ++layer) {
    ASSERT_EQ(grown->layers(layer).pages_size(), 20);  // ceil(5000 / 256)
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(grown->layers(layer).pages(i).slab(), admitted->layers(layer).pages(i).slab());
      EXPECT_EQ(grown->layers(layer).pages(i).offset(), admitted->layers(layer).pages(i).offset());
    }
  }
  size_t k = 0;
  for (uint32_t layer = 0; layer < 3; ++layer) {
    for (uint32_t p = 0; p < 300; ++p, ++k) {
      absl::StatusOr<uint8_t*> rec = sm->RecordForTest(s.ref.session_id(), 1, layer, p);
      ASSERT_TRUE(rec.ok());
      EXPECT_EQ(*rec, before[k]);
      EXPECT_EQ(**rec, static_cast<uint8_t>((layer * 131 + p) & 0xff));
    }
  }
  // Past the capacity, and layers past the geometry, are refused.
  EXPECT_FALSE(sm->RecordForTest(s.ref.session_id(), 1, 0, 5000).ok());
  EXPECT_FALSE(sm->RecordForTest(s.ref.session_id(), 1, 3, 0).ok());
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
}

// Pages come from slabs of one session only, fetched as "slab N" by that session alone.
TEST(SessionManagerTest, SlabsAreTheSessionsOwn) {
  auto sm = MakeManager(8 * kMiB);
  const Opened a = Open(*sm, 1000);
  const Opened a2 = Open(*sm, 1000);
  const Opened b = Open(*sm, 2000);
  ASSERT_TRUE(a.bind.ok() && a2.bind.ok() && b.bind.ok());
  v1::AdmitRequest adm;
  *adm.mutable_session() = a.ref;
  adm.set_request_id(1);
  adm.set_token_budget(1000);
  absl::StatusOr<v1::AdmitResponse> got = sm->Admit(adm);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(Admit(*sm, a2.ref, 1, 1000).ok());
  ASSERT_TRUE(Admit(*sm, b.ref, 1, 1000).ok());
  const std::string object = absl::StrCat("slab ", got->layers(0).pages(0).slab());
  uint64_t bytes = 0;
  auto fd = sm->DupFdFor(a.ref.session_id(), a.ref.token(), object, Owner(1000), &bytes);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_GE(bytes, 4 * kPage);
  // The same tenant's other session, and another tenant, are refused it.
  EXPECT_EQ(sm->DupFdFor(a2.ref.session_id(), a2.ref.token(), object, Owner(1000)).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(sm->DupFdFor(b.ref.session_id(), b.ref.token(), object, Owner(2000)).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(sm->DupFdFor(a.ref.session_id(), a.ref.token(), "slab 999999", Owner(1000)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(sm->DupFdFor(a.ref.session_id(), a.ref.token(), "segment 0", Owner(1000)).status().code(),
            absl::StatusCode::kInvalidArgument);
  const v1::StatsResponse st = sm->Stats();
  EXPECT_EQ(st.host_pool().slabs_by_session().size(), 3u);
  EXPECT_EQ(st.host_pool().slabs_by_session().at(a.ref.session_id()), 1u);
  // Released, the slab stays the session's (idle, for its next request); its end retires it.
  v1::ReleaseRequest rel;
  *rel.mutable_session() = a.ref;
  rel.set_request_id(1);
  ASSERT_TRUE(sm->Release(rel).ok());
  EXPECT_TRUE(sm->DupFdFor(a.ref.session_id(), a.ref.token(), object, Owner(1000)).ok());
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
  sm->CloseSession(a.ref.session_id());
  EXPECT_EQ(sm->Stats().host_pool().slabs_by_session().count(a.ref.session_id()), 0u);
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
}

TEST(SessionManagerTest, OneTenantCannotLockAnotherOut) {
  SessionManager::QuotaOptions q;
  q.host_bytes = 2 * kMiB;
  q.sessions = 4;
  auto sm = MakeManager(8 * kMiB, q);
  // Tenant A opens as many sessions as it can and puts a 1 MiB request in each.
  const uint32_t one_mib = kMiB / 16;
  std::vector<Opened> a;
  int bound = 0, admitted = 0;
  for (int i = 0; i < 8; ++i) {
    a.push_back(Open(*sm, 1000));
    if (!a.back().bind.ok()) {
      EXPECT_TRUE(absl::IsResourceExhausted(a.back().bind)) << a.back().bind;
      continue;
    }
    ++bound;
    if (Admit(*sm, a.back().ref, 1, one_mib).ok()) ++admitted;
  }
  EXPECT_EQ(bound, 4);     // quotas.sessions
  EXPECT_EQ(admitted, 2);  // quotas.host_bytes
  EXPECT_EQ(sm->Stats().host_pool().used_bytes(), 2 * kMiB);
  // Tenant B, with its quota unused, is admitted all the same, for all of its quota.
  const Opened b = Open(*sm, 2000);
  ASSERT_TRUE(b.bind.ok()) << b.bind;
  EXPECT_TRUE(Admit(*sm, b.ref, 1, 2 * one_mib).ok());
  // A's refusals were its quota, not a full pool.
  const v1::StatsResponse st = sm->Stats();
  for (const auto& rc : st.rejections_by_reason()) {
    if (rc.reason() == "pool_full") {
      EXPECT_EQ(rc.count(), 0u);
    }
    if (rc.reason() == "quota") {
      EXPECT_EQ(rc.count(), 4u + 2u);  // 4 sessions, 2 admissions
    }
  }
  EXPECT_EQ(st.host_pool().used_bytes(), 4 * kMiB);
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
}

TEST(SessionManagerTest, EvictsOnlyWhenThatCanAdmit) {
  auto sm = MakeManager(2 * kMiB, {}, /*evict=*/true);  // 512 pages
  const Opened a1 = Open(*sm, 1000, 1);
  const Opened b = Open(*sm, 2000, 1);
  const Opened a2 = Open(*sm, 1000, 1);
  ASSERT_TRUE(a1.bind.ok() && b.bind.ok() && a2.bind.ok());
  ASSERT_TRUE(Admit(*sm, a1.ref, 1, 1).ok());  // a page, tenant A
  ASSERT_TRUE(Admit(*sm, b.ref, 1, 1).ok());   // a page, tenant B
  // The whole pool: evicting A's request frees one page of the two it lacks. Nothing is evicted.
  EXPECT_TRUE(absl::IsResourceExhausted(Admit(*sm, a2.ref, 1, 512 * 256)));
  v1::StatsResponse st = sm->Stats();
  EXPECT_EQ(st.evictions(), 0u);
  EXPECT_EQ(st.requests(), 2u);
  // One page less: evicting A's request admits this one.
  EXPECT_TRUE(Admit(*sm, a2.ref, 2, 511 * 256).ok());
  st = sm->Stats();
  EXPECT_EQ(st.evictions(), 1u);
  EXPECT_EQ(st.requests(), 2u);
  EXPECT_EQ(st.host_pool().pages_used(), 512u);
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
}

TEST(SessionManagerTest, ListRequestsComesInPages) {
  auto sm = MakeManager(48 * kMiB);  // 9003 requests of a page each
  std::vector<Opened> sessions;
  std::set<std::pair<uint64_t, uint64_t>> want;
  for (int i = 0; i < 3; ++i) {
    sessions.push_back(Open(*sm, 1000, 1, 16, 4096));
    for (uint64_t id = 1; id <= 3001; ++id) {
      ASSERT_TRUE(Admit(*sm, sessions.back().ref, id * 7, 1).ok());
      want.insert({sessions.back().ref.session_id(), id * 7});
    }
  }
  for (const uint32_t page_size : {0u, 7u, 1000u, 100000u}) {
    v1::ListRequestsRequest req;
    req.set_page_size(page_size);
    std::vector<std::pair<uint64_t, uint64_t>> got;
    int pages = 0;
    for (;;) {
      auto page = sm->ListRequests(req);
      ASSERT_TRUE(page.ok()) << page.status();
      ++pages;
      const uint32_t limit =
          page_size == 0 ? SessionManager::kDefaultPageSize : std::min(page_size, SessionManager::kMaxPageSize);
      ASSERT_LE(static_cast<uint32_t>(page->requests_size()), limit);
      for (const auto& r : page->requests()) got.emplace_back(r.session_id(), r.request_id());
      if (page->next_page_token().empty()) break;
      ASSERT_EQ(static_cast<uint32_t>(page->requests_size()), limit);
      req.set_page_token(page->next_page_token());
      ASSERT_LT(pages, 10000);
    }
    EXPECT_TRUE(std::is_sorted(got.begin(), got.end())) << page_size;
    const std::set<std::pair<uint64_t, uint64_t>> got_set(got.begin(), got.end());
    EXPECT_EQ(got_set, want) << page_size;
    EXPECT_EQ(got.size(), want.size()) << page_size;
  }
  // One session's requests, a page at a time.
  v1::ListRequestsRequest one;
  one.set_session_id(sessions[1].ref.session_id());
  one.set_page_size(1000);
  size_t count = 0;
  for (;;) {
    auto page = sm->ListRequests(one);
    ASSERT_TRUE(page.ok());
    for (const auto& r : page->requests()) EXPECT_EQ(r.session_id(), one.session_id());
    count += page->requests_size();
    if (page->next_page_token().empty()) break;
    one.set_page_token(page->next_page_token());
  }
  EXPECT_EQ(count, 3001u);
  v1::ListRequestsRequest bad;
  bad.set_page_token("not a token");
  EXPECT_TRUE(absl::IsInvalidArgument(sm->ListRequests(bad).status()));
}

TEST(SessionManagerTest, MetricsExportEveryRejectionReason) {
  SessionManager::QuotaOptions q;
  q.requests = 1;
  auto sm = MakeManager(2 * kMiB, q);
  const Opened s = Open(*sm, 1000);
  ASSERT_TRUE(Admit(*sm, s.ref, 1, 1).ok());
  ASSERT_TRUE(absl::IsResourceExhausted(Admit(*sm, s.ref, 2, 1)));  // quotas.requests
  Metrics metrics(sm.get());
  std::set<std::string> reasons;
  for (const prometheus::MetricFamily& f : metrics.Collect()) {
    if (f.name != "hisparse_rejections_total") continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      ASSERT_EQ(m.label.size(), 1u);
      reasons.insert(m.label[0].value);
      if (m.label[0].value == "quota") {
        EXPECT_EQ(m.counter.value, 1.0);
      }
    }
  }
  std::set<std::string> want;
  for (RejectReason r : kRejectReasons) want.insert(RejectReasonName(r));
  EXPECT_EQ(reasons, want);
  EXPECT_EQ(want.size(), 7u);
  EXPECT_EQ(want.count("quota"), 1u);
}

TEST(SessionManagerTest, EngineNameMustBeUtf8AndIsCutAtACharacter) {
  auto sm = MakeManager(2 * kMiB);
  HostSession host;
  host.max_requests = 1;
  v1::OpenSession open = OpenMessage(host);
  for (const char* bad : {"\xff", "ok\xc3", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80"}) {
    open.set_engine_name(bad);
    const absl::Status st = sm->OpenSession(open, Owner(0)).status();
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  }
  std::string long_name(127, 'a');
  long_name += "\xc3\xa9\xc3\xa9";  // two-byte characters across byte 128
  open.set_engine_name(long_name);
  ASSERT_TRUE(sm->OpenSession(open, Owner(0)).ok());
  const v1::StatsResponse st = sm->Stats();
  ASSERT_EQ(st.session_stats_size(), 1);
  EXPECT_EQ(st.session_stats(0).engine_name(), std::string(127, 'a'));
}

TEST(SessionManagerTest, OutOfDescriptorsAtOpenIsResourceExhausted) {
#ifdef HISPARSE_UBSAN_BUILD
  // UBSan's vptr check tests memory through a pipe (sanitizer_common's IsAccessibleMemoryRange):
  // with no descriptor left it reports every virtual call as a type error, here and in the daemon.
  GTEST_SKIP() << "descriptor exhaustion makes UBSan's vptr check report false errors; runs in the plain build";
#endif
  auto sm = MakeManager(2 * kMiB);
  HostSession host;
  host.max_requests = 1;
  v1::OpenSession open = OpenMessage(host);
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  // Take every descriptor below a lowered limit, so that the arena's memfd_create gets EMFILE.
  rlimit low = saved;
  low.rlim_cur = 64;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> held;
  for (int fd; (fd = ::dup(0)) >= 0;) held.push_back(fd);
  const absl::Status st = sm->OpenSession(open, Owner(0)).status();
  for (int fd : held) ::close(fd);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_TRUE(absl::IsResourceExhausted(st)) << st;
  EXPECT_NE(st.message().find("memfd_create"), absl::string_view::npos) << st;
  EXPECT_TRUE(sm->OpenSession(open, Owner(0)).ok());  // and nothing was lost
  EXPECT_EQ(sm->Stats().sessions(), 1u);
}

}  // namespace session_manager_test
}  // namespace hisparse

namespace hisparse {
namespace session_manager_test {

// Every entry of the one metric catalog is exported with a sample once the daemon has a session,
// a request and a timed RPC: a catalog entry that nothing fills would be a dashboard panel that
// always reads empty. And the families are exactly the catalog's, with its types, in its order.
TEST(SessionManagerTest, MetricsFillEveryCatalogEntry) {
  auto sm = MakeManager(2 * kMiB);
  const Opened s = Open(*sm, 1000);
  ASSERT_TRUE(Admit(*sm, s.ref, 1, 1).ok());
  Metrics metrics(sm.get());
  metrics.ObserveRpc(Metrics::kAdmit, 0.001);
  const std::vector<prometheus::MetricFamily> families = metrics.Collect();
  const std::vector<MetricInfo>& catalog = MetricCatalog();
  ASSERT_EQ(families.size(), catalog.size());
  for (size_t i = 0; i < catalog.size(); ++i) {
    const prometheus::MetricFamily& f = families[i];
    EXPECT_EQ(f.name, catalog[i].name);
    EXPECT_EQ(f.help, catalog[i].help) << f.name;
    const prometheus::MetricType want = std::string(catalog[i].type) == "counter" ? prometheus::MetricType::Counter
                                        : std::string(catalog[i].type) == "histogram"
                                            ? prometheus::MetricType::Histogram
                                            : prometheus::MetricType::Gauge;
    EXPECT_EQ(f.type, want) << f.name;
    EXPECT_FALSE(f.metric.empty()) << f.name << " has no sample";
  }
}

}  // namespace session_manager_test
}  // namespace hisparse
