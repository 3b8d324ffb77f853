// CUDA VMM allocations shared between processes: the daemon creates a GPU slot arena and exports
// it as a POSIX fd; an engine imports that fd and maps it. Both sides map it (the daemon reads the
// RESOLVE counters from it for stats), and each side's VmmMapping unmaps and releases its part.
//
// The CUDA driver is loaded at run time (dlopen("libcuda.so.1")), never linked: hisparsed must
// start on hosts without a GPU driver, where every call here returns Unavailable. Built only with
// HISPARSE_HAVE_CUDA (cuda.h supplies the types).
#ifndef HISPARSE_COMMON_CUDA_VMM_H_
#define HISPARSE_COMMON_CUDA_VMM_H_

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "hisparse/common/unique_fd.h"

namespace hisparse::cuvmm {

// The number of CUDA devices the driver sees; Unavailable without a driver.
absl::StatusOr<int> DeviceCount();

// GPU `gpu`'s UUID (cuDeviceGetUuid, 16 bytes): the same GPU has the same UUID in every process,
// whatever ordinal CUDA_VISIBLE_DEVICES or a container's device list gives it there.
absl::StatusOr<std::string> DeviceUuid(int gpu);

// Whether `gpu` can share VMM allocations as POSIX fds: both
// CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED and
// CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED. Where not, cudaIpc is the way.
absl::StatusOr<bool> VmmFdExportSupported(int gpu);

// Where a mapping's import spent its time (seconds), for the session-open benchmark.
struct ImportTimes {
  double import_s = 0;  // cuMemImportFromShareableHandle / cuIpcOpenMemHandle
  double map_s = 0;     // address reserve + map + set access (VMM only; cudaIpc maps in its open)
};

class VmmMapping {
 public:
  // Creates `bytes` (rounded up to the allocation granularity) on `gpu`, exportable as a POSIX fd,
  // mapped read-write for `gpu` in this process and zeroed.
  static absl::StatusOr<std::unique_ptr<VmmMapping>> Create(int gpu, uint64_t bytes);
  // Imports an allocation exported by another process (`fd` is not consumed) of `bytes` bytes (the
  // exporter's rounded size) and maps it read-write for `gpu`.
  static absl::StatusOr<std::unique_ptr<VmmMapping>> Import(int gpu, int fd, uint64_t bytes,
                                                            ImportTimes* times = nullptr);

  VmmMapping(const VmmMapping&) = delete;
  VmmMapping& operator=(const VmmMapping&) = delete;
  // Unmaps, frees the address range and releases this process's handle. The physical memory goes
  // back to the GPU once every process that imported it has done the same (or exited).
  ~VmmMapping();

  CUdeviceptr ptr() const { return va_; }
  uint64_t bytes() const { return bytes_; }
  int gpu() const { return gpu_; }
  // A new close-on-exec fd for the allocation (exportable allocations only), for SCM_RIGHTS.
  absl::StatusOr<UniqueFd> Export() const;
  // Maps another process's allocation (`fd`, not consumed, of `bytes`: this mapping's size) at this
  // mapping's address in place of the one it maps, whose handle is released: kernels and graphs
  // that kept the address read the new allocation. FailedPrecondition for another size (nothing
  // changed); a driver error past the import leaves the range unmapped (reserved still).
  absl::Status Reimport(int fd, uint64_t bytes);
  // Copies `n` bytes at `offset` of the allocation to host memory (synchronous).
  absl::Status Read(uint64_t offset, void* dst, size_t n) const;

 private:
  VmmMapping() = default;
  absl::Status MapHere();
  // Maps handle_ read-write for gpu_ into the reserved range va_.
  absl::Status MapReserved();

  int gpu_ = -1;
  uint64_t bytes_ = 0;
  bool have_handle_ = false;
  CUmemGenericAllocationHandle handle_ = 0;
  CUdeviceptr va_ = 0;
  bool mapped_ = false;
  UniqueFd exported_;  // the daemon's own export; dup'ed for every engine that fetches it
};

// The legacy fallback: a cuMemAlloc'ed allocation shared through a cudaIpc handle (64 bytes, sent
// as data: no fd). The creator frees it (cuMemFree); an importer's object closes its mapping
// (cuIpcCloseMemHandle). The GPU memory is released when the creator frees it and every importer
// has closed it or exited.
class IpcMapping {
 public:
  static constexpr size_t kHandleBytes = sizeof(CUipcMemHandle);  // 64
  // Allocates `bytes` (rounded up to 2 MiB, as the VMM path does) on `gpu`, zeroed, with a handle.
  static absl::StatusOr<std::unique_ptr<IpcMapping>> Create(int gpu, uint64_t bytes);
  // Opens another process's allocation from its handle (kHandleBytes bytes) on `gpu`.
  static absl::StatusOr<std::unique_ptr<IpcMapping>> Open(int gpu, absl::string_view handle, uint64_t bytes,
                                                          ImportTimes* times = nullptr);

  IpcMapping(const IpcMapping&) = delete;
  IpcMapping& operator=(const IpcMapping&) = delete;
  ~IpcMapping();

  CUdeviceptr ptr() const { return ptr_; }
  uint64_t bytes() const { return bytes_; }
  int gpu() const { return gpu_; }
  // The handle's bytes (created allocations only).
  absl::StatusOr<std::string> Handle() const;
  absl::Status Read(uint64_t offset, void* dst, size_t n) const;

 private:
  IpcMapping() = default;
  int gpu_ = -1;
  uint64_t bytes_ = 0;
  CUdeviceptr ptr_ = 0;
  bool opened_ = false;  // imported: closed with cuIpcCloseMemHandle, else freed with cuMemFree
  std::string handle_;
};

}  // namespace hisparse::cuvmm

#endif  // HISPARSE_COMMON_CUDA_VMM_H_
