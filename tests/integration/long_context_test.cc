// The paged host pool end to end (issue 17), through the client library against a real daemon:
// - a 1M-token request (656-byte records, two layers) admits, stores in chunks, resolves at
//   positions spread over the whole context exactly, and hs_record_ptr finds every record by page
//   lookup. HISPARSE_LONG_CONTEXT_TOKENS lowers the context (default 1,048,576: ~1.3 GiB of pool);
// - the shipped default pool serves many sessions at once.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "test_support.h"

namespace hisparse::testing {
namespace long_context_test {

constexpr uint32_t kRecord = 656;
constexpr uint32_t kLayers = 2;
constexpr uint32_t kRecordsPerPage = 4096;  // a page of 2,686,976 B holds whole records
constexpr uint64_t kPageBytes = uint64_t{kRecord} * kRecordsPerPage;
constexpr int kK = 8, kSlots = 16;

uint8_t Pattern(uint32_t layer, uint32_t pos, uint32_t i) {
  return static_cast<uint8_t>(layer * 101 + pos * 31 + (pos >> 8) * 7 + (pos >> 16) * 3 + i);
}

uint32_t ContextTokens() {
  const char* env = std::getenv("HISPARSE_LONG_CONTEXT_TOKENS");
  return env != nullptr ? static_cast<uint32_t>(std::strtoul(env, nullptr, 10)) : (1u << 20);
}

TEST(LongContextTest, AMillionTokenRequestAdmitsStoresAndResolvesExactly) {
  const uint32_t tokens = ContextTokens();
  ASSERT_GE(tokens, 2u * kSlots);
  const uint64_t pages = (uint64_t{tokens} + kRecordsPerPage - 1) / kRecordsPerPage;  // per layer
  // One slab per layer (a layer's pages then lie in one run, which today's backends read).
  auto daemon =
      StartDaemon({"--host-pool-size", std::to_string(kLayers * pages * kPageBytes), "--host-pool-page-size",
                   std::to_string(kPageBytes), "--host-pool-slab-size", std::to_string(pages * kPageBytes), "--set",
                   "host_pool.reserve_slabs=0", "--set", "limits.max_tokens_per_request=" + std::to_string(tokens)});
  ASSERT_NE(daemon, nullptr);
  hs_session_options o = SmallGeometry(daemon->address());
  o.num_layers = kLayers;
  o.record_bytes = kRecord;
  o.k = kK;
  o.slots = kSlots;
  o.max_requests = 1;
  Session s;
  ASSERT_TRUE(Session::Open(o, &s).ok()) << hs_last_error();
  hs_session_info info;
  ASSERT_TRUE(s.Info(&info).ok());
  EXPECT_GE(info.max_tokens_per_request, tokens);
  hs_request_info ri = HS_REQUEST_INFO_INIT;
  ASSERT_TRUE(s.Admit(1, tokens, tokens, &ri).ok()) << hs_last_error();
  EXPECT_EQ(ri.capacity_tokens, tokens);
  v1::StatsResponse st = Stats(daemon->address());
  EXPECT_EQ(st.host_pool().pages_used(), kLayers * pages);
  EXPECT_EQ(st.host_pool().used_bytes(), kLayers * pages * kPageBytes);

  // Prefill in chunks of 64k tokens.
  constexpr uint32_t kChunk = 1u << 16;
  std::vector<uint8_t> chunk(uint64_t{kLayers} * kChunk * kRecord);
  for (uint32_t start = 0; start < tokens; start += kChunk) {
    const uint32_t n = std::min(kChunk, tokens - start);
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t t = 0; t < n; ++t) {
        uint8_t* rec = chunk.data() + (uint64_t{l} * kChunk + t) * kRecord;
        for (uint32_t i = 0; i < kRecord; ++i) rec[i] = Pattern(l, start + t, i);
      }
    }
    ASSERT_EQ(hs_store(s.get(), 1, static_cast<int32_t>(start), static_cast<int32_t>(n),
                       static_cast<int32_t>(start + n), chunk.data(), int64_t{kChunk} * kRecord, kRecord, nullptr),
              HS_OK)
        << hs_last_error();
  }
  // hs_record_ptr: page p / R at (p % R) * record_bytes, at every page boundary and the ends.
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint64_t page = 0; page < pages; ++page) {
      for (uint64_t p : {page * kRecordsPerPage, page * kRecordsPerPage + kRecordsPerPage - 1}) {
        if (p >= tokens) continue;
        void* ptr = nullptr;
        ASSERT_TRUE(s.RecordPtr(1, l, static_cast<uint32_t>(p), &ptr).ok()) << hs_last_error();
        const auto* rec = static_cast<const uint8_t*>(ptr);
        for (uint32_t i = 0; i < kRecord; ++i) {
          ASSERT_EQ(rec[i], Pattern(l, static_cast<uint32_t>(p), i)) << "layer " << l << " position " << p;
        }
      }
    }
  }
  void* past = nullptr;
  EXPECT_EQ(s.RecordPtr(1, 0, tokens, &past).code, HS_ERR_INVALID_ARGUMENT);

  // RESOLVE at positions spread over the whole context: each step misses nearly everywhere.
  std::mt19937 rng(17);
  int32_t row = static_cast<int32_t>(ri.row), seq = static_cast<int32_t>(tokens);
  std::vector<int32_t> pos(kK), out(kK);
  for (int step = 0; step < 8; ++step) {
    for (uint32_t l = 0; l < kLayers; ++l) {
      pos[0] = seq - 1;
      for (int j = 1; j < kK; ++j) {
        int32_t p;
        do {
          p = static_cast<int32_t>(rng() % static_cast<uint32_t>(seq - 1));
        } while (std::find(pos.begin(), pos.begin() + j, p) != pos.begin() + j);
        pos[j] = p;
      }
      hs_resolve_args a = ResolveArgs(l, 1, &row, &seq, pos.data(), out.data());
      ASSERT_TRUE(s.Resolve(a).ok()) << hs_last_error();
      for (int j = 0; j < kK; ++j) {
        ASSERT_GE(out[j], 0);
        ASSERT_LE(out[j], kSlots);
        const uint8_t* rec = static_cast<const uint8_t*>(info.slot_base) +
                             ((static_cast<size_t>(row) * kLayers + l) * (kSlots + 1) + out[j]) * info.record_stride;
        for (uint32_t i = 0; i < kRecord; ++i) {
          ASSERT_EQ(rec[i], Pattern(l, static_cast<uint32_t>(pos[j]), i)) << "layer " << l << " position " << pos[j];
        }
      }
    }
  }
  ASSERT_TRUE(s.Release(1).ok());
  st = Stats(daemon->address());
  EXPECT_EQ(st.host_pool().pages_used(), 0u);
  EXPECT_EQ(st.host_pool().used_bytes(), 0u);
}

