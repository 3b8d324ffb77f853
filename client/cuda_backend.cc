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
#include "device_backend.h"
#include "hisparse/common/cuda_vmm.h"
#include "hisparse/kernels/resolve_cuda.h"

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
  CudaBackend(int gpu, const ArenaGeometry& g) : gpu_(gpu), g_(g) {}

  absl::Status Init() {
    if (auto e = cudaSetDevice(gpu_); e != cudaSuccess) return CudaError(e, absl::StrCat("cudaSetDevice(", gpu_, ")"));
    const size_t rows = g_.max_rows, entries = rows * g_.num_layers;
    host_base_.assign(entries, nullptr);
    if (auto e = cudaMalloc(&dev_base_, entries * sizeof(uint8_t*)); e != cudaSuccess) return CudaError(e, "host map");
    if (auto e = cudaMalloc(&dev_capacity_, rows * sizeof(int32_t)); e != cudaSuccess) return CudaError(e, "host map");
    cudaMemset(dev_base_, 0, entries * sizeof(uint8_t*));
    cudaMemset(dev_capacity_, 0, rows * sizeof(int32_t));
    // counts_[i] == i: a device-resident batch size for calls that pass none, without a copy
    // (so even those stay capturable in a CUDA graph).
    std::vector<int32_t> counts(rows + 1);
    for (size_t i = 0; i <= rows; ++i) counts[i] = static_cast<int32_t>(i);
    if (auto e = cudaMalloc(&counts_, counts.size() * sizeof(int32_t)); e != cudaSuccess) return CudaError(e, "counts");
    cudaMemcpy(counts_, counts.data(), counts.size() * sizeof(int32_t), cudaMemcpyHostToDevice);
    if (auto e = cudaMalloc(&errors_, sizeof(uint32_t)); e != cudaSuccess) return CudaError(e, "error flags");
    cudaMemset(errors_, 0, sizeof(uint32_t));
    workspace_bytes_ = ResolveWorkspaceBytes(g_, g_.max_rows);
    if (auto e = cudaMalloc(&workspace_, workspace_bytes_); e != cudaSuccess) return CudaError(e, "RESOLVE workspace");
    if (auto e = InitResolveWorkspace(workspace_, workspace_bytes_, nullptr); e != cudaSuccess)
      return CudaError(e, "workspace");
    return CudaError(cudaDeviceSynchronize(), "backend setup");
  }

  ~CudaBackend() override {
    // No kernel may still use the arena when it is unmapped below.
    cudaSetDevice(gpu_);
    cudaDeviceSynchronize();
    for (void* p : {static_cast<void*>(arena_), static_cast<void*>(dev_base_), static_cast<void*>(dev_capacity_),
                    static_cast<void*>(counts_), static_cast<void*>(errors_), workspace_}) {
      if (p != nullptr) cudaFree(p);
    }
    for (void* p : plans_) cudaFree(p);
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

  // The daemon's arena is host memory: keep a private one on the GPU, if the engine asked.
  absl::StatusOr<ArenaView> AttachArena(uint8_t*, const ArenaGeometry& g) override {
    if (absl::Status st = PrivateGpuArenaAllowed(std::getenv(kPrivateGpuArenaEnv)); !st.ok()) return st;
    cudaSetDevice(gpu_);
    arena_bytes_ = ComputeArenaOffsets(g).total_bytes;
    if (auto e = cudaMalloc(&arena_, arena_bytes_); e != cudaSuccess) return CudaError(e, "allocating the slot arena");
    if (auto e = cudaMemset(arena_, 0, arena_bytes_); e != cudaSuccess) return CudaError(e, "clearing the slot arena");
    if (auto e = cudaDeviceSynchronize(); e != cudaSuccess) return CudaError(e, "clearing the slot arena");
    view_ = ArenaView::Of(arena_, g);
    return view_;
  }
  // The daemon's GPU arena (already zeroed by the daemon).
  absl::StatusOr<ArenaView> AttachGpuArena(int fd, uint64_t bytes, const ArenaGeometry& g) override {
    absl::StatusOr<std::unique_ptr<cuvmm::VmmMapping>> m = cuvmm::VmmMapping::Import(gpu_, fd, bytes, &import_times_);
    if (!m.ok()) return m.status();
    shared_arena_ = std::move(*m);
    return ViewOf(shared_arena_->ptr(), g);
  }
  // The daemon's GPU arena through the cudaIpc fallback (cuIpcOpenMemHandle; closed with us).
  absl::StatusOr<ArenaView> AttachIpcArena(const std::string& handle, uint64_t bytes, const ArenaGeometry& g) override {
    absl::StatusOr<std::unique_ptr<cuvmm::IpcMapping>> m = cuvmm::IpcMapping::Open(gpu_, handle, bytes, &import_times_);
    if (!m.ok()) return m.status();
    ipc_arena_ = std::move(*m);
    return ViewOf(ipc_arena_->ptr(), g);
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
  HostRecordMap host_map() const override { return HostRecordMap{dev_base_, dev_capacity_}; }

  absl::Status SetHostMapRow(int32_t row, const uint8_t* const* layer_base, int32_t capacity) override {
    const size_t first = static_cast<size_t>(row) * g_.num_layers;
    for (int32_t l = 0; l < g_.num_layers; ++l) {
      host_base_[first + l] = layer_base ? const_cast<uint8_t*>(layer_base[l]) : nullptr;
    }
    // Control path: synchronous copies, so the next data-path launch sees the row.
    if (auto e = cudaMemcpy(dev_base_ + first, host_base_.data() + first, g_.num_layers * sizeof(uint8_t*),
                            cudaMemcpyHostToDevice);
        e != cudaSuccess) {
      return CudaError(e, "publishing a row of the host map");
    }
    return CudaError(cudaMemcpy(dev_capacity_ + row, &capacity, sizeof(int32_t), cudaMemcpyHostToDevice), "host map");
  }

  absl::Status ResetRow(const ArenaView& arena, int32_t row, void* stream) override {
    if (auto e = LaunchResetRow(arena, row, static_cast<cudaStream_t>(stream)); e != cudaSuccess) {
      return CudaError(e, "reset row");
    }
    return CudaError(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "reset row");
  }
  absl::Status Resolve(const ResolveDesc& desc, void* stream) override {
    ResolveDesc d = desc;
    if (d.batch_size == nullptr) {
      if (d.max_batch > g_.max_rows) return absl::InvalidArgumentError("max_batch exceeds the session's rows");
      d.batch_size = counts_ + d.max_batch;
    }
    return CudaError(LaunchResolve(d, workspace_, workspace_bytes_, static_cast<cudaStream_t>(stream)),
                     "RESOLVE launch");
  }
  absl::Status Store(const StoreDesc& d, void* stream) override {
    return CudaError(LaunchStore(d, static_cast<cudaStream_t>(stream)), "store launch");
  }
  absl::Status Append(const AppendDesc& desc, void* stream) override {
    AppendDesc d = desc;
    if (d.batch_size == nullptr) {
      if (d.max_batch > g_.max_rows) return absl::InvalidArgumentError("max_batch exceeds the session's rows");
      d.batch_size = counts_ + d.max_batch;
    }
    return CudaError(LaunchAppend(d, static_cast<cudaStream_t>(stream)), "append launch");
  }
  absl::StatusOr<MissPlan> AllocMissPlan() override {
    cudaSetDevice(gpu_);
    void* p = nullptr;
    if (auto e = cudaMalloc(&p, MissPlan::Bytes(g_, g_.max_rows)); e != cudaSuccess) return CudaError(e, "miss plan");
    plans_.push_back(p);
    return MissPlan::Of(p, g_.max_rows);
  }
  absl::Status Replay(const ReplayDesc& d, void* stream) override {
    return CudaError(LaunchReplay(d, static_cast<cudaStream_t>(stream)), "prefetch launch");
  }
  absl::Status CheckErrors() override {
    if (auto e = cudaDeviceSynchronize(); e != cudaSuccess) return CudaError(e, "data path");
    uint32_t bits = 0;
    cudaMemcpy(&bits, errors_, sizeof(bits), cudaMemcpyDeviceToHost);
    cudaMemset(errors_, 0, sizeof(bits));
    return bits == 0 ? absl::OkStatus() : absl::InvalidArgumentError(DescribeResolveErrors(bits));
  }
  uint32_t* error_flags() override { return errors_; }
  absl::StatusOr<ArenaCounters> ReadCounters() override {
    ArenaCounters c{};
    if (auto e = cudaMemcpy(&c, view_.counters, sizeof(c), cudaMemcpyDeviceToHost); e != cudaSuccess) {
      return CudaError(e, "reading RESOLVE counters");
    }
    return c;
  }

 private:
  ArenaView ViewOf(CUdeviceptr ptr, const ArenaGeometry& g) {
    // A CUdeviceptr is an integer the driver hands out; kernels need it as a pointer.
    view_ = ArenaView::Of(reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(ptr)),  // NOLINT(performance-no-int-to-ptr)
                          g);
    return view_;
  }

  const int gpu_;
  const ArenaGeometry g_;
  uint8_t* arena_ = nullptr;  // private arena (daemon serves host arenas), else null
  size_t arena_bytes_ = 0;
  std::unique_ptr<cuvmm::VmmMapping> shared_arena_;  // the daemon's GPU arena, mapped here (cuda-vmm)
  std::unique_ptr<cuvmm::IpcMapping> ipc_arena_;     // or opened here (cuda-ipc)
  cuvmm::ImportTimes import_times_;
  ArenaView view_{};
  std::vector<uint8_t*> host_base_;
  uint8_t** dev_base_ = nullptr;
  int32_t* dev_capacity_ = nullptr;
  int32_t* counts_ = nullptr;
  uint32_t* errors_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::vector<void*> plans_;  // miss plans of anchor layers
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceBackend>> MakeCudaBackend(int gpu, const ArenaGeometry& g) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    return absl::UnavailableError("no CUDA device is present: use the host backend");
  }
  if (gpu < 0 || gpu >= count) {
    return absl::InvalidArgumentError(absl::StrCat("gpu ", gpu, " is not a CUDA device here (", count, " present)"));
  }
  auto backend = std::make_unique<CudaBackend>(gpu, g);
  if (auto st = backend->Init(); !st.ok()) return st;
  return backend;
}

}  // namespace hisparse
