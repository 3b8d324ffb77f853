// hs_resolve's page-table output (resolve.h, rule 9) through the client library on the
// host-emulated backend against the real daemon's memory: every entry names the record, in the
// arena viewed as one array from slot_base, that holds its position (byte-equal to the host
// record); pages and an offset shift it; out_slots may be left out; bad parameters are refused.
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "test_support.h"

namespace hisparse::testing {
namespace page_table_test {

constexpr uint32_t kLayers = 4, kRb = 64, kB = 16, kK = 8;
constexpr int32_t kCtx = 60;

uint8_t Pattern(uint64_t req, uint32_t layer, uint32_t pos, uint32_t i) {
  return static_cast<uint8_t>(req * 5 + layer * 11 + pos * 31 + i);
}

class PageTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = StartDaemon();
    ASSERT_NE(daemon_, nullptr);
    address_ = daemon_->address();
    ASSERT_TRUE(Session::Open(SmallGeometry(address_), &s_).ok());  // 4 layers, 64 B, k 8, B 16
    ASSERT_TRUE(s_.Info(&info_).ok());
    for (uint64_t id : {1, 2}) {
      hs_request_info ri = HS_REQUEST_INFO_INIT;
      ASSERT_TRUE(s_.Admit(id, kCtx, kCtx + 4, &ri).ok());
      rows_.push_back(static_cast<int32_t>(ri.row));
      std::vector<uint8_t> prompt(kLayers * kCtx * kRb);
      for (uint32_t l = 0; l < kLayers; ++l)
        for (uint32_t p = 0; p < kCtx; ++p)
          for (uint32_t i = 0; i < kRb; ++i) prompt[(l * kCtx + p) * kRb + i] = Pattern(id, l, p, i);
      ASSERT_EQ(hs_store(s_.get(), id, 0, kCtx, kCtx, prompt.data(), kCtx * kRb, kRb, nullptr), HS_OK)
          << hs_last_error();
    }
  }
  hs_resolve_args Args(uint32_t layer, int32_t* out, int32_t* pt, int32_t page_records, int32_t page_offset) {
    hs_resolve_args a = ResolveArgs(layer, 2, rows_.data(), seq_.data(), pos_.data(), out);
    a.page_table = pt;
    a.page_records = page_records;
    a.page_offset = page_offset;
    return a;
  }
  std::unique_ptr<DaemonProcess> daemon_;
  std::string address_;
  Session s_;
  hs_session_info info_ = HS_SESSION_INFO_INIT;
  std::vector<int32_t> rows_;
  std::vector<int32_t> seq_ = {kCtx, kCtx};
  std::vector<int32_t> pos_ = {kCtx - 1, 3, 40, 22, 9, 51, -1, 30, 0, 17, kCtx - 1, 44, 45, 46, -1, -1};
};

TEST_F(PageTableTest, EntriesNameTheRecordThatHoldsEachPosition) {
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    std::vector<int32_t> out(16, 99), pt(16, 99);
    hs_resolve_args a = Args(layer, out.data(), pt.data(), 1, 0);
    ASSERT_TRUE(s_.Resolve(a).ok()) << hs_last_error();
    for (int i = 0; i < 2; ++i) {
      for (uint32_t j = 0; j < kK; ++j) {
        const int32_t p = pos_[i * kK + j], e = pt[i * kK + j];
        if (p < 0) {
          EXPECT_EQ(e, -1);
          continue;
        }
        EXPECT_EQ(e, static_cast<int32_t>((rows_[i] * kLayers + layer) * (kB + 1)) + out[i * kK + j]);
        const uint8_t* rec =
            static_cast<const uint8_t*>(info_.slot_base) + static_cast<size_t>(e) * info_.record_stride;
        for (uint32_t b = 0; b < kRb; ++b) {
          ASSERT_EQ(rec[b], Pattern(i + 1, layer, p, b)) << "layer " << layer << " entry " << i << " position " << p;
        }
      }
    }
  }
}

TEST_F(PageTableTest, PagesOffsetAndNoOutSlots) {
  std::vector<int32_t> out(16), plain(16), paged(16, 99);
  hs_resolve_args a = Args(2, out.data(), plain.data(), 1, 0);
  ASSERT_TRUE(s_.Resolve(a).ok()) << hs_last_error();
  // Again (all hits now): pages of 64 records from page 3, no out_slots.
  a = Args(2, nullptr, paged.data(), 64, 3);
  ASSERT_TRUE(s_.Resolve(a).ok()) << hs_last_error();
  for (size_t x = 0; x < 16; ++x) EXPECT_EQ(paged[x], plain[x] < 0 ? -1 : plain[x] + 3 * 64) << x;
}

TEST_F(PageTableTest, BadParametersAreRefused) {
  std::vector<int32_t> out(16, 99), pt(16, 99);
  hs_stats before;
  ASSERT_TRUE(s_.Stats(&before).ok());
  for (auto [records, offset] : {std::pair{0, 0}, std::pair{1, -1}, std::pair{1 << 16, 1 << 16}}) {
    hs_resolve_args a = Args(0, out.data(), pt.data(), records, offset);
    Error e = s_.Resolve(a);
    EXPECT_EQ(e.code, HS_ERR_INVALID_ARGUMENT) << records << " " << offset;
    EXPECT_NE(e.message.find("page"), std::string::npos) << e.message;
  }
  hs_resolve_args a = Args(0, nullptr, nullptr, 1, 0);
  EXPECT_EQ(s_.Resolve(a).code, HS_ERR_INVALID_ARGUMENT);  // neither output
  EXPECT_EQ(out, std::vector<int32_t>(16, 99));
  EXPECT_EQ(pt, std::vector<int32_t>(16, 99));
  hs_stats after;
  ASSERT_TRUE(s_.Stats(&after).ok());
  EXPECT_EQ(after.hits + after.misses, before.hits + before.misses) << "nothing was resolved";
}

}  // namespace page_table_test
}  // namespace hisparse::testing
