// What programmatic dependent launch (sm_90) does to a stream's order, which the overlap schedules
// rely on (docs/INTEGRATION.md, "RESOLVE under a whole range's attention"; examples/engine's
// Overlap.under): with A (long, lets its dependents start at once), B (A's programmatic dependent,
// lets its own start at once, never waits), C (B's programmatic dependent) and D (an ordinary
// launch), both in a stream and in a captured graph:
//   - griddepcontrol.wait in C returns only after A too has completed, not after B alone: a kernel
//     that must run beside an earlier RESOLVE cannot use it to wait for the kernel just before it;
//   - D starts only after A has completed, though B and C let it start early: an ordinary launch
//     after such a chain finds every grid before it complete.
// If a driver ever made either weaker or stronger, these fail, and the schedules' reasoning must be
// redone. Times come from %globaltimer in each kernel.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>

#include "gpu_test_util.h"
#include "late_producer.cuh"
#include "stream_order.cuh"

namespace hisparse {
namespace {

using internal::LaunchInOrder;
using internal::LetDependentsLaunch;
using testing::GlobalNs;
using testing::SpinNs;

constexpr unsigned long long kLongNs = 200000;  // A spins 200 us; B and C far less

// ts: 0 A's start, 1 A's end, 2 B's end, 3 C's start, 4 C's wait returned, 5 D's start.
__global__ void A(unsigned long long* ts) {
  LetDependentsLaunch();
  ts[0] = GlobalNs();
  SpinNs(kLongNs);
  ts[1] = GlobalNs();
}
__global__ void B(unsigned long long* ts) {
  LetDependentsLaunch();
  SpinNs(20000);
  ts[2] = GlobalNs();
}
__global__ void C(unsigned long long* ts, int wait) {
  ts[3] = GlobalNs();
  if (wait) internal::WaitForPriorGrid();
  ts[4] = GlobalNs();
  LetDependentsLaunch();
}
__global__ void D(unsigned long long* ts) { ts[5] = GlobalNs(); }

void Enqueue(cudaStream_t s, unsigned long long* ts, int wait) {
  const dim3 one(1), warp(32);
  CUDA_OK(LaunchInOrder(A, one, warp, 0, s, /*programmatic=*/false, ts));
  CUDA_OK(LaunchInOrder(B, one, warp, 0, s, /*programmatic=*/true, ts));
  CUDA_OK(LaunchInOrder(C, one, warp, 0, s, /*programmatic=*/true, ts, wait));
  CUDA_OK(LaunchInOrder(D, one, warp, 0, s, /*programmatic=*/false, ts));
}

class StreamOrderGpu : public ::testing::TestWithParam<bool> {};  // in a captured graph or not

TEST_P(StreamOrderGpu, WaitCoversEveryGridInFlightAndAnOrdinaryLaunchWaitsForAll) {
  REQUIRE_GPU();
  if (!testing::CanLaunchProgrammatic()) GTEST_SKIP() << "programmatic dependent launch needs compute capability 9.0";
  unsigned long long* ts = nullptr;
  CUDA_OK(cudaMallocManaged(&ts, 6 * sizeof(unsigned long long)));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int wait : {0, 1}) {
    SCOPED_TRACE(wait ? "C waits" : "C does not wait");
    cudaGraphExec_t exec = nullptr;
    if (GetParam()) {
      cudaGraph_t g;
      CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      Enqueue(s, ts, wait);
      CUDA_OK(cudaStreamEndCapture(s, &g));
      CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
      CUDA_OK(cudaGraphDestroy(g));
    }
    for (int rep = 0; rep < 2; ++rep) {  // the second: everything loaded
      if (exec) {
        CUDA_OK(cudaGraphLaunch(exec, s));
      } else {
        Enqueue(s, ts, wait);
      }
      CUDA_OK(cudaStreamSynchronize(s));
    }
    EXPECT_LT(ts[2], ts[1]) << "B ran beside A, to its end";
    EXPECT_LT(ts[3], ts[1]) << "C started beside A";
    if (wait) {
      EXPECT_GE(ts[4], ts[1]) << "griddepcontrol.wait in C returned before A completed";
    } else {
      EXPECT_LT(ts[4], ts[1]);
    }
    EXPECT_GE(ts[5], ts[1]) << "an ordinary launch started before A completed";
    if (exec) CUDA_OK(cudaGraphExecDestroy(exec));
  }
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaFree(ts));
}

INSTANTIATE_TEST_SUITE_P(StreamAndGraph, StreamOrderGpu, ::testing::Bool());

}  // namespace
}  // namespace hisparse
