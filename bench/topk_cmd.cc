// hisparse-bench topk: TOP-K's time a call (kernels/topk.cu) by rows and blocks a row, each point's
// lists checked against the CPU reference (kernels/topk_reference.cc). Scores are normal, or with
// --zeros a fraction of them clamped to 0 as an indexer's ReLU leaves them; --dist serving draws
// them shaped as a serving run's indexer scores instead (a log-normal fitted to them, as
// tests/kernels/topk_cases.h's "serving" rows, drawn by the same code), which crowd nine in ten
// into one leading byte. A point's calls are captured in one CUDA graph and replayed, as a decode
// step replays them; its time is the median replay over --runs, divided by --calls. --blocks 0 is
// the launcher's choice (TopkBlocksPerRow), 1-8 forces that many blocks a row, so one run shows
// what the cluster gives at each row count.
// --l2 cold reads 128 MiB of other data before every call, as the indexer that writes the scores
// streams its keys (the scores then come from HBM, not L2): the graph of reads alone is timed too
// and taken off; warm (the default) replays the calls back to back, the scores in L2.
// --scores FILE takes a serving run's own scores instead (serve_bench.py --dump-scores: raw float32,
// rows of --cols, -inf past a row's length), the first `rows` rows of it at each --rows: whether
// the top-k's time depends on how an indexer's scores are spread, which normal ones do not show.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../tests/kernels/topk_cases.h"  // the "serving" rows the kernel's tests hold it to
#include "bench_cmd.h"
#include "cuda_bench_util.h"
#include "hisparse/kernels/topk.h"
#include "hisparse/kernels/topk_cuda.h"

namespace hisparse::bench {
namespace {

constexpr const char* kUsage =
    "usage: hisparse-bench topk [--rows 1,5,7,22,29,32] [--cols 131136] [--k 2048] [--blocks 0,1,2,4,8]\n"
    "       [--zeros 0,0.5] [--dist normal,serving] [--scores FILE] [--l2 warm,cold] [--calls 10] [--runs 5]\n"
    "       [--smoke]\n"
    "  --blocks: blocks a row (0: the launcher's choice; 1, 2, 4 or 8)\n"
    "  --l2: warm (calls back to back) and/or cold (128 MiB of other data read before each call)\n"
    "  --zeros: the fraction of each row's scores clamped to 0\n"
    "  --dist: normal scores, and/or serving ones (log-normal, shaped as a serving run's indexer's)\n"
    "  --scores: a file of float32 scores, rows of --cols (serve_bench.py --dump-scores), taken\n"
    "  instead of normal ones (--zeros ignored)\n"
    "  --smoke: tiny sizes, every block count (what ctest runs); exits 77 without a CUDA device\n";

void Usage() { std::fputs(kUsage, stderr); }

struct Options {
  std::vector<int> rows = {1, 5, 7, 22, 29, 32};
  int cols = 131136;
  int k = 2048;
  std::vector<int> blocks = {0, 1, 2, 4, 8};
  std::vector<double> zeros = {0.0, 0.5};
  std::vector<std::string> dists = {"normal"};  // how the scores are drawn: normal or serving
  std::string scores_file;                      // empty: drawn scores (less --zeros)
  size_t file_rows = 0;                         // the rows of --cols that scores_file holds
  std::vector<bool> cold = {false};
  int calls = 10;
  int runs = 5;
  bool smoke = false;
};

bool ParseOptions(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--smoke")) {
      o->smoke = true;
      continue;
    }
    std::string name, value;
    if (!TakeFlag(argc, argv, &i, &name, &value)) return false;
    if (name == "--rows") {
      o->rows = ParseList<int>(value.c_str());
    } else if (name == "--cols") {
      o->cols = std::atoi(value.c_str());
    } else if (name == "--k") {
      o->k = std::atoi(value.c_str());
    } else if (name == "--blocks") {
      o->blocks = ParseList<int>(value.c_str());
    } else if (name == "--zeros") {
      o->zeros = ParseList<double>(value.c_str());
    } else if (name == "--dist") {
      o->dists = ParseWords(value.c_str());
      for (const std::string& w : o->dists) {
        if (w != "normal" && w != "serving") {
          std::fprintf(stderr, "hisparse-bench topk: --dist %s is not normal or serving\n", w.c_str());
          return false;
        }
      }
    } else if (name == "--scores") {
      o->scores_file = value;
    } else if (name == "--l2") {
      o->cold.clear();
      for (const std::string& w : ParseWords(value.c_str())) {
        if (w != "warm" && w != "cold") {
          std::fprintf(stderr, "hisparse-bench topk: --l2 %s is not warm or cold\n", w.c_str());
          return false;
        }
        o->cold.push_back(w == "cold");
      }
    } else if (name == "--calls") {
      o->calls = std::atoi(value.c_str());
    } else if (name == "--runs") {
      o->runs = std::atoi(value.c_str());
    } else {
      std::fprintf(stderr, "hisparse-bench topk: unknown argument '%s'\n", name.c_str());
      return false;
    }
  }
  if (o->smoke) {
    o->rows = {1, 3};
    o->cols = 5000;
    o->k = 64;
    o->calls = 2;
    o->runs = 1;
    o->cold = {false, true};
    o->dists = {"normal", "serving"};
  }
  for (const int b : o->blocks) {
    if (b != 0 && b != 1 && b != 2 && b != 4 && b != 8) {
      std::fprintf(stderr, "hisparse-bench topk: --blocks %d is not 0, 1, 2, 4 or 8\n", b);
      return false;
    }
  }
  for (const int r : o->rows) {
    if (r < 1) return false;
  }
  for (const double z : o->zeros) {
    if (z < 0 || z >= 1) return false;
  }
  if (!o->scores_file.empty()) {
    FILE* f = std::fopen(o->scores_file.c_str(), "rb");
    if (f == nullptr || std::fseek(f, 0, SEEK_END) != 0) {
      std::fprintf(stderr, "hisparse-bench topk: cannot read --scores %s\n", o->scores_file.c_str());
      if (f != nullptr) std::fclose(f);
      return false;
    }
    const long bytes = std::ftell(f);
    std::fclose(f);
    const size_t row_bytes = static_cast<size_t>(o->cols) * sizeof(float);
    o->file_rows = bytes > 0 && o->cols > 0 ? static_cast<size_t>(bytes) / row_bytes : 0;
    if (o->cols <= 0 || bytes <= 0 || static_cast<size_t>(bytes) % row_bytes != 0) {
      std::fprintf(stderr, "hisparse-bench topk: --scores %s holds %ld bytes, not rows of --cols %d floats\n",
                   o->scores_file.c_str(), bytes, o->cols);
      return false;
    }
    for (const int r : o->rows) {
      if (static_cast<size_t>(r) > o->file_rows) {
        std::fprintf(stderr, "hisparse-bench topk: --rows %d but --scores %s holds %zu rows\n", r,
                     o->scores_file.c_str(), o->file_rows);
        return false;
      }
    }
    o->zeros = {0.0};  // the file's scores, as they are
    o->dists = {"file"};
  }
  return !o->rows.empty() && !o->blocks.empty() && !o->zeros.empty() && !o->dists.empty() && !o->cold.empty() &&
         o->cols > 0 && o->k > 0 && o->calls > 0 && o->runs > 0;
}

