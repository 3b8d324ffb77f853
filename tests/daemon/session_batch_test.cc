// SessionManager::AdmitBatch / ReleaseBatch (daemon/batches.cc): an all-or-nothing batch that
// fails leaves the pool, the ledger and every counter as they were; a per-item batch gives each
// item what a single Admit would (duplicates and over-quota items refused, the rest admitted);
// evict_lru_idle evicts for a per-item batch but never one of its own requests, and never for an
// all-or-nothing one; ReleaseBatch reports unknown and repeated ids per id and releases the rest.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "hisparse/daemon/session_manager.h"
#include "session_test_util.h"

namespace hisparse {
namespace session_batch_test {

using session_test::AdmitOf;
using session_test::Codes;
using session_test::kMiB;
using session_test::kPage;

constexpr uint32_t kPageTokens = 256;  // tokens of one page
constexpr int kAborted = static_cast<int>(absl::StatusCode::kAborted);

// A manager whose clock ticks a second a reading: the LRU order is the call order.
std::unique_ptr<SessionManager> MakeManager(uint64_t pool_bytes, const SessionManager::QuotaOptions& quotas = {},
                                            bool evict = false) {
  SessionManager::Options o;
  o.quotas = quotas;
  o.evict_on_pool_full = evict;
  o.clock = session_test::TickingClock();
  return session_test::MakeManager(pool_bytes, o);
}

// A host session of one layer of 16-byte records, tenant `uid`.
v1::SessionRef Open(SessionManager& sm, uint32_t uid = 1000, uint32_t max_requests = 128) {
  session_test::HostSession host;
  host.engine_name = "session-batch-test";
  host.max_requests = max_requests;
  return session_test::OpenHost(sm, host, uid);
}

struct Item {
  uint64_t id;
  uint32_t tokens;
};

v1::AdmitBatchRequest Batch(const v1::SessionRef& ref, v1::BatchMode mode, const std::vector<Item>& items) {
  v1::AdmitBatchRequest req;
  *req.mutable_session() = ref;
  req.set_mode(mode);
  for (const Item& it : items) {
    v1::AdmitItem* item = req.add_items();
    item->set_request_id(it.id);
    item->set_token_budget(it.tokens);
  }
  return req;
}

absl::Status Admit(SessionManager& sm, const v1::SessionRef& ref, uint64_t id, uint32_t tokens) {
  return sm.Admit(AdmitOf(ref, id, tokens)).status();
}

// The figures a batch must leave exact.
struct Figures {
  uint64_t pages_used, admissions, rejections, evictions;
  uint32_t requests;
  std::map<std::string, uint64_t> by_reason;
};

Figures Take(const SessionManager& sm) {
  const v1::StatsResponse st = sm.Stats();
  Figures f{st.host_pool().pages_used(), st.admissions(), st.rejections(), st.evictions(), st.requests(), {}};
  for (const auto& rc : st.rejections_by_reason()) f.by_reason[rc.reason()] = rc.count();
  return f;
}

TEST(SessionBatchTest, AllOrNothingRollbackLeavesEverythingAsBefore) {
  SessionManager::QuotaOptions q;
  q.host_bytes = 4 * kPage;
  auto sm = MakeManager(4 * kMiB, q);
  const v1::SessionRef s = Open(*sm);
  ASSERT_TRUE(Admit(*sm, s, 100, 1).ok());  // one page of the tenant's four
  Figures before = Take(*sm);

  // Three items fit the quota; the fourth does not: the three are rolled back.
  absl::StatusOr<v1::AdmitBatchResponse> resp =
      sm->AdmitBatch(Batch(s, v1::BATCH_MODE_ALL_OR_NOTHING, {{1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}}));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->failed_item(), 4u);
  EXPECT_EQ(resp->admitted(), 0u);
  EXPECT_EQ(Codes(*resp), (std::vector<int>{kAborted, kAborted, kAborted,
                                            static_cast<int>(absl::StatusCode::kResourceExhausted), kAborted}));
  for (int i = 0; i < resp->results_size(); ++i) EXPECT_EQ(resp->results(i).request_id(), uint64_t(i) + 1);
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
  Figures after = Take(*sm);
  EXPECT_EQ(after.pages_used, before.pages_used);
  EXPECT_EQ(after.requests, before.requests);
  EXPECT_EQ(after.admissions, before.admissions);      // rolled back: no admission
  EXPECT_EQ(after.rejections, before.rejections + 1);  // the failing item's refusal, once
  EXPECT_EQ(after.by_reason["quota"], before.by_reason["quota"] + 1);
  auto listed = sm->ListRequests(v1::ListRequestsRequest());
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->requests_size(), 1);
  EXPECT_EQ(listed->requests(0).request_id(), 100u);

