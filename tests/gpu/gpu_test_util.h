// What every kernel-level GPU test needs: a fatal CUDA check that names the launcher's reason, and
// a skip (with the reason) where no CUDA device is present, as on CI.
#ifndef HISPARSE_TESTS_GPU_GPU_TEST_UTIL_H_
#define HISPARSE_TESTS_GPU_GPU_TEST_UTIL_H_

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

#include "hisparse/kernels/resolve_cuda.h"

#define CUDA_OK(x)                                                                                          \
  do {                                                                                                      \
    const cudaError_t e_ = (x);                                                                             \
    ASSERT_EQ(e_, cudaSuccess) << #x << ": " << cudaGetErrorString(e_) << " (" << LastLaunchError() << ")"; \
  } while (0)

namespace hisparse::testing {

// True when a CUDA device is usable; otherwise false and why.
inline bool HaveDevice(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    *why = cudaGetErrorString(e);
    return false;
  }
  if (n == 0) {
    *why = "cudaGetDeviceCount returned 0";
    return false;
  }
  return true;
}

}  // namespace hisparse::testing

#define REQUIRE_GPU()                                                                        \
  do {                                                                                       \
    std::string why_;                                                                        \
    if (!::hisparse::testing::HaveDevice(&why_)) GTEST_SKIP() << "no CUDA device: " << why_; \
  } while (0)

#endif  // HISPARSE_TESTS_GPU_GPU_TEST_UTIL_H_
