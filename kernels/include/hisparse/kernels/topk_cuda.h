// The CUDA launcher of TOP-K (topk.h; kernels/topk.cu). For identical inputs it writes the lists
// the CPU reference writes. It enqueues one kernel on the given stream and returns at once: no host
// synchronization, no allocation, no workspace, so it can be captured in a CUDA graph; the batch
// size is read from device memory, so one graph captured for max_batch serves every batch.
#ifndef HISPARSE_KERNELS_TOPK_CUDA_H_
#define HISPARSE_KERNELS_TOPK_CUDA_H_

#include <cuda_runtime.h>

#include "hisparse/kernels/topk.h"

namespace hisparse {

// One thread block a row (d.rows blocks). cudaSuccess, the launch's CUDA error, or
// cudaErrorInvalidValue for a descriptor CheckTopkDesc rejects (LastLaunchError, resolve_cuda.h,
// says why). Every pointer is device memory (or mapped host memory).
cudaError_t LaunchTopk(const TopkDesc& d, cudaStream_t stream);

}  // namespace hisparse

#endif  // HISPARSE_KERNELS_TOPK_CUDA_H_
