// DurableRequests alone: the lease bounds, the per-tenant cap on orphans (counted), an ended
// session's requests kept as an orphan (every one kOrphaned, in the ledger too), adoption's
// checks and what the figures say. Over a real AdmissionLedger on a fake clock.
#include "hisparse/daemon/durable_requests.h"

#include <cstdint>
#include <memory>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hisparse {
namespace durable_requests_test {

using ::testing::HasSubstr;

constexpr uint64_t kPage = 4096;
constexpr uint32_t kTenant = 100;

class DurableRequestsTest : public ::testing::Test {
 protected:
  DurableRequestsTest() : ledger_({}, kPage, [this] { return now_; }) {}

  // A live session `id` of `tenant` with `rows` rows, 4 layers of 16 records a page.
  std::unique_ptr<SessionEntry> Open(uint64_t id, uint32_t tenant = kTenant, uint32_t rows = 4) {
    auto s = std::make_unique<SessionEntry>();
    s->id = id;
    s->tenant_uid = tenant;
    s->engine_name = "engine";
    s->geometry.set_num_layers(4);
    s->geometry.set_record_bytes(256);
    s->records_per_page = 16;
    s->pages_per_entry = 8;
    s->requests = RequestTable::Open(&ledger_, id, tenant, rows, 0);
    return s;
  }
  void Admit(SessionEntry& s, uint64_t rid, uint32_t lease_seconds, uint32_t pages_per_layer = 1) {
    uint32_t row = 0;
    ASSERT_EQ(ledger_.FreeRow(s.id, &row), std::nullopt);
    RequestEntry r;
    r.id = rid;
    r.pages.assign(4, std::vector<PagePool::Page>(pages_per_layer));
    r.charged_pages = 4 * pages_per_layer;
    r.lease_end = DurableRequests::LeaseEnd(now_, lease_seconds);
    s.requests.Admit(std::move(r), row);
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  AdmissionLedger ledger_;
};

TEST_F(DurableRequestsTest, LeasesAreBoundedAndNeverAnImports) {
  DurableRequests d(/*max_lease_seconds=*/60, /*max_orphans_per_tenant=*/0);
  EXPECT_TRUE(d.CheckLease(0, /*importing=*/true).ok());
  EXPECT_TRUE(d.CheckLease(60, false).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(d.CheckLease(61, false)));
  EXPECT_TRUE(absl::IsInvalidArgument(d.CheckLease(1, /*importing=*/true)));
  d.SetMaxLeaseSeconds(0);
  absl::Status off = d.CheckLease(1, false);
  EXPECT_TRUE(absl::IsFailedPrecondition(off)) << off;
  EXPECT_THAT(off.message(), HasSubstr("durable requests are off"));
  EXPECT_EQ(DurableRequests::LeaseEnd(now_, 0), absl::InfinitePast());
  RequestEntry r;
  r.lease_end = DurableRequests::LeaseEnd(now_, 30);
  EXPECT_DOUBLE_EQ(DurableRequests::LeaseLeft(r, now_ + absl::Seconds(10)), 20.0);
  EXPECT_DOUBLE_EQ(DurableRequests::LeaseLeft(r, now_ + absl::Seconds(40)), 0.0);
  EXPECT_TRUE(DurableRequests::Durable(r, now_));
  EXPECT_FALSE(DurableRequests::Durable(r, now_ + absl::Seconds(30)));
}

TEST_F(DurableRequestsTest, KeepMakesAnOrphanOfEveryRequestAndAdoptionChecksTheAdopter) {
  DurableRequests d(3600, 0);
  std::unique_ptr<SessionEntry> dead = Open(1);
  Admit(*dead, 10, 60);
  Admit(*dead, 11, 60, 3);
  ASSERT_TRUE(dead->requests.Park(*dead->requests.Find(11)).ok());
  ASSERT_TRUE(d.Keep(*dead).ok());
  EXPECT_TRUE(dead->requests.empty());
  SessionEntry* orphan = d.Find(1);
  ASSERT_NE(orphan, nullptr);
  EXPECT_EQ(orphan->requests.Count(RequestState::kOrphaned), 2u);
  EXPECT_EQ(orphan->arena, nullptr);
  EXPECT_TRUE(orphan->imports_closed);
  EXPECT_TRUE(ledger_.IsOrphan(1));
  EXPECT_TRUE(orphan->requests.CheckInvariants().ok()) << orphan->requests.CheckInvariants();

  std::unique_ptr<SessionEntry> adopter = Open(2);
  EXPECT_TRUE(DurableRequests::CheckAdopt(*adopter, *orphan, /*draining=*/false).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(DurableRequests::CheckAdopt(*adopter, *orphan, /*draining=*/true)));
  Admit(*adopter, 11, 0);
  EXPECT_TRUE(absl::IsAlreadyExists(DurableRequests::CheckAdopt(*adopter, *orphan, false)));
  std::unique_ptr<SessionEntry> small = Open(3);
  small->pages_per_entry = 2;  // request 11 holds 3 pages a layer
  EXPECT_THAT(DurableRequests::CheckAdopt(*small, *orphan, false).message(), HasSubstr("page tables hold 2"));
  std::unique_ptr<SessionEntry> other = Open(4);
  other->geometry.set_num_layers(8);
  EXPECT_THAT(DurableRequests::CheckAdopt(*other, *orphan, false).message(), HasSubstr("geometry differs"));

  v1::StatsResponse stats;
  d.FillStats(std::nullopt, ledger_, &stats);
  EXPECT_EQ(stats.orphaned_requests(), 2u);
  EXPECT_EQ(stats.orphaned_bytes(), 16 * kPage);
  std::unique_ptr<SessionEntry> taken = d.Take(1);
  ASSERT_NE(taken, nullptr);
  EXPECT_FALSE(d.contains(1));
  EXPECT_EQ(d.Take(1), nullptr);
}

TEST_F(DurableRequestsTest, TheCapPerTenantIsCountedAndOthersAreNotHeldToIt) {
  DurableRequests d(3600, /*max_orphans_per_tenant=*/1);
  EXPECT_TRUE(d.MayKeep(kTenant).ok());
  std::unique_ptr<SessionEntry> dead = Open(1);
  Admit(*dead, 10, 60);
  ASSERT_TRUE(d.Keep(*dead).ok());
  absl::Status refused = d.MayKeep(kTenant);
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("holds 1 orphans (durability.max_orphans_per_tenant 1)"));
  EXPECT_EQ(d.orphans_refused(), 1u);
  EXPECT_TRUE(d.MayKeep(kTenant + 1).ok());  // another tenant's count is its own
  d.SetMaxOrphansPerTenant(0);
  EXPECT_TRUE(d.MayKeep(kTenant).ok());
  EXPECT_EQ(d.orphans_refused(), 1u);
  d.CountExpiries(3);
  v1::StatsResponse stats;
  d.FillStats(kTenant + 1, ledger_, &stats);  // a tenant's view: none of its own
  EXPECT_EQ(stats.orphaned_requests(), 0u);
  EXPECT_EQ(stats.lease_expiries(), 3u);
  EXPECT_EQ(stats.orphans_refused(), 1u);
}

}  // namespace durable_requests_test
}  // namespace hisparse
