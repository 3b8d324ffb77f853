// CUDA launchers of RESOLVE, prefill store (plain and indexed), decode append and row reset
// (kernels/resolve.cu, kernels/store_append.cu). They meet the contract of resolve.h exactly: for
// identical inputs they leave slot tables, LRU orders, outputs (page tables included), counters and
// error flags identical to the CPU reference.
//
// Every launcher enqueues work on the given stream and returns at once: no host synchronization,
// no allocation, no host-side state that changes between launches. All of them can be captured in
// a CUDA graph and replayed; RESOLVE and append read the batch size from device memory, so one
// graph captured for max_batch serves every batch size up to it.
//
// RESOLVE needs a caller-provided workspace in device memory (ResolveWorkspaceBytes): it holds
// the per-launch work queue that spreads one step's miss fetches over the whole GPU. The workspace
// must be zeroed once after allocation (InitResolveWorkspace); every launch leaves it zeroed
// again, so graph replays need nothing in between. Its layout depends only on the geometry and its
// size, so launches of any max_batch up to the one it was sized for may share it, in any order
// (a graph per padded batch size, as engines capture them). One workspace serves one stream at a time:
// launches that share it must be ordered (same stream, or a dependency). After a launch that
// failed mid-kernel (a sticky CUDA error) re-initialize it.
//
// Errors: a launcher returns cudaSuccess, the launch's CUDA error, or cudaErrorInvalidValue for
// input it rejects on the host (unsupported geometry, record size, workspace too small). The
// reason is then in LastLaunchError() (per host thread, valid until the next launcher call on
// that thread). Per-row input errors found on the device are reported through error_flags, as in
// the contract.
//
// Thread-safety: the launchers may be called from any host thread; LastLaunchError is
// thread-local.
#ifndef HISPARSE_KERNELS_RESOLVE_CUDA_H_
#define HISPARSE_KERNELS_RESOLVE_CUDA_H_

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "hisparse/kernels/arena_layout.h"
#include "hisparse/kernels/resolve.h"

