// hs_store_indexed through the client library on the host-emulated backend, against memory the
// real daemon owns: a request prefilled by index from a paged KV pool (chunks, layer ranges) ends
// byte-identical to one prefilled with hs_store from a contiguous buffer, RESOLVE serves both the
// same, and every bad argument is refused with its code, writing nothing.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "test_support.h"

namespace hisparse::testing {
namespace indexed_store_test {

constexpr uint32_t kLayers = 4, kRb = 64, kB = 16;
constexpr int32_t kCtx = 40, kPoolTokens = 128;
constexpr int64_t kPoolStride = kRb + 16;  // the engine pads its pool's records

uint8_t Pattern(uint32_t layer, uint32_t pos, uint32_t i, uint32_t gen) {
  return static_cast<uint8_t>(layer * 13 + pos * 29 + i * 3 + gen * 101);
}

// The engine's paged pool: [layers][kPoolTokens] records; position p of the request lives in
// pool slot slot[p] (scattered pages).
struct Pool {
  explicit Pool(uint32_t gen, uint32_t seed) : bytes(kLayers * kPoolTokens * kPoolStride, 0xcd), slot(kPoolTokens) {
    std::iota(slot.begin(), slot.end(), 0);
    std::mt19937 rng(seed);
    std::shuffle(slot.begin(), slot.end(), rng);
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (int32_t p = 0; p < kCtx; ++p) {
        for (uint32_t i = 0; i < kRb; ++i) At(l, slot[p])[i] = Pattern(l, p, i, gen);
      }
    }
  }
  uint8_t* At(uint32_t layer, int32_t s) { return &bytes[(layer * kPoolTokens + s) * kPoolStride]; }
  std::vector<uint8_t> bytes;
  std::vector<int32_t> slot;
};

hs_store_indexed_args Args(uint64_t id, Pool& pool, const int32_t* index, uint32_t first_layer, uint32_t num_layers,
                           int32_t start, int32_t n, int32_t after) {
  hs_store_indexed_args a = HS_STORE_INDEXED_ARGS_INIT;
  a.request_id = id;
  a.first_layer = first_layer;
  a.num_layers = num_layers;
  a.start_pos = start;
  a.num_tokens = n;
  a.seq_len_after = after;
  a.src_base = pool.At(first_layer, 0);
  a.src_index = index;
  a.src_tokens = kPoolTokens;
  a.src_layer_stride = kPoolTokens * kPoolStride;
  a.src_token_stride = kPoolStride;
  return a;
}

// Every host record of the request, every layer, positions [0, kCtx).
std::vector<uint8_t> HostRecords(Session& s, uint64_t id) {
  std::vector<uint8_t> all;
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (int32_t p = 0; p < kCtx; ++p) {
      void* rec = nullptr;
      EXPECT_EQ(hs_record_ptr(s.get(), id, l, p, &rec), HS_OK) << hs_last_error();
      const uint8_t* b = static_cast<const uint8_t*>(rec);
      all.insert(all.end(), b, b + kRb);
    }
  }
  return all;
}

// The slot records (slots 0..B) of every layer of `row`.
std::vector<uint8_t> SlotRecords(const hs_session_info& info, int32_t row) {
  const uint8_t* base = static_cast<const uint8_t*>(info.slot_base);
  const size_t per_row = kLayers * (kB + 1) * info.record_stride;
  return std::vector<uint8_t>(base + row * per_row, base + (row + 1) * per_row);
}

class IndexedStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = StartDaemon();
    ASSERT_NE(daemon_, nullptr);
    address_ = daemon_->address();
    ASSERT_TRUE(Session::Open(SmallGeometry(address_), &s_).ok());  // 4 layers, 64 B, k 8, B 16
    ASSERT_TRUE(s_.Info(&info_).ok());
    for (uint64_t id : {1, 2}) {
      hs_request_info ri = HS_REQUEST_INFO_INIT;
      ASSERT_TRUE(s_.Admit(id, kCtx, kCtx + 8, &ri).ok());
      rows_.push_back(static_cast<int32_t>(ri.row));
    }
  }
  std::unique_ptr<DaemonProcess> daemon_;
  std::string address_;
  Session s_;
  hs_session_info info_ = HS_SESSION_INFO_INIT;
  std::vector<int32_t> rows_;
};

