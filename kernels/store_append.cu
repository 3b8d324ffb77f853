// CUDA prefill store (plain and indexed), decode append and row reset: plain copy kernels, a warp
// per record with 16-byte accesses. Semantics are those of IndexedStoreReference / StoreReference /
// AppendReference / ResetRowReference (kernels/resolve_reference.cc), including the refresh of a
// regular slot that already holds a position being rewritten. The plain store is the indexed store
// of every layer with index t for token t (src_index null), as in the reference: one kernel.
//
// An indexed store's source indices and every store's host page table live in device memory, so
// the host cannot check them: a one-block check kernel (every store) writes the verdict to the
// descriptor's check word (and ORs kResolveBadIndex or kResolveReadOnlyPage into error_flags) and
// the copy kernel, next on the stream, reads it first and writes nothing when it is set. Both are
// plain launches, so the pair is graph-capturable. Append checks its entry's few pages itself.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "hisparse/kernels/resolve_cuda.h"
#include "launch_status.h"
#include "stream_order.cuh"

namespace hisparse {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// One warp copies one record of `bytes` (multiple of 16).
__device__ __forceinline__ void WarpCopy(uint8_t* dst, const uint8_t* src, uint32_t bytes) {
  const int lane = threadIdx.x & 31;
  const int4* s = reinterpret_cast<const int4*>(src);
  int4* d = reinterpret_cast<int4*>(dst);
  const int n = static_cast<int>(bytes / 16);
  for (int u = lane; u < n; u += 32) d[u] = s[u];
}

__device__ __forceinline__ uint8_t* HostRec(const ArenaView& a, const HostRecordMap& h, int row, int layer, int pos) {
  return h.Record(a.geometry, row, layer, pos);
}

// A store's check, before anything is written: every source index in [0, src_tokens) (indexed
// stores), and every host page the store writes (the pages of positions [start_pos, start_pos +
// num_tokens) in every layer of the range) writable. One block; writes the verdict (0,
// kResolveBadIndex, else kResolveReadOnlyPage: the reference's order) to *check unconditionally,
// so a graph replay needs no reset.
constexpr int kCheckThreads = 1024;
__global__ void __launch_bounds__(kCheckThreads) StoreCheckKernel(const IndexedStoreDesc d) {
  bool bad_index = false, read_only = false;
  for (int t = threadIdx.x; d.src_index && t < d.num_tokens; t += kCheckThreads) {
    const int32_t x = d.src_index[t];
    bad_index |= x < 0 || x >= d.src_tokens;
  }
  const HostRecordMap& h = d.host;
  if (d.num_tokens > 0 && d.seq_len_after <= h.capacity[d.row]) {  // else the copy writes nothing anyway
    const uint32_t first = static_cast<uint32_t>(d.start_pos) / h.records_per_page;
    const uint32_t pages = static_cast<uint32_t>(d.start_pos + d.num_tokens - 1) / h.records_per_page - first + 1;
    const long long n = static_cast<long long>(pages) * d.num_layers;
    for (long long x = threadIdx.x; x < n; x += kCheckThreads) {
      const int layer = d.first_layer + static_cast<int>(x / pages);
      read_only |= !HostRecordMap::PageWritable(h.Table(d.arena.geometry, d.row, layer)[first + x % pages]);
    }
  }
  bad_index = __syncthreads_or(bad_index) != 0;
  read_only = __syncthreads_or(read_only) != 0;
  if (threadIdx.x == 0) {
    const uint32_t v = bad_index ? kResolveBadIndex : (read_only ? kResolveReadOnlyPage : 0u);
    *d.check = v;
    if (v && d.error_flags) atomicOr(d.error_flags, v);
  }
}

// Store: blockIdx.y = layer - first_layer; warp items [0, num_tokens) write the host pool, items
// [num_tokens, num_tokens + B) handle slot s = item - num_tokens, item num_tokens + B slot B.
__global__ void __launch_bounds__(kThreads) StoreKernel(const IndexedStoreDesc d) {
  const ArenaView& a = d.arena;
  const int B = a.geometry.slots;
  const uint32_t rb = a.geometry.record_bytes;
  if (*d.check) return;                                  // a bad index or a read-only page: nothing is written
  if (d.seq_len_after > d.host.capacity[d.row]) return;  // rejected: nothing is written
  const int layer = d.first_layer + static_cast<int>(blockIdx.y);
  const int item = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int start = d.start_pos, end = d.start_pos + d.num_tokens;
  const uint8_t* src_layer = d.src_base + static_cast<int64_t>(blockIdx.y) * d.src_layer_stride;
  auto src_of = [&](int pos) {
    const int64_t index = d.src_index ? static_cast<int64_t>(d.src_index[pos - start]) : pos - start;
    return src_layer + index * d.src_token_stride;
  };
  if (item < d.num_tokens) {
    WarpCopy(HostRec(a, d.host, d.row, layer, start + item), src_of(start + item), rb);
    return;
  }
  const int s = item - d.num_tokens;
  if (s > B) return;
  if (s == B) {
    const int newest = d.seq_len_after - 1;
    if (newest >= start && newest < end) WarpCopy(a.Record(d.row, layer, B), src_of(newest), rb);
    return;
  }
  int* slot_pos = a.SlotPos(d.row, layer);
  const int old = slot_pos[s];  // only this warp touches slot s
  const uint8_t* from = nullptr;
  if (old >= start && old < end) from = src_of(old);  // refresh of a resident slot
  const int filled = d.seq_len_after;
  if (filled <= B) {
    if (s < filled) from = (s >= start && s < end) ? src_of(s) : HostRec(a, d.host, d.row, layer, s);
    __syncwarp();
    if ((threadIdx.x & 31) == 0) {
      slot_pos[s] = s < filled ? s : kEmptySlot;
      a.Lru(d.row, layer)[s] = s < B - filled ? filled + s : s - (B - filled);
    }
  }
  if (from) WarpCopy(a.Record(d.row, layer, s), from, rb);
}

// Append: one block per batch entry, q = token_counts[i] tokens (1 without counts; resolve.h
// AppendDesc). Warp t < q writes token t (position seq_len - q + t) to the host pool and tail slot
// B + t; the block then scans the row's slot table for a regular slot holding one of the q
// positions (rare) and refreshes it from the same source, as AppendReference does.
__global__ void __launch_bounds__(kThreads) AppendKernel(const AppendDesc d) {
  // A kernel launched as this one's programmatic dependent may start at once: an engine's indexer,
  // which reads nothing the append writes, then runs beside it, and the append leaves the step's
  // critical path (hisparse.h, hs_append). A dependent that waits (WaitForPriorGrid) still finds
  // every record written; an ordinary launch after it is not affected.
  internal::LetDependentsLaunch();
  const ArenaView& a = d.arena;
  int batch = *d.batch_size;
  if (batch > d.max_batch) batch = d.max_batch;
  const int i = blockIdx.x;
  if (i >= batch) return;
  const int row = d.rows[i];
  const int seq = d.seq_lens[i];
  const int Q = a.geometry.TailSlots();
  uint32_t err = 0;
  int q = 1;
  if (d.layer < 0 || d.layer >= a.geometry.num_layers || row < 0 || row >= a.geometry.max_rows) {
    err = kResolveBadRow;
  } else if (d.token_counts && ((q = d.token_counts[i]) < 1 || q > Q)) {
    err = kResolveBadQueryCount;
  } else if (seq < q || seq > d.host.capacity[row]) {
    err = kResolveBadSeqLen;
  } else if (!d.host.RangeWritable(a.geometry, row, d.layer, seq - q, seq)) {
    err = kResolveReadOnlyPage;  // every thread reads the same few table entries: the block agrees
  }
  if (err) {
    if (threadIdx.x == 0 && d.error_flags) atomicOr(d.error_flags, err);
    return;
  }
  const uint32_t rb = a.geometry.record_bytes;
  const int first = seq - q;  // position of token 0
  auto src_of = [&](int t) { return d.src + (static_cast<int64_t>(i) * Q + t) * d.src_stride; };
  const int warp = threadIdx.x >> 5;
  for (int t = warp; t < q; t += kWarps) {
    WarpCopy(HostRec(a, d.host, row, d.layer, first + t), src_of(t), rb);
    WarpCopy(a.Record(row, d.layer, a.geometry.slots + t), src_of(t), rb);
  }
  const int* slot_pos = a.SlotPos(row, d.layer);
  const int B = a.geometry.slots;
  // Warp w scans slots [w * 32, ...) in steps of the block; a match is copied by that warp.
  for (int base = warp * 32; base < B; base += kThreads) {
    const int s = base + (threadIdx.x & 31);
    const int held = s < B ? slot_pos[s] : -1;
    const bool match = held >= first && held < seq;
    unsigned m = __ballot_sync(~0u, match);
    while (m) {
      const int l = __ffs(m) - 1;
      m &= m - 1;
      const int t = __shfl_sync(~0u, held, l) - first;
      WarpCopy(a.Record(row, d.layer, base + l), src_of(t), rb);
    }
  }
}

__global__ void __launch_bounds__(kThreads) ResetRowKernel(const ArenaView a, int row) {
  const int layer = blockIdx.y;
  int* slot_pos = a.SlotPos(row, layer);
  int* lru = a.Lru(row, layer);
  for (int s = blockIdx.x * kThreads + threadIdx.x; s < a.geometry.slots; s += gridDim.x * kThreads) {
    slot_pos[s] = kEmptySlot;
    lru[s] = s;
  }
}

}  // namespace

