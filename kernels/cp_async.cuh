// Private to kernels/: asynchronous global-to-shared copies (cp.async, sm_80 and later), which the
// planners use to stage a row's tables into shared memory with every load in flight at once.
#ifndef HISPARSE_KERNELS_CP_ASYNC_CUH_
#define HISPARSE_KERNELS_CP_ASYNC_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace hisparse::internal {

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(gmem) : "memory");
}
__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(a), "l"(gmem) : "memory");
}
__device__ __forceinline__ void CpAsyncWaitAll() { asm volatile("cp.async.wait_all;" ::: "memory"); }
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N of this thread's most recently committed groups are still in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWaitGroup() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Block-wide (kThreads threads) asynchronous copy of n ints from global to shared memory, every
// load in flight at once; it lands at the wait for the group it is committed in.
template <int kThreads>
__device__ __forceinline__ void StageInts(int* dst, const int* src, int n) {
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0 && (n & 3) == 0) {
    for (int v = threadIdx.x; v < n / 4; v += kThreads) CpAsync16(dst + 4 * v, src + 4 * v);
  } else {
    for (int e = threadIdx.x; e < n; e += kThreads) CpAsync4(dst + e, src + e);
  }
}

}  // namespace hisparse::internal

#endif  // HISPARSE_KERNELS_CP_ASYNC_CUH_
