// hisparse-bench gather: how fast records scattered over pinned host memory reach the GPU, by copy
// method, host memory and grid size, against the link's bulk rate measured in the same run
// (issue 20's >= 0.95 goals sit above what RESOLVE's copy reaches; this says what could get
// there, and what scattered reads lose to; bench/RESULTS.md, "Scattered host reads").
//
// Every point gathers --records distinct records of --record-bytes, drawn at random from a host
// pool of --span bytes laid out every --stride bytes (0: packed, as the daemon's slabs hold them;
// 768 puts every 656-B record at a 128-B line's start), into a device buffer (record j to slot
// perm[j], a random permutation), in random order or sorted by host address (--order). The pool
// (--pool) is pinned host memory that the GPU reads over the link:
//   hostalloc  one cudaHostAlloc(mapped, portable) block;
//   register   an anonymous mapping, madvise(MADV_HUGEPAGE), touched, then cudaHostRegister(mapped,
//              portable): what the daemon's memfd slabs become in an engine ("anon_huge_mib" says
//              how much of it the kernel backed with transparent huge pages);
//   register4k the same with MADV_NOHUGEPAGE: 4 KiB pages, as the daemon's memfd slabs are where
//              shmem gets no transparent huge pages (shmem_enabled "never", the common default);
//   hugetlb    an anonymous MAP_HUGETLB mapping of 2 MiB pages, then cudaHostRegister(mapped,
//              portable): the daemon's slabs where the host reserves huge pages (host_pool.hugepages);
//              the point is skipped, with the reason, where none are free;
//   hugetlb1g  the same of 1 GiB pages (the span rounded up to 1 GiB);
//   vmm        a CUDA VMM allocation on host NUMA node 0 (cuMemCreate, CU_MEM_LOCATION_TYPE_HOST_NUMA,
//              the recommended granularity), mapped for the GPU and the CPU.
// Each pool is filled by the GPU with a pattern of its byte offsets, which the check recomputes.
// Methods:
//   warp     RESOLVE's copy itself: one block of 512 threads per SM (or --blocks blocks); warp w
//            of W takes chunks w, w + W, ... of ChunkRecords' size and copies each with CopyChunk
//            (kernels/copy_chunk.cuh, 16-byte non-coherent loads, 8 a lane in flight),
//            specialised for the record size as RESOLVE is (DispatchRecordBytes);
//   tma      the same chunks and grid through the Hopper bulk-copy engine: per chunk, one
//            cp.async.bulk a record from host memory into shared memory (completing on an
//            mbarrier), then one cp.async.bulk a record from shared memory to its slot; each
//            warp keeps --tma-stages chunks in flight (sm_90 and newer; skipped below);
//   ce       the copy engines: one cudaMemcpyBatchAsync with a copy per record (host pointers
//            to device pointers); "enqueue_us" is the host time of that call;
//   memcpy   not a gather: one cudaMemcpyAsync of the same bytes from one contiguous run, the
//            link's rate at this size.
// Address translations (--translations): the GPU caches the translations of the host pages it
// reads, and every run reads the same records, so a point's later runs find them cached. A serving
// step's RESOLVEs each read another layer's records, 86 MB a row at 131,072 tokens, so they find
// none. (On the lent H100s the GPU translates host memory 64 KiB at a time, whatever the host's
// pages or the pool's kind, and keeps some 10,000-20,000 of them: bench/RESULTS.md, "Scattered
// reads go cold".) Variants:
//   warm     as above: each run after the one before (what every figure before 2026-12-06 was);
//   cold     before each run, one 16-byte read every 4 KiB of a second pinned pool of
//            --translation-scrub bytes, which evicts the cached translations;
//   touched  cold, then one 16-byte read at every --touch-page bytes (4K, 64K, 2M...) that the
//            point's records lie in (a kernel of one thread a read, timed apart as "touch_us"):
//            whether reading the pages ahead, under other work, gives a cold fetch the warm rate,
//            and how coarsely the GPU maps the pool (a read a mapped page suffices).
// Timing: per run, L2 is scrubbed (128 MiB memset), a GPU spin hides the launch (and, for ce, a
// spin longer than the measured enqueue), then CUDA events bracket the copy. Median and min of
// --runs. After the timed runs one more copy into a zeroed buffer is checked: every record's slot
// must hold its host record byte for byte ("check"; exit 1 when any differs).
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_cmd.h"
#include "copy_chunk.cuh"
#include "cuda_bench_util.h"
#include "host_tables.h"
#include "record_dispatch.h"

