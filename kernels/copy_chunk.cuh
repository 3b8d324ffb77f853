// Private to kernels/ (and hisparse-bench gather, which measures it beside other copy methods):
// how one warp copies a chunk of host records into the GPU arena with 16-byte loads (LdHost).
// RESOLVE's own chunks and consumers and the replay kernel all copy through it.
#ifndef HISPARSE_KERNELS_COPY_CHUNK_CUH_
#define HISPARSE_KERNELS_COPY_CHUNK_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "host_load.cuh"

namespace hisparse::internal {

// One warp copies `count` (<= 32) records: lane r < count holds record r's source address (its
// host page's address plus its offset in the page, SourceOf) and destination byte offset. Units of
// 16 bytes are spread over the lanes across record borders.
// When the chunk's records are consecutive in host memory (a run of positions in one page), the lanes are
// shifted so that every warp-wide load covers a 512-byte window aligned to 128 bytes in host
// memory: fewer, fuller PCIe read requests for record sizes that are not multiples of 128.
// UPR: the record's 16-byte units when compiled for its size (DispatchRecordBytes), 0: upr_rt.
template <int UPR, int U>
__device__ __forceinline__ void CopyChunk(uint8_t* __restrict__ dst_base, long long src_addr, long long dst_off,
                                          int count, int upr_rt) {
  const int upr = UPR ? UPR : upr_rt;
  const int lane = threadIdx.x & 31;
  const int n = count * upr;
  int lead = 0;
  {
    const long long next = __shfl_down_sync(~0u, src_addr, 1);
    const bool run = lane + 1 >= count || next == src_addr + upr * 16;
    if (__all_sync(~0u, run)) {
      const long long s0 = __shfl_sync(~0u, src_addr, 0);
      lead = static_cast<int>((s0 & 127) >> 4);
    }
  }
  for (int base = -lead; base < n; base += 32 * U) {
    int4 v[U];
#pragma unroll
    for (int t = 0; t < U; ++t) {
      const int u = base + t * 32 + lane;
      int rec = static_cast<int>(static_cast<unsigned>(u < 0 ? 0 : u) / static_cast<unsigned>(upr));
      if (rec >= count) rec = count - 1;
      const long long so = __shfl_sync(~0u, src_addr, rec);
      if (u >= 0 && u < n) v[t] = LdHost(reinterpret_cast<const uint8_t*>(so + (u - rec * upr) * 16));
    }
#pragma unroll
    for (int t = 0; t < U; ++t) {
      const int u = base + t * 32 + lane;
      int rec = static_cast<int>(static_cast<unsigned>(u < 0 ? 0 : u) / static_cast<unsigned>(upr));
      if (rec >= count) rec = count - 1;
      const long long dof = __shfl_sync(~0u, dst_off, rec);
      if (u >= 0 && u < n) *reinterpret_cast<int4*>(dst_base + dof + (u - rec * upr) * 16) = v[t];
    }
  }
}

}  // namespace hisparse::internal

#endif  // HISPARSE_KERNELS_COPY_CHUNK_CUH_
