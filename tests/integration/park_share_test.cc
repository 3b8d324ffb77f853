// Park/resume and shared prefixes end to end: a real hisparsed, the client library on the host
// backend. A parked request's row goes to another request, it resumes into another row and the
// first RESOLVE returns its own records byte for byte (the row's slots were reset, whatever the
// row's last request left); a child admitted on a parent's prefix (inside a page and at a page
// boundary) reads the parent's records, writes its own tail, stays exact once the parent is gone,
// and cannot write into a shared page. Every refusal keeps its code.
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "test_support.h"

namespace hisparse::testing {
namespace park_share_test {

constexpr uint32_t kLayers = 4, kRb = 64, kB = 16, kK = 8;
constexpr uint32_t kPerPage = 4096 / kRb;  // 64 records a page (the test daemon's 4 KiB pages)

uint8_t Pattern(uint64_t seed, uint32_t layer, uint32_t pos, uint32_t i) {
  return static_cast<uint8_t>(seed * 5 + layer * 11 + pos * 31 + i);
}

// Tokens [start, end) of every layer as hs_store takes them (layer-major), filled with `seed`.
std::vector<uint8_t> Records(uint64_t seed, uint32_t start, uint32_t end) {
  const uint32_t n = end - start;
  std::vector<uint8_t> out(kLayers * n * kRb);
  for (uint32_t l = 0; l < kLayers; ++l)
    for (uint32_t p = 0; p < n; ++p)
      for (uint32_t i = 0; i < kRb; ++i) out[(l * n + p) * kRb + i] = Pattern(seed, l, start + p, i);
  return out;
}

class ParkShareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = StartDaemon();
    ASSERT_NE(daemon_, nullptr);
    address_ = daemon_->address();
    hs_session_options o = SmallGeometry(address_);  // 4 layers, 64 B, k 8, B 16
    o.max_requests = 2;
    ASSERT_TRUE(Session::Open(o, &s_).ok()) << hs_last_error();
    ASSERT_TRUE(s_.Info(&info_).ok());
  }
  // Stores tokens [start, end) of `id` with `seed`'s pattern.
  hs_result Store(uint64_t id, uint32_t start, uint32_t end, uint64_t seed) {
    const std::vector<uint8_t> recs = Records(seed, start, end);
    const int32_t n = static_cast<int32_t>(end - start);
    return hs_store(s_.get(), id, static_cast<int32_t>(start), n, static_cast<int32_t>(end), recs.data(),
                    int64_t{n} * kRb, kRb, nullptr);
  }
  // Whether the host record of (id, layer, pos) holds `seed`'s pattern.
  bool HostHolds(uint64_t id, uint32_t layer, uint32_t pos, uint64_t seed) {
    void* p = nullptr;
    if (!s_.RecordPtr(id, layer, pos, &p).ok()) return false;
    for (uint32_t i = 0; i < kRb; ++i) {
      if (static_cast<uint8_t*>(p)[i] != Pattern(seed, layer, pos, i)) return false;
    }
    return true;
  }
  // RESOLVEs `positions` (k of them) of the request in `row` at seq_len for every layer and checks
  // that every output slot holds the record `seed_of(pos)` wrote.
  template <typename SeedOf>
  void ResolveAndCheck(uint32_t row, int32_t seq_len, const std::vector<int32_t>& positions, SeedOf seed_of) {
    ASSERT_EQ(positions.size(), kK);
    const int32_t rows[1] = {static_cast<int32_t>(row)};
    const int32_t seqs[1] = {seq_len};
    for (uint32_t layer = 0; layer < kLayers; ++layer) {
      std::vector<int32_t> out(kK, -7);
      hs_resolve_args a = ResolveArgs(layer, 1, rows, seqs, positions.data(), out.data());
      ASSERT_TRUE(s_.Resolve(a).ok()) << hs_last_error();
      for (uint32_t j = 0; j < kK; ++j) {
        ASSERT_GE(out[j], 0);
        const uint8_t* rec =
            static_cast<const uint8_t*>(info_.slot_base) +
            ((uint64_t{row} * kLayers + layer) * (kB + 1 + info_.draft_tokens) + out[j]) * info_.record_stride;
        const uint32_t pos = static_cast<uint32_t>(positions[j]);
        for (uint32_t i = 0; i < kRb; ++i) {
          ASSERT_EQ(rec[i], Pattern(seed_of(pos), layer, pos, i))
              << "row " << row << " layer " << layer << " position " << pos << " byte " << i;
        }
      }
    }
  }
  std::unique_ptr<DaemonProcess> daemon_;
  std::string address_;
  Session s_;
  hs_session_info info_ = HS_SESSION_INFO_INIT;
};

