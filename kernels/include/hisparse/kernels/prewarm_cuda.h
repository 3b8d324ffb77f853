// The CUDA launcher of PREWARM (prewarm.h; kernels/prewarm.cu). For identical records it reads what
// the CPU reference reads and leaves the same digest and error bits. It enqueues one kernel on the
// given stream and returns at once: no host synchronization, no allocation, no workspace, so it can
// be captured in a CUDA graph; the batch size is read from device memory, so one graph captured for
// max_batch serves every batch. It takes an eighth of the SMs by default (PrewarmDesc::max_blocks
// otherwise) and launches in PrewarmDesc::order: beside the kernel before it (programmatic dependent
// launch, sm_90 and later; an ordinary launch on others), it runs while that kernel does and completes
// after it, on the one stream.
#ifndef HISPARSE_KERNELS_PREWARM_CUDA_H_
#define HISPARSE_KERNELS_PREWARM_CUDA_H_

#include <cuda_runtime.h>

#include "hisparse/kernels/prewarm.h"
#include "hisparse/kernels/resolve_cuda.h"

namespace hisparse {

// cudaSuccess, the launch's CUDA error, or cudaErrorInvalidValue for a descriptor CheckPrewarmDesc
// rejects (LastLaunchError, resolve_cuda.h, says why). Every pointer is device memory or mapped
// host memory. This form asks the driver for the current device's SM count and compute capability
// (two attribute queries a launch).
cudaError_t LaunchPrewarm(const PrewarmDesc& d, cudaStream_t stream);
// The same, with the SM count and compute capability of a config PrepareResolveLaunch prepared for
// the current device (any geometry): on the step's path, no query. An unprepared config (sms 0)
// falls back to asking the driver.
cudaError_t LaunchPrewarm(const PrewarmDesc& d, const ResolveLaunchConfig& config, cudaStream_t stream);

}  // namespace hisparse

#endif  // HISPARSE_KERNELS_PREWARM_CUDA_H_
