// hisparse-bench resolve: sweeps the CUDA RESOLVE kernel over batch, B, record size, miss rate,
// miss pattern and host layout and prints one JSON object per line: first the link's bulk H2D
// bandwidth, then one per point. With --draft-tokens it runs the multi-query benchmark instead
// (resolve_draft_cmd.cc).
//
// State of every point (as in the issue): each request's slots hold positions 0..B-1, LRU in slot
// order; the selection is the first round((1 - miss) * k) resident positions followed by the
// misses: consecutive (B, B+1, ..., seq_len = B + k + 1 unless --context) or scattered (distinct
// random positions of [B, seq_len - 1), seq_len = --context, 131072 by default; the same positions
// for every layout). The host pool is one cudaHostAlloc(mapped) block (--pool, else twice what
// the largest point needs); the rows' records lie in it contiguous (one run per row, back to back)
// or paged (pages of --page-size scattered at random over the whole pool), or slabs (each row's
// pages inside its own slabs of --slab-size, in random order; host_tables.h), and
// every layout of a point reads the same pool in the same process: same link, same misses.
// After the timed runs one more launch is checked: the output slot of every miss of a sample of
// rows must hold the host record of its position, byte for byte ("check").
//
// Timing: per run, the pre-call slot tables are restored from a pristine copy (device to device),
// L2 is scrubbed with a 128 MiB memset (so tables come from HBM, as in serving), a ~20 us GPU
// spin kernel runs so that the host launch overhead is hidden as in a CUDA graph, then CUDA events
// bracket the one RESOLVE launch. With --translations cold, each run first evicts the GPU's
// cached translations of host memory (TranslationScrubber: reads over a second pinned pool of
// --translation-scrub bytes), as a serving RESOLVE, which reads another layer's pages each launch,
// finds them; warm (the default, and every figure before 2026-12-06) re-reads the pages the run
// before translated (bench/RESULTS.md, "Scattered reads go cold"). Median and min over --runs;
// the no-IO variant (flag NoFetch:
// same planning, no bytes moved) is timed the same way, and so is an empty kernel of RESOLVE's
// launch shape (LaunchResolveShapeOnly: same grid, block and shared memory), the launch floor
// that no planning goes below ("launch_floor_us"), and the no-IO step's memory traffic with that
// shape and no planning (LaunchResolveMemoryFloor: the row, its selections and both tables read,
// the LRU order and k ints a row written), the floor under any one-launch plan of these tables
// ("memory_floor_us"). --fetch-order runs every point once per
// order of the miss copies (ResolveLaunchConfig::address_order; address, the default, or
// selection), each launch with the figures PrepareResolveLaunch asked for once per point.
//
// --producer: what RESOLVE adds to a stream behind the kernel before it. In serving that kernel
// (the indexer's top-k) writes the selections; here LaunchProducer copies them into the positions
// buffer, which every run first fills with padding. The events bracket the producer and RESOLVE;
// the line reports each median less the producer's alone ("*_after_us"), with RESOLVE launched
// plainly and as a programmatic dependent (ResolveLaunchConfig::order = LaunchOrder::kProgrammatic), no-IO and
// full, and the producer letting dependents launch as its blocks exit or at its start.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench_cmd.h"
#include "bench_kernels.h"  // kernels/: the launch and memory floors
#include "cuda_bench_util.h"
#include "hisparse/kernels/prewarm_cuda.h"
#include "hisparse/kernels/resolve_cuda.h"
#include "host_tables.h"

