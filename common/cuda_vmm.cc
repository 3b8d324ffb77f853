// CUDA VMM allocations shared between processes: see cuda_vmm.h.
#include "hisparse/common/cuda_vmm.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "hisparse/common/log.h"
#include "hisparse/common/status_macros.h"

namespace hisparse::cuvmm {
namespace {

// The handful of driver entry points used here, resolved by name from libcuda.so.1 (the versioned
// names are what cuda.h's macros expand to).
struct Driver {
  decltype(&::cuInit) Init = nullptr;
  decltype(&::cuGetErrorString) GetErrorString = nullptr;
  decltype(&::cuDeviceGetCount) DeviceGetCount = nullptr;
  decltype(&::cuDeviceGet) DeviceGet = nullptr;
  decltype(&::cuDeviceGetUuid) DeviceGetUuid = nullptr;  // optional: resolved, not required
  decltype(&::cuDevicePrimaryCtxRetain) PrimaryCtxRetain = nullptr;
  decltype(&::cuCtxSetCurrent) CtxSetCurrent = nullptr;
  decltype(&::cuCtxSynchronize) CtxSynchronize = nullptr;
  decltype(&::cuMemGetAllocationGranularity) GetGranularity = nullptr;
  decltype(&::cuMemCreate) Create = nullptr;
  decltype(&::cuMemRelease) Release = nullptr;
  decltype(&::cuMemAddressReserve) AddressReserve = nullptr;
  decltype(&::cuMemAddressFree) AddressFree = nullptr;
  decltype(&::cuMemMap) Map = nullptr;
  decltype(&::cuMemUnmap) Unmap = nullptr;
  decltype(&::cuMemSetAccess) SetAccess = nullptr;
  decltype(&::cuMemExportToShareableHandle) Export = nullptr;
  decltype(&::cuMemImportFromShareableHandle) Import = nullptr;
  decltype(&::cuMemsetD8) MemsetD8 = nullptr;
  decltype(&::cuMemcpyDtoH) MemcpyDtoH = nullptr;
  decltype(&::cuDeviceGetAttribute) DeviceGetAttribute = nullptr;
  decltype(&::cuMemAlloc) MemAlloc = nullptr;
  decltype(&::cuMemFree) MemFree = nullptr;
  decltype(&::cuIpcGetMemHandle) IpcGetMemHandle = nullptr;
  decltype(&::cuIpcOpenMemHandle) IpcOpenMemHandle = nullptr;
  decltype(&::cuIpcCloseMemHandle) IpcCloseMemHandle = nullptr;