  // Rows and pages came back: the same three ids now fit, in the rows the rollback freed.
  resp = sm->AdmitBatch(Batch(s, v1::BATCH_MODE_ALL_OR_NOTHING, {{1, 1}, {2, 1}, {3, 1}}));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->failed_item(), 0u);
  EXPECT_EQ(resp->admitted(), 3u);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(resp->results(i).has_admitted());
    EXPECT_EQ(resp->results(i).admitted().row(), uint32_t(i) + 1);  // row 0 is request 100's
    EXPECT_EQ(resp->results(i).admitted().layers_size(), 1);
  }
  EXPECT_EQ(Take(*sm).admissions, before.admissions + 3);
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
}

TEST(SessionBatchTest, AllOrNothingDuplicateFailsTheWholeBatch) {
  auto sm = MakeManager(4 * kMiB);
  const v1::SessionRef s = Open(*sm);
  Figures before = Take(*sm);
  absl::StatusOr<v1::AdmitBatchResponse> resp =
      sm->AdmitBatch(Batch(s, v1::BATCH_MODE_ALL_OR_NOTHING, {{7, 10}, {8, 10}, {7, 10}}));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->failed_item(), 3u);
  EXPECT_EQ(Codes(*resp), (std::vector<int>{kAborted, kAborted, static_cast<int>(absl::StatusCode::kInvalidArgument)}));
  EXPECT_NE(resp->results(2).error().message().find("named twice"), std::string::npos);
  Figures after = Take(*sm);
  EXPECT_EQ(after.pages_used, 0u);
  EXPECT_EQ(after.requests, 0u);
  EXPECT_EQ(after.admissions, before.admissions);
  EXPECT_EQ(after.rejections, before.rejections);  // bad input is no refusal
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
}

TEST(SessionBatchTest, PerItemGivesEachItemItsOwnResult) {
  SessionManager::QuotaOptions q;
  q.host_bytes = 4 * kPage;
  auto sm = MakeManager(4 * kMiB, q);
  const v1::SessionRef s = Open(*sm);
  ASSERT_TRUE(Admit(*sm, s, 50, 1).ok());
  Figures before = Take(*sm);
  // good, duplicate, already admitted, id 0, over the quota (3 pages: 1 + 1 + 3 > 4), good.
  absl::StatusOr<v1::AdmitBatchResponse> resp = sm->AdmitBatch(
      Batch(s, v1::BATCH_MODE_PER_ITEM, {{1, 1}, {1, 1}, {50, 1}, {0, 1}, {2, 3 * kPageTokens}, {3, 1}}));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->failed_item(), 0u);
  EXPECT_EQ(resp->admitted(), 2u);
  EXPECT_EQ(Codes(*resp), (std::vector<int>{0, static_cast<int>(absl::StatusCode::kInvalidArgument),
                                            static_cast<int>(absl::StatusCode::kAlreadyExists),
                                            static_cast<int>(absl::StatusCode::kInvalidArgument),
                                            static_cast<int>(absl::StatusCode::kResourceExhausted), 0}));
  Figures after = Take(*sm);
  EXPECT_EQ(after.requests, before.requests + 2);
  EXPECT_EQ(after.pages_used, before.pages_used + 2);
  EXPECT_EQ(after.admissions, before.admissions + 2);
  EXPECT_EQ(after.rejections, before.rejections + 1);
  EXPECT_EQ(after.by_reason["quota"], before.by_reason["quota"] + 1);
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
}

