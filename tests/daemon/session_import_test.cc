// SessionManager's import grants (imports.cc) against a fake ImportTarget: a grant's
// memory is registered as the grant says and revoked before its pages are freed (commit, abort,
// expiry by the injected clock, session end), every call to the target is made outside the
// session manager's lock (the fake calls back into it), refusals change nothing, and the
// accounting invariants hold after every step.
#include <sys/stat.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "hisparse/daemon/import_target.h"
#include "hisparse/daemon/session_manager.h"
#include "session_test_util.h"

namespace hisparse {
namespace session_import_test {

using session_test::kMiB;
using session_test::kPage;

// Records registrations; on every Unregister it asks the manager (so a call made under its lock
// would deadlock) how many host bytes are held then.
class FakeTarget : public ImportTarget {
 public:
  std::string WorkerAddress() const override { return "fake-worker"; }
  absl::Status Register(const std::string& grant_id, Grant grant) override {
    if (fail_next || (succeed_before_failing >= 0 && succeed_before_failing-- == 0)) {
      fail_next = false;
      return absl::InternalError("fake registration failure");
    }
    registered.push_back(grant_id);
    grants[grant_id] = std::move(grant);
    return absl::OkStatus();
  }
  void Unregister(const std::string& grant_id) override {
    unregistered.push_back(grant_id);
    held_at_unregister.push_back(sm->Stats().host_pool().used_bytes());
  }
  SessionManager* sm = nullptr;
  bool fail_next = false;
  int succeed_before_failing = -1;  // >= 0: that many Registers succeed, the next fails
  std::vector<std::string> registered, unregistered;
  std::vector<uint64_t> held_at_unregister;
  std::map<std::string, Grant> grants;  // what each Register was given
};

class SessionImportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SessionManager::Options o;
    o.import_grant_ttl = absl::Seconds(10);
    o.clock = [this] {
      absl::MutexLock lock(&clock_mu_);
      return now_;
    };
    sm_ = session_test::MakeManager(8 * kMiB, o);
    ASSERT_NE(sm_, nullptr);
    target_.sm = sm_.get();
    sm_->SetImportTarget(&target_);
    auto ref = session_test::OpenRef(*sm_, session_test::OpenMessage({"", 2, 64, 8}), kUid);
    ASSERT_TRUE(ref.ok()) << ref.status();
    ref_ = *ref;
    sm_->SetEventSink(ref_.session_id(), [this](const v1::SessionEvent& e) {
      absl::MutexLock lock(&events_mu_);
      events_.push_back(e);
      return true;
    });
  }

  // An AdmitBatch of (id, begin_import) items of 100 tokens.
  absl::StatusOr<v1::AdmitBatchResponse> Batch(v1::BatchMode mode,
                                               const std::vector<std::pair<uint64_t, bool>>& items) {
    v1::AdmitBatchRequest req;
    *req.mutable_session() = ref_;
    req.set_mode(mode);
    for (const auto& [id, import] : items) {
      v1::AdmitItem* item = req.add_items();
      item->set_request_id(id);
      item->set_context_tokens(100);
      item->set_token_budget(100);
      item->set_begin_import(import);
    }
    return sm_->AdmitBatch(req);
  }
  absl::StatusOr<v1::AdmitResponse> AdmitImport(uint64_t id, uint32_t tokens) {
    v1::AdmitRequest req = session_test::AdmitOf(ref_, id, tokens);
    req.set_context_tokens(tokens);
    req.set_begin_import(true);
    return sm_->Admit(req);
  }
  v1::CommitImportRequest CommitOf(const v1::ImportGrant& g) {
    v1::CommitImportRequest c;
    c.set_grant_id(g.grant_id());
    c.set_session_id(g.session_id());
    c.set_request_id(g.request_id());
    return c;
  }
  uint64_t Used() const { return sm_->Stats().host_pool().used_bytes(); }
  std::vector<v1::SessionEvent> Events() {
    absl::MutexLock lock(&events_mu_);
    return events_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&clock_mu_);
    now_ += d;
  }

  static constexpr uint32_t kUid = 1234;
  FakeTarget target_;
  std::unique_ptr<SessionManager> sm_;
  v1::SessionRef ref_;
  absl::Mutex clock_mu_, events_mu_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
  std::vector<v1::SessionEvent> events_;
};

