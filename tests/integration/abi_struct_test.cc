// The C ABI's size-prefixed structs against a real daemon, one test per struct: each accepts any
// struct_size from its first version's up and refuses a smaller one with HS_ERR_INVALID_ARGUMENT;
// an output struct gets only the bytes its struct_size covers, keeps the caller's struct_size, and
// a newer caller's larger struct is never written past this library's sizeof.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "test_support.h"

namespace hisparse::testing {
namespace abi_struct_test {

// A caller's struct T grown by kExtra bytes (as a newer header would grow it), filled with 0xab.
template <typename T>
struct Grown {
  static constexpr size_t kExtra = 32;
  Grown() {
    std::memset(bytes, 0xab, sizeof(bytes));
    get()->struct_size = sizeof(bytes);
  }
  // An input struct `v` as such a caller passes it: v's fields, the caller's larger struct_size.
  explicit Grown(const T& v) : Grown() {
    *get() = v;
    get()->struct_size = sizeof(bytes);
  }
  T* get() { return reinterpret_cast<T*>(bytes); }
  bool TailUntouched() const {
    for (size_t i = sizeof(T); i < sizeof(bytes); ++i) {
      if (bytes[i] != 0xab) return false;
    }
    return true;
  }
  alignas(T) unsigned char bytes[sizeof(T) + kExtra];
};

class AbiStructTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = StartDaemon();
    ASSERT_NE(daemon_, nullptr);
    address_ = daemon_->address();
    ASSERT_TRUE(Session::Open(SmallGeometry(address_), &session_).ok());
  }
  std::unique_ptr<DaemonProcess> daemon_;
  std::string address_;
  Session session_;
};

TEST_F(AbiStructTest, AbiVersionIsMajorMinor) {
  int major = -1, minor = -1;
  hs_abi_version_get(&major, &minor);
  EXPECT_EQ(major, HS_ABI_VERSION_MAJOR);
  EXPECT_EQ(minor, HS_ABI_VERSION_MINOR);
  EXPECT_EQ(hs_abi_version(), HS_ABI_VERSION);
  EXPECT_EQ(HS_ABI_VERSION, HS_ABI_VERSION_MAJOR);  // what callers of HS_ABI_VERSION always got
  hs_abi_version_get(nullptr, nullptr);             // either may be NULL
  EXPECT_STRNE(hs_version(), "");
}