  int device_count = 0;
  absl::Mutex ctx_mu;
  std::vector<CUcontext> primary ABSL_GUARDED_BY(ctx_mu);  // retained once per GPU for the life of the process
};

template <typename F>
bool Resolve(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(::dlsym(lib, name));
  return *out != nullptr;
}

absl::StatusOr<Driver*> LoadDriver() {
  // Never dlclose'd: the driver stays for the life of the process, as when linked.
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr)
    return absl::UnavailableError(absl::StrCat("no CUDA driver (dlopen libcuda.so.1: ", ::dlerror(), ")"));
  auto* d = new Driver;
  const bool ok =
      Resolve(lib, "cuInit", &d->Init) && Resolve(lib, "cuGetErrorString", &d->GetErrorString) &&
      Resolve(lib, "cuDeviceGetCount", &d->DeviceGetCount) && Resolve(lib, "cuDeviceGet", &d->DeviceGet) &&
      Resolve(lib, "cuDevicePrimaryCtxRetain", &d->PrimaryCtxRetain) &&
      Resolve(lib, "cuCtxSetCurrent", &d->CtxSetCurrent) && Resolve(lib, "cuCtxSynchronize", &d->CtxSynchronize) &&
      Resolve(lib, "cuMemGetAllocationGranularity", &d->GetGranularity) && Resolve(lib, "cuMemCreate", &d->Create) &&
      Resolve(lib, "cuMemRelease", &d->Release) && Resolve(lib, "cuMemAddressReserve", &d->AddressReserve) &&
      Resolve(lib, "cuMemAddressFree", &d->AddressFree) && Resolve(lib, "cuMemMap", &d->Map) &&
      Resolve(lib, "cuMemUnmap", &d->Unmap) && Resolve(lib, "cuMemSetAccess", &d->SetAccess) &&
      Resolve(lib, "cuMemExportToShareableHandle", &d->Export) &&
      Resolve(lib, "cuMemImportFromShareableHandle", &d->Import) && Resolve(lib, "cuMemsetD8_v2", &d->MemsetD8) &&
      Resolve(lib, "cuMemcpyDtoH_v2", &d->MemcpyDtoH) && Resolve(lib, "cuDeviceGetAttribute", &d->DeviceGetAttribute) &&
      Resolve(lib, "cuMemAlloc_v2", &d->MemAlloc) && Resolve(lib, "cuMemFree_v2", &d->MemFree) &&
      Resolve(lib, "cuIpcGetMemHandle", &d->IpcGetMemHandle) &&
      Resolve(lib, "cuIpcOpenMemHandle_v2", &d->IpcOpenMemHandle) &&
      Resolve(lib, "cuIpcCloseMemHandle", &d->IpcCloseMemHandle);
  // cuDeviceGetUuid_v2 (CUDA 11.4+), else the first version: the same 16 bytes for a GPU.
  if (!Resolve(lib, "cuDeviceGetUuid_v2", &d->DeviceGetUuid)) (void)Resolve(lib, "cuDeviceGetUuid", &d->DeviceGetUuid);
  if (!ok) {
    delete d;
    return absl::UnavailableError("the CUDA driver lacks the VMM API (cuMemCreate and friends): too old");
  }
  if (CUresult r = d->Init(0); r != CUDA_SUCCESS) {
    delete d;
    return absl::UnavailableError(absl::StrCat("cuInit failed (CUresult ", static_cast<int>(r), "): no usable GPU"));
  }
  if (d->DeviceGetCount(&d->device_count) != CUDA_SUCCESS) d->device_count = 0;
  {
    absl::MutexLock lock(&d->ctx_mu);  // not yet shared; the lock keeps the analysis exact
    d->primary.assign(d->device_count, nullptr);
  }
  return d;
}

absl::StatusOr<Driver*> GetDriver() {
  static const absl::StatusOr<Driver*>* driver = new absl::StatusOr<Driver*>(LoadDriver());
  return *driver;
}

absl::Status Check(const Driver& d, CUresult r, absl::string_view what) {
  if (r == CUDA_SUCCESS) return absl::OkStatus();
  const char* text = nullptr;
  if (d.GetErrorString(r, &text) != CUDA_SUCCESS || text == nullptr) text = "unknown error";
  const std::string msg = absl::StrCat(what, ": ", text, " (CUresult ", static_cast<int>(r), ")");
  return r == CUDA_ERROR_OUT_OF_MEMORY ? absl::ResourceExhaustedError(msg) : absl::InternalError(msg);
}

// Makes `gpu`'s primary context (the one the CUDA runtime uses too) current on this thread.
absl::StatusOr<Driver*> UseGpu(int gpu) {
  absl::StatusOr<Driver*> got = GetDriver();
  if (!got.ok()) return got.status();
  Driver* d = *got;
  if (gpu < 0 || gpu >= d->device_count) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu ", gpu, " is not a CUDA device here (", d->device_count, " present)"));
  }
  CUcontext ctx = nullptr;
  {
    absl::MutexLock lock(&d->ctx_mu);
    if (d->primary[gpu] == nullptr) {
      CUdevice dev = 0;
      if (absl::Status st = Check(*d, d->DeviceGet(&dev, gpu), "cuDeviceGet"); !st.ok()) return st;
      if (absl::Status st = Check(*d, d->PrimaryCtxRetain(&d->primary[gpu], dev), "cuDevicePrimaryCtxRetain");
          !st.ok()) {
        return st;
      }
    }
    ctx = d->primary[gpu];
  }
  if (absl::Status st = Check(*d, d->CtxSetCurrent(ctx), "cuCtxSetCurrent"); !st.ok()) return st;
  return d;
}

