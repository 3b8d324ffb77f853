// The hot calls of many sessions at once (issue 41, item 2; session_core.h, "Locks"): Admit of a
// plain request, Extend, Park, Resume and Release (and batches, which hold the node) run under their session's own lock
// with the node's mutex held shared, while the node's own calls (CheckInvariants, Stats, listings, an operator's Evict,
// a session's open and close, evicting admissions) hold it exclusively. Every exclusive call sees an exact node, no
// tenant ever holds more than its quota (a reservation's quota check and its commit are one step under the ledger's
// lock), and everything comes back. CI runs this under TSan too (tools/ci-sanitizers.sh).
#include <atomic>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "hisparse/daemon/session_core.h"
#include "hisparse/daemon/session_manager.h"
#include "session_test_util.h"

namespace hisparse {
namespace {

using session_test::AdmitOf;
using session_test::HostSession;
using session_test::kMiB;
using session_test::kPage;
using session_test::MakeManager;
using session_test::OpenHost;

constexpr int kWorkers = 8;
constexpr int kTenants = 4;
constexpr uint64_t kTenantQuota = 3 * kMiB;

// What went wrong, from any thread: the first few messages, and how many.
class Problems {
 public:
  void Add(const std::string& what) {
    absl::MutexLock lock(&mu_);
    if (messages_.size() < 8) messages_.push_back(what);
    ++count_;
  }
  int count() const {
    absl::MutexLock lock(&mu_);
    return count_;
  }
  std::string Report() const {
    absl::MutexLock lock(&mu_);
    std::string out;
    for (const std::string& m : messages_) absl::StrAppend(&out, m, "\n");
    return out;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> messages_ ABSL_GUARDED_BY(mu_);
  int count_ ABSL_GUARDED_BY(mu_) = 0;
};

// An answer a hot call may give under this load: it worked, there was no room (pool or quota),
// the request was parked or live already, or an operator's eviction took it meanwhile.
bool Expected(const absl::Status& st) {
  return st.ok() || absl::IsResourceExhausted(st) || absl::IsFailedPrecondition(st) || absl::IsNotFound(st);
}

// Which tenant each engine's session is.
class Tenants {
 public:
  void Add(uint64_t session_id, uint32_t uid) {
    absl::MutexLock lock(&mu_);
    of_[session_id] = uid;
  }
  // 0 for a session not listed (the admin's).
  uint32_t Of(uint64_t session_id) const {
    absl::MutexLock lock(&mu_);
    auto it = of_.find(session_id);
    return it == of_.end() ? 0 : it->second;
  }

