// ChooseDevice: which memory the daemon puts GPU sessions' slot arenas in, decided once at start
// from the configured `device` and what probing for GPU arenas found. A pure function, so every
// case is pinned by a unit test on machines without a GPU (tests/daemon/device_choice_test.cc).
//
//   device: cuda  GPU arenas; start fails (FailedPrecondition) when the probe found no usable GPU.
//   device: auto  GPU arenas when the probe found one or more usable GPUs, else host arenas and
//                 `why` says what the probe saw (the daemon logs it).
//   device: host  host arenas whatever the probe saw (the explicit host-arena mode: CUDA engines
//                 then keep a private GPU arena only if they ask for one, see hisparse.h).
#ifndef HISPARSE_DAEMON_DEVICE_CHOICE_H_
#define HISPARSE_DAEMON_DEVICE_CHOICE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "hisparse/daemon/config.h"

namespace hisparse {

// What probing for GPU arenas (MakeCudaArenaAllocator) found: its status and, when it succeeded,
// the number of GPUs the driver sees.
struct GpuProbe {
  absl::Status status;
  int gpus = 0;
};

struct DeviceChoice {
  bool gpu_arenas = false;  // true: GPU sessions' arenas in GPU memory (the device is "cuda")
  std::string why;          // one line for the start-up log
  // "cuda" or "host": the device in use (StatsResponse.device).
  const char* device() const { return gpu_arenas ? "cuda" : "host"; }
};

absl::StatusOr<DeviceChoice> ChooseDevice(DeviceKind configured, const GpuProbe& probe);

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_DEVICE_CHOICE_H_
