// Speculative decoding through the client library on the host-emulated backend, against memory
// the real daemon sized: a session with draft_tokens = 2 gets 1 + 2 tail slots per (row, layer);
// every step a row appends q = 1..3 tokens (hs_append_tokens), RESOLVEs q selection lists at once
// (hs_resolve_args.query_counts) and then accepts a random number of them, so rejected drafts'
// positions are rewritten (with new bytes) the next step. Every output slot must hold the bytes
// last written for its position, and so must the record that the page table (rule 9, over B + 1 + n
// record slots per (row, layer)) names for it.
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "hisparse/kernels/arena_layout.h"
#include "test_support.h"

namespace hisparse::testing {
namespace speculative_test {

constexpr int kLayers = 4, kRecord = 64, kK = 8, kB = 20, kDraft = 2, kQ = kDraft + 1;

uint8_t Pattern(uint64_t req, uint32_t layer, uint32_t pos, uint32_t gen, uint32_t i) {
  return static_cast<uint8_t>(req * 7 + layer * 13 + pos * 29 + gen * 101 + i);
}

hs_session_options DraftGeometry(const std::string& address) {
  hs_session_options o = SmallGeometry(address);  // 4 layers, 64 B records, k 8
  o.slots = kB;                                   // < (n + 1) * k: overlapping lists fit, disjoint ones are refused
  o.draft_tokens = kDraft;
  return o;
}

TEST(SpeculativeTest, DraftTokensSizeTheArenaAndRandomAcceptanceStaysExact) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const std::string address = daemon->address();
  Session s;
  ASSERT_TRUE(Session::Open(DraftGeometry(address), &s).ok()) << hs_last_error();
  hs_session_info info = HS_SESSION_INFO_INIT;
  ASSERT_TRUE(s.Info(&info).ok());
  EXPECT_EQ(info.draft_tokens, static_cast<uint32_t>(kDraft));
  ArenaGeometry g{8, kLayers, kB, kK, kRecord, kDraft};
  EXPECT_GE(info.arena_bytes, ComputeArenaOffsets(g).total_bytes);  // the daemon sized the tails

