// GPU tests of the CUDA prefill store (plain and indexed), decode append and row reset against
// the CPU reference (kernels/resolve_reference.cc): for identical inputs both leave identical
// arenas (tables and every record) and host pools. The indexed store is also held equal to the
// plain store of the same records, and a bad source index (found on the device) writes nothing.
// Every test skips when no CUDA device is present (CI has none).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "hisparse/kernels/resolve_cuda.h"

namespace hisparse {
namespace {

// ---- store / append / reset against their references. ----

// Two copies of one arena and one host pool each (the kernels write the pool).
class StoreWorld {
 public:
  StoreWorld(int rows, int layers, int B, int k, uint32_t rb, int cap, int draft_tokens = 0)
      : g_{rows, layers, B, k, rb, draft_tokens}, off_(ComputeArenaOffsets(g_)), cap_(cap), rng_(5) {}
  ~StoreWorld() {
    cudaFreeHost(gpool_);
    cudaFree(garena_);
    cudaFree(d_base_);
    cudaFree(d_cap_);
    cudaFree(d_check_);
    std::free(rarena_);
  }
  // Contiguous runs by default; with records_per_page R, pages of R records dealt in random order
  // over the pool (the same order in both pools), row 1's first `shared` pages of every layer
  // mapping row 0's read-only.
  void Init(uint32_t records_per_page = kContiguousRecordsPerPage, int shared = 0) {
    R_ = records_per_page;
    ppe_ = R_ == kContiguousRecordsPerPage ? 1 : (static_cast<uint32_t>(cap_) + R_ - 1) / R_;
    const size_t run = static_cast<size_t>(std::min<uint32_t>(R_, cap_)) * g_.record_bytes;  // one page
    const size_t n = static_cast<size_t>(g_.max_rows) * g_.num_layers * ppe_;
    pool_bytes_ = run * n;
    rpool_.resize(pool_bytes_);
    for (size_t i = 0; i < pool_bytes_; ++i) rpool_[i] = static_cast<uint8_t>(i * 131 + (i >> 9));
    CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&gpool_), pool_bytes_, cudaHostAllocMapped));
    std::memcpy(gpool_, rpool_.data(), pool_bytes_);
    uint8_t* dev = nullptr;
    CUDA_OK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), gpool_, 0));
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    if (ppe_ > 1) std::shuffle(order.begin(), order.end(), rng_);
    rbase_.resize(n);
    std::vector<uint8_t*> gb(n);
    for (size_t i = 0; i < n; ++i) {
      rbase_[i] = rpool_.data() + order[i] * run;
      gb[i] = dev + order[i] * run;
    }
    auto read_only = [](uint8_t* p) { return HostRecordMap::ReadOnlyEntry(p); };
    for (int l = 0; l < g_.num_layers && g_.max_rows >= 2; ++l) {
      for (int pg = 0; pg < shared; ++pg) {
        const size_t from = static_cast<size_t>(l) * ppe_ + pg,
                     to = (static_cast<size_t>(g_.num_layers) + l) * ppe_ + pg;
        rbase_[to] = read_only(rbase_[from]);
        gb[to] = read_only(gb[from]);
      }
    }
    CUDA_OK(cudaMalloc(&d_check_, 4));
    caps_.assign(g_.max_rows, cap_);
    CUDA_OK(cudaMalloc(&d_base_, n * sizeof(uint8_t*)));
    CUDA_OK(cudaMemcpy(d_base_, gb.data(), n * sizeof(uint8_t*), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc(&d_cap_, caps_.size() * 4));
    CUDA_OK(cudaMemcpy(d_cap_, caps_.data(), caps_.size() * 4, cudaMemcpyHostToDevice));
    rarena_ = static_cast<uint8_t*>(std::aligned_alloc(256, off_.total_bytes));
    for (size_t i = 0; i < off_.total_bytes; ++i) rarena_[i] = static_cast<uint8_t>(i * 7);
    ref_ = ArenaView::Of(rarena_, g_);
    for (int r = 0; r < g_.max_rows; ++r) ResetRowReference(ref_, r);
    CUDA_OK(cudaMalloc(&garena_, off_.total_bytes));
    CUDA_OK(cudaMemcpy(garena_, rarena_, off_.total_bytes, cudaMemcpyHostToDevice));
    gpu_ = ArenaView::Of(garena_, g_);
  }
  void Compare(const std::string& what) {
    std::vector<uint8_t> t(off_.total_bytes);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(t.data(), garena_, t.size(), cudaMemcpyDeviceToHost));
    ASSERT_EQ(std::memcmp(t.data(), rarena_, off_.records), 0) << what << ": tables differ";
    ASSERT_EQ(std::memcmp(t.data(), rarena_, t.size()), 0) << what << ": records differ";
    ASSERT_EQ(std::memcmp(gpool_, rpool_.data(), pool_bytes_), 0) << what << ": host pools differ";
  }
  HostRecordMap RefHost() const { return HostRecordMap{rbase_.data(), caps_.data(), R_, ppe_}; }
  HostRecordMap GpuHost() const { return HostRecordMap{d_base_, d_cap_, R_, ppe_}; }
  // A plain store's GPU descriptor: the reference's with the GPU's arena, map and check word.
  StoreDesc Gpu(StoreDesc d, const uint8_t* src, uint32_t* error_flags = nullptr) const {
    d.arena = gpu_;
    d.host = GpuHost();
    d.src = src;
    d.check = d_check_;
    d.error_flags = error_flags;
    return d;
  }

  ArenaGeometry g_;
  ArenaOffsets off_;
  int cap_;
  std::mt19937 rng_;
  size_t pool_bytes_ = 0;
  std::vector<uint8_t> rpool_;
  uint8_t* gpool_ = nullptr;
  std::vector<uint8_t*> rbase_;
  std::vector<int32_t> caps_;
  uint8_t** d_base_ = nullptr;
  int32_t* d_cap_ = nullptr;
  uint32_t* d_check_ = nullptr;  // the plain stores' check word
  uint32_t R_ = kContiguousRecordsPerPage, ppe_ = 1;
  uint8_t* rarena_ = nullptr;
  void* garena_ = nullptr;
  ArenaView ref_{}, gpu_{};
};

