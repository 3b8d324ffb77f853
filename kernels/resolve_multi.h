// Private to kernels/: the multi-query RESOLVE launcher (resolve_multi.cu) that LaunchResolve
// dispatches to when the geometry has draft_tokens > 0 (resolve.h rule 8).
#ifndef HISPARSE_KERNELS_RESOLVE_MULTI_H_
#define HISPARSE_KERNELS_RESOLVE_MULTI_H_

#include <cuda_runtime.h>

#include <cstddef>

#include "hisparse/kernels/resolve.h"
#include "hisparse/kernels/resolve_cuda.h"
#include "launch_status.h"

namespace hisparse::internal {

// Whether to launch as a programmatic dependent: asked for (either programmatic order), on a device
// that supports it.
inline bool Programmatic(const ResolveLaunchConfig& c) {
  return c.order != LaunchOrder::kAfterCompletion && c.cc_major >= 9;
}
// Whether RESOLVE runs beside the kernel before (LaunchOrder::kBeside): it waits for that kernel
// last, not first. Only where the launch is programmatic; otherwise that kernel has completed.
inline bool Beside(const ResolveLaunchConfig& c) { return c.order == LaunchOrder::kBeside && Programmatic(c); }

// Workspace of a multi-query launch: one scratch block per batch entry (hash tables over the
// (draft_tokens + 1) * k selections and the B slots, ranks, victims).
size_t MultiQueryWorkspaceBytes(const ArenaGeometry& g, int max_batch);
// PrepareResolveLaunch's part for a multi-query geometry: given c's device figures (sms,
// smem_optin), sets c->smem (the planner's shared-memory table, 0 when it does not fit) and that
// kernel's shared-memory attribute on the current device.
cudaError_t PrepareMultiQueryLaunch(const ArenaGeometry& g, ResolveLaunchConfig* c);
// One block per batch entry; d is checked by LaunchResolve (pointers, geometry, max_batch > 0),
// and c was prepared for the current device and d's geometry (PrepareMultiQueryLaunch).
cudaError_t LaunchMultiQueryResolve(const ResolveDesc& d, void* workspace, size_t workspace_bytes,
                                    const ResolveLaunchConfig& c, cudaStream_t stream);

}  // namespace hisparse::internal

#endif  // HISPARSE_KERNELS_RESOLVE_MULTI_H_
