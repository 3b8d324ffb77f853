#include "hisparse/daemon/device_choice.h"

#include "absl/strings/str_cat.h"

namespace hisparse {
namespace {

// What a container on a GPU node needs for the daemon to see the GPUs (docs/DEPLOY.md, "What the
// node needs"): the host's driver library comes with the NVIDIA container runtime.
constexpr char kContainerAdvice[] =
    "this node runs the NVIDIA driver but libcuda.so.1 is not in this container: run hisparsed under the NVIDIA "
    "container runtime (Kubernetes: runtimeClassName: nvidia; env NVIDIA_VISIBLE_DEVICES=all and "
    "NVIDIA_DRIVER_CAPABILITIES=compute,utility; no libcuda in the image; docs/DEPLOY.md)";

std::string WhatWasSeen(const GpuProbe& probe) {
  if (probe.status.ok()) return absl::StrCat("the CUDA driver sees ", probe.gpus, " GPU(s)");
  std::string seen(probe.status.message());
  if (probe.driver == DriverView::kMissingOnGpuNode) absl::StrAppend(&seen, "; ", kContainerAdvice);
  if (probe.driver == DriverView::kNoDriver) absl::StrAppend(&seen, "; no NVIDIA driver on this machine");
  return seen;
}

}  // namespace

absl::StatusOr<DeviceChoice> ChooseDevice(DeviceKind configured, const GpuProbe& probe) {
  if (configured == DeviceKind::kHost) {
    return DeviceChoice{false, "device: host, slot arenas in host memory (asked for explicitly)"};
  }
  const bool usable = probe.status.ok() && probe.gpus >= 1;
  const std::string seen = WhatWasSeen(probe);
  if (usable) {
    return DeviceChoice{true, absl::StrCat("device: ", std::string(DeviceKindName(configured)),
                                           ", slot arenas in GPU memory (", seen, ")")};
  }
  if (configured == DeviceKind::kCuda) {
    return absl::FailedPreconditionError(absl::StrCat("device: cuda, but GPU slot arenas are unavailable: ", seen));
  }
  return DeviceChoice{false,
                      absl::StrCat("device: auto found no usable GPU (", seen,
                                   "): slot arenas in host memory; CUDA engines cannot use them "
                                   "unless they ask for a private arena"),
                      probe.driver == DriverView::kMissingOnGpuNode};
}

}  // namespace hisparse
