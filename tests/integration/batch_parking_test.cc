// Batched park, resume and import admission against the real daemon, through the C ABI
// (hs_park_batch, hs_resume_batch, hs_admit_import_batch): eight requests parked in one call
// give their rows back (stats, the client's table); an all-or-nothing resume that lacks rows
// changes nothing on either side; one that fits gives every request a row whose RESOLVE reads
// the records stored before the park, exactly; per-item calls report each id's code; import items
// fail FAILED_PRECONDITION where the daemon serves no imports.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "test_support.h"

namespace hisparse::testing {
namespace batch_parking_test {

constexpr uint32_t kLayers = 4, kRecord = 64, kSlots = 16, kK = 8, kCtx = 40;
constexpr hs_result kUntouched = HS_ERR_UNIMPLEMENTED;  // as batch_admission_test's

uint8_t Pattern(uint64_t req, uint32_t layer, uint32_t pos, uint32_t i) {
  return static_cast<uint8_t>(req * 7 + layer * 17 + pos * 31 + i);
}

class BatchParkingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = StartDaemon({"--set", "import.enabled=false"});  // imports are on by default
    ASSERT_NE(daemon_, nullptr);
    address_ = daemon_->address();
    ASSERT_TRUE(Session::Open(SmallGeometry(address_), &s_).ok()) << hs_last_error();  // 8 rows
    ASSERT_TRUE(s_.Info(&info_).ok());
  }
  void AdmitAndStore(uint64_t id) {
    hs_request_info ri = HS_REQUEST_INFO_INIT;
    ASSERT_EQ(hs_admit(s_.get(), id, kCtx, 100, &ri), HS_OK) << hs_last_error();
    std::vector<uint8_t> prompt(kLayers * kCtx * kRecord);
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint32_t p = 0; p < kCtx; ++p)
        for (uint32_t i = 0; i < kRecord; ++i) prompt[(l * kCtx + p) * kRecord + i] = Pattern(id, l, p, i);
    ASSERT_EQ(hs_store(s_.get(), id, 0, kCtx, kCtx, prompt.data(), kCtx * kRecord, kRecord, nullptr), HS_OK)
        << hs_last_error();
  }
  hs_result Park(std::vector<uint64_t> ids, hs_batch_mode mode) {
    results_.assign(ids.size(), kUntouched);
    return hs_park_batch(s_.get(), ids.size(), ids.data(), mode, results_.data());
  }
  hs_result Resume(std::vector<uint64_t> ids, hs_batch_mode mode) {
    results_.assign(ids.size(), kUntouched);
    rows_.assign(ids.size(), UINT32_MAX);
    caps_.assign(ids.size(), 0);
    return hs_resume_batch(s_.get(), ids.size(), ids.data(), mode, results_.data(), rows_.data(), caps_.data());
  }
  // RESOLVEs k positions of request `id` in `row` on every layer; each slot must hold its record.
  void ResolveAndCheck(uint64_t id, uint32_t row) {
    const int32_t rows[1] = {static_cast<int32_t>(row)};
    const int32_t seqs[1] = {static_cast<int32_t>(kCtx)};
    std::vector<int32_t> pos = {static_cast<int32_t>(kCtx - 1), 0, 3, 9, 17, 21, 30, 38};
    for (uint32_t l = 0; l < kLayers; ++l) {
      std::vector<int32_t> out(kK, -7);
      hs_resolve_args a = ResolveArgs(l, 1, rows, seqs, pos.data(), out.data());
      ASSERT_TRUE(s_.Resolve(a).ok()) << hs_last_error();
      for (uint32_t j = 0; j < kK; ++j) {
        if (pos[j] == static_cast<int32_t>(kCtx - 1)) continue;  // the newest token's slot: the next append's
        ASSERT_GE(out[j], 0);
        const uint8_t* rec = static_cast<const uint8_t*>(info_.slot_base) +
                             ((uint64_t{row} * kLayers + l) * (kSlots + 1) + out[j]) * info_.record_stride;
        for (uint32_t i = 0; i < kRecord; ++i) {
          ASSERT_EQ(rec[i], Pattern(id, l, static_cast<uint32_t>(pos[j]), i)) << "request " << id << " layer " << l;
        }
      }
    }
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::string address_;
  Session s_;
  hs_session_info info_;
  std::vector<hs_result> results_;
  std::vector<uint32_t> rows_, caps_;
};