CUmemAllocationProp PropFor(int gpu) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = gpu;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

}  // namespace

absl::StatusOr<int> DeviceCount() {
  absl::StatusOr<Driver*> d = GetDriver();
  if (!d.ok()) return d.status();
  return (*d)->device_count;
}

absl::StatusOr<std::string> DeviceUuid(int gpu) {
  absl::StatusOr<Driver*> got = GetDriver();
  if (!got.ok()) return got.status();
  Driver& d = **got;
  if (d.DeviceGetUuid == nullptr) return absl::UnavailableError("the CUDA driver lacks cuDeviceGetUuid");
  CUdevice dev = 0;
  HS_RETURN_IF_ERROR(Check(d, d.DeviceGet(&dev, gpu), "cuDeviceGet"));
  CUuuid uuid{};
  HS_RETURN_IF_ERROR(Check(d, d.DeviceGetUuid(&uuid, dev), "cuDeviceGetUuid"));
  return std::string(uuid.bytes, sizeof(uuid.bytes));
}

absl::StatusOr<bool> VmmFdExportSupported(int gpu) {
  absl::StatusOr<Driver*> got = UseGpu(gpu);
  if (!got.ok()) return got.status();
  Driver& d = **got;
  CUdevice dev = 0;
  HS_RETURN_IF_ERROR(Check(d, d.DeviceGet(&dev, gpu), "cuDeviceGet"));
  int vmm = 0, posix_fd = 0;
  HS_RETURN_IF_ERROR(Check(d, d.DeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev),
                           "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)"));
  HS_RETURN_IF_ERROR(
      Check(d, d.DeviceGetAttribute(&posix_fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev),
            "cuDeviceGetAttribute(HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)"));
  return vmm != 0 && posix_fd != 0;
}

absl::StatusOr<std::unique_ptr<VmmMapping>> VmmMapping::Create(int gpu, uint64_t bytes) {
  absl::StatusOr<Driver*> got = UseGpu(gpu);
  if (!got.ok()) return got.status();
  Driver& d = **got;
  const CUmemAllocationProp prop = PropFor(gpu);
  size_t granularity = 0;
  if (auto st = Check(d, d.GetGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "VMM granularity");
      !st.ok()) {
    return st;
  }
  std::unique_ptr<VmmMapping> m(new VmmMapping);
  m->gpu_ = gpu;
  m->bytes_ = (bytes + granularity - 1) / granularity * granularity;
  if (auto st = Check(d, d.Create(&m->handle_, m->bytes_, &prop, 0),
                      absl::StrCat("cuMemCreate of ", m->bytes_, " bytes on GPU ", gpu, " (POSIX fd export)"));
      !st.ok()) {
    return st;
  }
  m->have_handle_ = true;
  HS_RETURN_IF_ERROR(m->MapHere());
  int fd = -1;
  if (auto st = Check(d, d.Export(&fd, m->handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                      "cuMemExportToShareableHandle (POSIX fd)");
      !st.ok()) {
    return st;
  }
  m->exported_.Reset(fd);
  // Engines see a clean arena: counters zero, every slot empty.
  if (auto st = Check(d, d.MemsetD8(m->va_, 0, m->bytes_), "clearing the slot arena"); !st.ok()) return st;
  if (auto st = Check(d, d.CtxSynchronize(), "clearing the slot arena"); !st.ok()) return st;
  return m;
}

absl::StatusOr<std::unique_ptr<VmmMapping>> VmmMapping::Import(int gpu, int fd, uint64_t bytes, ImportTimes* times) {
  absl::StatusOr<Driver*> got = UseGpu(gpu);
  if (!got.ok()) return got.status();
  Driver& d = **got;
  std::unique_ptr<VmmMapping> m(new VmmMapping);
  m->gpu_ = gpu;
  m->bytes_ = bytes;
  const auto t0 = std::chrono::steady_clock::now();
  if (auto st =
          Check(d,
                // The driver's API passes a POSIX fd through a void*.
                d.Import(&m->handle_,
                         reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),  // NOLINT(performance-no-int-to-ptr)
                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                "cuMemImportFromShareableHandle (the daemon's GPU arena)");
      !st.ok()) {
    return st;
  }
  m->have_handle_ = true;
  const auto t1 = std::chrono::steady_clock::now();
  HS_RETURN_IF_ERROR(m->MapHere());
  if (times != nullptr) {
    times->import_s = std::chrono::duration<double>(t1 - t0).count();
    times->map_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  }
  return m;
}

absl::Status VmmMapping::Reimport(int fd, uint64_t bytes) {
  if (bytes != bytes_ || va_ == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("an allocation of ", bytes, " bytes cannot take the place of ", bytes_, " bytes"));
  }
  absl::StatusOr<Driver*> got = UseGpu(gpu_);
  if (!got.ok()) return got.status();
  Driver& d = **got;
  CUmemGenericAllocationHandle fresh = 0;
  HS_RETURN_IF_ERROR(
      Check(d,
            d.Import(&fresh,
                     // The driver's API passes a POSIX fd through a void*.
                     reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),  // NOLINT(performance-no-int-to-ptr)
                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            "cuMemImportFromShareableHandle (the daemon's GPU arena, again)"));
  if (mapped_) {
    mapped_ = false;
    HS_RETURN_IF_ERROR(Check(d, d.Unmap(va_, bytes_), "cuMemUnmap (the former arena)"));
  }
  if (have_handle_) (void)d.Release(handle_);
  handle_ = fresh;
  have_handle_ = true;
  return MapReserved();
}

