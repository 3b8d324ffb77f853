// See cuda_bench_util.h.
#include "cuda_bench_util.h"

namespace hisparse::bench {
namespace {

__global__ void SpinKernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// The kernel before RESOLVE in a serving stream, e.g. the indexer's top-k: one block per row
// writes the row's selections. `early`: it lets its dependents launch at once (as kernels built
// for programmatic launches do), else only as its blocks exit.
__global__ void ProducerKernel(int32_t* dst, const int32_t* src, int per_row, bool early) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (early) asm volatile("griddepcontrol.launch_dependents;");
#endif
  const size_t base = static_cast<size_t>(blockIdx.x) * per_row;
  for (int j = threadIdx.x; j < per_row; j += blockDim.x) dst[base + j] = src[base + j];
}

// Reads n 16-byte words (a grid-stride loop) and writes nothing unless the impossible happens, so
// that the L2 is left full of clean lines of other data, as an indexer streaming its keys leaves it.
__global__ void StreamReadKernel(const int4* buf, size_t n, int* sink) {
  int acc = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int4 v = __ldcg(buf + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x7fffffff && sink != nullptr) *sink = acc;
}

}  // namespace

void LaunchStreamRead(const void* buf, size_t bytes, int* sink, cudaStream_t stream) {
  int dev = 0, sms = 0;
  BENCH_CUDA(cudaGetDevice(&dev));
  BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  StreamReadKernel<<<4 * sms, 512, 0, stream>>>(static_cast<const int4*>(buf), bytes / sizeof(int4), sink);
}

void LaunchSpin(cudaStream_t stream, long long cycles) { SpinKernel<<<1, 1, 0, stream>>>(cycles); }

void LaunchProducer(int32_t* dst, const int32_t* src, int rows, int per_row, bool early, cudaStream_t stream) {
  ProducerKernel<<<rows, 256, 0, stream>>>(dst, src, per_row, early);
}

long long SpinCycles(double us) {
  int dev = 0, clock_khz = 0;
  BENCH_CUDA(cudaGetDevice(&dev));
  BENCH_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev));
  return static_cast<long long>(clock_khz * us / 1000.0);
}

// GB/s of a 1 GiB pinned host-to-device copy: best of 5 after one warm-up.
double MeasureLink() {
  const size_t bytes = size_t{1} << 30;
  void* h = nullptr;
  void* d = nullptr;
  BENCH_CUDA(cudaHostAlloc(&h, bytes, cudaHostAllocDefault));
  BENCH_CUDA(cudaMalloc(&d, bytes));
  std::memset(h, 1, bytes);
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  float best = 1e30f;
  for (int i = 0; i < 6; ++i) {
    BENCH_CUDA(cudaEventRecord(a));
    BENCH_CUDA(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaEventRecord(b));
    BENCH_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
    if (i > 0) best = std::min(best, ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFree(d);
  cudaFreeHost(h);
  return bytes / (best * 1e-3) / 1e9;
}

double PrintLinkLine() {
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  const double link = MeasureLink();
  std::printf("{\"kind\":\"link\",\"device\":\"%s\",\"sms\":%d,\"h2d_gbps\":%.2f}\n", prop.name,
              prop.multiProcessorCount, link);
  std::fflush(stdout);
  return link;
}

MappedPool::MappedPool(size_t n) : bytes(n) {
  BENCH_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&host), bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  for (size_t i = 0; i < bytes; i += 4096) host[i] = static_cast<uint8_t>(i >> 12);
  BENCH_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), host, 0));
}

namespace {
constexpr size_t kScrubStep = size_t{4} << 10;

// One 16-byte cache-volatile read at at(i) for each i < n (the grid strides over them).
template <class At>
__global__ void ReadKernel(At at, long long n, unsigned* sink) {
  unsigned acc = 0;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcv(reinterpret_cast<const uint4*>(at(i)));
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;
}

// Read i's address: base + i * step (every page of a pool), or list[i] (listed addresses).
struct Strided {
  const uint8_t* base;
  size_t step;
  __device__ const uint8_t* operator()(long long i) const { return base + i * step; }
};
struct Listed {
  const long long* list;
  __device__ const uint8_t* operator()(long long i) const { return reinterpret_cast<const uint8_t*>(list[i]); }
};
}  // namespace

