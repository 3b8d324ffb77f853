// Whether the machine's NVIDIA driver can run this build's CUDA runtime, and if not a message an
// operator can act on (which driver is needed), rather than the runtime's error code
// (cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version").
//
// The CUDA backend calls it at session open with cudaDriverGetVersion and cudaRuntimeGetVersion
// (both 1000 * major + 10 * minor; the driver's 0 when no driver is loaded). Pure; thread-safe;
// no CUDA headers, so it is tested on machines without CUDA.
#ifndef HISPARSE_CLIENT_CUDA_DRIVER_CHECK_H_
#define HISPARSE_CLIENT_CUDA_DRIVER_CHECK_H_

#include "absl/status/status.h"

namespace hisparse {

// The oldest Linux driver branch for a CUDA major version (NVIDIA's CUDA Toolkit release notes,
// "CUDA Driver": 13.x >= 580, 12.x >= 525, 11.x >= 450, with minor-version compatibility within
// a major); 0 for a major this table does not know.
int MinimumDriverForCuda(int cuda_major);

// OK when a driver of `driver_version` runs a runtime of `runtime_version`: the driver supports
// that CUDA major (newer drivers run older runtimes; within a major, minor-version compatibility
// covers the runtime's minor). Otherwise FAILED_PRECONDITION naming the driver's CUDA version,
// the runtime's and the driver branch it needs; no driver (0): UNAVAILABLE, the same advice.
absl::Status CheckCudaDriver(int driver_version, int runtime_version);

}  // namespace hisparse

#endif  // HISPARSE_CLIENT_CUDA_DRIVER_CHECK_H_
