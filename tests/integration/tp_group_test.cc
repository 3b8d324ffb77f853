// TP groups end to end (issue 19, part 4): a real hisparsed, the client library on the host
// backend, four sessions that are the ranks of one group. One rank admits and stores a request;
// every rank's hs_admit_group attaches to the same pages, and every rank's RESOLVE returns the
// stored records byte for byte into its own arena; the ranks' appends write the same bytes once;
// the node's stats count the pages once (1x, not 4x); the ranks admitting at once from their own
// threads each get a row over one set of pages; a rank's death keeps the others exact; a rank
// twice and a call before the group is complete keep their codes.
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "test_support.h"

namespace hisparse::testing {
namespace tp_group_test {

constexpr uint32_t kLayers = 4, kRb = 64, kB = 16, kK = 8, kRanks = 4;
constexpr uint32_t kCtx = 300;     // 5 pages of 64 records a layer (the test daemon's 4 KiB pages)
constexpr uint32_t kBudget = 320;  // 5 pages a layer exactly

uint8_t Pattern(uint64_t seed, uint32_t layer, uint32_t pos, uint32_t i) {
  return static_cast<uint8_t>(seed * 7 + layer * 13 + pos * 29 + i);
}

std::vector<uint8_t> Records(uint64_t seed, uint32_t start, uint32_t end) {
  const uint32_t n = end - start;
  std::vector<uint8_t> out(kLayers * n * kRb);
  for (uint32_t l = 0; l < kLayers; ++l)
    for (uint32_t p = 0; p < n; ++p)
      for (uint32_t i = 0; i < kRb; ++i) out[(l * n + p) * kRb + i] = Pattern(seed, l, start + p, i);
  return out;
}

class TpGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = StartDaemon();
    ASSERT_NE(daemon_, nullptr);
    address_ = daemon_->address();
    for (uint32_t rank = 0; rank < kRanks; ++rank) {
      ASSERT_EQ(OpenRank(rank, &ranks_[rank]), HS_OK) << hs_last_error();
      ASSERT_TRUE(ranks_[rank].Info(&info_[rank]).ok());
    }
  }
  hs_result OpenRank(uint32_t rank, Session* out, const char* group = "tp-test") {
    hs_session_options o = SmallGeometry(address_);  // 4 layers, 64 B, k 8, B 16, 8 rows
    o.group = group;
    o.group_rank = rank;
    o.group_size = kRanks;
    return Session::Open(o, out).code;
  }
  hs_result Store(uint32_t rank, uint64_t id, uint32_t start, uint32_t end, uint64_t seed) {
    const std::vector<uint8_t> recs = Records(seed, start, end);
    const int32_t n = static_cast<int32_t>(end - start);
    return hs_store(ranks_[rank].get(), id, static_cast<int32_t>(start), n, static_cast<int32_t>(end), recs.data(),
                    int64_t{n} * kRb, kRb, nullptr);
  }
  // RESOLVEs `positions` of the request in `row` of rank `rank` at seq_len for every layer and
  // checks that every output slot of that rank's arena holds `seed`'s record.
  void ResolveAndCheck(uint32_t rank, uint32_t row, int32_t seq_len, const std::vector<int32_t>& positions,
                       uint64_t seed) {
    ASSERT_EQ(positions.size(), kK);
    const int32_t rows[1] = {static_cast<int32_t>(row)};
    const int32_t seqs[1] = {seq_len};
    const hs_session_info& info = info_[rank];
    for (uint32_t layer = 0; layer < kLayers; ++layer) {
      std::vector<int32_t> out(kK, -7);
      hs_resolve_args a = ResolveArgs(layer, 1, rows, seqs, positions.data(), out.data());
      ASSERT_TRUE(ranks_[rank].Resolve(a).ok()) << hs_last_error();
      for (uint32_t j = 0; j < kK; ++j) {
        ASSERT_GE(out[j], 0);
        const uint8_t* rec =
            static_cast<const uint8_t*>(info.slot_base) +
            ((uint64_t{row} * kLayers + layer) * (kB + 1 + info.draft_tokens) + out[j]) * info.record_stride;
        const uint32_t pos = static_cast<uint32_t>(positions[j]);
        for (uint32_t i = 0; i < kRb; ++i) {
          ASSERT_EQ(rec[i], Pattern(seed, layer, pos, i))
              << "rank " << rank << " row " << row << " layer " << layer << " position " << pos << " byte " << i;
        }
      }
    }
  }
  std::unique_ptr<DaemonProcess> daemon_;
  std::string address_;
  Session ranks_[kRanks];
  hs_session_info info_[kRanks];
};

