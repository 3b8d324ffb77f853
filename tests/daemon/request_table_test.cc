// RequestTable alone: the state machine of request_table.h over a real AdmissionLedger (pure, on
// a fake clock). Every transition moves the ledger's rows and parked flags with the state; a
// transition from the wrong state is refused and changes nothing. The invariants (table and
// ledger) are checked after every step.
#include "hisparse/daemon/request_table.h"

#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hisparse {
namespace request_table_test {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

constexpr uint64_t kPage = 4096;
constexpr uint32_t kTenant = 100;

class RequestTableTest : public ::testing::Test {
 protected:
  RequestTableTest() : ledger_({}, kPage, [this] { return now_; }) {}

  void Check(const RequestTable& t) {
    ASSERT_TRUE(t.CheckInvariants().ok()) << t.CheckInvariants();
    ASSERT_TRUE(ledger_.CheckInvariants().ok()) << ledger_.CheckInvariants();
  }
  // Admits `id` into `t`'s lowest free row, charged `pages`.
  RequestEntry& AdmitIn(RequestTable& t, uint64_t id, uint64_t pages = 1) {
    uint32_t row = 0;
    EXPECT_EQ(ledger_.FreeRow(t.session_id(), &row), std::nullopt);
    RequestEntry r;
    r.id = id;
    r.charged_pages = pages;
    return t.Admit(std::move(r), row);
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  AdmissionLedger ledger_;
};

TEST_F(RequestTableTest, AdmitIsLiveInTheLedgersRow) {
  RequestTable t = RequestTable::Open(&ledger_, 1, kTenant, 4, 0);
  EXPECT_TRUE(ledger_.HasSession(1));
  const RequestEntry& a = AdmitIn(t, 10, 3);
  EXPECT_EQ(a.state(), RequestState::kLive);
  EXPECT_EQ(a.row(), 0u);
  const RequestEntry& b = AdmitIn(t, 11, 2);  // `a` may have moved: entries are the map's
  EXPECT_EQ(b.row(), 1u);
  EXPECT_EQ(t.Find(10)->row(), 0u);
  EXPECT_EQ(ledger_.RowOf(1, 11), 1u);
  EXPECT_EQ(ledger_.PagesOf(1), 5u);
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(t.Count(RequestState::kLive), 2u);
  Check(t);
}

TEST_F(RequestTableTest, ParkFreesTheRowAndResumeTakesAnother) {
  RequestTable t = RequestTable::Open(&ledger_, 1, kTenant, 2, 0);
  AdmitIn(t, 10);
  AdmitIn(t, 11);
  RequestEntry& a = *t.Find(10);
  ASSERT_TRUE(t.Park(a).ok());
  EXPECT_EQ(a.state(), RequestState::kParked);
  EXPECT_TRUE(a.parked());
  EXPECT_TRUE(ledger_.IsParked(1, 10));
  EXPECT_EQ(ledger_.RowOf(1, 10), std::nullopt);
  Check(t);
  // Its row is free for another: a third request takes row 0.
  EXPECT_EQ(AdmitIn(t, 12).row(), 0u);
  Check(t);
  uint32_t row = 0;
  EXPECT_NE(ledger_.FreeRow(1, &row), std::nullopt);  // both rows held
  t.Erase(11);
  ASSERT_EQ(ledger_.FreeRow(1, &row), std::nullopt);
  ASSERT_TRUE(t.Resume(*t.Find(10), row).ok());
  EXPECT_EQ(t.Find(10)->state(), RequestState::kLive);
  EXPECT_EQ(t.Find(10)->row(), 1u);
  EXPECT_EQ(ledger_.RowOf(1, 10), 1u);
  Check(t);
}

TEST_F(RequestTableTest, WrongFromStateIsRefusedAndChangesNothing) {
  RequestTable t = RequestTable::Open(&ledger_, 1, kTenant, 2, 0);
  RequestEntry& a = AdmitIn(t, 10);
  absl::Status st = t.Resume(a, 1);  // live: not resumable
  EXPECT_TRUE(absl::IsInternal(st)) << st;
  EXPECT_THAT(st.message(), HasSubstr("is live: no resume"));
  EXPECT_TRUE(absl::IsInternal(t.CommitImport(a)));  // not importing
  EXPECT_EQ(a.state(), RequestState::kLive);
  EXPECT_EQ(a.row(), 0u);
  Check(t);
  ASSERT_TRUE(t.BeginImport(a, "grant").ok());
  EXPECT_TRUE(a.importing());
  EXPECT_EQ(a.import_grant(), "grant");
  EXPECT_TRUE(absl::IsInternal(t.Park(a)));  // importing: never parked
  EXPECT_TRUE(absl::IsInternal(t.BeginImport(a, "another")));
  EXPECT_EQ(a.import_grant(), "grant");
  EXPECT_FALSE(ledger_.IsParked(1, 10));
  Check(t);
  // An importing request holds its row, and cannot be orphaned.
  EXPECT_TRUE(absl::IsInternal(t.Orphan()));
  EXPECT_FALSE(ledger_.IsOrphan(1));
  Check(t);
}

TEST_F(RequestTableTest, ImportCommitMakesItLiveAndUsedNow) {
  RequestTable t = RequestTable::Open(&ledger_, 1, kTenant, 2, 0);
  AdmitIn(t, 10);
  AdmitIn(t, 11);
  RequestEntry& a = *t.Find(10);
  ASSERT_TRUE(t.BeginImport(a, "g").ok());
  EXPECT_EQ(t.Count(RequestState::kImporting), 1u);
  Check(t);
  now_ += absl::Seconds(5);
  ASSERT_TRUE(t.CommitImport(a).ok());
  EXPECT_EQ(a.state(), RequestState::kLive);
  EXPECT_TRUE(a.import_grant().empty());
  // Used now: the LRU victim is 11 (admitted at 1000), not the committed 10.
  std::optional<AdmissionLedger::RequestKey> victim = ledger_.PickVictim(1);
  ASSERT_TRUE(victim.has_value());
  EXPECT_EQ(victim->request_id, 11u);
  Check(t);
}

TEST_F(RequestTableTest, OrphanThenAdoptMovesEveryRequestParked) {
  RequestTable dead = RequestTable::Open(&ledger_, 1, kTenant, 2, 64);
  AdmitIn(dead, 10, 2);
  ASSERT_TRUE(dead.Park(AdmitIn(dead, 11, 3)).ok());
  RequestTable orphan = std::move(dead);
  EXPECT_TRUE(dead.empty());  // NOLINT(bugprone-use-after-move): a moved-from table is empty
  ASSERT_TRUE(orphan.Orphan().ok());
  EXPECT_EQ(orphan.Count(RequestState::kOrphaned), 2u);
  EXPECT_TRUE(ledger_.IsOrphan(1));
  EXPECT_EQ(ledger_.Usage(kTenant).sessions, 0u);
  EXPECT_EQ(ledger_.Usage(kTenant).requests, 2u);
  Check(orphan);

  RequestTable adopter = RequestTable::Open(&ledger_, 2, kTenant, 4, 64);
  ASSERT_TRUE(adopter.AdoptFrom(orphan).ok());
  EXPECT_TRUE(orphan.empty());
  EXPECT_FALSE(ledger_.HasSession(1));
  EXPECT_EQ(adopter.Count(RequestState::kParked), 2u);
  EXPECT_THAT(adopter.Ids(), UnorderedElementsAre(10u, 11u));
  EXPECT_TRUE(ledger_.IsParked(2, 10));
  EXPECT_EQ(ledger_.PagesOf(2), 5u);
  Check(adopter);
  Check(orphan);
}

TEST_F(RequestTableTest, AdoptRefusesACollidingIdAndMovesNothing) {
  RequestTable orphan = RequestTable::Open(&ledger_, 1, kTenant, 2, 0);
  AdmitIn(orphan, 10);
  ASSERT_TRUE(orphan.Orphan().ok());
  RequestTable adopter = RequestTable::Open(&ledger_, 2, kTenant, 2, 0);
  AdmitIn(adopter, 10);
  EXPECT_TRUE(absl::IsInternal(adopter.AdoptFrom(orphan)));
  EXPECT_EQ(orphan.size(), 1u);
  EXPECT_EQ(adopter.size(), 1u);
  EXPECT_TRUE(ledger_.IsOrphan(1));
  Check(orphan);
  Check(adopter);
  // Nor may a live session's table be adopted.
  RequestTable other = RequestTable::Open(&ledger_, 3, kTenant, 2, 0);
  EXPECT_TRUE(absl::IsInternal(other.AdoptFrom(adopter)));
  EXPECT_EQ(adopter.size(), 1u);
}

TEST_F(RequestTableTest, EraseAndCloseLeaveTheLedgerEmpty) {
  RequestTable t = RequestTable::Open(&ledger_, 1, kTenant, 2, 128);
  AdmitIn(t, 10, 4);
  AdmitIn(t, 11, 4);
  t.Erase(10);
  EXPECT_FALSE(t.contains(10));
  EXPECT_EQ(ledger_.used_pages(), 4u);
  Check(t);
  t.Close();
  EXPECT_TRUE(t.empty());
  EXPECT_FALSE(ledger_.HasSession(1));
  EXPECT_EQ(ledger_.used_pages(), 0u);
  EXPECT_EQ(ledger_.Usage(kTenant), AdmissionLedger::TenantUsage{});
  Check(t);
}

TEST_F(RequestTableTest, StateNames) {
  EXPECT_STREQ(RequestStateName(RequestState::kLive), "live");
  EXPECT_STREQ(RequestStateName(RequestState::kParked), "parked");
  EXPECT_STREQ(RequestStateName(RequestState::kImporting), "importing");
  EXPECT_STREQ(RequestStateName(RequestState::kOrphaned), "orphaned");
  EXPECT_TRUE(HoldsRow(RequestState::kLive));
  EXPECT_TRUE(HoldsRow(RequestState::kImporting));
  EXPECT_FALSE(HoldsRow(RequestState::kParked));
  EXPECT_FALSE(HoldsRow(RequestState::kOrphaned));
}

// ---- Reserve, then commit, over a fake PageSource ----

// `capacity` pages; each allocation is numbered on from the last, under its owner as the slab.
// Counts what each owner holds, so a test sees exactly what a reservation took and gave back.
class FakePages final : public PageSource {
 public:
  explicit FakePages(uint64_t capacity) : free_(capacity) {}
  absl::StatusOr<std::vector<PagePool::Page>> Allocate(uint64_t owner, uint32_t count,
                                                       const PagePool::Page* /*after*/) override {
    ++allocations_;
    if (!fail_with_.ok()) return fail_with_;
    if (count > free_) return absl::ResourceExhaustedError("the fake pool is full");
    std::vector<PagePool::Page> out;
    for (uint32_t i = 0; i < count; ++i) out.push_back(PagePool::Page{owner, next_++});
    free_ -= count;
    held_[owner] += count;
    return out;
  }
  absl::Status ReleaseAll(uint64_t owner, const std::vector<PagePool::Page>& pages) override {
    for (const PagePool::Page& p : pages) {
      if (p.slab != owner || held_[owner] == 0) return absl::InternalError("not the owner's page");
      --held_[owner];
      ++free_;
    }
    return absl::OkStatus();
  }
  uint64_t Held(uint64_t owner) { return held_[owner]; }

