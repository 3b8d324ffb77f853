// The kernel before a programmatic RESOLVE launch in the GPU tests: it lets its dependents launch
// at once (griddepcontrol.launch_dependents, as kernels written for programmatic launches do),
// spins, and only then writes the selections. A RESOLVE that touched its inputs before this
// kernel completed would read the padding the test filled them with, and differ from the
// reference.
#ifndef HISPARSE_TESTS_GPU_LATE_PRODUCER_CUH_
#define HISPARSE_TESTS_GPU_LATE_PRODUCER_CUH_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace hisparse::testing {

__global__ void LateProducerKernel(int32_t* dst, const int32_t* src, size_t n, unsigned long long spin_ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  unsigned long long t0 = 0, t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < spin_ns);
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

// One block: copies n selections from src to dst after ~spin_us microseconds.
inline void LaunchLateProducer(int32_t* dst, const int32_t* src, size_t n, double spin_us, cudaStream_t stream) {
  LateProducerKernel<<<1, 256, 0, stream>>>(dst, src, n, static_cast<unsigned long long>(spin_us * 1000.0));
}

// Whether the current device can launch programmatic dependents (compute capability 9.0+).
inline bool CanLaunchProgrammatic() {
  int dev = 0, major = 0;
  return cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
}

}  // namespace hisparse::testing

#endif  // HISPARSE_TESTS_GPU_LATE_PRODUCER_CUH_