TEST_F(TpGroupTest, OneRankStoresEveryRankResolvesTheSamePagesAndStatsCountThemOnce) {
  hs_request_info first = HS_REQUEST_INFO_INIT;
  ASSERT_TRUE(ranks_[0].AdmitGroup(1, kCtx, kBudget, &first).ok()) << hs_last_error();
  ASSERT_EQ(Store(0, 1, 0, kCtx, 5), HS_OK) << hs_last_error();  // the prefill, stored once by rank 0
  std::vector<hs_request_info> rows(kRanks, first);
  for (uint32_t rank = 1; rank < kRanks; ++rank) {
    ASSERT_TRUE(ranks_[rank].AdmitGroup(1, kCtx, kBudget, &rows[rank]).ok()) << hs_last_error();
    EXPECT_EQ(rows[rank].capacity_tokens, kBudget);
  }
  // A decode step: every rank appends the same newest token (a replicated MLA record) into its own
  // tail slot and the one host page, then resolves. The prompt's records reach ranks 1..3 only
  // through the pages rank 0 stored: their first RESOLVE misses everything and fetches them.
  const std::vector<uint8_t> newest = Records(5, kCtx, kCtx + 1);
  for (uint32_t rank = 0; rank < kRanks; ++rank) {
    for (uint32_t layer = 0; layer < kLayers; ++layer) {
      const int32_t row = static_cast<int32_t>(rows[rank].row), seq = kCtx + 1, batch = 1;
      ASSERT_EQ(hs_append(ranks_[rank].get(), layer, 1, &batch, &row, &seq, newest.data() + layer * kRb, kRb, nullptr),
                HS_OK)
          << hs_last_error();
    }
  }
  const std::vector<int32_t> picks = {3, 290, 64, 127, 200, 0, 299, kCtx};
  for (uint32_t rank = 0; rank < kRanks; ++rank) ResolveAndCheck(rank, rows[rank].row, kCtx + 1, picks, 5);
  const std::vector<int32_t> step = {kCtx, 1, 2, 298, 65, 128, 257, 31};
  for (uint32_t rank = 0; rank < kRanks; ++rank) ResolveAndCheck(rank, rows[rank].row, kCtx + 1, step, 5);
  // Every rank's mapping of a record is the same host page.
  void* p0 = nullptr;
  void* p3 = nullptr;
  ASSERT_TRUE(ranks_[0].RecordPtr(1, 2, 100, &p0).ok());
  ASSERT_TRUE(ranks_[3].RecordPtr(1, 2, 100, &p3).ok());
  EXPECT_EQ(std::memcmp(p0, p3, kRb), 0);
  static_cast<uint8_t*>(p3)[0] ^= 0xff;  // written through rank 3's mapping, seen through rank 0's
  EXPECT_EQ(static_cast<uint8_t*>(p0)[0], static_cast<uint8_t>(Pattern(5, 2, 100, 0) ^ 0xff));
  static_cast<uint8_t*>(p3)[0] ^= 0xff;

  const uint64_t one_copy = uint64_t{kLayers} * (kBudget / 64) * 4096;
  const v1::StatsResponse st = Stats(address_);
  EXPECT_EQ(st.host_pool().used_bytes(), one_copy);  // 1x, not kRanks x
  EXPECT_EQ(st.host_pool().group_bytes(), one_copy);
  ASSERT_EQ(st.groups_size(), 1);
  EXPECT_EQ(st.groups(0).name(), "tp-test");
  EXPECT_EQ(st.groups(0).host_bytes(), one_copy);
  EXPECT_EQ(st.groups(0).requests(), 1u);
  EXPECT_EQ(st.groups(0).shares(), kRanks);
  uint64_t sessions_bytes = 0;
  for (const auto& ss : st.session_stats()) sessions_bytes += ss.host_bytes();
  EXPECT_EQ(sessions_bytes, one_copy);
  // hisparse-ctl shows the group once, and each rank's share with the ranks holding it.
  const CommandResult groups = Ctl(address_, "groups");
  EXPECT_EQ(groups.exit_code, 0);
  EXPECT_NE(groups.out.find("tp-test"), std::string::npos) << groups.out;
  const CommandResult requests = Ctl(address_, "requests");
  EXPECT_EQ(requests.exit_code, 0);
  size_t listed = 0;
  for (size_t at = 0; (at = requests.out.find("tp-test (4 ranks)", at)) != std::string::npos; ++at) ++listed;
  EXPECT_EQ(listed, kRanks) << requests.out;
  const CommandResult json = Ctl(address_, "--json groups");
  EXPECT_NE(json.out.find(absl::StrCat("\"host_bytes\": ", one_copy)), std::string::npos) << json.out;

  // Rank 0, which stored (and pays), dies: the others keep their rows over the same pages.
  ranks_[0].Close();
  ASSERT_TRUE(WaitUntil([&] { return Stats(address_).sessions() == kRanks - 1; }));
  EXPECT_EQ(Stats(address_).host_pool().used_bytes(), one_copy);
  for (uint32_t rank = 1; rank < kRanks; ++rank) ResolveAndCheck(rank, rows[rank].row, kCtx + 1, picks, 5);
  // Without rank 0 the group admits nothing new; a new session may take the rank again.
  hs_request_info info = HS_REQUEST_INFO_INIT;
  EXPECT_EQ(hs_admit_group(ranks_[1].get(), 2, 10, 64, &info), HS_ERR_FAILED_PRECONDITION);
  EXPECT_NE(std::string(hs_last_error()).find("rank(s) 0"), std::string::npos) << hs_last_error();
  ASSERT_EQ(OpenRank(0, &ranks_[0]), HS_OK) << hs_last_error();
  ASSERT_TRUE(ranks_[0].AdmitGroup(2, 10, 64).ok()) << hs_last_error();
  for (uint32_t rank = 1; rank < kRanks; ++rank) {
    ASSERT_TRUE(ranks_[rank].Release(1).ok());
    ASSERT_TRUE(ranks_[rank].AdmitGroup(2, 10, 64).ok()) << hs_last_error();
  }
  EXPECT_EQ(Stats(address_).host_pool().used_bytes(), uint64_t{kLayers} * 4096);  // request 1 is gone
  for (auto& s : ranks_) s.Close();
  ASSERT_TRUE(WaitUntil([&] { return Stats(address_).sessions() == 0; }));
  const v1::StatsResponse after = Stats(address_);
  EXPECT_EQ(after.host_pool().used_bytes(), 0u);
  EXPECT_EQ(after.groups_size(), 0);
}

