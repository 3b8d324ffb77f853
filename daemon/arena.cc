#include "hisparse/daemon/arena.h"

#include <fcntl.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "hisparse/v1/arena_kind.h"

namespace hisparse {
namespace {

class HostArena final : public Arena {
 public:
  HostArena(UniqueFd fd, MappedRegion counters_page, uint64_t bytes, size_t counters_offset)
      : fd_(std::move(fd)), page_(std::move(counters_page)), bytes_(bytes), counters_offset_(counters_offset) {}

  v1::ArenaKind kind() const override { return v1::ARENA_KIND_HOST; }
  uint64_t bytes() const override { return bytes_; }

  absl::StatusOr<ExportedArena> Export() const override {
    ExportedArena out;
    out.fd.Reset(::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0));
    if (!out.fd.valid()) return absl::InternalError("dup of a slot arena's memfd failed");
    out.grant = FdOk{bytes_, FdForm::kFd, ""};  // the sealed memfd's size, as fstat says
    return out;
  }

  absl::Status ReadCounters(ArenaCounters* out) const override {
    // The engine updates these concurrently; a torn read of a 64-bit counter is not possible on
    // x86-64 and a slightly stale value is fine for stats.
    const auto* c = reinterpret_cast<const volatile ArenaCounters*>(page_.data() + counters_offset_);
    out->hits = c->hits;
    out->misses = c->misses;
    out->bytes_fetched = c->bytes_fetched;
    out->steps = c->steps;
    out->rejected = c->rejected;
    return absl::OkStatus();
  }

 private:
  const UniqueFd fd_;
  const MappedRegion page_;  // [0, counters + sizeof(ArenaCounters)) of the memfd
  const uint64_t bytes_;
  const size_t counters_offset_;
};

class GpuBackedArena final : public Arena {
 public:
  GpuBackedArena(std::unique_ptr<GpuArena> gpu, uint64_t counters_offset)
      : gpu_(std::move(gpu)), kind_(v1::ArenaKindFromName(gpu_->kind())), counters_offset_(counters_offset) {}

  v1::ArenaKind kind() const override { return kind_; }
  uint64_t bytes() const override { return gpu_->bytes(); }

  absl::StatusOr<ExportedArena> Export() const override {
    ExportedArena out;
    out.grant.bytes = gpu_->bytes();  // a GPU arena's fd has no size to fstat
    if (kind_ == v1::ARENA_KIND_CUDA_IPC) {
      // No descriptor: the cudaIpc handle travels as data.
      absl::StatusOr<std::string> handle = gpu_->IpcHandle();
      if (!handle.ok()) return handle.status();
      if (handle->size() != kCudaIpcHandleBytes) {
        return absl::InternalError(absl::StrCat("a cudaIpc handle of ", handle->size(), " bytes"));
      }
      out.grant.form = FdForm::kCudaIpc;
      out.grant.handle = std::move(*handle);
      return out;
    }
    absl::StatusOr<UniqueFd> fd = gpu_->Export();
    if (!fd.ok()) return fd.status();
    out.fd = std::move(*fd);
    return out;
  }

  absl::Status ReadCounters(ArenaCounters* out) const override {
    return gpu_->Read(counters_offset_, out, sizeof(*out));
  }

 private:
  const std::unique_ptr<GpuArena> gpu_;
  const v1::ArenaKind kind_;
  const uint64_t counters_offset_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Arena>> MakeHostArena(const ArenaOffsets& layout) {
  absl::StatusOr<UniqueFd> fd = CreateMemfd("hisparse-arena", layout.total_bytes, false, nullptr);
  if (!fd.ok()) return fd.status();
  // The seals keep the mapped counters page valid: nobody can shrink the file under it.
  absl::StatusOr<MappedRegion> page = MappedRegion::MapShared(fd->get(), layout.counters + sizeof(ArenaCounters));
  if (!page.ok()) return page.status();
  return std::unique_ptr<Arena>(new HostArena(std::move(*fd), std::move(*page), layout.total_bytes, layout.counters));
}

std::unique_ptr<Arena> WrapGpuArena(std::unique_ptr<GpuArena> gpu, uint64_t counters_offset) {
  return std::unique_ptr<Arena>(new GpuBackedArena(std::move(gpu), counters_offset));
}

}  // namespace hisparse
