// kernels/topk.cu's device code, run on the host (cuda_emulation/cuda_runtime.h) and held equal to
// TopkReference on the cases the GPU test runs (topk_cases.h), at 1, 2, 4 and 8 blocks a row, at
// sizes a CI machine runs in about a minute and a half (mostly the cluster of 8: 4,096 threads). Every CUDA thread is a
// host thread, scheduled in no fixed order, so a race that a GPU's warps rarely show fails here: it is how the kernel's
// first version, which had passed on an H200, was found to let one lane of a warp write the search state while others
// still read it. This does not replace tests/gpu/topk_gpu_test.cu (the real hardware, the float4 loads' alignment, the
// launch), which the GPU plan runs.
#include <cuda_runtime.h>  // cuda_emulation/cuda_runtime.h

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "hisparse/kernels/topk.h"
#include "topk_cases.h"

// What resolve.cu provides the kernel file on a GPU build.
namespace hisparse {
namespace internal {
namespace {
std::string g_emulated_error;
}  // namespace
void SetLaunchError(const char* msg) { g_emulated_error = msg ? msg : ""; }
cudaError_t FailLaunch(const std::string& msg) {
  g_emulated_error = msg;
  return cudaErrorInvalidValue;
}
cudaError_t LaunchCallFailed(cudaError_t e) {
  g_emulated_error = cudaGetErrorName(e);
  return e;
}
cudaError_t CheckLaunched() { return cudaSuccess; }
}  // namespace internal
const char* LastLaunchError() { return internal::g_emulated_error.c_str(); }
}  // namespace hisparse

#include "../../kernels/topk.cu"  // NOLINT(bugprone-suspicious-include): the kernel, compiled for the host

