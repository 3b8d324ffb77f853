// GpuArena: a session's slot arena in GPU memory, owned by the daemon and handed to the engine. The
// seam between SessionManager and CUDA. Two ways to share it, chosen per GPU (ChooseArenaKind):
//   "cuda-vmm": cuMemCreate, exported as a POSIX fd (sent with SCM_RIGHTS); the preferred path.
//   "cuda-ipc": cuMemAlloc + a legacy 64-byte cudaIpc handle (sent as data over the fd channel),
//               the fallback where the GPU cannot export VMM allocations as fds.
// Tests inject a fake allocator through SessionManager::Options.
#ifndef HISPARSE_DAEMON_GPU_ARENA_H_
#define HISPARSE_DAEMON_GPU_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/daemon/device_choice.h"

namespace hisparse {

inline constexpr char kArenaKindHost[] = "host";
inline constexpr char kArenaKindVmm[] = "cuda-vmm";
inline constexpr char kArenaKindIpc[] = "cuda-ipc";

class GpuArena {
 public:
  virtual ~GpuArena() = default;  // releases the GPU memory (this process's share of it)
  virtual int gpu() const = 0;
  // The allocation's size: the geometry's bytes rounded up to the allocator's granularity.
  virtual uint64_t bytes() const = 0;
  // kArenaKindVmm or kArenaKindIpc (SessionOpened.arena.kind).
  virtual std::string kind() const = 0;
  // cuda-vmm: a new close-on-exec descriptor for the engine (sent with SCM_RIGHTS).
  virtual absl::StatusOr<UniqueFd> Export() const = 0;
  // cuda-ipc: the allocation's cudaIpc handle (64 bytes).
  virtual absl::StatusOr<std::string> IpcHandle() const {
    return absl::FailedPreconditionError("this GPU arena is shared as an fd, not a cudaIpc handle");
  }
  // Copies `n` bytes at `offset` to host memory: the daemon reads RESOLVE's counters this way.
  virtual absl::Status Read(uint64_t offset, void* dst, size_t n) const = 0;
};

// Allocates a zeroed arena of at least `bytes` on GPU `gpu`.
using GpuArenaAllocator = std::function<absl::StatusOr<std::unique_ptr<GpuArena>>(int gpu, uint64_t bytes)>;

// gpu.arena_export: how GPU arenas are shared with engines.
enum class ArenaExport { kAuto, kVmm, kCudaIpc };

// The arena kind for a GPU whose VMM fd export support is `vmm_fd_supported`: auto takes VMM where
// it is supported and cuda-ipc elsewhere; vmm refuses a GPU without it (FailedPrecondition);
// cuda_ipc always takes cuda-ipc.
absl::StatusOr<std::string> ChooseArenaKind(ArenaExport mode, bool vmm_fd_supported, int gpu);

// The CUDA allocator: per GPU, probes VMM fd export once, picks the kind with ChooseArenaKind and
// allocates that way. Unavailable in builds without CUDA, on hosts without a CUDA driver and where
// the driver sees no GPU. `gpu_count` (may be null) receives the number of GPUs.
absl::StatusOr<GpuArenaAllocator> MakeCudaArenaAllocator(ArenaExport mode, int* gpu_count);

// The UUID of each GPU the CUDA driver sees, by ordinal (16 bytes each; cuDeviceGetUuid):
// SessionManager::Options::gpu_uuids. Unavailable as MakeCudaArenaAllocator is.
absl::StatusOr<std::vector<std::string>> CudaGpuUuids();
// A GPU UUID of 16 bytes as nvidia-smi prints it ("GPU-" and 32 hex digits in groups of
// 8-4-4-4-12); other sizes as plain hex.
std::string GpuUuidText(const std::string& uuid);

// The NVIDIA driver as this process sees it, after MakeCudaArenaAllocator tried to load
// libcuda.so.1: asks the loader whether it holds libcuda.so.1, else looks for the kernel driver
// (/proc/driver/nvidia/version). kNotBuilt in builds without CUDA. For ChooseDevice's message.
DriverView SeeCudaDriver();

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_GPU_ARENA_H_
