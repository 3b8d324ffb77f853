#include "cuda_driver_check.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace hisparse {
namespace {

std::string CudaVersionText(int v) { return absl::StrCat(v / 1000, ".", (v % 1000) / 10); }

std::string NeedText(int runtime_version) {
  const int need = MinimumDriverForCuda(runtime_version / 1000);
  return absl::StrCat("hisparse's CUDA kernels are built with CUDA ", CudaVersionText(runtime_version),
                      need > 0 ? absl::StrCat(", which needs NVIDIA driver ", need, " or newer") : std::string(),
                      ": upgrade the node's driver, or open the session on the host backend");
}

}  // namespace

int MinimumDriverForCuda(int cuda_major) {
  switch (cuda_major) {
    case 13:
      return 580;
    case 12:
      return 525;
    case 11:
      return 450;
    default:
      return 0;
  }
}

absl::Status CheckCudaDriver(int driver_version, int runtime_version) {
  if (driver_version <= 0) {
    return absl::UnavailableError(
        absl::StrCat("no NVIDIA driver is loaded (libcuda.so.1); ", NeedText(runtime_version)));
  }
  if (driver_version / 1000 >= runtime_version / 1000) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("the NVIDIA driver here supports CUDA up to ",
                                                    CudaVersionText(driver_version), "; ", NeedText(runtime_version)));
}

}  // namespace hisparse
