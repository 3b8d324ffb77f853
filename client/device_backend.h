// DeviceBackend: the one seam between the client and a device. The host-emulated backend keeps
// the arena in host memory and runs the CPU reference; the CUDA backend registers the host pool
// with CUDA (mapped), keeps the arena on the GPU and launches the kernels on the caller's stream.
// Tests and machines without a GPU use the host backend; everything above this seam is the same.
//
// A backend belongs to one ClientSession, which serializes the control calls that change its state
// (the host map, the arena) under its lock; host-segment registration runs outside it (below).
// Data-path calls are ordered by the caller.
#ifndef HISPARSE_CLIENT_DEVICE_BACKEND_H_
#define HISPARSE_CLIENT_DEVICE_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "hisparse/hisparse.h"
#include "hisparse/kernels/prewarm.h"
#include "hisparse/kernels/resolve.h"
#include "hisparse/kernels/topk.h"

namespace hisparse {

// The daemon's slot arena as this process received it, in one of its sharing forms (the kind in
// SessionOpened.arena, fetched over the fd channel). Borrowed: nothing here is owned.
struct AttachedArena {
  enum class Form {
    kHostMapped,     // a host memfd ("host"), mapped into this process at `mapped`
    kCudaVmmFd,      // GPU memory ("cuda-vmm"): a CUDA VMM allocation's POSIX `fd`, not consumed
    kCudaIpcHandle,  // GPU memory ("cuda-ipc"): the allocation's 64-byte cudaIpc `handle`
  };
  Form form = Form::kHostMapped;
  uint64_t bytes = 0;  // the allocation's size (kHostMapped: the mapping's)
  uint8_t* mapped = nullptr;
  int fd = -1;
  std::string handle;
};

// How a RESOLVE launch places itself (hs_resolve_args.launch_flags, .max_blocks and .consumer_warps):
// its order after the previous kernel, the most thread blocks it may occupy (0: as many as the
// device holds) and the warps of each that fetch (0: the kernels' choice). None changes a result;
// the host backend ignores them.
struct ResolvePlacement {
  LaunchOrder order = LaunchOrder::kAfterCompletion;  // resolve.h
  int32_t max_blocks = 0;
  int32_t consumer_warps = 0;     // ResolveLaunchConfig::consumer_warps
  bool early_dependents = false;  // HS_RESOLVE_LAUNCH_EARLY_DEPENDENTS
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual hs_backend kind() const = 0;

  // Makes a mapped host-pool segment readable by kernels; returns the address kernels use. These
  // two run outside the session's lock, possibly on several threads at once (each segment on
  // one): they must keep no state of the backend's (cudaHostRegister is thread-safe) and may
  // block (a large registration takes ~0.1 s/GiB) without holding up any other call.
  virtual absl::StatusOr<uint8_t*> RegisterHostSegment(uint8_t* host, size_t bytes) = 0;
  virtual void UnregisterHostSegment(uint8_t* host) = 0;

  // Sets up the slot arena of geometry `g` from the daemon's arena in whichever form it came;
  // returns the view kernels use. The host backend takes kHostMapped only, the CUDA backend every
  // form (for kHostMapped it keeps a private GPU arena, PrivateGpuArenaAllowed); a form the
  // backend cannot use is FailedPrecondition saying what to do instead. Imports (GPU forms) are
  // held until ReleaseArena or the backend's end.
  virtual absl::StatusOr<ArenaView> Attach(const AttachedArena& arena, const ArenaGeometry& g) = 0;
  // Waits for the device and lets go of the daemon's GPU arena (unmap / cuIpcCloseMemHandle); the
  // session calls it before it ends, so no import outlives the daemon's free. Nothing for host.
  virtual void ReleaseArena() {}
  // Seconds the last Attach of a GPU form spent importing and mapping (benchmarks).
  virtual void LastImportTimes(double* import_s, double* map_s) const { *import_s = *map_s = 0; }

  // The host page tables that kernels read (arena_layout.h), of the HostPageGeometry the backend
  // was made with: (row, layer, page) -> kernel-visible page address.
  virtual HostRecordMap host_map() const = 0;
  // Publishes row `row`'s tables, layer-major: pages[l * pages_given + i], i < pages_given <=
  // pages_per_entry, in kernel address space, bit 0 set for a read-only (shared) page; the rest of
  // the row's table becomes null. capacity 0 clears the row (pages may then be null). Bad input
  // (CheckHostMapRow) is InvalidArgument and changes nothing.
  virtual absl::Status SetHostMapRow(int32_t row, const uint8_t* const* pages, uint32_t pages_given,
                                     int32_t capacity) = 0;