// rows x cols scores, normal or (`serving`) topk_cases.h's "serving" rows; with zeros > 0, less
// row 0's `zeros` quantile and clamped at 0.
std::vector<float> MakeScores(int rows, int cols, bool serving, double zeros, unsigned seed) {
  std::vector<float> s(static_cast<size_t>(rows) * cols);
  if (serving) {
    for (int r = 0; r < rows; ++r) {
      const std::vector<float> row = testing::TopkRow("serving", cols, seed + static_cast<unsigned>(r));
      std::copy(row.begin(), row.end(), s.begin() + static_cast<std::ptrdiff_t>(r) * cols);
    }
  } else {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    for (float& x : s) x = normal(rng);
  }
  if (zeros > 0) {
    std::vector<float> row0(s.begin(), s.begin() + cols);
    auto at = row0.begin() + static_cast<std::ptrdiff_t>(zeros * (cols - 1));
    std::nth_element(row0.begin(), at, row0.end());
    const float q = *at;
    for (float& x : s) x = std::max(x - q, 0.0f);
  }
  return s;
}

// The first `rows` rows of cols floats of a --scores file (ParseOptions checked its size).
std::vector<float> LoadScores(const std::string& path, int rows, int cols) {
  std::vector<float> s(static_cast<size_t>(rows) * cols);
  FILE* f = std::fopen(path.c_str(), "rb");
  const size_t got = f != nullptr ? std::fread(s.data(), sizeof(float), s.size(), f) : 0;
  if (f != nullptr) std::fclose(f);
  if (got != s.size()) {
    std::fprintf(stderr, "hisparse-bench topk: --scores %s: read %zu of %zu floats\n", path.c_str(), got, s.size());
    std::exit(1);
  }
  return s;
}

// One (rows, zeros) batch on the device, timed at each block count.
class Point {
 public:
  Point(const Options& o, const std::string& dist, int rows, double zeros) : o_(o), rows_(rows) {
    host_ = o.scores_file.empty() ? MakeScores(rows, o.cols, dist == "serving", zeros, 1000 + rows)
                                  : LoadScores(o.scores_file, rows, o.cols);
    BENCH_CUDA(cudaMalloc(&scores_, host_.size() * sizeof(float)));
    BENCH_CUDA(cudaMalloc(&out_, static_cast<size_t>(rows) * o.k * sizeof(int32_t)));
    BENCH_CUDA(cudaMemcpy(scores_, host_.data(), host_.size() * sizeof(float), cudaMemcpyHostToDevice));
    want_.assign(static_cast<size_t>(rows) * o.k, 0);
    TopkReference(Desc(host_.data(), want_.data()));
  }
  ~Point() {
    cudaFree(scores_);
    cudaFree(out_);
  }
  Point(const Point&) = delete;
  Point& operator=(const Point&) = delete;

