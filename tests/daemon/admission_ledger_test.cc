// AdmissionLedger alone: quotas (bytes and pages), rows, the eviction order and its ties, and "evict only
// when it can admit", on a fake clock. The invariants are checked after every step.
#include "hisparse/daemon/admission_ledger.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hisparse {
namespace admission_ledger_test {

using ::testing::HasSubstr;
using Key = AdmissionLedger::RequestKey;

constexpr uint64_t kPage = 4096;

class AdmissionLedgerTest : public ::testing::Test {
 protected:
  explicit AdmissionLedgerTest(AdmissionLedger::Quotas q = {}) : ledger_(q, kPage, [this] { return now_; }) {}
  // Every step is followed by the full invariant check.
  void Check() { ASSERT_TRUE(ledger_.CheckInvariants().ok()) << ledger_.CheckInvariants(); }
  void Tick() { now_ += absl::Seconds(1); }
  // Admits `rid` in the session's lowest free row holding `pages`.
  void AdmitIn(uint64_t sid, uint64_t rid, uint64_t pages = 1) {
    uint32_t row = 0;
    ASSERT_EQ(ledger_.FreeRow(sid, &row), std::nullopt);
    ledger_.Admit(sid, rid, row, pages);
    Check();
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  AdmissionLedger ledger_;
};

TEST_F(AdmissionLedgerTest, RowsAreLowestFreeAndRefusedWhenFull) {
  ledger_.AddSession(1, 100, 2, 0);
  Check();
  AdmitIn(1, 10);
  AdmitIn(1, 11);
  uint32_t row = 99;
  std::optional<Refusal> full = ledger_.FreeRow(1, &row);
  ASSERT_TRUE(full.has_value());
  EXPECT_EQ(full->reason, RejectReason::kRowsFull);
  EXPECT_TRUE(absl::IsResourceExhausted(full->status));
  EXPECT_THAT(full->status.message(), HasSubstr("all 2 request rows"));
  ledger_.Release(1, 10);
  Check();
  ASSERT_EQ(ledger_.FreeRow(1, &row), std::nullopt);
  EXPECT_EQ(row, 0u);
  EXPECT_EQ(ledger_.RowOf(1, 11), 1u);
}

// Rows past the first 64-row word, and a last word only partly rows: the lowest free row is found
// in any word, a bit past the end is never a row, and a full session is refused.
TEST_F(AdmissionLedgerTest, RowsPastTheFirstWordAreFoundAndAFullSessionIsRefused) {
  for (const uint32_t rows : {1u, 63u, 64u, 65u, 200u}) {
    const uint64_t sid = 10 + rows;
    ledger_.AddSession(sid, 100, rows, 0);
    for (uint32_t i = 0; i < rows; ++i) AdmitIn(sid, 1000 + i);
    for (uint32_t i = 0; i < rows; ++i) EXPECT_EQ(ledger_.RowOf(sid, 1000 + i), i);
    uint32_t row = 0;
    std::optional<Refusal> full = ledger_.FreeRow(sid, &row);
    ASSERT_TRUE(full.has_value()) << rows << " rows, all used: row " << row << " offered";
    EXPECT_EQ(full->reason, RejectReason::kRowsFull);
    // Free two rows, the higher first: the lower is offered, then the higher.
    const uint32_t low = rows / 2, high = rows - 1;
    ledger_.Release(sid, 1000 + high);
    if (low != high) ledger_.Release(sid, 1000 + low);
    Check();
    ASSERT_EQ(ledger_.FreeRow(sid, &row), std::nullopt);
    EXPECT_EQ(row, low) << rows << " rows";
    AdmitIn(sid, 5000);
    if (low != high) {
      ASSERT_EQ(ledger_.FreeRow(sid, &row), std::nullopt);
      EXPECT_EQ(row, high) << rows << " rows";
    }
    ledger_.RemoveSession(sid);
    Check();
  }
}

TEST_F(AdmissionLedgerTest, PagesAndRequestsSumPerTenant) {
  ledger_.AddSession(1, 100, 8, 64);
  ledger_.AddSession(2, 100, 8, 32);
  ledger_.AddSession(3, 200, 8, 16);
  Check();
  AdmitIn(1, 1, 2);
  AdmitIn(2, 1, 1);
  AdmitIn(3, 1, 4);
  EXPECT_EQ(ledger_.Usage(100), (AdmissionLedger::TenantUsage{3, 96, 2, 2}));
  EXPECT_EQ(ledger_.Usage(200), (AdmissionLedger::TenantUsage{4, 16, 1, 1}));
  EXPECT_EQ(ledger_.used_pages(), 7u);
  EXPECT_EQ(ledger_.PagesOf(1), 2u);
  ledger_.SetPages(1, 1, 6);  // an Extend appended four
  Check();
  EXPECT_EQ(ledger_.Usage(100).pages, 7u);
  EXPECT_EQ(ledger_.PagesOf(1), 6u);
  ledger_.RemoveSession(1);
  Check();
  EXPECT_EQ(ledger_.Usage(100), (AdmissionLedger::TenantUsage{1, 32, 1, 1}));
  ledger_.RemoveSession(2);
  ledger_.RemoveSession(3);
  Check();
  EXPECT_EQ(ledger_.used_pages(), 0u);
  EXPECT_EQ(ledger_.Usage(100), AdmissionLedger::TenantUsage{});
}

TEST_F(AdmissionLedgerTest, QuotasRefuseWithTheirKey) {
  ledger_.SetQuotas({/*host_bytes=*/2 * kPage, /*arena_bytes=*/100, /*requests=*/2, /*sessions=*/2, /*pages=*/0});
  ASSERT_EQ(ledger_.CheckOpenSession(100, 60), std::nullopt);
  ledger_.AddSession(1, 100, 8, 60);
  Check();
  std::optional<Refusal> arena = ledger_.CheckOpenSession(100, 41);
  ASSERT_TRUE(arena.has_value());
  EXPECT_EQ(arena->reason, RejectReason::kQuota);
  EXPECT_THAT(arena->status.message(), HasSubstr("quotas.arena_bytes"));
  ASSERT_EQ(ledger_.CheckOpenSession(100, 40), std::nullopt);
  ledger_.AddSession(2, 100, 8, 40);
  std::optional<Refusal> sessions = ledger_.CheckOpenSession(100, 0);
  ASSERT_TRUE(sessions.has_value());
  EXPECT_THAT(sessions->status.message(), HasSubstr("quotas.sessions"));
  EXPECT_EQ(ledger_.CheckOpenSession(200, 100), std::nullopt);  // another tenant is untouched

  // Host bytes, charged in whole pages: exactly the quota is fine, one page over is not.
  EXPECT_EQ(ledger_.CheckGrow(1, 2, 1), std::nullopt);
  AdmitIn(1, 1, 1);
  std::optional<Refusal> bytes = ledger_.CheckGrow(2, 2, 1);
  ASSERT_TRUE(bytes.has_value());
  EXPECT_EQ(bytes->reason, RejectReason::kQuota);
  EXPECT_THAT(bytes->status.message(), HasSubstr("quotas.host_bytes"));
  EXPECT_EQ(ledger_.CheckGrow(2, 1, 1), std::nullopt);
  AdmitIn(2, 1, 1);
  std::optional<Refusal> requests = ledger_.CheckGrow(1, 0, 1);
  ASSERT_TRUE(requests.has_value());
  EXPECT_THAT(requests->status.message(), HasSubstr("quotas.requests"));
  EXPECT_EQ(ledger_.CheckGrow(1, 0, 0), std::nullopt);  // an extend adds no request

  // Pages, on their own key.
  ledger_.SetQuotas({0, 0, 0, 0, /*pages=*/3});
  EXPECT_EQ(ledger_.CheckGrow(1, 1, 0), std::nullopt);
  std::optional<Refusal> pages = ledger_.CheckGrow(1, 2, 0);
  ASSERT_TRUE(pages.has_value());
  EXPECT_EQ(pages->reason, RejectReason::kQuota);
  EXPECT_THAT(pages->status.message(), HasSubstr("quotas.pages"));
}

TEST_F(AdmissionLedgerTest, VictimIsLeastRecentlyUsedOfTheTenantWithTiesBySessionThenRequest) {
  ledger_.AddSession(2, 100, 8, 0);
  ledger_.AddSession(1, 100, 8, 0);
  ledger_.AddSession(3, 200, 8, 0);
  AdmitIn(3, 1);  // the oldest, but another tenant's
  Tick();
  AdmitIn(2, 7);  // these three tie on time
  AdmitIn(2, 5);
  AdmitIn(1, 9);
  Tick();
  AdmitIn(1, 1);
  EXPECT_EQ(ledger_.PickVictim(2), (Key{1, 9}));
  EXPECT_EQ(ledger_.PickVictim(3), (Key{3, 1}));
  ledger_.Release(1, 9);
  Check();
  EXPECT_EQ(ledger_.PickVictim(1), (Key{2, 5}));
  // Extending makes it recent.
  Tick();
  ledger_.SetPages(2, 5, 2);  // holding more is not using
  Check();
  EXPECT_EQ(ledger_.PickVictim(1), (Key{2, 5}));
  ledger_.Touch(2, 5);
  EXPECT_EQ(ledger_.PickVictim(1), (Key{2, 7}));
  Tick();
  ledger_.Touch(2, 7);
  Check();
  EXPECT_EQ(ledger_.PickVictim(1), (Key{1, 1}));
  ledger_.RemoveSession(3);
  Check();
  EXPECT_EQ(ledger_.PickVictim(3), std::nullopt);
}

TEST_F(AdmissionLedgerTest, EvictsOnlyWhenThatCanAdmit) {
  ledger_.AddSession(1, 100, 8, 0);
  ledger_.AddSession(2, 100, 8, 0);
  ledger_.AddSession(3, 200, 8, 0);
  AdmitIn(1, 1, 2);
  AdmitIn(2, 1, 1);
  AdmitIn(3, 1, 4);
  // Tenant 100 holds 3 pages: with 5 available, evicting can find 8, never 9.
  EXPECT_TRUE(ledger_.EvictionCouldAdmit(1, 8, 5));
  EXPECT_FALSE(ledger_.EvictionCouldAdmit(1, 9, 5));
  // Another tenant's pages are never counted.
  EXPECT_TRUE(ledger_.EvictionCouldAdmit(3, 9, 5));
  EXPECT_FALSE(ledger_.EvictionCouldAdmit(3, 10, 5));
  EXPECT_FALSE(ledger_.EvictionCouldAdmit(7, 1, 100));  // no such session
}

TEST_F(AdmissionLedgerTest, InvariantCheckIsClean) {
  // Unknown ids are no-ops, and leave the ledger consistent.
  ledger_.Release(5, 5);
  ledger_.SetPages(5, 5, 1);
  ledger_.RemoveSession(5);
  ledger_.Admit(5, 1, 0, 1);
  Check();
  ledger_.AddSession(1, 100, 1, 0);
  AdmitIn(1, 1, 1);
  ledger_.Admit(1, 2, 0, 1);  // row 0 is taken: refused, nothing recorded
  Check();
  EXPECT_FALSE(ledger_.HasRequest(1, 2));
  EXPECT_EQ(ledger_.used_pages(), 1u);
}

// Durable requests: an ended session kept as an orphan still holds its tenant's requests and
// pages, but no session, arena bytes or rows; its requests are never victims; adoption moves them,
// parked, into a session of the tenant; the tenant is forgotten only once it holds nothing.
TEST_F(AdmissionLedgerTest, OrphansKeepRequestsAndPagesButNoSessionNorVictim) {
  ledger_.AddSession(1, 100, 2, 64);
  AdmitIn(1, 10, 3);
  AdmitIn(1, 11, 2);
  ledger_.Park(1, 11);
  Check();
  ledger_.OrphanSession(1);
  Check();
  EXPECT_TRUE(ledger_.IsOrphan(1));
  EXPECT_TRUE(ledger_.IsParked(1, 10));
  EXPECT_EQ(ledger_.Usage(100), (AdmissionLedger::TenantUsage{5, 0, 2, 0}));
  ledger_.AddSession(2, 100, 2, 32);
  Check();
  EXPECT_EQ(ledger_.PickVictim(2), std::nullopt);  // only the orphan's requests: none is a victim
  EXPECT_FALSE(ledger_.EvictionCouldAdmit(2, 1, 0));
  AdmitIn(2, 20, 1);
  EXPECT_EQ(ledger_.PickVictim(2), (Key{2, 20}));
  ledger_.AdoptOrphan(1, 2);
  Check();
  EXPECT_FALSE(ledger_.HasSession(1));
  EXPECT_TRUE(ledger_.IsParked(2, 10));
  EXPECT_TRUE(ledger_.IsParked(2, 11));
  EXPECT_EQ(ledger_.PagesOf(2), 6u);
  EXPECT_EQ(ledger_.Usage(100), (AdmissionLedger::TenantUsage{6, 32, 3, 1}));
  EXPECT_EQ(ledger_.PickVictim(2), (Key{2, 10}));  // parked before live, adopted ones included
  // An orphan emptied by its requests' release leaves the tenant when it held nothing else.
  ledger_.OrphanSession(2);
  Check();
  for (uint64_t rid : {10, 11, 20}) ledger_.Release(2, rid);
  ledger_.RemoveSession(2);
  Check();
  EXPECT_EQ(ledger_.Usage(100), AdmissionLedger::TenantUsage{});
}

}  // namespace admission_ledger_test
}  // namespace hisparse
