// TP groups on the CUDA backend against hisparsed --device cuda: two ranks of one group (on GPUs 0
// and 1 when there are two, else both on GPU 0) share one set of host pages; rank 0 stores the
// prompt from device memory, both ranks append the same newest token, and each rank's RESOLVE on
// its GPU copies records equal, byte for byte, to the one host pool's. Skips without a GPU.
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "hisparse/common/daemon_process.h"
#include "hisparse/hisparse.h"

namespace hisparse {
namespace tp_group_gpu_test {

constexpr uint32_t kLayers = 2, kRb = 64, kK = 4, kB = 8, kRanks = 2;

uint8_t Pattern(uint32_t layer, uint32_t pos, uint32_t i) { return static_cast<uint8_t>(layer * 11 + pos * 31 + i); }

// A device buffer of `bytes` on the current device (freed with the object).
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(p); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

class TpGroupGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) GTEST_SKIP() << "no CUDA device";
    auto d = DaemonProcess::Start({"--device", "cuda", "--host-pool-size", "64MiB", "--host-pool-page-size", "4KiB",
                                   "--host-pool-slab-size", "4MiB", "--log-level", "warning"});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
    for (uint32_t rank = 0; rank < kRanks; ++rank) {
      gpu_[rank] = static_cast<int>(rank) % count;
      hs_session_options o = HS_SESSION_OPTIONS_INIT;
      o.daemon_address = daemon_->address().c_str();
      o.engine_name = "tp-group-gpu-test";
      o.gpu = gpu_[rank];
      o.num_layers = kLayers;
      o.record_bytes = kRb;
      o.k = kK;
      o.slots = kB;
      o.max_requests = 2;
      o.backend = HS_BACKEND_CUDA;
      o.group = "tp-gpu";
      o.group_rank = rank;
      o.group_size = kRanks;
      ASSERT_EQ(cudaSetDevice(gpu_[rank]), cudaSuccess);
      ASSERT_EQ(hs_session_open(&o, &s_[rank]), HS_OK) << hs_last_error();
      ASSERT_EQ(hs_session_get_info(s_[rank], &info_[rank]), HS_OK);
    }
  }
  void TearDown() override {
    for (hs_session* s : s_) {
      if (s != nullptr) hs_session_close(s);
    }
  }
  // Stores tokens [0, n) of `id` through rank 0, from device memory.
  void StoreOnRank0(uint64_t id, uint32_t n) {
    ASSERT_EQ(cudaSetDevice(gpu_[0]), cudaSuccess);
    std::vector<uint8_t> host(kLayers * n * kRb);
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint32_t p = 0; p < n; ++p)
        for (uint32_t i = 0; i < kRb; ++i) host[(l * n + p) * kRb + i] = Pattern(l, p, i);
    DeviceBuffer dev(host.size());
    ASSERT_EQ(cudaMemcpy(dev.p, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(
        hs_store(s_[0], id, 0, static_cast<int32_t>(n), static_cast<int32_t>(n), dev.p, int64_t{n} * kRb, kRb, nullptr),
        HS_OK)
        << hs_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  // Appends token `pos` (the same bytes on every rank) into `rank`'s row.
  void Append(uint32_t rank, uint32_t row, uint32_t pos) {
    ASSERT_EQ(cudaSetDevice(gpu_[rank]), cudaSuccess);
    DeviceBuffer rows(sizeof(int32_t)), seqs(sizeof(int32_t)), rec(kRb);
    const int32_t r = static_cast<int32_t>(row), seq = static_cast<int32_t>(pos + 1);
    ASSERT_EQ(cudaMemcpy(rows.p, &r, sizeof(r), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(seqs.p, &seq, sizeof(seq), cudaMemcpyHostToDevice), cudaSuccess);
    for (uint32_t l = 0; l < kLayers; ++l) {
      uint8_t host[kRb];
      for (uint32_t i = 0; i < kRb; ++i) host[i] = Pattern(l, pos, i);
      ASSERT_EQ(cudaMemcpy(rec.p, host, kRb, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(hs_append(s_[rank], l, 1, nullptr, rows.as<int32_t>(), seqs.as<int32_t>(), rec.p, kRb, nullptr), HS_OK)
          << hs_last_error();
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  // RESOLVEs `positions` of `id` in `rank`'s `row` on its GPU, every layer, and compares each output
  // slot's record with the pattern the host pool holds.
  void ResolveAndCheck(uint32_t rank, uint64_t id, uint32_t row, int32_t seq_len,
                       const std::vector<int32_t>& positions) {
    ASSERT_EQ(cudaSetDevice(gpu_[rank]), cudaSuccess);
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
      ASSERT_EQ(hs_resolve(s_[rank], &a), HS_OK) << hs_last_error();
      ASSERT_EQ(hs_check_errors(s_[rank]), HS_OK) << hs_last_error();
      std::vector<int32_t> slots(kK);
      ASSERT_EQ(cudaMemcpy(slots.data(), out.p, kK * sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
      for (uint32_t j = 0; j < kK; ++j) {
        ASSERT_GE(slots[j], 0);
        const uint64_t index = (uint64_t{row} * kLayers + layer) * (kB + 1 + info_[rank].draft_tokens) + slots[j];
        uint8_t got[kRb];
        ASSERT_EQ(cudaMemcpy(got, static_cast<uint8_t*>(info_[rank].slot_base) + index * info_[rank].record_stride, kRb,
                             cudaMemcpyDeviceToHost),
                  cudaSuccess);
        void* host = nullptr;
        ASSERT_EQ(hs_record_ptr(s_[rank], id, layer, static_cast<uint32_t>(positions[j]), &host), HS_OK);
        for (uint32_t i = 0; i < kRb; ++i) {
          ASSERT_EQ(got[i], Pattern(layer, static_cast<uint32_t>(positions[j]), i))
              << "rank " << rank << " layer " << layer << " position " << positions[j];
        }
        ASSERT_EQ(std::memcmp(got, host, kRb), 0);
      }
    }
  }
  std::unique_ptr<DaemonProcess> daemon_;
  int gpu_[kRanks] = {};
  hs_session* s_[kRanks] = {};
  hs_session_info info_[kRanks] = {HS_SESSION_INFO_INIT, HS_SESSION_INFO_INIT};
};

TEST_F(TpGroupGpuTest, EveryRanksGpuResolvesTheOneSetOfPages) {
  hs_request_info r[kRanks] = {HS_REQUEST_INFO_INIT, HS_REQUEST_INFO_INIT};
  ASSERT_EQ(hs_admit_group(s_[0], 1, 100, 128, &r[0]), HS_OK) << hs_last_error();
  StoreOnRank0(1, 100);
  ASSERT_EQ(hs_admit_group(s_[1], 1, 100, 128, &r[1]), HS_OK) << hs_last_error();
  for (uint32_t rank = 0; rank < kRanks; ++rank) Append(rank, r[rank].row, 100);
  for (uint32_t rank = 0; rank < kRanks; ++rank) ResolveAndCheck(rank, 1, r[rank].row, 101, {5, 63, 99, 100});
  for (uint32_t rank = 0; rank < kRanks; ++rank) ResolveAndCheck(rank, 1, r[rank].row, 101, {0, 64, 70, 100});
  // One host copy: the two ranks' mappings of a record are of the same page.
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(hs_record_ptr(s_[0], 1, 1, 77, &a), HS_OK);
  ASSERT_EQ(hs_record_ptr(s_[1], 1, 1, 77, &b), HS_OK);
  static_cast<uint8_t*>(a)[0] ^= 0xff;
  EXPECT_EQ(static_cast<uint8_t*>(b)[0], static_cast<uint8_t>(Pattern(1, 77, 0) ^ 0xff));
  static_cast<uint8_t*>(a)[0] ^= 0xff;
}

}  // namespace tp_group_gpu_test
}  // namespace hisparse