// The shipped default pool (1 GiB, 256 KiB pages) serves many tenants at once: the segmented pool
// (4 segments of 256 MiB) refused every session past the fourth with RESOURCE_EXHAUSTED.
TEST(ManyTenantsTest, TheDefaultPoolServesManySessionsAtOnce) {
  constexpr int kSessions = 128;
  auto daemon = StartDaemon({"--host-pool-size", "1GiB"});
  ASSERT_NE(daemon, nullptr);
  hs_session_options o = SmallGeometry(daemon->address());
  o.num_layers = 1;
  o.max_requests = 1;
  std::vector<Session> sessions(kSessions);
  for (int i = 0; i < kSessions; ++i) {
    ASSERT_TRUE(Session::Open(o, &sessions[i]).ok()) << "session " << i << ": " << hs_last_error();
    hs_request_info ri = HS_REQUEST_INFO_INIT;
    const Error e = sessions[i].Admit(1, 100, 1000, &ri);
    ASSERT_TRUE(e.ok()) << "session " << i << ": " << e.message;
  }
  v1::StatsResponse st = Stats(daemon->address());
  EXPECT_EQ(st.requests(), static_cast<uint32_t>(kSessions));
  EXPECT_EQ(st.host_pool().pages_used(), static_cast<uint64_t>(kSessions));  // a 256 KiB page each
  EXPECT_EQ(st.host_pool().slabs(), static_cast<uint32_t>(kSessions));
  EXPECT_EQ(st.host_pool().used_bytes(), uint64_t{kSessions} << 18);
  for (Session& s : sessions) ASSERT_TRUE(s.Release(1).ok());
  st = Stats(daemon->address());
  EXPECT_EQ(st.host_pool().pages_used(), 0u);
  EXPECT_EQ(st.host_pool().slabs(), static_cast<uint32_t>(kSessions));  // idle, each its session's
  sessions.clear();
  // Ended sessions' slabs are dropped by the pool's worker; the pool ends empty and exact.
  ASSERT_TRUE(WaitUntil([&] {
    st = Stats(daemon->address());
    return st.host_pool().scrub_queue() == 0 && st.host_pool().slabs() == 0;
  }));
  EXPECT_EQ(st.host_pool().pages_used(), 0u);
  EXPECT_EQ(st.host_pool().used_bytes(), 0u);
  EXPECT_EQ(st.host_pool().free_bytes(), st.host_pool().capacity_bytes());
}

}  // namespace long_context_test
}  // namespace hisparse::testing
