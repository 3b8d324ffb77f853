// Issue 39 ("Hardening, round two") at the SessionManager level, each attack as a test:
//   1. a retired slab an engine kept the descriptor of is punched out of its memfd, and what is
//      not yet freed counts against its tenant until it is (page_pool.h, "Retired slabs");
//   5. TP group names are their tenant's: another uid cannot squat the name a TP engine uses;
//   7. an eviction whose victim was released and admitted again (as an import) while the lock
//      was dropped leaves the new request, its grant and a later commit or expiry alone;
//   8. ListAdoptable pages, and orphans are capped per tenant (live).
// The clock is injected; the pool's worker is paused or hooked where a test needs the moment
// between a slab's retirement and its punch. CheckInvariants runs after every step.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "hisparse/daemon/import_target.h"
#include "hisparse/daemon/page_pool.h"
#include "hisparse/daemon/session_manager.h"
#include "session_test_util.h"

namespace hisparse {
namespace session_hardening_test {

using session_test::AdmitOf;
using session_test::kMiB;
using session_test::kPage;
using session_test::Owner;

constexpr uint32_t kTenant = 1000;
constexpr uint32_t kOther = 2000;
constexpr uint32_t kSlabTokens = 256 * 256;  // 16-byte records, 4 KiB pages: 256 pages, one 1 MiB slab

// A clock only the test moves.
struct ManualClock {
  absl::Mutex mu;
  absl::Time now = absl::FromUnixSeconds(1000);
  absl::Time Now() {
    absl::MutexLock lock(&mu);
    return now;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu);
    now += d;
  }
};

// A manager over `pool_bytes` of 4 KiB pages in 1 MiB slabs (as session_test::MakeManager), whose
// pool the test keeps a pointer to (owned by the manager).
struct Harness {
  std::unique_ptr<SessionManager> sm;
  PagePool* pool = nullptr;
  ManualClock clock;