TEST_F(ParkShareTest, ParkedRequestResumesIntoAnotherRowAndResolvesItsOwnRecords) {
  constexpr int32_t kCtx = 200;
  const std::vector<int32_t> picks = {3, 40, 22, 9, 150, 130, 77, 64};
  hs_request_info r1 = HS_REQUEST_INFO_INIT, r2 = HS_REQUEST_INFO_INIT, r3 = HS_REQUEST_INFO_INIT;
  ASSERT_TRUE(s_.Admit(1, kCtx, 256, &r1).ok());
  ASSERT_EQ(Store(1, 0, kCtx, 1), HS_OK) << hs_last_error();
  ASSERT_TRUE(s_.Admit(2, kCtx, 256, &r2).ok());
  ASSERT_EQ(Store(2, 0, kCtx, 2), HS_OK) << hs_last_error();
  ResolveAndCheck(r2.row, kCtx, picks, [](uint32_t) { return 2; });  // request 2's records in its row's slots
  ASSERT_TRUE(s_.Park(1).ok()) << hs_last_error();
  EXPECT_EQ(Store(1, kCtx, kCtx + 1, 1), HS_ERR_FAILED_PRECONDITION);  // parked: no row to store through
  EXPECT_TRUE(HostHolds(1, 3, 150, 1));                                // its pages stay readable

  ASSERT_TRUE(s_.Admit(3, kCtx, 256, &r3).ok()) << hs_last_error();  // takes the row request 1 gave back
  EXPECT_EQ(r3.row, r1.row);
  EXPECT_EQ(s_.Resume(1).code, HS_ERR_RESOURCE_EXHAUSTED);   // both rows in use: it stays parked
  EXPECT_EQ(s_.Park(1).code, HS_ERR_FAILED_PRECONDITION);    // parked already
  EXPECT_EQ(s_.Resume(3).code, HS_ERR_FAILED_PRECONDITION);  // live
  EXPECT_EQ(s_.Park(99).code, HS_ERR_NOT_FOUND);
  EXPECT_EQ(s_.Resume(99).code, HS_ERR_NOT_FOUND);
  v1::StatsResponse st = Stats(address_);
  EXPECT_EQ(st.parked_requests(), 1u);
  EXPECT_EQ(st.requests(), 3u);
  const CommandResult listed = Ctl(address_, "requests");
  ASSERT_EQ(listed.exit_code, 0);
  EXPECT_NE(listed.out.find("parked"), std::string::npos) << listed.out;
  EXPECT_NE(Ctl(address_, "stats").out.find("(parked 1)"), std::string::npos);

  // Request 2 leaves; request 1 resumes into its row, whose slots hold request 2's records of the
  // same positions: the reset makes the first RESOLVE fetch request 1's own.
  ASSERT_TRUE(s_.Release(2).ok());
  hs_request_info resumed = HS_REQUEST_INFO_INIT;
  ASSERT_TRUE(s_.Resume(1, &resumed).ok()) << hs_last_error();
  EXPECT_EQ(resumed.row, r2.row);
  EXPECT_NE(resumed.row, r1.row);
  EXPECT_EQ(resumed.capacity_tokens, 256u);
  ResolveAndCheck(resumed.row, kCtx, picks, [](uint32_t) { return 1; });
  // It decodes on: an appended-then-stored token lands in its pages again.
  ASSERT_EQ(Store(1, kCtx, kCtx + 1, 1), HS_OK) << hs_last_error();
  EXPECT_TRUE(HostHolds(1, 0, kCtx, 1));
  EXPECT_EQ(Stats(address_).parked_requests(), 0u);
}