namespace hisparse {
namespace {

using testing::MakeTopkBatch;
using testing::TopkBatch;
using testing::TopkBatchDesc;
using testing::TopkBatchReference;

// Rows start 16 bytes into the buffer or 4 bytes off it: both load paths. `blocks_per_row` 0: the
// launcher's choice for the emulated device (8 SMs).
void ExpectEqual(const TopkBatch& b, int32_t batch_size, bool with_lens, bool aligned, const char* what,
                 int blocks_per_row = 0) {
  std::vector<float> scores(b.scores.size() + 4);
  const size_t off = aligned ? 0 : 1;
  std::copy(b.scores.begin(), b.scores.end(), scores.begin() + off);
  std::vector<int32_t> got(static_cast<size_t>(b.rows) * b.k, 0x5a5a5a5a);
  const TopkDesc d =
      TopkBatchDesc(b, scores.data() + off, &batch_size, with_lens ? b.seq_lens.data() : nullptr, got.data());
  ASSERT_EQ(LaunchTopk(d, nullptr, blocks_per_row), cudaSuccess) << LastLaunchError();
  const std::vector<int32_t> want = TopkBatchReference(b, batch_size, with_lens);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << what << (aligned ? "" : ", unaligned") << ", " << blocks_per_row
                               << " blocks a row: row " << i / b.k << " ("
                               << testing::TopkKinds()[(i / b.k) % testing::TopkKinds().size()] << ") col " << i % b.k;
  }
}

TEST(TopkEmulated, EveryKindOfRowMatchesReference) {
  const TopkBatch b = MakeTopkBatch(11, 20000, 20000, 2048, 1);
  for (bool aligned : {true, false}) {
    ExpectEqual(b, 11, false, aligned, "k 2048");
    ExpectEqual(b, 6, true, aligned, "batch 6, seq_lens");
  }
}

// A row cut among the blocks of a cluster (4 a row: AnEngineRowMatchesReference): the shares cut
// inside a tile and, with 20,000 scores among 8 blocks, short of one.
TEST(TopkEmulated, EveryClusterSizeMatchesReference) {
  const TopkBatch b = MakeTopkBatch(11, 20000, 20000, 2048, 3);
  ExpectEqual(b, 11, true, false, "k 2048", 8);  // 2 a row: OddShapesMatchReference
}

TEST(TopkEmulated, AnEngineRowMatchesReference) {
  ExpectEqual(MakeTopkBatch(2, 131136, 131136, 2048, 7), 2, true, true, "131,136 scores");  // 4 blocks a row
  ExpectEqual(MakeTopkBatch(1, 131136, 131136, 2048, 8), 1, true, false, "131,136 scores", 8);
}

TEST(TopkEmulated, OddShapesMatchReference) {
  for (const auto& o : testing::TopkOddShapes()) {
    ExpectEqual(MakeTopkBatch(o.rows, o.cols, o.ld, o.k, o.seed), o.rows, true, true, o.what, 2);
  }
}

TEST(TopkEmulated, ChoosesTheMostBlocksARowWhoseClustersAllRunAtOnce) {
  const int h100[4] = {132, 66, 32, 16};  // clusters of 1, 2, 4, 8 such blocks: fewer than 132 / size
  EXPECT_EQ(TopkBlocksPerRow(1, h100), 8);
  EXPECT_EQ(TopkBlocksPerRow(16, h100), 8);
  EXPECT_EQ(TopkBlocksPerRow(17, h100), 4);
  EXPECT_EQ(TopkBlocksPerRow(32, h100), 4);
  EXPECT_EQ(TopkBlocksPerRow(33, h100), 2);
  EXPECT_EQ(TopkBlocksPerRow(67, h100), 1);
  EXPECT_EQ(TopkBlocksPerRow(1 << 30, h100), 1);
  const int none[4] = {0, 0, 0, 0};  // a device that cannot run clusters at all still gets 1
  EXPECT_EQ(TopkBlocksPerRow(1, none), 1);
}

// TopkDesc::after_count: the kernel reads no score before the count reaches its target. Here the
// scores are written, and counted, by another thread while the launch waits; a block that read
// them early would select from the zeros they start as.
TEST(TopkEmulated, WaitsForTheCountBeforeReadingScores) {
  const TopkBatch b = MakeTopkBatch(2, 5000, 5000, 64, 11);
  std::vector<float> scores(b.scores.size(), 0.0f);
  std::vector<int32_t> got(static_cast<size_t>(b.rows) * b.k, 0x5a5a5a5a);
  int32_t batch = b.rows;
  int32_t count = 0;
  TopkDesc d = TopkBatchDesc(b, scores.data(), &batch, b.seq_lens.data(), got.data());
  d.after_count = &count;
  d.after_target = 3;
  std::thread writer([&] {
    for (int part = 0; part < 3; ++part) {  // three "programs", each its third of the scores, then counted
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const size_t lo = scores.size() * part / 3, hi = scores.size() * (part + 1) / 3;
      std::copy(b.scores.begin() + static_cast<std::ptrdiff_t>(lo), b.scores.begin() + static_cast<std::ptrdiff_t>(hi),
                scores.begin() + static_cast<std::ptrdiff_t>(lo));
      __atomic_add_fetch(&count, 1, __ATOMIC_RELEASE);
    }
  });
  const cudaError_t err = LaunchTopk(d, nullptr, 2);
  writer.join();
  ASSERT_EQ(err, cudaSuccess) << LastLaunchError();
  EXPECT_EQ(got, TopkBatchReference(b, batch, true));
  d.after_target = -1;
  EXPECT_EQ(LaunchTopk(d, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(LastLaunchError()).find("after_target"), std::string::npos) << LastLaunchError();
}

TEST(TopkEmulated, RefusesWhatItCannotRun) {
  EXPECT_EQ(LaunchTopk(TopkDesc{}, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(LastLaunchError()).find("top-k"), std::string::npos) << LastLaunchError();
  const TopkBatch b = MakeTopkBatch(1, 100, 100, 8, 1);
  int32_t batch = 1;
  std::vector<int32_t> got(8, 7);
  const TopkDesc d = TopkBatchDesc(b, b.scores.data(), &batch, nullptr, got.data());
  for (int blocks : {-1, 3, 16}) {
    EXPECT_EQ(LaunchTopk(d, nullptr, blocks), cudaErrorInvalidValue) << blocks;
    EXPECT_NE(std::string(LastLaunchError()).find("blocks_per_row"), std::string::npos) << LastLaunchError();
  }
  EXPECT_EQ(got, std::vector<int32_t>(8, 7)) << "a refused launch wrote";
}

}  // namespace
}  // namespace hisparse
