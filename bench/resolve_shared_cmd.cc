// hisparse-bench resolve-shared: the same RESOLVE launch on the daemon's GPU arena (imported by a
// CUDA-backend session: cuda-vmm or cuda-ipc) and on an arena of the same geometry that this
// process cudaMalloc'ed itself. Issue 4's goal: no measurable difference (within 3%).
//
// Starts its own hisparsed (--device cuda, --gpu-arena-export MODE; beside this binary or
// $HISPARSE_DAEMON_BIN). Both arenas get the same state (every row's slots hold positions 0..B-1,
// LRU in slot order, seq_len = B + k + 1; the selection is the first round((1-miss)*k) resident
// positions, then non-resident ones), read the same host pool (one cudaHostAlloc'ed mapped block,
// each row's run contiguous, as in `hisparse-bench resolve`) through the same host record map and
// workspace. Timing as in `resolve`: per run, the tables are restored from a pristine device copy,
// L2 is scrubbed (128 MiB memset), a ~20 us spin hides the launch, and CUDA events bracket the one
// launch. The two arenas alternate run by run (ABBA order) so that drift hits both alike. Prints the
// link's bulk H2D bandwidth first, then one JSON object per point with both medians and their ratio.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench_cmd.h"
#include "cuda_bench_util.h"
#include "hisparse/common/daemon_process.h"
#include "hisparse/hisparse.hpp"
#include "hisparse/kernels/resolve_cuda.h"

namespace hisparse::bench {
namespace {

struct Options {
  std::string mode = "auto";
  int batch = 64, slots = 4096, k = 2048, record_bytes = 656;
  std::vector<double> miss{0, 0.05, 0.2};
  int runs = 300;
  bool smoke = false;
};

void Usage() {
  std::fprintf(stderr,
               "usage: hisparse-bench resolve-shared [--mode auto|vmm|cuda_ipc] [--batch 64] [--slots 4096]\n"
               "       [--k 2048] [--record-bytes 656] [--miss 0,0.05,0.2] [--runs 300] [--smoke]\n"
               "  --smoke: batch 4, 256 slots, k 128, misses 0 and 0.2, 5 runs (what ctest runs); exits 77 without a\n"
               "  GPU.\n");
}

// One arena's tables and their pristine copy.
struct Arena {
  ArenaView view{};
  void* saved = nullptr;
  size_t table_span = 0;
};

Arena Prepare(const ArenaView& view, const ArenaGeometry& g) {
  Arena a;
  a.view = view;
  const ArenaOffsets off = ComputeArenaOffsets(g);
  std::vector<int32_t> tab(static_cast<size_t>(g.max_rows) * g.slots);
  for (size_t i = 0; i < tab.size(); ++i) tab[i] = static_cast<int32_t>(i % g.slots);
  BENCH_CUDA(cudaMemcpy(view.slot_pos, tab.data(), tab.size() * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(view.lru, tab.data(), tab.size() * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemset(view.counters, 0, sizeof(ArenaCounters)));
  a.table_span = off.records - off.slot_pos;
  BENCH_CUDA(cudaMalloc(&a.saved, a.table_span));
  BENCH_CUDA(cudaMemcpy(a.saved, view.slot_pos, a.table_span, cudaMemcpyDeviceToDevice));
  return a;
}

bool ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--smoke") {
      o->smoke = true;
      o->batch = 4, o->slots = 256, o->k = 128, o->runs = 5;
      o->miss = {0, 0.2};
      continue;
    }
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    bool ok = true;
    if (a == "--mode") {
      o->mode = v;
    } else if (a == "--batch") {
      ok = absl::SimpleAtoi(v, &o->batch);
    } else if (a == "--slots") {
      ok = absl::SimpleAtoi(v, &o->slots);
    } else if (a == "--k") {
      ok = absl::SimpleAtoi(v, &o->k);
    } else if (a == "--record-bytes") {
      ok = absl::SimpleAtoi(v, &o->record_bytes);
    } else if (a == "--runs") {
      ok = absl::SimpleAtoi(v, &o->runs) && o->runs >= 1;
    } else if (a == "--miss") {
      o->miss.clear();
      for (absl::string_view p : absl::StrSplit(v, ',', absl::SkipEmpty())) {
        double m = 0;
        ok = ok && absl::SimpleAtod(p, &m) && m >= 0 && m <= 1;
        o->miss.push_back(m);
      }
    } else {
      ok = false;
    }
    if (!ok) return false;
  }
  return o->batch >= 1 && o->k >= 1 && o->slots >= o->k && !o->miss.empty();
}

}  // namespace