TEST_F(IndexedStoreTest, EqualsThePlainStoreOfTheSameRecords) {
  Pool pool(1, 42);
  // Request 1 by index: a short first chunk (resident, seq 10 <= B), then the rest in two layer
  // ranges. Request 2 the plain way, from a contiguous copy of the same records.
  ASSERT_EQ(hs_store_indexed(s_.get(), nullptr), HS_ERR_INVALID_ARGUMENT);
  hs_store_indexed_args a = Args(1, pool, pool.slot.data(), 0, kLayers, 0, 10, 10);
  ASSERT_EQ(hs_store_indexed(s_.get(), &a), HS_OK) << hs_last_error();
  a = Args(1, pool, pool.slot.data() + 10, 0, 2, 10, kCtx - 10, kCtx);
  ASSERT_EQ(hs_store_indexed(s_.get(), &a), HS_OK) << hs_last_error();
  a = Args(1, pool, pool.slot.data() + 10, 2, 2, 10, kCtx - 10, kCtx);
  ASSERT_EQ(hs_store_indexed(s_.get(), &a), HS_OK) << hs_last_error();
  std::vector<uint8_t> flat(kLayers * kCtx * kRb);
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (int32_t p = 0; p < kCtx; ++p) std::memcpy(&flat[(l * kCtx + p) * kRb], pool.At(l, pool.slot[p]), kRb);
  }
  ASSERT_EQ(hs_store(s_.get(), 2, 0, 10, 10, flat.data(), kCtx * kRb, kRb, nullptr), HS_OK) << hs_last_error();
  ASSERT_EQ(hs_store(s_.get(), 2, 10, kCtx - 10, kCtx, flat.data() + 10 * kRb, kCtx * kRb, kRb, nullptr), HS_OK)
      << hs_last_error();

  const std::vector<uint8_t> host1 = HostRecords(s_, 1);
  EXPECT_EQ(host1, HostRecords(s_, 2));
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (int32_t p = 0; p < kCtx; ++p) {
      for (uint32_t i = 0; i < kRb; ++i) {
        ASSERT_EQ(host1[(l * kCtx + p) * kRb + i], Pattern(l, p, i, 1)) << "layer " << l << " position " << p;
      }
    }
  }
  EXPECT_EQ(SlotRecords(info_, rows_[0]), SlotRecords(info_, rows_[1]));

  // RESOLVE of both with the same selection: the same slots, holding the same bytes.
  std::vector<int32_t> seq = {kCtx, kCtx}, pos = {kCtx - 1, 3, 17, 25, 33, 4, 12, -1};
  pos.insert(pos.end(), pos.begin(), pos.end());
  for (uint32_t l = 0; l < kLayers; ++l) {
    std::vector<int32_t> out(16, 99);
    hs_resolve_args r = HS_RESOLVE_ARGS_INIT;
    r.layer = l;
    r.max_batch = 2;
    r.rows = rows_.data();
    r.seq_lens = seq.data();
    r.positions = pos.data();
    r.out_slots = out.data();
    ASSERT_TRUE(s_.Resolve(r).ok()) << hs_last_error();
    EXPECT_EQ(std::vector<int32_t>(out.begin(), out.begin() + 8), std::vector<int32_t>(out.begin() + 8, out.end()));
  }
  EXPECT_EQ(SlotRecords(info_, rows_[0]), SlotRecords(info_, rows_[1]));
}