// Evicting a parked request (here by an operator) leaves alone the row it once held, which another
// request holds now.
TEST_F(ParkShareTest, EvictingAParkedRequestLeavesItsOldRowToItsNewHolder) {
  hs_request_info r1 = HS_REQUEST_INFO_INIT, r2 = HS_REQUEST_INFO_INIT;
  ASSERT_TRUE(s_.Admit(1, 40, 64, &r1).ok());
  ASSERT_EQ(Store(1, 0, 40, 1), HS_OK) << hs_last_error();
  ASSERT_TRUE(s_.Park(1).ok());
  ASSERT_TRUE(s_.Admit(2, 40, 64, &r2).ok());
  ASSERT_EQ(r2.row, r1.row);
  ASSERT_EQ(Store(2, 0, 40, 2), HS_OK) << hs_last_error();
  hs_session_info info = HS_SESSION_INFO_INIT;
  ASSERT_EQ(hs_session_get_info(s_.get(), &info), HS_OK);
  auto stub = RawStub(address_);
  grpc::ClientContext ctx;
  v1::EvictRequest req;
  req.set_session_id(info.session_id);
  req.set_request_id(1);
  v1::EvictResponse resp;
  ASSERT_TRUE(stub->Evict(&ctx, req, &resp).ok());
  ASSERT_TRUE(WaitUntil([&] {
    uint64_t id = 0;
    size_t n = 0;
    return hs_poll_evicted(s_.get(), &id, 1, &n) == HS_OK && n == 1 && id == 1;
  }));
  ResolveAndCheck(r2.row, 40, {3, 20, 33, 12, 0, 1, 2, 30}, [](uint32_t) { return 2; });
}

TEST_F(ParkShareTest, ChildOfASharedPrefixIsExactAndCannotWriteTheSharedPages) {
  constexpr int32_t kCtx = 200;
  ASSERT_TRUE(s_.Admit(1, kCtx, 256, nullptr).ok());  // 4 pages a layer
  ASSERT_EQ(Store(1, 0, kCtx, 1), HS_OK) << hs_last_error();
  // Inside a page: one full page shared, 36 records of the second copied.
  constexpr uint32_t kPrefix = kPerPage + 36;
  hs_request_info child = HS_REQUEST_INFO_INIT;
  ASSERT_TRUE(s_.AdmitShared(2, 150, 192, 1, kPrefix, &child).ok()) << hs_last_error();
  for (uint32_t l = 0; l < kLayers; ++l)
    for (uint32_t p = 0; p < kPrefix; ++p) ASSERT_TRUE(HostHolds(2, l, p, 1)) << l << " " << p;
  // Its own tail, from the prefix on (the copied page is its own); not into the shared page.
  ASSERT_EQ(Store(2, kPrefix, 150, 2), HS_OK) << hs_last_error();
  EXPECT_EQ(Store(2, 10, 11, 2), HS_ERR_INVALID_ARGUMENT) << hs_last_error();
  EXPECT_NE(std::string(hs_last_error()).find("read-only"), std::string::npos) << hs_last_error();
  // The parent's prefix is immutable now too; past the shared page it writes as before.
  EXPECT_EQ(Store(1, 10, 11, 9), HS_ERR_INVALID_ARGUMENT) << hs_last_error();
  ASSERT_EQ(Store(1, kPerPage, kCtx, 1), HS_OK) << hs_last_error();
  for (uint32_t p = 0; p < 150; ++p) ASSERT_TRUE(HostHolds(2, 1, p, p < kPrefix ? 1 : 2)) << p;
  for (uint32_t p = 0; p < kCtx; ++p) ASSERT_TRUE(HostHolds(1, 1, p, 1)) << p;

  v1::StatsResponse st = Stats(address_);
  EXPECT_EQ(st.host_pool().shared_bytes(), uint64_t{kLayers} * 4096);
  const CommandResult listed = Ctl(address_, "requests");
  ASSERT_EQ(listed.exit_code, 0);
  EXPECT_NE(listed.out.find("16.0 KiB"), std::string::npos) << listed.out;  // each one's shared bytes
  const CommandResult stats = Ctl(address_, "stats --json");
  ASSERT_EQ(stats.exit_code, 0);
  EXPECT_NE(stats.out.find("\"shared_bytes\": 16384"), std::string::npos) << stats.out;

  // The parent goes: the child resolves the same records from the pages it kept.
  ASSERT_TRUE(s_.Release(1).ok());
  EXPECT_EQ(Stats(address_).host_pool().shared_bytes(), 0u);
  ResolveAndCheck(child.row, 150, {3, 70, 100, 63, 64, 99, 149, 140},
                  [&](uint32_t pos) { return pos < kPrefix ? 1u : 2u; });
  for (uint32_t p = 0; p < 150; ++p) ASSERT_TRUE(HostHolds(2, 3, p, p < kPrefix ? 1 : 2)) << p;
}