namespace hisparse::bench {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kChunkUnits = 256;  // 16-byte units of a chunk (~4 KB), as RESOLVE's queue chunks
constexpr int kMaxChunkRecords = 32;
constexpr int kMaxStages = 4;
constexpr size_t kTmaSmemLimit = 220 * 1024;  // dynamic shared memory (sm_90 allows 227 KB)

// The copy methods, host pools and record orders of the header, parsed once from their names.
enum class Method { kWarp, kTma, kCe, kMemcpy };
enum class PoolKind { kHostAlloc, kRegister, kRegisterSmall, kVmm, kHugetlb, kHugetlb1g };
enum class Order { kRandom, kAddress };
enum class Translations { kWarm, kCold, kTouched };
constexpr const char* kMethodNames[] = {"warp", "tma", "ce", "memcpy"};
constexpr const char* kPoolNames[] = {"hostalloc", "register", "register4k", "vmm", "hugetlb", "hugetlb1g"};
constexpr const char* kOrderNames[] = {"random", "address"};
constexpr const char* kTranslationNames[] = {"warm", "cold", "touched"};
const char* Name(Method m) { return kMethodNames[static_cast<int>(m)]; }
const char* Name(PoolKind k) { return kPoolNames[static_cast<int>(k)]; }
const char* Name(Order o) { return kOrderNames[static_cast<int>(o)]; }
const char* Name(Translations t) { return kTranslationNames[static_cast<int>(t)]; }

// Every word of a comma list as the E whose name it is (E's names are `names`, in order); false,
// with a message, at the first unknown one.
template <typename E, size_t N>
bool ParseNames(const std::string& list, const char* const (&names)[N], const char* what, std::vector<E>* out) {
  out->clear();
  for (const std::string& w : ParseWords(list.c_str())) {
    const auto it = std::find(std::begin(names), std::end(names), w);
    if (it == std::end(names)) {
      std::fprintf(stderr, "hisparse-bench gather: unknown %s '%s'\n", what, w.c_str());
      return false;
    }
    out->push_back(static_cast<E>(it - std::begin(names)));
  }
  return true;
}

struct Options {
  std::vector<int> record_bytes{656, 1152};
  std::vector<Order> orders{Order::kRandom, Order::kAddress};
  std::vector<Method> methods{Method::kWarp, Method::kTma, Method::kCe, Method::kMemcpy};
  std::vector<PoolKind> pools{PoolKind::kHostAlloc};
  std::vector<int> blocks{0};   // grid of the warp and tma kernels; 0: one block per SM
  std::vector<int> strides{0};  // bytes from one record's start to the next's in the pool; 0: packed
  int records = 16384;
  size_t span = size_t{160} << 20;
  std::vector<Translations> translations{Translations::kWarm};
  size_t translation_scrub = size_t{8} << 30;  // cold and touched: the pool whose reads evict translations
  size_t touch_page = size_t{64} << 10;        // touched: one read every touch_page bytes the records lie in
  int runs = 20;
  int tma_stages = 3;
  bool smoke = false;
};

void Usage() {
  std::fprintf(stderr,
               "usage: hisparse-bench gather [--record-bytes 656,1152] [--records 16384] [--span 160M]\n"
               "       [--order random,address] [--method warp,tma,ce,memcpy] [--runs 20] [--tma-stages 3]\n"
               "       [--pool hostalloc,register,register4k,vmm,hugetlb,hugetlb1g] [--blocks 0,66] [--stride 0,768]\n"
               "       [--translations warm,cold,touched] [--translation-scrub 8G] [--touch-page 64K] [--smoke]\n"
               "  --translations: the host pages' translations cached from the run before (warm), evicted\n"
               "  before each run (cold), or evicted and then read ahead (touched)\n"
               "  --stride: bytes from one record's start to the next's in the pool (0: packed, the\n"
               "  record's size)\n"
               "  --smoke: tiny sizes, every method (what ctest runs); exits 77 without a CUDA device,\n"
               "  1 when a check fails\n");
}

// RESOLVE's queue chunk: as many records as ~4 KB holds, 1..32 (ChunkRecords in resolve.cu).
int ChunkRecordsOf(int rb) { return std::clamp(kChunkUnits / (rb / 16), 1, kMaxChunkRecords); }

// What every copy kernel reads: record j's source (device address of its host record) and its
// destination byte offset in dst, in chunks of `per` records.
struct GatherDesc {
  const long long* src;
  const long long* dst_off;
  uint8_t* dst;
  int n;
  int per;
  int rb;
};

template <int UPR>
__global__ void __launch_bounds__(kThreads, 1) WarpGatherKernel(const GatherDesc d) {
  const int lane = threadIdx.x & 31;
  const int w = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int W = gridDim.x * kWarps;
  const int chunks = (d.n + d.per - 1) / d.per;
  for (int c = w; c < chunks; c += W) {
    const int start = c * d.per;
    const int cnt = min(d.per, d.n - start);
    long long so = 0, dof = 0;
    if (lane < cnt) {
      so = d.src[start + lane];
      dof = d.dst_off[start + lane];
    }
    internal::CopyChunk<UPR, 8>(d.dst, so, dof, cnt, d.rb / 16);
  }
}

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ bool MbarTryWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done)
               : "r"(bar), "r"(parity)
               : "memory");
  return done != 0;
}

