// See cuda_bench_util.h.
#include "cuda_bench_util.h"

namespace hisparse::bench {
namespace {

__global__ void SpinKernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

void LaunchSpin(cudaStream_t stream, long long cycles) { SpinKernel<<<1, 1, 0, stream>>>(cycles); }

long long SpinCycles(double us) {
  int dev = 0, clock_khz = 0;
  BENCH_CUDA(cudaGetDevice(&dev));
  BENCH_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev));
  return static_cast<long long>(clock_khz * us / 1000.0);
}

// GB/s of a 1 GiB pinned host-to-device copy: best of 5 after one warm-up.
double MeasureLink() {
  const size_t bytes = size_t{1} << 30;
  void* h = nullptr;
  void* d = nullptr;
  BENCH_CUDA(cudaHostAlloc(&h, bytes, cudaHostAllocDefault));
  BENCH_CUDA(cudaMalloc(&d, bytes));
  std::memset(h, 1, bytes);
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  float best = 1e30f;
  for (int i = 0; i < 6; ++i) {
    BENCH_CUDA(cudaEventRecord(a));
    BENCH_CUDA(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaEventRecord(b));
    BENCH_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
    if (i > 0) best = std::min(best, ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFree(d);
  cudaFreeHost(h);
  return bytes / (best * 1e-3) / 1e9;
}

}  // namespace hisparse::bench