  constexpr int kReq = 3, kCtx = 60, kSteps = 30;
  std::vector<int32_t> rows(kReq), committed(kReq, kCtx);
  std::vector<std::vector<uint32_t>> gen(kReq, std::vector<uint32_t>(kCtx + kSteps * kQ + kQ, 0));
  for (int r = 0; r < kReq; ++r) {
    hs_request_info ri = HS_REQUEST_INFO_INIT;
    ASSERT_TRUE(s.Admit(r + 1, kCtx, kCtx + kSteps * kQ + kQ, &ri).ok());
    rows[r] = ri.row;
    std::vector<uint8_t> prompt(kLayers * kCtx * kRecord);
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint32_t p = 0; p < kCtx; ++p)
        for (uint32_t i = 0; i < kRecord; ++i) prompt[(l * kCtx + p) * kRecord + i] = Pattern(r + 1, l, p, 0, i);
    ASSERT_EQ(hs_store(s.get(), r + 1, 0, kCtx, kCtx, prompt.data(), kCtx * kRecord, kRecord, nullptr), HS_OK)
        << hs_last_error();
  }
  std::mt19937 rng(11);
  std::vector<int32_t> pos(kReq * kQ * kK), out(kReq * kQ * kK), table(kReq * kQ * kK), seq(kReq), q(kReq);
  std::vector<uint8_t> src(kReq * kQ * kRecord);
  int multi = 0;
  for (int step = 1; step <= kSteps; ++step) {
    for (int r = 0; r < kReq; ++r) {
      q[r] = 1 + static_cast<int32_t>(rng() % kQ);
      seq[r] = committed[r] + q[r];
      for (int t = 0; t < q[r]; ++t) gen[r][committed[r] + t] = step;  // rewrites rejected drafts
      multi += q[r] > 1;
    }
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (int r = 0; r < kReq; ++r)
        for (int t = 0; t < q[r]; ++t)
          for (uint32_t i = 0; i < kRecord; ++i) {
            const int32_t p = committed[r] + t;
            src[(r * kQ + t) * kRecord + i] = Pattern(r + 1, l, p, gen[r][p], i);
          }
      ASSERT_EQ(
          hs_append_tokens(s.get(), l, kReq, nullptr, rows.data(), seq.data(), q.data(), src.data(), kRecord, nullptr),
          HS_OK)
          << hs_last_error();
      std::fill(pos.begin(), pos.end(), -1);
      for (int r = 0; r < kReq; ++r) {
        std::vector<int32_t> prev;
        for (int t = 0; t < q[r]; ++t) {
          const int32_t len = committed[r] + t + 1;    // query t selects over [0, len)
          std::vector<int32_t> sel = {len - 1, 3, 4};  // its own token and a hot set
          for (int32_t p : prev)
            if (sel.size() < kK - 1 && std::find(sel.begin(), sel.end(), p) == sel.end()) sel.push_back(p);
          while (sel.size() < kK - 1) {
            const int32_t p = static_cast<int32_t>(rng() % len);
            if (std::find(sel.begin(), sel.end(), p) == sel.end()) sel.push_back(p);
          }
          prev = sel;
          std::copy(sel.begin(), sel.end(), pos.begin() + (r * kQ + t) * kK);  // last entry: padding
        }
      }
      hs_resolve_args a = ResolveArgs(l, kReq, rows.data(), seq.data(), pos.data(), out.data());
      a.query_counts = q.data();
      a.page_table = table.data();  // odd layers: pages of 4 records from page 3
      a.page_records = l % 2 ? 4 : 1;
      a.page_offset = l % 2 ? 3 : 0;
      ASSERT_TRUE(s.Resolve(a).ok()) << hs_last_error();
      for (int r = 0; r < kReq; ++r) {
        for (int x = 0; x < kQ * kK; ++x) {
          const int32_t p = pos[r * kQ * kK + x], slot = out[r * kQ * kK + x];
          const int32_t entry = table[r * kQ * kK + x];
          if (p < 0) {
            ASSERT_EQ(slot, -1);
            ASSERT_EQ(entry, -1);
            continue;
          }
          const int64_t first = int64_t{a.page_offset} * a.page_records;
          ASSERT_EQ(entry, first + (static_cast<int64_t>(rows[r]) * kLayers + l) * (kB + kQ) + slot)
              << "page table: the record index over B + 1 + n slots per (row, layer)";
          ASSERT_GE(slot, 0);
          ASSERT_LT(slot, kB + kQ);
          if (p >= committed[r]) {
            ASSERT_EQ(slot, kB + p - committed[r]) << "query token t lives in tail slot B + t";
          }
          const uint8_t* rec = static_cast<const uint8_t*>(info.slot_base) + (entry - first) * info.record_stride;
          for (uint32_t i = 0; i < kRecord; ++i)
            ASSERT_EQ(rec[i], Pattern(r + 1, l, p, gen[r][p], i)) << "step " << step << " position " << p;
        }
      }
    }
    for (int r = 0; r < kReq; ++r) committed[r] += 1 + static_cast<int32_t>(rng() % q[r]);  // accepted
  }
  EXPECT_GT(multi, 20);
}