TEST(SessionBatchTest, BadBatchesChangeNothing) {
  auto sm = MakeManager(4 * kMiB);
  const v1::SessionRef s = Open(*sm);
  std::vector<Item> too_many;
  for (int i = 0; i <= SessionManager::kMaxBatchItems; ++i) too_many.push_back({uint64_t(i) + 1, 1});
  EXPECT_TRUE(absl::IsInvalidArgument(sm->AdmitBatch(Batch(s, v1::BATCH_MODE_PER_ITEM, too_many)).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(sm->AdmitBatch(Batch(s, v1::BATCH_MODE_PER_ITEM, {})).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(sm->AdmitBatch(Batch(s, v1::BATCH_MODE_UNSPECIFIED, {{1, 1}})).status()));
  v1::SessionRef forged = s;
  forged.set_token("not-the-token");
  for (const v1::BatchMode mode : {v1::BATCH_MODE_PER_ITEM, v1::BATCH_MODE_ALL_OR_NOTHING}) {
    EXPECT_TRUE(absl::IsPermissionDenied(sm->AdmitBatch(Batch(forged, mode, {{1, 1}})).status()));
  }
  too_many.pop_back();  // exactly the cap is fine
  absl::StatusOr<v1::AdmitBatchResponse> at_cap = sm->AdmitBatch(Batch(s, v1::BATCH_MODE_PER_ITEM, too_many));
  ASSERT_TRUE(at_cap.ok()) << at_cap.status();
  EXPECT_EQ(at_cap->results_size(), SessionManager::kMaxBatchItems);
  EXPECT_EQ(at_cap->admitted(), 128u);  // the session's rows
  EXPECT_EQ(at_cap->results(128).error().code(), static_cast<int>(absl::StatusCode::kResourceExhausted));

  v1::ReleaseBatchRequest rel;
  *rel.mutable_session() = forged;
  rel.add_request_ids(1);
  EXPECT_TRUE(absl::IsPermissionDenied(sm->ReleaseBatch(rel).status()));
  *rel.mutable_session() = s;
  rel.clear_request_ids();
  EXPECT_TRUE(absl::IsInvalidArgument(sm->ReleaseBatch(rel).status()));
  for (int i = 0; i <= SessionManager::kMaxBatchItems; ++i) rel.add_request_ids(uint64_t(i) + 1);
  EXPECT_TRUE(absl::IsInvalidArgument(sm->ReleaseBatch(rel).status()));
  EXPECT_EQ(sm->Stats().requests(), 128u);
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
}

TEST(SessionBatchTest, ReleaseBatchReportsEachIdAndReleasesTheRest) {
  auto sm = MakeManager(4 * kMiB);
  const v1::SessionRef s = Open(*sm);
  const v1::SessionRef other = Open(*sm);
  ASSERT_TRUE(sm->AdmitBatch(Batch(s, v1::BATCH_MODE_ALL_OR_NOTHING, {{1, 1}, {2, 300}, {3, 1}})).ok());
  ASSERT_TRUE(Admit(*sm, other, 9, 1).ok());
  v1::ReleaseBatchRequest rel;
  *rel.mutable_session() = s;
  for (uint64_t id : {1, 9, 2, 1, 3}) rel.add_request_ids(id);  // 9 is the other session's
  absl::StatusOr<v1::ReleaseBatchResponse> resp = sm->ReleaseBatch(rel);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->released(), 3u);
  std::vector<int> codes;
  for (const auto& r : resp->results()) codes.push_back(r.code());
  EXPECT_EQ(codes, (std::vector<int>{0, static_cast<int>(absl::StatusCode::kNotFound), 0,
                                     static_cast<int>(absl::StatusCode::kInvalidArgument), 0}));
  const v1::StatsResponse st = sm->Stats();
  EXPECT_EQ(st.requests(), 1u);  // the other session's, untouched
  EXPECT_EQ(st.host_pool().pages_used(), 1u);
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
}

// evict_lru_idle: an all-or-nothing batch that does not fit evicts nothing; a per-item one evicts
// the tenant's older requests, never one this batch admitted.
TEST(SessionBatchTest, EvictionIsPerItemOnlyAndSparesTheBatch) {
  auto sm = MakeManager(kMiB, {}, /*evict=*/true);  // 256 pages
  const v1::SessionRef s = Open(*sm);
  ASSERT_TRUE(Admit(*sm, s, 100, 128 * kPageTokens).ok());
  ASSERT_TRUE(Admit(*sm, s, 101, 128 * kPageTokens).ok());  // the pool is full
  Figures before = Take(*sm);
  absl::StatusOr<v1::AdmitBatchResponse> resp = sm->AdmitBatch(Batch(s, v1::BATCH_MODE_ALL_OR_NOTHING, {{1, 1}}));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->failed_item(), 1u);
  EXPECT_EQ(resp->results(0).error().code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  Figures after = Take(*sm);
  EXPECT_EQ(after.evictions, before.evictions);
  EXPECT_EQ(after.requests, 2u);
  EXPECT_EQ(after.by_reason["pool_full"], before.by_reason["pool_full"] + 1);

  // Item 1 evicts 100 (the least recently used), item 2 then 101; item 3 could only be admitted
  // by evicting item 1 or 2 of this batch, so it fails.
  resp = sm->AdmitBatch(
      Batch(s, v1::BATCH_MODE_PER_ITEM, {{1, 128 * kPageTokens}, {2, 128 * kPageTokens}, {3, kPageTokens}}));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(Codes(*resp), (std::vector<int>{0, 0, static_cast<int>(absl::StatusCode::kResourceExhausted)}));
  EXPECT_EQ(resp->admitted(), 2u);
  after = Take(*sm);
  EXPECT_EQ(after.evictions, before.evictions + 2);
  EXPECT_EQ(after.requests, 2u);
  EXPECT_EQ(after.pages_used, 256u);
  auto listed = sm->ListRequests(v1::ListRequestsRequest());
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->requests_size(), 2);
  EXPECT_EQ(listed->requests(0).request_id(), 1u);
  EXPECT_EQ(listed->requests(1).request_id(), 2u);
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
}

