// hisparse-bench resolve --draft-tokens N[,N...]: issue 18's benchmark of multi-query RESOLVE
// (speculative decoding, resolve.h rule 8). For every point (draft_tokens n, batch) it times, on
// the GPU, the same steady-state decode step of q = n + 1 query tokens three ways:
//   multi     one multi-query launch (arena draft_tokens = n) serving all q lists;
//   separate  q single-query launches of the same lists, one after another, on an arena of the
//             same B with draft_tokens = 0 (list t at seq_len context + t + 1);
//   single    one single-query launch of list 0 alone on that arena (what a step costs without
//             drafts: the goal is multi <= 1.3 x single).
// The lists, the steady state and what each variant must produce come from draft_workload.h
// (lists of consecutive query tokens overlap 80%; the previous step's union is resident), built
// on the CPU reference; each point's GPU outputs and tables are checked bit-equal against it.
//
// Timing as in `hisparse-bench resolve`: per run and variant the arena's pre-step tables are
// restored from a pristine device copy, L2 is scrubbed (128 MiB memset; --warm-l2 skips it), a
// GPU spin hides the host launch overhead as a CUDA graph would, and CUDA events bracket the
// variant's launch (or its q launches). The three variants take turns in a rotating order, run by
// run, so drift hits them alike. Median and min over --runs. --no-fetch times the planning alone
// (kResolveFlagNoFetch: outputs and tables as usual, no record moved): with fetches every list's
// fresh positions cost link time, so a step of q lists moves about q times list 0's bytes.
//
// Output (stdout, one JSON object per line): the link's bulk H2D bandwidth, then one
// "resolve_draft" object per point; a readable table of the same figures goes to stderr.
// --smoke: no GPU and no timing; tiny sizes (unless given), every point built and checked on the
// CPU reference alone (what ctest runs).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench_cmd.h"
#include "cuda_bench_util.h"
#include "draft_workload.h"
#include "hisparse/kernels/resolve_cuda.h"

namespace hisparse::bench {
namespace {

struct DraftOptions {
  std::vector<int> draft{0, 1, 3};
  std::vector<int> batch{1, 32, 128};
  DraftPoint base;  // k, slots, context, record_bytes, overlap, seed
  int runs = 200;
  bool scrub_l2 = true;
  bool no_fetch = false;  // kResolveFlagNoFetch on every variant: the planning alone
  bool smoke = false;
};

void DraftUsage() {
  std::fprintf(stderr,
               "usage: hisparse-bench resolve --draft-tokens 0,1,3 [--batch 1,32,128] [--k 2048]\n"
               "       [--slots B (default (n+2)*k)] [--context 16384] [--record-bytes 656]\n"
               "       [--overlap 0.8] [--seed 1] [--runs 200] [--warm-l2] [--no-fetch] [--smoke]\n"
               "  --no-fetch: every variant plans, publishes and updates its tables but moves no record\n"
               "  --smoke: CPU reference only, no GPU, no timing (tiny sizes unless given)\n");
}

bool ParseInts(const std::string& v, std::vector<int>* out) {
  out->clear();
  for (absl::string_view p : absl::StrSplit(v, ',', absl::SkipEmpty())) {
    int x = 0;
    if (!absl::SimpleAtoi(p, &x)) return false;
    out->push_back(x);
  }
  return !out->empty();
}

bool ParseDraftArgs(int argc, char** argv, DraftOptions* o) {
  bool k_set = false, context_set = false, rb_set = false, batch_set = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--smoke") {
      o->smoke = true;
      continue;
    }
    if (a == "--warm-l2") {
      o->scrub_l2 = false;
      continue;
    }
    if (a == "--no-fetch") {
      o->no_fetch = true;
      continue;
    }
    std::string name, v;
    if (!TakeFlag(argc, argv, &i, &name, &v)) return false;
    bool ok = true;
    int x = 0;
    if (name == "--draft-tokens") {
      ok = ParseInts(v, &o->draft);
    } else if (name == "--batch") {
      ok = ParseInts(v, &o->batch);
      batch_set = true;
    } else if (name == "--k") {
      ok = absl::SimpleAtoi(v, &o->base.k);
      k_set = true;
    } else if (name == "--slots") {
      ok = absl::SimpleAtoi(v, &o->base.slots) && o->base.slots >= 1;
    } else if (name == "--context") {
      ok = absl::SimpleAtoi(v, &o->base.context);
      context_set = true;
    } else if (name == "--record-bytes") {
      ok = absl::SimpleAtoi(v, &x) && x > 0;
      o->base.record_bytes = static_cast<uint32_t>(x);
      rb_set = true;
    } else if (name == "--overlap") {
      ok = absl::SimpleAtod(v, &o->base.overlap);
    } else if (name == "--seed") {
      ok = absl::SimpleAtoi(v, &o->base.seed);
    } else if (name == "--runs") {
      ok = absl::SimpleAtoi(v, &o->runs) && o->runs >= 1;
    } else {
      std::fprintf(stderr, "hisparse-bench resolve: unknown argument '%s'\n", name.c_str());
      ok = false;
    }
    if (!ok) return false;
  }
  if (o->smoke) {  // tiny sizes, unless given
    if (!k_set) o->base.k = 16;
    if (!context_set) o->base.context = 512;
    if (!rb_set) o->base.record_bytes = 32;
    if (!batch_set) o->batch = {1, 3};
  }
  return true;
}