  virtual absl::Status ResetRow(const ArenaView& arena, int32_t row, void* stream) = 0;
  // Returns InvalidArgument naming the error bits when the backend can tell at once (host).
  virtual absl::Status Resolve(const ResolveDesc& d, const ResolvePlacement& placement, void* stream) = 0;
  virtual absl::Status Store(const StoreDesc& d, void* stream) = 0;
  // Indexed store (hs_store_indexed). The backend supplies d.check (CUDA: a device word of its
  // own) and d.error_flags; an index outside the pool is InvalidArgument at once on host, a flag
  // for CheckErrors on CUDA.
  virtual absl::Status StoreIndexed(const IndexedStoreDesc& d, void* stream) = 0;
  virtual absl::Status Append(const AppendDesc& d, void* stream) = 0;
  // Memory for one anchor layer's miss plan, for batches of up to the session's rows, where
  // kernels can write it; the backend owns it until it is destroyed.
  virtual absl::StatusOr<MissPlan> AllocMissPlan() = 0;
  // Exact prefetch of a shared layer from its anchor's plan (ReplayDesc).
  virtual absl::Status Replay(const ReplayDesc& d, void* stream) = 0;
  // The translations of rows' host records, made ahead (PrewarmDesc, checked; batch_size may be
  // null: the backend supplies max_batch, <= the session's rows, in its own memory space).
  virtual absl::Status Prewarm(const PrewarmDesc& d, void* stream) = 0;
  // Error flags that kernels set since the last call; waits for the whole device (CUDA: every
  // stream, so that kernels on a side stream, e.g. prefetch, have landed their flags too).
  virtual absl::Status CheckErrors() = 0;
  // Where kernels OR their ResolveError bits (nullptr for host: errors are returned at once).
  virtual uint32_t* error_flags() = 0;
  // The session's RESOLVE counters as the data path left them.
  virtual absl::StatusOr<ArenaCounters> ReadCounters() = 0;
};

// The shape of a session's host page tables (arena_layout.h): R, records per page, and the table
// stride of one (row, layer). The default is one contiguous run per (row, layer).
struct HostPageGeometry {
  uint32_t records_per_page = kContiguousRecordsPerPage;
  uint32_t pages_per_entry = 1;
};

// SetHostMapRow's checks, shared by the backends: row in [0, max_rows); capacity >= 0; for
// capacity > 0, pages_given in [1, pages_per_entry], capacity <= pages_given * R and, in every
// layer, the ceil(capacity / R) pages that hold positions non-null; every non-null page 16-byte
// aligned once bit 0 (read-only) is cleared.
absl::Status CheckHostMapRow(const ArenaGeometry& g, const HostPageGeometry& p, int32_t row,
                             const uint8_t* const* pages, uint32_t pages_given, int32_t capacity);
// Writes row `row`'s tables (already checked) into `table` ([max_rows * layers * pages_per_entry]).
void FillHostMapRow(const ArenaGeometry& g, const HostPageGeometry& p, int32_t row, const uint8_t* const* pages,
                    uint32_t pages_given, int32_t capacity, uint8_t** table);

std::unique_ptr<DeviceBackend> MakeHostBackend(const ArenaGeometry& g, const HostPageGeometry& pages = {});
// Available in CUDA builds (HISPARSE_HAVE_CUDA); elsewhere returns Unimplemented.
absl::StatusOr<std::unique_ptr<DeviceBackend>> MakeCudaBackend(int gpu, const ArenaGeometry& g,
                                                               const HostPageGeometry& pages = {});

// TOP-K (kernels/include/hisparse/kernels/topk.h) enqueued on `stream` of CUDA device `gpu`, which
// is made current for the launch and the caller's current device restored after. `d` must pass
// CheckTopkDesc. Unimplemented in builds without CUDA. No session: hs_topk's device path.
absl::Status LaunchTopkOn(int gpu, const TopkDesc& d, void* stream);

// GPU `gpu`'s UUID (16 bytes; Geometry.gpu_uuid), as the CUDA runtime reports it. Unimplemented
// in builds without CUDA; an error where the runtime sees no such device.
absl::StatusOr<std::string> CudaGpuUuid(int gpu);

// The environment variable by which an engine asks for a private GPU arena (value "1").
inline constexpr char kPrivateGpuArenaEnv[] = "HISPARSE_PRIVATE_GPU_ARENA";
// Whether the CUDA backend may keep a private GPU arena when the daemon serves the session a host
// arena (its device is host, or auto where it sees no GPU): only when the engine asked, with
// `request` (the value of kPrivateGpuArenaEnv, may be null) "1". The daemon cannot read a private
// arena's RESOLVE counters nor count its GPU memory, so without the ask it is FailedPrecondition
// with what to do instead.
absl::Status PrivateGpuArenaAllowed(const char* request);

// "resolve: row 3 position out of range" style text for a set of ResolveError bits.
std::string DescribeResolveErrors(uint32_t bits);

}  // namespace hisparse

#endif  // HISPARSE_CLIENT_DEVICE_BACKEND_H_