TranslationScrubber::TranslationScrubber(size_t bytes) : pool_(bytes) {
  int dev = 0;
  BENCH_CUDA(cudaGetDevice(&dev));
  BENCH_CUDA(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, dev));
  BENCH_CUDA(cudaMalloc(&sink_, sizeof(unsigned)));
}

TranslationScrubber::~TranslationScrubber() { cudaFree(sink_); }

void TranslationScrubber::Scrub(cudaStream_t stream) {
  ReadKernel<<<sms_, 256, 0, stream>>>(Strided{pool_.dev, kScrubStep}, static_cast<long long>(pool_.bytes / kScrubStep),
                                       sink_);
  BENCH_CUDA(cudaGetLastError());
}

void LaunchReadEach(const long long* addresses, long long n, unsigned* sink, int blocks, cudaStream_t stream) {
  ReadKernel<<<blocks, 256, 0, stream>>>(Listed{addresses}, n, sink);
  BENCH_CUDA(cudaGetLastError());
}

namespace {
std::vector<uint8_t*> ContiguousRuns(uint8_t* pool_dev, int batch, int seq, uint32_t rb) {
  std::vector<uint8_t*> base(batch);
  for (int r = 0; r < batch; ++r) base[r] = pool_dev + static_cast<size_t>(r) * seq * rb;
  return base;
}
}  // namespace

ResolveInputs::ResolveInputs(const ArenaGeometry& g, uint8_t* pool_dev, int batch, int seq, cudaStream_t stream)
    : ResolveInputs(g, ContiguousRuns(pool_dev, batch, seq, g.record_bytes), kContiguousRecordsPerPage, 1, batch, seq,
                    stream) {}

ResolveInputs::ResolveInputs(const ArenaGeometry& g, const std::vector<uint8_t*>& table, uint32_t rpp, uint32_t ppe,
                             int batch, int seq, cudaStream_t stream)
    : records_per_page(rpp), pages_per_entry(ppe) {
  std::vector<int32_t> caps(batch, seq), rows(batch), seqs(batch, seq);
  for (int r = 0; r < batch; ++r) rows[r] = r;
  BENCH_CUDA(cudaMalloc(&d_base, table.size() * sizeof(uint8_t*)));
  BENCH_CUDA(cudaMemcpy(d_base, table.data(), table.size() * sizeof(uint8_t*), cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMalloc(&d_cap, batch * 4));
  BENCH_CUDA(cudaMemcpy(d_cap, caps.data(), batch * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMalloc(&d_rows, batch * 4));
  BENCH_CUDA(cudaMemcpy(d_rows, rows.data(), batch * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMalloc(&d_seqs, batch * 4));
  BENCH_CUDA(cudaMemcpy(d_seqs, seqs.data(), batch * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMalloc(&d_batch, 4));
  BENCH_CUDA(cudaMemcpy(d_batch, &batch, 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMalloc(&d_pos, static_cast<size_t>(batch) * g.k * 4));
  BENCH_CUDA(cudaMalloc(&d_out, static_cast<size_t>(batch) * g.k * 4));
  BENCH_CUDA(cudaMalloc(&d_scratch, static_cast<size_t>(batch) * g.k * 4));
  BENCH_CUDA(cudaMalloc(&d_err, 4));
  BENCH_CUDA(cudaMemset(d_err, 0, 4));
  ws_bytes = ResolveWorkspaceBytes(g, batch);
  BENCH_CUDA(cudaMalloc(&ws, ws_bytes));
  BENCH_CUDA(InitResolveWorkspace(ws, ws_bytes, stream));
}

ResolveInputs::~ResolveInputs() {
  for (void* p : {static_cast<void*>(d_base), static_cast<void*>(d_cap), static_cast<void*>(d_rows),
                  static_cast<void*>(d_seqs), static_cast<void*>(d_batch), static_cast<void*>(d_pos),
                  static_cast<void*>(d_out), static_cast<void*>(d_scratch), static_cast<void*>(d_err), ws}) {
    cudaFree(p);
  }
}

}  // namespace hisparse::bench