int ResolveSharedMain(int argc, char** argv) {
  Options o;
  if (argc > 1 && (std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help")) {
    Usage();
    return 0;
  }
  if (!ParseArgs(argc, argv, &o)) {
    Usage();
    return 2;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "hisparse-bench resolve-shared: no CUDA device%s\n", o.smoke ? " (smoke: skipped)" : "");
    return o.smoke ? 77 : 1;
  }
  BENCH_CUDA(cudaSetDevice(0));
  const double link = PrintLinkLine();

  auto daemon = DaemonProcess::Start(
      {"--device", "cuda", "--gpu-arena-export", o.mode, "--host-pool-size", "64MiB", "--log-level", "warning"},
      120000);
  if (!daemon.ok()) {
    std::fprintf(stderr, "hisparse-bench resolve-shared: cannot start hisparsed: %s\n",
                 daemon.status().ToString().c_str());
    return 1;
  }
  const std::string address = (*daemon)->address();
  hs_session_options so = HS_SESSION_OPTIONS_INIT;
  so.daemon_address = address.c_str();
  so.engine_name = "bench-resolve-shared";
  so.gpu = 0;
  so.num_layers = 1;
  so.record_bytes = static_cast<uint32_t>(o.record_bytes);
  so.k = static_cast<uint32_t>(o.k);
  so.slots = static_cast<uint32_t>(o.slots);
  so.max_requests = static_cast<uint32_t>(o.batch);
  so.backend = HS_BACKEND_CUDA;
  Session session;
  hs_session_info info;
  if (Error e = Session::Open(so, &session); e || (e = session.Info(&info))) {
    std::fprintf(stderr, "hisparse-bench resolve-shared: session: %s\n", e.message.c_str());
    return 1;
  }
  const std::string kind = ArenaKindName(info.arena_kind);
  const ArenaGeometry g{o.batch, 1, o.slots, o.k, static_cast<uint32_t>(o.record_bytes)};
  const ArenaOffsets off = ComputeArenaOffsets(g);
  // The daemon's arena as this process mapped it: its layout is the geometry's (arena_layout.h), so
  // the records' address (hs_session_info.slot_base) places the whole arena.
  if (info.arena_bytes < off.total_bytes) {
    std::fprintf(stderr, "hisparse-bench resolve-shared: the session's arena is %llu bytes, its layout needs %zu\n",
                 static_cast<unsigned long long>(info.arena_bytes), off.total_bytes);
    return 1;
  }
  void* const shared_base = static_cast<uint8_t*>(info.slot_base) - off.records;
  void* own_mem = nullptr;
  BENCH_CUDA(cudaMalloc(&own_mem, off.total_bytes));
  BENCH_CUDA(cudaMemset(own_mem, 0, off.total_bytes));
  Arena arenas[2] = {Prepare(ArenaView::Of(shared_base, g), g), Prepare(ArenaView::Of(own_mem, g), g)};

  // The host pool and everything else RESOLVE reads: shared by both arenas.
  const int B = o.slots, k = o.k, batch = o.batch, rb = o.record_bytes, seq = B + k + 1;
  const size_t pool_bytes = static_cast<size_t>(batch) * seq * rb;
  MappedPool pool(pool_bytes);
  uint8_t* const pool_dev = pool.dev;
  L2Scrubber scrub;
  cudaStream_t st;
  BENCH_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  bench::ResolveInputs in(g, pool_dev, batch, seq, st);
  uint8_t** const d_base = in.d_base;
  int32_t *const d_cap = in.d_cap, *const d_rows = in.d_rows, *const d_seqs = in.d_seqs, *const d_batch = in.d_batch,
                 *const d_pos = in.d_pos, *const d_out = in.d_out;
  uint32_t* const d_err = in.d_err;
  void* const ws = in.ws;
  const size_t ws_bytes = in.ws_bytes;
  cudaEvent_t ev0, ev1;
  BENCH_CUDA(cudaEventCreate(&ev0));
  BENCH_CUDA(cudaEventCreate(&ev1));
  const long long spin = SpinCycles(20);

  int rc = 0;
  for (double miss : o.miss) {
    const int hits = static_cast<int>(std::lround((1.0 - miss) * k));
    const int misses_row = k - hits;
    std::vector<int32_t> pos(static_cast<size_t>(batch) * k);
    for (int r = 0; r < batch; ++r) {
      for (int j = 0; j < k; ++j) pos[static_cast<size_t>(r) * k + j] = j < hits ? j : B + (j - hits);
    }
    BENCH_CUDA(cudaMemcpy(d_pos, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
    ResolveDesc d{};
    d.host = HostRecordMap{d_base, d_cap};
    d.layer = 0;
    d.max_batch = batch;
    d.batch_size = d_batch;
    d.rows = d_rows;
    d.seq_lens = d_seqs;
    d.positions = d_pos;
    d.out_slots = d_out;
    d.error_flags = d_err;
    std::vector<float> t[2];
    const int warmup = 5;
    for (int run = 0; run < o.runs + warmup; ++run) {
      for (int step = 0; step < 2; ++step) {
        const int which = (run % 2 == 0) ? step : 1 - step;  // ABBA: neither always goes first
        Arena& a = arenas[which];
        d.arena = a.view;
        BENCH_CUDA(cudaMemcpyAsync(a.view.slot_pos, a.saved, a.table_span, cudaMemcpyDeviceToDevice, st));
        scrub.Scrub(run, st);
        LaunchSpin(st, spin);
        BENCH_CUDA(cudaEventRecord(ev0, st));
        BENCH_CUDA(LaunchResolve(d, ws, ws_bytes, st));
        BENCH_CUDA(cudaEventRecord(ev1, st));
        BENCH_CUDA(cudaEventSynchronize(ev1));
        float ms = 0;
        BENCH_CUDA(cudaEventElapsedTime(&ms, ev0, ev1));
        if (run >= warmup) t[which].push_back(ms * 1000.0f);
      }
    }
    // Sanity: no error flags; both arenas counted the planned misses.
    uint32_t err = 0;
    BENCH_CUDA(cudaMemcpy(&err, d_err, 4, cudaMemcpyDeviceToHost));
    bool ok = err == 0;
    const uint64_t launches = static_cast<uint64_t>(o.runs) + warmup;
    for (Arena& a : arenas) {
      ArenaCounters c{};
      BENCH_CUDA(cudaMemcpy(&c, a.view.counters, sizeof c, cudaMemcpyDeviceToHost));
      ok = ok && c.misses == launches * misses_row * batch;
      BENCH_CUDA(cudaMemset(a.view.counters, 0, sizeof c));
    }
    const double shared = Median(t[0]), own = Median(t[1]);
    const double miss_bytes = static_cast<double>(misses_row) * batch * rb;
    std::printf(
        "{\"kind\":\"resolve_shared\",\"mode\":\"%s\",\"arena_kind\":\"%s\",\"batch\":%d,\"k\":%d,\"slots\":%d,"
        "\"record_bytes\":%d,\"miss_rate\":%g,\"miss_bytes\":%.0f,\"shared_median_us\":%.2f,\"own_median_us\":%.2f,"
        "\"shared_min_us\":%.2f,\"own_min_us\":%.2f,\"ratio_shared_to_own\":%.4f,\"within_3pct\":%s,"
        "\"link_gbps\":%.2f,\"runs\":%d,\"check\":\"%s\"}\n",
        o.mode.c_str(), kind.c_str(), batch, k, B, rb, miss, miss_bytes, shared, own,
        *std::min_element(t[0].begin(), t[0].end()), *std::min_element(t[1].begin(), t[1].end()), shared / own,
        std::fabs(shared / own - 1) <= 0.03 ? "true" : "false", link, o.runs, ok ? "ok" : "FAILED");
    std::fflush(stdout);
    if (!ok) rc = 1;
  }
  for (Arena& a : arenas) cudaFree(a.saved);
  cudaFree(own_mem);
  cudaStreamDestroy(st);
  session.Close();
  return rc;
}

}  // namespace hisparse::bench
