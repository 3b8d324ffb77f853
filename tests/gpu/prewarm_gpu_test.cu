// PREWARM on the GPU (kernels/prewarm.cu) against its CPU reference: over host records in mapped
// pinned memory, in pages of the shipped shape (399 records of 656 bytes) placed at offsets that do
// not fall on a granule's boundary, and in one contiguous run per (row, layer), the kernel's digest
// (how many reads, and the XOR of the bytes read) and error bits equal the reference's, at several
// granules and budgets of blocks, with padding, bad entries and a batch smaller than max_batch, and
// from a CUDA graph replayed at another batch size. Skips without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "gtest/gtest.h"
#include "hisparse/kernels/prewarm.h"
#include "hisparse/kernels/prewarm_cuda.h"
#include "hisparse/kernels/resolve.h"

namespace hisparse {
namespace {

struct Config {
  bool paged;
  uint32_t granule;
  int32_t max_blocks;
  uint32_t stride = 1;
  LaunchOrder order = LaunchOrder::kAfterCompletion;
};

std::string Name(const ::testing::TestParamInfo<Config>& info) {
  const Config& c = info.param;
  return std::string(c.paged ? "paged" : "contiguous") + "_g" + std::to_string(c.granule) + "_b" +
         std::to_string(c.max_blocks) + "_s" + std::to_string(c.stride) +
         (c.order == LaunchOrder::kBeside         ? "_beside"
          : c.order == LaunchOrder::kProgrammatic ? "_programmatic"
                                                  : "");
}

class PrewarmGpuTest : public ::testing::TestWithParam<Config> {
 protected:
  static constexpr int32_t kRows = 6, kLayers = 2, kCapacity = 5000;
  static constexpr uint32_t kRecord = 656, kPerPage = 399;

  void TearDown() override {
    for (void* p : dev_) cudaFree(p);
    if (pool_ != nullptr) cudaFreeHost(pool_);
  }
  template <typename T>
  T* Device(const std::vector<T>& v) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(1, v.size() * sizeof(T))), cudaSuccess);
    dev_.push_back(p);
    if (!v.empty()) EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    return static_cast<T*>(p);
  }
  // Fills the pool with random bytes and the tables (host and device addresses of the same pages).
  void Build(const Config& c) {
    const uint32_t per_page = c.paged ? kPerPage : kContiguousRecordsPerPage;
    const uint32_t pages = c.paged ? (kCapacity + kPerPage - 1) / kPerPage : 1;
    const size_t page_bytes = c.paged ? size_t{256} << 10 : static_cast<size_t>(kCapacity) * kRecord + 4096;
    const size_t entries = static_cast<size_t>(kRows) * kLayers * pages;
    pool_bytes_ = entries * page_bytes;
    ASSERT_EQ(cudaHostAlloc(&pool_, pool_bytes_, cudaHostAllocMapped), cudaSuccess);
    uint8_t* dev_pool = nullptr;
    ASSERT_EQ(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_pool), pool_, 0), cudaSuccess);
    std::mt19937_64 rng(17 + c.granule + c.max_blocks + (c.paged ? 1 : 0));
    uint64_t* words = static_cast<uint64_t*>(pool_);
    for (size_t i = 0; i < pool_bytes_ / 8; ++i) words[i] = rng();
    std::vector<size_t> order(entries);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    host_table_.resize(entries);
    std::vector<uint8_t*> dev_table(entries);
    for (size_t e = 0; e < entries; ++e) {
      const size_t skew = 16 * (rng() % 64);  // pages start off a granule's boundary
      const size_t at = order[e] * page_bytes + (c.paged ? 0 : skew);
      const bool read_only = e % 5 == 3;
      host_table_[e] = static_cast<uint8_t*>(pool_) + at + (read_only ? kReadOnlyPageBit : 0);
      dev_table[e] = dev_pool + at + (read_only ? kReadOnlyPageBit : 0);
    }
    capacity_.assign(kRows, kCapacity);
    capacity_[4] = 0;  // not admitted
    geometry_ = ArenaGeometry{kRows, kLayers, 2048, 2048, kRecord, 0};
    host_map_ = HostRecordMap{host_table_.data(), capacity_.data(), per_page, pages};
    dev_map_ = HostRecordMap{Device(dev_table), Device(capacity_), per_page, pages};
  }
  PrewarmDesc Desc(const Config& c, const HostRecordMap& map) const {
    PrewarmDesc d;
    d.geometry = geometry_;
    d.host = map;
    d.layer = 1;
    d.max_positions = kCapacity;
    d.granule_bytes = c.granule;
    d.max_blocks = c.max_blocks;
    d.granule_stride = c.stride;
    d.granule_phase = c.stride - 1;
    d.order = c.order;
    return d;
  }

  void* pool_ = nullptr;
  size_t pool_bytes_ = 0;
  std::vector<void*> dev_;
  std::vector<uint8_t*> host_table_;
  std::vector<int32_t> capacity_;
  ArenaGeometry geometry_{};
  HostRecordMap host_map_{}, dev_map_{};
};