// Device copies of one arena: the arena, its pristine pre-step tables, and how to restore them.
struct DeviceArena {
  DeviceArena(const ArenaGeometry& g, const DraftTables& before) {
    const ArenaOffsets off = ComputeArenaOffsets(g);
    BENCH_CUDA(cudaMalloc(&mem, off.total_bytes));
    BENCH_CUDA(cudaMemset(mem, 0, off.total_bytes));
    view = ArenaView::Of(mem, g);
    BENCH_CUDA(cudaMemcpy(view.slot_pos, before.slot_pos.data(), before.slot_pos.size() * 4, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(view.lru, before.lru.data(), before.lru.size() * 4, cudaMemcpyHostToDevice));
    span = off.records - off.slot_pos;  // slot_pos and lru (and the padding between them)
    BENCH_CUDA(cudaMalloc(&saved, span));
    BENCH_CUDA(cudaMemcpy(saved, view.slot_pos, span, cudaMemcpyDeviceToDevice));
    BENCH_CUDA(PrepareResolveLaunch(g, &config));
    ws_bytes = ResolveWorkspaceBytes(g, g.max_rows);
    BENCH_CUDA(cudaMalloc(&ws, ws_bytes));
    BENCH_CUDA(InitResolveWorkspace(ws, ws_bytes, nullptr));
    BENCH_CUDA(cudaDeviceSynchronize());  // the bench's stream does not wait on the legacy stream
  }
  ~DeviceArena() {
    cudaFree(ws);
    cudaFree(saved);
    cudaFree(mem);
  }
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  void Restore(cudaStream_t st) const {
    BENCH_CUDA(cudaMemcpyAsync(view.slot_pos, saved, span, cudaMemcpyDeviceToDevice, st));
  }
  DraftTables Tables() const {
    const size_t n = static_cast<size_t>(view.geometry.max_rows) * view.geometry.slots;
    DraftTables t{std::vector<int32_t>(n), std::vector<int32_t>(n)};
    BENCH_CUDA(cudaMemcpy(t.slot_pos.data(), view.slot_pos, n * 4, cudaMemcpyDeviceToHost));
    BENCH_CUDA(cudaMemcpy(t.lru.data(), view.lru, n * 4, cudaMemcpyDeviceToHost));
    return t;
  }
  uint64_t Misses() const {
    ArenaCounters c{};
    BENCH_CUDA(cudaMemcpy(&c, view.counters, sizeof c, cudaMemcpyDeviceToHost));
    return c.misses;
  }

  void* mem = nullptr;
  void* saved = nullptr;
  size_t span = 0;
  ArenaView view{};
  ResolveLaunchConfig config;
  void* ws = nullptr;
  size_t ws_bytes = 0;
};

// A device int32 array with host contents; owns it.
struct DeviceInts {
  explicit DeviceInts(const std::vector<int32_t>& v) : n(v.size()) {
    BENCH_CUDA(cudaMalloc(&p, std::max<size_t>(n, 1) * 4));
    BENCH_CUDA(cudaMemcpy(p, v.data(), n * 4, cudaMemcpyHostToDevice));
  }
  ~DeviceInts() { cudaFree(p); }
  DeviceInts(const DeviceInts&) = delete;
  DeviceInts& operator=(const DeviceInts&) = delete;
  std::vector<int32_t> Read() const {
    std::vector<int32_t> v(n);
    BENCH_CUDA(cudaMemcpy(v.data(), p, n * 4, cudaMemcpyDeviceToHost));
    return v;
  }
  int32_t* p = nullptr;
  size_t n = 0;
};

// The device inputs of one point's launches, uploaded from its workload; owns them.
struct PointInputs {
  PointInputs(const DraftWorkload& w, uint8_t* pool_dev) {
    const DraftPoint& p = w.point;
    const int32_t q = p.Queries(), batch = p.batch, k = p.k;
    std::vector<uint8_t*> base(batch);
    for (int32_t r = 0; r < batch; ++r) base[r] = pool_dev + static_cast<size_t>(r) * w.SeqLen() * p.record_bytes;
    BENCH_CUDA(cudaMalloc(&bases, batch * sizeof(uint8_t*)));
    BENCH_CUDA(cudaMemcpy(bases, base.data(), batch * sizeof(uint8_t*), cudaMemcpyHostToDevice));
    std::vector<int32_t> ids(batch);
    for (int32_t r = 0; r < batch; ++r) ids[r] = r;
    auto ints = [](const std::vector<int32_t>& v) { return std::make_unique<DeviceInts>(v); };
    caps = ints(std::vector<int32_t>(batch, w.SeqLen()));
    rows = ints(ids);
    batch_size = ints({batch});
    counts = ints(std::vector<int32_t>(batch, q));
    seq_multi = ints(std::vector<int32_t>(batch, w.SeqLen()));
    const int32_t* step = w.Step(w.steps - 1);
    pos_multi = ints(std::vector<int32_t>(step, step + static_cast<size_t>(batch) * q * k));
    out_multi = ints(std::vector<int32_t>(static_cast<size_t>(batch) * q * k, 0));
    for (int32_t t = 0; t < q; ++t) {
      seq_list.push_back(ints(std::vector<int32_t>(batch, p.context + t + 1)));
      pos_list.push_back(ints(w.TimedList(t)));
      out_list.push_back(ints(std::vector<int32_t>(static_cast<size_t>(batch) * k, 0)));
    }
    out_single = ints(std::vector<int32_t>(static_cast<size_t>(batch) * k, 0));
    errors = ints({0, 0, 0});
  }
  ~PointInputs() { cudaFree(bases); }
  PointInputs(const PointInputs&) = delete;
  PointInputs& operator=(const PointInputs&) = delete;

