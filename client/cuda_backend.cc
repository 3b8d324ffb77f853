// The CUDA device backend: the host pool's segments registered with CUDA (mapped, portable) so
// RESOLVE's GPU threads read host records directly; the slot arena, host record map, RESOLVE
// workspace and error flags in device memory on the session's GPU; kernels on the caller's stream.
//
// The slot arena is the daemon's when it offers one in GPU memory: kind "cuda-vmm" is imported
// from its fd and mapped here, kind "cuda-ipc" opened from its cudaIpc handle. Either way the
// daemon owns it, reads its counters and frees it when the session ends. Given a host arena
// (daemon device host, or auto where the daemon sees no GPU) the backend keeps a private
// cudaMalloc'ed arena only when the engine asked for one (PrivateGpuArenaAllowed); hs_stats_get
// then reads its counters here, and hs_session_info says HS_ARENA_PRIVATE_GPU.
#include <cuda_runtime.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cuda_driver_check.h"
#include "device_backend.h"
#include "hisparse/common/cuda_vmm.h"
#include "hisparse/common/device_buffer.h"
#include "hisparse/kernels/prewarm_cuda.h"
#include "hisparse/kernels/resolve_cuda.h"
#include "hisparse/kernels/topk_cuda.h"

namespace hisparse {
namespace {

absl::Status CudaError(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  const char* why = LastLaunchError();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e), (why && *why) ? " (" : "", why ? why : "",
                                          (why && *why) ? ")" : ""));
}

class CudaBackend final : public DeviceBackend {
 public:
  CudaBackend(int gpu, const ArenaGeometry& g, const HostPageGeometry& p) : gpu_(gpu), g_(g), pages_(p) {}

  absl::Status Init() {
    if (auto e = cudaSetDevice(gpu_); e != cudaSuccess) return CudaError(e, absl::StrCat("cudaSetDevice(", gpu_, ")"));
    const size_t rows = g_.max_rows, entries = rows * g_.num_layers * pages_.pages_per_entry;
    host_base_.assign(entries, nullptr);
    if (auto e = DeviceBuffer::Allocate(entries * sizeof(uint8_t*), &dev_base_); e != cudaSuccess) {
      return CudaError(e, "host map");
    }
    if (auto e = DeviceBuffer::Allocate(rows * sizeof(int32_t), &dev_capacity_); e != cudaSuccess) {
      return CudaError(e, "host map");
    }
    cudaMemset(dev_base_.get(), 0, dev_base_.bytes());
    cudaMemset(dev_capacity_.get(), 0, dev_capacity_.bytes());
    // counts_[i] == i: a device-resident batch size for calls that pass none, without a copy
    // (so even those stay capturable in a CUDA graph).
    std::vector<int32_t> counts(rows + 1);
    for (size_t i = 0; i <= rows; ++i) counts[i] = static_cast<int32_t>(i);
    if (auto e = DeviceBuffer::Allocate(counts.size() * sizeof(int32_t), &counts_); e != cudaSuccess) {
      return CudaError(e, "counts");
    }
    cudaMemcpy(counts_.get(), counts.data(), counts_.bytes(), cudaMemcpyHostToDevice);
    if (auto e = DeviceBuffer::Allocate(sizeof(uint32_t), &errors_); e != cudaSuccess)
      return CudaError(e, "error flags");
    cudaMemset(errors_.get(), 0, sizeof(uint32_t));
    if (auto e = DeviceBuffer::Allocate(sizeof(uint32_t), &store_check_); e != cudaSuccess)
      return CudaError(e, "store check word");
    if (auto e = DeviceBuffer::Allocate(ResolveWorkspaceBytes(g_, g_.max_rows), &workspace_); e != cudaSuccess) {
      return CudaError(e, "RESOLVE workspace");
    }
    // The device's SM count, shared memory and RESOLVE's occupancy, asked once for the session
    // instead of at every launch. A geometry RESOLVE cannot run leaves launch_ unprepared: every
    // RESOLVE then fails with the launcher's own reason, as it would without a config.
    if (PrepareResolveLaunch(g_, &launch_) != cudaSuccess) (void)cudaGetLastError();  // not the next launch's
    if (auto e = InitResolveWorkspace(workspace_.get(), workspace_.bytes(), nullptr); e != cudaSuccess)
      return CudaError(e, "workspace");
    return CudaError(cudaDeviceSynchronize(), "backend setup");
  }

  ~CudaBackend() override {
    // No kernel may still use the arena or the buffers when the members free them, after this.
    cudaSetDevice(gpu_);
    cudaDeviceSynchronize();
  }