TEST_F(AbiStructTest, SessionOptionsFromTheFirstVersionUp) {
  // ABI 1.0's struct ends before layer_anchor.
  hs_session_options o = SmallGeometry(address_);
  o.struct_size = offsetof(hs_session_options, layer_anchor);
  hs_session* s = nullptr;
  ASSERT_EQ(hs_session_open(&o, &s), HS_OK) << hs_last_error();
  hs_session_close(s);

  Grown<hs_session_options> grown(SmallGeometry(address_));
  ASSERT_EQ(hs_session_open(grown.get(), &s), HS_OK) << hs_last_error();
  hs_session_close(s);

  // ABI 1.1 .. 1.3 end before draft_tokens (zero: one query token per step).
  o.struct_size = offsetof(hs_session_options, draft_tokens);
  o.draft_tokens = 99;  // past their struct: must not be read
  ASSERT_EQ(hs_session_open(&o, &s), HS_OK) << hs_last_error();
  hs_session_info info = HS_SESSION_INFO_INIT;
  ASSERT_EQ(hs_session_get_info(s, &info), HS_OK);
  EXPECT_EQ(info.draft_tokens, 0u);
  hs_session_close(s);

  o.struct_size = offsetof(hs_session_options, layer_anchor) - 4;
  EXPECT_EQ(hs_session_open(&o, &s), HS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(s, nullptr);
}

TEST_F(AbiStructTest, RequestInfoFromTheFirstVersionUp) {
  Grown<hs_request_info> grown;
  ASSERT_EQ(hs_admit(session_.get(), 1, 10, 100, grown.get()), HS_OK) << hs_last_error();
  EXPECT_EQ(grown.get()->capacity_tokens, 100u);
  EXPECT_EQ(grown.get()->struct_size, sizeof(grown.bytes));  // the caller's, not the library's
  EXPECT_TRUE(grown.TailUntouched());
  Grown<hs_request_info> extended;
  ASSERT_EQ(hs_extend(session_.get(), 1, 200, extended.get()), HS_OK) << hs_last_error();
  EXPECT_EQ(extended.get()->capacity_tokens, 200u);
  EXPECT_EQ(extended.get()->struct_size, sizeof(extended.bytes));
  EXPECT_TRUE(extended.TailUntouched());

  hs_request_info small = HS_REQUEST_INFO_INIT;
  small.struct_size = sizeof(hs_request_info) - 4;
  EXPECT_EQ(hs_admit(session_.get(), 2, 10, 100, &small), HS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(hs_extend(session_.get(), 1, 300, &small), HS_ERR_INVALID_ARGUMENT);
}

TEST_F(AbiStructTest, SessionInfoFromTheFirstVersionUp) {
  Grown<hs_session_info> grown;
  ASSERT_EQ(hs_session_get_info(session_.get(), grown.get()), HS_OK) << hs_last_error();
  EXPECT_EQ(grown.get()->arena_kind, HS_ARENA_HOST);
  EXPECT_EQ(grown.get()->struct_size, sizeof(grown.bytes));
  EXPECT_TRUE(grown.TailUntouched());
  // The first version (before arena_kind) and the refusal below it: control_plane_test.
}

TEST_F(AbiStructTest, StatsFromTheFirstVersionUp) {
  ASSERT_EQ(hs_admit(session_.get(), 1, 10, 100, nullptr), HS_OK) << hs_last_error();
  Grown<hs_stats> grown;
  ASSERT_EQ(hs_stats_get(session_.get(), grown.get()), HS_OK) << hs_last_error();
  EXPECT_EQ(grown.get()->session_requests, 1u);
  EXPECT_EQ(grown.get()->struct_size, sizeof(grown.bytes));  // the caller's, not the library's
  EXPECT_TRUE(grown.TailUntouched());

  hs_stats small = HS_STATS_INIT;
  small.struct_size = sizeof(hs_stats) - 8;
  EXPECT_EQ(hs_stats_get(session_.get(), &small), HS_ERR_INVALID_ARGUMENT);
}

TEST_F(AbiStructTest, SessionTimingsAsTheLibraryKnowsThem) {
  ASSERT_EQ(hs_admit(session_.get(), 1, 10, 100, nullptr), HS_OK) << hs_last_error();
  Grown<hs_session_timings> grown;
  ASSERT_EQ(hs_session_get_timings(session_.get(), grown.get()), HS_OK) << hs_last_error();
  EXPECT_GT(grown.get()->open_total_s, 0.0);
  EXPECT_LE(grown.get()->open_rpc_s, grown.get()->open_total_s);
  EXPECT_GE(grown.get()->slabs_mapped, 1u);  // the admission's slab
  EXPECT_EQ(grown.get()->struct_size, sizeof(grown.bytes));
  EXPECT_TRUE(grown.TailUntouched());

  hs_session_timings small = HS_SESSION_TIMINGS_INIT;
  small.struct_size = sizeof(hs_session_timings) - 8;
  EXPECT_EQ(hs_session_get_timings(session_.get(), &small), HS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(hs_session_get_timings(session_.get(), nullptr), HS_ERR_INVALID_ARGUMENT);
}

TEST_F(AbiStructTest, ResolveArgsFromTheFirstVersionUp) {
  hs_request_info ri = HS_REQUEST_INFO_INIT;
  ASSERT_EQ(hs_admit(session_.get(), 1, 20, 40, &ri), HS_OK) << hs_last_error();
  std::vector<uint8_t> prompt(4 * 20 * 64, 0x11);
  ASSERT_EQ(hs_store(session_.get(), 1, 0, 20, 20, prompt.data(), 20 * 64, 64, nullptr), HS_OK) << hs_last_error();
  const int32_t row = static_cast<int32_t>(ri.row), seq = 20;
  std::vector<int32_t> pos = {19, 0, 1, 2, -1, -1, -1, -1}, out(8, -7);
  // A newer caller's larger struct: the bytes past this library's fields are not read.
  hs_resolve_args a = ResolveArgs(0, 1, &row, &seq, pos.data(), out.data());
  Grown<hs_resolve_args> grown(a);
  ASSERT_EQ(hs_resolve(session_.get(), grown.get()), HS_OK) << hs_last_error();
  EXPECT_NE(out[0], -7);
  EXPECT_EQ(out[4], -1);

  // ABI 1.9's launch flags: the programmatic launch gives the same outputs (the host backend runs
  // in order either way); unknown bits are refused and change nothing.
  std::vector<int32_t> plain = out;
  a.launch_flags = HS_RESOLVE_LAUNCH_PROGRAMMATIC;
  std::fill(out.begin(), out.end(), -7);
  ASSERT_EQ(hs_resolve(session_.get(), &a), HS_OK) << hs_last_error();
  EXPECT_EQ(out, plain);
  // ABI 1.14's beside launch: the same outputs; with the programmatic bit it is refused.
  a.launch_flags = HS_RESOLVE_LAUNCH_BESIDE;
  std::fill(out.begin(), out.end(), -7);
  ASSERT_EQ(hs_resolve(session_.get(), &a), HS_OK) << hs_last_error();
  EXPECT_EQ(out, plain);
  // ABI 1.15's early dependents, alone or with either order: the same outputs.
  for (const uint32_t flags :
       {HS_RESOLVE_LAUNCH_EARLY_DEPENDENTS, HS_RESOLVE_LAUNCH_EARLY_DEPENDENTS | HS_RESOLVE_LAUNCH_PROGRAMMATIC,
        HS_RESOLVE_LAUNCH_EARLY_DEPENDENTS | HS_RESOLVE_LAUNCH_BESIDE}) {
    a.launch_flags = flags;
    std::fill(out.begin(), out.end(), -7);
    ASSERT_EQ(hs_resolve(session_.get(), &a), HS_OK) << flags << ": " << hs_last_error();
    EXPECT_EQ(out, plain) << flags;
  }
  // A refused call names the field in its error and writes nothing.
  auto expect_refused = [&](const char* field, int64_t value) {
    std::fill(out.begin(), out.end(), -7);
    EXPECT_EQ(hs_resolve(session_.get(), &a), HS_ERR_INVALID_ARGUMENT) << field << " " << value;
    EXPECT_NE(std::string(hs_last_error()).find(field), std::string::npos) << hs_last_error();
    EXPECT_EQ(out, std::vector<int32_t>(8, -7)) << field << " " << value;
  };
  for (const uint32_t bad :
       {0x8u, 0xau, HS_RESOLVE_LAUNCH_PROGRAMMATIC | HS_RESOLVE_LAUNCH_BESIDE,
        HS_RESOLVE_LAUNCH_PROGRAMMATIC | HS_RESOLVE_LAUNCH_BESIDE | HS_RESOLVE_LAUNCH_EARLY_DEPENDENTS}) {
    a.launch_flags = bad;
    expect_refused("launch_flags", bad);
  }
  // ABI 1.13's block budget: any budget gives the same outputs; a negative one is refused and
  // changes nothing; ABI 1.12 callers end before it, so what lies there is not read.
  a.launch_flags = 0;
  a.max_blocks = 3;
  std::fill(out.begin(), out.end(), -7);
  ASSERT_EQ(hs_resolve(session_.get(), &a), HS_OK) << hs_last_error();
  EXPECT_EQ(out, plain);
  a.max_blocks = -1;
  expect_refused("max_blocks", -1);
  a.struct_size = offsetof(hs_resolve_args, max_blocks);
  ASSERT_EQ(hs_resolve(session_.get(), &a), HS_OK) << hs_last_error();
  EXPECT_EQ(out, plain);
  a.struct_size = sizeof(hs_resolve_args);
  a.max_blocks = 0;
  // ABI 1.15's consumer warps: any count in [0, 16] gives the same outputs; one outside is refused
  // and changes nothing; ABI 1.14 callers end before it, so what lies there is not read.
  for (const int32_t warps : {1, 16, 0}) {
    a.consumer_warps = warps;
    std::fill(out.begin(), out.end(), -7);
    ASSERT_EQ(hs_resolve(session_.get(), &a), HS_OK) << warps << ": " << hs_last_error();
    EXPECT_EQ(out, plain) << warps;
  }
  for (const int32_t bad : {-1, 17}) {
    a.consumer_warps = bad;
    expect_refused("consumer_warps", bad);
  }
  a.struct_size = offsetof(hs_resolve_args, consumer_warps);
  ASSERT_EQ(hs_resolve(session_.get(), &a), HS_OK) << hs_last_error();
  EXPECT_EQ(out, plain);
  a.struct_size = sizeof(hs_resolve_args);
  a.consumer_warps = 0;
  a.launch_flags = 0x8;  // refused if it were read (0x6 was, before ABI 1.15 made it valid)
  // ABI 1.8 callers end before launch_flags: bits past their struct are not read.
  a.struct_size = offsetof(hs_resolve_args, launch_flags);
  ASSERT_EQ(hs_resolve(session_.get(), &a), HS_OK) << hs_last_error();
  EXPECT_EQ(out, plain);
  a.launch_flags = 0;

  // ABI 1.3 callers end before query_counts: one list per row, as before.
  a.struct_size = offsetof(hs_resolve_args, query_counts);
  a.query_counts = reinterpret_cast<const int32_t*>(8);  // past their struct: must not be read
  std::fill(out.begin(), out.end(), -7);
  ASSERT_EQ(hs_resolve(session_.get(), &a), HS_OK) << hs_last_error();
  EXPECT_NE(out[0], -7);
  a.query_counts = nullptr;

  // ABI 1.0's struct ends before page_table: accepted, and no page table is written.
  std::vector<int32_t> page_table(8, 55);
  a.page_table = page_table.data();  // past that struct_size: not read
  a.page_records = 0;
  a.struct_size = offsetof(hs_resolve_args, page_table);
  out.assign(8, -7);
  ASSERT_EQ(hs_resolve(session_.get(), &a), HS_OK) << hs_last_error();
  EXPECT_NE(out[0], -7);
  EXPECT_EQ(page_table, std::vector<int32_t>(8, 55));

  a.struct_size = offsetof(hs_resolve_args, page_table) - 8;
  EXPECT_EQ(hs_resolve(session_.get(), &a), HS_ERR_INVALID_ARGUMENT);
}

TEST_F(AbiStructTest, StoreIndexedArgsFromTheFirstVersionUp) {  // ABI 1.3
  hs_request_info ri = HS_REQUEST_INFO_INIT;
  ASSERT_EQ(hs_admit(session_.get(), 1, 4, 8, &ri), HS_OK) << hs_last_error();
  std::vector<uint8_t> pool(4 * 8 * 64);
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = static_cast<uint8_t>(i * 7);
  const std::vector<int32_t> index = {5, 0, 7, 2};
  hs_store_indexed_args a = HS_STORE_INDEXED_ARGS_INIT;
  a.request_id = 1;
  a.num_layers = 4;
  a.num_tokens = 4;
  a.seq_len_after = 4;
  a.src_base = pool.data();
  a.src_index = index.data();
  a.src_tokens = 8;
  a.src_layer_stride = 8 * 64;
  a.src_token_stride = 64;
  // A newer caller's larger struct: the bytes past this library's fields are not read.
  Grown<hs_store_indexed_args> grown(a);
  ASSERT_EQ(hs_store_indexed(session_.get(), grown.get()), HS_OK) << hs_last_error();
  void* rec = nullptr;
  ASSERT_EQ(hs_record_ptr(session_.get(), 1, 3, 2, &rec), HS_OK) << hs_last_error();
  EXPECT_EQ(std::memcmp(rec, &pool[(3 * 8 + 7) * 64], 64), 0) << "layer 3, position 2 is pool slot 7";

  a.struct_size = sizeof(hs_store_indexed_args) - 8;
  EXPECT_EQ(hs_store_indexed(session_.get(), &a), HS_ERR_INVALID_ARGUMENT);
}

// ABI 1.19: hs_prewarm reads and writes nothing a caller sees; on the host backend it runs the
// reference, so its checks answer at once: bad arguments launch nothing, bad entries are named.
TEST_F(AbiStructTest, PrewarmArgsFromTheFirstVersionUp) {
  hs_request_info ri = HS_REQUEST_INFO_INIT;
  ASSERT_EQ(hs_admit(session_.get(), 1, 4, 8, &ri), HS_OK) << hs_last_error();
  const int32_t rows[3] = {static_cast<int32_t>(ri.row), -1, static_cast<int32_t>(ri.row)};
  const int32_t lens[3] = {4, 0, 1};
  hs_prewarm_args a = HS_PREWARM_ARGS_INIT;
  a.layer = 3;
  a.max_batch = 3;
  a.rows = rows;
  a.seq_lens = lens;
  Grown<hs_prewarm_args> grown(a);
  ASSERT_EQ(hs_prewarm(session_.get(), grown.get()), HS_OK) << hs_last_error();
  a.granule_bytes = 4096;
  ASSERT_EQ(hs_prewarm(session_.get(), &a), HS_OK) << hs_last_error();

  const int32_t too_long[3] = {static_cast<int32_t>(ri.capacity_tokens) + 1, 0, 1};
  a.seq_lens = too_long;
  EXPECT_EQ(hs_prewarm(session_.get(), &a), HS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hs_last_error()).find("seq_len"), std::string::npos) << hs_last_error();
  const int32_t one = 2;  // the bad entry is past the batch: read nothing, no error
  a.batch_size = &one;
  a.seq_lens = lens;
  const int32_t bad_rows[3] = {static_cast<int32_t>(ri.row), -1, 1000};
  a.rows = bad_rows;
  EXPECT_EQ(hs_prewarm(session_.get(), &a), HS_OK) << hs_last_error();
  a.batch_size = nullptr;
  EXPECT_EQ(hs_prewarm(session_.get(), &a), HS_ERR_INVALID_ARGUMENT);
  a.rows = rows;
  for (uint32_t g : {48u, 8u, 2u << 30}) {
    a.granule_bytes = g;
    EXPECT_EQ(hs_prewarm(session_.get(), &a), HS_ERR_INVALID_ARGUMENT) << g;
    EXPECT_NE(std::string(hs_last_error()).find("granule"), std::string::npos) << hs_last_error();
  }
  a.granule_bytes = 0;
  a.layer = 4;
  EXPECT_EQ(hs_prewarm(session_.get(), &a), HS_ERR_INVALID_ARGUMENT);
  a.layer = 0;
  a.max_blocks = -1;
  EXPECT_EQ(hs_prewarm(session_.get(), &a), HS_ERR_INVALID_ARGUMENT);
  a.max_blocks = 0;
  a.max_batch = 1 << 20;  // past the session's rows
  EXPECT_EQ(hs_prewarm(session_.get(), &a), HS_ERR_INVALID_ARGUMENT);
  a.max_batch = 3;
  a.seq_lens = nullptr;
  EXPECT_EQ(hs_prewarm(session_.get(), &a), HS_ERR_INVALID_ARGUMENT);
  a.seq_lens = lens;
  a.struct_size = sizeof(hs_prewarm_args) - 8;
  EXPECT_EQ(hs_prewarm(session_.get(), &a), HS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(hs_prewarm(nullptr, &a), HS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(hs_prewarm(session_.get(), nullptr), HS_ERR_INVALID_ARGUMENT);
}

// ABI 1.16: hs_topk needs no session. Host memory (device -1) runs the CPU reference; a larger
// caller's struct is read only to this library's sizeof; bad input is refused and writes nothing.
TEST_F(AbiStructTest, TopkArgsFromTheFirstVersionUp) {
  const std::vector<float> scores = {0.5f, 3.0f, -1.0f, 3.0f, 2.0f, 9.0f, 1.0f, 1.0f};  // 2 rows of 4
  const int32_t lens[2] = {4, 2};
  std::vector<int32_t> out(2 * 3, 77);
  hs_topk_args a = HS_TOPK_ARGS_INIT;
  a.max_batch = 2;
  a.k = 3;
  a.cols = 4;
  a.ld = 4;
  a.scores = scores.data();
  a.seq_lens = lens;
  a.positions = out.data();
  Grown<hs_topk_args> grown(a);
  ASSERT_EQ(hs_topk(grown.get()), HS_OK) << hs_last_error();
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 3, 0, 1, -1})) << "row 0: 0.5, 3, 3 ascending; row 1: its first 2";

  std::vector<int32_t> untouched(out.size(), 77);
  out = untouched;
  a.k = 0;
  EXPECT_EQ(hs_topk(&a), HS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hs_last_error()).find("k must"), std::string::npos) << hs_last_error();
  a.k = 3;
  a.ld = 3;
  EXPECT_EQ(hs_topk(&a), HS_ERR_INVALID_ARGUMENT);
  a.ld = 4;
  a.device = -2;
  EXPECT_EQ(hs_topk(&a), HS_ERR_INVALID_ARGUMENT);
  a.device = -1;
  a.struct_size = offsetof(hs_topk_args, after_count) - 8;  // short of ABI 1.16's
  EXPECT_EQ(hs_topk(&a), HS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(hs_topk(nullptr), HS_ERR_INVALID_ARGUMENT);
  // ABI 1.17: after_count is a kernel's count, so host memory refuses it, as it does a negative
  // target; a 1.16 caller's struct ends before them and reads them as NULL and 0.
  const int32_t count = 0;
  a.struct_size = sizeof(hs_topk_args);
  a.after_count = &count;
  EXPECT_EQ(hs_topk(&a), HS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(hs_last_error()).find("after_count"), std::string::npos) << hs_last_error();
  a.after_count = nullptr;
  a.after_target = -1;
  EXPECT_EQ(hs_topk(&a), HS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(out, untouched);
  a.struct_size = offsetof(hs_topk_args, after_count);
  a.after_count = &count;  // past a 1.16 struct: not read
  ASSERT_EQ(hs_topk(&a), HS_OK) << hs_last_error();
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 3, 0, 1, -1}));
}

TEST_F(AbiStructTest, AdmitArgsFromTheFirstVersionUp) {  // ABI 1.10
  hs_admit_args a = HS_ADMIT_ARGS_INIT;
  a.request_id = 1;
  a.token_budget = 100;
  // A newer caller's larger struct: the bytes past this library's fields (0xab, which as flags
  // would be refused) are not read.
  Grown<hs_admit_args> grown(a);
  hs_request_info ri = HS_REQUEST_INFO_INIT;
  ASSERT_EQ(hs_admit2(session_.get(), grown.get(), &ri), HS_OK) << hs_last_error();
  EXPECT_GE(ri.capacity_tokens, 100u);
  EXPECT_TRUE(grown.TailUntouched());

  a.request_id = 2;
  a.struct_size = sizeof(hs_admit_args) - 8;
  EXPECT_EQ(hs_admit2(session_.get(), &a, &ri), HS_ERR_INVALID_ARGUMENT);
}

}  // namespace abi_struct_test
}  // namespace hisparse::testing