  uint8_t** bases = nullptr;
  std::unique_ptr<DeviceInts> caps, rows, batch_size, counts, seq_multi, pos_multi, out_multi, out_single, errors;
  std::vector<std::unique_ptr<DeviceInts>> seq_list, pos_list, out_list;  // [q]: list t as its own launch
};

ResolveDesc Desc(const DeviceArena& a, const PointInputs& in, const DeviceInts& seqs, const DeviceInts& pos,
                 const DeviceInts& out, int variant, bool multi, bool no_fetch) {
  ResolveDesc d{};
  d.flags = no_fetch ? static_cast<uint32_t>(kResolveFlagNoFetch) : 0u;
  d.arena = a.view;
  d.host = HostRecordMap{in.bases, in.caps->p};
  d.layer = 0;
  d.max_batch = a.view.geometry.max_rows;
  d.batch_size = in.batch_size->p;
  d.rows = in.rows->p;
  d.seq_lens = seqs.p;
  d.positions = pos.p;
  d.out_slots = out.p;
  d.error_flags = reinterpret_cast<uint32_t*>(in.errors->p) + variant;
  d.query_counts = multi && a.view.geometry.draft_tokens > 0 ? in.counts->p : nullptr;
  return d;
}

enum Variant { kMulti = 0, kSeparate = 1, kSingle = 2, kVariants = 3 };

struct PointResult {
  double median[kVariants] = {0, 0, 0};
  double min[kVariants] = {0, 0, 0};
  std::string check;  // "" when the GPU matched the reference
};

// Why the GPU's result of one variant differs from the reference's, or "".
std::string Compare(const char* what, const std::vector<int32_t>& gpu, const std::vector<int32_t>& ref) {
  if (gpu == ref) return "";
  size_t x = 0;
  while (x < gpu.size() && x < ref.size() && gpu[x] == ref[x]) ++x;
  return std::string(what) + " differs from the CPU reference at index " + std::to_string(x);
}

// Times one point's three variants and checks the GPU against the workload's reference outcome.
PointResult RunPoint(const DraftWorkload& w, uint8_t* pool_dev, const DraftOptions& o, cudaStream_t st,
                     L2Scrubber& scrub) {
  const DraftPoint& p = w.point;
  const int32_t q = p.Queries();
  DeviceArena multi(p.MultiGeometry(), w.multi_before), single(p.SingleGeometry(), w.single_before);
  PointInputs in(w, pool_dev);
  std::vector<ResolveDesc> launches[kVariants];
  launches[kMulti].push_back(Desc(multi, in, *in.seq_multi, *in.pos_multi, *in.out_multi, kMulti, true, o.no_fetch));
  for (int32_t t = 0; t < q; ++t) {
    launches[kSeparate].push_back(
        Desc(single, in, *in.seq_list[t], *in.pos_list[t], *in.out_list[t], kSeparate, false, o.no_fetch));
  }
  launches[kSingle].push_back(
      Desc(single, in, *in.seq_list[0], *in.pos_list[0], *in.out_single, kSingle, false, o.no_fetch));
  const DeviceArena* arena[kVariants] = {&multi, &single, &single};
  auto enqueue = [&](int v) {
    for (const ResolveDesc& d : launches[v])
      BENCH_CUDA(LaunchResolve(d, arena[v]->ws, arena[v]->ws_bytes, arena[v]->config, st));
  };
  cudaEvent_t ev0, ev1;
  BENCH_CUDA(cudaEventCreate(&ev0));
  BENCH_CUDA(cudaEventCreate(&ev1));
  const long long spin = SpinCycles(20.0 + 10.0 * q);  // hides the host's enqueue of up to q launches
  const int warmup = 5;
  std::vector<float> us[kVariants];
  for (int run = 0; run < o.runs + warmup; ++run) {
    for (int i = 0; i < kVariants; ++i) {
      const int v = (run + i) % kVariants;  // rotating order: none always goes first
      arena[v]->Restore(st);
      if (o.scrub_l2) scrub.Scrub(run, st);
      LaunchSpin(st, spin);
      BENCH_CUDA(cudaEventRecord(ev0, st));
      enqueue(v);
      BENCH_CUDA(cudaEventRecord(ev1, st));
      BENCH_CUDA(cudaEventSynchronize(ev1));
      float ms = 0;
      BENCH_CUDA(cudaEventElapsedTime(&ms, ev0, ev1));
      if (run >= warmup) us[v].push_back(ms * 1000.0f);
    }
  }
  cudaEventDestroy(ev0);
  cudaEventDestroy(ev1);
  PointResult res;
  for (int v = 0; v < kVariants; ++v) {
    res.median[v] = Median(us[v]);
    res.min[v] = *std::min_element(us[v].begin(), us[v].end());
  }

  // Checks: no error flags, the planned misses every run, then one more run of each variant held
  // bit-equal to the reference (outputs, and the tables after the step).
  const uint64_t runs = static_cast<uint64_t>(o.runs) + warmup;
  uint64_t separate_misses = 0;
  for (const DraftOutcome& s : w.separate) separate_misses += s.misses;
  const std::vector<int32_t> err = in.errors->Read();
  if (err[0] | err[1] | err[2]) {
    res.check = "error flags set: multi " + std::to_string(err[0]) + ", separate " + std::to_string(err[1]) +
                ", single " + std::to_string(err[2]);
  } else if (multi.Misses() != runs * w.multi.misses || single.Misses() != runs * (separate_misses + w.single.misses)) {
    res.check = "the arenas' miss counters do not match the planned misses";
  }
  for (int v = 0; v < kVariants && res.check.empty(); ++v) {
    arena[v]->Restore(st);
    enqueue(v);
    BENCH_CUDA(cudaStreamSynchronize(st));
    if (v == kMulti) {
      res.check = Compare("multi out_slots", in.out_multi->Read(), w.multi.out);
      if (res.check.empty()) res.check = Compare("multi slot table", multi.Tables().slot_pos, w.multi_after.slot_pos);
      if (res.check.empty()) res.check = Compare("multi LRU order", multi.Tables().lru, w.multi_after.lru);
    } else if (v == kSeparate) {
      for (int32_t t = 0; t < q && res.check.empty(); ++t) {
        res.check = Compare("separate out_slots", in.out_list[t]->Read(), w.separate[t].out);
      }
      if (res.check.empty())
        res.check = Compare("separate slot table", single.Tables().slot_pos, w.separate_after.slot_pos);
      if (res.check.empty()) res.check = Compare("separate LRU order", single.Tables().lru, w.separate_after.lru);
    } else {
      res.check = Compare("single out_slots", in.out_single->Read(), w.single.out);
    }
  }
  return res;
}

// The JSON fields every point shares (smoke or timed), without the closing brace.
std::string PointJson(const char* backend, const DraftWorkload& w) {
  const DraftPoint& p = w.point;
  const int32_t fresh = p.k - p.Kept();
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"kind\":\"resolve_draft\",\"backend\":\"%s\",\"draft_tokens\":%d,\"queries\":%d,\"batch\":%d,"
                "\"k\":%d,\"slots\":%d,\"record_bytes\":%u,\"context\":%d,\"overlap\":%g,\"kept\":%d,"
                "\"misses_per_row_multi\":%d,\"misses_per_row_single\":%d,\"warmup_steps\":%d",
                backend, p.draft_tokens, p.Queries(), p.batch, p.k, p.Slots(), p.record_bytes, p.context, p.overlap,
                p.Kept(), p.Queries() * fresh, fresh, w.steps - 1);
  return buf;
}