namespace hisparse {

// Bytes of device memory one RESOLVE workspace needs for this geometry and max_batch.
size_t ResolveWorkspaceBytes(const ArenaGeometry& g, int max_batch);

// Zeroes a workspace (once after allocation, or after a failed launch).
cudaError_t InitResolveWorkspace(void* workspace, size_t bytes, cudaStream_t stream);

// What RESOLVE and replay launches need to know of the device and of the RESOLVE kernel for one
// geometry: the SM count, the opt-in shared memory per block and the kernel's occupancy. Asking
// the driver for these at every step costs host time on the decode path, and none of them changes
// during a session: PrepareResolveLaunch asks once (at session open, with the session's device
// current) and a launcher given the config uses it. A launcher uses a config only when it was
// prepared for the current device and the launch's k, slots, record size and draft tokens;
// otherwise it asks the driver as the launchers without a config do, so the kernels' behaviour
// never depends on it. For a multi-query geometry (draft_tokens > 0) smem is the planner's
// shared-memory position table (0: it does not fit, the table lives in the workspace).
struct ResolveLaunchConfig {
  int device = -1;  // -1: not prepared
  int32_t k = 0;
  int32_t slots = 0;
  uint32_t record_bytes = 0;
  int32_t draft_tokens = 0;
  int sms = 0;            // cudaDevAttrMultiProcessorCount
  int smem_optin = 0;     // cudaDevAttrMaxSharedMemoryPerBlockOptin
  unsigned smem = 0;      // dynamic shared memory of one RESOLVE block for this geometry
  int blocks_per_sm = 0;  // RESOLVE blocks resident per SM (cudaOccupancyMaxActiveBlocksPerMultiprocessor)
  // Launch tuning, not contract (outputs and tables are the same either way): a row whose misses
  // go through the work queue fetches them in position order, i.e. host-address order, instead
  // of selection order, in launches of the single-query kernel with k >= kAddressOrderMinK and
  // max_batch >= kAddressOrderMinBatch. bench/RESULTS.md, "Address-ordered fetch", has what it
  // buys and costs.
  bool address_order = true;
  // How the launch orders itself after the kernel before it in the stream (LaunchOrder, resolve.h).
  // Outputs and tables are the same in every order; only what may run at once differs.
  LaunchOrder order = LaunchOrder::kAfterCompletion;
  // The most thread blocks the launch may occupy (0: as many as the device holds at once). The grid
  // otherwise fills the GPU with helper blocks that fetch; an engine that runs RESOLVE on a side
  // stream beside its own kernels, to hide the misses under them, gives it a few SMs' worth and
  // leaves the rest to those kernels. Fewer row blocks than rows plan several rows each; the
  // outputs and tables are the same with any budget. With draft tokens (the multi-query form) it
  // bounds the fetch kernel's grid; the planner keeps one block a row.
  int max_blocks = 0;
  // Launch tuning, not contract: the blocks whose consumer warps take the work queue's chunks (0:
  // every block of the grid). Fewer consumers keep the host addresses in flight in a narrower span,
  // which scattered reads over PCIe need (bench/RESULTS.md, "Scattered host reads"); every row keeps
  // its planner, and no helper block is added past these. What fewer consumers buy is measured in
  // bench/RESULTS.md, "Fewer consumer blocks"; the default stays every block until a default that
  // depends on the host layout has run through the GPU suite.
  int consumer_blocks = 0;
  // Launch tuning, not contract: the warps of each consumer block that take the work queue's chunks
  // (1 to 16, the block's last ones; 0: two, or under a budget of blocks (max_blocks) as many as
  // give the grid the whole GPU's count of consumer warps, since a budget's few blocks with two
  // each keep too few loads in flight: bench/RESULTS.md, "RESOLVE's budget of blocks, alone"). A
  // workspace's END entries bound the total to two a block of the grid it was sized for. The
  // single-query kernel only; the multi-query fetch keeps its own.
  int consumer_warps = 0;
  // Launch tuning, not contract: every block lets the stream's next kernel, where that one is
  // launched as RESOLVE's programmatic dependent, be scheduled at once (griddepcontrol.
  // launch_dependents first thing), so that it runs beside RESOLVE on the SMs a budget
  // (max_blocks) leaves: an engine's indexer for later rows, say. A dependent that waits for
  // RESOLVE still sees it complete; one that does not wait must neither read what RESOLVE writes
  // nor write what it reads, nor touch what the kernel before RESOLVE writes (a programmatic
  // RESOLVE lets it launch before that kernel has completed). The single-query kernel only.
  bool early_dependents = false;
  int cc_major = 0;  // cudaDevAttrComputeCapabilityMajor
};
// On the H200 the address order bought 0.01-0.12 of the link at batch 64 and 128 with scattered
// misses and cost 1.5-3 us (5-10%) of a batch-1 launch, whose fetch it cannot speed up; below
// k 1024 its counts do not fit in the planner's free shared memory.
inline constexpr int kAddressOrderMinK = 1024;
inline constexpr int kAddressOrderMinBatch = 64;

// Fills `config` for the current device and `g`, and sets the RESOLVE kernel's shared-memory
// attribute on that device. cudaErrorInvalidValue (LastLaunchError says why) for a geometry that
// RESOLVE does not support, e.g. one whose per-row plan does not fit in shared memory.
cudaError_t PrepareResolveLaunch(const ArenaGeometry& g, ResolveLaunchConfig* config);

// One RESOLVE step for one layer and the batch: hit detection, LRU eviction, miss fetch from the
// host pool (GPU threads reading mapped host memory), slot table. The grid (at most one wave of
// resident blocks) is sized from max_batch and the device; entries at index >= *d.batch_size
// only get kPadding outputs (rule 7), and blocks without a row help fetch other rows' misses.
// Supported: every geometry ValidateArenaGeometry accepts whose per-row plan fits in one thread
// block's shared memory (e.g. k = 2048 with B up to 17,344 on an H200; LastLaunchError says
// otherwise). Rows of one launch must be distinct (two entries of one row would race).
cudaError_t LaunchResolve(const ResolveDesc& d, void* workspace, size_t workspace_bytes, cudaStream_t stream);
// The same, with the device figures of PrepareResolveLaunch (asked for again only if `config`
// does not match the current device and d's geometry).
cudaError_t LaunchResolve(const ResolveDesc& d, void* workspace, size_t workspace_bytes,
                          const ResolveLaunchConfig& config, cudaStream_t stream);

// Exact layer-wise prefetch (ReplayDesc): copies the anchor's recorded misses into `layer`'s
// slots and makes its tables the anchor's. Meant for a side stream that waits on an event recorded
// after the anchor's RESOLVE, so the copies overlap the anchor's and the next layers' compute.
// Graph-capturable like RESOLVE; needs no workspace. Uses d.blocks thread blocks (0: an eighth of
// the SMs), so the engine's kernels on the main stream keep the rest of the GPU.
cudaError_t LaunchReplay(const ReplayDesc& d, cudaStream_t stream);
// The same, with the SM count of a config prepared for the current device (any geometry).
cudaError_t LaunchReplay(const ReplayDesc& d, const ResolveLaunchConfig& config, cudaStream_t stream);

// Prefill store (StoreDesc): host pool always, slots and tables when seq_len_after <= B.
cudaError_t LaunchStore(const StoreDesc& d, cudaStream_t stream);

// Indexed prefill store (IndexedStoreDesc): one check kernel (one block) over src_index, then one
// copy launch for every layer of the range and every token of the chunk. The host-visible fields
// are checked here (cudaErrorInvalidValue, LastLaunchError says which); a source index outside
// [0, src_tokens) is found on the device: the copy then writes nothing and kResolveBadIndex is ORed
// into d.error_flags. d.check must be a device word (one per stream of stores).
cudaError_t LaunchStoreIndexed(const IndexedStoreDesc& d, cudaStream_t stream);

// Decode append (AppendDesc): the newest token of every batch row into slot B and the host pool.
cudaError_t LaunchAppend(const AppendDesc& d, cudaStream_t stream);

// Every layer of `row`: slots EMPTY, LRU = identity (as ResetRowReference).
cudaError_t LaunchResetRow(const ArenaView& arena, int32_t row, cudaStream_t stream);

// Why the last launcher call on this thread returned cudaErrorInvalidValue (or the CUDA error's
// name otherwise); "" after a success.
const char* LastLaunchError();

}  // namespace hisparse

#endif  // HISPARSE_KERNELS_RESOLVE_CUDA_H_