namespace {

// Host-side checks of a store (every field the host can read), then the check and copy launches.
cudaError_t LaunchStoreKernels(const IndexedStoreDesc& d, cudaStream_t stream) {
  char buf[160];
  const ArenaGeometry& g = d.arena.geometry;
  if (const char* why = internal::CheckGeometry(g, buf, sizeof buf)) return internal::FailLaunch(why);
  if (d.row < 0 || d.row >= g.max_rows) {
    std::snprintf(buf, sizeof buf, "store: row %d outside [0, %d)", d.row, g.max_rows);
    return internal::FailLaunch(buf);
  }
  if (d.num_layers < 1 || d.first_layer < 0 || d.first_layer > g.num_layers - d.num_layers) {
    std::snprintf(buf, sizeof buf, "store: layers [%d, %d + %d) outside [0, %d) or empty", d.first_layer, d.first_layer,
                  d.num_layers, g.num_layers);
    return internal::FailLaunch(buf);
  }
  if (d.start_pos < 0 || d.num_tokens < 0) return internal::FailLaunch("store: negative start_pos or num_tokens");
  if (d.seq_len_after < 1 || static_cast<int64_t>(d.start_pos) + d.num_tokens > d.seq_len_after) {
    return internal::FailLaunch("store: seq_len_after < 1 or < start_pos + num_tokens");
  }
  if (d.num_tokens > 0 &&
      (!d.src_base || d.src_token_stride < static_cast<int64_t>(g.record_bytes) || d.src_token_stride % 16 ||
       d.src_layer_stride % 16 || reinterpret_cast<uintptr_t>(d.src_base) % 16)) {
    return internal::FailLaunch("store: src must be 16-byte aligned with 16-byte multiple strides >= record_bytes");
  }
  if (!d.host.page_base || !d.host.capacity) return internal::FailLaunch("store: the host map is null");
  if (const char* why = internal::CheckHostMap(d.host)) return internal::FailLaunch(why);
  if (!d.check) return internal::FailLaunch("store: a store needs a check word (a device uint32)");
  const bool indexed = d.src_index != nullptr && d.num_tokens > 0;
  if (indexed && d.src_tokens < 1) return internal::FailLaunch("store: an indexed store needs src_tokens >= 1");
  IndexedStoreDesc k = d;
  if (!indexed) k.src_index = nullptr;
  StoreCheckKernel<<<1, kCheckThreads, 0, stream>>>(k);
  if (const cudaError_t e = internal::CheckLaunched(); e != cudaSuccess) return e;
  const int items = d.num_tokens + g.slots + 1;
  dim3 grid((items + kWarps - 1) / kWarps, d.num_layers);
  StoreKernel<<<grid, kThreads, 0, stream>>>(k);
  return internal::CheckLaunched();
}

}  // namespace