TEST_F(IndexedStoreTest, BadInputIsRefusedAndWritesNothing) {
  Pool pool(1, 7);
  hs_store_indexed_args a = Args(1, pool, pool.slot.data(), 0, kLayers, 0, kCtx, kCtx);
  ASSERT_EQ(hs_store_indexed(s_.get(), &a), HS_OK) << hs_last_error();
  const std::vector<uint8_t> host = HostRecords(s_, 1);
  const std::vector<uint8_t> slots = SlotRecords(info_, rows_[0]);
  Pool other(2, 8);  // other bytes: a write would show
  std::vector<int32_t> index(other.slot.begin(), other.slot.begin() + kCtx);
  auto refused = [&](hs_result want, const hs_store_indexed_args& args, const char* why) {
    EXPECT_EQ(hs_store_indexed(s_.get(), &args), want) << why;
    EXPECT_NE(std::string(hs_last_error()).find(why), std::string::npos) << hs_last_error();
    EXPECT_EQ(HostRecords(s_, 1), host) << why;
    EXPECT_EQ(SlotRecords(info_, rows_[0]), slots) << why;
  };
  // A source index outside [0, src_tokens): the last one, after valid ones, and a negative one.
  index.back() = kPoolTokens;
  refused(HS_ERR_INVALID_ARGUMENT, Args(1, other, index.data(), 0, kLayers, 0, kCtx, kCtx), "source index");
  index.back() = other.slot[kCtx - 1];
  index[3] = -1;
  refused(HS_ERR_INVALID_ARGUMENT, Args(1, other, index.data(), 0, kLayers, 0, kCtx, kCtx), "source index");
  index[3] = other.slot[3];
  // Layer ranges: empty, past the last layer.
  refused(HS_ERR_INVALID_ARGUMENT, Args(1, other, index.data(), 0, 0, 0, kCtx, kCtx), "layers");
  refused(HS_ERR_INVALID_ARGUMENT, Args(1, other, index.data(), 2, 3, 0, kCtx, kCtx), "layers");
  hs_store_indexed_args x = Args(1, other, index.data(), 0, 1, 0, kCtx, kCtx);
  x.first_layer = 0xffffffffu;  // first + num would wrap in 32 bits
  refused(HS_ERR_INVALID_ARGUMENT, x, "layers");
  // Token ranges: past the capacity, past seq_len_after, negative.
  refused(HS_ERR_INVALID_ARGUMENT, Args(1, other, index.data(), 0, kLayers, 10, kCtx, kCtx + 10), "capacity");
  refused(HS_ERR_INVALID_ARGUMENT, Args(1, other, index.data(), 0, kLayers, 0, kCtx, kCtx - 1), "seq_len_after");
  refused(HS_ERR_INVALID_ARGUMENT, Args(1, other, index.data(), 0, kLayers, -1, 5, 10), "tokens");
  // The pool: no index, no src_tokens, a token stride below the record.
  refused(HS_ERR_INVALID_ARGUMENT, Args(1, other, nullptr, 0, kLayers, 0, kCtx, kCtx), "src_index");
  x = Args(1, other, index.data(), 0, kLayers, 0, kCtx, kCtx);
  x.src_tokens = 0;
  refused(HS_ERR_INVALID_ARGUMENT, x, "src_tokens");
  x = Args(1, other, index.data(), 0, kLayers, 0, kCtx, kCtx);
  x.src_token_stride = kRb - 16;
  refused(HS_ERR_INVALID_ARGUMENT, x, "src_token_stride");
  // A request not admitted here, and a struct from no known version.
  refused(HS_ERR_NOT_FOUND, Args(9, other, index.data(), 0, kLayers, 0, kCtx, kCtx), "not admitted");
  x = Args(1, other, index.data(), 0, kLayers, 0, kCtx, kCtx);
  x.struct_size = 8;
  refused(HS_ERR_INVALID_ARGUMENT, x, "struct_size");
}

}  // namespace indexed_store_test
}  // namespace hisparse::testing