 private:
  mutable absl::Mutex mu_;
  std::map<uint64_t, uint32_t> of_ ABSL_GUARDED_BY(mu_);
};

// One engine: its session, and a random walk over its own requests' lives.
void Engine(SessionManager& sm, int worker, int steps, Tenants& tenants, Problems& problems) {
  HostSession hs;
  hs.layers = 2;
  hs.max_requests = 32;
  const uint32_t uid = 1000 + worker % kTenants;
  const v1::SessionRef ref = OpenHost(sm, hs, uid);
  tenants.Add(ref.session_id(), uid);
  std::mt19937 rng(worker);
  std::map<uint64_t, uint32_t> held;  // id -> capacity tokens
  uint64_t next_id = 1;
  const auto check = [&](const char* what, const absl::Status& st) {
    if (!Expected(st)) problems.Add(absl::StrCat("worker ", worker, " ", what, ": ", st.ToString()));
  };
  for (int step = 0; step < steps; ++step) {
    const int op = static_cast<int>(rng() % 7);
    if (op == 6) {  // a batch, either mode: the slabs its items want are made outside the locks
      v1::AdmitBatchRequest req;
      *req.mutable_session() = ref;
      req.set_mode(rng() % 2 == 0 ? v1::BATCH_MODE_PER_ITEM : v1::BATCH_MODE_ALL_OR_NOTHING);
      const int items = 1 + static_cast<int>(rng() % 3);
      for (int i = 0; i < items; ++i) {
        v1::AdmitItem* item = req.add_items();
        item->set_request_id(next_id++);
        item->set_token_budget(1 + rng() % 2048);
      }
      auto batch = sm.AdmitBatch(req);
      check("batch", batch.status());
      if (!batch.ok()) continue;
      for (const v1::AdmitResult& r : batch->results()) {
        if (r.has_admitted()) {
          held[r.request_id()] = r.admitted().capacity_tokens();
        } else if (r.error().code() != static_cast<int>(absl::StatusCode::kAborted)) {  // rolled back
          check("batch item", absl::Status(static_cast<absl::StatusCode>(r.error().code()), r.error().message()));
        }
      }
      continue;
    }
    if (held.empty() || op == 0 || op == 1) {
      v1::AdmitRequest req = AdmitOf(ref, next_id, 1 + rng() % 2048);  // 1-8 pages a layer
      if (rng() % 4 == 0) req.set_lease_seconds(60);
      auto admitted = sm.Admit(req);
      check("admit", admitted.status());
      if (admitted.ok()) held[next_id] = admitted->capacity_tokens();
      ++next_id;
      continue;
    }
    auto it = held.begin();
    std::advance(it, rng() % held.size());
    const uint64_t id = it->first;
    if (op == 2) {
      v1::ExtendRequest req;
      *req.mutable_session() = ref;
      req.set_request_id(id);
      req.set_token_budget(it->second + 1 + rng() % 1024);
      auto extended = sm.Extend(req);
      check("extend", extended.status());
      if (extended.ok()) it->second = extended->capacity_tokens();
      if (absl::IsNotFound(extended.status())) held.erase(it);  // evicted
    } else if (op == 3) {
      auto parked = session_test::Park(sm, ref, id);
      check("park", parked.status());
      if (absl::IsNotFound(parked.status())) held.erase(it);
    } else if (op == 4) {
      auto resumed = session_test::Resume(sm, ref, id);
      check("resume", resumed.status());
      if (absl::IsNotFound(resumed.status())) held.erase(it);
    } else {
      const absl::Status released = session_test::Release(sm, ref, id);
      if (!released.ok() && !absl::IsNotFound(released)) check("release", released);
      held.erase(it);
    }
  }
  for (const auto& [id, tokens] : held) {
    const absl::Status released = session_test::Release(sm, ref, id);
    if (!released.ok() && !absl::IsNotFound(released)) check("final release", released);
  }
  sm.CloseSession(ref.session_id());
}

TEST(SessionConcurrencyTest, HotCallsOfManySessionsStayExactBesideTheNodesOwnCalls) {
  SessionManager::Options options;
  options.evict_on_pool_full = true;  // a hot Admit that lacks room defers to the exclusive path
  options.quotas.host_bytes = kTenantQuota;
  // 16 MiB for 4 tenants of 3 MiB each, and the admin's: full at times, so admissions evict.
  auto sm = MakeManager(16 * kMiB, options);
  ASSERT_NE(sm, nullptr);
  Problems problems;
  Tenants tenants;
  std::atomic<int> running{kWorkers};
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&, w] {
      Engine(*sm, w, /*steps=*/20000, tenants, problems);
      running.fetch_sub(1);
    });
  }
  // The node's own calls, meanwhile.
  int checks = 0;
  std::mt19937 rng(99);
  while (running.load() > 0) {
    ++checks;
    if (absl::Status st = sm->CheckInvariants(); !st.ok()) problems.Add("invariants: " + st.ToString());
    std::map<uint32_t, uint64_t> tenant_bytes;  // what the ledger charges each tenant now
    const v1::StatsResponse now = sm->Stats();
    for (const auto& ss : now.session_stats()) tenant_bytes[tenants.Of(ss.session_id())] += ss.host_bytes();
    for (const auto& [tenant, bytes] : tenant_bytes) {
      if (tenant != 0 && bytes > kTenantQuota)
        problems.Add(absl::StrCat("tenant ", tenant, " holds ", bytes, " bytes"));
    }
    auto listed = sm->ListRequests(v1::ListRequestsRequest());
    if (!listed.ok()) {
      problems.Add("list: " + listed.status().ToString());
      continue;
    }
    if (checks % 4 == 0 && listed->requests_size() > 0) {  // an operator evicts one
      const auto& victim = listed->requests(static_cast<int>(rng() % listed->requests_size()));
      v1::EvictRequest evict;
      evict.set_session_id(victim.session_id());
      evict.set_request_id(victim.request_id());
      auto evicted = sm->Evict(evict);
      if (!evicted.ok() && !absl::IsNotFound(evicted.status()) && !absl::IsFailedPrecondition(evicted.status())) {
        problems.Add("evict: " + evicted.status().ToString());
      }
    }
    if (checks % 8 == 0) {  // a session opens, admits and closes
      const v1::SessionRef ref = OpenHost(*sm, HostSession(), /*uid=*/2000);
      auto admitted = sm->Admit(AdmitOf(ref, 1, 256));
      if (!Expected(admitted.status())) problems.Add("admin admit: " + admitted.status().ToString());
      sm->CloseSession(ref.session_id());
    }
  }
  for (std::thread& t : workers) t.join();
  EXPECT_EQ(problems.count(), 0) << problems.Report();
  EXPECT_GT(checks, 0);
  RecordProperty("exclusive_checks", checks);
  const v1::StatsResponse stats = sm->Stats();
  EXPECT_GT(stats.admissions(), uint64_t{kWorkers}) << "the engines admitted nothing";
  RecordProperty("admissions", static_cast<int>(stats.admissions()));
  RecordProperty("evictions", static_cast<int>(stats.evictions()));
  RecordProperty("rejections", static_cast<int>(stats.rejections()));
  EXPECT_EQ(stats.sessions(), 0u);
  EXPECT_EQ(stats.requests(), 0u);
  EXPECT_EQ(stats.host_pool().pages_used(), 0u);
  // No slab is left to an owner that ended (slabs made outside the locks included).
  EXPECT_EQ(stats.host_pool().slabs(), 0u);
  RecordProperty("slabs_made_inline", static_cast<int>(stats.host_pool().slabs_made_inline()));
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
}