TEST(SpeculativeTest, BadDraftInputIsRefusedWithItsReason) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const std::string address = daemon->address();
  hs_session_options too_many = DraftGeometry(address);
  too_many.draft_tokens = kMaxDraftTokens + 1;
  Session refused;
  Error e = Session::Open(too_many, &refused);
  EXPECT_EQ(e.code, HS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(e.message.find("draft_tokens"), std::string::npos) << e.message;

  Session s;
  ASSERT_TRUE(Session::Open(DraftGeometry(address), &s).ok()) << hs_last_error();
  hs_request_info ri = HS_REQUEST_INFO_INIT;
  ASSERT_TRUE(s.Admit(1, 40, 80, &ri).ok());
  std::vector<uint8_t> prompt(kLayers * 40 * kRecord, 1);
  ASSERT_EQ(hs_store(s.get(), 1, 0, 40, 40, prompt.data(), 40 * kRecord, kRecord, nullptr), HS_OK);
  std::vector<int32_t> pos(kQ * kK, -1), out(kQ * kK, 7);
  int32_t row = ri.row, seq = 42, count = kQ + 1;
  hs_resolve_args a = ResolveArgs(0, 1, &row, &seq, pos.data(), out.data());
  a.query_counts = &count;
  e = s.Resolve(a);  // four queries for draft_tokens 2
  EXPECT_EQ(e.code, HS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(e.message.find("query or token count"), std::string::npos) << e.message;
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](int32_t v) { return v == -1; }));
  // Three disjoint lists of 8: a union of 24 > B = 20.
  count = kQ;
  for (int x = 0; x < kQ * kK; ++x) pos[x] = x;
  e = s.Resolve(a);
  EXPECT_EQ(e.code, HS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(e.message.find("union"), std::string::npos) << e.message;
  hs_stats st = HS_STATS_INIT;
  ASSERT_TRUE(s.Stats(&st).ok());
  EXPECT_EQ(st.hits + st.misses, 0u);  // refused rows count nothing
  std::vector<uint8_t> src((kQ + 1) * kRecord, 3);
  count = kQ + 1;  // appends, too, take at most draft_tokens + 1 tokens
  EXPECT_NE(hs_append_tokens(s.get(), 0, 1, nullptr, &row, &seq, &count, src.data(), kRecord, nullptr), HS_OK);
  EXPECT_NE(std::string(hs_last_error()).find("query or token count"), std::string::npos) << hs_last_error();
  count = 0;
  EXPECT_NE(hs_append_tokens(s.get(), 0, 1, nullptr, &row, &seq, &count, src.data(), kRecord, nullptr), HS_OK);
  count = kQ;  // a valid append still works
  EXPECT_EQ(hs_append_tokens(s.get(), 0, 1, nullptr, &row, &seq, &count, src.data(), kRecord, nullptr), HS_OK)
      << hs_last_error();
  // The page table (rule 9) of a multi-query step: shaped like out_slots, -1 in padded query rows,
  // tail slot B + t of query token t included; a refused row's table is -1 throughout.
  std::vector<int32_t> table(kQ * kK, 77);
  count = 2;
  seq = 42;
  for (int x = 0; x < kQ * kK; ++x) pos[x] = x < kK ? x : (x < 2 * kK ? 41 - (x - kK) : 5);
  a.out_slots = nullptr;  // the page table alone
  a.page_table = table.data();
  a.page_records = 1;
  e = s.Resolve(a);
  ASSERT_EQ(e.code, HS_OK) << e.message;
  const int32_t base = (ri.row * kLayers + 0) * (kB + kQ);
  EXPECT_EQ(table[kK + 0], base + kB + 1) << "query token 1 (position 41) is in tail slot B + 1";
  EXPECT_EQ(table[kK + 1], base + kB + 0) << "query token 0 (position 40) is in tail slot B";
  for (int x = 0; x < 2 * kK; ++x) {
    EXPECT_GE(table[x], base);
    EXPECT_LT(table[x], base + kB + kQ);
  }
  EXPECT_EQ(std::vector<int32_t>(table.begin() + 2 * kK, table.end()), std::vector<int32_t>(kK, -1));
  for (int x = 0; x < kQ * kK; ++x) pos[x] = x;  // the refused union of 24 again
  count = kQ;
  e = s.Resolve(a);
  EXPECT_EQ(e.code, HS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(table, std::vector<int32_t>(kQ * kK, -1));
}

}  // namespace speculative_test
}  // namespace hisparse::testing