cudaError_t LaunchStore(const StoreDesc& d, cudaStream_t stream) {
  IndexedStoreDesc x = IndexedStoreOf(d);
  return LaunchStoreKernels(x, stream);
}

cudaError_t LaunchStoreIndexed(const IndexedStoreDesc& d, cudaStream_t stream) {
  if (d.num_tokens > 0 && !d.src_index) return internal::FailLaunch("store: an indexed store needs src_index");
  return LaunchStoreKernels(d, stream);
}

cudaError_t LaunchAppend(const AppendDesc& d, cudaStream_t stream) {
  char buf[160];
  const ArenaGeometry& g = d.arena.geometry;
  if (const char* why = internal::CheckGeometry(g, buf, sizeof buf)) return internal::FailLaunch(why);
  if (d.max_batch < 0 || !d.batch_size || !d.rows || !d.seq_lens) {
    return internal::FailLaunch("append: max_batch < 0 or a null per-batch pointer");
  }
  if (!d.host.page_base || !d.host.capacity) return internal::FailLaunch("append: the host map is null");
  if (const char* why = internal::CheckHostMap(d.host)) return internal::FailLaunch(why);
  if (d.max_batch == 0) {
    internal::SetLaunchError("");
    return cudaSuccess;
  }
  if (!d.src || d.src_stride < static_cast<int64_t>(g.record_bytes) || d.src_stride % 16 ||
      reinterpret_cast<uintptr_t>(d.src) % 16) {
    return internal::FailLaunch("append: src must be 16-byte aligned with a 16-byte multiple stride >= record_bytes");
  }
  AppendKernel<<<d.max_batch, kThreads, 0, stream>>>(d);
  return internal::CheckLaunched();
}

cudaError_t LaunchResetRow(const ArenaView& arena, int32_t row, cudaStream_t stream) {
  char buf[160];
  if (const char* why = internal::CheckGeometry(arena.geometry, buf, sizeof buf)) {
    return internal::FailLaunch(why);
  }
  if (row < 0 || row >= arena.geometry.max_rows) {
    std::snprintf(buf, sizeof buf, "reset: row %d outside [0, %d)", row, arena.geometry.max_rows);
    return internal::FailLaunch(buf);
  }
  const int per_layer = (arena.geometry.slots + kThreads - 1) / kThreads;
  dim3 grid(per_layer < 64 ? per_layer : 64, arena.geometry.num_layers);
  ResetRowKernel<<<grid, kThreads, 0, stream>>>(arena, row);
  return internal::CheckLaunched();
}

}  // namespace hisparse