// AdmitItem.lease_seconds (and begin_import with it) are checked as Admit checks them: a lease
// above durability.max_lease_seconds or on an import is INVALID_ARGUMENT, any lease with
// durability off FAILED_PRECONDITION; an item within bounds is durable from admission.
TEST(SessionBatchTest, LeaseItemsAreCheckedAsAdmitChecksThem) {
  auto sm = MakeManager(4 * kMiB);  // durability.max_lease_seconds 3600 (the default)
  const v1::SessionRef s = Open(*sm);
  v1::AdmitBatchRequest req = Batch(s, v1::BATCH_MODE_PER_ITEM, {{1, 16}, {2, 16}, {3, 16}, {4, 16}});
  req.mutable_items(0)->set_lease_seconds(30);
  req.mutable_items(1)->set_lease_seconds(3601);
  req.mutable_items(2)->set_lease_seconds(30);
  req.mutable_items(2)->set_begin_import(true);
  absl::StatusOr<v1::AdmitBatchResponse> r = sm->AdmitBatch(req);
  ASSERT_TRUE(r.ok()) << r.status();
  const int invalid = static_cast<int>(absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Codes(*r), (std::vector<int>{0, invalid, invalid, 0}));
  EXPECT_EQ(sm->Stats().durable_requests(), 1u);
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();

  SessionManager::Options off;
  off.max_lease_seconds = 0;
  const std::unique_ptr<SessionManager> no_leases = session_test::MakeManager(4 * kMiB, off);
  ASSERT_NE(no_leases, nullptr);
  const v1::SessionRef t = Open(*no_leases);
  v1::AdmitBatchRequest one = Batch(t, v1::BATCH_MODE_ALL_OR_NOTHING, {{1, 16}, {2, 16}});
  one.mutable_items(1)->set_lease_seconds(30);
  absl::StatusOr<v1::AdmitBatchResponse> refused = no_leases->AdmitBatch(one);
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(Codes(*refused), (std::vector<int>{kAborted, static_cast<int>(absl::StatusCode::kFailedPrecondition)}));
  EXPECT_EQ(no_leases->Stats().requests(), 0u);
}

