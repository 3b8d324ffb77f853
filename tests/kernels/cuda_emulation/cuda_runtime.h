// A host emulation of the CUDA features a kernel of kernels/ uses, so that its device code can run
// on a machine without a GPU (CI) under a test: one cluster of blocks at a time (a block is a
// cluster of one), one std::thread per CUDA thread, a std::barrier for __syncthreads, a barrier of
// 32 for __syncwarp and every shuffle, and a barrier of all the cluster's threads for its sync
// (cooperative_groups.h beside this file).
// Threads run truly concurrently and in no fixed order, which is stricter than a GPU's warps:
// code that assumes a warp's lanes execute in step (a read of shared memory by some lanes racing
// a write by another, with no __syncwarp between) fails here. That is how topk.cu's first
// version, which passed on an H200, was found to race (tests/kernels/topk_emulated_test.cc).
// Only what topk.cu uses is here. A block's shared memory is its own buffer, which starts as
// garbage, as a GPU's does; a kernel names its one shared variable with HS_BLOCK_SHARED. It is
// found as <cuda_runtime.h> by that test only (tests/kernels/CMakeLists.txt), and the kernel file
// compiled as C++ launches through cudaLaunchKernelEx here, which runs EmulateLaunch.
#ifndef HISPARSE_TESTS_KERNELS_CUDA_EMULATION_CUDA_RUNTIME_H_
#define HISPARSE_TESTS_KERNELS_CUDA_EMULATION_CUDA_RUNTIME_H_
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
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
typedef int cudaError_t;
typedef void* cudaStream_t;
constexpr int cudaSuccess = 0, cudaErrorInvalidValue = 1;
inline const char* cudaGetErrorName(int) { return "err"; }
inline int cudaGetLastError() { return 0; }
inline int g_emu_sms = 8;  // the SMs of the emulated device
inline int cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3() = default;
  explicit dim3(unsigned x_, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct float4 {
  float x, y, z, w;
};
inline thread_local dim3 threadIdx, blockIdx;
constexpr size_t kEmuSharedBytes = 48 * 1024;  // a block's static shared memory on a GPU
struct EmuBlock {
  std::unique_ptr<std::barrier<>> all;
  std::vector<std::unique_ptr<std::barrier<>>> warp;
  std::vector<unsigned long long> xchg;  // [threads]
  std::vector<char> shared;              // the block's shared memory
};
struct EmuCluster {
  std::unique_ptr<std::barrier<>> all;  // every thread of every block of the cluster
  std::vector<EmuBlock*> blocks;        // by rank
};
inline thread_local EmuBlock* g_emu = nullptr;
inline thread_local EmuCluster* g_emu_cluster = nullptr;
inline thread_local unsigned g_emu_rank = 0;
template <typename T>
T& EmuShared() {
  static_assert(sizeof(T) <= kEmuSharedBytes, "more shared memory than a block may declare");
  return *reinterpret_cast<T*>(g_emu->shared.data());
}
#define HS_BLOCK_SHARED(type, name) type& name = EmuShared<type>()
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
inline unsigned atomicMax(unsigned* p, unsigned v) {
  unsigned old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return old;
}
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
// Runs body() as `threads` threads of each of `blocks` blocks, in clusters of `cluster` blocks
// (which divides `blocks`): the threads of one cluster at once, one cluster after another.
inline void EmulateLaunch(int blocks, int threads, int cluster, const std::function<void()>& body) {
  for (int first = 0; first < blocks; first += cluster) {
    std::vector<EmuBlock> blk(static_cast<size_t>(cluster));
    EmuCluster cl;
    cl.all = std::make_unique<std::barrier<>>(cluster * threads);
    for (EmuBlock& b : blk) {
      b.all = std::make_unique<std::barrier<>>(threads);
      for (int w = 0; w < threads / 32; ++w) b.warp.push_back(std::make_unique<std::barrier<>>(32));
      b.xchg.assign(static_cast<size_t>(threads), 0);
      b.shared.assign(kEmuSharedBytes, static_cast<char>(0xA5));
      cl.blocks.push_back(&b);
    }
    std::vector<std::thread> ts;
    for (int r = 0; r < cluster; ++r) {
      for (int t = 0; t < threads; ++t) {
        ts.emplace_back([&, r, t] {
          threadIdx.x = static_cast<unsigned>(t);
          blockIdx.x = static_cast<unsigned>(first + r);
          g_emu = &blk[static_cast<size_t>(r)];
          g_emu_cluster = &cl;
          g_emu_rank = static_cast<unsigned>(r);
          body();
        });
      }
    }
    for (auto& th : ts) th.join();
  }
}

// Launches run in order here, so a programmatic dependent is an ordinary launch.
enum cudaLaunchAttributeID {
  cudaLaunchAttributeClusterDimension = 4,
  cudaLaunchAttributeProgrammaticStreamSerialization = 6
};
union cudaLaunchAttributeValue {
  struct {
    unsigned x, y, z;
  } clusterDim;
  int programmaticStreamSerializationAllowed;
};
struct cudaLaunchAttribute {
  cudaLaunchAttributeID id;
  cudaLaunchAttributeValue val;
};
struct cudaLaunchConfig_t {
  dim3 gridDim, blockDim;
  size_t dynamicSmemBytes = 0;
  cudaStream_t stream = nullptr;
  cudaLaunchAttribute* attrs = nullptr;
  unsigned numAttrs = 0;
};
inline int EmuClusterSize(const cudaLaunchConfig_t& c) {
  for (unsigned i = 0; i < c.numAttrs; ++i) {
    if (c.attrs[i].id == cudaLaunchAttributeClusterDimension) return static_cast<int>(c.attrs[i].val.clusterDim.x);
  }
  return 1;
}
// The emulated device holds g_emu_sms blocks at once, a cluster's anywhere.
template <typename K>
int cudaOccupancyMaxActiveClusters(int* n, K, const cudaLaunchConfig_t* c) {
  *n = g_emu_sms / EmuClusterSize(*c);
  return cudaSuccess;
}
template <typename... P, typename... A>
int cudaLaunchKernelEx(const cudaLaunchConfig_t* c, void (*kernel)(P...), A&&... args) {
  EmulateLaunch(static_cast<int>(c->gridDim.x), static_cast<int>(c->blockDim.x), EmuClusterSize(*c),
                [&] { kernel(args...); });
  return cudaSuccess;
}

#endif  // HISPARSE_TESTS_KERNELS_CUDA_EMULATION_CUDA_RUNTIME_H_
