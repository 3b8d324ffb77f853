// Park/resume and shared prefixes on the CUDA backend against hisparsed --device cuda: a parked
// request resumes into another row, whose slots LaunchResetRow empties, and the first RESOLVE on
// the GPU copies its own records (byte-compared with the host pool); a child of a shared prefix
// resolves the parent's records from the shared pages after the parent is released; a store into
// a shared page is flagged (hs_check_errors) and writes nothing. Skips without a GPU.
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "hisparse/common/daemon_process.h"
#include "hisparse/hisparse.h"

namespace hisparse {
namespace park_share_gpu_test {

constexpr uint32_t kLayers = 2, kRb = 64, kK = 4, kB = 8;
constexpr uint32_t kPerPage = 4096 / kRb;

uint8_t Pattern(uint64_t seed, uint32_t layer, uint32_t pos, uint32_t i) {
  return static_cast<uint8_t>(seed * 5 + layer * 11 + pos * 31 + i);
}

// A device buffer holding `bytes` (freed with the object).
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(p); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

class ParkShareGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) GTEST_SKIP() << "no CUDA device";
    auto d = DaemonProcess::Start({"--device", "cuda", "--host-pool-size", "64MiB", "--host-pool-page-size", "4KiB",
                                   "--host-pool-slab-size", "4MiB", "--log-level", "warning"});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
    hs_session_options o = HS_SESSION_OPTIONS_INIT;
    o.daemon_address = daemon_->address().c_str();
    o.engine_name = "park-share-gpu-test";
    o.gpu = 0;
    o.num_layers = kLayers;
    o.record_bytes = kRb;
    o.k = kK;
    o.slots = kB;
    o.max_requests = 2;
    o.backend = HS_BACKEND_CUDA;
    ASSERT_EQ(hs_session_open(&o, &s_), HS_OK) << hs_last_error();
    ASSERT_EQ(hs_session_get_info(s_, &info_), HS_OK);
  }
  void TearDown() override {
    if (s_ != nullptr) hs_session_close(s_);
  }
  // Stores tokens [start, end) of `id` with `seed`'s pattern from device memory.
  hs_result Store(uint64_t id, uint32_t start, uint32_t end, uint64_t seed) {
    const uint32_t n = end - start;
    std::vector<uint8_t> host(kLayers * n * kRb);
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint32_t p = 0; p < n; ++p)
        for (uint32_t i = 0; i < kRb; ++i) host[(l * n + p) * kRb + i] = Pattern(seed, l, start + p, i);
    DeviceBuffer dev(host.size());
    EXPECT_EQ(cudaMemcpy(dev.p, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
    const hs_result r = hs_store(s_, id, static_cast<int32_t>(start), static_cast<int32_t>(n),
                                 static_cast<int32_t>(end), dev.p, int64_t{n} * kRb, kRb, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return r;
  }
  // Appends token `pos` (seq_len pos + 1) of the request in `row` with `seed`'s pattern.
  void Append(uint32_t row, uint32_t pos, uint64_t seed) {
    DeviceBuffer rows(sizeof(int32_t)), seqs(sizeof(int32_t)), rec(kRb);
    const int32_t r = static_cast<int32_t>(row), seq = static_cast<int32_t>(pos + 1);
    ASSERT_EQ(cudaMemcpy(rows.p, &r, sizeof(r), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(seqs.p, &seq, sizeof(seq), cudaMemcpyHostToDevice), cudaSuccess);
    for (uint32_t l = 0; l < kLayers; ++l) {
      uint8_t host[kRb];
      for (uint32_t i = 0; i < kRb; ++i) host[i] = Pattern(seed, l, pos, i);
      ASSERT_EQ(cudaMemcpy(rec.p, host, kRb, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(hs_append(s_, l, 1, nullptr, rows.as<int32_t>(), seqs.as<int32_t>(), rec.p, kRb, nullptr), HS_OK)
          << hs_last_error();
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  // RESOLVEs `positions` of the request `id` in `row` on the GPU, every layer, and compares each
  // output slot's record with the host pool's record of that position.
  void ResolveAndCheck(uint64_t id, uint32_t row, int32_t seq_len, const std::vector<int32_t>& positions) {
    ASSERT_EQ(positions.size(), kK);
    DeviceBuffer rows(sizeof(int32_t)), seqs(sizeof(int32_t)), pos(kK * sizeof(int32_t)), out(kK * sizeof(int32_t));
    const int32_t r = static_cast<int32_t>(row);
    ASSERT_EQ(cudaMemcpy(rows.p, &r, sizeof(r), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(seqs.p, &seq_len, sizeof(seq_len), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(pos.p, positions.data(), kK * sizeof(int32_t), cudaMemcpyHostToDevice), cudaSuccess);
    for (uint32_t layer = 0; layer < kLayers; ++layer) {
      hs_resolve_args a = HS_RESOLVE_ARGS_INIT;
      a.layer = layer;
      a.max_batch = 1;
      a.rows = rows.as<int32_t>();
      a.seq_lens = seqs.as<int32_t>();
      a.positions = pos.as<int32_t>();
      a.out_slots = out.as<int32_t>();
      ASSERT_EQ(hs_resolve(s_, &a), HS_OK) << hs_last_error();
      ASSERT_EQ(hs_check_errors(s_), HS_OK) << hs_last_error();
      std::vector<int32_t> slots(kK);
      ASSERT_EQ(cudaMemcpy(slots.data(), out.p, kK * sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
      for (uint32_t j = 0; j < kK; ++j) {
        ASSERT_GE(slots[j], 0);
        const uint64_t index = (uint64_t{row} * kLayers + layer) * (kB + 1 + info_.draft_tokens) + slots[j];
        uint8_t got[kRb];
        ASSERT_EQ(cudaMemcpy(got, static_cast<uint8_t*>(info_.slot_base) + index * info_.record_stride, kRb,
                             cudaMemcpyDeviceToHost),
                  cudaSuccess);
        void* want = nullptr;
        ASSERT_EQ(hs_record_ptr(s_, id, layer, static_cast<uint32_t>(positions[j]), &want), HS_OK);
        ASSERT_EQ(std::memcmp(got, want, kRb), 0) << "layer " << layer << " position " << positions[j];
      }
    }
  }
  std::unique_ptr<DaemonProcess> daemon_;
  hs_session* s_ = nullptr;
  hs_session_info info_ = HS_SESSION_INFO_INIT;
};

TEST_F(ParkShareGpuTest, ResumedRowIsResetAndResolvesTheRequestsOwnRecords) {
  hs_request_info r1 = HS_REQUEST_INFO_INIT, r2 = HS_REQUEST_INFO_INIT, r3 = HS_REQUEST_INFO_INIT;
  ASSERT_EQ(hs_admit(s_, 1, 40, 64, &r1), HS_OK) << hs_last_error();
  ASSERT_EQ(Store(1, 0, 40, 1), HS_OK) << hs_last_error();
  ASSERT_EQ(hs_admit(s_, 2, 40, 64, &r2), HS_OK) << hs_last_error();
  ASSERT_EQ(Store(2, 0, 40, 2), HS_OK) << hs_last_error();
  ResolveAndCheck(2, r2.row, 40, {3, 20, 33, 39});
  ASSERT_EQ(hs_park(s_, 1), HS_OK) << hs_last_error();
  ASSERT_EQ(hs_admit(s_, 3, 8, 8, &r3), HS_OK) << hs_last_error();
  EXPECT_EQ(r3.row, r1.row);
  EXPECT_EQ(hs_resume(s_, 1, nullptr), HS_ERR_RESOURCE_EXHAUSTED);
  ASSERT_EQ(hs_release(s_, 2), HS_OK);
  hs_request_info resumed = HS_REQUEST_INFO_INIT;
  ASSERT_EQ(hs_resume(s_, 1, &resumed), HS_OK) << hs_last_error();
  EXPECT_EQ(resumed.row, r2.row);
  Append(resumed.row, 40, 1);
  ResolveAndCheck(1, resumed.row, 41, {3, 20, 33, 40});
}

TEST_F(ParkShareGpuTest, ChildResolvesTheSharedPrefixAndCannotStoreIntoIt) {
  ASSERT_EQ(hs_admit(s_, 1, 100, 128, nullptr), HS_OK) << hs_last_error();
  ASSERT_EQ(Store(1, 0, 100, 1), HS_OK) << hs_last_error();
  hs_request_info child = HS_REQUEST_INFO_INIT;
  constexpr uint32_t kPrefix = kPerPage + 10;
  ASSERT_EQ(hs_admit_shared(s_, 2, 100, 128, 1, kPrefix, &child), HS_OK) << hs_last_error();
  ASSERT_EQ(Store(2, kPrefix, 100, 2), HS_OK) << hs_last_error();
  ASSERT_EQ(hs_check_errors(s_), HS_OK) << hs_last_error();
  // Into the shared page: the kernel flags it and writes nothing.
  void* shared = nullptr;
  ASSERT_EQ(hs_record_ptr(s_, 2, 0, 5, &shared), HS_OK);
  uint8_t before[kRb];
  std::memcpy(before, shared, kRb);
  // Refused at once, or (seen only by the kernel) flagged at the next check.
  const hs_result stored = Store(2, 5, 6, 9);
  if (stored == HS_OK) {
    EXPECT_EQ(hs_check_errors(s_), HS_ERR_INVALID_ARGUMENT);
  } else {
    EXPECT_EQ(stored, HS_ERR_INVALID_ARGUMENT);
  }
  EXPECT_NE(std::string(hs_last_error()).find("read-only"), std::string::npos) << hs_last_error();
  EXPECT_EQ(std::memcmp(before, shared, kRb), 0);
  ASSERT_EQ(hs_release(s_, 1), HS_OK);
  ResolveAndCheck(2, child.row, 100, {5, 63, 70, 99});
}

}  // namespace park_share_gpu_test
}  // namespace hisparse