// Lane 0 arms stage `s`'s mbarrier for cnt records, then lane r < cnt starts record r's bulk load.
__device__ __forceinline__ void TmaIssue(const GatherDesc& d, int start, int cnt, uint32_t stage, uint32_t bar) {
  const int lane = threadIdx.x & 31;
  if (lane == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(cnt * d.rb) : "memory");
  }
  __syncwarp();
  if (lane < cnt) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     stage + lane * d.rb),
                 "l"(d.src[start + lane]), "r"(d.rb), "r"(bar)
                 : "memory");
  }
}

__global__ void __launch_bounds__(kThreads, 1) TmaGatherKernel(const GatherDesc d, int stages, int stage_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) unsigned long long bars[kWarps * kMaxStages];
  const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
  const int w = blockIdx.x * kWarps + wib;
  const int W = gridDim.x * kWarps;
  const int chunks = (d.n + d.per - 1) / d.per;
  const int T = chunks > w ? (chunks - w + W - 1) / W : 0;  // this warp's chunks: w + t * W
  const uint32_t buf = SmemAddr(smem + static_cast<size_t>(wib) * stages * stage_bytes);
  const uint32_t bar0 = SmemAddr(&bars[wib * kMaxStages]);
  if (lane < stages) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar0 + lane * 8) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncwarp();
  auto chunk_start = [&](int t) { return (w + t * W) * d.per; };
  auto chunk_count = [&](int t) { return min(d.per, d.n - chunk_start(t)); };
  for (int t = 0; t < T && t < stages; ++t)
    TmaIssue(d, chunk_start(t), chunk_count(t), buf + t * stage_bytes, bar0 + t * 8);
  for (int t = 0; t < T; ++t) {
    const int s = t % stages;
    const uint32_t stage = buf + s * stage_bytes, bar = bar0 + s * 8;
    while (!MbarTryWait(bar, (t / stages) & 1)) {
    }
    const int start = chunk_start(t), cnt = chunk_count(t);
    if (lane < cnt) {
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(d.dst + d.dst_off[start + lane]),
                   "r"(stage + lane * d.rb), "r"(d.rb)
                   : "memory");
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
    if (t + stages < T) {
      asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // the stage is read out
      __syncwarp();
      TmaIssue(d, chunk_start(t + stages), chunk_count(t + stages), stage, bar);
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}

// The pattern every pool holds: the 8-byte word at byte offset o is PatternWord(o / 8).
__host__ __device__ inline uint64_t PatternWord(uint64_t i) { return (i + 1) * 0x9E3779B97F4A7C15ull; }

__global__ void FillPatternKernel(uint64_t* p, size_t words) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = PatternWord(i);
  }
}

// Driver entry points through the runtime (no link against libcuda).
template <typename F>
F DriverFn(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  BENCH_CUDA(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q));
  if (q != cudaDriverEntryPointSuccess || !fn) {
    std::fprintf(stderr, "hisparse-bench gather: driver entry point %s not found\n", name);
    std::exit(1);
  }
  return reinterpret_cast<F>(fn);
}

