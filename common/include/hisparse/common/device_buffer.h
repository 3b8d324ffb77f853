// DeviceBuffer: one cudaMalloc'ed allocation and its only owner; cudaFree'd when the buffer is
// destroyed or reset, on every path. Move-only. For CUDA host code (client/, kernels/, tests and
// benchmarks) in builds with CUDA; the caller keeps the right device current while allocating
// (cudaFree finds the device from the address).
//
// Thread-safety: none of its own; a buffer belongs to one owner.
#ifndef HISPARSE_COMMON_DEVICE_BUFFER_H_
#define HISPARSE_COMMON_DEVICE_BUFFER_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

namespace hisparse {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Allocates `bytes` on the current device; on failure *out is left empty. Replaces what *out held.
  static cudaError_t Allocate(size_t bytes, DeviceBuffer* out) {
    out->reset();
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) return e;
    out->ptr_ = p;
    out->bytes_ = bytes;
    return cudaSuccess;
  }

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  explicit operator bool() const { return ptr_ != nullptr; }

  // Frees the allocation now (no-op when empty). The caller makes sure no kernel still uses it.
  void reset() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace hisparse

#endif  // HISPARSE_COMMON_DEVICE_BUFFER_H_