TEST_F(BatchParkingTest, ParkAllResumeAllOrNothingAndReadBackExactly) {
  std::vector<uint64_t> ids;
  for (uint64_t id = 1; id <= 8; ++id) {
    AdmitAndStore(id);
    ids.push_back(id);
  }
  ASSERT_EQ(Park(ids, HS_BATCH_ALL_OR_NOTHING), HS_OK) << hs_last_error();
  for (hs_result r : results_) EXPECT_EQ(r, HS_OK);
  EXPECT_EQ(Stats(address_).parked_requests(), 8u);
  void* rec = nullptr;
  ASSERT_TRUE(s_.RecordPtr(3, 1, 5, &rec).ok()) << "a parked request's records stay readable";
  EXPECT_EQ(static_cast<uint8_t*>(rec)[2], Pattern(3, 1, 5, 2));

  // Three rows taken by new requests: five free for eight parked. All or nothing changes nothing.
  for (uint64_t id = 100; id < 103; ++id) AdmitAndStore(id);
  EXPECT_EQ(Resume(ids, HS_BATCH_ALL_OR_NOTHING), HS_ERR_RESOURCE_EXHAUSTED);
  EXPECT_NE(std::string(hs_last_error()).find("items[5]"), std::string::npos) << hs_last_error();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(results_[i], i == 5 ? HS_ERR_RESOURCE_EXHAUSTED : HS_ERR_ABORTED) << i;
  EXPECT_EQ(rows_[0], UINT32_MAX) << "a not-resumed item's outputs are not written";
  EXPECT_EQ(Stats(address_).parked_requests(), 8u);

  // With the rows back, one call resumes all eight, each in its own row, each reading its records.
  std::vector<uint64_t> extra = {100, 101, 102};
  std::vector<hs_result> released(3, kUntouched);
  ASSERT_EQ(hs_release_batch(s_.get(), 3, extra.data(), released.data()), HS_OK);
  ASSERT_EQ(Resume(ids, HS_BATCH_ALL_OR_NOTHING), HS_OK) << hs_last_error();
  EXPECT_EQ(std::set<uint32_t>(rows_.begin(), rows_.end()).size(), 8u);
  EXPECT_EQ(Stats(address_).parked_requests(), 0u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(caps_[i], 100u);
    ResolveAndCheck(ids[i], rows_[i]);
  }
}

TEST_F(BatchParkingTest, PerItemCallsReportEachIdAndBadCallsWriteNothing) {
  AdmitAndStore(1);
  AdmitAndStore(2);
  ASSERT_EQ(Park({1, 9, 1, 2}, HS_BATCH_PER_ITEM), HS_OK) << hs_last_error();
  EXPECT_EQ(results_, (std::vector<hs_result>{HS_OK, HS_ERR_NOT_FOUND, HS_ERR_INVALID_ARGUMENT, HS_OK}));
  ASSERT_EQ(Resume({2, 2, 9}, HS_BATCH_PER_ITEM), HS_OK) << hs_last_error();
  EXPECT_EQ(results_, (std::vector<hs_result>{HS_OK, HS_ERR_INVALID_ARGUMENT, HS_ERR_NOT_FOUND}));
  ResolveAndCheck(2, rows_[0]);
  ASSERT_EQ(Resume({2, 1}, HS_BATCH_PER_ITEM), HS_OK);
  EXPECT_EQ(results_, (std::vector<hs_result>{HS_ERR_FAILED_PRECONDITION, HS_OK}));
  ResolveAndCheck(1, rows_[1]);

  uint64_t ids[1] = {1};
  hs_result one[1] = {kUntouched};
  EXPECT_EQ(hs_park_batch(s_.get(), 0, ids, HS_BATCH_PER_ITEM, one), HS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(hs_park_batch(s_.get(), HS_BATCH_MAX_ITEMS + 1, ids, HS_BATCH_PER_ITEM, one), HS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(hs_park_batch(s_.get(), 1, ids, static_cast<hs_batch_mode>(7), one), HS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(hs_resume_batch(s_.get(), 1, ids, HS_BATCH_PER_ITEM, nullptr, nullptr, nullptr), HS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(one[0], kUntouched);
  EXPECT_EQ(Stats(address_).parked_requests(), 0u);
}

TEST_F(BatchParkingTest, ImportItemsFailWhereTheDaemonServesNoImports) {
  uint64_t ids[2] = {1, 2};
  uint32_t budgets[2] = {100, 100};
  hs_result results[2] = {kUntouched, kUntouched};
  ASSERT_EQ(hs_admit_import_batch(s_.get(), 2, ids, nullptr, budgets, HS_BATCH_PER_ITEM, results), HS_OK)
      << hs_last_error();
  EXPECT_EQ(results[0], HS_ERR_FAILED_PRECONDITION);
  EXPECT_EQ(results[1], HS_ERR_FAILED_PRECONDITION);
  EXPECT_EQ(hs_admit_import_batch(s_.get(), 2, ids, nullptr, budgets, HS_BATCH_ALL_OR_NOTHING, results),
            HS_ERR_FAILED_PRECONDITION);
  EXPECT_EQ(results[1], HS_ERR_ABORTED);
  EXPECT_EQ(Stats(address_).requests(), 0u);
}

}  // namespace batch_parking_test
}  // namespace hisparse::testing