absl::Status VmmMapping::MapHere() {
  Driver& d = **GetDriver();
  HS_RETURN_IF_ERROR(Check(d, d.AddressReserve(&va_, bytes_, 0, 0, 0), "cuMemAddressReserve"));
  return MapReserved();
}

absl::Status VmmMapping::MapReserved() {
  Driver& d = **GetDriver();
  HS_RETURN_IF_ERROR(Check(d, d.Map(va_, bytes_, 0, handle_, 0), "cuMemMap"));
  mapped_ = true;
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = gpu_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return Check(d, d.SetAccess(va_, bytes_, &access, 1), "cuMemSetAccess");
}

VmmMapping::~VmmMapping() {
  absl::StatusOr<Driver*> got = UseGpu(gpu_);
  if (!got.ok()) return;
  Driver& d = **got;
  // Reverse order of MapHere/Create. Errors are logged, not fatal: nothing more can be done.
  if (mapped_) {
    if (CUresult r = d.Unmap(va_, bytes_); r != CUDA_SUCCESS)
      LOG(ERROR) << "cuMemUnmap failed: " << static_cast<int>(r);
  }
  if (va_ != 0) {
    if (CUresult r = d.AddressFree(va_, bytes_); r != CUDA_SUCCESS) {
      LOG(ERROR) << "cuMemAddressFree failed: " << static_cast<int>(r);
    }
  }
  if (have_handle_) {
    if (CUresult r = d.Release(handle_); r != CUDA_SUCCESS)
      LOG(ERROR) << "cuMemRelease failed: " << static_cast<int>(r);
  }
  // exported_ closes with the object.
}

absl::StatusOr<UniqueFd> VmmMapping::Export() const {
  if (!exported_.valid()) return absl::FailedPreconditionError("this GPU arena was imported, not created here");
  UniqueFd dup(::fcntl(exported_.get(), F_DUPFD_CLOEXEC, 0));
  if (!dup.valid()) return absl::InternalError("dup of a GPU arena descriptor failed");
  return dup;
}

