// Private to kernels/: the launch bookkeeping every CUDA launcher shares (defined in resolve.cu).
// A launcher returns cudaSuccess or an error, and leaves the reason for LastLaunchError
// (resolve_cuda.h): "" after a success, per host thread.
#ifndef HISPARSE_KERNELS_LAUNCH_STATUS_H_
#define HISPARSE_KERNELS_LAUNCH_STATUS_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "hisparse/kernels/arena_layout.h"

namespace hisparse::internal {

// Sets LastLaunchError's text (null: "").
void SetLaunchError(const char* msg);
// A descriptor the launcher refuses: `msg`, and cudaErrorInvalidValue.
cudaError_t FailLaunch(const std::string& msg);
// After a launch: the pending launch error (cleared), with its name as the reason, or cudaSuccess.
cudaError_t CheckLaunched();
// A launch call's own error, e.g. cudaLaunchKernelEx's (cleared from cudaGetLastError, returned).
cudaError_t LaunchCallFailed(cudaError_t e);

// Host-side checks every launcher makes: the contract's geometry and record size (the reason,
// written into buf when it names a figure, or null), and the page-table shape of a host map.
const char* CheckGeometry(const ArenaGeometry& g, char* buf, size_t n);
const char* CheckHostMap(const HostRecordMap& h);

}  // namespace hisparse::internal

#endif  // HISPARSE_KERNELS_LAUNCH_STATUS_H_
