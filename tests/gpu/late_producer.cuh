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

// The GPU's global clock, in ns (%globaltimer): what the GPU tests' kernels spin and time by.
__device__ __forceinline__ unsigned long long GlobalNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Spins the calling thread for about ns nanoseconds.
__device__ __forceinline__ void SpinNs(unsigned long long ns) {
  const unsigned long long t0 = GlobalNs();
  while (GlobalNs() - t0 < ns) {
  }
}

__global__ void LateProducerKernel(int32_t* dst, const int32_t* src, size_t n, unsigned long long spin_ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  SpinNs(spin_ns);
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

// One block: copies n selections from src to dst after ~spin_us microseconds.
inline void LaunchLateProducer(int32_t* dst, const int32_t* src, size_t n, double spin_us, cudaStream_t stream) {
  LateProducerKernel<<<1, 256, 0, stream>>>(dst, src, n, static_cast<unsigned long long>(spin_us * 1000.0));
}

// The kernel a RESOLVE launched beside it (LaunchOrder::kBeside) runs next to. One thread: it
// reads `counter` (the arena's step counter, which RESOLVE advances before its end), lets its
// dependents launch, and watches the counter for up to watch_ns: out[0] = 1 if it advanced while
// this kernel ran, i.e. RESOLVE did its step beside it. It then runs on for tail_ns more and
// writes out[1] = 1 last, so that a kernel after RESOLVE in the stream finds out[1] set only if
// RESOLVE completed after this kernel (FollowerKernel).
__global__ void NeighbourKernel(const uint64_t* counter, unsigned long long watch_ns, unsigned long long tail_ns,
                                int* out) {
  if (threadIdx.x != 0) return;
  const uint64_t before = *reinterpret_cast<const volatile uint64_t*>(counter);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  const unsigned long long t0 = GlobalNs();
  int seen = 0;
  do {
    seen = *reinterpret_cast<const volatile uint64_t*>(counter) != before;
  } while (!seen && GlobalNs() - t0 < watch_ns);
  out[0] = seen;
  SpinNs(tail_ns);
  __threadfence();
  *reinterpret_cast<volatile int*>(&out[1]) = 1;
}

// The kernel after it: out[2] = out[1] (0 if it ran before NeighbourKernel ended).
__global__ void FollowerKernel(int* out) {
  if (threadIdx.x == 0) out[2] = *reinterpret_cast<const volatile int*>(&out[1]);
}

// The kernel after a RESOLVE that lets its dependents launch early (early_dependents), launched
// as its programmatic dependent, behind a RESOLVE beside NeighbourKernel (which completes only
// after that kernel). One thread: out[3] = 1 if NeighbourKernel had not ended when it started,
// i.e. it started before RESOLVE completed; then it waits for RESOLVE (griddepcontrol.wait) and
// out[4] = 1 if NeighbourKernel had ended by then, as RESOLVE's completion implies.
__global__ void EarlyWatcherKernel(int* out) {
  if (threadIdx.x != 0) return;
  out[3] = *reinterpret_cast<const volatile int*>(&out[1]) == 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  out[4] = *reinterpret_cast<const volatile int*>(&out[1]);
}

// Whether the current device can launch programmatic dependents (compute capability 9.0+).
inline bool CanLaunchProgrammatic() {
  int dev = 0, major = 0;
  return cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
}

}  // namespace hisparse::testing

#endif  // HISPARSE_TESTS_GPU_LATE_PRODUCER_CUH_
