#include "hisparse/daemon/device_choice.h"

#include "absl/strings/str_cat.h"

namespace hisparse {

absl::StatusOr<DeviceChoice> ChooseDevice(DeviceKind configured, const GpuProbe& probe) {
  if (configured == DeviceKind::kHost) {
    return DeviceChoice{false, "device: host, slot arenas in host memory (asked for explicitly)"};
  }
  const bool usable = probe.status.ok() && probe.gpus >= 1;
  const std::string seen = probe.status.ok() ? absl::StrCat("the CUDA driver sees ", probe.gpus, " GPU(s)")
                                             : std::string(probe.status.message());
  if (usable) {
    return DeviceChoice{true, absl::StrCat("device: ", std::string(DeviceKindName(configured)),
                                           ", slot arenas in GPU memory (", seen, ")")};
  }
  if (configured == DeviceKind::kCuda) {
    return absl::FailedPreconditionError(absl::StrCat("device: cuda, but GPU slot arenas are unavailable: ", seen));
  }
  return DeviceChoice{false, absl::StrCat("device: auto found no usable GPU (", seen,
                                          "): slot arenas in host memory; CUDA engines cannot use them "
                                          "unless they ask for a private arena")};
}

}  // namespace hisparse