std::vector<DraftPoint> Points(const DraftOptions& o) {
  std::vector<DraftPoint> points;
  for (int n : o.draft) {
    for (int b : o.batch) {
      DraftPoint p = o.base;
      p.draft_tokens = n;
      p.batch = b;
      points.push_back(p);
    }
  }
  return points;
}

// --smoke: every point built and checked on the CPU reference; no CUDA call at all.
int RunSmoke(const DraftOptions& o) {
  int rc = 0;
  for (const DraftPoint& p : Points(o)) {
    absl::StatusOr<DraftWorkload> w = MakeDraftWorkload(p);
    if (!w.ok()) {
      std::fprintf(stderr, "hisparse-bench resolve: %s\n", w.status().ToString().c_str());
      return 2;
    }
    const std::string why = CheckDraftWorkload(*w);
    std::printf("%s,\"timed\":false,\"check\":\"%s\"}\n", PointJson("cpu-reference", *w).c_str(),
                why.empty() ? "ok" : ("FAILED: " + why).c_str());
    if (!why.empty()) rc = 1;
  }
  return rc;
}

}  // namespace

int ResolveDraftMain(int argc, char** argv) {
  DraftOptions o;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "-h" || std::string(argv[i]) == "--help") {
      DraftUsage();
      return 0;
    }
  }
  if (!ParseDraftArgs(argc, argv, &o)) {
    DraftUsage();
    return 2;
  }
  for (DraftPoint p : Points(o)) {  // every point is valid (checked at batch 1) before anything runs
    p.batch = std::min(p.batch, 1);
    const absl::StatusOr<DraftWorkload> w = MakeDraftWorkload(p);
    if (!w.ok()) {
      std::fprintf(stderr, "hisparse-bench resolve: %s\n", w.status().ToString().c_str());
      return 2;
    }
  }
  if (o.smoke) return RunSmoke(o);

  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::fprintf(stderr,
                 "hisparse-bench resolve --draft-tokens: no CUDA device (%s); it times on a GPU. --smoke checks "
                 "the workload on the CPU reference without one.\n",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 1;
  }
  BENCH_CUDA(cudaSetDevice(0));
  const double link = PrintLinkLine();

  const std::vector<DraftPoint> points = Points(o);
  size_t pool_bytes = 0;  // one pool for every point: each row's run of context + q records
  for (const DraftPoint& p : points) {
    pool_bytes = std::max(pool_bytes, static_cast<size_t>(p.batch) * (p.context + p.Queries()) * p.record_bytes);
  }
  MappedPool pool(pool_bytes);
  L2Scrubber scrub;
  cudaStream_t st;
  BENCH_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::vector<std::string> table;
  int rc = 0;
  for (const DraftPoint& p : points) {
    absl::StatusOr<DraftWorkload> w = MakeDraftWorkload(p);
    if (!w.ok()) {
      std::fprintf(stderr, "hisparse-bench resolve: %s\n", w.status().ToString().c_str());
      return 2;
    }
    std::string why = CheckDraftWorkload(*w);
    const PointResult r = why.empty() ? RunPoint(*w, pool.dev, o, st, scrub) : PointResult{};
    if (why.empty()) why = r.check;
    if (!why.empty()) rc = 1;
    // Ratios of the medians; 0 when nothing was timed (the workload failed its own check).
    const double vs_single = r.median[kSingle] > 0 ? r.median[kMulti] / r.median[kSingle] : 0;
    const double vs_separate = r.median[kSeparate] > 0 ? r.median[kMulti] / r.median[kSeparate] : 0;
    std::printf(
        "%s,\"timed\":%s,\"multi_median_us\":%.2f,\"multi_min_us\":%.2f,\"separate_median_us\":%.2f,"
        "\"separate_min_us\":%.2f,\"single_median_us\":%.2f,\"single_min_us\":%.2f,\"multi_over_single\":%.3f,"
        "\"multi_over_separate\":%.3f,\"goal_multi_le_1_3x_single\":%s,\"link_gbps\":%.2f,\"runs\":%d,"
        "\"l2\":\"%s\",\"fetch\":%s,\"check\":\"%s\"}\n",
        PointJson("cuda", *w).c_str(), r.median[kMulti] > 0 ? "true" : "false", r.median[kMulti], r.min[kMulti],
        r.median[kSeparate], r.min[kSeparate], r.median[kSingle], r.min[kSingle], vs_single, vs_separate,
        vs_single > 0 && vs_single <= 1.3 ? "true" : "false", link, o.runs, o.scrub_l2 ? "cold" : "warm",
        o.no_fetch ? "false" : "true", why.empty() ? "ok" : ("FAILED: " + why).c_str());
    std::fflush(stdout);
    char line[256];
    std::snprintf(line, sizeof line, "%5d %5d %6d %10.1f %12.1f %10.1f %13.3f %15.3f %10s  %s", p.draft_tokens, p.batch,
                  p.Slots(), r.median[kMulti], r.median[kSeparate], r.median[kSingle], vs_single, vs_separate,
                  vs_single > 0 && vs_single <= 1.3 ? "yes" : "no", why.empty() ? "ok" : "FAILED");
    table.push_back(line);
  }
  std::fprintf(stderr,
               "\nRESOLVE, one steady-state decode step of n+1 query tokens (k=%d, lists overlap %g, L2 %s%s; "
               "median us of %d runs)\n  multi: one multi-query launch; separate: n+1 single-query launches of the "
               "same lists; single: list 0 alone (goal: multi <= 1.3 x single)\n%5s %5s %6s %10s %12s %10s %13s "
               "%15s %10s  %s\n",
               o.base.k, o.base.overlap, o.scrub_l2 ? "cold" : "warm", o.no_fetch ? ", planning only: no fetch" : "",
               o.runs, "n", "batch", "B", "multi_us", "separate_us", "single_us", "multi/single", "multi/separate",
               "<=1.3x", "check");
  for (const std::string& l : table) std::fprintf(stderr, "%s\n", l.c_str());
  cudaStreamDestroy(st);
  return rc;
}

}  // namespace hisparse::bench
