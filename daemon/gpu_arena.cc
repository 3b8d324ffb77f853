// The CUDA VMM GpuArena allocator: see gpu_arena.h. Without CUDA in the build, a stub that says
// so; with it, libcuda is still loaded only at run time (hisparse/common/cuda_vmm.h), so hisparsed
// starts on hosts without a driver and serves host arenas there.
#include "hisparse/daemon/gpu_arena.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#ifdef HISPARSE_HAVE_CUDA
#include "hisparse/common/cuda_vmm.h"
#endif

namespace hisparse {

#ifdef HISPARSE_HAVE_CUDA
namespace {

class VmmArena final : public GpuArena {
 public:
  explicit VmmArena(std::unique_ptr<cuvmm::VmmMapping> m) : m_(std::move(m)) {}
  int gpu() const override { return m_->gpu(); }
  uint64_t bytes() const override { return m_->bytes(); }
  std::string kind() const override { return "cuda-vmm"; }
  absl::StatusOr<UniqueFd> Export() const override { return m_->Export(); }
  absl::Status Read(uint64_t offset, void* dst, size_t n) const override { return m_->Read(offset, dst, n); }

 private:
  std::unique_ptr<cuvmm::VmmMapping> m_;
};

}  // namespace

absl::StatusOr<GpuArenaAllocator> MakeVmmArenaAllocator(int* gpu_count) {
  absl::StatusOr<int> count = cuvmm::DeviceCount();
  if (!count.ok()) return count.status();
  if (*count == 0) return absl::UnavailableError("the CUDA driver sees no GPU");
  if (gpu_count != nullptr) *gpu_count = *count;
  return GpuArenaAllocator([](int gpu, uint64_t bytes) -> absl::StatusOr<std::unique_ptr<GpuArena>> {
    absl::StatusOr<std::unique_ptr<cuvmm::VmmMapping>> m = cuvmm::VmmMapping::Create(gpu, bytes);
    if (!m.ok()) return m.status();
    return std::unique_ptr<GpuArena>(new VmmArena(std::move(*m)));
  });
}

#else

absl::StatusOr<GpuArenaAllocator> MakeVmmArenaAllocator(int* gpu_count) {
  if (gpu_count != nullptr) *gpu_count = 0;
  return absl::UnavailableError("this hisparsed was built without CUDA: GPU arenas are unavailable");
}

#endif

}  // namespace hisparse