// Issue 41, item 2: no slab is made from the OS under the daemon's locks. The pool keeps no
// reserve, so every allocation below needs slabs made on demand: each call has them made with no
// lock held and takes them under its locks (HostPoolStats.slabs_made_inline counts those made
// under the locks instead, as every one was before). A batch has the slabs of all its items made
// at once, as far as its tenant's quota goes.
TEST(SessionBatchTest, EveryNewSlabIsMadeOutsideTheLocks) {
  auto sm = MakeManager(64 * kMiB);
  session_test::HostSession host;
  host.layers = 4;
  const v1::SessionRef a = session_test::OpenHost(*sm, host, 1000);
  const v1::SessionRef b = session_test::OpenHost(*sm, host, 1001);
  // A plain admission (the hot path), and a shared prefix's child (the exclusive one).
  ASSERT_TRUE(Admit(*sm, a, 1, 3 * kPageTokens).ok());
  v1::AdmitRequest child = AdmitOf(a, 2, 40 * kPageTokens);
  child.set_parent_request_id(1);
  child.set_prefix_tokens(2 * kPageTokens);
  absl::StatusOr<v1::AdmitResponse> admitted = sm->Admit(child);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  // Extend: every layer's new pages.
  v1::ExtendRequest ext;
  *ext.mutable_session() = a;
  ext.set_request_id(1);
  ext.set_token_budget(300 * kPageTokens);
  absl::StatusOr<v1::ExtendResponse> extended = sm->Extend(ext);
  ASSERT_TRUE(extended.ok()) << extended.status();
  // Batches, in both modes.
  absl::StatusOr<v1::AdmitBatchResponse> all = sm->AdmitBatch(
      Batch(b, v1::BATCH_MODE_ALL_OR_NOTHING, {{10, 30 * kPageTokens}, {11, 70 * kPageTokens}, {12, 5 * kPageTokens}}));
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->admitted(), 3u);
  absl::StatusOr<v1::AdmitBatchResponse> each = sm->AdmitBatch(
      Batch(b, v1::BATCH_MODE_PER_ITEM, {{20, 100 * kPageTokens}, {21, 300 * kPageTokens}, {22, kPageTokens}}));
  ASSERT_TRUE(each.ok()) << each.status();
  EXPECT_EQ(each->admitted(), 3u);
  const v1::StatsResponse stats = sm->Stats();
  const v1::HostPoolStats& hp = stats.host_pool();
  EXPECT_GE(hp.slabs(), 6u) << "the calls above needed slabs made";
  EXPECT_EQ(hp.slabs_made_inline(), 0u);
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
}

// A tenant at its quota has nothing made for it: a batch that wants more than its quota lets it
// hold has only its failing item's slab made, and an Extend the quota refuses none at all.
TEST(SessionBatchTest, NoSlabIsMadeForWhatTheQuotaRefuses) {
  SessionManager::QuotaOptions q;
  q.pages = 20;
  auto sm = MakeManager(64 * kMiB, q);
  const v1::SessionRef s = Open(*sm);
  ASSERT_TRUE(Admit(*sm, s, 1, kPageTokens).ok());
  const uint64_t slabs_before = sm->Stats().host_pool().slabs();
  v1::ExtendRequest ext;
  *ext.mutable_session() = s;
  ext.set_request_id(1);
  ext.set_token_budget(30 * kPageTokens);
  EXPECT_TRUE(absl::IsResourceExhausted(sm->Extend(ext).status()));
  EXPECT_EQ(sm->Stats().host_pool().slabs(), slabs_before) << "a slab made for an extend the quota refused";
  // Items of 8 pages each: the first fits (9 of 20), the batch of three does not (25).
  absl::StatusOr<v1::AdmitBatchResponse> each = sm->AdmitBatch(
      Batch(s, v1::BATCH_MODE_PER_ITEM, {{10, 8 * kPageTokens}, {11, 8 * kPageTokens}, {12, 8 * kPageTokens}}));
  ASSERT_TRUE(each.ok()) << each.status();
  EXPECT_EQ(each->admitted(), 2u);
  const v1::StatsResponse stats = sm->Stats();
  const v1::HostPoolStats& hp = stats.host_pool();
  EXPECT_EQ(hp.pages_used(), 17u);
  EXPECT_LE(hp.pages_used() + hp.pages_free(), 20u + 1) << "slabs made past the quota";
  EXPECT_EQ(hp.slabs_made_inline(), 0u);
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
}

}  // namespace session_batch_test
}  // namespace hisparse