namespace hisparse::bench {
namespace {

enum class Pattern { kConsecutive, kScattered };
// When the kernel before RESOLVE lets its programmatic dependents launch (LaunchProducer).
enum class ProducerStart { kAtExit, kEarly };

struct Options {
  std::vector<int> batch{1, 10, 64, 100, 128};
  std::vector<int> slots{4096, 8192};
  std::vector<int> record_bytes{512, 656, 1152};
  std::vector<double> miss{0, 0.001, 0.05, 0.2, 1.0};
  std::vector<HostLayout> layouts{HostLayout::kContiguous};
  std::vector<Pattern> patterns{Pattern::kConsecutive};
  std::vector<size_t> page_sizes{size_t{2} << 20};  // paged, slabs: one variant per page size
  size_t slab_bytes = size_t{64} << 20;             // slabs: the daemon's default host_pool.slab_size
  size_t pool_bytes = 0;                            // 0: twice what the largest point needs
  int context = 0;                                  // 0: B + k + 1 (consecutive), 131072 (scattered)
  int k = 2048;
  int runs = 200;
  bool scrub_l2 = true;
  bool cold_translations = false;              // --translations cold
  size_t translation_scrub = size_t{8} << 30;  // the pool whose reads evict them
  // --prewarm (cold only): per value R, RESOLVE again after one read in each of R of the launch's
  // distinct translation pages (translation_page bytes of host address space, what the GPU caches
  // one entry for), then prewarm_extra pages of its rows per needed page that no miss reads (a
  // predictor's false positives), then prewarm_gap pages of the pool no miss reads (another launch's
  // translations in between).
  std::vector<double> prewarm;
  double prewarm_extra = 0;
  double prewarm_gap = 0;
  size_t translation_page = size_t{64} << 10;
  // --prewarm-call (cold only): per value, the library's PREWARM (hs_prewarm's kernel) of every row's
  // layer on that many thread blocks (0: its default), timed alone and then before RESOLVE.
  std::vector<int> prewarm_call;
  bool smoke = false;
  std::vector<bool> address_order{true};  // ResolveLaunchConfig::address_order per point
  std::vector<int> max_blocks{0};         // ResolveLaunchConfig::max_blocks per point (0: no budget)
  std::vector<int> consumer_blocks{0};    // ResolveLaunchConfig::consumer_blocks per point (0: every block)
  std::vector<int> consumer_warps{0};     // ResolveLaunchConfig::consumer_warps per point (0: the default)
  std::vector<ProducerStart> producers;   // --producer: also time RESOLVE behind a producer
};

void Usage() {
  std::fprintf(stderr,
               "usage: hisparse-bench resolve [--batch 1,10,64,100,128] [--slots 4096,8192]\n"
               "       [--record-bytes 512,656,1152] [--miss 0,0.001,0.05,0.2,1] [--k 2048]\n"
               "       [--runs 200] [--warm-l2] [--host-layout contiguous,paged,slabs] [--page-size 2M,16M,64M]\n"
               "       [--slab-size 64M] [--pool 64G] [--pattern consecutive,scattered] [--context 131072]\n"
               "       [--fetch-order address,selection] [--max-blocks 0,16,32] [--consumer-blocks 0,16,32]\n"
               "       [--consumer-warps 0,2,4,16] [--producer exit,early] [--translations warm]\n"
               "       [--translation-scrub 8G] [--prewarm 0,0.5,1] [--prewarm-extra 0] [--prewarm-gap 0]\n"
               "       [--translation-page 64K] [--prewarm-call 0,16] [--smoke]\n"
               "  --translations: warm (the host pages' translations cached by the run before) or cold\n"
               "  (evicted before each run, as a serving RESOLVE finds them)\n"
               "  --prewarm: with cold translations, per fraction R also time RESOLVE after one read in R of\n"
               "  the distinct --translation-page pages its misses lie in (translations made ahead, as an\n"
               "  engine could make them while the GPU translates nothing else), plus --prewarm-extra pages\n"
               "  of its rows that no miss needs per needed page (a prediction's misses), then --prewarm-gap of\n"
               "  the pool's (another launch's translations between them and RESOLVE); one line of kind\n"
               "  resolve_prewarm each\n"
               "  --prewarm-call: with cold translations, per count of thread blocks (0: its default) time\n"
               "  the library's PREWARM of the batch rows' layer (one read per --translation-page of their\n"
               "  records, no prediction) alone, then RESOLVE after it; one line of kind resolve_prewarm_call each\n"
               "  --max-blocks: per point, the launch's budget of thread blocks (0: the GPU's capacity),\n"
               "  what an engine that hides RESOLVE beside its own kernels gives it\n"
               "  --consumer-blocks: per point, the blocks whose consumer warps take queued chunks (0: all)\n"
               "  --consumer-warps: per point, the warps of each such block that take them (1-16; 0: two,\n"
               "  or under a budget as many as give the grid the whole GPU's count)\n"
               "  --producer: per point, also RESOLVE behind the kernel that writes its selections,\n"
               "  launched plainly and as its programmatic dependent; the producer lets dependents\n"
               "  launch as its blocks exit, or early (one JSON line of kind resolve_after_producer each)\n"
               "  --smoke: a few tiny points of every layout and pattern (what ctest runs); exits 77\n"
               "  without a CUDA device, 1 when a check fails\n");
}

// What a point's launch is tuned with: ResolveLaunchConfig's tuning fields.
struct LaunchVariant {
  bool ordered;         // address_order
  int max_blocks;       // the budget of blocks
  int consumer_blocks;  // the blocks that take queued chunks
  int consumer_warps;   // the warps of each of those that take them
};

// Every (fetch order, block budget, consumer blocks, consumer warps) a point runs with.
std::vector<LaunchVariant> LaunchVariants(const Options& o) {
  std::vector<LaunchVariant> out;
  for (const bool ordered : o.address_order) {
    for (const int blocks : o.max_blocks) {
      for (const int consumers : o.consumer_blocks) {
        for (const int warps : o.consumer_warps) out.push_back({ordered, blocks, consumers, warps});
      }
    }
  }
  return out;
}

int SeqLen(const Options& o, Pattern p, int B) {
  if (o.context > 0) return o.context;
  return p == Pattern::kConsecutive ? B + o.k + 1 : 131072;
}

// The selections of every row: `hits` resident positions 0.. then the misses (see the top).
std::vector<int32_t> Selections(Pattern p, int batch, int k, int hits, int B, int seq, uint32_t seed) {
  std::vector<int32_t> pos(static_cast<size_t>(batch) * k);
  std::mt19937_64 rng(seed);
  for (int r = 0; r < batch; ++r) {
    int32_t* row = &pos[static_cast<size_t>(r) * k];
    for (int j = 0; j < hits; ++j) row[j] = j;
    if (p == Pattern::kConsecutive) {
      for (int j = hits; j < k; ++j) row[j] = B + (j - hits);
      continue;
    }
    std::vector<char> taken(seq, 0);
    std::uniform_int_distribution<int32_t> any(B, seq - 2);  // never the newest token (slot B)
    for (int j = hits; j < k;) {
      const int32_t x = any(rng);
      if (!taken[x]) taken[x] = 1, row[j++] = x;
    }
  }
  return pos;
}

// One more real launch from the pristine tables, then the output slot of every miss (selections
// hits..k-1 of a row) of a sample of rows against the host record of its position. Hits are not
// checked: the bench sets up the slot tables alone, so a resident slot's bytes are whatever the
// arena held (RESOLVE never moves a hit's record; the GPU tests hold hits to the reference).
// Returns the mismatching selections.
int CheckRecords(const ResolveDesc& d, const ResolveLaunchConfig& config, void* ws, size_t ws_bytes, void* saved,
                 size_t table_span, const std::vector<int32_t>& pos, int hits, const HostTables& t,
                 const uint8_t* pool_host, cudaStream_t st) {
  const ArenaView& a = d.arena;
  const int k = a.geometry.k, B = a.geometry.slots, batch = d.max_batch;
  const uint32_t rb = a.geometry.record_bytes;
  ResolveDesc x = d;
  x.flags = 0;
  BENCH_CUDA(cudaMemcpyAsync(a.slot_pos, saved, table_span, cudaMemcpyDeviceToDevice, st));
  BENCH_CUDA(LaunchResolve(x, ws, ws_bytes, config, st));
  BENCH_CUDA(cudaStreamSynchronize(st));
  std::vector<int32_t> out(static_cast<size_t>(batch) * k);
  BENCH_CUDA(cudaMemcpy(out.data(), d.out_slots, out.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<uint8_t> rec(static_cast<size_t>(a.geometry.RecordSlots()) * rb);
  int bad = 0;
  std::vector<int> sample;  // about 8 rows, the last one included
  for (int r = 0; r < batch; r += std::max(1, batch / 8)) sample.push_back(r);
  if (sample.back() != batch - 1) sample.push_back(batch - 1);
  for (int r : sample) {
    BENCH_CUDA(cudaMemcpy(rec.data(), a.Record(r, 0, 0), rec.size(), cudaMemcpyDeviceToHost));
    for (int j = hits; j < k; ++j) {
      const int s = out[static_cast<size_t>(r) * k + j];
      const int p = pos[static_cast<size_t>(r) * k + j];
      if (s < 0 || s > B || std::memcmp(&rec[static_cast<size_t>(s) * rb], pool_host + t.Offset(r, p, rb), rb) != 0) {
        ++bad;
      }
    }
  }
  return bad;
}

// How every timed launch runs: per run the pre-call slot tables are restored, `prepare` runs, L2
// is scrubbed (unless warm), the spin hides the host's launch overhead, and events bracket
// `launch`. Median and min in us over `runs` runs after 5 warm-ups.
struct Timer {
  cudaStream_t st;
  cudaEvent_t ev0, ev1;
  L2Scrubber* scrub;         // null: warm L2
  TranslationScrubber* tlb;  // null: warm translations of host memory
  long long spin;
  int runs;
  void* tables;  // the arena's tables, restored from `saved` before every run
  const void* saved;
  size_t table_span;
  std::function<void()> touch;  // after the scrubs, before the spin (--prewarm); may be empty

  struct Times {
    double median, min;
  };
  template <class Prepare, class Launch>
  Times Time(Prepare prepare, Launch launch) const {
    std::vector<float> times;
    times.reserve(runs);
    for (int run = 0; run < runs + 5; ++run) {
      BENCH_CUDA(cudaMemcpyAsync(tables, saved, table_span, cudaMemcpyDeviceToDevice, st));
      prepare();
      if (tlb) tlb->Scrub(st);
      if (scrub) scrub->Scrub(run, st);
      if (touch) touch();
      LaunchSpin(st, spin);
      BENCH_CUDA(cudaEventRecord(ev0, st));
      launch();
      BENCH_CUDA(cudaEventRecord(ev1, st));
      BENCH_CUDA(cudaEventSynchronize(ev1));
      float ms = 0;
      BENCH_CUDA(cudaEventElapsedTime(&ms, ev0, ev1));
      if (run >= 5) times.push_back(ms * 1000.0f);
    }
    return {Median(times), *std::min_element(times.begin(), times.end())};
  }
};

// A device copy of a host vector (--prewarm's addresses, the producer's selections, a digest).
// Owns it.
template <class T>
struct DeviceCopy {
  explicit DeviceCopy(const std::vector<T>& v) : n(static_cast<long long>(v.size())) {
    if (v.empty()) return;
    BENCH_CUDA(cudaMalloc(&p, v.size() * sizeof(T)));
    BENCH_CUDA(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceCopy() { cudaFree(p); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  T* p = nullptr;
  long long n;
};

// RESOLVE behind the kernel that writes its selections (LaunchProducer copies them from `src`
// into d.positions, which every run first fills with padding, so a launch that read them too
// early would plan no misses and fail the bench's miss count). Medians, us: the producer alone,
// then producer + RESOLVE no-IO / full, each launched plainly and as a programmatic dependent.
// Every RESOLVE launch counts its misses (4 * (runs + 5) launches).
struct BehindProducer {
  double producer, noio, noio_programmatic, full, full_programmatic;
};
BehindProducer TimeBehindProducer(const Timer& timer, ResolveDesc d, ResolveLaunchConfig config, const int32_t* src,
                                  ProducerStart start, void* ws, size_t ws_bytes) {
  const int batch = d.max_batch, k = d.arena.geometry.k;
  int32_t* positions = const_cast<int32_t*>(d.positions);
  const size_t bytes = static_cast<size_t>(batch) * k * sizeof(int32_t);
  auto pad = [&] { BENCH_CUDA(cudaMemsetAsync(positions, 0xff, bytes, timer.st)); };
  auto producer = [&] { LaunchProducer(positions, src, batch, k, start == ProducerStart::kEarly, timer.st); };
  auto behind = [&](bool no_fetch, bool programmatic) {
    d.flags = no_fetch ? static_cast<uint32_t>(kResolveFlagNoFetch) : 0u;
    config.order = programmatic ? LaunchOrder::kProgrammatic : LaunchOrder::kAfterCompletion;
    return timer
        .Time(pad,
              [&] {
                producer();
                BENCH_CUDA(LaunchResolve(d, ws, ws_bytes, config, timer.st));
              })
        .median;
  };
  BehindProducer b{};
  b.producer = timer.Time(pad, producer).median;
  b.noio = behind(true, false);
  b.noio_programmatic = behind(true, true);
  b.full = behind(false, false);
  b.full_programmatic = behind(false, true);
  return b;
}

}  // namespace

int ResolveMain(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {  // the multi-query mode has its own points and output
    if (std::strncmp(argv[i], "--draft-tokens", 14) == 0) return ResolveDraftMain(argc, argv);
  }
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        Usage();
        std::exit(2);
      }
      return argv[++i];
    };
    bool ok = true;
    if (a == "--batch") {
      o.batch = ParseList<int>(next());
    } else if (a == "--slots") {
      o.slots = ParseList<int>(next());
    } else if (a == "--record-bytes") {
      o.record_bytes = ParseList<int>(next());
    } else if (a == "--miss") {
      o.miss = ParseList<double>(next());
    } else if (a == "--k") {
      o.k = std::atoi(next());
    } else if (a == "--runs") {
      o.runs = std::atoi(next());
    } else if (a == "--warm-l2") {
      o.scrub_l2 = false;
    } else if (a == "--translations") {
      const std::string w = next();
      ok = w == "warm" || w == "cold";
      o.cold_translations = w == "cold";
    } else if (a == "--prewarm") {
      o.prewarm = ParseList<double>(next());
      ok = std::all_of(o.prewarm.begin(), o.prewarm.end(), [](double r) { return r >= 0 && r <= 1; });
    } else if (a == "--prewarm-call") {
      o.prewarm_call = ParseList<int>(next());
      ok = std::all_of(o.prewarm_call.begin(), o.prewarm_call.end(), [](int b) { return b >= 0; });
    } else if (a == "--prewarm-extra") {
      ok = (o.prewarm_extra = std::atof(next())) >= 0;
    } else if (a == "--prewarm-gap") {
      ok = (o.prewarm_gap = std::atof(next())) >= 0;
    } else if (a == "--translation-page") {
      const size_t tp = ParseBytes(next());
      ok = tp >= 16 && (tp & (tp - 1)) == 0;
      o.translation_page = tp;
    } else if (a == "--translation-scrub") {
      ok = (o.translation_scrub = ParseBytes(next())) >= (size_t{1} << 20);
    } else if (a == "--host-layout") {
      o.layouts.clear();
      for (const std::string& w : ParseWords(next())) {
        HostLayout l;
        ok = ok && ParseHostLayout(w, &l);
        o.layouts.push_back(l);
      }
    } else if (a == "--pattern") {
      o.patterns.clear();
      for (const std::string& w : ParseWords(next())) {
        ok = ok && (w == "consecutive" || w == "scattered");
        o.patterns.push_back(w == "scattered" ? Pattern::kScattered : Pattern::kConsecutive);
      }
    } else if (a == "--fetch-order") {
      o.address_order.clear();
      for (const std::string& w : ParseWords(next())) {
        ok = ok && (w == "address" || w == "selection");
        o.address_order.push_back(w == "address");
      }
    } else if (a == "--max-blocks" || a == "--consumer-blocks" || a == "--consumer-warps") {
      std::vector<int>& list = a == "--max-blocks"        ? o.max_blocks
                               : a == "--consumer-blocks" ? o.consumer_blocks
                                                          : o.consumer_warps;
      list.clear();
      for (const std::string& w : ParseWords(next())) {
        const int n = std::atoi(w.c_str());
        ok = ok && n >= 0 && std::to_string(n) == w && (a != "--consumer-warps" || n <= 16);
        list.push_back(n);
      }
    } else if (a == "--producer") {
      o.producers.clear();
      for (const std::string& w : ParseWords(next())) {
        ok = ok && (w == "exit" || w == "early");
        o.producers.push_back(w == "early" ? ProducerStart::kEarly : ProducerStart::kAtExit);
      }
    } else if (a == "--page-size") {
      o.page_sizes.clear();
      for (const std::string& w : ParseWords(next())) {
        o.page_sizes.push_back(ParseBytes(w));
        ok = ok && o.page_sizes.back() > 0;
      }
    } else if (a == "--slab-size") {
      ok = (o.slab_bytes = ParseBytes(next())) > 0;
    } else if (a == "--pool") {
      ok = (o.pool_bytes = ParseBytes(next())) > 0;
    } else if (a == "--context") {
      ok = (o.context = std::atoi(next())) > 0;
    } else if (a == "--smoke") {
      o.smoke = true;
    } else if (a == "-h" || a == "--help") {
      Usage();
      return 0;
    } else {
      std::fprintf(stderr, "hisparse-bench resolve: unknown argument '%s'\n", a.c_str());
      Usage();
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "hisparse-bench resolve: bad value for %s\n", a.c_str());
      Usage();
      return 2;
    }
  }
  if (o.smoke) {  // every layout and pattern, tiny: pages of 5 or 64 records in a 16 MiB pool
    o.batch = {1, 3};
    o.slots = {64};
    o.record_bytes = {656};
    o.miss = {0.2, 1.0};
    o.k = 16;
    o.runs = 3;
    o.layouts = {HostLayout::kContiguous, HostLayout::kPaged, HostLayout::kSlabs};
    o.slab_bytes = 2 * 320 * 656;  // a whole number of either page
    o.patterns = {Pattern::kConsecutive, Pattern::kScattered};
    o.page_sizes = {5 * 656, 64 * 656};
    o.pool_bytes = size_t{16} << 20;
    o.context = 4096;
    o.producers = {ProducerStart::kAtExit, ProducerStart::kEarly};
    o.max_blocks = {0, 1};       // one block: the planner walks every row and fetches alone
    o.consumer_blocks = {0, 1};  // one consumer block: one block's two warps take every queued chunk
    o.consumer_warps = {0, 16};  // every warp of each block consumes
    o.cold_translations = true;  // the scrubber's path; the warm one is the plain launch
    o.translation_scrub = size_t{16} << 20;
    o.prewarm = {0.5};
    o.prewarm_extra = 0.5;
    o.prewarm_gap = 1;
    o.prewarm_call = {0, 1};
    o.translation_page = 4096;  // the smoke's rows are a few pages of 64 KiB
  }
  if ((!o.prewarm.empty() || !o.prewarm_call.empty()) && !o.cold_translations) {
    std::fprintf(stderr, "hisparse-bench resolve: --prewarm and --prewarm-call need --translations cold\n");
    return 2;
  }
  if (o.batch.empty() || o.slots.empty() || o.record_bytes.empty() || o.miss.empty() || o.layouts.empty() ||
      o.patterns.empty() || o.page_sizes.empty() || o.address_order.empty() || o.max_blocks.empty() ||
      o.consumer_blocks.empty() || o.consumer_warps.empty() || o.k < 1 || o.runs < 1) {
    Usage();
    return 2;
  }
  // Every (layout, page size) a point runs over: contiguous once, paged once per page size.
  struct HostVariant {
    HostLayout layout;
    size_t page_bytes;
  };
  std::vector<HostVariant> variants;
  for (HostLayout l : o.layouts) {
    if (l == HostLayout::kContiguous) variants.push_back({l, 0});
    for (size_t pb : o.page_sizes) {
      if (l != HostLayout::kContiguous) variants.push_back({l, pb});
    }
  }
  int dev = 0, count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "hisparse-bench resolve: no CUDA device: skipped\n");
    return 77;
  }
  BENCH_CUDA(cudaGetDevice(&dev));
  int clock_khz = 0;
  BENCH_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev));
  int sms = 0;  // --prewarm's reads: one block a SM
  BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));

  const double link = PrintLinkLine();

  const int max_batch_all = *std::max_element(o.batch.begin(), o.batch.end());
  const int max_slots_all = *std::max_element(o.slots.begin(), o.slots.end());
  const int max_rb_all = *std::max_element(o.record_bytes.begin(), o.record_bytes.end());
  const int k = o.k;
  // Host pool: sized for the largest point (twice, so pages have room to scatter), reused by all.
  size_t pool_bytes = o.pool_bytes;
  if (pool_bytes == 0) {
    for (Pattern p : o.patterns) {
      for (const HostVariant& v : variants) {
        const size_t need = HostTablesBytes(v.layout, {v.page_bytes, o.slab_bytes}, max_batch_all,
                                            SeqLen(o, p, max_slots_all), max_rb_all);
        pool_bytes = std::max(pool_bytes, 2 * need);
      }
    }
  }
  MappedPool pool(pool_bytes);

  L2Scrubber scrub;
  std::unique_ptr<TranslationScrubber> tlb =
      o.cold_translations ? std::make_unique<TranslationScrubber>(o.translation_scrub) : nullptr;
  cudaStream_t st;
  BENCH_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t ev0, ev1;
  BENCH_CUDA(cudaEventCreate(&ev0));
  BENCH_CUDA(cudaEventCreate(&ev1));
  const long long spin = static_cast<long long>(clock_khz) * 20 / 1000;  // ~20 us
  int failed = 0;

  for (int B : o.slots) {
    for (int rb : o.record_bytes) {
      for (int batch : o.batch) {
        const ArenaGeometry g{batch, 1, B, k, static_cast<uint32_t>(rb)};
        if (const char* why = ValidateArenaGeometry(g)) {
          std::fprintf(stderr, "skipping B=%d rb=%d: %s\n", B, rb, why);
          continue;
        }
        const ArenaOffsets off = ComputeArenaOffsets(g);
        void* arena = nullptr;
        BENCH_CUDA(cudaMalloc(&arena, off.total_bytes));
        BENCH_CUDA(cudaMemset(arena, 0, off.total_bytes));
        const ArenaView view = ArenaView::Of(arena, g);
        // Tables: positions 0..B-1 in slot order, LRU in slot order; kept pristine in `saved`.
        std::vector<int32_t> tab(static_cast<size_t>(batch) * B);
        for (size_t i = 0; i < tab.size(); ++i) tab[i] = static_cast<int32_t>(i % B);
        BENCH_CUDA(cudaMemcpy(view.slot_pos, tab.data(), tab.size() * 4, cudaMemcpyHostToDevice));
        BENCH_CUDA(cudaMemcpy(view.lru, tab.data(), tab.size() * 4, cudaMemcpyHostToDevice));
        const size_t table_span = off.records - off.slot_pos;
        void* saved = nullptr;
        BENCH_CUDA(cudaMalloc(&saved, table_span));
        BENCH_CUDA(cudaMemcpy(saved, view.slot_pos, table_span, cudaMemcpyDeviceToDevice));

        for (Pattern pattern : o.patterns) {
          const int seq = SeqLen(o, pattern, B);
          if (seq < B + k + 1) {
            std::fprintf(stderr, "skipping B=%d: --context %d < B + k + 1\n", B, seq);
            continue;
          }
          for (const HostVariant& v : variants) {
            const HostLayout layout = v.layout;
            HostTables t;
            std::string why;
            if (!BuildHostTables(layout, pool.bytes, {v.page_bytes, o.slab_bytes}, batch, seq,
                                 static_cast<uint32_t>(rb), 1234u + batch, &t, &why)) {
              std::fprintf(stderr, "hisparse-bench resolve: %s\n", why.c_str());
              return 2;
            }
            bench::ResolveInputs in(g, t.At(pool.dev), t.records_per_page, t.pages_per_entry, batch, seq, st);
            for (double miss : o.miss) {
              const int hits = static_cast<int>(std::lround((1.0 - miss) * k));
              const int misses_row = k - hits;
              const std::vector<int32_t> pos = Selections(pattern, batch, k, hits, B, seq, 99u + batch + hits);
              BENCH_CUDA(cudaMemcpy(in.d_pos, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
              std::optional<DeviceCopy<int32_t>> pos_src;  // the producer's source, when timed behind one
              if (!o.producers.empty()) pos_src.emplace(pos);
              for (const auto& [ordered, max_blocks, consumer_blocks, consumer_warps] : LaunchVariants(o)) {
                ResolveLaunchConfig config;
                BENCH_CUDA(PrepareResolveLaunch(g, &config));
                config.address_order = ordered;
                config.max_blocks = max_blocks;
                config.consumer_blocks = consumer_blocks;
                config.consumer_warps = consumer_warps;
                ResolveDesc d{};
                d.arena = view;
                d.host = in.host();
                d.layer = 0;
                d.max_batch = batch;
                d.batch_size = in.d_batch;
                d.rows = in.d_rows;
                d.seq_lens = in.d_seqs;
                d.positions = in.d_pos;
                d.out_slots = in.d_out;
                d.error_flags = in.d_err;

                const Timer timer{st,        ev0,        ev1,    o.scrub_l2 ? &scrub : nullptr,
                                  tlb.get(), spin,       o.runs, view.slot_pos,
                                  saved,     table_span, {}};
                // Variants: 0 RESOLVE, 1 no-IO, 2 the launch shape alone, 3 the no-IO step's memory
                // traffic alone (LaunchResolveMemoryFloor).
                double med[4] = {0, 0, 0, 0}, mn[4] = {0, 0, 0, 0};
                for (int variant = 0; variant < 4; ++variant) {
                  d.flags = variant == 1 ? static_cast<uint32_t>(kResolveFlagNoFetch) : 0u;
                  const Timer::Times t =
                      timer.Time([] {},
                                 [&] {
                                   if (variant < 2) {
                                     BENCH_CUDA(LaunchResolve(d, in.ws, in.ws_bytes, config, st));
                                   } else if (variant == 2) {
                                     BENCH_CUDA(LaunchResolveShapeOnly(config, batch, st));
                                   } else {
                                     BENCH_CUDA(LaunchResolveMemoryFloor(d, config, in.d_scratch, st));
                                   }
                                 });
                  med[variant] = t.median;
                  mn[variant] = t.min;
                }
                d.flags = 0;
                // --prewarm: RESOLVE again with part of its translations made ahead.
                struct Prewarmed {
                  double frac;
                  PrewarmReads reads;
                  Timer::Times t;
                };
                std::vector<Prewarmed> prewarmed;
                for (const double frac : o.prewarm) {
                  PrewarmReads reads =
                      PlanPrewarm(t, reinterpret_cast<uintptr_t>(pool.dev), pool.bytes, pos, batch, k, hits, seq,
                                  static_cast<uint32_t>(rb), {o.translation_page, frac, o.prewarm_extra, o.prewarm_gap},
                                  7u + batch + hits);
                  const DeviceCopy<long long> first(reads.first), gap(reads.gap);
                  Timer tw = timer;
                  tw.touch = [&] {
                    if (first.n) LaunchReadEach(first.p, first.n, tlb->sink(), sms, st);
                    if (gap.n) LaunchReadEach(gap.p, gap.n, tlb->sink(), sms, st);
                  };
                  const Timer::Times tt =
                      tw.Time([] {}, [&] { BENCH_CUDA(LaunchResolve(d, in.ws, in.ws_bytes, config, st)); });
                  prewarmed.push_back({frac, std::move(reads), tt});
                }
                // --prewarm-call: the library's PREWARM of the rows' whole layer, alone and before RESOLVE.
                struct Called {
                  int blocks;
                  unsigned long long reads;
                  Timer::Times alone, after;
                };
                std::vector<Called> called;
                for (const int blocks : o.prewarm_call) {
                  PrewarmDesc p;
                  p.geometry = d.arena.geometry;
                  p.host = d.host;
                  p.layer = d.layer;
                  p.max_batch = d.max_batch;
                  p.batch_size = d.batch_size;
                  p.rows = d.rows;
                  p.seq_lens = d.seq_lens;
                  p.max_positions = seq;
                  p.granule_bytes = static_cast<uint32_t>(o.translation_page);
                  p.max_blocks = blocks;
                  unsigned long long digest[2] = {0, 0};
                  {
                    const DeviceCopy<unsigned long long> dig(std::vector<unsigned long long>(2, 0));
                    p.digest = reinterpret_cast<uint64_t*>(dig.p);
                    BENCH_CUDA(LaunchPrewarm(p, config, st));
                    BENCH_CUDA(cudaMemcpyAsync(digest, dig.p, sizeof digest, cudaMemcpyDeviceToHost, st));
                    BENCH_CUDA(cudaStreamSynchronize(st));
                    p.digest = nullptr;
                  }
                  const Timer::Times alone = timer.Time([] {}, [&] { BENCH_CUDA(LaunchPrewarm(p, config, st)); });
                  Timer tw = timer;
                  tw.touch = [&] { BENCH_CUDA(LaunchPrewarm(p, config, st)); };
                  const Timer::Times after =
                      tw.Time([] {}, [&] { BENCH_CUDA(LaunchResolve(d, in.ws, in.ws_bytes, config, st)); });
                  called.push_back({blocks, digest[0], alone, after});
                }
                std::vector<BehindProducer> behind;
                for (const ProducerStart start : o.producers) {
                  behind.push_back(TimeBehindProducer(timer, d, config, pos_src->p, start, in.ws, in.ws_bytes));
                }
                // Sanity: no error flags, misses counted as planned, records exact.
                const int bad =
                    CheckRecords(d, config, in.ws, in.ws_bytes, saved, table_span, pos, hits, t, pool.host, st);
                uint32_t err = 0;
                BENCH_CUDA(cudaMemcpy(&err, in.d_err, 4, cudaMemcpyDeviceToHost));
                ArenaCounters c{};
                BENCH_CUDA(cudaMemcpy(&c, view.counters, sizeof c, cudaMemcpyDeviceToHost));
                const uint64_t launches =
                    (2ull + 4ull * o.producers.size() + o.prewarm.size() + o.prewarm_call.size()) * (o.runs + 5) + 1;
                const bool ok = err == 0 && bad == 0 && c.misses == launches * misses_row * batch;
                failed += ok ? 0 : 1;
                BENCH_CUDA(cudaMemset(view.counters, 0, sizeof c));

                const double miss_bytes = static_cast<double>(misses_row) * batch * rb;
                const double link_us = miss_bytes / (link * 1e3);
                const double bound = std::max(med[1], link_us);
                std::printf(
                    "{\"kind\":\"resolve\",\"batch\":%d,\"k\":%d,\"slots\":%d,\"record_bytes\":%d,"
                    "\"miss_rate\":%g,\"misses\":%d,\"miss_bytes\":%.0f,\"pattern\":\"%s\",\"seq_len\":%d,"
                    "\"host_layout\":\"%s\",\"page_bytes\":%zu,\"slab_bytes\":%zu,\"records_per_page\":%u,\"pool_"
                    "bytes\":"
                    "%zu,"
                    "\"median_us\":%.2f,\"min_us\":%.2f,\"miss_gbps\":%.2f,\"link_fraction\":%.3f,"
                    "\"noio_median_us\":%.2f,\"noio_min_us\":%.2f,\"launch_floor_us\":%.2f,\"memory_floor_us\":%.2f,"
                    "\"link_gbps\":%.2f,\"bound_us\":%.2f,"
                    "\"ratio_to_bound\":%.3f,\"runs\":%d,\"l2\":\"%s\",\"translations\":\"%s\",\"fetch_order\":\"%s\","
                    "\"max_blocks\":%d,"
                    "\"consumer_blocks\":%d,\"consumer_warps\":%d,\"check\":\"%s\"}\n",
                    batch, k, B, rb, miss, misses_row * batch, miss_bytes,
                    pattern == Pattern::kScattered ? "scattered" : "consecutive", seq, HostLayoutName(layout),
                    v.page_bytes, layout == HostLayout::kSlabs ? o.slab_bytes : 0,
                    layout == HostLayout::kContiguous ? 0u : t.records_per_page, pool.bytes, med[0], mn[0],
                    miss_bytes / (med[0] * 1e3), miss_bytes / (med[0] * 1e3) / link, med[1], mn[1], med[2], med[3],
                    link, bound, med[0] / bound, o.runs, o.scrub_l2 ? "cold" : "warm",
                    o.cold_translations ? "cold" : "warm",
                    ordered && batch >= kAddressOrderMinBatch && k >= kAddressOrderMinK ? "address" : "selection",
                    max_blocks, consumer_blocks, consumer_warps, ok ? "ok" : "FAILED");
                for (const Prewarmed& pw : prewarmed) {
                  std::printf(
                      "{\"kind\":\"resolve_prewarm\",\"batch\":%d,\"k\":%d,\"slots\":%d,\"record_bytes\":%d,"
                      "\"miss_rate\":%g,\"pattern\":\"%s\",\"host_layout\":\"%s\",\"max_blocks\":%d,"
                      "\"consumer_warps\":%d,\"translation_page\":%zu,\"miss_pages\":%lld,\"prewarm\":%g,"
                      "\"prewarmed_pages\":%lld,\"extra_pages\":%lld,\"gap_pages\":%zu,\"median_us\":%.2f,"
                      "\"min_us\":%.2f,\"cold_us\":%.2f,\"link_gbps\":%.2f,\"runs\":%d,\"check\":\"%s\"}\n",
                      batch, k, B, rb, miss, pattern == Pattern::kScattered ? "scattered" : "consecutive",
                      HostLayoutName(layout), max_blocks, consumer_warps, o.translation_page, pw.reads.needed, pw.frac,
                      pw.reads.hit, static_cast<long long>(pw.reads.first.size()) - pw.reads.hit, pw.reads.gap.size(),
                      pw.t.median, pw.t.min, med[0], link, o.runs, ok ? "ok" : "FAILED");
                }
                for (const Called& c : called) {
                  std::printf(
                      "{\"kind\":\"resolve_prewarm_call\",\"batch\":%d,\"k\":%d,\"slots\":%d,\"record_bytes\":%d,"
                      "\"miss_rate\":%g,\"pattern\":\"%s\",\"host_layout\":\"%s\",\"max_blocks\":%d,"
                      "\"consumer_warps\":%d,\"translation_page\":%zu,\"prewarm_blocks\":%d,\"reads\":%llu,"
                      "\"call_us\":%.2f,\"call_min_us\":%.2f,\"median_us\":%.2f,\"min_us\":%.2f,\"cold_us\":%.2f,"
                      "\"link_gbps\":%.2f,\"runs\":%d,\"check\":\"%s\"}\n",
                      batch, k, B, rb, miss, pattern == Pattern::kScattered ? "scattered" : "consecutive",
                      HostLayoutName(layout), max_blocks, consumer_warps, o.translation_page, c.blocks, c.reads,
                      c.alone.median, c.alone.min, c.after.median, c.after.min, med[0], link, o.runs,
                      ok && c.reads > 0 ? "ok" : "FAILED");
                }
                for (size_t x = 0; x < behind.size(); ++x) {
                  const BehindProducer& bp = behind[x];
                  std::printf(
                      "{\"kind\":\"resolve_after_producer\",\"batch\":%d,\"k\":%d,\"slots\":%d,\"record_bytes\":%d,"
                      "\"miss_rate\":%g,\"pattern\":\"%s\",\"host_layout\":\"%s\",\"producer_start\":\"%s\","
                      "\"producer_us\":%.2f,\"noio_after_us\":%.2f,\"noio_after_programmatic_us\":%.2f,"
                      "\"after_us\":%.2f,\"after_programmatic_us\":%.2f,\"noio_alone_us\":%.2f,\"alone_us\":%.2f,"
                      "\"launch_floor_us\":%.2f,\"link_gbps\":%.2f,\"runs\":%d,\"l2\":\"%s\",\"check\":\"%s\"}\n",
                      batch, k, B, rb, miss, pattern == Pattern::kScattered ? "scattered" : "consecutive",
                      HostLayoutName(layout), o.producers[x] == ProducerStart::kEarly ? "early" : "exit", bp.producer,
                      bp.noio - bp.producer, bp.noio_programmatic - bp.producer, bp.full - bp.producer,
                      bp.full_programmatic - bp.producer, med[1], med[0], med[2], link, o.runs,
                      o.scrub_l2 ? "cold" : "warm", ok ? "ok" : "FAILED");
                }
                std::fflush(stdout);
              }
            }
          }
        }
        cudaFree(saved);
        cudaFree(arena);
      }
    }
  }
  cudaStreamDestroy(st);
  return failed == 0 ? 0 : 1;
}

}  // namespace hisparse::bench
