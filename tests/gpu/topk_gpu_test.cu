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

namespace hisparse {
namespace {

struct Batch {
  int32_t rows = 0, cols = 0, k = 0;
  int64_t ld = 0;
  std::vector<float> scores;
  std::vector<int32_t> seq_lens;
};

// Row i is kinds[i % kinds] with its own seed; seq_lens cut some rows (and one below zero).
Batch MakeBatch(int32_t rows, int32_t cols, int64_t ld, int32_t k, uint32_t seed) {
  Batch b{rows, cols, k, ld, std::vector<float>(static_cast<size_t>(rows) * ld, -1.0f), {}};
  const auto& kinds = testing::TopkKinds();
  for (int32_t i = 0; i < rows; ++i) {
    const std::vector<float> row = testing::TopkRow(kinds[i % kinds.size()], cols, seed + i);
    std::memcpy(&b.scores[static_cast<size_t>(i) * ld], row.data(), row.size() * sizeof(float));
    b.seq_lens.push_back(i % 5 == 3 ? cols / 2 + i : i % 7 == 6 ? -1 : cols + 3);
  }
  return b;
}

std::vector<int32_t> Reference(const Batch& b, int32_t batch_size, bool with_lens) {
  std::vector<int32_t> out(static_cast<size_t>(b.rows) * b.k);
  TopkDesc d;
  d.scores = b.scores.data();
  d.ld = b.ld;
  d.cols = b.cols;
  d.rows = b.rows;
  d.k = b.k;
  d.batch_size = &batch_size;
  d.seq_lens = with_lens ? b.seq_lens.data() : nullptr;
  d.positions = out.data();
  TopkReference(d);
  return out;
}

class DeviceBatch {
 public:
  explicit DeviceBatch(const Batch& b) : b_(b) {
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
  TopkDesc Desc(bool with_lens) const {
    TopkDesc d;
    d.scores = scores_;
    d.ld = b_.ld;
    d.cols = b_.cols;
    d.rows = b_.rows;
    d.k = b_.k;
    d.batch_size = batch_;
    d.seq_lens = with_lens ? lens_ : nullptr;
    d.positions = out_;
    return d;
  }
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
  const Batch& b_;
  float* scores_ = nullptr;
  int32_t* lens_ = nullptr;
  int32_t* batch_ = nullptr;
  int32_t* out_ = nullptr;
};

void ExpectRowsEqual(const std::vector<int32_t>& got, const std::vector<int32_t>& want, const Batch& b,
                     const char* what) {
  for (int32_t i = 0; i < b.rows; ++i) {
    for (int32_t j = 0; j < b.k; ++j) {
      const size_t at = static_cast<size_t>(i) * b.k + j;
      ASSERT_EQ(got[at], want[at]) << what << ": row " << i << " (" << testing::TopkKinds()[i % 8] << ") col " << j;
    }
  }
}

void RunAndCompare(const Batch& b, int32_t batch_size, bool with_lens, const char* what) {
  DeviceBatch dev(b);
  dev.SetBatch(batch_size, nullptr);
  dev.Poison(nullptr);
  CUDA_OK(LaunchTopk(dev.Desc(with_lens), nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  ExpectRowsEqual(dev.Out(), Reference(b, batch_size, with_lens), b, what);
}

TEST(TopkGpu, EngineShapeMatchesReference) {
  REQUIRE_GPU();
  const Batch b = MakeBatch(/*rows=*/16, /*cols=*/131136, /*ld=*/131136, /*k=*/2048, 7);
  RunAndCompare(b, 16, false, "all rows");
  RunAndCompare(b, 16, true, "seq_lens");
  RunAndCompare(b, 11, true, "batch 11 of 16");
}

TEST(TopkGpu, OddShapesMatchReference) {
  REQUIRE_GPU();
  // An unaligned row stride (rows start off 16 bytes), k past most rows, a short tile's tail.
  RunAndCompare(MakeBatch(9, 4099, 4101, 300, 3), 9, true, "ld 4101, k 300");
  RunAndCompare(MakeBatch(9, 1000, 1001, 2048, 5), 9, true, "k past the row");
  RunAndCompare(MakeBatch(8, 40000, 40000, 1, 9), 8, false, "k 1");
  RunAndCompare(MakeBatch(8, 9000, 9000, 5000, 11), 8, false, "k 5000");
  RunAndCompare(MakeBatch(3, 0, 4, 16, 13), 3, false, "no columns");
}

// A row's list does not depend on the rows launched beside it.
TEST(TopkGpu, ARowAloneEqualsItInABatch) {
  REQUIRE_GPU();
  const Batch b = MakeBatch(8, 20000, 20000, 700, 21);
  DeviceBatch dev(b);
  dev.SetBatch(8, nullptr);
  CUDA_OK(LaunchTopk(dev.Desc(true), nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<int32_t> all = dev.Out();
  for (int32_t i = 0; i < b.rows; ++i) {
    Batch one{1,
              b.cols,
              b.k,
              b.ld,
              std::vector<float>(b.scores.begin() + i * b.ld, b.scores.begin() + (i + 1) * b.ld),
              {b.seq_lens[i]}};
    DeviceBatch d1(one);
    d1.SetBatch(1, nullptr);
    CUDA_OK(LaunchTopk(d1.Desc(true), nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<int32_t> alone = d1.Out();
    for (int32_t j = 0; j < b.k; ++j) ASSERT_EQ(alone[j], all[static_cast<size_t>(i) * b.k + j]) << i << " " << j;
  }
}

// One graph captured for 16 rows serves batches of 16, 5 and 0: the batch size is read at run time.
TEST(TopkGpu, OneGraphServesEveryBatchSize) {
  REQUIRE_GPU();
  const Batch b = MakeBatch(16, 50000, 50000, 2048, 31);
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
    ExpectRowsEqual(dev.Out(), Reference(b, n, true), b, "graph");
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(s));
}

TEST(TopkGpu, RefusesWhatItCannotRun) {
  REQUIRE_GPU();
  TopkDesc d;
  EXPECT_EQ(LaunchTopk(d, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(LastLaunchError()).find("top-k"), std::string::npos) << LastLaunchError();
}

}  // namespace
}  // namespace hisparse
