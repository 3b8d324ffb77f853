// Private to kernels/: programmatic dependent launch (PDL, sm_90 and later). A kernel launched as
// a programmatic dependent may start while the kernel before it in the stream is still finishing:
// its blocks get scheduled and run their prologue during the previous kernel's tail instead of
// after its completion. Everything that reads or writes global memory must wait for the previous
// grid first (WaitForPriorGrid: it returns once that grid has completed and its writes are
// visible); a kernel launched the ordinary way returns from it at once. Every data-path kernel
// that can be launched this way calls WaitForPriorGrid before its first global access, on every
// path, so a chain of such launches keeps the stream's order transitively: a grid completes only
// after its own wait returned.
#ifndef HISPARSE_KERNELS_STREAM_ORDER_CUH_
#define HISPARSE_KERNELS_STREAM_ORDER_CUH_

#include <cuda_runtime.h>

namespace hisparse::internal {

__device__ __forceinline__ void WaitForPriorGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the stream's next kernel, where it was launched as this one's programmatic dependent, be
// scheduled once every block of this grid has called this (or exited), instead of at this grid's
// end. Only scheduling changes: a dependent that waits (WaitForPriorGrid) still sees this grid
// complete, so a kernel calls it where whatever comes next may run beside it.
__device__ __forceinline__ void LetDependentsLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent of the
// stream's previous kernel when `programmatic` (the kernel must call WaitForPriorGrid first). The
// attribute is only asked for when set, so ordinary launches stay ordinary launches.
template <typename... Params, typename... Args>
cudaError_t LaunchInOrder(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                          bool programmatic, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  if (programmatic) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Args&&>(args)...);
}

}  // namespace hisparse::internal

#endif  // HISPARSE_KERNELS_STREAM_ORDER_CUH_
