// Private to kernels/ and its benchmark: two kernels that only hisparse-bench's RESOLVE bench
// (bench/resolve_cmd.cu) times, as floors under RESOLVE, and tests/gpu checks. Built into
// hisparse_kernels_cuda (kernels/resolve.cu) beside RESOLVE, whose launch shape and tables they
// share; no engine calls them, so they are not in the public resolve_cuda.h. Errors as there
// (LastLaunchError).
#ifndef HISPARSE_KERNELS_BENCH_KERNELS_H_
#define HISPARSE_KERNELS_BENCH_KERNELS_H_

#include <cuda_runtime.h>
#include <stdint.h>

#include "hisparse/kernels/resolve.h"
#include "hisparse/kernels/resolve_cuda.h"

namespace hisparse {

// For benchmarks: an empty kernel with the launch shape of a single-query RESOLVE of max_batch
// entries (the same grid, block size and dynamic shared memory; `config` prepared for the current
// device by PrepareResolveLaunch). Timed like RESOLVE, it is the floor no planning can go below:
// what the launch itself costs.
cudaError_t LaunchResolveShapeOnly(const ResolveLaunchConfig& config, int max_batch, cudaStream_t stream);

// For benchmarks: the global memory traffic of a no-IO single-query RESOLVE step with its launch
// shape, and no planning. Each row block reads its row, capacity and selections and stages the
// row's slot table and LRU order into shared memory as RESOLVE does, then writes the LRU order
// back unchanged and k ints per entry into `scratch` ([max_batch][k], device memory); nothing else
// changes. Timed like RESOLVE, it is the floor under a one-launch plan of those tables: the launch,
// the dependent loads and the tables' bytes. `config` as for LaunchResolve (prepared for d's geometry).
cudaError_t LaunchResolveMemoryFloor(const ResolveDesc& d, const ResolveLaunchConfig& config, int32_t* scratch,
                                     cudaStream_t stream);

}  // namespace hisparse

#endif  // HISPARSE_KERNELS_BENCH_KERNELS_H_
