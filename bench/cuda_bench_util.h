// Helpers shared by hisparse-bench's CUDA subcommands (resolve, resolve-shared, session-open):
// a fatal CUDA check, the ~20 us spin kernel that hides launch overhead, medians, and the link's
// bulk H2D bandwidth (1 GiB pinned cudaMemcpy, best of 5 after a warm-up). Plain C++ (the kernel
// lives in cuda_bench_util.cu), so host-compiled subcommands that include gRPC headers can use it.
#ifndef HISPARSE_BENCH_CUDA_BENCH_UTIL_H_
#define HISPARSE_BENCH_CUDA_BENCH_UTIL_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "hisparse/kernels/resolve_cuda.h"

#define BENCH_CUDA(x)                                                                                       \
  do {                                                                                                      \
    const cudaError_t e_ = (x);                                                                             \
    if (e_ != cudaSuccess) {                                                                                \
      std::fprintf(stderr, "hisparse-bench: %s: %s (%s)\n", #x, cudaGetErrorString(e_), LastLaunchError()); \
      std::exit(1);                                                                                         \
    }                                                                                                       \
  } while (0)

namespace hisparse::bench {

// Launches a one-thread kernel that spins `cycles` GPU clocks on `stream`.
void LaunchSpin(cudaStream_t stream, long long cycles);
// Spin cycles for about `us` microseconds on the current device.
long long SpinCycles(double us);

template <typename T>
double Median(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  if (n == 0) return 0;
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// GB/s of a 1 GiB pinned host-to-device copy: best of 5 after one warm-up.
double MeasureLink();

}  // namespace hisparse::bench

#endif  // HISPARSE_BENCH_CUDA_BENCH_UTIL_H_
