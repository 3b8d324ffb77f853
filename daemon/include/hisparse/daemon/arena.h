// Arena: a session's slot arena as the daemon owns it, whatever memory it is in and however it is
// shared with the engine. The one typed seam between SessionManager and the sharing forms: the
// session manager picks the form once, when the session opens (MakeHostArena, or WrapGpuArena
// around what the GPU allocator returned), and after that only asks the arena what it is, hands
// it out over the fd channel (Export) and reads RESOLVE's counters from it (ReadCounters).
//
// Forms today (v1::ArenaKind):
//   ARENA_KIND_HOST      a sealed host memfd; the daemon maps only its counters page
//   ARENA_KIND_CUDA_VMM  GPU memory (GpuArena), exported as a POSIX fd
//   ARENA_KIND_CUDA_IPC  GPU memory (GpuArena), shared as a 64-byte cudaIpc handle
//
// Ownership: an Arena owns its memory (the memfd and the mapping, or the GpuArena) and releases it
// when destroyed; a session holds it in a shared_ptr so that Stats and the fd channel may use it
// outside the session core's lock. Every method is const and thread-safe.
#ifndef HISPARSE_DAEMON_ARENA_H_
#define HISPARSE_DAEMON_ARENA_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "hisparse/common/fd_channel_codec.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/daemon/gpu_arena.h"
#include "hisparse/kernels/arena_layout.h"
#include "hisparse/v1/hisparse.pb.h"

namespace hisparse {

// What the fd channel sends for an arena: the grant (its bytes, form and, for kCudaIpc, the
// handle) and, for form kFd, a new close-on-exec descriptor that the caller owns.
struct ExportedArena {
  FdOk grant;
  UniqueFd fd;
};

class Arena {
 public:
  virtual ~Arena() = default;
  virtual v1::ArenaKind kind() const = 0;
  // The memory's size: the geometry's bytes, rounded up to the allocator's granularity on a GPU.
  virtual uint64_t bytes() const = 0;
  // Whether the arena is host memory (counted against limits.host_arena_bytes).
  bool in_host_memory() const { return kind() == v1::ARENA_KIND_HOST; }
  // The arena for the engine, in its sharing form.
  virtual absl::StatusOr<ExportedArena> Export() const = 0;
  // RESOLVE's counters as the engine's kernels left them (a GPU arena: a device copy, which may
  // wait on the GPU; call it outside locks).
  virtual absl::Status ReadCounters(ArenaCounters* out) const = 0;
};

// A host memfd of `layout.total_bytes`, of which only the counters (at layout.counters) are mapped
// here: a session's address-space cost in the daemon is one page, however large its arena.
absl::StatusOr<std::unique_ptr<Arena>> MakeHostArena(const ArenaOffsets& layout);

// The arena around a GPU allocation whose counters are at `counters_offset`; the form is the
// allocation's (GpuArena::kind: cuda-vmm or cuda-ipc).
std::unique_ptr<Arena> WrapGpuArena(std::unique_ptr<GpuArena> gpu, uint64_t counters_offset);

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_ARENA_H_
