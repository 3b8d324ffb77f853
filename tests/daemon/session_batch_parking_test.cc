// SessionManager::ParkBatch / ResumeBatch (daemon/batches.cc): each item gets the
// code a single Park / Resume of it would (NOT_FOUND, FAILED_PRECONDITION, RESOURCE_EXHAUSTED) and
// INVALID_ARGUMENT for a repeated id; an all-or-nothing batch that fails leaves every request in
// the state and row it had (parks undone into their old rows, resumes parked again) and the
// ledger exact; bad batches (no ids, over 1024, no mode, a forged session) change nothing.
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "hisparse/daemon/session_manager.h"
#include "session_test_util.h"

namespace hisparse {
namespace session_batch_parking_test {

using session_test::AdmitOf;
using session_test::Codes;
using session_test::kMiB;

constexpr int kOk = 0;
constexpr int kAborted = static_cast<int>(absl::StatusCode::kAborted);
constexpr int kNotFound = static_cast<int>(absl::StatusCode::kNotFound);
constexpr int kPrecondition = static_cast<int>(absl::StatusCode::kFailedPrecondition);
constexpr int kExhausted = static_cast<int>(absl::StatusCode::kResourceExhausted);
constexpr int kInvalid = static_cast<int>(absl::StatusCode::kInvalidArgument);

class SessionBatchParkingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SessionManager::Options o;
    o.clock = session_test::TickingClock();
    sm_ = session_test::MakeManager(8 * kMiB, o);
    ASSERT_NE(sm_, nullptr);
    auto ref =
        session_test::OpenRef(*sm_, session_test::OpenMessage({"session-batch-parking-test", 1, 16, kRows}), 1000);
    ASSERT_TRUE(ref.ok()) << ref.status();
    ref_ = *ref;
  }

  // Admits ids 1..n; returns each one's row.
  std::map<uint64_t, uint32_t> AdmitN(uint64_t n) {
    std::map<uint64_t, uint32_t> rows;
    for (uint64_t id = 1; id <= n; ++id) {
      auto a = sm_->Admit(AdmitOf(ref_, id, 16));
      EXPECT_TRUE(a.ok()) << a.status();
      if (a.ok()) rows[id] = a->row();
    }
    return rows;
  }
  template <typename BatchRequest>
  BatchRequest Batch(v1::BatchMode mode, const std::vector<uint64_t>& ids) {
    BatchRequest req;
    *req.mutable_session() = ref_;
    req.set_mode(mode);
    for (uint64_t id : ids) req.add_request_ids(id);
    return req;
  }
  absl::StatusOr<v1::ParkBatchResponse> Park(v1::BatchMode mode, const std::vector<uint64_t>& ids) {
    return sm_->ParkBatch(Batch<v1::ParkBatchRequest>(mode, ids));
  }
  absl::StatusOr<v1::ResumeBatchResponse> Resume(v1::BatchMode mode, const std::vector<uint64_t>& ids) {
    return sm_->ResumeBatch(Batch<v1::ResumeBatchRequest>(mode, ids));
  }
  // Each request's state as the listing shows it: row, or -1 while parked.
  std::map<uint64_t, int64_t> State() {
    std::map<uint64_t, int64_t> out;
    auto listed = sm_->ListRequests(v1::ListRequestsRequest());
    EXPECT_TRUE(listed.ok()) << listed.status();
    if (!listed.ok()) return out;
    for (const auto& r : listed->requests()) {
      out[r.request_id()] = r.state() == v1::REQUEST_STATE_PARKED ? -1 : static_cast<int64_t>(r.row());
    }
    return out;
  }
  static constexpr uint32_t kRows = 4;
  std::unique_ptr<SessionManager> sm_;
  v1::SessionRef ref_;
};

TEST_F(SessionBatchParkingTest, PerItemGivesEachItemItsOwnCode) {
  const std::map<uint64_t, uint32_t> rows = AdmitN(3);
  ASSERT_TRUE(Park(v1::BATCH_MODE_PER_ITEM, {3}).ok());
  auto r = Park(v1::BATCH_MODE_PER_ITEM, {1, 99, 3, 1, 2});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Codes(*r), (std::vector<int>{kOk, kNotFound, kPrecondition, kInvalid, kOk}));
  EXPECT_EQ(r->parked(), 2u);
  EXPECT_EQ(r->failed_item(), 0u);
  EXPECT_EQ(r->results(0).parked().row(), rows.at(1));  // the row it gave back
  EXPECT_EQ(r->results(4).parked().row(), rows.at(2));
  EXPECT_EQ(State(), (std::map<uint64_t, int64_t>{{1, -1}, {2, -1}, {3, -1}}));
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
}

TEST_F(SessionBatchParkingTest, AllOrNothingParkFailureUnparksIntoTheOldRows) {
  AdmitN(3);
  ASSERT_TRUE(Park(v1::BATCH_MODE_PER_ITEM, {3}).ok());
  const std::map<uint64_t, int64_t> before = State();
  // Items 1 and 2 park, then 3 (parked already) fails the batch: 1 and 2 hold their rows again.
  auto r = Park(v1::BATCH_MODE_ALL_OR_NOTHING, {1, 2, 3, 4});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Codes(*r), (std::vector<int>{kAborted, kAborted, kPrecondition, kAborted}));
  EXPECT_EQ(r->failed_item(), 3u);
  EXPECT_EQ(r->parked(), 0u);
  EXPECT_EQ(State(), before);
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
  // A free row is still free: a new admission takes the parked request's old one, not 1's or 2's.
  v1::AdmitRequest req;
  *req.mutable_session() = ref_;
  req.set_request_id(10);
  req.set_token_budget(16);
  auto a = sm_->Admit(req);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_NE(a->row(), static_cast<uint32_t>(before.at(1)));
  EXPECT_NE(a->row(), static_cast<uint32_t>(before.at(2)));
  // A duplicate fails an all-or-nothing batch too, with nothing parked.
  auto dup = Park(v1::BATCH_MODE_ALL_OR_NOTHING, {1, 1});
  ASSERT_TRUE(dup.ok());
  EXPECT_EQ(Codes(*dup), (std::vector<int>{kAborted, kInvalid}));
  EXPECT_EQ(State().at(1), before.at(1));
  auto all = Park(v1::BATCH_MODE_ALL_OR_NOTHING, {1, 2});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(Codes(*all), (std::vector<int>{kOk, kOk}));
  EXPECT_EQ(all->parked(), 2u);
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
}