TEST_F(ParkShareTest, PrefixAtAPageBoundaryFromAParkedParent) {
  ASSERT_TRUE(s_.Admit(1, 128, 128, nullptr).ok());
  ASSERT_EQ(Store(1, 0, 128, 1), HS_OK) << hs_last_error();
  ASSERT_TRUE(s_.Park(1).ok());
  hs_request_info child = HS_REQUEST_INFO_INIT;
  ASSERT_TRUE(s_.AdmitShared(2, 130, 192, 1, 2 * kPerPage, &child).ok()) << hs_last_error();
  ASSERT_EQ(Store(2, 2 * kPerPage, 130, 2), HS_OK) << hs_last_error();
  EXPECT_EQ(Store(2, 2 * kPerPage - 1, 2 * kPerPage, 2), HS_ERR_INVALID_ARGUMENT);  // the last shared record
  ResolveAndCheck(child.row, 130, {0, 63, 64, 127, 128, 5, 100, 129},
                  [](uint32_t pos) { return pos < 2 * kPerPage ? 1u : 2u; });
  ASSERT_TRUE(s_.Release(2).ok());  // the child first, this time: the parent keeps its pages
  ASSERT_TRUE(s_.Resume(1).ok()) << hs_last_error();
  for (uint32_t p = 0; p < 128; ++p) ASSERT_TRUE(HostHolds(1, 2, p, 1)) << p;
}

TEST_F(ParkShareTest, BadPrefixesAreRefusedWithTheirCodes) {
  ASSERT_TRUE(s_.Admit(1, 100, 100, nullptr).ok());
  Session other;
  ASSERT_TRUE(Session::Open(SmallGeometry(address_), &other).ok());
  ASSERT_TRUE(other.Admit(7, 10, 10, nullptr).ok());
  const uint64_t used = Stats(address_).host_pool().used_bytes();
  EXPECT_EQ(s_.AdmitShared(2, 10, 200, 9, 10).code, HS_ERR_NOT_FOUND);          // no such parent
  EXPECT_EQ(s_.AdmitShared(2, 10, 200, 7, 5).code, HS_ERR_NOT_FOUND);           // another session's request
  EXPECT_EQ(s_.AdmitShared(2, 10, 200, 1, 101).code, HS_ERR_INVALID_ARGUMENT);  // longer than the parent
  EXPECT_NE(std::string(hs_last_error()).find("parent's capacity"), std::string::npos) << hs_last_error();
  EXPECT_EQ(s_.AdmitShared(2, 10, 50, 1, 60).code, HS_ERR_INVALID_ARGUMENT);  // longer than the child
  EXPECT_EQ(s_.AdmitShared(2, 10, 200, 1, 0).code, HS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(s_.AdmitShared(2, 10, 200, 2, 5).code, HS_ERR_INVALID_ARGUMENT);  // its own parent
  EXPECT_EQ(Stats(address_).host_pool().used_bytes(), used);
  EXPECT_EQ(Stats(address_).requests(), 2u);
  EXPECT_TRUE(s_.AdmitShared(2, 10, 200, 1, 100).ok()) << hs_last_error();  // the whole parent
}

}  // namespace park_share_test
}  // namespace hisparse::testing
