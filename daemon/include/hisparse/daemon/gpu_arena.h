// GpuArena: a session's slot arena in GPU memory, owned by the daemon and handed to the engine as
// an fd. The seam between SessionManager and CUDA: the daemon uses the CUDA VMM allocator
// (cuMemCreate, exported as a POSIX fd); tests inject a fake through SessionManager::Options.
#ifndef HISPARSE_DAEMON_GPU_ARENA_H_
#define HISPARSE_DAEMON_GPU_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "hisparse/common/unique_fd.h"

namespace hisparse {

class GpuArena {
 public:
  virtual ~GpuArena() = default;  // releases the GPU memory (this process's share of it)
  virtual int gpu() const = 0;
  // The allocation's size: the geometry's bytes rounded up to the allocator's granularity.
  virtual uint64_t bytes() const = 0;
  // "cuda-vmm" (SessionOpened.arena.kind).
  virtual std::string kind() const = 0;
  // A new close-on-exec descriptor for the engine (sent with SCM_RIGHTS).
  virtual absl::StatusOr<UniqueFd> Export() const = 0;
  // Copies `n` bytes at `offset` to host memory: the daemon reads RESOLVE's counters this way.
  virtual absl::Status Read(uint64_t offset, void* dst, size_t n) const = 0;
};

// Allocates a zeroed arena of at least `bytes` on GPU `gpu`.
using GpuArenaAllocator = std::function<absl::StatusOr<std::unique_ptr<GpuArena>>(int gpu, uint64_t bytes)>;

// The CUDA VMM allocator. Unavailable in builds without CUDA, on hosts without a CUDA driver and
// where the driver sees no GPU. `gpu_count` (may be null) receives the number of GPUs.
absl::StatusOr<GpuArenaAllocator> MakeVmmArenaAllocator(int* gpu_count);

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_GPU_ARENA_H_
