// The data path through the client library on the host-emulated backend, against memory the real
// daemon owns: prefill store, decode append, RESOLVE; every output slot's bytes equal the host
// record of its position, and the daemon's stats show the arena's counters.
#include <cstring>
#include <random>

#include "gtest/gtest.h"
#include "test_support.h"

namespace hisparse::testing {
namespace data_path_test {

uint8_t Pattern(uint64_t req, uint32_t layer, uint32_t pos, uint32_t i) {
  return static_cast<uint8_t>(req * 7 + layer * 13 + pos * 29 + i);
}

TEST(DataPathTest, StoreAppendResolveAreExactThroughTheDaemonsMemory) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const std::string address = daemon->address();
  hs_session_options o = SmallGeometry(address);  // 4 layers, 64 B records, k 8, B 16
  Session s;
  ASSERT_TRUE(Session::Open(o, &s).ok());
  hs_session_info info;
  ASSERT_TRUE(s.Info(&info).ok());
  EXPECT_EQ(info.backend, HS_BACKEND_HOST);

  constexpr int kReq = 3, kCtx = 200, kSteps = 40;
  std::vector<int32_t> rows(kReq), seq(kReq, kCtx);
  for (int r = 0; r < kReq; ++r) {
    hs_request_info ri = HS_REQUEST_INFO_INIT;
    ASSERT_TRUE(s.Admit(r + 1, kCtx, kCtx + kSteps, &ri).ok());
    rows[r] = ri.row;
    std::vector<uint8_t> prompt(4 * kCtx * 64);
    for (uint32_t l = 0; l < 4; ++l)
      for (uint32_t p = 0; p < kCtx; ++p)
        for (uint32_t i = 0; i < 64; ++i) prompt[(l * kCtx + p) * 64 + i] = Pattern(r + 1, l, p, i);
    ASSERT_EQ(hs_store(s.get(), r + 1, 0, kCtx, kCtx, prompt.data(), kCtx * 64, 64, nullptr), HS_OK) << hs_last_error();
  }
  std::mt19937 rng(5);
  std::vector<int32_t> pos(kReq * 8), out(kReq * 8);
  std::vector<uint8_t> newest(kReq * 64);
  for (int step = 0; step < kSteps; ++step) {
    for (int r = 0; r < kReq; ++r) ++seq[r];
    for (uint32_t l = 0; l < 4; ++l) {
      for (int r = 0; r < kReq; ++r)
        for (uint32_t i = 0; i < 64; ++i) newest[r * 64 + i] = Pattern(r + 1, l, seq[r] - 1, i);
      ASSERT_EQ(hs_append(s.get(), l, kReq, nullptr, rows.data(), seq.data(), newest.data(), 64, nullptr), HS_OK)
          << hs_last_error();
      for (int r = 0; r < kReq; ++r) {
        // Newest token, a sticky hot set, and random positions; the last entry is padding.
        std::vector<int32_t> sel = {seq[r] - 1, 3, 4, 5};
        while (sel.size() < 7) {
          int32_t p = static_cast<int32_t>(rng() % seq[r]);
          if (std::find(sel.begin(), sel.end(), p) == sel.end()) sel.push_back(p);
        }
        sel.push_back(-1);
        std::copy(sel.begin(), sel.end(), pos.begin() + r * 8);
      }
      hs_resolve_args a = ResolveArgs(l, kReq, rows.data(), seq.data(), pos.data(), out.data());
      ASSERT_TRUE(s.Resolve(a).ok()) << hs_last_error();
      for (int r = 0; r < kReq; ++r) {
        for (int j = 0; j < 8; ++j) {
          const int32_t p = pos[r * 8 + j], slot = out[r * 8 + j];
          if (p < 0) {
            EXPECT_EQ(slot, -1);
            continue;
          }
          ASSERT_GE(slot, 0);
          ASSERT_LE(slot, 16);
          if (p == seq[r] - 1) {
            EXPECT_EQ(slot, 16) << "the newest token lives in slot B";
          }
          const uint8_t* rec = static_cast<const uint8_t*>(info.slot_base) +
                               ((static_cast<size_t>(rows[r]) * 4 + l) * 17 + slot) * info.record_stride;
          for (uint32_t i = 0; i < 64; ++i) ASSERT_EQ(rec[i], Pattern(r + 1, l, p, i)) << "step " << step;
        }
      }
    }
  }
  // A bad selection is refused with a message and changes nothing.
  pos[0] = 100000;
  hs_resolve_args a = ResolveArgs(0, kReq, rows.data(), seq.data(), pos.data(), out.data());
  Error e = s.Resolve(a);
  EXPECT_EQ(e.code, HS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(e.message.find("position"), std::string::npos) << e.message;

  // The daemon reads RESOLVE's counters from the shared arena.
  hs_stats st;
  ASSERT_TRUE(s.Stats(&st).ok());
  // Every step's selections, plus the two valid rows of the refused call (other rows proceed).
  EXPECT_EQ(st.hits + st.misses, uint64_t{kSteps} * 4 * kReq * 7 + (kReq - 1) * 7);
  EXPECT_GT(st.hits, 0u);
  EXPECT_GT(st.misses, 0u);
  EXPECT_EQ(st.bytes_fetched, st.misses * 64);
  // ... and the daemon itself reports the same numbers for this session.
  v1::StatsResponse node = Stats(address);
  ASSERT_EQ(node.session_stats_size(), 1);
  EXPECT_EQ(node.session_stats(0).hits(), st.hits);
  EXPECT_EQ(node.session_stats(0).misses(), st.misses);
  // The refused row is counted in the arena, and the daemon reports it (the
  // hisparse_resolve_rejected_rows_total its alert watches).
  EXPECT_EQ(node.session_stats(0).rejected(), 1u);
}

TEST(DataPathTest, ShortPromptIsResidentAfterPrefill) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const std::string address = daemon->address();
  Session s;
  ASSERT_TRUE(Session::Open(SmallGeometry(address), &s).ok());
  hs_request_info ri = HS_REQUEST_INFO_INIT;
  ASSERT_TRUE(s.Admit(1, 12, 100, &ri).ok());
  std::vector<uint8_t> prompt(4 * 12 * 64, 0x11);
  ASSERT_EQ(hs_store(s.get(), 1, 0, 12, 12, prompt.data(), 12 * 64, 64, nullptr), HS_OK) << hs_last_error();
  int32_t row = ri.row, seq = 12;
  std::vector<int32_t> pos = {0, 1, 2, 3, 4, 5, 6, 7}, out(8);
  hs_stats before;
  ASSERT_TRUE(s.Stats(&before).ok());
  hs_resolve_args a = ResolveArgs(0, 1, &row, &seq, pos.data(), out.data());
  ASSERT_TRUE(s.Resolve(a).ok()) << hs_last_error();
  EXPECT_EQ(out, pos) << "with seq_len <= B, position p lives in slot p";
  hs_stats after;
  ASSERT_TRUE(s.Stats(&after).ok());
  EXPECT_EQ(after.misses - before.misses, 0u);
}

}  // namespace data_path_test
}  // namespace hisparse::testing
