// The CUDA GpuArena allocator: see gpu_arena.h. Without CUDA in the build, a stub that says so;
// with it, libcuda is still loaded only at run time (hisparse/common/cuda_vmm.h), so hisparsed
// starts on hosts without a driver and serves host arenas there.
#include "hisparse/daemon/gpu_arena.h"

#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "hisparse/common/log.h"

#ifdef HISPARSE_HAVE_CUDA
#include <dlfcn.h>
#include <unistd.h>

#include "hisparse/common/cuda_vmm.h"
#endif

namespace hisparse {

absl::StatusOr<std::string> ChooseArenaKind(ArenaExport mode, bool vmm_fd_supported, int gpu) {
  switch (mode) {
    case ArenaExport::kAuto:
      return std::string(vmm_fd_supported ? kArenaKindVmm : kArenaKindIpc);
    case ArenaExport::kVmm:
      if (vmm_fd_supported) return std::string(kArenaKindVmm);
      return absl::FailedPreconditionError(
          absl::StrCat("gpu.arena_export is vmm, but GPU ", gpu,
                       " cannot export VMM allocations as POSIX fds: use auto (falls back to cuda_ipc)"));
    case ArenaExport::kCudaIpc:
      return std::string(kArenaKindIpc);
  }
  return absl::InternalError("unknown gpu.arena_export mode");
}

#ifdef HISPARSE_HAVE_CUDA
namespace {

class VmmArena final : public GpuArena {
 public:
  explicit VmmArena(std::unique_ptr<cuvmm::VmmMapping> m) : m_(std::move(m)) {}
  int gpu() const override { return m_->gpu(); }
  uint64_t bytes() const override { return m_->bytes(); }
  std::string kind() const override { return kArenaKindVmm; }
  absl::StatusOr<UniqueFd> Export() const override { return m_->Export(); }
  absl::Status Read(uint64_t offset, void* dst, size_t n) const override { return m_->Read(offset, dst, n); }

 private:
  std::unique_ptr<cuvmm::VmmMapping> m_;
};

class IpcArena final : public GpuArena {
 public:
  explicit IpcArena(std::unique_ptr<cuvmm::IpcMapping> m) : m_(std::move(m)) {}
  int gpu() const override { return m_->gpu(); }
  uint64_t bytes() const override { return m_->bytes(); }
  std::string kind() const override { return kArenaKindIpc; }
  absl::StatusOr<UniqueFd> Export() const override {
    return absl::FailedPreconditionError("this GPU arena is shared as a cudaIpc handle, not an fd");
  }
  absl::StatusOr<std::string> IpcHandle() const override { return m_->Handle(); }
  absl::Status Read(uint64_t offset, void* dst, size_t n) const override { return m_->Read(offset, dst, n); }

 private:
  std::unique_ptr<cuvmm::IpcMapping> m_;  // cuMemFree'd with the arena
};

// Per GPU, the kind chosen at its first arena (probing the driver once).
class KindCache {
 public:
  explicit KindCache(ArenaExport mode) : mode_(mode) {}
  // The probe runs under the lock: the first arenas of one GPU must not probe it twice.
  absl::StatusOr<std::string> For(int gpu) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = kinds_.find(gpu);
    if (it != kinds_.end()) return it->second;
    absl::StatusOr<bool> vmm = cuvmm::VmmFdExportSupported(gpu);
    if (!vmm.ok()) return vmm.status();
    absl::StatusOr<std::string> kind = ChooseArenaKind(mode_, *vmm, gpu);
    if (!kind.ok()) return kind.status();
    LOG(INFO) << "GPU " << gpu << ": VMM POSIX-fd export " << (*vmm ? "supported" : "NOT supported")
              << "; slot arenas are shared as " << *kind;
    kinds_.emplace(gpu, *kind);
    return kind;
  }

 private:
  const ArenaExport mode_;
  absl::Mutex mu_;
  std::map<int, std::string> kinds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<GpuArenaAllocator> MakeCudaArenaAllocator(ArenaExport mode, int* gpu_count) {
  absl::StatusOr<int> count = cuvmm::DeviceCount();
  if (!count.ok()) return count.status();
  if (*count == 0) return absl::UnavailableError("the CUDA driver sees no GPU");
  if (gpu_count != nullptr) *gpu_count = *count;
  auto kinds = std::make_shared<KindCache>(mode);
  return GpuArenaAllocator([kinds](int gpu, uint64_t bytes) -> absl::StatusOr<std::unique_ptr<GpuArena>> {
    absl::StatusOr<std::string> kind = kinds->For(gpu);
    if (!kind.ok()) return kind.status();
    if (*kind == kArenaKindIpc) {
      absl::StatusOr<std::unique_ptr<cuvmm::IpcMapping>> m = cuvmm::IpcMapping::Create(gpu, bytes);
      if (!m.ok()) return m.status();
      return std::unique_ptr<GpuArena>(new IpcArena(std::move(*m)));
    }
    absl::StatusOr<std::unique_ptr<cuvmm::VmmMapping>> m = cuvmm::VmmMapping::Create(gpu, bytes);
    if (!m.ok()) return m.status();
    return std::unique_ptr<GpuArena>(new VmmArena(std::move(*m)));
  });
}

absl::StatusOr<std::vector<std::string>> CudaGpuUuids() {
  absl::StatusOr<int> count = cuvmm::DeviceCount();
  if (!count.ok()) return count.status();
  std::vector<std::string> uuids;
  for (int gpu = 0; gpu < *count; ++gpu) {
    absl::StatusOr<std::string> uuid = cuvmm::DeviceUuid(gpu);
    if (!uuid.ok()) return uuid.status();
    uuids.push_back(*std::move(uuid));
  }
  return uuids;
}

DriverView SeeCudaDriver() {
  if (void* loaded = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD); loaded != nullptr) {
    ::dlclose(loaded);  // drops only the reference RTLD_NOLOAD took
    return DriverView::kLoaded;
  }
  return ::access("/proc/driver/nvidia/version", F_OK) == 0 ? DriverView::kMissingOnGpuNode : DriverView::kNoDriver;
}

#else

absl::StatusOr<GpuArenaAllocator> MakeCudaArenaAllocator(ArenaExport, int* gpu_count) {
  if (gpu_count != nullptr) *gpu_count = 0;
  return absl::UnavailableError("this hisparsed was built without CUDA: GPU arenas are unavailable");
}

absl::StatusOr<std::vector<std::string>> CudaGpuUuids() {
  return absl::UnavailableError("this hisparsed was built without CUDA: GPU arenas are unavailable");
}

DriverView SeeCudaDriver() { return DriverView::kNotBuilt; }

#endif

std::string GpuUuidText(const std::string& uuid) {
  std::string hex;
  for (unsigned char c : uuid) absl::StrAppend(&hex, absl::Hex(c, absl::kZeroPad2));
  if (uuid.size() != 16) return hex;
  return absl::StrCat("GPU-", hex.substr(0, 8), "-", hex.substr(8, 4), "-", hex.substr(12, 4), "-", hex.substr(16, 4),
                      "-", hex.substr(20));
}

}  // namespace hisparse
