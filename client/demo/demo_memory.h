// DemoMemory: the buffers the demo hands to the data path — plain host memory on the host
// backend, device memory on the CUDA backend — with copies in and out. Owns what it allocates.
// Not thread-safe.
#ifndef HISPARSE_CLIENT_DEMO_DEMO_MEMORY_H_
#define HISPARSE_CLIENT_DEMO_DEMO_MEMORY_H_

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <vector>

#ifdef HISPARSE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace hisparse::demo {

class DemoMemory {
 public:
  explicit DemoMemory(bool cuda) : cuda_(cuda) {}
  ~DemoMemory() {
    for (void* p : owned_) {
#ifdef HISPARSE_HAVE_CUDA
      if (cuda_) {
        cudaFree(p);
        continue;
      }
#endif
      std::free(p);
    }
  }
  DemoMemory(const DemoMemory&) = delete;
  DemoMemory& operator=(const DemoMemory&) = delete;

  static bool CudaAvailable() {
#ifdef HISPARSE_HAVE_CUDA
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
    return false;
#endif
  }

  template <typename T>
  T* Alloc(size_t count) {
    void* p = nullptr;
#ifdef HISPARSE_HAVE_CUDA
    if (cuda_) {
      if (cudaMalloc(&p, count * sizeof(T)) != cudaSuccess) return nullptr;
      owned_.push_back(p);
      return static_cast<T*>(p);
    }
#endif
    p = std::calloc(count, sizeof(T));
    owned_.push_back(p);
    return static_cast<T*>(p);
  }
  void Upload(void* dst, const void* src, size_t bytes) {
#ifdef HISPARSE_HAVE_CUDA
    if (cuda_) {
      cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
      return;
    }
#endif
    std::memcpy(dst, src, bytes);
  }
  void Download(void* dst, const void* src, size_t bytes) {
#ifdef HISPARSE_HAVE_CUDA
    if (cuda_) {
      cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
      return;
    }
#endif
    std::memcpy(dst, src, bytes);
  }
  void Sync() {
#ifdef HISPARSE_HAVE_CUDA
    if (cuda_) cudaDeviceSynchronize();
#endif
  }

 private:
  bool cuda_;
  std::vector<void*> owned_;
};

}  // namespace hisparse::demo

#endif  // HISPARSE_CLIENT_DEMO_DEMO_MEMORY_H_