TEST_F(TpGroupTest, RanksAdmittingAtOnceShareOneSetOfPages) {
  constexpr uint64_t kRequests = 8;  // every row of every rank
  std::vector<std::vector<hs_result>> results(kRanks, std::vector<hs_result>(kRequests, HS_OK));
  std::vector<std::thread> threads;
  for (uint32_t rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      for (uint64_t i = 0; i < kRequests; ++i) {
        // Each rank goes through the ids in its own order: some reserve, the rest attach.
        const uint64_t id = 100 + (i + rank * 3) % kRequests;
        hs_request_info info = HS_REQUEST_INFO_INIT;
        results[rank][id - 100] = hs_admit_group(ranks_[rank].get(), id, 10, kBudget, &info);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (uint32_t rank = 0; rank < kRanks; ++rank) {
    for (uint64_t i = 0; i < kRequests; ++i) EXPECT_EQ(results[rank][i], HS_OK) << "rank " << rank << " id " << 100 + i;
  }
  const v1::StatsResponse st = Stats(address_);
  EXPECT_EQ(st.host_pool().used_bytes(), kRequests * kLayers * (kBudget / 64) * 4096);
  ASSERT_EQ(st.groups_size(), 1);
  EXPECT_EQ(st.groups(0).shares(), kRanks * kRequests);
  // Every rank's rows are full now: one more group request is refused for all of them.
  hs_request_info info = HS_REQUEST_INFO_INIT;
  EXPECT_EQ(hs_admit_group(ranks_[2].get(), 999, 10, 64, &info), HS_ERR_RESOURCE_EXHAUSTED);
  EXPECT_EQ(Stats(address_).host_pool().used_bytes(), st.host_pool().used_bytes());
}

TEST_F(TpGroupTest, ARankTwiceAndAnIncompleteGroupAreRefused) {
  Session twice;
  EXPECT_EQ(OpenRank(2, &twice), HS_ERR_ALREADY_EXISTS);
  EXPECT_NE(std::string(hs_last_error()).find("rank 2"), std::string::npos) << hs_last_error();
  hs_session_options o = SmallGeometry(address_);
  o.group = "tp-test";
  o.group_rank = kRanks;  // rank >= size
  o.group_size = kRanks;
  hs_session* s = nullptr;
  EXPECT_EQ(hs_session_open(&o, &s), HS_ERR_INVALID_ARGUMENT);
  o.group_rank = 0;
  o.num_layers = kLayers + 1;  // another layout than the members'
  EXPECT_EQ(hs_session_open(&o, &s), HS_ERR_FAILED_PRECONDITION);
  Session lone;
  ASSERT_EQ(OpenRank(0, &lone, "half-open"), HS_OK) << hs_last_error();
  hs_request_info info = HS_REQUEST_INFO_INIT;
  EXPECT_EQ(hs_admit_group(lone.get(), 1, 10, 64, &info), HS_ERR_FAILED_PRECONDITION);
  // A session in no group, and an attach with another budget.
  Session plain;
  ASSERT_TRUE(Session::Open(SmallGeometry(address_), &plain).ok());
  EXPECT_EQ(hs_admit_group(plain.get(), 1, 10, 64, &info), HS_ERR_FAILED_PRECONDITION);
  ASSERT_TRUE(ranks_[0].AdmitGroup(7, 10, 64).ok()) << hs_last_error();
  EXPECT_EQ(hs_admit_group(ranks_[1].get(), 7, 10, 128, &info), HS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(hs_admit_group(ranks_[0].get(), 7, 10, 64, &info), HS_ERR_ALREADY_EXISTS);
  EXPECT_EQ(Stats(address_).host_pool().used_bytes(), uint64_t{kLayers} * 4096);
  // An extension by one rank grows every share; each other rank's hs_extend to it maps the pages.
  for (uint32_t rank = 1; rank < kRanks; ++rank) {
    ASSERT_EQ(hs_admit_group(ranks_[rank].get(), 7, 10, 64, &info), HS_OK) << hs_last_error();
  }
  ASSERT_EQ(hs_extend(ranks_[0].get(), 7, 128, &info), HS_OK) << hs_last_error();
  EXPECT_EQ(Stats(address_).host_pool().used_bytes(), uint64_t{kLayers} * 2 * 4096);
  for (uint32_t rank = 1; rank < kRanks; ++rank) {
    ASSERT_EQ(hs_extend(ranks_[rank].get(), 7, 128, &info), HS_OK) << hs_last_error();
    EXPECT_EQ(info.capacity_tokens, 128u);
  }
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_TRUE(ranks_[0].RecordPtr(7, 3, 127, &a).ok());
  ASSERT_TRUE(ranks_[2].RecordPtr(7, 3, 127, &b).ok());
  static_cast<uint8_t*>(a)[5] = 0x77;
  EXPECT_EQ(static_cast<uint8_t*>(b)[5], 0x77);
  EXPECT_EQ(Stats(address_).host_pool().used_bytes(), uint64_t{kLayers} * 2 * 4096);
}

// A caller built before ABI 1.7 passes a struct_size that ends before `group`: whatever lies past
// it is not read, and its session joins no group.
TEST_F(TpGroupTest, AnOlderCallersOptionsJoinNoGroup) {
  hs_session_options o = SmallGeometry(address_);
  o.struct_size = offsetof(hs_session_options, group);
  o.group = "tp-test";  // past the caller's struct: must not be read
  o.group_rank = 1;     // (a live rank: joining would be ALREADY_EXISTS)
  o.group_size = kRanks;
  Session old;
  ASSERT_TRUE(Session::Open(o, &old).ok()) << hs_last_error();
  hs_request_info info = HS_REQUEST_INFO_INIT;
  EXPECT_EQ(hs_admit_group(old.get(), 1, 10, 64, &info), HS_ERR_FAILED_PRECONDITION);
  EXPECT_TRUE(old.Admit(1, 10, 64).ok());
}

// Rank 1 is another process (hisparse-test-client, 4 layers of 128-byte records): it reserves N
// group requests, which this process's rank 0 attaches to and reads through the same pages. Killed
// with SIGKILL, it drops its shares; rank 0 keeps its rows over the pages, byte for byte.
TEST(TpGroupProcessTest, AKilledRankDropsItsSharesTheOthersKeepThePages) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const std::string address = daemon->address();
  hs_session_options o = SmallGeometry(address);
  o.record_bytes = 128;  // the test client's layout
  o.group = "tp-kill";
  o.group_rank = 0;
  o.group_size = 2;
  Session rank0;
  ASSERT_TRUE(Session::Open(o, &rank0).ok()) << hs_last_error();
  constexpr int kRequests = 6;
  const auto rank1 = TestClient::Start({address, "group", "tp-kill", "1", "2", std::to_string(kRequests)});
  ASSERT_NE(rank1, nullptr);
  const uint64_t one_copy = Stats(address).host_pool().used_bytes();
  EXPECT_EQ(one_copy, uint64_t{kRequests} * 4 * ((1000 * 128 + 4095) / 4096) * 4096);
  for (uint64_t id = 1; id <= kRequests; ++id) {
    ASSERT_TRUE(rank0.AdmitGroup(id, 100, 1000).ok()) << hs_last_error();
    void* rec = nullptr;
    ASSERT_TRUE(rank0.RecordPtr(id, 0, 0, &rec).ok());
    EXPECT_EQ(static_cast<uint8_t*>(rec)[127], 0xAB);  // written by the other process's rank
  }
  EXPECT_EQ(Stats(address).host_pool().used_bytes(), one_copy);
  rank1->Kill();
  ASSERT_TRUE(WaitUntil([&] { return Stats(address).sessions() == 1; }));
  const v1::StatsResponse st = Stats(address);
  EXPECT_EQ(st.host_pool().used_bytes(), one_copy);  // rank 0 holds every request still
  ASSERT_EQ(st.groups_size(), 1);
  EXPECT_EQ(st.groups(0).shares(), static_cast<uint32_t>(kRequests));
  EXPECT_EQ(st.groups(0).rank_sessions(1), 0u);
  for (uint64_t id = 1; id <= kRequests; ++id) {
    void* rec = nullptr;
    ASSERT_TRUE(rank0.RecordPtr(id, 0, 0, &rec).ok());
    EXPECT_EQ(static_cast<uint8_t*>(rec)[0], 0xAB);
  }
  hs_request_info info = HS_REQUEST_INFO_INIT;
  EXPECT_EQ(hs_admit_group(rank0.get(), 99, 10, 64, &info), HS_ERR_FAILED_PRECONDITION);  // rank 1 is gone
  for (uint64_t id = 1; id <= kRequests; ++id) ASSERT_TRUE(rank0.Release(id).ok());
  EXPECT_EQ(Stats(address).host_pool().used_bytes(), 0u);
}

}  // namespace tp_group_test
}  // namespace hisparse::testing