#define BENCH_CU(x)                                                                               \
  do {                                                                                            \
    const CUresult r_ = (x);                                                                      \
    if (r_ != CUDA_SUCCESS) {                                                                     \
      std::fprintf(stderr, "hisparse-bench gather: %s: CUresult %d\n", #x, static_cast<int>(r_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

// Anonymous huge pages of this process, MiB (/proc/self/smaps_rollup), or -1.
long AnonHugeMib() {
  std::ifstream f("/proc/self/smaps_rollup");
  std::string key;
  long kb = 0;
  while (f >> key) {
    if (key == "AnonHugePages:") {
      f >> kb;
      return kb / 1024;
    }
  }
  return -1;
}

// Pinned host memory the GPU reads at `dev`, of one --pool kind, filled with the pattern. Owns it.
class HostPool {
 public:
  HostPool(PoolKind kind, size_t bytes) : kind_(kind), bytes_(bytes) {
    if (kind == PoolKind::kHostAlloc) {
      BENCH_CUDA(cudaHostAlloc(&host_, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
      BENCH_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_), host_, 0));
    } else if (kind == PoolKind::kRegister || kind == PoolKind::kRegisterSmall) {
      constexpr size_t kHuge = size_t{2} << 20;
      map_bytes_ = bytes + kHuge;
      map_ = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (map_ == MAP_FAILED) {
        std::perror("hisparse-bench gather: mmap");
        std::exit(1);
      }
      host_ = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(map_) + kHuge - 1) / kHuge * kHuge);
      madvise(host_, bytes, kind == PoolKind::kRegister ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
      std::memset(host_, 0, bytes);
      BENCH_CUDA(cudaHostRegister(host_, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
      registered_ = true;
      BENCH_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_), host_, 0));
      anon_huge_mib_ = AnonHugeMib();
    } else if (kind == PoolKind::kHugetlb || kind == PoolKind::kHugetlb1g) {
      const bool gig = kind == PoolKind::kHugetlb1g;
      const size_t page = gig ? size_t{1} << 30 : size_t{2} << 20;
      bytes_ = map_bytes_ = (bytes + page - 1) / page * page;
      const int flags =
          MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | (gig ? (30 << MAP_HUGE_SHIFT) : (21 << MAP_HUGE_SHIFT));
      map_ = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, flags, -1, 0);
      if (map_ == MAP_FAILED) {
        map_ = nullptr;
        why_not_ = std::string("mmap(MAP_HUGETLB) of ") + std::to_string(map_bytes_ >> 20) +
                   " MiB failed: " + std::strerror(errno) + " (no huge pages of that size free?)";
        return;
      }
      host_ = map_;
      std::memset(host_, 0, bytes_);
      BENCH_CUDA(cudaHostRegister(host_, bytes_, cudaHostRegisterMapped | cudaHostRegisterPortable));
      registered_ = true;
      BENCH_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_), host_, 0));
    } else {  // vmm
      auto create = DriverFn<decltype(&::cuMemCreate)>("cuMemCreate");
      auto granularity = DriverFn<decltype(&::cuMemGetAllocationGranularity)>("cuMemGetAllocationGranularity");
      auto reserve = DriverFn<decltype(&::cuMemAddressReserve)>("cuMemAddressReserve");
      auto map = DriverFn<decltype(&::cuMemMap)>("cuMemMap");
      auto access = DriverFn<decltype(&::cuMemSetAccess)>("cuMemSetAccess");
      int dev = 0;
      BENCH_CUDA(cudaGetDevice(&dev));
      CUmemAllocationProp prop{};
      prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
      prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
      prop.location.id = 0;
      BENCH_CU(granularity(&granularity_, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
      bytes_ = (bytes + granularity_ - 1) / granularity_ * granularity_;
      BENCH_CU(create(&handle_, bytes_, &prop, 0));
      have_handle_ = true;
      BENCH_CU(reserve(&va_, bytes_, granularity_, 0, 0));
      BENCH_CU(map(va_, bytes_, 0, handle_, 0));
      mapped_ = true;
      CUmemAccessDesc acc[2]{};
      acc[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      acc[0].location.id = dev;
      acc[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      acc[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
      acc[1].location.id = 0;
      acc[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      BENCH_CU(access(va_, bytes_, acc, 2));
      dev_ = reinterpret_cast<uint8_t*>(va_);
    }
    FillPatternKernel<<<1024, 256>>>(reinterpret_cast<uint64_t*>(dev_), bytes_ / 8);
    BENCH_CUDA(cudaDeviceSynchronize());
  }
  ~HostPool() {
    if (kind_ == PoolKind::kHostAlloc) {
      cudaFreeHost(host_);
    } else if (kind_ != PoolKind::kVmm) {
      if (registered_) cudaHostUnregister(host_);
      if (map_ != nullptr) munmap(map_, map_bytes_);
    } else {
      cudaDeviceSynchronize();
      if (mapped_) DriverFn<decltype(&::cuMemUnmap)>("cuMemUnmap")(va_, bytes_);
      if (va_) DriverFn<decltype(&::cuMemAddressFree)>("cuMemAddressFree")(va_, bytes_);
      if (have_handle_) DriverFn<decltype(&::cuMemRelease)>("cuMemRelease")(handle_);
    }
  }
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // Empty when the pool was made; else why not (a huge-page pool where none are free).
  const std::string& why_not() const { return why_not_; }
  uint8_t* dev() const { return dev_; }
  size_t bytes() const { return bytes_; }
  size_t granularity() const { return granularity_; }
  long anon_huge_mib() const { return anon_huge_mib_; }

 private:
  PoolKind kind_;
  size_t bytes_;
  void* host_ = nullptr;
  uint8_t* dev_ = nullptr;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  bool registered_ = false;
  long anon_huge_mib_ = -1;
  CUmemGenericAllocationHandle handle_ = 0;
  bool have_handle_ = false, mapped_ = false;
  CUdeviceptr va_ = 0;
  size_t granularity_ = 0;
  std::string why_not_;
};

// The host side of one point: pool, records, buffers, and the methods' launches.
class GatherPoint {
 public:
  GatherPoint(HostPool& pool, const Options& o, int rb, int stride, bool address_order, uint64_t seed)
      : pool_(pool), rb_(rb), n_(o.records), per_(ChunkRecordsOf(rb)) {
    const size_t slots = pool.bytes() / stride;
    std::mt19937_64 rng(seed);
    std::vector<size_t> recs(slots);  // a partial shuffle picks n distinct records
    std::iota(recs.begin(), recs.end(), size_t{0});
    for (int j = 0; j < n_; ++j) std::swap(recs[j], recs[j + rng() % (slots - j)]);
    recs.resize(n_);
    if (address_order) std::sort(recs.begin(), recs.end());
    std::vector<int> perm(n_);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    src_.resize(n_);
    dst_off_.resize(n_);
    for (int j = 0; j < n_; ++j) {
      src_[j] = static_cast<long long>(recs[j] * stride);  // byte offset in the pool
      dst_off_[j] = static_cast<long long>(perm[j]) * rb;
    }
    std::vector<long long> src_dev(n_);
    for (int j = 0; j < n_; ++j) src_dev[j] = reinterpret_cast<long long>(pool.dev()) + src_[j];
    std::vector<long long> pages;  // every touch_page a record lies in, once
    const size_t tp = o.touch_page;
    for (int j = 0; j < n_; ++j) {
      for (size_t q = src_[j] / tp; q <= (src_[j] + rb - 1) / tp; ++q)
        pages.push_back(reinterpret_cast<long long>(pool.dev()) + static_cast<long long>(q * tp));
    }
    std::sort(pages.begin(), pages.end());
    pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
    pages_ = static_cast<long long>(pages.size());
    BENCH_CUDA(cudaMalloc(&d_pages_, pages.size() * sizeof(long long)));
    BENCH_CUDA(cudaMemcpy(d_pages_, pages.data(), pages.size() * sizeof(long long), cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMalloc(&d_src_, n_ * sizeof(long long)));
    BENCH_CUDA(cudaMalloc(&d_dst_off_, n_ * sizeof(long long)));
    BENCH_CUDA(cudaMalloc(&dst_, static_cast<size_t>(n_) * rb));
    BENCH_CUDA(cudaMemcpy(d_src_, src_dev.data(), n_ * sizeof(long long), cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(d_dst_off_, dst_off_.data(), n_ * sizeof(long long), cudaMemcpyHostToDevice));
    int dev = 0;
    BENCH_CUDA(cudaGetDevice(&dev));
    BENCH_CUDA(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, dev));
    for (int j = 0; j < n_; ++j) {
      ce_src_.push_back(pool.dev() + src_[j]);
      ce_dst_.push_back(dst_ + dst_off_[j]);
    }
    ce_sizes_.assign(n_, static_cast<size_t>(rb));
  }
  ~GatherPoint() {
    cudaFree(d_pages_);
    cudaFree(d_src_);
    cudaFree(d_dst_off_);
    cudaFree(dst_);
  }
  GatherPoint(const GatherPoint&) = delete;
  GatherPoint& operator=(const GatherPoint&) = delete;

  size_t Bytes() const { return static_cast<size_t>(n_) * rb_; }
  long long Pages() const { return pages_; }

  // One read at every page the records lie in (Translations::kTouched).
  void Touch(unsigned* sink, cudaStream_t st) const { LaunchReadEach(d_pages_, pages_, sink, sms_, st); }
  int Grid(int blocks) const { return blocks > 0 ? blocks : sms_; }
  int ChunkRecords() const { return per_; }

  // Why `method` cannot run here, or null.
  const char* Unsupported(Method method, const Options& o) const {
    if (method == Method::kTma) {
      int dev = 0, major = 0;
      BENCH_CUDA(cudaGetDevice(&dev));
      BENCH_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
      if (major < 9) return "tma: needs sm_90 or newer";
      if (TmaSmem(o.tma_stages) > kTmaSmemLimit) return "tma: stages of this record size exceed shared memory";
    }
    return nullptr;
  }

  // Enqueues one copy by `method` on `st`.
  // blocks: the warp and tma kernels' grid (0: one block per SM).
  void Launch(Method method, const Options& o, int blocks, cudaStream_t st) {
    const GatherDesc d{d_src_, d_dst_off_, dst_, n_, per_, rb_};
    const int grid = Grid(blocks);
    if (method == Method::kWarp) {
      internal::DispatchRecordBytes(static_cast<uint32_t>(rb_), [&](auto upr) {
        WarpGatherKernel<decltype(upr)::value><<<grid, kThreads, 0, st>>>(d);
      });
    } else if (method == Method::kTma) {
      const size_t smem = TmaSmem(o.tma_stages);
      BENCH_CUDA(cudaFuncSetAttribute(TmaGatherKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      TmaGatherKernel<<<grid, kThreads, smem, st>>>(d, o.tma_stages, StageBytes());
    } else if (method == Method::kCe) {
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      attr.srcLocHint.type = cudaMemLocationTypeHost;
      attr.dstLocHint.type = cudaMemLocationTypeDevice;
      size_t idx = 0;
      BENCH_CUDA(cudaMemcpyBatchAsync(reinterpret_cast<void* const*>(ce_dst_.data()),
                                      reinterpret_cast<const void* const*>(ce_src_.data()), ce_sizes_.data(), n_, &attr,
                                      &idx, 1, st));
    } else {  // memcpy: the same bytes from one contiguous run
      BENCH_CUDA(cudaMemcpyAsync(dst_, pool_.dev(), Bytes(), cudaMemcpyDefault, st));
    }
    BENCH_CUDA(cudaGetLastError());
  }

  // Copies once into a zeroed buffer and counts the records whose slot differs from the host.
  int Check(Method method, const Options& o, int blocks, cudaStream_t st) {
    BENCH_CUDA(cudaMemsetAsync(dst_, 0, Bytes(), st));
    Launch(method, o, blocks, st);
    BENCH_CUDA(cudaStreamSynchronize(st));
    std::vector<uint8_t> got(Bytes());
    BENCH_CUDA(cudaMemcpy(got.data(), dst_, got.size(), cudaMemcpyDeviceToHost));
    int bad = 0;
    std::vector<uint64_t> want(rb_ / 8);
    for (int j = 0; j < n_; ++j) {
      const bool run = method == Method::kMemcpy;  // record j of the contiguous run, at slot j
      const size_t from = run ? static_cast<size_t>(j) * rb_ : static_cast<size_t>(src_[j]);
      const size_t at = run ? static_cast<size_t>(j) * rb_ : static_cast<size_t>(dst_off_[j]);
      for (size_t w = 0; w < want.size(); ++w) want[w] = PatternWord(from / 8 + w);
      bad += std::memcmp(&got[at], want.data(), rb_) != 0;
    }
    return bad;
  }

 private:
  int StageBytes() const { return (per_ * rb_ + 127) / 128 * 128; }
  size_t TmaSmem(int stages) const { return static_cast<size_t>(kWarps) * stages * StageBytes(); }

  HostPool& pool_;
  int rb_, n_, per_;
  int sms_ = 0;
  std::vector<long long> src_, dst_off_;
  long long *d_src_ = nullptr, *d_dst_off_ = nullptr, *d_pages_ = nullptr;
  long long pages_ = 0;
  uint8_t* dst_ = nullptr;
  std::vector<void*> ce_dst_;
  std::vector<const void*> ce_src_;
  std::vector<size_t> ce_sizes_;
};

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

// One method's figures at one point: median and min over --runs, the host time of its enqueue,
// the median time of the touched variant's reads ahead, and the records the check found wrong.
struct Timing {
  double median_us = 0, min_us = 0, enqueue_us = 0, touch_us = 0;
  int bad = 0;
};

Timing TimeMethod(GatherPoint& pt, Method m, const Options& o, int blocks, Translations tr, L2Scrubber& scrub,
                  TranslationScrubber* tlb, cudaStream_t st) {
  Timing t;
  for (int w = 0; w < 2; ++w) {  // warm-up; the second one's host time sizes the spin
    const auto t0 = std::chrono::steady_clock::now();
    pt.Launch(m, o, blocks, st);
    t.enqueue_us = Since(t0);
    BENCH_CUDA(cudaStreamSynchronize(st));
  }
  const long long spin = SpinCycles(std::max(20.0, 2 * t.enqueue_us));
  cudaEvent_t a, b, c, d;  // a, b around the copy; c, d around the touch
  for (cudaEvent_t* e : {&a, &b, &c, &d}) BENCH_CUDA(cudaEventCreate(e));
  std::vector<float> us, touch_us;
  for (int r = 0; r < o.runs; ++r) {
    if (tr != Translations::kWarm) tlb->Scrub(st);
    if (tr == Translations::kTouched) {
      BENCH_CUDA(cudaEventRecord(c, st));
      pt.Touch(tlb->sink(), st);
      BENCH_CUDA(cudaEventRecord(d, st));
    }
    scrub.Scrub(r, st);  // L2 (in HBM): the touch's lines too; translations stay cached
    LaunchSpin(st, spin);
    BENCH_CUDA(cudaEventRecord(a, st));
    pt.Launch(m, o, blocks, st);
    BENCH_CUDA(cudaEventRecord(b, st));
    BENCH_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
    us.push_back(ms * 1000);
    if (tr == Translations::kTouched) {
      BENCH_CUDA(cudaEventElapsedTime(&ms, c, d));
      touch_us.push_back(ms * 1000);
    }
  }
  for (cudaEvent_t e : {a, b, c, d}) cudaEventDestroy(e);
  t.median_us = Median(us);
  if (!touch_us.empty()) t.touch_us = Median(touch_us);
  t.min_us = *std::min_element(us.begin(), us.end());
  t.bad = pt.Check(m, o, blocks, st);
  return t;
}

bool ParseOptions(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string name, value;
    if (!std::strcmp(argv[i], "--smoke")) {
      o->smoke = true;
      continue;
    }
    if (!TakeFlag(argc, argv, &i, &name, &value)) return false;
    if (name == "--record-bytes") {
      o->record_bytes = ParseList<int>(value.c_str());
    } else if (name == "--records") {
      o->records = std::atoi(value.c_str());
    } else if (name == "--span") {
      o->span = ParseBytes(value);
    } else if (name == "--order") {
      if (!ParseNames(value, kOrderNames, "order", &o->orders)) return false;
    } else if (name == "--method") {
      if (!ParseNames(value, kMethodNames, "method", &o->methods)) return false;
    } else if (name == "--blocks") {
      o->blocks = ParseList<int>(value.c_str());
    } else if (name == "--stride") {
      o->strides = ParseList<int>(value.c_str());
    } else if (name == "--pool") {
      if (!ParseNames(value, kPoolNames, "pool", &o->pools)) return false;
    } else if (name == "--translations") {
      if (!ParseNames(value, kTranslationNames, "translations", &o->translations)) return false;
    } else if (name == "--translation-scrub") {
      o->translation_scrub = ParseBytes(value);
    } else if (name == "--touch-page") {
      o->touch_page = ParseBytes(value);
    } else if (name == "--runs") {
      o->runs = std::atoi(value.c_str());
    } else if (name == "--tma-stages") {
      o->tma_stages = std::atoi(value.c_str());
    } else {
      std::fprintf(stderr, "hisparse-bench gather: unknown argument '%s'\n", name.c_str());
      return false;
    }
  }
  if (o->smoke) {
    o->records = 300;
    o->span = size_t{4} << 20;
    o->runs = 2;
    o->record_bytes = {656, 1152, 4112};
    o->pools = {PoolKind::kHostAlloc, PoolKind::kRegister, PoolKind::kRegisterSmall, PoolKind::kVmm,
                PoolKind::kHugetlb};  // hugetlb: skipped, with the reason, where none are reserved
    o->blocks = {0, 3};
    o->strides = {0, 768};  // packed, and every 656-B record on a line's start (the larger ones skip it)
    o->translations = {Translations::kWarm, Translations::kCold, Translations::kTouched};
    o->translation_scrub = size_t{16} << 20;
  }
  for (const int rb : o->record_bytes) {
    if (rb < 16 || rb > 16384 || rb % 16 != 0) {
      std::fprintf(stderr, "hisparse-bench gather: record size %d is not a multiple of 16 in [16, 16384]\n", rb);
      return false;
    }
    for (const int stride : o->strides) {
      const int step = std::max(stride, rb);  // a stride below a record's size skips that size
      if (stride < 0 || stride % 16 != 0) {
        std::fprintf(stderr, "hisparse-bench gather: --stride %d is not a multiple of 16\n", stride);
        return false;
      }
      if (o->span / step < static_cast<size_t>(o->records)) {
        std::fprintf(stderr, "hisparse-bench gather: --span holds fewer than --records records every %d B\n", step);
        return false;
      }
    }
  }
  for (const int b : o->blocks) {
    if (b < 0) return false;
  }
  return o->records > 0 && o->runs > 0 && !o->blocks.empty() && !o->translations.empty() &&
         o->translation_scrub >= (size_t{1} << 20) && o->touch_page >= 16 && o->touch_page % 16 == 0 &&
         o->tma_stages >= 1 && o->tma_stages <= kMaxStages && !o->record_bytes.empty() && !o->methods.empty() &&
         !o->orders.empty() && !o->pools.empty() && !o->strides.empty();
}

// Times every method and grid of o on one point (records of rb bytes every `step` in the pool, in
// `order`) and prints a line each; returns how many failed their check.
int RunPoint(HostPool& pool, PoolKind kind, const Options& o, int rb, int step, Order order, double link,
             L2Scrubber& scrub, TranslationScrubber* tlb, cudaStream_t st) {
  GatherPoint pt(pool, o, rb, step, order == Order::kAddress, 7 + rb);
  int failed = 0;
  for (const Method m : o.methods) {
    if (const char* why = pt.Unsupported(m, o)) {
      std::printf("{\"kind\":\"gather\",\"pool\":\"%s\",\"method\":\"%s\",\"record_bytes\":%d,\"skipped\":\"%s\"}\n",
                  Name(kind), Name(m), rb, why);
      continue;
    }
    for (const int blocks : o.blocks) {
      const bool grid = m == Method::kWarp || m == Method::kTma;
      if (!grid && blocks != o.blocks.front()) continue;  // ce and memcpy have no grid
      for (const Translations tr : o.translations) {
        const Timing t = TimeMethod(pt, m, o, blocks, tr, scrub, tlb, st);
        failed += t.bad != 0;
        const double gbps = pt.Bytes() / (t.median_us * 1e-6) / 1e9;
        std::printf(
            "{\"kind\":\"gather\",\"pool\":\"%s\",\"method\":\"%s\",\"blocks\":%d,\"record_bytes\":%d,\"stride\":%d,"
            "\"records\":%d,\"span_mib\":%.0f,\"order\":\"%s\",\"translations\":\"%s\",\"touch_page\":%zu,\"touches\":%"
            "lld,"
            "\"chunk_records\":%d,\"median_us\":%.2f,\"min_us\":%.2f,\"gbps\":%.2f,\"link_fraction\":%.3f,"
            "\"touch_us\":%.2f,\"enqueue_us\":%.1f,\"check\":\"%s\",\"bad_records\":%d}\n",
            Name(kind), Name(m), grid ? pt.Grid(blocks) : 0, rb, step, o.records, pool.bytes() / 1048576.0, Name(order),
            Name(tr), o.touch_page, pt.Pages(), pt.ChunkRecords(), t.median_us, t.min_us, gbps, gbps / link, t.touch_us,
            t.enqueue_us, t.bad ? "FAILED" : "ok", t.bad);
        std::fflush(stdout);
      }
    }
  }
  return failed;
}

}  // namespace

int GatherMain(int argc, char** argv) {
  Options o;
  if (!ParseOptions(argc, argv, &o)) {
    Usage();
    return 2;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "hisparse-bench gather: no CUDA device: skipped\n");
    return 77;
  }
  const double link = PrintLinkLine();
  L2Scrubber scrub;
  const bool evict = std::any_of(o.translations.begin(), o.translations.end(),
                                 [](Translations t) { return t != Translations::kWarm; });
  std::unique_ptr<TranslationScrubber> tlb =
      evict ? std::make_unique<TranslationScrubber>(o.translation_scrub) : nullptr;
  cudaStream_t st;
  BENCH_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int failed = 0;
  for (const PoolKind kind : o.pools) {
    const auto t0 = std::chrono::steady_clock::now();
    HostPool pool(kind, o.span);
    if (!pool.why_not().empty()) {
      std::printf("{\"kind\":\"pool\",\"pool\":\"%s\",\"skipped\":\"%s\"}\n", Name(kind), pool.why_not().c_str());
      continue;
    }
    std::printf(
        "{\"kind\":\"pool\",\"pool\":\"%s\",\"bytes\":%zu,\"setup_s\":%.2f,\"granularity\":%zu,\"anon_huge_mib\":%ld}"
        "\n",
        Name(kind), pool.bytes(), Since(t0) / 1e6, pool.granularity(), pool.anon_huge_mib());
    for (const int rb : o.record_bytes) {
      for (const int stride : o.strides) {
        if (stride != 0 && stride < rb) continue;  // this stride cannot hold this record
        for (const Order order : o.orders)
          failed += RunPoint(pool, kind, o, rb, stride ? stride : rb, order, link, scrub, tlb.get(), st);
      }
    }
  }
  cudaStreamDestroy(st);
  return failed ? 1 : 0;
}

}  // namespace hisparse::bench
