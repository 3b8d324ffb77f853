// LaunchTopk (topk_cuda.h) held equal to TopkReference (topk.h), list for list, on every kind of
// row topk_cases.h makes: the radix search's early end, a bucket kept in shared memory, one too
// large to keep, ties, specials, short and padded rows; at an engine's shape (k 2048 of 131,136
// scores) and at odd ones (k past the row, an unaligned row stride); from a graph whose batch size
// changes between replays.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "../kernels/topk_cases.h"
#include "gpu_test_util.h"
#include "hisparse/kernels/topk_cuda.h"
#include "late_producer.cuh"
#include "stream_order.cuh"

namespace hisparse {
namespace {

using testing::MakeTopkBatch;
using testing::TopkBatch;
using testing::TopkBatchDesc;
using testing::TopkBatchReference;

class DeviceBatch {
 public:
  explicit DeviceBatch(const TopkBatch& b) : b_(b) {
    EXPECT_EQ(cudaMalloc(&scores_, b.scores.size() * sizeof(float) + 16), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&lens_, b.seq_lens.size() * sizeof(int32_t) + 4), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&batch_, sizeof(int32_t)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&out_, static_cast<size_t>(b.rows) * b.k * sizeof(int32_t) + 4), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(scores_, b.scores.data(), b.scores.size() * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
    EXPECT_EQ(cudaMemcpy(lens_, b.seq_lens.data(), b.seq_lens.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  ~DeviceBatch() {
    cudaFree(scores_);
    cudaFree(lens_);
    cudaFree(batch_);
    cudaFree(out_);
  }
  TopkDesc Desc(bool with_lens) const { return TopkBatchDesc(b_, scores_, batch_, with_lens ? lens_ : nullptr, out_); }
  const float* Scores() const { return scores_; }
  void SetBatch(int32_t n, cudaStream_t s) const {
    ASSERT_EQ(cudaMemcpyAsync(batch_, &n, sizeof n, cudaMemcpyHostToDevice, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  }
  // Fills the output with a marker, so that a column the kernel leaves unwritten shows.
  void Poison(cudaStream_t s) const {
    ASSERT_EQ(cudaMemsetAsync(out_, 0x5a, static_cast<size_t>(b_.rows) * b_.k * sizeof(int32_t), s), cudaSuccess);
  }
  std::vector<int32_t> Out() const {
    std::vector<int32_t> out(static_cast<size_t>(b_.rows) * b_.k);
    EXPECT_EQ(cudaMemcpy(out.data(), out_, out.size() * sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  const TopkBatch& b_;
  float* scores_ = nullptr;
  int32_t* lens_ = nullptr;
  int32_t* batch_ = nullptr;
  int32_t* out_ = nullptr;
};

void ExpectRowsEqual(const std::vector<int32_t>& got, const std::vector<int32_t>& want, const TopkBatch& b,
                     const char* what) {
  for (int32_t i = 0; i < b.rows; ++i) {
    for (int32_t j = 0; j < b.k; ++j) {
      const size_t at = static_cast<size_t>(i) * b.k + j;
      ASSERT_EQ(got[at], want[at]) << what << ": row " << i << " ("
                                   << testing::TopkKinds()[i % testing::TopkKinds().size()] << ") col " << j;
    }
  }
}

// `blocks_per_row` 0: the launcher's choice on this GPU.
void RunAndCompare(const TopkBatch& b, int32_t batch_size, bool with_lens, const char* what, int blocks_per_row = 0) {
  DeviceBatch dev(b);
  dev.SetBatch(batch_size, nullptr);
  dev.Poison(nullptr);
  CUDA_OK(LaunchTopk(dev.Desc(with_lens), nullptr, blocks_per_row));
  CUDA_OK(cudaDeviceSynchronize());
  SCOPED_TRACE(std::to_string(blocks_per_row) + " blocks a row");
  ExpectRowsEqual(dev.Out(), TopkBatchReference(b, batch_size, with_lens), b, what);
}

TEST(TopkGpu, EngineShapeMatchesReference) {
  REQUIRE_GPU();
  const TopkBatch b = MakeTopkBatch(/*rows=*/16, /*cols=*/131136, /*ld=*/131136, /*k=*/2048, 7);
  RunAndCompare(b, 16, false, "all rows");
  RunAndCompare(b, 11, true, "batch 11 of 16");
  for (int blocks : {1, 2, 4, 8}) RunAndCompare(b, 16, true, "seq_lens", blocks);
  // A serving engine's score rows, 133,125 floats wide: three rows in four start between 16-byte
  // boundaries, where the kernel loads from the boundary before the row (TopkKernel's lo).
  const TopkBatch w = MakeTopkBatch(/*rows=*/16, /*cols=*/133125, /*ld=*/133125, /*k=*/2048, 9);
  for (int blocks : {0, 1, 8}) RunAndCompare(w, 16, true, "rows 133,125 wide", blocks);
}

TEST(TopkGpu, OddShapesMatchReference) {
  REQUIRE_GPU();
  for (const auto& o : testing::TopkOddShapes()) {
    for (int blocks : {1, 8})
      RunAndCompare(MakeTopkBatch(o.rows, o.cols, o.ld, o.k, o.seed), o.rows, true, o.what, blocks);
  }
}

// A row's list does not depend on the rows launched beside it, nor on the blocks a row.
TEST(TopkGpu, ARowAloneEqualsItInABatch) {
  REQUIRE_GPU();
  const TopkBatch b = MakeTopkBatch(8, 20000, 20000, 700, 21);
  DeviceBatch dev(b);
  dev.SetBatch(8, nullptr);
  CUDA_OK(LaunchTopk(dev.Desc(true), nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<int32_t> all = dev.Out();
  for (int32_t i = 0; i < b.rows; ++i) {
    TopkBatch one{1,
                  b.cols,
                  b.k,
                  b.ld,
                  std::vector<float>(b.scores.begin() + i * b.ld, b.scores.begin() + (i + 1) * b.ld),
                  {b.seq_lens[i]}};
    DeviceBatch d1(one);
    d1.SetBatch(1, nullptr);
    CUDA_OK(LaunchTopk(d1.Desc(true), nullptr, 1 << (i % 4)));
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<int32_t> alone = d1.Out();
    for (int32_t j = 0; j < b.k; ++j) ASSERT_EQ(alone[j], all[static_cast<size_t>(i) * b.k + j]) << i << " " << j;
  }
}

// One graph captured for 16 rows serves batches of 16, 5 and 0: the batch size is read at run time.
TEST(TopkGpu, OneGraphServesEveryBatchSize) {
  REQUIRE_GPU();
  const TopkBatch b = MakeTopkBatch(16, 50000, 50000, 2048, 31);
  DeviceBatch dev(b);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  CUDA_OK(LaunchTopk(dev.Desc(true), s));
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int32_t n : {16, 5, 0}) {
    dev.SetBatch(n, s);
    dev.Poison(s);
    CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaStreamSynchronize(s));
    ExpectRowsEqual(dev.Out(), TopkBatchReference(b, n, true), b, "graph");
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(s));
}

// The kernels that write the scores in TopkDesc::after_count's tests: each block lets its dependents
// launch at once, spins, copies its part of the scores, and only then counts itself (a release).
__global__ void LateScoresKernel(float* dst, const float* src, size_t n, unsigned long long spin_ns, int32_t* count) {
  internal::LetDependentsLaunch();
  testing::SpinNs(spin_ns);
  const size_t part = (n + gridDim.x - 1) / gridDim.x, lo = part * blockIdx.x, hi = lo + part < n ? lo + part : n;
  for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) dst[i] = src[i];
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(count, 1);
  }
}

// hs_topk_args.after_count: the top-k, a programmatic dependent of the kernel writing its scores,
// starts while that kernel spins and reads nothing before the count reaches its target. A top-k
// that read early would find the NaNs the scores start as, which it never selects. Twice, from a
// graph, with the count reset between (as an engine does).
TEST(TopkGpu, WaitsForTheCountOfTheKernelsWritingTheScores) {
  REQUIRE_GPU();
  const TopkBatch b = MakeTopkBatch(6, 131136, 131136, 2048, 41);
  DeviceBatch dev(b);
  dev.SetBatch(6, nullptr);
  float* late = nullptr;
  int32_t* count = nullptr;
  CUDA_OK(cudaMalloc(&late, b.scores.size() * sizeof(float)));
  CUDA_OK(cudaMalloc(&count, sizeof(int32_t)));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  TopkDesc d = dev.Desc(true);
  d.scores = late;
  d.after_count = count;
  d.after_target = 12;  // the writing kernel's blocks
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  CUDA_OK(cudaMemsetAsync(count, 0, sizeof(int32_t), s));
  CUDA_OK(cudaMemsetAsync(late, 0xff, b.scores.size() * sizeof(float), s));  // NaN
  LateScoresKernel<<<12, 256, 0, s>>>(late, dev.Scores(), b.scores.size(), 200000, count);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(LaunchTopk(d, s));
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    dev.Poison(s);
    CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaStreamSynchronize(s));
    ExpectRowsEqual(dev.Out(), TopkBatchReference(b, 6, true), b, "after the count");
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaFree(late));
  CUDA_OK(cudaFree(count));
}

TEST(TopkGpu, RefusesWhatItCannotRun) {
  REQUIRE_GPU();
  TopkDesc d;
  EXPECT_EQ(LaunchTopk(d, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(LastLaunchError()).find("top-k"), std::string::npos) << LastLaunchError();
  const TopkBatch b = MakeTopkBatch(1, 100, 100, 8, 1);
  DeviceBatch dev(b);
  EXPECT_EQ(LaunchTopk(dev.Desc(true), nullptr, 3), cudaErrorInvalidValue);
  EXPECT_NE(std::string(LastLaunchError()).find("blocks_per_row"), std::string::npos) << LastLaunchError();
}

}  // namespace
}  // namespace hisparse