  absl::Status fail_with_;
  int allocations_ = 0;

 private:
  uint64_t free_;
  uint32_t next_ = 0;
  std::map<uint64_t, uint64_t> held_;
};

TEST_F(RequestTableTest, ReserveHoldsPagesAndARowUntilCommitted) {
  FakePages pool(16);
  RequestTable t = RequestTable::Open(&ledger_, 1, kTenant, 2, 0);
  AdmitIn(t, 10);  // row 0
  ReserveOutcome got = Reserve(ledger_, pool, ReserveSpec{1, {1}, 1, 4});
  ASSERT_TRUE(got.reservation.has_value()) << got.status;
  EXPECT_EQ(got.reservation->rows(), std::vector<uint32_t>{1});
  EXPECT_EQ(got.reservation->pages().size(), 4u);
  EXPECT_EQ(pool.Held(1), 4u);
  // Nothing is recorded before the commit.
  EXPECT_EQ(ledger_.used_pages(), 1u);
  EXPECT_EQ(ledger_.Usage(kTenant).requests, 1u);
  RequestEntry r;
  r.id = 11;
  r.pages = {got.reservation->TakePages()};
  r.charged_pages = 4;
  t.Admit(std::move(r), got.reservation->rows()[0]);
  got.reservation.reset();  // committed: the request holds the pages, the reservation none
  EXPECT_EQ(pool.Held(1), 4u);
  EXPECT_EQ(ledger_.RowOf(1, 11), 1u);
  EXPECT_EQ(ledger_.used_pages(), 5u);
  Check(t);
}

TEST_F(RequestTableTest, AReservationDroppedUncommittedGivesItsPagesBack) {
  FakePages pool(16);
  RequestTable t = RequestTable::Open(&ledger_, 1, kTenant, 2, 0);
  {
    ReserveOutcome got = Reserve(ledger_, pool, ReserveSpec{1, {1}, 1, 6});
    ASSERT_TRUE(got.reservation.has_value()) << got.status;
    EXPECT_EQ(pool.Held(1), 6u);
    Reservation moved = *std::move(got.reservation);  // one owner at a time
    got.reservation.reset();
    EXPECT_EQ(pool.Held(1), 6u);
  }
  EXPECT_EQ(pool.Held(1), 0u);
  EXPECT_TRUE(t.empty());
  Check(t);
}

TEST_F(RequestTableTest, ReserveRefusesInOrderAndTakesNothing) {
  FakePages pool(8);
  RequestTable t = RequestTable::Open(&ledger_, 1, kTenant, 1, 0);
  // The quota first: one request per tenant, held already.
  AdmitIn(t, 10);
  AdmissionLedger::Quotas one_request;
  one_request.requests = 1;
  ledger_.SetQuotas(one_request);
  ReserveOutcome quota = Reserve(ledger_, pool, ReserveSpec{1, {1}, 1, 2});
  EXPECT_FALSE(quota.reservation.has_value());
  EXPECT_EQ(quota.counted, RejectReason::kQuota);
  EXPECT_FALSE(quota.lacked_room);
  EXPECT_EQ(pool.allocations_, 0);
  // Then a free row: session 1's only row is held.
  ledger_.SetQuotas({});
  ReserveOutcome rows = Reserve(ledger_, pool, ReserveSpec{1, {1}, 1, 2});
  EXPECT_EQ(rows.counted, RejectReason::kRowsFull);
  EXPECT_EQ(rows.failed_row, 0);
  EXPECT_EQ(pool.allocations_, 0);
  // Then the pages: a full pool lacks room (the one refusal evicting can cure).
  t.Erase(10);
  ReserveOutcome full = Reserve(ledger_, pool, ReserveSpec{1, {1}, 1, 9});
  EXPECT_EQ(full.counted, RejectReason::kPoolFull);
  EXPECT_TRUE(full.lacked_room);
  EXPECT_TRUE(absl::IsResourceExhausted(full.status)) << full.status;
  ReserveOutcome huge = Reserve(ledger_, pool, ReserveSpec{1, {1}, 1, uint64_t{UINT32_MAX} + 1});
  EXPECT_EQ(huge.counted, RejectReason::kPoolFull);
  EXPECT_THAT(huge.status.message(), HasSubstr("exceeds any host pool"));
  // A pool's own error is no refusal: not counted, no room lacked.
  pool.fail_with_ = absl::InternalError("the fake pool broke");
  ReserveOutcome broke = Reserve(ledger_, pool, ReserveSpec{1, {1}, 1, 1});
  EXPECT_TRUE(absl::IsInternal(broke.status));
  EXPECT_EQ(broke.counted, std::nullopt);
  EXPECT_FALSE(broke.lacked_room);
  EXPECT_EQ(pool.Held(1), 0u);
  Check(t);
}

TEST_F(RequestTableTest, ReserveForEveryRankTakesARowInEachAndPagesOfTheOwner) {
  FakePages pool(64);
  constexpr uint64_t kGroupOwner = 99;
  RequestTable a = RequestTable::Open(&ledger_, 1, kTenant, 2, 0);
  RequestTable b = RequestTable::Open(&ledger_, 2, kTenant, 1, 0);
  RequestTable c = RequestTable::Open(&ledger_, 3, kTenant, 2, 0);
  AdmitIn(a, 10);  // a's row 0
  ReserveOutcome got = Reserve(ledger_, pool, ReserveSpec{1, {1, 2, 3}, kGroupOwner, 8});
  ASSERT_TRUE(got.reservation.has_value()) << got.status;
  EXPECT_EQ(got.reservation->rows(), (std::vector<uint32_t>{1, 0, 0}));
  EXPECT_EQ(pool.Held(kGroupOwner), 8u);
  EXPECT_EQ(pool.Held(1), 0u);
  got.reservation.reset();
  // A rank without a free row is named, and nothing is taken.
  AdmitIn(b, 20);
  ReserveOutcome refused = Reserve(ledger_, pool, ReserveSpec{1, {1, 2, 3}, kGroupOwner, 8});
  EXPECT_EQ(refused.failed_row, 1);
  EXPECT_EQ(refused.counted, RejectReason::kRowsFull);
  EXPECT_EQ(pool.Held(kGroupOwner), 0u);
  // No pages asked (a child inside its parent's): none allocated.
  const int before = pool.allocations_;
  ReserveOutcome none = Reserve(ledger_, pool, ReserveSpec{1, {1}, 1, 0});
  ASSERT_TRUE(none.reservation.has_value()) << none.status;
  EXPECT_TRUE(none.reservation->pages().empty());
  EXPECT_EQ(pool.allocations_, before);
  Check(a);
  Check(b);
  Check(c);
}

}  // namespace request_table_test
}  // namespace hisparse