  hs_backend kind() const override { return HS_BACKEND_CUDA; }

  absl::StatusOr<uint8_t*> RegisterHostSegment(uint8_t* host, size_t bytes) override {
    cudaSetDevice(gpu_);
    if (auto e = cudaHostRegister(host, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable); e != cudaSuccess) {
      return CudaError(e, "registering a host pool segment with CUDA (is the memlock limit high enough?)");
    }
    void* dev = nullptr;
    if (auto e = cudaHostGetDevicePointer(&dev, host, 0); e != cudaSuccess) {
      cudaHostUnregister(host);
      return CudaError(e, "device address of a host pool segment");
    }
    return static_cast<uint8_t*>(dev);
  }
  void UnregisterHostSegment(uint8_t* host) override { cudaHostUnregister(host); }

  absl::StatusOr<ArenaView> Attach(const AttachedArena& arena, const ArenaGeometry& g) override {
    switch (arena.form) {
      case AttachedArena::Form::kHostMapped:
        return AttachPrivateArena(g);
      case AttachedArena::Form::kCudaVmmFd:
        return AttachVmmArena(arena.fd, arena.bytes, g);
      case AttachedArena::Form::kCudaIpcHandle:
        return AttachIpcArena(arena.handle, arena.bytes, g);
    }
    return absl::InternalError("an arena of no known form");
  }
  void ReleaseArena() override {
    cudaSetDevice(gpu_);
    cudaDeviceSynchronize();
    ipc_arena_.reset();
    shared_arena_.reset();
  }
  void LastImportTimes(double* import_s, double* map_s) const override {
    *import_s = import_times_.import_s;
    *map_s = import_times_.map_s;
  }

  HostRecordMap host_map() const override {
    return HostRecordMap{dev_base_.as<uint8_t*>(), dev_capacity_.as<int32_t>(), pages_.records_per_page,
                         pages_.pages_per_entry};
  }

  absl::Status SetHostMapRow(int32_t row, const uint8_t* const* pages, uint32_t pages_given,
                             int32_t capacity) override {
    if (absl::Status st = CheckHostMapRow(g_, pages_, row, pages, pages_given, capacity); !st.ok()) return st;
    FillHostMapRow(g_, pages_, row, pages, pages_given, capacity, host_base_.data());
    const size_t per_row = static_cast<size_t>(g_.num_layers) * pages_.pages_per_entry;
    const size_t first = static_cast<size_t>(row) * per_row;
    // Control path: synchronous copies, so the next data-path launch sees the row.
    if (auto e = cudaMemcpy(dev_base_.as<uint8_t*>() + first, host_base_.data() + first, per_row * sizeof(uint8_t*),
                            cudaMemcpyHostToDevice);
        e != cudaSuccess) {
      return CudaError(e, "publishing a row of the host map");
    }
    return CudaError(cudaMemcpy(dev_capacity_.as<int32_t>() + row, &capacity, sizeof(int32_t), cudaMemcpyHostToDevice),
                     "host map");
  }

