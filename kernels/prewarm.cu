// PREWARM on the GPU (prewarm.h, prewarm_cuda.h).
//
// What matters is how many reads are in flight, not the bytes: each read exists to make the GPU
// translate one granule of host memory, and a cold translation takes microseconds. So every thread
// takes a piece of one page (up to kPrewarmReadsPerThread of its reads, issued back to back before
// any is used) and the grid strides over (entry, page, piece) of the descriptor's index space.
// On the shipped layout (256 KiB pages of 656-byte records, 64 KiB granules) a page is 4-5 reads:
// one thread a page. The loads are volatile and cache-volatile (ld.global.cv): the compiler may not
// drop them, and no cache may answer them. Their bytes are folded into a digest only where one is
// asked for (tests); otherwise a register keeps them alive.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "hisparse/kernels/prewarm_cuda.h"
#include "hisparse/kernels/resolve_cuda.h"  // LastLaunchError
#include "launch_status.h"
#include "stream_order.cuh"

namespace hisparse {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint64_t ReadFolded(uintptr_t at) {
  uint64_t lo, hi;
  asm volatile("ld.global.cv.v2.u64 {%0, %1}, [%2];" : "=l"(lo), "=l"(hi) : "l"(at));
  return lo ^ hi;
}

__device__ void PrewarmBlock(const PrewarmDesc& d, uint64_t pages, uint64_t pieces) {
  int32_t batch = *d.batch_size;
  batch = batch < 0 ? 0 : (batch > d.max_batch ? d.max_batch : batch);
  const uint64_t per_entry = pages * pieces;
  const uint64_t total = static_cast<uint64_t>(batch) * per_entry;
  uint64_t reads = 0, folded = 0;
  for (uint64_t t = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const int32_t i = static_cast<int32_t>(t / per_entry);
    const uint64_t pg = (t % per_entry) / pieces, piece = t % pieces;
    const int32_t row = d.rows[i], seq_len = d.seq_lens[i];
    if (row == kPadding) continue;
    if (const uint32_t e = PrewarmEntryError(d, row, seq_len); e != 0) {
      if (pg == 0 && piece == 0 && d.error_flags != nullptr) atomicOr(d.error_flags, e);
      continue;
    }
    const uint64_t used = PrewarmPageBytes(d, seq_len, pg);
    if (used == 0) continue;
    const uintptr_t page =
        reinterpret_cast<uintptr_t>(HostRecordMap::PageAddress(d.host.Table(d.geometry, row, d.layer)[pg]));
    const uint64_t n = PrewarmReadsOfPage(page, used, d.granule_bytes);
    const uint64_t first = piece * kPrewarmReadsPerThread;
    if (first >= n) continue;
    const uint64_t count = n - first < kPrewarmReadsPerThread ? n - first : kPrewarmReadsPerThread;
    uint64_t got[kPrewarmReadsPerThread];
#pragma unroll
    for (uint32_t j = 0; j < kPrewarmReadsPerThread; ++j) {
      const uintptr_t at = PrewarmReadAt(page, d.granule_bytes, first + j);
      const bool taken = j < count && PrewarmReadTaken(d, at);
      got[j] = taken ? ReadFolded(at) : 0;
      reads += taken ? 1 : 0;
    }
#pragma unroll
    for (uint32_t j = 0; j < kPrewarmReadsPerThread; ++j) folded ^= got[j];
  }
  if (d.digest == nullptr) return;
  for (int off = 16; off > 0; off >>= 1) {
    reads += __shfl_xor_sync(0xffffffffu, reads, off);
    folded ^= __shfl_xor_sync(0xffffffffu, folded, off);
  }
  if ((threadIdx.x & 31) == 0 && reads != 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(d.digest), static_cast<unsigned long long>(reads));
    atomicXor(reinterpret_cast<unsigned long long*>(d.digest + 1), static_cast<unsigned long long>(folded));
  }
}

__global__ void __launch_bounds__(kThreads) PrewarmKernel(const PrewarmDesc d, uint64_t pages, uint64_t pieces) {
  // Beside the kernel before it, nothing waits first: the descriptor's arrays and the host records are
  // not that kernel's to write (hs_prewarm_args says so). Every block waits for it last, so what
  // follows in the stream finds both complete.
  if (d.order == LaunchOrder::kProgrammatic) internal::WaitForPriorGrid();
  PrewarmBlock(d, pages, pieces);
  if (d.order == LaunchOrder::kBeside) internal::WaitForPriorGrid();
}

}  // namespace

cudaError_t LaunchPrewarm(const PrewarmDesc& d, cudaStream_t stream) {
  ResolveLaunchConfig device;  // sms 0: asks the driver
  return LaunchPrewarm(d, device, stream);
}

cudaError_t LaunchPrewarm(const PrewarmDesc& d, const ResolveLaunchConfig& config, cudaStream_t stream) {
  if (const char* why = CheckPrewarmDesc(d)) return internal::FailLaunch(std::string("prewarm: ") + why);
  if (d.max_batch == 0) {
    internal::SetLaunchError("");
    return cudaSuccess;
  }
  int sms = config.sms, cc_major = config.cc_major;
  if (sms <= 0) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e != cudaSuccess) return internal::LaunchCallFailed(e);
  }
  const bool ordered = d.order != LaunchOrder::kAfterCompletion;
  const int blocks = d.max_blocks > 0 ? d.max_blocks : (sms / 8 > 0 ? sms / 8 : 1);
  const uint64_t pages = PrewarmMaxPages(d);
  const uint64_t pieces = (PrewarmMaxReadsOfPage(d) + kPrewarmReadsPerThread - 1) / kPrewarmReadsPerThread;
  if (pages * pieces > (uint64_t{1} << 40) / static_cast<uint64_t>(d.max_batch)) {
    return internal::FailLaunch("prewarm: the index space (max_batch x pages x reads) is too large");
  }
  const cudaError_t e = internal::LaunchInOrder(PrewarmKernel, dim3(blocks), dim3(kThreads), 0, stream,
                                                ordered && cc_major >= 9, d, pages, pieces);
  return e != cudaSuccess ? internal::LaunchCallFailed(e) : internal::CheckLaunched();
}

}  // namespace hisparse