  explicit Harness(uint64_t pool_bytes, SessionManager::Options o = {}) {
    PagePool::Options po;
    po.budget_bytes = pool_bytes;
    po.page_bytes = kPage;
    po.slab_bytes = kMiB;
    po.reserve_slabs = 0;
    po.hugepages = PagePool::Hugepages::kOff;
    po.pretouch_threads = 1;
    auto made = PagePool::Create(po);
    EXPECT_TRUE(made.ok()) << made.status();
    if (!made.ok()) return;
    pool = made->get();
    o.clock = [this] { return clock.Now(); };
    if (o.max_sessions == 256) o.max_sessions = 32;
    sm = std::make_unique<SessionManager>(o, std::move(*made));
  }
  v1::SessionRef Open(uint32_t uid, const std::string& engine = "engine", uint32_t rows = 4) {
    return session_test::OpenHost(*sm, {engine, /*layers=*/1, /*record_bytes=*/16, rows}, uid);
  }
  absl::StatusOr<v1::AdmitResponse> Admit(const v1::SessionRef& ref, uint64_t id, uint32_t tokens, uint32_t lease = 0) {
    v1::AdmitRequest req = AdmitOf(ref, id, tokens);
    req.set_lease_seconds(lease);
    return sm->Admit(req);
  }
  // The engine's fetch of a slab over the fd channel, as tenant `uid`.
  UniqueFd FetchSlab(const v1::SessionRef& ref, uint64_t slab, uint32_t uid) {
    auto fd = sm->DupFdFor(ref.session_id(), ref.token(), "slab " + std::to_string(slab), Owner(uid));
    EXPECT_TRUE(fd.ok()) << fd.status();
    return fd.ok() ? *std::move(fd) : UniqueFd();
  }
};

uint64_t AllocatedBytes(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

// Maps a whole slab the way an engine does, and writes every page of it.
uint8_t* MapAndWrite(int fd, uint64_t bytes) {
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  EXPECT_NE(map, MAP_FAILED);
  if (map == MAP_FAILED) return nullptr;
  std::memset(map, 0x5a, bytes);
  return static_cast<uint8_t*>(map);
}

// ---- 1. retired slabs ----

TEST(RetiredSlabTest, ASlabAnEngineKeptIsPunchedOutOfItsMemfdWhenItRetires) {
  Harness h(8 * kMiB);
  ASSERT_NE(h.sm, nullptr);
  const v1::SessionRef ref = h.Open(kTenant);
  auto admitted = h.Admit(ref, 1, kSlabTokens);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  UniqueFd kept = h.FetchSlab(ref, admitted->layers(0).pages(0).slab(), kTenant);
  ASSERT_TRUE(kept.valid());
  uint8_t* map = MapAndWrite(kept.get(), kMiB);
  ASSERT_NE(map, nullptr);
  ASSERT_EQ(::munmap(map, kMiB), 0);
  ASSERT_EQ(AllocatedBytes(kept.get()), kMiB);
  // The hostile engine keeps the descriptor; its session ends.
  h.sm->CloseSession(ref.session_id());
  h.sm->WaitPoolIdle();
  EXPECT_EQ(AllocatedBytes(kept.get()), 0u) << "the retired slab's memory lives on in the engine's descriptor";
  const v1::StatsResponse st = h.sm->Stats();
  EXPECT_EQ(st.host_pool().retired_bytes(), 0u);
  EXPECT_EQ(st.host_pool().retired_slabs(), 0u);
  EXPECT_EQ(st.host_pool().slabs(), 0u);
  EXPECT_INVARIANTS(*h.sm);
}

TEST(RetiredSlabTest, ARetiredSlabCountsAgainstItsTenantUntilItIsPunched) {
  SessionManager::Options o;
  o.quotas.host_bytes = 2 * kMiB;
  Harness h(8 * kMiB, o);
  ASSERT_NE(h.sm, nullptr);
  const v1::SessionRef ref = h.Open(kTenant);
  auto admitted = h.Admit(ref, 1, kSlabTokens);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  UniqueFd kept = h.FetchSlab(ref, admitted->layers(0).pages(0).slab(), kTenant);
  ASSERT_TRUE(kept.valid());
  h.pool->PauseWorkerForTest(true);  // the slab retires; its punch has not come yet
  h.sm->CloseSession(ref.session_id());
  v1::StatsResponse st = h.sm->Stats();
  EXPECT_EQ(st.host_pool().retired_bytes(), kMiB);
  EXPECT_EQ(st.host_pool().retired_slabs(), 1u);
  EXPECT_EQ(h.sm->Stats(kTenant).host_pool().retired_bytes(), kMiB);  // the tenant sees its own
  EXPECT_EQ(h.sm->Stats(kOther).host_pool().retired_bytes(), 0u);
  // The tenant's quota holds the retired slab: 1 MiB more fits, a page beyond does not.
  const v1::SessionRef again = h.Open(kTenant);
  const absl::Status over = h.Admit(again, 1, kSlabTokens + 256).status();
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_NE(over.message().find("retired slabs"), std::string::npos) << over;
  EXPECT_TRUE(h.Admit(again, 2, kSlabTokens).ok());
  // Another tenant is not charged for it.
  const v1::SessionRef other = h.Open(kOther);
  EXPECT_TRUE(h.Admit(other, 1, 2 * kSlabTokens).ok());
  EXPECT_INVARIANTS(*h.sm);
  // Punched: the charge is gone with the memory.
  h.pool->PauseWorkerForTest(false);
  h.sm->WaitPoolIdle();
  EXPECT_EQ(AllocatedBytes(kept.get()), 0u);
  st = h.sm->Stats();
  EXPECT_EQ(st.host_pool().retired_bytes(), 0u);
  EXPECT_EQ(st.host_pool().retired_slabs(), 0u);
  EXPECT_TRUE(h.Admit(again, 3, kSlabTokens).ok());
  EXPECT_INVARIANTS(*h.sm);
}

TEST(RetiredSlabTest, PagesTouchedAgainAfterThePunchStayChargedUntilASweepFreesThem) {
  SessionManager::Options o;
  o.quotas.host_bytes = 2 * kMiB;
  Harness h(8 * kMiB, o);
  ASSERT_NE(h.sm, nullptr);
  const v1::SessionRef ref = h.Open(kTenant);
  auto admitted = h.Admit(ref, 1, kSlabTokens);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  UniqueFd kept = h.FetchSlab(ref, admitted->layers(0).pages(0).slab(), kTenant);
  ASSERT_TRUE(kept.valid());
  uint8_t* map = MapAndWrite(kept.get(), kMiB);
  ASSERT_NE(map, nullptr);
  // The engine writes 64 pages again right after the punch, before the daemon measures the memfd.
  constexpr uint64_t kTouched = 64 * kPage;
  h.pool->SetAfterPunchForTest([map] { std::memset(map, 0x6b, kTouched); });
  h.sm->CloseSession(ref.session_id());
  h.sm->WaitPoolIdle();
  h.pool->SetAfterPunchForTest(nullptr);
  const uint64_t held = AllocatedBytes(kept.get());
  ASSERT_GE(held, kTouched);
  v1::StatsResponse st = h.sm->Stats();
  EXPECT_EQ(st.host_pool().retired_bytes(), held);
  EXPECT_EQ(st.host_pool().retired_slabs(), 1u);
  const v1::SessionRef again = h.Open(kTenant);
  const uint32_t room = static_cast<uint32_t>((2 * kMiB - held) / kPage) * 256;
  EXPECT_EQ(h.Admit(again, 1, room + 256).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(h.Admit(again, 2, room).ok());
  // The sweep punches it again and finds it empty: dropped, the charge with it.
  EXPECT_EQ(h.sm->SweepRetiredSlabs(), 1u);
  EXPECT_EQ(AllocatedBytes(kept.get()), 0u);
  st = h.sm->Stats();
  EXPECT_EQ(st.host_pool().retired_bytes(), 0u);
  EXPECT_EQ(st.host_pool().retired_slabs(), 0u);
  EXPECT_EQ(h.sm->SweepRetiredSlabs(), 0u);
  ASSERT_EQ(::munmap(map, kMiB), 0);
  EXPECT_INVARIANTS(*h.sm);
}

TEST(RetiredSlabTest, CyclesOfAKeptDescriptorPinNothing) {
  // The attack in small: open, admit the whole quota, fetch and write the slabs, close,
  // keeping every descriptor. Eight cycles pinned eight quotas.
  SessionManager::Options o;
  o.quotas.host_bytes = 2 * kMiB;
  Harness h(8 * kMiB, o);
  ASSERT_NE(h.sm, nullptr);
  std::vector<UniqueFd> kept;
  for (int cycle = 0; cycle < 8; ++cycle) {
    const v1::SessionRef ref = h.Open(kTenant);
    auto admitted = h.Admit(ref, 1, 2 * kSlabTokens);
    ASSERT_TRUE(admitted.ok()) << "cycle " << cycle << ": " << admitted.status();
    std::vector<uint64_t> slabs;
    for (const auto& p : admitted->layers(0).pages()) {
      if (slabs.empty() || slabs.back() != p.slab()) slabs.push_back(p.slab());
    }
    for (uint64_t slab : slabs) {
      kept.push_back(h.FetchSlab(ref, slab, kTenant));
      uint8_t* map = MapAndWrite(kept.back().get(), kMiB);
      ASSERT_NE(map, nullptr);
      ASSERT_EQ(::munmap(map, kMiB), 0);
    }
    h.sm->CloseSession(ref.session_id());
    h.sm->WaitPoolIdle();
  }
  uint64_t pinned = 0;
  for (const UniqueFd& fd : kept) pinned += AllocatedBytes(fd.get());
  EXPECT_EQ(pinned, 0u) << kept.size() << " kept descriptors pin " << pinned << " bytes";
  EXPECT_EQ(h.sm->Stats().host_pool().retired_bytes(), 0u);
  EXPECT_INVARIANTS(*h.sm);
}

// ---- 5. TP group names are their tenant's ----

absl::StatusOr<v1::SessionRef> OpenRank(SessionManager& sm, uint32_t uid, const std::string& group, uint32_t rank,
                                        uint32_t size) {
  v1::OpenSession open = session_test::OpenMessage({"tp-engine", 1, 16, 4});
  open.mutable_group()->set_name(group);
  open.mutable_group()->set_rank(rank);
  open.mutable_group()->set_size(size);
  return session_test::OpenRef(sm, open, uid);
}

TEST(GroupScopeTest, AnotherUidCannotSquatTheNameATpEngineWillUse) {
  Harness h(8 * kMiB);
  ASSERT_NE(h.sm, nullptr);
  // The squatter comes first, with the name and a size of its own choosing.
  auto squat = OpenRank(*h.sm, kOther, "run-42", 0, 4);
  ASSERT_TRUE(squat.ok()) << squat.status();
  // The TP engine's ranks open as if the name were free, and their group works.
  auto rank0 = OpenRank(*h.sm, kTenant, "run-42", 0, 2);
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  auto rank1 = OpenRank(*h.sm, kTenant, "run-42", 1, 2);
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  v1::AdmitRequest req = AdmitOf(*rank0, 7, 1000);
  req.set_group(true);
  ASSERT_TRUE(h.sm->Admit(req).ok());
  *req.mutable_session() = *rank1;
  auto attached = h.sm->Admit(req);
  ASSERT_TRUE(attached.ok()) << attached.status();
  // The squatter's group is its own: it lacks ranks, and holds nothing of the engine's.
  v1::AdmitRequest theirs = AdmitOf(*squat, 7, 1000);
  theirs.set_group(true);
  EXPECT_EQ(h.sm->Admit(theirs).status().code(), absl::StatusCode::kFailedPrecondition);
  // A second rank 0 of the tenant's own group is still refused (the rank is held).
  EXPECT_EQ(OpenRank(*h.sm, kTenant, "run-42", 0, 2).status().code(), absl::StatusCode::kAlreadyExists);
  const v1::StatsResponse all = h.sm->Stats();
  ASSERT_EQ(all.groups_size(), 2);
  for (const auto& g : all.groups()) {
    EXPECT_EQ(g.name(), "run-42");
    EXPECT_EQ(g.size(), g.tenant_uid() == kTenant ? 2u : 4u);
    EXPECT_EQ(g.requests(), g.tenant_uid() == kTenant ? 1u : 0u);
  }
  const v1::StatsResponse mine = h.sm->Stats(kTenant);
  ASSERT_EQ(mine.groups_size(), 1);
  EXPECT_EQ(mine.groups(0).tenant_uid(), kTenant);
  EXPECT_EQ(h.sm->Stats(kOther).groups_size(), 1);
  EXPECT_INVARIANTS(*h.sm);
  // Each group ends with its own last member.
  h.sm->CloseSession(squat->session_id());
  EXPECT_EQ(h.sm->Stats().groups_size(), 1);
  h.sm->CloseSession(rank0->session_id());
  h.sm->CloseSession(rank1->session_id());
  EXPECT_EQ(h.sm->Stats().groups_size(), 0);
  EXPECT_EQ(h.sm->Stats().host_pool().pages_used(), 0u);
  EXPECT_INVARIANTS(*h.sm);
}

// ---- 7. eviction against a request released and admitted again meanwhile ----

// Accepts every registration; records what it was asked.
class FakeTarget : public ImportTarget {
 public:
  std::string WorkerAddress() const override { return "fake-worker"; }
  absl::Status Register(const std::string& grant_id, Grant /*grant*/) override {
    absl::MutexLock lock(&mu_);
    registered_.push_back(grant_id);
    return absl::OkStatus();
  }
  void Unregister(const std::string& grant_id) override {
    absl::MutexLock lock(&mu_);
    unregistered_.push_back(grant_id);
  }
  size_t unregistered() {
    absl::MutexLock lock(&mu_);
    return unregistered_.size();
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> registered_ ABSL_GUARDED_BY(mu_), unregistered_ ABSL_GUARDED_BY(mu_);
};

class EvictionRaceTest : public ::testing::Test {
 protected:
  void Make(bool evict_on_pool_full, uint64_t pool_bytes) {
    SessionManager::Options o;
    o.evict_on_pool_full = evict_on_pool_full;
    o.import_grant_ttl = absl::Seconds(10);
    h_ = std::make_unique<Harness>(pool_bytes, o);
    ASSERT_NE(h_->sm, nullptr);
    h_->sm->SetImportTarget(&target_);
    ref_ = h_->Open(kTenant);
    // The engine's stream. At the first eviction notice, in the gap between the victim's choice
    // and its eviction (the notice is posted outside the lock), the engine has released the
    // request and admitted its id again, as an import.
    h_->sm->SetEventSink(ref_.session_id(), [this](const v1::SessionEvent& e) {
      if (!e.has_evicted() || raced_) return true;
      raced_ = true;
      EXPECT_TRUE(session_test::Release(*h_->sm, ref_, e.evicted().request_id()).ok());
      v1::AdmitRequest again = AdmitOf(ref_, e.evicted().request_id(), 256);
      again.set_begin_import(true);
      auto opened = h_->sm->Admit(again);
      EXPECT_TRUE(opened.ok()) << opened.status();
      if (opened.ok()) grant_ = opened->grant();
      return true;
    });
  }
  v1::CommitImportRequest Commit() const {
    v1::CommitImportRequest c;
    c.set_grant_id(grant_.grant_id());
    c.set_session_id(grant_.session_id());
    c.set_request_id(grant_.request_id());
    return c;
  }
  // The request's state in ListRequests (UNSPECIFIED: not held).
  v1::RequestState StateOf(uint64_t id) {
    v1::ListRequestsRequest req;
    req.set_session_id(ref_.session_id());
    auto listed = h_->sm->ListRequests(req);
    EXPECT_TRUE(listed.ok()) << listed.status();
    if (listed.ok()) {
      for (const auto& r : listed->requests()) {
        if (r.request_id() == id) return r.state();
      }
    }
    return v1::REQUEST_STATE_UNSPECIFIED;
  }

  FakeTarget target_;
  std::unique_ptr<Harness> h_;
  v1::SessionRef ref_;
  bool raced_ = false;  // touched by the sink, which runs on the evicting (test) thread
  v1::ImportGrant grant_;
};

TEST_F(EvictionRaceTest, AnOperatorsEvictionSparesTheImportThatTookItsVictimsId) {
  Make(/*evict_on_pool_full=*/false, 8 * kMiB);
  ASSERT_TRUE(h_->Admit(ref_, 1, 1000).ok());
  v1::EvictRequest evict;
  evict.set_session_id(ref_.session_id());
  evict.set_request_id(1);
  const absl::Status evicted = h_->sm->Evict(evict).status();
  ASSERT_TRUE(raced_);
  ASSERT_FALSE(grant_.grant_id().empty());
  EXPECT_EQ(evicted.code(), absl::StatusCode::kNotFound) << evicted;
  EXPECT_EQ(StateOf(1), v1::REQUEST_STATE_IMPORTING);
  EXPECT_EQ(h_->sm->Stats().evictions(), 0u);
  EXPECT_INVARIANTS(*h_->sm);
  // The grant is the import's still: its commit makes the request live.
  const absl::Status committed = h_->sm->CommitImport(Commit(), kTenant);
  EXPECT_TRUE(committed.ok()) << committed;
  EXPECT_EQ(StateOf(1), v1::REQUEST_STATE_LIVE);
  EXPECT_INVARIANTS(*h_->sm);
  EXPECT_TRUE(session_test::Release(*h_->sm, ref_, 1).ok());
  EXPECT_EQ(h_->sm->Stats().host_pool().pages_used(), 0u);
}

TEST_F(EvictionRaceTest, TheImportThatTookItsVictimsIdExpiresCleanly) {
  Make(/*evict_on_pool_full=*/false, 8 * kMiB);
  ASSERT_TRUE(h_->Admit(ref_, 1, 1000).ok());
  v1::EvictRequest evict;
  evict.set_session_id(ref_.session_id());
  evict.set_request_id(1);
  EXPECT_EQ(h_->sm->Evict(evict).status().code(), absl::StatusCode::kNotFound);
  ASSERT_FALSE(grant_.grant_id().empty());
  h_->clock.Advance(absl::Seconds(11));
  EXPECT_EQ(h_->sm->ExpireImports(), 1u);
  EXPECT_EQ(target_.unregistered(), 1u);
  EXPECT_EQ(StateOf(1), v1::REQUEST_STATE_UNSPECIFIED);
  EXPECT_EQ(h_->sm->Stats().host_pool().pages_used(), 0u);
  EXPECT_INVARIANTS(*h_->sm);
}

TEST_F(EvictionRaceTest, AFullPoolsEvictionSparesTheImportThatTookItsVictimsId) {
  // 1 MiB of pool: request 1 holds most of it, request 2 needs room, request 1 is the victim.
  Make(/*evict_on_pool_full=*/true, kMiB);
  ASSERT_TRUE(h_->Admit(ref_, 1, 200 * 256).ok());
  const absl::Status second = h_->Admit(ref_, 2, 100 * 256).status();
  ASSERT_TRUE(raced_);
  ASSERT_FALSE(grant_.grant_id().empty());
  // The victim's id names the import now, which is spared; the engine's release made the room.
  EXPECT_TRUE(second.ok()) << second;
  EXPECT_EQ(StateOf(1), v1::REQUEST_STATE_IMPORTING);
  EXPECT_EQ(StateOf(2), v1::REQUEST_STATE_LIVE);
  EXPECT_EQ(h_->sm->Stats().evictions(), 0u);
  EXPECT_INVARIANTS(*h_->sm);
  const absl::Status committed = h_->sm->CommitImport(Commit(), kTenant);
  EXPECT_TRUE(committed.ok()) << committed;
  EXPECT_EQ(StateOf(1), v1::REQUEST_STATE_LIVE);
  EXPECT_INVARIANTS(*h_->sm);
}

// ---- 8. ListAdoptable pages; orphans are capped per tenant ----

class OrphanTest : public ::testing::Test {
 protected:
  void Make(uint32_t max_orphans) {
    SessionManager::Options o;
    o.max_lease_seconds = 600;
    o.max_orphans_per_tenant = max_orphans;
    h_ = std::make_unique<Harness>(16 * kMiB, o);
    ASSERT_NE(h_->sm, nullptr);
  }
  // A session of `uid` that admits durable requests `ids` and ends: its id.
  uint64_t Orphan(uint32_t uid, std::vector<uint64_t> ids) {
    const v1::SessionRef ref = h_->Open(uid);
    for (uint64_t id : ids) EXPECT_TRUE(h_->Admit(ref, id, 100, /*lease=*/60).ok());
    h_->sm->CloseSession(ref.session_id());
    return ref.session_id();
  }
  absl::StatusOr<v1::ListAdoptableResponse> List(const v1::SessionRef& ref, uint32_t page_size,
                                                 const std::string& token = "") {
    v1::ListAdoptableRequest req;
    *req.mutable_session() = ref;
    req.set_page_size(page_size);
    req.set_page_token(token);
    return h_->sm->ListAdoptable(req);
  }
  std::unique_ptr<Harness> h_;
};

using Entry = std::pair<uint64_t, uint64_t>;  // (dead session, request)
std::vector<Entry> Entries(const v1::ListAdoptableResponse& r) {
  std::vector<Entry> out;
  for (const auto& a : r.requests()) out.emplace_back(a.dead_session_id(), a.request_id());
  return out;
}

TEST_F(OrphanTest, ListAdoptableComesInPages) {
  Make(/*max_orphans=*/0);
  const uint64_t a = Orphan(kTenant, {1, 2}), b = Orphan(kTenant, {3, 4}), c = Orphan(kTenant, {5});
  Orphan(kOther, {6});  // another tenant's: never listed
  const v1::SessionRef me = h_->Open(kTenant);
  auto first = List(me, 2);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(Entries(*first), (std::vector<Entry>{{a, 1}, {a, 2}}));
  ASSERT_FALSE(first->next_page_token().empty());
  auto second = List(me, 2, first->next_page_token());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(Entries(*second), (std::vector<Entry>{{b, 3}, {b, 4}}));
  // Adopting what the page showed shifts nothing: the token names where the listing was.
  v1::AdoptRequest adopt;
  *adopt.mutable_session() = me;
  adopt.set_dead_session_id(b);
  ASSERT_TRUE(h_->sm->Adopt(adopt).ok());
  auto third = List(me, 2, second->next_page_token());
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(Entries(*third), (std::vector<Entry>{{c, 5}}));
  EXPECT_TRUE(third->next_page_token().empty());
  // 0: the default page, which holds them all here; a page of exactly what is left says so.
  auto all = List(me, 0);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(Entries(*all), (std::vector<Entry>{{a, 1}, {a, 2}, {c, 5}}));
  EXPECT_TRUE(all->next_page_token().empty());
  auto exact = List(me, 3);
  ASSERT_TRUE(exact.ok());
  EXPECT_TRUE(exact->next_page_token().empty());
  // A token the daemon never handed out.
  EXPECT_EQ(List(me, 2, "not-a-token").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_INVARIANTS(*h_->sm);
}

TEST_F(OrphanTest, OrphansAreCappedPerTenantAndTheCapChangesLive) {
  Make(/*max_orphans=*/2);
  Orphan(kTenant, {1});
  Orphan(kTenant, {2, 3});
  Orphan(kTenant, {4});  // over the cap: released as it ends
  Orphan(kOther, {5});   // another tenant's cap is its own
  v1::StatsResponse st = h_->sm->Stats();
  EXPECT_EQ(st.orphaned_requests(), 4u);
  EXPECT_EQ(st.orphans_refused(), 1u);
  EXPECT_EQ(h_->sm->Stats(kTenant).orphaned_requests(), 3u);
  EXPECT_INVARIANTS(*h_->sm);
  // A session without durable requests is not refused anything.
  Orphan(kTenant, {});
  EXPECT_EQ(h_->sm->Stats().orphans_refused(), 1u);
  // Raised: the next one is kept.
  h_->sm->SetMaxOrphansPerTenant(3);
  Orphan(kTenant, {6});
  EXPECT_EQ(h_->sm->Stats(kTenant).orphaned_requests(), 4u);
  // Lowered below what is held: those stay, the next goes.
  h_->sm->SetMaxOrphansPerTenant(1);
  Orphan(kTenant, {7});
  st = h_->sm->Stats(kTenant);
  EXPECT_EQ(st.orphaned_requests(), 4u);
  EXPECT_EQ(st.orphans_refused(), 2u);
  // Every lease ends: nothing is left.
  h_->clock.Advance(absl::Seconds(61));
  EXPECT_EQ(h_->sm->ExpireLeases(), 5u);
  EXPECT_EQ(h_->sm->Stats().host_pool().pages_used(), 0u);
  EXPECT_INVARIANTS(*h_->sm);
}

}  // namespace session_hardening_test
}  // namespace hisparse
