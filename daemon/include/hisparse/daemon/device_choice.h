// ChooseDevice: which memory the daemon puts GPU sessions' slot arenas in, decided once at start
// from the configured `device` and what probing for GPU arenas found. A pure function, so every
// case is pinned by a unit test on machines without a GPU (tests/daemon/device_choice_test.cc).
//
//   device: cuda  GPU arenas; start fails (FailedPrecondition) when the probe found no usable GPU.
//   device: auto  GPU arenas when the probe found one or more usable GPUs, else host arenas and
//                 `why` says what the probe saw (the daemon logs it; as a warning on a GPU node
//                 whose container lacks libcuda.so.1, with what the container needs).
//   device: host  host arenas whatever the probe saw (the explicit host-arena mode: CUDA engines
//                 then keep a private GPU arena only if they ask for one, see hisparse.h).
#ifndef HISPARSE_DAEMON_DEVICE_CHOICE_H_
#define HISPARSE_DAEMON_DEVICE_CHOICE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "hisparse/daemon/config.h"

namespace hisparse {

// What the daemon sees of the NVIDIA driver, for a start-up message an operator can act on. In a
// container the driver's user-space library (libcuda.so.1) is not in the image: the NVIDIA
// container runtime mounts the host's at start, so a GPU node's container without that runtime
// has the kernel driver but no libcuda.
enum class DriverView {
  kUnknown,           // not looked at
  kNotBuilt,          // this hisparsed was built without CUDA
  kLoaded,            // libcuda.so.1 is loaded
  kMissingOnGpuNode,  // no libcuda.so.1, but the kernel runs the NVIDIA driver (/proc/driver/nvidia)
  kNoDriver,          // neither: a machine without NVIDIA GPUs
};

// What probing for GPU arenas (MakeCudaArenaAllocator) found: its status and, when it succeeded,
// the number of GPUs the driver sees; `driver` from SeeCudaDriver() (gpu_arena.h) after the probe.
struct GpuProbe {
  absl::Status status;
  int gpus = 0;
  DriverView driver = DriverView::kUnknown;
};

struct DeviceChoice {
  bool gpu_arenas = false;  // true: GPU sessions' arenas in GPU memory (the device is "cuda")
  std::string why;          // one line for the start-up log
  // true: `why` reports a GPU node the daemon cannot use (logged as a warning, not as info).
  bool warn = false;
  // "cuda" or "host": the device in use (StatsResponse.device).
  const char* device() const { return gpu_arenas ? "cuda" : "host"; }
};

absl::StatusOr<DeviceChoice> ChooseDevice(DeviceKind configured, const GpuProbe& probe);

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_DEVICE_CHOICE_H_