  absl::Status ResetRow(const ArenaView& arena, int32_t row, void* stream) override {
    if (auto e = LaunchResetRow(arena, row, static_cast<cudaStream_t>(stream)); e != cudaSuccess) {
      return CudaError(e, "reset row");
    }
    return CudaError(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "reset row");
  }
  absl::Status Resolve(const ResolveDesc& desc, const ResolvePlacement& placement, void* stream) override {
    ResolveDesc d = desc;
    if (d.batch_size == nullptr) {
      if (d.max_batch > g_.max_rows) return absl::InvalidArgumentError("max_batch exceeds the session's rows");
      d.batch_size = counts_.as<int32_t>() + d.max_batch;
    }
    ResolveLaunchConfig how = launch_;
    how.order = placement.order;
    how.max_blocks = placement.max_blocks;
    how.consumer_warps = placement.consumer_warps;
    how.early_dependents = placement.early_dependents;
    return CudaError(LaunchResolve(d, workspace_.get(), workspace_.bytes(), how, static_cast<cudaStream_t>(stream)),
                     "RESOLVE launch");
  }
  absl::Status Store(const StoreDesc& desc, void* stream) override {
    StoreDesc d = desc;
    d.check = store_check_.as<uint32_t>();
    d.error_flags = errors_.as<uint32_t>();
    return CudaError(LaunchStore(d, static_cast<cudaStream_t>(stream)), "store launch");
  }
  absl::Status StoreIndexed(const IndexedStoreDesc& desc, void* stream) override {
    IndexedStoreDesc d = desc;
    d.check = store_check_.as<uint32_t>();
    d.error_flags = errors_.as<uint32_t>();
    return CudaError(LaunchStoreIndexed(d, static_cast<cudaStream_t>(stream)), "indexed store launch");
  }
  absl::Status Append(const AppendDesc& desc, void* stream) override {
    AppendDesc d = desc;
    if (d.batch_size == nullptr) {
      if (d.max_batch > g_.max_rows) return absl::InvalidArgumentError("max_batch exceeds the session's rows");
      d.batch_size = counts_.as<int32_t>() + d.max_batch;
    }
    return CudaError(LaunchAppend(d, static_cast<cudaStream_t>(stream)), "append launch");
  }
  absl::StatusOr<MissPlan> AllocMissPlan() override {
    cudaSetDevice(gpu_);
    DeviceBuffer plan;
    if (auto e = DeviceBuffer::Allocate(MissPlan::Bytes(g_, g_.max_rows), &plan); e != cudaSuccess) {
      return CudaError(e, "miss plan");
    }
    plans_.push_back(std::move(plan));
    return MissPlan::Of(plans_.back().get(), g_.max_rows);
  }
  absl::Status Replay(const ReplayDesc& d, void* stream) override {
    return CudaError(LaunchReplay(d, launch_, static_cast<cudaStream_t>(stream)), "prefetch launch");
  }
  absl::Status Prewarm(const PrewarmDesc& desc, void* stream) override {
    PrewarmDesc d = desc;
    if (d.batch_size == nullptr) d.batch_size = counts_.as<int32_t>() + d.max_batch;
    return CudaError(LaunchPrewarm(d, launch_, static_cast<cudaStream_t>(stream)), "prewarm launch");
  }
  absl::Status CheckErrors() override {
    if (auto e = cudaDeviceSynchronize(); e != cudaSuccess) return CudaError(e, "data path");
    uint32_t bits = 0;
    cudaMemcpy(&bits, errors_.get(), sizeof(bits), cudaMemcpyDeviceToHost);
    cudaMemset(errors_.get(), 0, sizeof(bits));
    return bits == 0 ? absl::OkStatus() : absl::InvalidArgumentError(DescribeResolveErrors(bits));
  }
  uint32_t* error_flags() override { return errors_.as<uint32_t>(); }
  absl::StatusOr<ArenaCounters> ReadCounters() override {
    ArenaCounters c{};
    if (auto e = cudaMemcpy(&c, view_.counters, sizeof(c), cudaMemcpyDeviceToHost); e != cudaSuccess) {
      return CudaError(e, "reading RESOLVE counters");
    }
    return c;
  }