TEST(StoreGpu, MatchesReference) {
  REQUIRE_GPU();
  const int L = 3, B = 512, k = 256, cap = 2048;
  const uint32_t rb = 656;
  StoreWorld w(4, L, B, k, rb, cap);
  ASSERT_NO_FATAL_FAILURE(w.Init());
  const int max_tokens = 1200;
  const int64_t tstride = rb + 32, lstride = tstride * max_tokens;
  std::vector<uint8_t> src(static_cast<size_t>(lstride) * L);
  uint8_t* d_src = nullptr;
  CUDA_OK(cudaMalloc(&d_src, src.size()));
  struct Case {
    int row, start, n, after;
  };
  // Chunked prefill within B, a chunk that crosses B, a long prefill, a store that rewrites
  // positions held by resident slots (refresh), an empty store, the newest token in range.
  const Case cases[] = {{0, 0, 100, 300},  {0, 100, 200, 300}, {0, 300, 300, 700}, {1, 0, 1200, 1200}, {2, 0, 512, 512},
                        {2, 100, 50, 512}, {3, 0, 0, 1},       {3, 0, 10, 10},     {1, 600, 400, 1300}};
  int gen = 0;
  for (const Case& c : cases) {
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(w.rng_() + gen);
    ++gen;
    CUDA_OK(cudaMemcpy(d_src, src.data(), src.size(), cudaMemcpyHostToDevice));
    StoreDesc rd{w.ref_, w.RefHost(), c.row, c.start, c.n, c.after, src.data(), lstride, tstride};
    StoreDesc gd =
        w.Gpu(StoreDesc{w.ref_, w.RefHost(), c.row, c.start, c.n, c.after, nullptr, lstride, tstride}, d_src);
    ASSERT_EQ(StoreReference(rd), 0u);
    CUDA_OK(LaunchStore(gd, 0));
    ASSERT_NO_FATAL_FAILURE(w.Compare("store row " + std::to_string(c.row) + " start " + std::to_string(c.start)));
  }
  // Rejected on the host: the reference rejects it too and nothing changes.
  StoreDesc bad{w.gpu_, w.GpuHost(), 0, -1, 5, 10, d_src, lstride, tstride};
  EXPECT_EQ(LaunchStore(bad, 0), cudaErrorInvalidValue);
  bad.arena = w.ref_;
  bad.host = w.RefHost();
  EXPECT_NE(StoreReference(bad), 0u);
  ASSERT_NO_FATAL_FAILURE(w.Compare("rejected store"));
  cudaFree(d_src);
}

