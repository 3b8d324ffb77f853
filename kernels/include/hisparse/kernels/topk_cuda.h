// The CUDA launcher of TOP-K (topk.h; kernels/topk.cu). For identical inputs it writes the lists
// the CPU reference writes. It enqueues one kernel on the given stream and returns at once: no host
// synchronization, no allocation, no workspace, so it can be captured in a CUDA graph; the batch
// size is read from device memory, so one graph captured for max_batch serves every batch (the
// blocks a row are chosen from d.rows, the capacity, not from the batch).
#ifndef HISPARSE_KERNELS_TOPK_CUDA_H_
#define HISPARSE_KERNELS_TOPK_CUDA_H_

#include <cuda_runtime.h>

#include "hisparse/kernels/topk.h"

namespace hisparse {

// A cluster of `blocks_per_row` thread blocks a row, each reading its share of the row's scores
// (sm_90 and later): 1, 2, 4 or 8, or 0 for TopkBlocksPerRow's choice on the current device.
// The lists do not depend on it. cudaSuccess, the launch's CUDA error, or cudaErrorInvalidValue
// for a descriptor CheckTopkDesc rejects or another blocks_per_row (LastLaunchError,
// resolve_cuda.h, says why). Every pointer is device memory (or mapped host memory).
cudaError_t LaunchTopk(const TopkDesc& d, cudaStream_t stream, int blocks_per_row = 0);

// With blocks_per_row 0, the first call on a device asks the CUDA runtime how many clusters of each
// size it runs at once (host-side, no stream work; remembered per device), so a call before any
// capture (a warm-up) keeps that query out of a captured graph's first launch.

// The blocks a row LaunchTopk chooses for `rows` rows on a device that runs resident[i] clusters of
// 2^i blocks at once (cudaOccupancyMaxActiveClusters): the most, up to 8, whose clusters all run at
// once (rows <= resident[i]), else 1.
int TopkBlocksPerRow(int rows, const int (&resident)[4]);

}  // namespace hisparse

#endif  // HISPARSE_KERNELS_TOPK_CUDA_H_
