// kernels/topk.cu's device code, run on the host (cuda_emulation/cuda_runtime.h) and held equal to
// TopkReference on the cases the GPU test runs (topk_cases.h), at sizes a CI machine runs in
// seconds. Every CUDA thread is a host thread, scheduled in no fixed order, so a race that a
// GPU's warps rarely show fails here: it is how the kernel's first version, which had passed on an
// H200, was found to let one lane of a warp write the search state while others still read it.
// This does not replace tests/gpu/topk_gpu_test.cu (the real hardware, the float4 loads' alignment,
// the launch), which the GPU plan runs.
#include <cuda_runtime.h>  // cuda_emulation/cuda_runtime.h

#include <string>
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

// Rows start 16 bytes into the buffer or 4 bytes off it: both load paths.
void ExpectEqual(const TopkBatch& b, int32_t batch_size, bool with_lens, bool aligned, const char* what) {
  std::vector<float> scores(b.scores.size() + 4);
  const size_t off = aligned ? 0 : 1;
  std::copy(b.scores.begin(), b.scores.end(), scores.begin() + off);
  std::vector<int32_t> got(static_cast<size_t>(b.rows) * b.k, 0x5a5a5a5a);
  const TopkDesc d =
      TopkBatchDesc(b, scores.data() + off, &batch_size, with_lens ? b.seq_lens.data() : nullptr, got.data());
  ASSERT_EQ(LaunchTopk(d, nullptr), cudaSuccess) << LastLaunchError();
  const std::vector<int32_t> want = TopkBatchReference(b, batch_size, with_lens);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << what << (aligned ? "" : ", unaligned") << ": row " << i / b.k << " ("
                               << testing::TopkKinds()[(i / b.k) % testing::TopkKinds().size()] << ") col " << i % b.k;
  }
}

TEST(TopkEmulated, EveryKindOfRowMatchesReference) {
  const TopkBatch b = MakeTopkBatch(8, 20000, 20000, 2048, 1);
  for (bool aligned : {true, false}) {
    ExpectEqual(b, 8, false, aligned, "k 2048");
    ExpectEqual(b, 6, true, aligned, "batch 6, seq_lens");
  }
}

TEST(TopkEmulated, AnEngineRowMatchesReference) {
  ExpectEqual(MakeTopkBatch(2, 131136, 131136, 2048, 7), 2, true, true, "131,136 scores");
}

TEST(TopkEmulated, OddShapesMatchReference) {
  for (const auto& o : testing::TopkOddShapes()) {
    ExpectEqual(MakeTopkBatch(o.rows, o.cols, o.ld, o.k, o.seed), o.rows, true, true, o.what);
  }
}

TEST(TopkEmulated, RefusesWhatItCannotRun) {
  EXPECT_EQ(LaunchTopk(TopkDesc{}, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(LastLaunchError()).find("top-k"), std::string::npos) << LastLaunchError();
}

}  // namespace
}  // namespace hisparse