TEST(AppendGpu, MatchesReference) {
  REQUIRE_GPU();
  const int L = 2, B = 256, k = 256, cap = 1024, rows = 12, max_batch = 8;
  const uint32_t rb = 1152;
  StoreWorld w(rows, L, B, k, rb, cap);
  ASSERT_NO_FATAL_FAILURE(w.Init());
  // Give every row a prefill of 200 tokens (slots hold 0..199) through both paths.
  std::vector<uint8_t> src(static_cast<size_t>(rb) * 200 * L);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(w.rng_());
  uint8_t* d_src = nullptr;
  CUDA_OK(cudaMalloc(&d_src, src.size()));
  CUDA_OK(cudaMemcpy(d_src, src.data(), src.size(), cudaMemcpyHostToDevice));
  for (int r = 0; r < rows; ++r) {
    StoreDesc rd{w.ref_, w.RefHost(), r, 0, 200, 200, src.data(), int64_t{rb} * 200, rb};
    StoreDesc gd = w.Gpu(StoreDesc{w.ref_, w.RefHost(), r, 0, 200, 200, nullptr, int64_t{rb} * 200, rb}, d_src);
    ASSERT_EQ(StoreReference(rd), 0u);
    CUDA_OK(LaunchStore(gd, 0));
  }
  ASSERT_NO_FATAL_FAILURE(w.Compare("prefill"));
  int32_t *d_batch, *d_rows, *d_seq;
  uint32_t* d_err;
  uint8_t* d_tok;
  const int64_t stride = rb + 16;
  CUDA_OK(cudaMalloc(&d_batch, 4));
  CUDA_OK(cudaMalloc(&d_rows, max_batch * 4));
  CUDA_OK(cudaMalloc(&d_seq, max_batch * 4));
  CUDA_OK(cudaMalloc(&d_err, 4));
  CUDA_OK(cudaMalloc(&d_tok, stride * max_batch));
  std::vector<uint8_t> tok(stride * max_batch);
  for (int step = 0; step < 20; ++step) {
    const int batch = step % 5 == 4 ? 0 : 1 + step % max_batch;
    std::vector<int32_t> rws(max_batch), seq(max_batch);
    for (int i = 0; i < max_batch; ++i) {
      rws[i] = (step * 3 + i) % rows;
      seq[i] = 150 + step + i;  // seq - 1 < 200: a regular slot holds it (refresh path)
      if (step > 10) seq[i] = 300 + step * 7 + i;
    }
    if (step == 6) rws[1] = rows + 2;  // bad row
    if (step == 7) seq[0] = cap + 1;   // bad seq_len
    if (step == 8) seq[2] = 0;
    for (auto& b : tok) b = static_cast<uint8_t>(w.rng_());
    const int layer = step % L;
    uint32_t rerr = 0, gerr = 0;
    int32_t hb = batch;
    AppendDesc rd{w.ref_, w.RefHost(), layer, max_batch, &hb, rws.data(), seq.data(), tok.data(), stride, &rerr};
    CUDA_OK(cudaMemcpy(d_batch, &hb, 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_rows, rws.data(), max_batch * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_seq, seq.data(), max_batch * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_tok, tok.data(), tok.size(), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d_err, 0, 4));
    AppendDesc gd{w.gpu_, w.GpuHost(), layer, max_batch, d_batch, d_rows, d_seq, d_tok, stride, d_err};
    AppendReference(rd);
    CUDA_OK(LaunchAppend(gd, 0));
    CUDA_OK(cudaMemcpy(&gerr, d_err, 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(gerr, rerr) << "append step " << step;
    ASSERT_NO_FATAL_FAILURE(w.Compare("append step " + std::to_string(step)));
  }
  // Reset of one row.
  ResetRowReference(w.ref_, 3);
  CUDA_OK(LaunchResetRow(w.gpu_, 3, 0));
  ASSERT_NO_FATAL_FAILURE(w.Compare("reset row 3"));
  cudaFree(d_batch);
  cudaFree(d_rows);
  cudaFree(d_seq);
  cudaFree(d_err);
  cudaFree(d_tok);
  cudaFree(d_src);
}

// Multi-token append (speculative decoding, resolve.h rule 8) for draft_tokens 1..4: a prefill
// through both store paths (the tail slots beside slot B exist now), then steps of random device
// token counts (bad ones too), random device batch sizes (padded entries), positions both past B
// and held by regular slots (refresh), all through one captured CUDA graph per geometry.
TEST(AppendGpu, MultiTokenGraphMatchesReference) {
  REQUIRE_GPU();
  for (int n = 1; n <= 4; ++n) {
    SCOPED_TRACE("draft_tokens " + std::to_string(n));
    const int L = 2, B = 256, k = 64, cap = 1024, rows = 10, max_batch = 8, Q = n + 1;
    const uint32_t rb = 656;
    StoreWorld w(rows, L, B, k, rb, cap, n);
    ASSERT_NO_FATAL_FAILURE(w.Init());
    std::vector<uint8_t> src(static_cast<size_t>(rb) * 200 * L);
    for (auto& b : src) b = static_cast<uint8_t>(w.rng_());
    uint8_t* d_src = nullptr;
    CUDA_OK(cudaMalloc(&d_src, src.size()));
    CUDA_OK(cudaMemcpy(d_src, src.data(), src.size(), cudaMemcpyHostToDevice));
    for (int r = 0; r < rows; ++r) {
      StoreDesc rd{w.ref_, w.RefHost(), r, 0, 200, 200, src.data(), int64_t{rb} * 200, rb};
      StoreDesc gd = w.Gpu(StoreDesc{w.ref_, w.RefHost(), r, 0, 200, 200, nullptr, int64_t{rb} * 200, rb}, d_src);
      ASSERT_EQ(StoreReference(rd), 0u);
      CUDA_OK(LaunchStore(gd, 0));
    }
    ASSERT_NO_FATAL_FAILURE(w.Compare("prefill"));
    int32_t *d_batch, *d_rows, *d_seq, *d_counts;
    uint32_t* d_err;
    uint8_t* d_tok;
    const int64_t stride = rb + 16;
    const size_t tok_bytes = static_cast<size_t>(stride) * max_batch * Q;
    CUDA_OK(cudaMalloc(&d_batch, 4));
    CUDA_OK(cudaMalloc(&d_rows, max_batch * 4));
    CUDA_OK(cudaMalloc(&d_seq, max_batch * 4));
    CUDA_OK(cudaMalloc(&d_counts, max_batch * 4));
    CUDA_OK(cudaMalloc(&d_err, 4));
    CUDA_OK(cudaMalloc(&d_tok, tok_bytes));
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreate(&stream));
    cudaGraphExec_t exec[2] = {nullptr, nullptr};  // one graph per layer
    for (int layer = 0; layer < L; ++layer) {
      AppendDesc gd{w.gpu_, w.GpuHost(), layer, max_batch, d_batch, d_rows, d_seq, d_tok, stride, d_err, d_counts};
      cudaGraph_t graph;
      CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      CUDA_OK(LaunchAppend(gd, stream));
      CUDA_OK(cudaStreamEndCapture(stream, &graph));
      CUDA_OK(cudaGraphInstantiate(&exec[layer], graph, 0));
      CUDA_OK(cudaGraphDestroy(graph));
    }
    std::vector<uint8_t> tok(tok_bytes);
    for (int step = 0; step < 40; ++step) {
      const int batch = static_cast<int>(w.rng_() % (max_batch + 2));  // past max_batch too
      std::vector<int32_t> rws(max_batch), seq(max_batch), counts(max_batch);
      for (int i = 0; i < max_batch; ++i) {
        rws[i] = (step * 3 + i) % rows;
        counts[i] = 1 + static_cast<int>(w.rng_() % Q);
        // Below 200 a regular slot holds the positions (refresh); later ones lie past B.
        seq[i] = (step < 15 ? 150 : 300) + step * 5 + i + counts[i];
      }
      if (step == 6) counts[1] = Q + 1;  // bad counts
      if (step == 7) counts[0] = 0;
      if (step == 8) seq[2] = counts[2] - 1;  // seq_len below the count
      if (step == 9) rws[3] = rows + 1;
      for (auto& b : tok) b = static_cast<uint8_t>(w.rng_());
      const int layer = step % L;
      uint32_t rerr = 0, gerr = 0;
      int32_t hb = batch;
      AppendDesc rd{w.ref_,     w.RefHost(), layer,  max_batch, &hb,          rws.data(),
                    seq.data(), tok.data(),  stride, &rerr,     counts.data()};
      CUDA_OK(cudaMemcpy(d_batch, &hb, 4, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemcpy(d_rows, rws.data(), max_batch * 4, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemcpy(d_seq, seq.data(), max_batch * 4, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemcpy(d_counts, counts.data(), max_batch * 4, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemcpy(d_tok, tok.data(), tok.size(), cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemset(d_err, 0, 4));
      AppendReference(rd);
      CUDA_OK(cudaGraphLaunch(exec[layer], stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      CUDA_OK(cudaMemcpy(&gerr, d_err, 4, cudaMemcpyDeviceToHost));
      EXPECT_EQ(gerr, rerr) << "append step " << step;
      ASSERT_NO_FATAL_FAILURE(w.Compare("multi-token append step " + std::to_string(step)));
    }
    for (cudaGraphExec_t e : exec) cudaGraphExecDestroy(e);
    cudaStreamDestroy(stream);
    cudaFree(d_batch);
    cudaFree(d_rows);
    cudaFree(d_seq);
    cudaFree(d_counts);
    cudaFree(d_err);
    cudaFree(d_tok);
    cudaFree(d_src);
  }
}

// ---- indexed store: a paged pool in device memory, gathered by index. ----

// An engine's paged KV pool on the GPU: [layers][pool_tokens] records of `stride` bytes; a chunk's
// tokens sit at scattered slots (a random permutation), as pages of a token pool do.
class PagedPool {
 public:
  PagedPool(int layers, int pool_tokens, int64_t stride) : layers_(layers), tokens_(pool_tokens), stride_(stride) {}
  ~PagedPool() {
    cudaFree(d_pool_);
    cudaFree(d_index_);
    cudaFree(d_err_);
    cudaFree(d_check_);
  }
  void Init() {
    CUDA_OK(cudaMalloc(&d_pool_, Bytes()));
    CUDA_OK(cudaMalloc(&d_index_, static_cast<size_t>(tokens_) * 4));
    CUDA_OK(cudaMalloc(&d_err_, 4));
    CUDA_OK(cudaMalloc(&d_check_, 4));
    CUDA_OK(cudaMemset(d_err_, 0, 4));
    CUDA_OK(cudaMemset(d_check_, 0x5a, 4));  // the check kernel writes it before any copy reads it
  }
  size_t Bytes() const { return static_cast<size_t>(layers_) * tokens_ * stride_; }
  // Puts the chunk `src` ([layers][n][rb], contiguous) at random pool slots; returns the slots
  // (uploaded to d_index_).
  std::vector<int32_t> Scatter(const std::vector<uint8_t>& src, int n, uint32_t rb, std::mt19937& rng) {
    std::vector<int32_t> slots(tokens_);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    slots.resize(n);
    std::vector<uint8_t> pool(Bytes());
    for (auto& b : pool) b = static_cast<uint8_t>(rng());
    for (int l = 0; l < layers_; ++l) {
      for (int t = 0; t < n; ++t) {
        std::memcpy(&pool[(static_cast<size_t>(l) * tokens_ + slots[t]) * stride_],
                    &src[(static_cast<size_t>(l) * n + t) * rb], rb);
      }
    }
    EXPECT_EQ(cudaMemcpy(d_pool_, pool.data(), pool.size(), cudaMemcpyHostToDevice), cudaSuccess);
    Upload(slots);
    return slots;
  }
  void Upload(const std::vector<int32_t>& index) {
    EXPECT_EQ(cudaMemcpy(d_index_, index.data(), index.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  }
  IndexedStoreDesc Desc(const StoreWorld& w, int row, int first_layer, int num_layers, int start, int n,
                        int after) const {
    IndexedStoreDesc d{};
    d.arena = w.gpu_;
    d.host = w.GpuHost();
    d.row = row;
    d.first_layer = first_layer;
    d.num_layers = num_layers;
    d.start_pos = start;
    d.num_tokens = n;
    d.seq_len_after = after;
    d.src_base = d_pool_ + static_cast<size_t>(first_layer) * tokens_ * stride_;
    d.src_index = d_index_;
    d.src_tokens = tokens_;
    d.src_layer_stride = static_cast<int64_t>(tokens_) * stride_;
    d.src_token_stride = stride_;
    d.check = d_check_;
    d.error_flags = d_err_;
    return d;
  }
  uint32_t TakeErrors() {
    uint32_t e = 0;
    EXPECT_EQ(cudaMemcpy(&e, d_err_, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemset(d_err_, 0, 4), cudaSuccess);
    return e;
  }

  int layers_, tokens_;
  int64_t stride_;
  uint8_t* d_pool_ = nullptr;
  int32_t* d_index_ = nullptr;
  uint32_t* d_err_ = nullptr;
  uint32_t* d_check_ = nullptr;
};

// Chunked prefill (within B, across B, long, re-stores of resident positions, empty, the newest
// token in range) by index, every chunk in two layer ranges, against the plain reference store of
// the same records: arenas and host pools stay byte-identical.
TEST(IndexedStoreGpu, EqualsThePlainStoreOfTheSameRecords) {
  REQUIRE_GPU();
  const int L = 3, B = 512, k = 256, cap = 2048, pool_tokens = 3000;
  const uint32_t rb = 656;
  StoreWorld w(4, L, B, k, rb, cap);
  ASSERT_NO_FATAL_FAILURE(w.Init());
  PagedPool pool(L, pool_tokens, rb + 48);
  ASSERT_NO_FATAL_FAILURE(pool.Init());
  struct Case {
    int row, start, n, after;
  };
  const Case cases[] = {{0, 0, 100, 300},  {0, 100, 200, 300}, {0, 300, 300, 700}, {1, 0, 1200, 1200}, {2, 0, 512, 512},
                        {2, 100, 50, 512}, {3, 0, 0, 1},       {3, 0, 10, 10},     {1, 600, 400, 1300}};
  for (const Case& c : cases) {
    std::vector<uint8_t> src(static_cast<size_t>(L) * c.n * rb);
    for (auto& b : src) b = static_cast<uint8_t>(w.rng_());
    pool.Scatter(src, c.n, rb, w.rng_);
    StoreDesc rd{w.ref_, w.RefHost(), c.row, c.start, c.n, c.after, src.data(), static_cast<int64_t>(c.n) * rb, rb};
    ASSERT_EQ(StoreReference(rd), 0u);
    CUDA_OK(LaunchStoreIndexed(pool.Desc(w, c.row, 0, 1, c.start, c.n, c.after), 0));
    CUDA_OK(LaunchStoreIndexed(pool.Desc(w, c.row, 1, L - 1, c.start, c.n, c.after), 0));
    ASSERT_NO_FATAL_FAILURE(
        w.Compare("indexed store row " + std::to_string(c.row) + " start " + std::to_string(c.start)));
    EXPECT_EQ(pool.TakeErrors(), 0u);
  }
}

// One CUDA graph of an indexed store, replayed with new index contents: valid chunks match the
// reference; a chunk with one index out of range writes nothing (host pool, slots, tables) and
// flags kResolveBadIndex; the next valid replay works again (the check word needs no reset).
TEST(IndexedStoreGpu, GraphReplayAndBadIndexWritesNothing) {
  REQUIRE_GPU();
  const int L = 2, B = 256, k = 128, cap = 1024, pool_tokens = 700, n = 300;
  const uint32_t rb = 1152;
  StoreWorld w(2, L, B, k, rb, cap);
  ASSERT_NO_FATAL_FAILURE(w.Init());
  PagedPool pool(L, pool_tokens, rb);
  ASSERT_NO_FATAL_FAILURE(pool.Init());
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraphExec_t exec;
  {
    cudaGraph_t graph;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CUDA_OK(LaunchStoreIndexed(pool.Desc(w, 1, 0, L, 0, n, n), s));
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphDestroy(graph));
  }
  for (int round = 0; round < 6; ++round) {
    std::vector<uint8_t> src(static_cast<size_t>(L) * n * rb);
    for (auto& b : src) b = static_cast<uint8_t>(w.rng_());
    std::vector<int32_t> index = pool.Scatter(src, n, rb, w.rng_);
    const bool bad = round % 2 == 1;
    if (bad) {
      index[round == 1 ? n - 1 : round == 3 ? 0 : n / 2] = round == 5 ? -1 : pool_tokens + round;
      pool.Upload(index);
      // What the reference says of the same input (it writes nothing either).
      std::vector<uint8_t> host_pool(pool.Bytes());
      IndexedStoreDesc rd{};
      rd.arena = w.ref_;
      rd.host = w.RefHost();
      rd.row = 1;
      rd.num_layers = L;
      rd.num_tokens = n;
      rd.seq_len_after = n;
      rd.src_base = host_pool.data();
      rd.src_index = index.data();
      rd.src_tokens = pool_tokens;
      rd.src_layer_stride = static_cast<int64_t>(pool_tokens) * rb;
      rd.src_token_stride = rb;
      ASSERT_EQ(IndexedStoreReference(rd), static_cast<uint32_t>(kResolveBadIndex));
    } else {
      StoreDesc rd{w.ref_, w.RefHost(), 1, 0, n, n, src.data(), static_cast<int64_t>(n) * rb, rb};
      ASSERT_EQ(StoreReference(rd), 0u);
    }
    CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaStreamSynchronize(s));
    ASSERT_NO_FATAL_FAILURE(w.Compare("graph round " + std::to_string(round)));
    EXPECT_EQ(pool.TakeErrors(), bad ? static_cast<uint32_t>(kResolveBadIndex) : 0u) << "round " << round;
  }
  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(s);
}

// Input the host can see is refused before any launch, with the reason.
TEST(IndexedStoreGpu, RejectsBadRangesOnHost) {
  REQUIRE_GPU();
  StoreWorld w(2, 3, 256, 128, 64, 512);
  ASSERT_NO_FATAL_FAILURE(w.Init());
  PagedPool pool(3, 64, 64);
  ASSERT_NO_FATAL_FAILURE(pool.Init());
  auto refused = [&](IndexedStoreDesc d, const char* why) {
    EXPECT_EQ(LaunchStoreIndexed(d, 0), cudaErrorInvalidValue) << why;
    EXPECT_NE(std::string(LastLaunchError()).find(why), std::string::npos) << LastLaunchError();
  };
  refused(pool.Desc(w, 0, 0, 0, 0, 8, 8), "layers");
  refused(pool.Desc(w, 0, 2, 2, 0, 8, 8), "layers");
  refused(pool.Desc(w, 0, 0, 3, -1, 8, 8), "negative");
  refused(pool.Desc(w, 0, 0, 3, 0, 8, 4), "seq_len_after");
  refused(pool.Desc(w, 5, 0, 3, 0, 8, 8), "row");
  IndexedStoreDesc d = pool.Desc(w, 0, 0, 3, 0, 8, 8);
  d.src_index = nullptr;
  refused(d, "src_index");
  d = pool.Desc(w, 0, 0, 3, 0, 8, 8);
  d.check = nullptr;
  refused(d, "check word");
  d = pool.Desc(w, 0, 0, 3, 0, 8, 8);
  d.src_token_stride = 72;
  refused(d, "16-byte");
  ASSERT_NO_FATAL_FAILURE(w.Compare("refused stores"));
}

// Paged host tables (pages of 7 records scattered over the pool; row 1's first 3 pages of every
// layer are row 0's, read-only): store, indexed store and append stay byte-equal with the
// reference, records crossing page borders included, and a write that touches a shared page
// anywhere in its range is refused by both, writes nothing (arena and both pools unchanged) and
// sets kResolveReadOnlyPage, while the other rows of an append proceed.
TEST(StoreGpu, PagedTablesAndReadOnlyPagesMatchReference) {
  REQUIRE_GPU();
  const int L = 3, B = 64, k = 32, cap = 600, pool_tokens = 800;
  const uint32_t rb = 656;
  StoreWorld w(4, L, B, k, rb, cap);
  ASSERT_NO_FATAL_FAILURE(w.Init(/*records_per_page=*/7, /*shared=*/3));  // row 1: positions 0..20 shared
  const int max_tokens = 500;
  std::vector<uint8_t> src(static_cast<size_t>(rb) * max_tokens * L);
  uint8_t *d_src = nullptr, *d_tok = nullptr;
  uint32_t* d_err = nullptr;
  CUDA_OK(cudaMalloc(&d_src, src.size()));
  CUDA_OK(cudaMalloc(&d_err, 4));
  auto take_err = [&] {
    uint32_t e = 0;
    EXPECT_EQ(cudaMemcpy(&e, d_err, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemset(d_err, 0, 4), cudaSuccess);
    return e;
  };
  CUDA_OK(cudaMemset(d_err, 0, 4));
  struct Case {
    int row, start, n, after;
    uint32_t want;
  };
  const uint32_t ro = kResolveReadOnlyPage;
  const Case cases[] = {{0, 0, 300, 300, 0},   {1, 0, 300, 300, ro}, {1, 21, 279, 300, 0}, {2, 0, 40, 40, 0},
                        {0, 300, 200, 500, 0}, {1, 20, 10, 300, ro}, {1, 14, 1, 300, ro},  {3, 3, 50, 53, 0}};
  int gen = 0;
  for (const Case& c : cases) {
    for (auto& b : src) b = static_cast<uint8_t>(w.rng_() + gen);
    ++gen;
    CUDA_OK(cudaMemcpy(d_src, src.data(), src.size(), cudaMemcpyHostToDevice));
    const int64_t lstride = static_cast<int64_t>(rb) * max_tokens;
    StoreDesc rd{w.ref_, w.RefHost(), c.row, c.start, c.n, c.after, src.data(), lstride, rb};
    const std::string what =
        "store row " + std::to_string(c.row) + " [" + std::to_string(c.start) + ", +" + std::to_string(c.n) + ")";
    ASSERT_EQ(StoreReference(rd), c.want) << what;
    CUDA_OK(LaunchStore(w.Gpu(rd, d_src, d_err), 0));
    ASSERT_NO_FATAL_FAILURE(w.Compare(what));
    EXPECT_EQ(take_err(), c.want) << what;
  }
  // Append: row 1's entry lands in a shared page (refused), the others proceed.
  const int max_batch = 4;
  const int64_t stride = rb;
  std::vector<uint8_t> tok(stride * max_batch);
  int32_t *d_batch, *d_rows, *d_seq;
  CUDA_OK(cudaMalloc(&d_batch, 4));
  CUDA_OK(cudaMalloc(&d_rows, max_batch * 4));
  CUDA_OK(cudaMalloc(&d_seq, max_batch * 4));
  CUDA_OK(cudaMalloc(&d_tok, tok.size()));
  const std::vector<std::vector<int32_t>> seqs = {{301, 15, 41, 54}, {501, 301, 42, 55}, {502, 21, 43, 56}};
  const uint32_t want[] = {ro, 0, ro};
  for (size_t step = 0; step < seqs.size(); ++step) {
    std::vector<int32_t> rws = {0, 1, 2, 3}, seq = seqs[step];
    for (auto& b : tok) b = static_cast<uint8_t>(w.rng_());
    int32_t hb = max_batch;
    uint32_t rerr = 0;
    const int layer = static_cast<int>(step) % L;
    AppendDesc rd{w.ref_, w.RefHost(), layer, max_batch, &hb, rws.data(), seq.data(), tok.data(), stride, &rerr};
    CUDA_OK(cudaMemcpy(d_batch, &hb, 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_rows, rws.data(), max_batch * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_seq, seq.data(), max_batch * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_tok, tok.data(), tok.size(), cudaMemcpyHostToDevice));
    AppendDesc gd{w.gpu_, w.GpuHost(), layer, max_batch, d_batch, d_rows, d_seq, d_tok, stride, d_err};
    AppendReference(rd);
    CUDA_OK(LaunchAppend(gd, 0));
    EXPECT_EQ(rerr, want[step]) << "append step " << step;
    EXPECT_EQ(take_err(), want[step]) << "append step " << step;
    ASSERT_NO_FATAL_FAILURE(w.Compare("paged append step " + std::to_string(step)));
  }
  // Indexed store through the same tables: a chunk over row 1's shared pages is refused whole,
  // one over row 3's pages equals the plain reference store of the same records.
  PagedPool pool(L, pool_tokens, rb);
  ASSERT_NO_FATAL_FAILURE(pool.Init());
  for (const Case& c : {Case{1, 10, 40, 300, ro}, Case{3, 0, 120, 120, 0}, Case{2, 35, 200, 235, 0}}) {
    std::vector<uint8_t> chunk(static_cast<size_t>(L) * c.n * rb);
    for (auto& b : chunk) b = static_cast<uint8_t>(w.rng_());
    pool.Scatter(chunk, c.n, rb, w.rng_);
    StoreDesc rd{w.ref_, w.RefHost(), c.row, c.start, c.n, c.after, chunk.data(), static_cast<int64_t>(c.n) * rb, rb};
    ASSERT_EQ(StoreReference(rd), c.want);
    CUDA_OK(LaunchStoreIndexed(pool.Desc(w, c.row, 0, L, c.start, c.n, c.after), 0));
    ASSERT_NO_FATAL_FAILURE(w.Compare("paged indexed store row " + std::to_string(c.row)));
    EXPECT_EQ(pool.TakeErrors(), c.want);
  }
  cudaFree(d_batch);
  cudaFree(d_rows);
  cudaFree(d_seq);
  cudaFree(d_tok);
  cudaFree(d_src);
  cudaFree(d_err);
}

}  // namespace
}  // namespace hisparse
