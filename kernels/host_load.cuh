// Private to kernels/: how the data-path kernels read a host record (device-mapped pinned host
// memory): 16 bytes at a time with a non-coherent load that skips L1. The host pool is never
// written while a RESOLVE or replay reads it, so no coherence is needed, and records are read
// once, so caching them in L1 only evicts the planner's tables.
#ifndef HISPARSE_KERNELS_HOST_LOAD_CUH_
#define HISPARSE_KERNELS_HOST_LOAD_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace hisparse::internal {

__device__ __forceinline__ int4 LdHost(const uint8_t* p) {
  int4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

}  // namespace hisparse::internal

#endif  // HISPARSE_KERNELS_HOST_LOAD_CUH_