 private:
  // The daemon's arena is host memory: keep a private one on the GPU, if the engine asked.
  absl::StatusOr<ArenaView> AttachPrivateArena(const ArenaGeometry& g) {
    if (absl::Status st = PrivateGpuArenaAllowed(std::getenv(kPrivateGpuArenaEnv)); !st.ok()) return st;
    cudaSetDevice(gpu_);
    // A session recovered onto this backend (ClientSession::Recover) keeps the arena, cleared.
    const uint64_t bytes = ComputeArenaOffsets(g).total_bytes;
    if (arena_.bytes() != bytes) {
      if (auto e = DeviceBuffer::Allocate(bytes, &arena_); e != cudaSuccess) {
        return CudaError(e, "allocating the slot arena");
      }
    }
    if (auto e = cudaMemset(arena_.get(), 0, arena_.bytes()); e != cudaSuccess) {
      return CudaError(e, "clearing the slot arena");
    }
    if (auto e = cudaDeviceSynchronize(); e != cudaSuccess) return CudaError(e, "clearing the slot arena");
    view_ = ArenaView::Of(arena_.as<uint8_t>(), g);
    return view_;
  }
  // The daemon's GPU arena (already zeroed by the daemon).
  absl::StatusOr<ArenaView> AttachVmmArena(int fd, uint64_t bytes, const ArenaGeometry& g) {
    if (shared_arena_ != nullptr && shared_arena_->bytes() == bytes) {
      // A session recovered onto this backend (ClientSession::Recover): the new daemon's arena at
      // the address kernels and captured graphs kept.
      cudaSetDevice(gpu_);
      cudaDeviceSynchronize();
      if (absl::Status st = shared_arena_->Reimport(fd, bytes); st.ok()) return ViewOf(shared_arena_->ptr(), g);
    }
    shared_arena_.reset();  // another size, or a failed reimport: a fresh import at a new address
    absl::StatusOr<std::unique_ptr<cuvmm::VmmMapping>> m = cuvmm::VmmMapping::Import(gpu_, fd, bytes, &import_times_);
    if (!m.ok()) return m.status();
    shared_arena_ = std::move(*m);
    return ViewOf(shared_arena_->ptr(), g);
  }
  // The daemon's GPU arena through the cudaIpc fallback (cuIpcOpenMemHandle; closed with us).
  absl::StatusOr<ArenaView> AttachIpcArena(const std::string& handle, uint64_t bytes, const ArenaGeometry& g) {
    absl::StatusOr<std::unique_ptr<cuvmm::IpcMapping>> m = cuvmm::IpcMapping::Open(gpu_, handle, bytes, &import_times_);
    if (!m.ok()) return m.status();
    ipc_arena_ = std::move(*m);
    return ViewOf(ipc_arena_->ptr(), g);
  }
  ArenaView ViewOf(CUdeviceptr ptr, const ArenaGeometry& g) {
    // A CUdeviceptr is an integer the driver hands out; kernels need it as a pointer.
    view_ = ArenaView::Of(reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(ptr)),  // NOLINT(performance-no-int-to-ptr)
                          g);
    return view_;
  }

  const int gpu_;
  const ArenaGeometry g_;
  const HostPageGeometry pages_;
  DeviceBuffer arena_;                               // the private arena (the engine asked for one), else empty
  std::unique_ptr<cuvmm::VmmMapping> shared_arena_;  // the daemon's GPU arena, mapped here (cuda-vmm)
  std::unique_ptr<cuvmm::IpcMapping> ipc_arena_;     // or opened here (cuda-ipc)
  cuvmm::ImportTimes import_times_;
  ArenaView view_{};
  std::vector<uint8_t*> host_base_;
  DeviceBuffer dev_base_;            // uint8_t*[rows * layers * pages_per_entry]: the host page tables
  DeviceBuffer dev_capacity_;        // int32_t[rows]
  DeviceBuffer counts_;              // int32_t[rows + 1], counts_[i] == i
  DeviceBuffer errors_;              // uint32_t: ResolveError bits
  DeviceBuffer store_check_;         // uint32_t: a store's check verdict (stores are ordered)
  DeviceBuffer workspace_;           // RESOLVE's
  ResolveLaunchConfig launch_;       // PrepareResolveLaunch's for gpu_ and g_, at Init
  std::vector<DeviceBuffer> plans_;  // miss plans of anchor layers
};

}  // namespace

absl::StatusOr<std::string> CudaGpuUuid(int gpu) {
  cudaDeviceProp prop{};
  if (cudaError_t e = cudaGetDeviceProperties(&prop, gpu); e != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it for the calls that follow
    return absl::UnavailableError(absl::StrCat("cudaGetDeviceProperties(", gpu, "): ", cudaGetErrorString(e)));
  }
  return std::string(prop.uuid.bytes, sizeof(prop.uuid.bytes));
}

absl::Status LaunchTopkOn(int gpu, const TopkDesc& d, void* stream) {
  int current = -1;
  if (cudaError_t e = cudaGetDevice(&current); e != cudaSuccess) return CudaError(e, "cudaGetDevice");
  if (current != gpu) {
    if (cudaError_t e = cudaSetDevice(gpu); e != cudaSuccess) {
      (void)cudaGetLastError();
      return absl::InvalidArgumentError(absl::StrCat("cudaSetDevice(", gpu, "): ", cudaGetErrorString(e)));
    }
  }
  absl::Status st = CudaError(LaunchTopk(d, static_cast<cudaStream_t>(stream)), "top-k launch");
  if (current != gpu) cudaSetDevice(current);
  return st;
}

absl::StatusOr<std::unique_ptr<DeviceBackend>> MakeCudaBackend(int gpu, const ArenaGeometry& g,
                                                               const HostPageGeometry& pages) {
  // An old driver is the commonest reason a CUDA session cannot open on a node: say which driver
  // is needed before the runtime answers with cudaErrorInsufficientDriver.
  int driver = 0;
  int runtime = 0;
  cudaDriverGetVersion(&driver);  // 0 without a driver
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = CUDART_VERSION;
  if (absl::Status st = CheckCudaDriver(driver, runtime); !st.ok()) return st;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    return absl::UnavailableError("no CUDA device is present: use the host backend");
  }
  if (gpu < 0 || gpu >= count) {
    return absl::InvalidArgumentError(absl::StrCat("gpu ", gpu, " is not a CUDA device here (", count, " present)"));
  }
  auto backend = std::make_unique<CudaBackend>(gpu, g, pages);
  if (auto st = backend->Init(); !st.ok()) return st;
  return backend;
}

}  // namespace hisparse
