// A host emulation of the CUDA features a kernel of kernels/ uses, so that its device code can run
// on a machine without a GPU (CI) under a test: one block at a time, one std::thread per CUDA
// thread, a std::barrier for __syncthreads, a barrier of 32 for __syncwarp and every shuffle.
// Threads run truly concurrently and in no fixed order, which is stricter than a GPU's warps:
// code that assumes a warp's lanes execute in step (a read of shared memory by some lanes racing
// a write by another, with no __syncwarp between) fails here. That is how topk.cu's first
// version, which passed on an H200, was found to race (tests/kernels/topk_emulated_test.cc).
// Only what topk.cu uses is here; `__shared__` becomes `static`, so one launch must finish before
// the next begins (EmulateLaunch runs the blocks in turn). It is found as <cuda_runtime.h> by that
// test only (tests/kernels/CMakeLists.txt), and the kernel file compiled as C++ with
// HISPARSE_CUDA_EMULATION defined launches through EmulateLaunch.
#ifndef HISPARSE_TESTS_KERNELS_CUDA_EMULATION_CUDA_RUNTIME_H_
#define HISPARSE_TESTS_KERNELS_CUDA_EMULATION_CUDA_RUNTIME_H_
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>
#define __host__
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static
typedef int cudaError_t;
typedef void* cudaStream_t;
constexpr int cudaSuccess = 0, cudaErrorInvalidValue = 1;
inline const char* cudaGetErrorName(int) { return "err"; }
inline int cudaGetLastError() { return 0; }
struct dim3 {
  unsigned x = 0, y = 0, z = 0;
};
struct float4 {
  float x, y, z, w;
};
inline thread_local dim3 threadIdx, blockIdx;
struct EmuBlock {
  std::unique_ptr<std::barrier<>> all;
  std::vector<std::unique_ptr<std::barrier<>>> warp;
  std::vector<unsigned long long> xchg;  // [threads]
};
inline EmuBlock* g_emu = nullptr;
inline void __syncthreads() { g_emu->all->arrive_and_wait(); }
inline void WarpSync() { g_emu->warp[threadIdx.x / 32]->arrive_and_wait(); }
inline void __syncwarp() { WarpSync(); }
template <typename T>
T EmuShfl(T v, int src_lane) {
  const int base = threadIdx.x & ~31;
  unsigned long long u = 0;
  std::memcpy(&u, &v, sizeof v);
  g_emu->xchg[threadIdx.x] = u;
  WarpSync();
  unsigned long long r = g_emu->xchg[base + src_lane];
  WarpSync();
  T out;
  std::memcpy(&out, &r, sizeof out);
  return out;
}
template <typename T>
T __shfl_down_sync(unsigned, T v, int off) {
  int lane = threadIdx.x & 31;
  return EmuShfl(v, lane + off < 32 ? lane + off : lane);
}
template <typename T>
T __shfl_up_sync(unsigned, T v, int off) {
  int lane = threadIdx.x & 31;
  return EmuShfl(v, lane - off >= 0 ? lane - off : lane);
}
template <typename T>
T __shfl_sync(unsigned, T v, int src) {
  return EmuShfl(v, src);
}
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
template <typename T>
T __ldg(const T* p) {
  return *p;
}
using std::max;
using std::min;
// Runs body() as `threads` threads of each of `blocks` blocks, one block after another.
inline void EmulateLaunch(int blocks, int threads, const std::function<void()>& body) {
  for (int b = 0; b < blocks; ++b) {
    EmuBlock blk;
    blk.all = std::make_unique<std::barrier<>>(threads);
    for (int w = 0; w < threads / 32; ++w) blk.warp.push_back(std::make_unique<std::barrier<>>(32));
    blk.xchg.assign(threads, 0);
    g_emu = &blk;
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t, b] {
        threadIdx.x = t;
        blockIdx.x = b;
        body();
      });
    }
    for (auto& th : ts) th.join();
  }
}

#endif  // HISPARSE_TESTS_KERNELS_CUDA_EMULATION_CUDA_RUNTIME_H_