TEST_F(SessionBatchParkingTest, ResumeCodesAndRowsPerItem) {
  AdmitN(4);  // every row taken
  ASSERT_TRUE(Park(v1::BATCH_MODE_ALL_OR_NOTHING, {1, 2, 3}).ok());
  const uint64_t rejections = sm_->Stats().rejections();
  // Three rows free: 1 and 2 take one each, 4 is live, 9 unknown, 2 repeated, 3 takes the last.
  auto r = Resume(v1::BATCH_MODE_PER_ITEM, {1, 4, 9, 2, 2, 3});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Codes(*r), (std::vector<int>{kOk, kPrecondition, kNotFound, kOk, kInvalid, kOk}));
  EXPECT_EQ(r->resumed(), 3u);
  std::map<uint64_t, int64_t> state = State();
  EXPECT_EQ(r->results(0).resumed().row(), state.at(1));
  EXPECT_EQ(r->results(3).resumed().row(), state.at(2));
  EXPECT_EQ(r->results(5).resumed().capacity_tokens(), 16u);
  EXPECT_EQ(sm_->Stats().rejections(), rejections);
  // No free row: RESOURCE_EXHAUSTED, counted once, as a single Resume's.
  ASSERT_TRUE(Park(v1::BATCH_MODE_PER_ITEM, {1}).ok());
  v1::AdmitRequest req;
  *req.mutable_session() = ref_;
  req.set_request_id(5);
  req.set_token_budget(16);
  ASSERT_TRUE(sm_->Admit(req).ok());  // takes 1's row
  auto full = Resume(v1::BATCH_MODE_PER_ITEM, {1});
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(Codes(*full), (std::vector<int>{kExhausted}));
  EXPECT_EQ(sm_->Stats().rejections(), rejections + 1);
  EXPECT_EQ(State().at(1), -1);  // it stays parked
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
}

TEST_F(SessionBatchParkingTest, AllOrNothingResumeWithoutRowsParksEveryItemAgain) {
  AdmitN(4);
  ASSERT_TRUE(Park(v1::BATCH_MODE_ALL_OR_NOTHING, {1, 2, 3}).ok());
  v1::AdmitRequest req;
  *req.mutable_session() = ref_;
  req.set_request_id(5);
  req.set_token_budget(16);
  ASSERT_TRUE(sm_->Admit(req).ok());  // two rows free for three parked requests
  const std::map<uint64_t, int64_t> before = State();
  auto r = Resume(v1::BATCH_MODE_ALL_OR_NOTHING, {1, 2, 3});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Codes(*r), (std::vector<int>{kAborted, kAborted, kExhausted}));
  EXPECT_EQ(r->failed_item(), 3u);
  EXPECT_EQ(r->resumed(), 0u);
  EXPECT_EQ(State(), before);
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
  // Two of them fit, all or nothing.
  auto two = Resume(v1::BATCH_MODE_ALL_OR_NOTHING, {3, 1});
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(Codes(*two), (std::vector<int>{kOk, kOk}));
  EXPECT_NE(two->results(0).resumed().row(), two->results(1).resumed().row());
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
}

TEST_F(SessionBatchParkingTest, BadBatchesChangeNothing) {
  AdmitN(2);
  std::vector<uint64_t> too_many;
  for (int i = 0; i <= SessionManager::kMaxBatchItems; ++i) too_many.push_back(uint64_t(i) + 1);
  EXPECT_TRUE(absl::IsInvalidArgument(Park(v1::BATCH_MODE_PER_ITEM, too_many).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(Resume(v1::BATCH_MODE_PER_ITEM, too_many).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(Park(v1::BATCH_MODE_PER_ITEM, {}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(Resume(v1::BATCH_MODE_ALL_OR_NOTHING, {}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(Park(v1::BATCH_MODE_UNSPECIFIED, {1}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(Resume(v1::BATCH_MODE_UNSPECIFIED, {1}).status()));
  const v1::SessionRef real = ref_;
  ref_.set_token("not-the-token");
  EXPECT_TRUE(absl::IsPermissionDenied(Park(v1::BATCH_MODE_PER_ITEM, {1}).status()));
  EXPECT_TRUE(absl::IsPermissionDenied(Resume(v1::BATCH_MODE_PER_ITEM, {1}).status()));
  ref_ = real;
  too_many.pop_back();  // exactly the cap is fine: two parked, the rest unknown
  auto at_cap = Park(v1::BATCH_MODE_PER_ITEM, too_many);
  ASSERT_TRUE(at_cap.ok()) << at_cap.status();
  EXPECT_EQ(at_cap->results_size(), SessionManager::kMaxBatchItems);
  EXPECT_EQ(at_cap->parked(), 2u);
  EXPECT_EQ(State(), (std::map<uint64_t, int64_t>{{1, -1}, {2, -1}}));
  EXPECT_TRUE(sm_->CheckInvariants().ok()) << sm_->CheckInvariants();
}

}  // namespace session_batch_parking_test
}  // namespace hisparse