absl::Status VmmMapping::Read(uint64_t offset, void* dst, size_t n) const {
  if (offset + n > bytes_) return absl::OutOfRangeError("read past the end of a GPU arena");
  absl::StatusOr<Driver*> got = UseGpu(gpu_);
  if (!got.ok()) return got.status();
  return Check(**got, (*got)->MemcpyDtoH(dst, va_ + offset, n), "reading the GPU arena");
}

absl::StatusOr<std::unique_ptr<IpcMapping>> IpcMapping::Create(int gpu, uint64_t bytes) {
  absl::StatusOr<Driver*> got = UseGpu(gpu);
  if (!got.ok()) return got.status();
  Driver& d = **got;
  constexpr uint64_t kRound = uint64_t{2} << 20;  // the same accounting unit as the VMM path
  std::unique_ptr<IpcMapping> m(new IpcMapping);
  m->gpu_ = gpu;
  m->bytes_ = (bytes + kRound - 1) / kRound * kRound;
  HS_RETURN_IF_ERROR(Check(d, d.MemAlloc(&m->ptr_, m->bytes_),
                           absl::StrCat("cuMemAlloc of ", m->bytes_, " bytes on GPU ", gpu, " (cudaIpc export)")));
  CUipcMemHandle h;
  HS_RETURN_IF_ERROR(Check(d, d.IpcGetMemHandle(&h, m->ptr_), "cuIpcGetMemHandle"));
  m->handle_.assign(reinterpret_cast<const char*>(&h), sizeof(h));
  HS_RETURN_IF_ERROR(Check(d, d.MemsetD8(m->ptr_, 0, m->bytes_), "clearing the slot arena"));
  HS_RETURN_IF_ERROR(Check(d, d.CtxSynchronize(), "clearing the slot arena"));
  return m;
}

absl::StatusOr<std::unique_ptr<IpcMapping>> IpcMapping::Open(int gpu, absl::string_view handle, uint64_t bytes,
                                                             ImportTimes* times) {
  if (handle.size() != kHandleBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a cudaIpc handle is ", kHandleBytes, " bytes, got ", handle.size()));
  }
  absl::StatusOr<Driver*> got = UseGpu(gpu);
  if (!got.ok()) return got.status();
  Driver& d = **got;
  CUipcMemHandle h;
  std::memcpy(&h, handle.data(), sizeof(h));
  std::unique_ptr<IpcMapping> m(new IpcMapping);
  m->gpu_ = gpu;
  m->bytes_ = bytes;
  const auto t0 = std::chrono::steady_clock::now();
  HS_RETURN_IF_ERROR(Check(d, d.IpcOpenMemHandle(&m->ptr_, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                           "cuIpcOpenMemHandle (the daemon's GPU arena)"));
  m->opened_ = true;
  if (times != nullptr) {
    times->import_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    times->map_s = 0;
  }
  return m;
}

IpcMapping::~IpcMapping() {
  if (ptr_ == 0) return;
  absl::StatusOr<Driver*> got = UseGpu(gpu_);
  if (!got.ok()) return;
  Driver& d = **got;
  if (opened_) {
    if (CUresult r = d.IpcCloseMemHandle(ptr_); r != CUDA_SUCCESS)
      LOG(ERROR) << "cuIpcCloseMemHandle failed: " << static_cast<int>(r);
  } else if (CUresult r = d.MemFree(ptr_); r != CUDA_SUCCESS) {
    LOG(ERROR) << "cuMemFree failed: " << static_cast<int>(r);
  }
}

absl::StatusOr<std::string> IpcMapping::Handle() const {
  if (opened_) return absl::FailedPreconditionError("this GPU arena was imported, not created here");
  return handle_;
}

absl::Status IpcMapping::Read(uint64_t offset, void* dst, size_t n) const {
  if (offset + n > bytes_) return absl::OutOfRangeError("read past the end of a GPU arena");
  absl::StatusOr<Driver*> got = UseGpu(gpu_);
  if (!got.ok()) return got.status();
  return Check(**got, (*got)->MemcpyDtoH(dst, ptr_ + offset, n), "reading the GPU arena");
}

}  // namespace hisparse::cuvmm