  // µs a call (median replay / calls), and whether the lists equal the reference's. With `scrub`
  // (cold), each call follows a read of its 128 MiB, and the reads' own graph is taken off.
  double Time(int blocks, const L2Scrubber* scrub, int* sink, cudaStream_t st, bool* exact) {
    BENCH_CUDA(cudaMemsetAsync(out_, 0xFF, want_.size() * sizeof(int32_t), st));
    BENCH_CUDA(LaunchTopk(Desc(scores_, out_), st, blocks));  // warm (the occupancy query) and check
    std::vector<int32_t> got(want_.size());
    BENCH_CUDA(cudaMemcpyAsync(got.data(), out_, got.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
    BENCH_CUDA(cudaStreamSynchronize(st));
    *exact = got == want_;
    auto read = [&] {
      if (scrub != nullptr) LaunchStreamRead(scrub->buf, L2Scrubber::kBytes, sink, st);
    };
    const double both = ReplayUs(st, [&] {
      read();
      BENCH_CUDA(LaunchTopk(Desc(scores_, out_), st, blocks));
    });
    return (both - (scrub != nullptr ? ReplayUs(st, read) : 0.0)) / o_.calls;
  }

 private:
  // The median over --runs of one replay of a graph of --calls calls of `call`, µs.
  template <typename F>
  double ReplayUs(cudaStream_t st, F call) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    BENCH_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int c = 0; c < o_.calls; ++c) call();
    BENCH_CUDA(cudaStreamEndCapture(st, &graph));
    BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    BENCH_CUDA(cudaGraphLaunch(exec, st));  // warm
    cudaEvent_t a, b;
    BENCH_CUDA(cudaEventCreate(&a));
    BENCH_CUDA(cudaEventCreate(&b));
    std::vector<float> us;
    for (int r = 0; r < o_.runs; ++r) {
      BENCH_CUDA(cudaEventRecord(a, st));
      BENCH_CUDA(cudaGraphLaunch(exec, st));
      BENCH_CUDA(cudaEventRecord(b, st));
      BENCH_CUDA(cudaEventSynchronize(b));
      float ms = 0;
      BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
      us.push_back(ms * 1000);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return Median(us);
  }

  TopkDesc Desc(const float* scores, int32_t* out) const {
    TopkDesc d;
    d.scores = scores;
    d.positions = out;
    d.rows = rows_;
    d.cols = o_.cols;
    d.ld = o_.cols;
    d.k = o_.k;
    return d;
  }

  const Options& o_;
  const int rows_;
  std::vector<float> host_;
  std::vector<int32_t> want_;
  float* scores_ = nullptr;
  int32_t* out_ = nullptr;
};

// Times one batch at every --l2 and --blocks, a JSON line each; returns how many were not exact.
int PrintPoint(const Options& o, const std::string& dist, int rows, double zeros, Point* pt, const L2Scrubber& scrub,
               int* sink, cudaStream_t st) {
  int failed = 0;
  for (const bool cold : o.cold) {
    for (const int blocks : o.blocks) {
      bool exact = false;
      const double us = pt->Time(blocks, cold ? &scrub : nullptr, sink, st, &exact);
      failed += !exact;
      std::printf(
          "{\"kind\":\"topk\",\"rows\":%d,\"cols\":%d,\"k\":%d,\"scores\":\"%s\",\"zeros\":%.2f,"
          "\"blocks_per_row\":%d,\"l2\":\"%s\",\"calls\":%d,\"runs\":%d,\"us_per_call\":%.2f,\"check\":\"%s\"}\n",
          rows, o.cols, o.k, dist.c_str(), zeros, blocks, cold ? "cold" : "warm", o.calls, o.runs, us,
          exact ? "ok" : "FAILED");
      std::fflush(stdout);
    }
  }
  return failed;
}

}  // namespace

int TopkMain(int argc, char** argv) {
  Options o;
  if (!ParseOptions(argc, argv, &o)) {
    Usage();
    return 2;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "hisparse-bench topk: no CUDA device: skipped\n");
    return 77;
  }
  PrintLinkLine();
  cudaStream_t st;
  BENCH_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  L2Scrubber scrub;
  BENCH_CUDA(cudaMemsetAsync(scrub.buf, 0, L2Scrubber::kBytes, st));
  int* sink = nullptr;
  BENCH_CUDA(cudaMalloc(&sink, sizeof(int)));
  int failed = 0;
  for (const std::string& dist : o.dists) {
    for (const double zeros : o.zeros) {
      for (const int rows : o.rows) {
        Point pt(o, dist, rows, zeros);
        failed += PrintPoint(o, dist, rows, zeros, &pt, scrub, sink, st);
      }
    }
  }
  cudaFree(sink);
  cudaStreamDestroy(st);
  return failed ? 1 : 0;
}

}  // namespace hisparse::bench
