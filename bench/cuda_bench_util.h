// Helpers shared by hisparse-bench's CUDA subcommands (resolve, resolve-shared, session-open):
// a fatal CUDA check, the ~20 us spin kernel that hides launch overhead, medians, and the link's
// bulk H2D bandwidth (1 GiB pinned cudaMemcpy, best of 5 after a warm-up). Plain C++ (the kernel
// lives in cuda_bench_util.cu), so host-compiled subcommands that include gRPC headers can use it.
#ifndef HISPARSE_BENCH_CUDA_BENCH_UTIL_H_
#define HISPARSE_BENCH_CUDA_BENCH_UTIL_H_

#include <cuda_runtime.h>
#include "hisparse/hisparse.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "hisparse/kernels/resolve_cuda.h"

#define BENCH_CUDA(x)                                                                                       \
  do {                                                                                                      \
    const cudaError_t e_ = (x);                                                                             \
    if (e_ != cudaSuccess) {                                                                                \
      std::fprintf(stderr, "hisparse-bench: %s: %s (%s)\n", #x, cudaGetErrorString(e_), LastLaunchError()); \
      std::exit(1);                                                                                         \
    }                                                                                                       \
  } while (0)

namespace hisparse::bench {

// hs_arena_kind as hisparse-ctl and the logs spell it ("host", "cuda-vmm", "cuda-ipc", "private-gpu").
inline const char* ArenaKindName(hs_arena_kind kind) {
  switch (kind) {
    case HS_ARENA_HOST:
      return "host";
    case HS_ARENA_CUDA_VMM:
      return "cuda-vmm";
    case HS_ARENA_CUDA_IPC:
      return "cuda-ipc";
    case HS_ARENA_PRIVATE_GPU:
      return "private-gpu";
  }
  return "unknown";
}

// Launches a one-thread kernel that spins `cycles` GPU clocks on `stream`.
void LaunchSpin(cudaStream_t stream, long long cycles);
// Spin cycles for about `us` microseconds on the current device.
long long SpinCycles(double us);
// Launches a stand-in for the kernel that precedes RESOLVE in serving (the indexer's top-k): one
// block of 256 threads per row copies its per_row selections from src to dst. `early`: the kernel
// lets programmatic dependents launch as soon as it starts (griddepcontrol.launch_dependents), as
// kernels written for programmatic launches do; otherwise only as its blocks exit.
void LaunchProducer(int32_t* dst, const int32_t* src, int rows, int per_row, bool early, cudaStream_t stream);

// Launches a kernel that reads `bytes` of device memory at buf and writes nothing (sink: a device
// int it never writes in practice), leaving L2 full of clean lines of other data: what an indexer
// streaming its keys leaves behind it for the top-k after it.
void LaunchStreamRead(const void* buf, size_t bytes, int* sink, cudaStream_t stream);

template <typename T>
double Median(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  if (n == 0) return 0;
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// GB/s of a 1 GiB pinned host-to-device copy: best of 5 after one warm-up.
double MeasureLink();
// Prints device 0's name, SM count and MeasureLink() as the benchmarks' first JSON line (stdout);
// returns the link's GB/s.
double PrintLinkLine();

// A host pool for RESOLVE benches: one mapped, portable cudaHostAlloc block with every page
// touched, and its device address. Owns it.
struct MappedPool {
  explicit MappedPool(size_t bytes);
  ~MappedPool() { cudaFreeHost(host); }
  MappedPool(const MappedPool&) = delete;
  MappedPool& operator=(const MappedPool&) = delete;
  uint8_t* host = nullptr;
  uint8_t* dev = nullptr;
  size_t bytes = 0;
};

// A 128 MiB device buffer whose memset evicts the L2, so the next launch reads its tables from HBM
// ("cold", as in serving). Owns it.
struct L2Scrubber {
  L2Scrubber() { BENCH_CUDA(cudaMalloc(&buf, kBytes)); }
  ~L2Scrubber() { cudaFree(buf); }
  L2Scrubber(const L2Scrubber&) = delete;
  L2Scrubber& operator=(const L2Scrubber&) = delete;
  void Scrub(int value, cudaStream_t stream) { BENCH_CUDA(cudaMemsetAsync(buf, value & 0xff, kBytes, stream)); }
  static constexpr size_t kBytes = size_t{128} << 20;
  void* buf = nullptr;
};

// Evicts the GPU's cached translations of host memory: one 16-byte read every 4 KiB of a pinned
// pool of its own. The GPU translates host memory 64 KiB at a time and caches some 10,000-20,000
// of them, so a bench that reads the same host records run after run finds them cached ("warm"),
// where a serving RESOLVE, which reads another layer's records each launch, finds none
// (bench/RESULTS.md, "Scattered reads go cold"). Owns the pool.
class TranslationScrubber {
 public:
  explicit TranslationScrubber(size_t bytes);  // bytes: at least the GPU's reach (8 GiB is ample)
  ~TranslationScrubber();
  TranslationScrubber(const TranslationScrubber&) = delete;
  TranslationScrubber& operator=(const TranslationScrubber&) = delete;
  void Scrub(cudaStream_t stream);
  // A word the reading kernels may write, so that their reads are kept.
  unsigned* sink() const { return sink_; }

 private:
  MappedPool pool_;
  int sms_ = 0;
  unsigned* sink_ = nullptr;
};

// One 16-byte read, cache-volatile (so that it goes through the GPU's translation of its
// address), at each of `n` device addresses of host memory; `sink` keeps them from being dropped.
void LaunchReadEach(const long long* addresses, long long n, unsigned* sink, int blocks, cudaStream_t stream);

// The device-side inputs of one RESOLVE launch over rows 0..batch-1, every row at seq_len `seq`:
// host page tables (one layer), rows, seq_lens, batch size, positions / out_slots / error flags,
// and a workspace zeroed on `stream`. Owns them all.
struct ResolveInputs {
  // Row r's host run at pool_dev + r * seq * record_bytes (one page per row).
  ResolveInputs(const ArenaGeometry& g, uint8_t* pool_dev, int batch, int seq, cudaStream_t stream);
  // Row r's pages at table[r * pages_per_entry + i] (device addresses), records_per_page each.
  ResolveInputs(const ArenaGeometry& g, const std::vector<uint8_t*>& table, uint32_t records_per_page,
                uint32_t pages_per_entry, int batch, int seq, cudaStream_t stream);
  ~ResolveInputs();
  ResolveInputs(const ResolveInputs&) = delete;
  ResolveInputs& operator=(const ResolveInputs&) = delete;

  HostRecordMap host() const { return HostRecordMap{d_base, d_cap, records_per_page, pages_per_entry}; }
  uint32_t records_per_page = kContiguousRecordsPerPage;
  uint32_t pages_per_entry = 1;

  uint8_t** d_base = nullptr;
  int32_t *d_cap = nullptr, *d_rows = nullptr, *d_seqs = nullptr, *d_batch = nullptr, *d_pos = nullptr,
          *d_out = nullptr;
  int32_t* d_scratch = nullptr;  // [batch][k]: LaunchResolveMemoryFloor's outputs
  uint32_t* d_err = nullptr;
  void* ws = nullptr;
  size_t ws_bytes = 0;
};

}  // namespace hisparse::bench

#endif  // HISPARSE_BENCH_CUDA_BENCH_UTIL_H_