TEST_P(PrewarmGpuTest, ReadsWhatTheReferenceReads) {
  REQUIRE_GPU();
  const Config c = GetParam();
  Build(c);
  if (HasFatalFailure()) return;
  // Entry 2 pads, 5 asks past its capacity, 6 is row 4 (not admitted), 7 is past the first batch.
  const std::vector<int32_t> rows = {0, 3, kPadding, 1, 5, 2, 4, 3};
  const std::vector<int32_t> seq = {kCapacity, 1, 77, 398, 400, kCapacity + 1, 10, 4321};
  const int32_t max_batch = static_cast<int32_t>(rows.size());
  int32_t* d_rows = Device(rows);
  int32_t* d_seq = Device(seq);
  int32_t* d_batch = Device(std::vector<int32_t>{max_batch - 1});
  uint64_t* d_digest = Device(std::vector<uint64_t>{0, 0});
  uint32_t* d_flags = Device(std::vector<uint32_t>{0});
  cudaStream_t st;
  CUDA_OK(cudaStreamCreate(&st));

  for (const int32_t batch : {max_batch - 1, max_batch, 2}) {
    int32_t hb = batch;
    uint64_t want[2] = {0, 0};
    uint32_t want_flags = 0;
    PrewarmDesc ref = Desc(c, host_map_);
    ref.max_batch = max_batch;
    ref.batch_size = &hb;
    ref.rows = rows.data();
    ref.seq_lens = seq.data();
    ref.digest = want;
    ref.error_flags = &want_flags;
    PrewarmReference(ref);

    PrewarmDesc d = Desc(c, dev_map_);
    d.max_batch = max_batch;
    d.batch_size = d_batch;
    d.rows = d_rows;
    d.seq_lens = d_seq;
    d.digest = d_digest;
    d.error_flags = d_flags;
    CUDA_OK(cudaMemcpyAsync(d_batch, &hb, 4, cudaMemcpyHostToDevice, st));
    CUDA_OK(cudaMemsetAsync(d_digest, 0, 16, st));
    CUDA_OK(cudaMemsetAsync(d_flags, 0, 4, st));
    if (batch == 2) {  // from a graph captured at another batch size: the kernel reads it at run time
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      int32_t other = max_batch;
      CUDA_OK(cudaMemcpy(d_batch, &other, 4, cudaMemcpyHostToDevice));
      CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      CUDA_OK(LaunchPrewarm(d, st));
      CUDA_OK(cudaStreamEndCapture(st, &graph));
      CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      CUDA_OK(cudaMemcpyAsync(d_batch, &hb, 4, cudaMemcpyHostToDevice, st));
      CUDA_OK(cudaGraphLaunch(exec, st));
      CUDA_OK(cudaStreamSynchronize(st));
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    } else if (batch == max_batch) {  // with the device figures of a prepared config: no query
      ResolveLaunchConfig prepared;
      CUDA_OK(PrepareResolveLaunch(d.geometry, &prepared));
      ASSERT_GT(prepared.sms, 0);
      CUDA_OK(LaunchPrewarm(d, prepared, st));
    } else {
      CUDA_OK(LaunchPrewarm(d, st));
    }
    uint64_t got[2];
    uint32_t flags = 0;
    CUDA_OK(cudaMemcpyAsync(got, d_digest, 16, cudaMemcpyDeviceToHost, st));
    CUDA_OK(cudaMemcpyAsync(&flags, d_flags, 4, cudaMemcpyDeviceToHost, st));
    CUDA_OK(cudaStreamSynchronize(st));
    EXPECT_GT(want[0], 0u) << "batch " << batch;
    EXPECT_EQ(got[0], want[0]) << "batch " << batch;
    EXPECT_EQ(got[1], want[1]) << "batch " << batch;
    EXPECT_EQ(flags, want_flags) << "batch " << batch;
    EXPECT_EQ(want_flags, batch > 6   ? static_cast<uint32_t>(kResolveBadRow | kResolveBadSeqLen)
                          : batch > 5 ? static_cast<uint32_t>(kResolveBadSeqLen)
                                      : 0u)
        << "batch " << batch;
  }
  // Without a digest it runs all the same (the reads are volatile), and rejects a bad descriptor.
  PrewarmDesc d = Desc(c, dev_map_);
  d.max_batch = max_batch;
  d.batch_size = d_batch;
  d.rows = d_rows;
  d.seq_lens = d_seq;
  CUDA_OK(LaunchPrewarm(d, st));
  CUDA_OK(cudaStreamSynchronize(st));
  d.granule_bytes = 3000;
  EXPECT_EQ(LaunchPrewarm(d, st), cudaErrorInvalidValue);
  EXPECT_NE(std::string(LastLaunchError()).find("granule"), std::string::npos) << LastLaunchError();
  cudaStreamDestroy(st);
}

INSTANTIATE_TEST_SUITE_P(Layouts, PrewarmGpuTest,
                         ::testing::Values(Config{true, 64u << 10, 0}, Config{true, 64u << 10, 1},
                                           Config{true, 4096, 7}, Config{false, 64u << 10, 0}, Config{false, 4096, 3},
                                           Config{true, 2u << 20, 0},
                                           Config{true, 64u << 10, 0, 4, LaunchOrder::kBeside},
                                           Config{true, 4096, 2, 3, LaunchOrder::kProgrammatic},
                                           Config{false, 64u << 10, 0, 5, LaunchOrder::kBeside}),
                         Name);

}  // namespace
}  // namespace hisparse
