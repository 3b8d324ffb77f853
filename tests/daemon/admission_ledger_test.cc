// AdmissionLedger alone: quotas, rows, the eviction order and its ties, refusals, and "evict only
// when it can admit", on a fake clock. The invariants are checked after every step.
#include "hisparse/daemon/admission_ledger.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hisparse {
namespace {

using ::testing::HasSubstr;
using Hold = AdmissionLedger::Hold;
using Key = AdmissionLedger::RequestKey;
using SegmentView = AdmissionLedger::SegmentView;

constexpr uint64_t kSegment = 1 << 20;

class AdmissionLedgerTest : public ::testing::Test {
 protected:
  explicit AdmissionLedgerTest(AdmissionLedger::Quotas q = {}) : ledger_(q, kSegment, [this] { return now_; }) {}
  // Every step is followed by the full invariant check.
  void Check() { ASSERT_TRUE(ledger_.CheckInvariants().ok()) << ledger_.CheckInvariants(); }
  void Tick() { now_ += absl::Seconds(1); }
  // Admits `rid` in the session's lowest free row with one hold per entry of `segments`.
  void AdmitIn(uint64_t sid, uint64_t rid, const std::vector<uint32_t>& segments, uint64_t bytes = 4096) {
    uint32_t row = 0;
    ASSERT_EQ(ledger_.FreeRow(sid, &row), std::nullopt);
    std::vector<Hold> holds;
    for (uint32_t seg : segments) holds.push_back(Hold{seg, bytes});
    ledger_.Admit(sid, rid, row, holds);
    Check();
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  AdmissionLedger ledger_;
};

TEST_F(AdmissionLedgerTest, RowsAreLowestFreeAndRefusedWhenFull) {
  ledger_.AddSession(1, 100, 2, 0);
  Check();
  AdmitIn(1, 10, {0});
  AdmitIn(1, 11, {0});
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

TEST_F(AdmissionLedgerTest, HostBytesAndRequestsSumPerTenant) {
  ledger_.AddSession(1, 100, 8, 64);
  ledger_.AddSession(2, 100, 8, 32);
  ledger_.AddSession(3, 200, 8, 16);
  Check();
  AdmitIn(1, 1, {0, 0}, 512);
  AdmitIn(2, 1, {1}, 256);
  AdmitIn(3, 1, {2}, 1024);
  EXPECT_EQ(ledger_.Usage(100), (AdmissionLedger::TenantUsage{1280, 96, 2, 2}));
  EXPECT_EQ(ledger_.Usage(200), (AdmissionLedger::TenantUsage{1024, 16, 1, 1}));
  EXPECT_EQ(ledger_.used_bytes(), 2304u);
  EXPECT_EQ(ledger_.SegmentsHeld(100), 2u);
  ledger_.SetHolds(1, 1, {Hold{0, 512}, Hold{3, 2048}});
  Check();
  EXPECT_EQ(ledger_.Usage(100).host_bytes, 256u + 512 + 2048);
  EXPECT_EQ(ledger_.SegmentsHeld(100), 3u);
  ledger_.RemoveSession(1);
  Check();
  EXPECT_EQ(ledger_.Usage(100), (AdmissionLedger::TenantUsage{256, 32, 1, 1}));
  ledger_.RemoveSession(2);
  ledger_.RemoveSession(3);
  Check();
  EXPECT_EQ(ledger_.used_bytes(), 0u);
  EXPECT_EQ(ledger_.Usage(100), AdmissionLedger::TenantUsage{});
}

TEST_F(AdmissionLedgerTest, QuotasRefuseWithTheirKey) {
  ledger_.SetQuotas({/*host_bytes=*/8192, /*arena_bytes=*/100, /*requests=*/2, /*sessions=*/2, /*segments=*/0});
  EXPECT_EQ(ledger_.SegmentsPerTenant(), 1u);  // ceil(8192 / 1 MiB)
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

  // Host bytes: exactly the quota is fine, one byte over is not.
  EXPECT_EQ(ledger_.CheckGrow(1, 8192, 1), std::nullopt);
  AdmitIn(1, 1, {0}, 4096);
  std::optional<Refusal> bytes = ledger_.CheckGrow(2, 4097, 1);
  ASSERT_TRUE(bytes.has_value());
  EXPECT_EQ(bytes->reason, RejectReason::kQuota);
  EXPECT_THAT(bytes->status.message(), HasSubstr("quotas.host_bytes"));
  EXPECT_EQ(ledger_.CheckGrow(2, 4096, 1), std::nullopt);
  AdmitIn(2, 1, {1}, 256);
  std::optional<Refusal> requests = ledger_.CheckGrow(1, 0, 1);
  ASSERT_TRUE(requests.has_value());
  EXPECT_THAT(requests->status.message(), HasSubstr("quotas.requests"));
  EXPECT_EQ(ledger_.CheckGrow(1, 256, 0), std::nullopt);  // an extend adds no request
}

TEST_F(AdmissionLedgerTest, SegmentShareDecidesQuotaOrPoolFull) {
  ledger_.SetQuotas({0, 0, 0, 0, /*segments=*/2});
  ledger_.AddSession(1, 100, 8, 0);
  Refusal below = ledger_.RoomRefusal(1, 4096, 1, absl::ResourceExhaustedError("pool"));
  EXPECT_EQ(below.reason, RejectReason::kPoolFull);
  EXPECT_EQ(below.status.message(), "pool");
  Refusal at = ledger_.RoomRefusal(1, 4096, 2, absl::ResourceExhaustedError("pool"));
  EXPECT_EQ(at.reason, RejectReason::kQuota);
  EXPECT_THAT(at.status.message(), HasSubstr("quotas.segments"));
  ledger_.SetQuotas({});
  EXPECT_EQ(ledger_.SegmentsPerTenant(), UINT32_MAX);
}

TEST_F(AdmissionLedgerTest, VictimIsLeastRecentlyUsedOfTheTenantWithTiesBySessionThenRequest) {
  ledger_.AddSession(2, 100, 8, 0);
  ledger_.AddSession(1, 100, 8, 0);
  ledger_.AddSession(3, 200, 8, 0);
  AdmitIn(3, 1, {2});  // the oldest, but another tenant's
  Tick();
  AdmitIn(2, 7, {0});  // these three tie on time
  AdmitIn(2, 5, {0});
  AdmitIn(1, 9, {1});
  Tick();
  AdmitIn(1, 1, {1});
  EXPECT_EQ(ledger_.PickVictim(2), (Key{1, 9}));
  EXPECT_EQ(ledger_.PickVictim(3), (Key{3, 1}));
  ledger_.Release(1, 9);
  Check();
  EXPECT_EQ(ledger_.PickVictim(1), (Key{2, 5}));
  // Extending makes it recent; a moving request is never picked.
  Tick();
  ledger_.SetHolds(2, 5, {Hold{0, 8192}});  // holding more is not using
  Check();
  EXPECT_EQ(ledger_.PickVictim(1), (Key{2, 5}));
  ledger_.Touch(2, 5);
  EXPECT_EQ(ledger_.PickVictim(1), (Key{2, 7}));
  ledger_.SetMoving(2, 7, true);
  EXPECT_TRUE(ledger_.IsMoving(2, 7));
  EXPECT_EQ(ledger_.MovesIn(2), 1u);
  EXPECT_EQ(ledger_.PickVictim(1), (Key{1, 1}));
  ledger_.SetMoving(2, 7, false);
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
  ledger_.SetQuotas({0, 0, 0, 0, /*segments=*/2});
  ledger_.AddSession(1, 100, 8, 0);
  ledger_.AddSession(2, 100, 8, 0);
  ledger_.AddSession(3, 200, 8, 0);
  // Four segments of 16 KiB: 0 is session 1's (8 KiB held, 4 KiB free), 1 is session 2's,
  // 2 another tenant's, 3 free.
  AdmitIn(1, 1, {0, 0}, 4096);
  AdmitIn(2, 1, {1}, 4096);
  AdmitIn(3, 1, {2}, 16384);
  const uint64_t cap = 16384;
  std::vector<SegmentView> pool = {{1, cap, 4096}, {2, cap, cap - 4096}, {3, cap, 0}, {0, cap, cap}};
  // Session 1 with its tenant's requests gone: segment 0 has 12 KiB, 1 and 3 whole; share 2.
  EXPECT_TRUE(ledger_.EvictionCouldAdmit(1, 16384, 2, pool));
  EXPECT_FALSE(ledger_.EvictionCouldAdmit(1, 16384, 3, pool));  // only two segments of share
  // 8 KiB runs: 1 in segment 0, 2 each in 1 and 3; the share counts the roomiest two.
  EXPECT_TRUE(ledger_.EvictionCouldAdmit(1, 8192, 4, pool));
  EXPECT_FALSE(ledger_.EvictionCouldAdmit(1, 8192, 5, pool));
  EXPECT_FALSE(ledger_.EvictionCouldAdmit(1, 32768, 1, pool));  // no segment is that large
  // The other tenant's segment is never counted: it has only free segment 3 and its own.
  EXPECT_TRUE(ledger_.EvictionCouldAdmit(3, 16384, 2, pool));
  EXPECT_FALSE(ledger_.EvictionCouldAdmit(3, 16384, 3, pool));
  ledger_.SetQuotas({});
  EXPECT_TRUE(ledger_.EvictionCouldAdmit(1, 8192, 5, pool));
  EXPECT_FALSE(ledger_.EvictionCouldAdmit(1, 16384, 3, pool));  // segment 0 has 12 KiB at most
}

TEST_F(AdmissionLedgerTest, InvariantCheckIsClean) {
  // Unknown ids are no-ops, and leave the ledger consistent.
  ledger_.Release(5, 5);
  ledger_.SetHolds(5, 5, {Hold{0, 1}});
  ledger_.RemoveSession(5);
  ledger_.Admit(5, 1, 0, {Hold{0, 1}});
  Check();
  ledger_.AddSession(1, 100, 1, 0);
  AdmitIn(1, 1, {0});
  ledger_.Admit(1, 2, 0, {Hold{0, 1}});  // row 0 is taken: refused, nothing recorded
  Check();
  EXPECT_FALSE(ledger_.HasRequest(1, 2));
  EXPECT_EQ(ledger_.used_bytes(), 4096u);
}

}  // namespace
}  // namespace hisparse