TEST_F(SessionImportTest, CommitRevokesBeforeTheRequestGoesLive) {
  auto admitted = AdmitImport(1, 1000);  // 16 pages a layer of 64 records
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  const v1::ImportGrant& g = admitted->grant();
  EXPECT_EQ(g.grant_id().size(), 32u);
  EXPECT_EQ(g.worker_address(), "fake-worker");
  EXPECT_EQ(g.records_per_page(), kPage / 64);
  EXPECT_EQ(g.max_write_bytes(), kMaxImportWriteBytes);
  // The grant names no daemon address; the target got the layout and page table to check writes
  // against: 2 layers of 16 distinct pages, 1000 positions of 64-byte records.
  EXPECT_EQ(g.GetReflection()->GetUnknownFields(g).field_count(), 0);
  ASSERT_EQ(target_.grants.count(g.grant_id()), 1u);
  const ImportTarget::Grant& t = target_.grants.at(g.grant_id());
  EXPECT_EQ(t.layout.num_layers, 2u);
  EXPECT_EQ(t.layout.capacity_tokens, 1000u);
  EXPECT_EQ(t.layout.records_per_page, kPage / 64);
  EXPECT_EQ(t.layout.record_bytes, 64u);
  EXPECT_EQ(t.page_bytes, kPage);
  ASSERT_EQ(t.pages.size(), 2u);
  // Each page a distinct page of a slab the target got a descriptor of (the worker maps them).
  ASSERT_FALSE(t.slabs.empty());
  std::set<std::pair<uint64_t, uint64_t>> distinct;  // (slab's inode, offset)
  for (const auto& layer : t.pages) {
    EXPECT_EQ(layer.size(), 16u);
    for (const ChannelPageRef& p : layer) {
      ASSERT_LT(p.slab, t.slabs.size());
      const ImportTarget::Slab& slab = t.slabs[p.slab];
      struct stat st {};
      ASSERT_EQ(::fstat(slab.fd.get(), &st), 0);
      EXPECT_EQ(static_cast<uint64_t>(st.st_size), slab.bytes);
      EXPECT_EQ(p.offset % kPage, 0u);
      EXPECT_LE(p.offset + kPage, slab.bytes);
      distinct.emplace(st.st_ino, p.offset);
    }
  }
  EXPECT_EQ(distinct.size(), 32u);
  const uint64_t held = Used();
  EXPECT_EQ(held, 32 * kPage);
  // Importing: no Extend, no Evict.
  v1::ExtendRequest ext;
  *ext.mutable_session() = ref_;
  ext.set_request_id(1);
  ext.set_token_budget(2000);
  EXPECT_EQ(sm_->Extend(ext).status().code(), absl::StatusCode::kFailedPrecondition);
  v1::EvictRequest ev;
  ev.set_session_id(ref_.session_id());
  ev.set_request_id(1);
  EXPECT_EQ(sm_->Evict(ev).status().code(), absl::StatusCode::kFailedPrecondition);
  // Another uid, another request: refused, nothing changes.
  EXPECT_EQ(sm_->CommitImport(CommitOf(g), kUid + 1).code(), absl::StatusCode::kPermissionDenied);
  v1::CommitImportRequest other = CommitOf(g);
  other.set_request_id(2);
  EXPECT_EQ(sm_->CommitImport(other, kUid).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(target_.unregistered.empty());
  EXPECT_TRUE(Events().empty());

  ASSERT_TRUE(sm_->CommitImport(CommitOf(g), kUid).ok());
  ASSERT_EQ(target_.unregistered.size(), 1u);
  EXPECT_EQ(target_.unregistered[0], g.grant_id());
  EXPECT_EQ(target_.held_at_unregister[0], held);
  EXPECT_EQ(Used(), held);  // live now
  ASSERT_EQ(Events().size(), 1u);
  EXPECT_TRUE(Events()[0].import_finished().committed());
  EXPECT_TRUE(sm_->Extend(ext).ok());
  EXPECT_EQ(sm_->CommitImport(CommitOf(g), kUid).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
}

TEST_F(SessionImportTest, ExpiryByTheClockFreesAfterRevoking) {
  auto admitted = AdmitImport(5, 100);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  const uint64_t held = Used();
  Advance(absl::Seconds(9));
  EXPECT_EQ(sm_->ExpireImports(), 0u);
  EXPECT_EQ(Used(), held);
  Advance(absl::Seconds(1));
  EXPECT_EQ(sm_->ExpireImports(), 1u);
  ASSERT_EQ(target_.held_at_unregister.size(), 1u);
  EXPECT_EQ(target_.held_at_unregister[0], held);  // revoked while still held
  EXPECT_EQ(Used(), 0u);
  EXPECT_EQ(sm_->Stats().requests(), 0u);
  ASSERT_EQ(Events().size(), 1u);
  EXPECT_FALSE(Events()[0].import_finished().committed());
  EXPECT_EQ(Events()[0].import_finished().reason(), "expired");
  EXPECT_EQ(sm_->CommitImport(CommitOf(admitted->grant()), kUid).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
}

// The import worker died (import_worker_target.cc): the grants it held are aborted, each telling
// its session why; a grant it never held, or one that ended already, is left as it is.
TEST_F(SessionImportTest, GrantsLostWithTheWorkerAreAbortedWithTheReason) {
  auto lost = AdmitImport(5, 100);
  auto kept = AdmitImport(6, 100);
  ASSERT_TRUE(lost.ok() && kept.ok());
  const uint64_t held = Used();
  ASSERT_TRUE(sm_->CommitImport(CommitOf(kept->grant()), kUid).ok());
  EXPECT_EQ(
      sm_->AbortLostImports({lost->grant().grant_id(), kept->grant().grant_id(), "0123456789abcdef0123456789abcdef"},
                            "the import worker (pid 7) was killed by signal 6"),
      1u);
  EXPECT_EQ(sm_->Stats().requests(), 1u);  // the committed one lives on
  EXPECT_LT(Used(), held);
  std::vector<v1::SessionEvent> events = Events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_TRUE(events[0].import_finished().committed());
  EXPECT_EQ(events[1].import_finished().request_id(), 5u);
  EXPECT_FALSE(events[1].import_finished().committed());
  EXPECT_EQ(events[1].import_finished().reason(), "aborted: the import worker (pid 7) was killed by signal 6");
  EXPECT_EQ(sm_->CommitImport(CommitOf(lost->grant()), kUid).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
}

TEST_F(SessionImportTest, ReleaseAndSessionEndAbortAfterRevoking) {
  auto a = AdmitImport(1, 100);
  auto b = AdmitImport(2, 100);
  ASSERT_TRUE(a.ok() && b.ok());
  const uint64_t both = Used();
  v1::ReleaseRequest rel;
  *rel.mutable_session() = ref_;
  rel.set_request_id(1);
  ASSERT_TRUE(sm_->Release(rel).ok());
  ASSERT_EQ(target_.unregistered.size(), 1u);
  EXPECT_EQ(target_.held_at_unregister[0], both);  // revoked while still held
  EXPECT_EQ(sm_->CommitImport(CommitOf(a->grant()), kUid).code(), absl::StatusCode::kFailedPrecondition);
  const uint64_t held = Used();
  EXPECT_GT(held, 0u);
  sm_->CloseSession(ref_.session_id());
  ASSERT_EQ(target_.unregistered.size(), 2u);
  EXPECT_EQ(target_.unregistered[1], b->grant().grant_id());
  EXPECT_EQ(target_.held_at_unregister[1], held);
  EXPECT_EQ(Used(), 0u);
  EXPECT_EQ(sm_->CommitImport(CommitOf(b->grant()), kUid).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
}

// A batched release aborts an importing request as a single Release does: its memory is revoked
// while still held, its grant is spent (a later commit is refused), the session hears the abort,
// and the accounting stays exact; the batch's other items are released as usual.
TEST_F(SessionImportTest, ReleaseBatchAbortsAnImportingRequest) {
  auto a = AdmitImport(1, 100);
  ASSERT_TRUE(a.ok()) << a.status();
  v1::AdmitRequest plain;
  *plain.mutable_session() = ref_;
  plain.set_request_id(2);
  plain.set_context_tokens(10);
  plain.set_token_budget(100);
  ASSERT_TRUE(sm_->Admit(plain).ok());
  const uint64_t both = Used();
  v1::ReleaseBatchRequest rel;
  *rel.mutable_session() = ref_;
  rel.add_request_ids(1);
  rel.add_request_ids(2);
  rel.add_request_ids(1);  // named twice: the second is refused, as for any item
  auto r = sm_->ReleaseBatch(rel);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->results_size(), 3);
  EXPECT_EQ(r->results(0).code(), 0) << r->results(0).message();
  EXPECT_EQ(r->results(1).code(), 0) << r->results(1).message();
  EXPECT_EQ(r->results(2).code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(r->released(), 2u);
  ASSERT_EQ(target_.unregistered.size(), 1u) << "the grant's memory must be revoked";
  EXPECT_EQ(target_.unregistered[0], a->grant().grant_id());
  EXPECT_EQ(target_.held_at_unregister[0], both);  // revoked while still held
  EXPECT_EQ(sm_->CommitImport(CommitOf(a->grant()), kUid).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Used(), 0u);
  bool told = false;
  for (const v1::SessionEvent& e : Events()) told |= e.has_import_finished() && !e.import_finished().committed();
  EXPECT_TRUE(told) << "the session hears ImportFinished{committed: false}";
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
}

// An importing request lists as IMPORTING (it holds a row but is not live yet) and counts in
// Stats.importing_requests; how grants end is counted: committed, aborted, expired.
TEST_F(SessionImportTest, ListingAndStatsShowImports) {
  auto a = AdmitImport(1, 100);
  auto b = AdmitImport(2, 100);
  auto c = AdmitImport(3, 100);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  auto state_of = [this](uint64_t id) {
    auto listed = sm_->ListRequests(v1::ListRequestsRequest());
    EXPECT_TRUE(listed.ok()) << listed.status();
    for (const v1::RequestInfo& r : listed->requests()) {
      if (r.request_id() == id) return r.state();
    }
    return v1::REQUEST_STATE_UNSPECIFIED;
  };
  EXPECT_EQ(state_of(1), v1::REQUEST_STATE_IMPORTING);
  EXPECT_EQ(sm_->Stats().importing_requests(), 3u);
  ASSERT_TRUE(sm_->CommitImport(CommitOf(a->grant()), kUid).ok());
  EXPECT_EQ(state_of(1), v1::REQUEST_STATE_LIVE);
  v1::AbortImportRequest abort;
  abort.set_grant_id(b->grant().grant_id());
  abort.set_session_id(b->grant().session_id());
  abort.set_request_id(b->grant().request_id());
  ASSERT_TRUE(sm_->AbortImport(abort, kUid).ok());
  Advance(absl::Seconds(11));  // past the 10 s grant ttl
  EXPECT_EQ(sm_->ExpireImports(), 1u);
  const v1::StatsResponse st = sm_->Stats();
  EXPECT_EQ(st.importing_requests(), 0u);
  EXPECT_EQ(st.imports_committed(), 1u);
  EXPECT_EQ(st.imports_aborted(), 1u);
  EXPECT_EQ(st.imports_expired(), 1u);
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
}

TEST_F(SessionImportTest, NoTargetOrAFailedRegistrationHoldsNothing) {
  target_.fail_next = true;
  EXPECT_EQ(AdmitImport(1, 100).status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(Used(), 0u);
  EXPECT_EQ(sm_->Stats().requests(), 0u);
  sm_->SetImportTarget(nullptr);
  EXPECT_EQ(AdmitImport(1, 100).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Used(), 0u);
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
  // The same id admits afterwards: nothing of the failed attempts is left.
  sm_->SetImportTarget(&target_);
  EXPECT_TRUE(AdmitImport(1, 100).ok());
}

// Review fix: an importing request's records are not there until commit, so it can be neither
// parked nor named as a shared prefix's parent; both are FAILED_PRECONDITION and change nothing.
TEST_F(SessionImportTest, AnImportingRequestCannotBeParkedOrAParent) {
  absl::StatusOr<v1::AdmitResponse> importing = AdmitImport(1, 100);
  ASSERT_TRUE(importing.ok()) << importing.status();
  const v1::StatsResponse before = sm_->Stats();
  v1::ParkRequest park;
  *park.mutable_session() = ref_;
  park.set_request_id(1);
  absl::StatusOr<v1::ParkResponse> parked = sm_->Park(park);
  EXPECT_EQ(parked.status().code(), absl::StatusCode::kFailedPrecondition) << parked.status();
  EXPECT_NE(parked.status().message().find("importing"), absl::string_view::npos) << parked.status();
  v1::AdmitRequest child;
  *child.mutable_session() = ref_;
  child.set_request_id(2);
  child.set_context_tokens(100);
  child.set_token_budget(200);
  child.set_parent_request_id(1);
  child.set_prefix_tokens(64);
  absl::StatusOr<v1::AdmitResponse> shared = sm_->Admit(child);
  EXPECT_EQ(shared.status().code(), absl::StatusCode::kFailedPrecondition) << shared.status();
  EXPECT_NE(shared.status().message().find("importing"), absl::string_view::npos) << shared.status();
  const v1::StatsResponse after = sm_->Stats();
  EXPECT_EQ(after.requests(), before.requests());
  EXPECT_EQ(after.parked_requests(), 0u);
  EXPECT_EQ(after.host_pool().pages_used(), before.host_pool().pages_used());
  EXPECT_EQ(after.host_pool().pages_shared(), 0u);
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
  // Once committed it is an ordinary request: both work.
  ASSERT_TRUE(sm_->CommitImport(CommitOf(importing->grant()), kUid).ok());
  EXPECT_TRUE(sm_->Admit(child).ok());
  EXPECT_TRUE(sm_->Park(park).ok());
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
}

// Batched import (AdmitItem.begin_import): each admitted import item carries its own registered
// grant; a PER_ITEM item whose registration fails is freed alone; an ALL_OR_NOTHING batch whose
// registration fails for one item revokes every grant it registered while the pages are still
// held, then frees everything (the pool as before, no grant left to commit).
TEST_F(SessionImportTest, BatchedImportsCarryTheirGrantsPerItem) {
  auto r = Batch(v1::BATCH_MODE_PER_ITEM, {{1, true}, {2, false}, {3, true}, {1, true}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->results_size(), 4);
  EXPECT_EQ(r->admitted(), 3u);
  ASSERT_TRUE(r->results(0).has_admitted()) << r->results(0).error().message();
  ASSERT_TRUE(r->results(2).has_admitted()) << r->results(2).error().message();
  EXPECT_FALSE(r->results(1).admitted().has_grant());  // a plain item
  EXPECT_EQ(r->results(3).error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  const v1::ImportGrant g1 = r->results(0).admitted().grant();
  const v1::ImportGrant g3 = r->results(2).admitted().grant();
  EXPECT_NE(g1.grant_id(), g3.grant_id());
  EXPECT_EQ(g1.request_id(), 1u);
  EXPECT_EQ(g1.worker_address(), "fake-worker");
  EXPECT_EQ(target_.grants.at(g1.grant_id()).pages.size(), 2u);
  EXPECT_EQ(target_.registered, (std::vector<std::string>{g1.grant_id(), g3.grant_id()}));
  EXPECT_EQ(sm_->Stats().importing_requests(), 2u);
  EXPECT_TRUE(sm_->CommitImport(CommitOf(g1), kUid).ok());
  EXPECT_TRUE(sm_->CommitImport(CommitOf(g3), kUid).ok());
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();

  // PER_ITEM: the second registration fails; that item alone is freed.
  const uint64_t before = Used();
  target_.succeed_before_failing = 1;
  auto partly = Batch(v1::BATCH_MODE_PER_ITEM, {{10, true}, {11, true}, {12, false}});
  ASSERT_TRUE(partly.ok()) << partly.status();
  EXPECT_TRUE(partly->results(0).has_admitted());
  EXPECT_EQ(partly->results(1).error().code(), static_cast<int>(absl::StatusCode::kInternal));
  EXPECT_TRUE(partly->results(2).has_admitted());
  EXPECT_EQ(partly->admitted(), 2u);
  EXPECT_EQ(sm_->Stats().requests(), 5u);
  EXPECT_GT(Used(), before);
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
}

TEST_F(SessionImportTest, AllOrNothingBatchRevokesEveryRegisteredGrantOnFailure) {
  const uint64_t admissions = sm_->Stats().admissions();
  target_.succeed_before_failing = 2;  // items 0 and 2 register, item 3 fails
  auto r = Batch(v1::BATCH_MODE_ALL_OR_NOTHING, {{1, true}, {2, false}, {3, true}, {4, true}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->failed_item(), 4u);
  EXPECT_EQ(r->admitted(), 0u);
  ASSERT_EQ(r->results_size(), 4);
  EXPECT_EQ(r->results(3).error().code(), static_cast<int>(absl::StatusCode::kInternal));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r->results(i).error().code(), static_cast<int>(absl::StatusCode::kAborted)) << i;
  }
  ASSERT_EQ(target_.registered.size(), 2u);
  // Both registered grants revoked, each while the batch's pages were still held.
  EXPECT_EQ(std::set<std::string>(target_.unregistered.begin(), target_.unregistered.end()),
            std::set<std::string>(target_.registered.begin(), target_.registered.end()));
  for (uint64_t held : target_.held_at_unregister) EXPECT_GT(held, 0u);
  EXPECT_EQ(Used(), 0u);
  EXPECT_EQ(sm_->Stats().requests(), 0u);
  EXPECT_EQ(sm_->Stats().importing_requests(), 0u);
  EXPECT_EQ(sm_->Stats().admissions(), admissions);
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();

  // A failure under the lock (a duplicate) registers nothing at all.
  target_.registered.clear();
  auto dup = Batch(v1::BATCH_MODE_ALL_OR_NOTHING, {{1, true}, {1, false}});
  ASSERT_TRUE(dup.ok()) << dup.status();
  EXPECT_EQ(dup->failed_item(), 2u);
  EXPECT_TRUE(target_.registered.empty());
  EXPECT_EQ(Used(), 0u);
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();

  // Where no imports are served an import item is FAILED_PRECONDITION, as Admit's.
  sm_->SetImportTarget(nullptr);
  auto off = Batch(v1::BATCH_MODE_PER_ITEM, {{5, true}, {6, false}});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->results(0).error().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(off->results(1).has_admitted());
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
}

// An importing request refuses ParkBatch as Park does (FAILED_PRECONDITION), and an
// all-or-nothing batch naming it parks nothing.
TEST_F(SessionImportTest, ParkBatchRefusesAnImportingRequest) {
  ASSERT_TRUE(AdmitImport(1, 100).ok());
  auto r = Batch(v1::BATCH_MODE_PER_ITEM, {{2, false}});
  ASSERT_TRUE(r.ok() && r->admitted() == 1u);
  v1::ParkBatchRequest park;
  *park.mutable_session() = ref_;
  park.set_mode(v1::BATCH_MODE_ALL_OR_NOTHING);
  park.add_request_ids(2);
  park.add_request_ids(1);
  auto parked = sm_->ParkBatch(park);
  ASSERT_TRUE(parked.ok()) << parked.status();
  EXPECT_EQ(parked->results(0).error().code(), static_cast<int>(absl::StatusCode::kAborted));
  EXPECT_EQ(parked->results(1).error().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(sm_->Stats().parked_requests(), 0u);
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
}

}  // namespace session_import_test
}  // namespace hisparse