// A tenant's quota under concurrent hot admissions of its sessions: never exceeded, and used up
// exactly (what fits is admitted).
TEST(SessionConcurrencyTest, ConcurrentAdmissionsOfOneTenantNeverPassItsQuota) {
  SessionManager::Options options;
  options.quotas.host_bytes = 40 * kPage;  // 40 requests of one page
  auto sm = MakeManager(8 * kMiB, options);
  ASSERT_NE(sm, nullptr);
  constexpr int kThreads = 8;
  std::vector<v1::SessionRef> refs;
  for (int t = 0; t < kThreads; ++t) refs.push_back(OpenHost(*sm, HostSession(), /*uid=*/7));
  std::atomic<int> admitted{0}, refused{0}, other{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t id = 1; id <= 20; ++id) {
        auto got = sm->Admit(AdmitOf(refs[t], id, 1));
        if (got.ok()) {
          admitted.fetch_add(1);
        } else if (absl::IsResourceExhausted(got.status())) {
          refused.fetch_add(1);
        } else {
          other.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(admitted.load(), 40);
  EXPECT_EQ(refused.load(), kThreads * 20 - 40);
  EXPECT_EQ(other.load(), 0);
  const v1::StatsResponse stats = sm->Stats();
  EXPECT_EQ(stats.admissions(), 40u);
  EXPECT_EQ(stats.rejections(), uint64_t(kThreads * 20 - 40));
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
  for (const v1::SessionRef& ref : refs) sm->CloseSession(ref.session_id());
  EXPECT_EQ(session_test::PagesUsed(*sm), 0u);
}

// A hot admission takes its pages before the ledger's lock, but only once its quota and a row are
// there: a request its quota refuses takes nothing from the pool, so it cannot make the pool
// reclaim another tenant's idle slab.
TEST(SessionConcurrencyTest, AQuotaRefusedAdmissionTakesNoPages) {
  SessionManager::Options options;
  options.quotas.host_bytes = kMiB;          // one slab of 4 KiB pages
  auto sm = MakeManager(2 * kMiB, options);  // two 1 MiB slabs: the whole budget
  ASSERT_NE(sm, nullptr);
  constexpr uint32_t kSlabTokens = 256 * 256;  // 16-byte records, 4 KiB pages: 256 pages, one slab
  HostSession hs;
  hs.max_context_tokens = kSlabTokens;
  const v1::SessionRef other = OpenHost(*sm, hs, /*uid=*/8);
  ASSERT_TRUE(sm->Admit(AdmitOf(other, 1, kSlabTokens)).ok());
  ASSERT_TRUE(session_test::Release(*sm, other, 1).ok());  // its slab idle, still its own
  const v1::SessionRef full = OpenHost(*sm, hs, /*uid=*/7);
  ASSERT_TRUE(sm->Admit(AdmitOf(full, 1, kSlabTokens)).ok());  // the other slab: at its quota now
  auto refused = sm->Admit(AdmitOf(full, 2, 1));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  const auto slabs = sm->Stats().host_pool().slabs_by_session();
  ASSERT_TRUE(slabs.contains(other.session_id()));
  EXPECT_EQ(slabs.at(other.session_id()), 1u) << "the refused request reclaimed the other tenant's idle slab";
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
  sm->CloseSession(full.session_id());
  sm->CloseSession(other.session_id());
}

// A slab made outside the locks for an owner that ended meanwhile (its session closed between
// the want and the making) is retired again: nobody else would (SessionCore::MakeWantedSlabs).
TEST(SessionConcurrencyTest, ASlabMadeForAnOwnerThatEndedIsRetiredAgain) {
  auto pool = PagePool::Create(session_test::TestPoolOptions(8 * kMiB));
  ASSERT_TRUE(pool.ok()) << pool.status();
  SessionCore core(SessionOptions{}, *std::move(pool));
  PagePool& pages = *core.pool_unlocked_;
  constexpr uint64_t kEnded = 777;  // no session, no group: an owner that ended
  PagePool::SlabsOutsideLocks outside;
  EXPECT_EQ(pages.Allocate(kEnded, 3).status().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(core.MakeWantedSlabs(outside));
  EXPECT_EQ(pages.SlabsOf(kEnded), 0u) << "a slab made for an owner that ended stayed its";
  EXPECT_EQ(pages.GetStats().slabs_made, 1u);
  EXPECT_FALSE(core.MakeWantedSlabs(outside)) << "the want was made once";
  EXPECT_TRUE(pages.CheckInvariants().ok()) << pages.CheckInvariants();
}

}  // namespace
}  // namespace hisparse
