// GPU tests of the CUDA RESOLVE kernel against the CPU reference: for identical inputs both must
// leave identical slot tables, LRU orders, outputs, counters, error flags and record bytes (the
// store, append and reset kernels: store_gpu_test.cu). Every test skips when no CUDA device is
// present (CI has none).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_kernels.h"  // kernels/: the benchmark's memory floor, checked here
#include "gpu_test_util.h"
#include "hisparse/kernels/resolve_cuda.h"
#include "late_producer.cuh"
#include "stream_order.cuh"  // kernels/: LaunchInOrder, for the dependent of a RESOLVE

namespace hisparse {
namespace {

constexpr int32_t kPoison = 0x7f7f7f7f;

// Counts selections whose output slot does not hold the host record of the position.
__global__ void CheckOutputRecords(ArenaView a, HostRecordMap h, int layer, int batch, const int* rows,
                                   const int* positions, const int* out, unsigned long long* bad) {
  const int i = blockIdx.x;
  if (i >= batch) return;
  const int k = a.geometry.k, B = a.geometry.slots;
  const int lane = threadIdx.x & 31;
  for (int j = threadIdx.x >> 5; j < k; j += blockDim.x >> 5) {
    const int s = out[i * k + j];
    if (s < 0 || s >= B) continue;
    const int row = rows[i];
    const int p = positions[i * k + j];
    const uint4* rec = reinterpret_cast<const uint4*>(a.Record(row, layer, s));
    const uint4* host = reinterpret_cast<const uint4*>(h.Record(a.geometry, row, layer, p));
    bool diff = false;
    for (uint32_t u = lane; u < a.geometry.record_bytes / 16; u += 32) {
      const uint4 x = rec[u], y = host[u];
      diff |= x.x != y.x || x.y != y.y || x.z != y.z || x.w != y.w;
    }
    if (__any_sync(~0u, diff) && lane == 0) atomicAdd(bad, 1ull);
  }
}

struct Config {
  int k, B;
  uint32_t rb;
  int max_batch;
  int steps;
};

std::string Name(const Config& c) {
  return "k" + std::to_string(c.k) + "_B" + std::to_string(c.B) + "_rb" + std::to_string(c.rb) + "_mb" +
         std::to_string(c.max_batch);
}

// One session's worth of state twice: the reference arena in host memory, the GPU arena in
// device memory, one host pool in mapped pinned memory that both read.
class World {
 public:
  // with_plan: every launch (reference and GPU) records its MissPlan, and CompareStep holds the
  // two plans equal, padded entries' summaries included.
  explicit World(const Config& c, int layers = 2, uint64_t seed = 1, bool with_plan = false)
      : cfg_(c), layers_(layers), rng_(seed), with_plan_(with_plan) {}

  ~World() {
    cudaFreeHost(pool_);
    cudaFree(gpu_arena_);
    cudaFree(ws_);
    cudaFree(d_base_);
    cudaFree(d_cap_);
    cudaFree(d_batch_);
    cudaFree(d_rows_);
    cudaFree(d_seq_);
    cudaFree(d_pos_);
    cudaFree(d_out_);
    cudaFree(d_err_);
    cudaFree(d_bad_);
    cudaFree(d_plan_);
    cudaFree(d_pt_);
    std::free(ref_arena_);
  }

  void Init() {
    g_ = ArenaGeometry{cfg_.max_batch + 6, layers_, cfg_.B, cfg_.k, cfg_.rb};
    off_ = ComputeArenaOffsets(g_);
    cap_ = std::max(2 * cfg_.B, cfg_.B + 2 * cfg_.k) + cfg_.steps + 64;
    // Contiguous: one run of cap_ records per (row, layer). Paged: pages of R records dealt in
    // random order over the pool; row 1's first pages are row 0's, read-only (shared).
    if (records_per_page_ == kContiguousRecordsPerPage) {
      ppe_ = 1;
    } else {
      ppe_ = (static_cast<uint32_t>(cap_) + records_per_page_ - 1) / records_per_page_;
    }
    const size_t page = static_cast<size_t>(std::min<uint32_t>(records_per_page_, cap_)) * cfg_.rb;
    const size_t pages = static_cast<size_t>(g_.max_rows) * layers_ * ppe_;
    pool_bytes_ = page * pages;
    CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&pool_), pool_bytes_, cudaHostAllocMapped | cudaHostAllocPortable));
    uint64_t* w = reinterpret_cast<uint64_t*>(pool_);
    for (size_t i = 0; i < pool_bytes_ / 8; ++i) w[i] = (i + 1) * 0x9E3779B97F4A7C15ull ^ (i >> 7);
    uint8_t* pool_dev = nullptr;
    CUDA_OK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&pool_dev), pool_, 0));
    std::vector<size_t> order(pages);
    std::iota(order.begin(), order.end(), 0);
    if (ppe_ > 1) std::shuffle(order.begin(), order.end(), rng_);
    base_h_.resize(pages);
    std::vector<uint8_t*> base_d(pages);
    for (size_t i = 0; i < pages; ++i) {
      base_h_[i] = pool_ + order[i] * page;
      base_d[i] = pool_dev + order[i] * page;
    }
    for (int l = 0; l < layers_ && g_.max_rows >= 2; ++l) {
      for (int pg = 0; pg < shared_pages_; ++pg) {
        const size_t from = static_cast<size_t>(l) * ppe_ + pg, to = (static_cast<size_t>(layers_) + l) * ppe_ + pg;
        base_h_[to] = HostRecordMap::ReadOnlyEntry(base_h_[from]);
        base_d[to] = HostRecordMap::ReadOnlyEntry(base_d[from]);
      }
    }
    caps_.assign(g_.max_rows, cap_);
    CUDA_OK(cudaMalloc(&d_base_, base_d.size() * sizeof(uint8_t*)));
    CUDA_OK(cudaMemcpy(d_base_, base_d.data(), base_d.size() * sizeof(uint8_t*), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc(&d_cap_, caps_.size() * 4));
    CUDA_OK(cudaMemcpy(d_cap_, caps_.data(), caps_.size() * 4, cudaMemcpyHostToDevice));

    ref_arena_ = static_cast<uint8_t*>(std::aligned_alloc(256, off_.total_bytes));
    ASSERT_NE(ref_arena_, nullptr);
    std::memset(ref_arena_, 0, off_.total_bytes);
    ref_ = ArenaView::Of(ref_arena_, g_);
    seq_.assign(g_.max_rows, 0);
    prev_.assign(static_cast<size_t>(g_.max_rows) * layers_, {});
    for (int r = 0; r < g_.max_rows; ++r) {
      seq_[r] = std::uniform_int_distribution<int>(cfg_.k / 2 + 1, cap_ - cfg_.steps - 2)(rng_);
      for (int l = 0; l < layers_; ++l) RandomState(r, l);
    }
    CUDA_OK(cudaMalloc(&gpu_arena_, off_.total_bytes));
    CUDA_OK(cudaMemcpy(gpu_arena_, ref_arena_, off_.total_bytes, cudaMemcpyHostToDevice));
    gpu_ = ArenaView::Of(gpu_arena_, g_);

    ws_bytes_ = ResolveWorkspaceBytes(g_, cfg_.max_batch);
    CUDA_OK(cudaMalloc(&ws_, ws_bytes_));
    CUDA_OK(InitResolveWorkspace(ws_, ws_bytes_, 0));
    const size_t sel = static_cast<size_t>(cfg_.max_batch) * cfg_.k;
    CUDA_OK(cudaMalloc(&d_batch_, 4));
    CUDA_OK(cudaMalloc(&d_rows_, cfg_.max_batch * 4));
    CUDA_OK(cudaMalloc(&d_seq_, cfg_.max_batch * 4));
    CUDA_OK(cudaMalloc(&d_pos_, sel * 4));
    CUDA_OK(cudaMalloc(&d_out_, sel * 4));
    CUDA_OK(cudaMalloc(&d_err_, 4));
    CUDA_OK(cudaMalloc(&d_bad_, 8));
    rows_.assign(cfg_.max_batch, 0);
    seqs_.assign(cfg_.max_batch, 0);
    pos_.assign(sel, 0);
    if (with_plan_) {
      plan_bytes_ = MissPlan::Bytes(g_, cfg_.max_batch);
      CUDA_OK(cudaMalloc(&d_plan_, plan_bytes_));
      ref_plan_.assign((plan_bytes_ + 3) / 4, kPoison);
    }
    if (pt_records_ > 0) {
      CUDA_OK(cudaMalloc(&d_pt_, sel * 4));
      ref_pt_.assign(sel, kPoison);
    }
  }

  // Before Init: host records in pages of `records_per_page` scattered over the pool, the first
  // `shared` pages of row 1 mapping row 0's read-only.
  void WithPagedHost(uint32_t records_per_page, int shared) {
    records_per_page_ = records_per_page;
    shared_pages_ = shared;
  }
  HostRecordMap RefHost() const { return HostRecordMap{base_h_.data(), caps_.data(), records_per_page_, ppe_}; }
  HostRecordMap GpuHost() const { return HostRecordMap{d_base_, d_cap_, records_per_page_, ppe_}; }

  // Before Init: every launch also writes rule 9's page table (pages of `records` from page
  // `offset`); no_out: and no out_slots at all (the page table alone).
  void WithPageTable(int records, int offset, bool no_out) {
    pt_records_ = records;
    pt_offset_ = offset;
    no_out_ = no_out;
  }

  // A valid random state of (row, layer): a random subset of [0, seq) resident in random slots
  // (sometimes the prefill layout), EMPTY slots first in a random LRU order.
  void RandomState(int r, int l) {
    const int B = cfg_.B, seq = seq_[r];
    int32_t* sp = ref_.SlotPos(r, l);
    int32_t* lru = ref_.Lru(r, l);
    std::vector<int32_t> order(B);
    std::iota(order.begin(), order.end(), 0);
    if (seq <= B && Bern(0.5)) {
      for (int s = 0; s < B; ++s) {
        sp[s] = s < seq ? s : kEmptySlot;
        lru[s] = s < B - seq ? seq + s : s - (B - seq);
      }
    } else {
      const int filled = std::min(B, std::max(1, static_cast<int>(std::min(B, seq) * Uni(0.5, 1.0))));
      std::vector<int32_t> ps = Distinct(filled, seq);
      std::shuffle(order.begin(), order.end(), rng_);
      for (int s = 0; s < B; ++s) sp[s] = kEmptySlot;
      for (int i = 0; i < filled; ++i) sp[order[i]] = ps[i];
      // LRU: empty slots first, then filled in random order.
      std::vector<int32_t> empties, full;
      for (int s = 0; s < B; ++s) (sp[s] == kEmptySlot ? empties : full).push_back(s);
      std::shuffle(empties.begin(), empties.end(), rng_);
      std::shuffle(full.begin(), full.end(), rng_);
      int n = 0;
      for (int s : empties) lru[n++] = s;
      for (int s : full) lru[n++] = s;
    }
    for (int s = 0; s < B; ++s) {
      if (sp[s] != kEmptySlot) {
        std::memcpy(ref_.Record(r, l, s), HostRec(r, l, sp[s]), cfg_.rb);
      }
    }
  }

  uint8_t* HostRec(int r, int l, int p) { return RefHost().Record(g_, r, l, p); }
  bool Bern(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  double Uni(double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng_); }
  int UniI(int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng_); }

  // n distinct positions in [0, seq).
  std::vector<int32_t> Distinct(int n, int seq) {
    std::vector<int32_t> out;
    if (n * 2 > seq) {
      out.resize(seq);
      std::iota(out.begin(), out.end(), 0);
      std::shuffle(out.begin(), out.end(), rng_);
      out.resize(n);
      return out;
    }
    mark_.assign(seq, 0);
    while (static_cast<int>(out.size()) < n) {
      const int p = UniI(0, seq - 1);
      if (!mark_[p]) {
        mark_[p] = 1;
        out.push_back(p);
      }
    }
    return out;
  }

  // A selection with locality to the previous step of (row, layer), or fully random.
  void Select(int r, int l, int seq, int32_t* sel) {
    const int k = cfg_.k;
    std::vector<int32_t>& prev = prev_[ref_.RowLayer(r, l)];
    mark_.assign(seq, 0);
    std::vector<int32_t> out;
    out.reserve(k);
    const int npad = Bern(0.2) ? UniI(0, k / 8) : 0;
    const int want = std::min(k - npad, seq);
    if (!prev.empty() && Bern(0.85)) {
      const double keep = Uni(0.3, 0.97);
      for (int32_t p : prev) {
        if (p >= 0 && p < seq && !mark_[p] && Bern(keep) && static_cast<int>(out.size()) < want) {
          mark_[p] = 1;
          out.push_back(p);
        }
      }
      // Neighbours of kept positions.
      const size_t kept = out.size();
      for (size_t i = 0; i < kept && static_cast<int>(out.size()) < want; ++i) {
        if (!Bern(0.1)) continue;
        const int p = out[i] + UniI(-3, 3);
        if (p >= 0 && p < seq && !mark_[p]) {
          mark_[p] = 1;
          out.push_back(p);
        }
      }
    }
    if (Bern(0.5) && !mark_[seq - 1] && static_cast<int>(out.size()) < want) {
      mark_[seq - 1] = 1;
      out.push_back(seq - 1);
    }
    if (static_cast<int>(out.size()) < want) {
      if ((want - static_cast<int>(out.size())) * 2 > seq - static_cast<int>(out.size())) {
        for (int p = 0; p < seq && static_cast<int>(out.size()) < want; ++p) {
          if (!mark_[p]) {
            mark_[p] = 1;
            out.push_back(p);
          }
        }
      } else {
        while (static_cast<int>(out.size()) < want) {
          const int p = UniI(0, seq - 1);
          if (!mark_[p]) {
            mark_[p] = 1;
            out.push_back(p);
          }
        }
      }
    }
    if (!Bern(0.2)) std::shuffle(out.begin(), out.end(), rng_);
    prev = out;
    while (static_cast<int>(out.size()) < k) {
      out.insert(out.begin() + UniI(0, static_cast<int>(out.size())), kPadding);
    }
    std::copy(out.begin(), out.end(), sel);
  }

  // Rule 10, as engines leave their buffers: entry i becomes vLLM's padded entry (row -1, garbage
  // beside it), or, for a row shorter than k, its selections move to the first seq_len columns and
  // the rest hold what SGLang's reused top-k buffer may hold (stale duplicates, positions past
  // seq_len, values below -1). Neither is an error.
  void EnginePadding(int i, int32_t* sel) {
    const int k = cfg_.k, seq = seqs_[i];
    if (Bern(0.5)) {
      rows_[i] = kPadding;
      seqs_[i] = -7;
      for (int j = 0; j < k; ++j) sel[j] = j % 3 == 0 ? 1 : -1000 - j;
      return;
    }
    if (seq >= k) return;
    std::stable_partition(sel, sel + k, [](int32_t v) { return v != kPadding; });
    for (int j = seq; j < k; ++j) {
      switch (UniI(0, 2)) {
        case 0:
          sel[j] = sel[UniI(0, seq - 1)];
          break;
        case 1:
          sel[j] = seq + UniI(0, 9);
          break;
        default:
          sel[j] = -2 - UniI(0, 9);
      }
    }
  }

  // Fills the per-batch inputs of one step. invalid_p: chance that a row gets a bad input.
  int MakeStep(int batch, double invalid_p) {
    std::vector<int> perm(g_.max_rows);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng_);
    const int k = cfg_.k;
    for (int i = 0; i < cfg_.max_batch; ++i) {
      int32_t* sel = &pos_[static_cast<size_t>(i) * k];
      if (i >= batch) {  // padding garbage: must be ignored
        rows_[i] = -5 - i;
        seqs_[i] = -1;
        for (int j = 0; j < k; ++j) sel[j] = -1000 - j;
        continue;
      }
      const int r = perm[i];
      if (Bern(0.5) && seq_[r] < cap_) ++seq_[r];
      rows_[i] = r;
      seqs_[i] = seq_[r];
      Select(r, layer_, seq_[r], sel);
      if (Bern(engine_padding_p_)) {
        EnginePadding(i, sel);
        continue;
      }
      if (Bern(invalid_p)) {
        switch (UniI(0, 4)) {
          case 0:
            rows_[i] = Bern(0.5) ? -1 : g_.max_rows + UniI(0, 3);
            break;
          case 1:
            seqs_[i] = Bern(0.5) ? 0 : cap_ + 1;
            break;
          case 2:
            sel[UniI(0, k - 1)] = Bern(0.5) ? seqs_[i] + UniI(0, 5) : -2 - UniI(0, 5);
            break;
          case 3: {
            int a = UniI(0, k - 1), b = UniI(0, k - 1);
            if (a != b && sel[a] >= 0)
              sel[b] = sel[a];
            else
              sel[UniI(0, k - 1)] = seqs_[i];
            break;
          }
          default:
            seqs_[i] = std::max(1, seqs_[i] - UniI(1, 4));  // positions may now be >= seq
        }
      }
    }
    return batch;
  }

  ResolveDesc RefDesc(int32_t* batch, int32_t* out, uint32_t* err, uint32_t flags) {
    ResolveDesc d{};
    d.arena = ref_;
    d.host = RefHost();
    d.layer = layer_;
    d.max_batch = LaunchMaxBatch();
    d.batch_size = batch;
    d.rows = rows_.data();
    d.seq_lens = seqs_.data();
    d.positions = pos_.data();
    d.out_slots = out;
    d.error_flags = err;
    d.flags = flags;
    if (with_plan_) d.plan = MissPlan::Of(ref_plan_.data(), cfg_.max_batch);
    if (no_out_) d.out_slots = nullptr;
    if (pt_records_ > 0) {
      d.page_table = ref_pt_.data();
      d.page_records = pt_records_;
      d.page_offset = pt_offset_;
    }
    return d;
  }
  ResolveDesc GpuDesc(uint32_t flags) {
    ResolveDesc d{};
    d.arena = gpu_;
    d.host = GpuHost();
    d.layer = layer_;
    d.max_batch = LaunchMaxBatch();
    d.batch_size = d_batch_;
    d.rows = d_rows_;
    d.seq_lens = d_seq_;
    d.positions = d_pos_;
    d.out_slots = d_out_;
    d.error_flags = d_err_;
    d.flags = flags;
    if (with_plan_) d.plan = MissPlan::Of(d_plan_, cfg_.max_batch);
    if (no_out_) d.out_slots = nullptr;
    if (pt_records_ > 0) {
      d.page_table = d_pt_;
      d.page_records = pt_records_;
      d.page_offset = pt_offset_;
    }
    return d;
  }

  void Upload(int batch) {
    CUDA_OK(cudaMemcpy(d_batch_, &batch, 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_rows_, rows_.data(), rows_.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_seq_, seqs_.data(), seqs_.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_pos_, pos_.data(), pos_.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d_out_, 0x7f, pos_.size() * 4));
    CUDA_OK(cudaMemset(d_err_, 0, 4));
    if (with_plan_) {
      CUDA_OK(cudaMemset(d_plan_, 0x7f, plan_bytes_));
      std::fill(ref_plan_.begin(), ref_plan_.end(), kPoison);
    }
    if (pt_records_ > 0) {
      CUDA_OK(cudaMemset(d_pt_, 0x7f, pos_.size() * 4));
      std::fill(ref_pt_.begin(), ref_pt_.end(), kPoison);
    }
  }

  // Runs the reference for the current inputs and compares with what the GPU left.
  void CompareStep(int batch, uint32_t flags, const std::string& what) {
    std::vector<int32_t> ref_out(pos_.size(), kPoison);
    uint32_t ref_err = 0;
    int32_t b = batch;
    const uint32_t ret = ResolveReference(RefDesc(&b, ref_out.data(), &ref_err, flags));
    EXPECT_EQ(ret, ref_err);
    std::vector<int32_t> out(pos_.size());
    uint32_t err = 0;
    CUDA_OK(cudaMemcpy(out.data(), d_out_, out.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(&err, d_err_, 4, cudaMemcpyDeviceToHost));
    ASSERT_EQ(err, ref_err) << what;
    for (size_t x = 0; x < out.size(); ++x) {
      ASSERT_EQ(out[x], ref_out[x]) << what << ": out_slots[" << x / cfg_.k << "][" << x % cfg_.k << "] (batch "
                                    << batch << ")";
    }
    // Rule 7: every column of every entry past the batch is kPadding (the GPU's buffer was
    // poisoned before the launch, so an entry left alone fails here).
    const int active = std::max(0, std::min(batch, LaunchMaxBatch()));
    const size_t launched = static_cast<size_t>(LaunchMaxBatch()) * cfg_.k;  // entries past it stay poisoned
    for (size_t x = static_cast<size_t>(active) * cfg_.k; x < launched && !no_out_; ++x) {
      ASSERT_EQ(out[x], kPadding) << what << ": padded out_slots[" << x / cfg_.k << "][" << x % cfg_.k << "] (batch "
                                  << batch << ")";
    }
    if (with_plan_) ASSERT_NO_FATAL_FAILURE(ComparePlans(active, what));
    if (pt_records_ > 0) ASSERT_NO_FATAL_FAILURE(ComparePageTables(active, ref_out, what));
    CompareTables(what);
    if (!(flags & kResolveFlagNoFetch) && !no_out_) {
      CUDA_OK(cudaMemset(d_bad_, 0, 8));
      CheckOutputRecords<<<cfg_.max_batch, 256>>>(gpu_, GpuHost(), layer_, batch, d_rows_, d_pos_, d_out_, d_bad_);
      CUDA_OK(cudaGetLastError());
      unsigned long long bad = 0;
      CUDA_OK(cudaMemcpy(&bad, d_bad_, 8, cudaMemcpyDeviceToHost));
      ASSERT_EQ(bad, 0ull) << what << ": output slots whose record differs from the host pool";
    }
  }

  // Rule 8: the GPU's page table equals the reference's entry for entry; every entry is -1 where
  // the reference's output is padding (and in padded entries), else O * P + g of its slot.
  void ComparePageTables(int active, const std::vector<int32_t>& ref_out, const std::string& what) {
    std::vector<int32_t> gpu(ref_pt_.size());
    CUDA_OK(cudaMemcpy(gpu.data(), d_pt_, gpu.size() * 4, cudaMemcpyDeviceToHost));
    for (size_t x = 0; x < gpu.size(); ++x) {
      ASSERT_EQ(gpu[x], ref_pt_[x]) << what << ": page_table[" << x / cfg_.k << "][" << x % cfg_.k << "]";
      const int i = static_cast<int>(x / cfg_.k);
      if (i >= active) ASSERT_EQ(gpu[x], kPadding) << what << ": padded page_table[" << i << "]";
      if (!no_out_ && ref_out[x] >= 0) {
        const int64_t g = (static_cast<int64_t>(rows_[i]) * layers_ + layer_) * (cfg_.B + 1) + ref_out[x];
        ASSERT_EQ(gpu[x], static_cast<int64_t>(pt_offset_) * pt_records_ + g) << what;
      }
    }
  }

  // The GPU's MissPlan against the reference's: *batch, every entry's summary (padded entries'
  // (kPadding, -1, 0) included) and the miss records of every resolved entry.
  void ComparePlans(int active, const std::string& what) {
    std::vector<int32_t> gpu(ref_plan_.size());
    CUDA_OK(cudaMemcpy(gpu.data(), d_plan_, plan_bytes_, cudaMemcpyDeviceToHost));
    const MissPlan gp = MissPlan::Of(gpu.data(), cfg_.max_batch);
    const MissPlan rp = MissPlan::Of(ref_plan_.data(), cfg_.max_batch);
    ASSERT_EQ(*gp.batch, *rp.batch) << what;
    ASSERT_EQ(*rp.batch, active) << what;
    for (int i = 0; i < cfg_.max_batch; ++i) {
      for (int f = 0; f < 3; ++f) {
        ASSERT_EQ(gp.summary[3 * i + f], rp.summary[3 * i + f]) << what << ": plan summary " << i << "." << f;
      }
      if (i >= active) {
        ASSERT_EQ(rp.summary[3 * i], kPadding) << what;
        ASSERT_EQ(rp.summary[3 * i + 1], -1) << what;
      }
      const int m = rp.summary[3 * i + 1];
      for (int x = 0; x < 2 * m; ++x) {
        const size_t e = static_cast<size_t>(i) * cfg_.k * 2 + x;
        ASSERT_EQ(gp.entries[e], rp.entries[e]) << what << ": plan entry " << i << " miss " << x / 2;
      }
    }
  }

  // Counters, slot tables and LRU orders of every row and layer.
  void CompareTables(const std::string& what) {
    std::vector<uint8_t> t(off_.records);
    CUDA_OK(cudaMemcpy(t.data(), gpu_arena_, t.size(), cudaMemcpyDeviceToHost));
    const ArenaCounters* c = reinterpret_cast<const ArenaCounters*>(t.data());
    const ArenaCounters* rc = ref_.counters;
    ASSERT_EQ(c->hits, rc->hits) << what;
    ASSERT_EQ(c->misses, rc->misses) << what;
    ASSERT_EQ(c->bytes_fetched, rc->bytes_fetched) << what;
    ASSERT_EQ(c->steps, rc->steps) << what;
    if (std::memcmp(t.data(), ref_arena_, t.size()) != 0) {
      for (size_t x = off_.slot_pos; x < t.size(); x += 4) {
        int32_t a, b;
        std::memcpy(&a, &t[x], 4);
        std::memcpy(&b, ref_arena_ + x, 4);
        if (a != b) {
          const bool in_lru = x >= off_.lru;
          const size_t e = (x - (in_lru ? off_.lru : off_.slot_pos)) / 4;
          FAIL() << what << ": " << (in_lru ? "lru" : "slot_pos") << " differs at row-layer " << e / cfg_.B << " index "
                 << e % cfg_.B << ": gpu " << a << " ref " << b;
        }
      }
    }
  }

  // Every byte of the two arenas (records of every slot included).
  void CompareWholeArena(const std::string& what) {
    std::vector<uint8_t> t(off_.total_bytes);
    CUDA_OK(cudaMemcpy(t.data(), gpu_arena_, t.size(), cudaMemcpyDeviceToHost));
    const size_t rec = static_cast<size_t>(cfg_.B + 1) * cfg_.rb;
    for (size_t x = off_.records; x < t.size(); x += rec) {
      const size_t n = std::min(rec, t.size() - x);
      ASSERT_EQ(std::memcmp(&t[x], ref_arena_ + x, n), 0)
          << what << ": records of row-layer " << (x - off_.records) / rec << " differ";
    }
    ASSERT_EQ(std::memcmp(t.data(), ref_arena_, off_.records), 0) << what;
  }

  Config cfg_;
  int layers_;
  std::mt19937_64 rng_;
  ArenaGeometry g_{};
  ArenaOffsets off_{};
  int cap_ = 0;
  uint8_t* pool_ = nullptr;
  size_t pool_bytes_ = 0;
  std::vector<uint8_t*> base_h_;  // the host page tables, host addresses ([rows * layers * ppe_])
  std::vector<int32_t> caps_;
  uint32_t records_per_page_ = kContiguousRecordsPerPage, ppe_ = 1;
  int shared_pages_ = 0;
  uint8_t** d_base_ = nullptr;
  int32_t* d_cap_ = nullptr;
  uint8_t* ref_arena_ = nullptr;
  void* gpu_arena_ = nullptr;
  ArenaView ref_{}, gpu_{};
  void* ws_ = nullptr;
  size_t ws_bytes_ = 0;
  int32_t *d_batch_ = nullptr, *d_rows_ = nullptr, *d_seq_ = nullptr, *d_pos_ = nullptr, *d_out_ = nullptr;
  uint32_t* d_err_ = nullptr;
  unsigned long long* d_bad_ = nullptr;
  std::vector<int32_t> seq_, rows_, seqs_, pos_;
  std::vector<std::vector<int32_t>> prev_;
  std::vector<char> mark_;
  bool with_plan_ = false;
  double engine_padding_p_ = 0;  // chance that an entry carries rule 10's padding (EnginePadding)
  void* d_plan_ = nullptr;
  size_t plan_bytes_ = 0;
  std::vector<int32_t> ref_plan_;
  // The descriptors' max_batch (0: cfg_.max_batch; a smaller one launches over the same
  // workspace and buffers, sized for cfg_.max_batch; not with a plan or a page table).
  int launch_max_batch_ = 0;
  int LaunchMaxBatch() const { return launch_max_batch_ > 0 ? launch_max_batch_ : cfg_.max_batch; }
  int pt_records_ = 0, pt_offset_ = 0;  // page table: 0 records = not written
  bool no_out_ = false;
  int32_t* d_pt_ = nullptr;
  std::vector<int32_t> ref_pt_;
  int layer_ = 0;
};

int RandomBatch(World& w) {
  const int mb = w.cfg_.max_batch;
  const double u = w.Uni(0, 1);
  if (u < 0.2) return mb;
  if (u < 0.4) return w.UniI(1, std::min(mb, 4));
  return w.UniI(1, mb);
}

class ResolveRandom : public ::testing::TestWithParam<Config> {};

// The same random steps over paged host tables: pages of a few records in random order over the
// pool, row 1's first pages shared read-only with row 0 (RESOLVE reads them freely). The kernel
// must stay bit-equal with the reference, miss records included (CheckOutputRecords reads through
// the same tables).
class ResolvePaged : public ::testing::TestWithParam<Config> {};

TEST_P(ResolvePaged, MatchesReference) {
  REQUIRE_GPU();
  const Config c = GetParam();
  for (const uint32_t records_per_page : {1u, 3u, 16u}) {
    World w(c, 2, 77 + c.k + c.B + c.rb + records_per_page);
    w.WithPagedHost(records_per_page, /*shared=*/4);
    w.WithPageTable(64, 5, /*no_out=*/false);
    ASSERT_NO_FATAL_FAILURE(w.Init());
    const std::string name = Name(c) + "_R" + std::to_string(records_per_page);
    for (int step = 0; step < c.steps; ++step) {
      w.layer_ = w.UniI(0, 1);
      const int batch = w.MakeStep(RandomBatch(w), 0.03);
      ASSERT_NO_FATAL_FAILURE(w.Upload(batch));
      CUDA_OK(LaunchResolve(w.GpuDesc(0), w.ws_, w.ws_bytes_, 0));
      CUDA_OK(cudaDeviceSynchronize());
      ASSERT_NO_FATAL_FAILURE(w.CompareStep(batch, 0, name + " step " + std::to_string(step)));
    }
    ASSERT_NO_FATAL_FAILURE(w.CompareWholeArena(name));
  }
}

INSTANTIATE_TEST_SUITE_P(Paged, ResolvePaged,
                         ::testing::Values(Config{8, 16, 48, 3, 40}, Config{64, 96, 656, 10, 30},
                                           Config{256, 320, 1152, 64, 12}, Config{2048, 2304, 656, 4, 4}),
                         [](const ::testing::TestParamInfo<Config>& i) { return Name(i.param); });

TEST_P(ResolveRandom, MatchesReference) {
  REQUIRE_GPU();
  const Config c = GetParam();
  World w(c, 2, 1234 + c.k + c.B + c.rb + c.max_batch);
  w.WithPageTable(64, 5, /*no_out=*/false);  // rule 9 besides the outputs, on every step
  ASSERT_NO_FATAL_FAILURE(w.Init());
  for (int step = 0; step < c.steps; ++step) {
    w.layer_ = w.UniI(0, 1);
    const int batch = w.MakeStep(RandomBatch(w), 0.03);
    ASSERT_NO_FATAL_FAILURE(w.Upload(batch));
    CUDA_OK(LaunchResolve(w.GpuDesc(0), w.ws_, w.ws_bytes_, 0));
    CUDA_OK(cudaDeviceSynchronize());
    ASSERT_NO_FATAL_FAILURE(w.CompareStep(batch, 0, Name(c) + " step " + std::to_string(step)));
  }
  ASSERT_NO_FATAL_FAILURE(w.CompareWholeArena(Name(c)));
}

INSTANTIATE_TEST_SUITE_P(Sweep, ResolveRandom,
                         ::testing::Values(Config{256, 256, 656, 256, 300}, Config{256, 512, 1152, 128, 300},
                                           Config{256, 1024, 656, 64, 250}, Config{256, 512, 16, 32, 200},
                                           Config{256, 512, 4112, 32, 100}, Config{2048, 2048, 1152, 8, 200},
                                           Config{2048, 4096, 656, 16, 120}, Config{2048, 8192, 1152, 8, 80},
                                           Config{2048, 4096, 512, 4, 60},
                                           // max_batch >= 64: the fetch in address order (step 5a)
                                           Config{2048, 4096, 656, 64, 30},
                                           // B 16384: the hash table of 4k entries does not fit beside
                                           // the tables, so the planner falls back to 2k (HashBitsFor)
                                           Config{2048, 16384, 656, 2, 12}),
                         [](const ::testing::TestParamInfo<Config>& i) { return Name(i.param); });

// A layer outside [0, num_layers) rejects every active row as kResolveBadRow, like the reference.
TEST(ResolveGpu, BadLayerRejectsEveryRow) {
  REQUIRE_GPU();
  World w(Config{256, 512, 656, 8, 4}, 2, 7);
  ASSERT_NO_FATAL_FAILURE(w.Init());
  w.layer_ = 0;
  const int batch = w.MakeStep(5, 0.0);
  ASSERT_NO_FATAL_FAILURE(w.Upload(batch));
  w.layer_ = 2;
  CUDA_OK(LaunchResolve(w.GpuDesc(0), w.ws_, w.ws_bytes_, 0));
  CUDA_OK(cudaDeviceSynchronize());
  ASSERT_NO_FATAL_FAILURE(w.CompareStep(batch, 0, "bad layer"));
  ASSERT_NO_FATAL_FAILURE(w.CompareWholeArena("bad layer"));
}

// Rows that miss exactly x of their k selections, x around the fetch split (SplitFetch): all of a
// row's misses in one-round own chunks (up to 16 * DirectRecords: 48 of 512 B, 32 of 656 B, 16 of
// 1152 B), one past that (the two-round own chunks and the queue), and many. Each step replaces
// the first x selections of every row with positions neither resident nor selected before, so the
// reference must count exactly batch * x misses; records, tables and counters match it.
TEST(ResolveGpu, ExactMissCountsAroundTheFetchSplit) {
  REQUIRE_GPU();
  for (const Config c : {Config{2048, 4096, 512, 4, 0}, Config{2048, 4096, 656, 4, 0}, Config{2048, 4096, 1152, 4, 0},
                         Config{2048, 4096, 4112, 2, 0}, Config{2048, 4096, 656, 64, 0}}) {
    World w(c, 1, 4242 + c.rb + c.max_batch);
    ASSERT_NO_FATAL_FAILURE(w.Init());
    // Every row's resident positions lie below its initial seq_len (< cap_), so all are valid.
    const int k = c.k, batch = c.max_batch, seq = w.cap_;
    std::vector<std::vector<int32_t>> sel(batch);
    std::vector<int> next(batch, 0);
    for (const int x : {k, 0, 1, 15, 16, 17, 31, 32, 33, 47, 48, 49, 95, 96, 97, 193, 200, 500}) {
      for (int i = 0; i < batch; ++i) {
        // Taken: resident in (row i, layer 0) now, selected before, or the newest token.
        std::vector<char> taken(seq, 0);
        const int32_t* sp = w.ref_.SlotPos(i, 0);
        for (int s = 0; s < c.B; ++s) {
          if (sp[s] >= 0 && sp[s] < seq) taken[sp[s]] = 1;
        }
        for (const int32_t p : sel[i]) taken[p] = 1;
        taken[seq - 1] = 1;
        if (sel[i].empty()) sel[i].assign(k, -1);
        for (int j = 0; j < x; ++j) {
          while (next[i] < seq && taken[next[i]]) ++next[i];
          ASSERT_LT(next[i], seq) << "ran out of fresh positions";
          sel[i][j] = next[i]++;
        }
        w.rows_[i] = i;
        w.seqs_[i] = seq;
        std::copy(sel[i].begin(), sel[i].end(), w.pos_.begin() + static_cast<size_t>(i) * k);
      }
      ASSERT_NO_FATAL_FAILURE(w.Upload(batch));
      CUDA_OK(LaunchResolve(w.GpuDesc(0), w.ws_, w.ws_bytes_, 0));
      CUDA_OK(cudaDeviceSynchronize());
      const std::string what = Name(c) + " misses " + std::to_string(x);
      const uint64_t misses_before = w.ref_.counters->misses;
      ASSERT_NO_FATAL_FAILURE(w.CompareStep(batch, 0, what));  // counters and records included
      ASSERT_EQ(w.ref_.counters->misses - misses_before, static_cast<uint64_t>(batch) * x) << what;
    }
    ASSERT_NO_FATAL_FAILURE(w.CompareWholeArena(Name(c)));
  }
}

// kResolveFlagNoFetch: tables and outputs as usual, no record bytes moved (the reference moves
// none either, so the whole arena still matches).
TEST(ResolveGpu, NoFetchPlansWithoutCopying) {
  REQUIRE_GPU();
  const Config c{2048, 4096, 1152, 8, 20};
  World w(c, 1, 99);
  ASSERT_NO_FATAL_FAILURE(w.Init());
  for (int step = 0; step < c.steps; ++step) {
    const int batch = w.MakeStep(RandomBatch(w), 0.0);
    ASSERT_NO_FATAL_FAILURE(w.Upload(batch));
    CUDA_OK(LaunchResolve(w.GpuDesc(kResolveFlagNoFetch), w.ws_, w.ws_bytes_, 0));
    CUDA_OK(cudaDeviceSynchronize());
    ASSERT_NO_FATAL_FAILURE(w.CompareStep(batch, kResolveFlagNoFetch, "nofetch"));
  }
  ASSERT_NO_FATAL_FAILURE(w.CompareWholeArena("nofetch"));
}

// One graph per layer of w, each capturing what `enqueue` (returning the launch's error) puts on
// stream s for w.layer_ = that layer.
template <class Enqueue>
void CaptureLayerGraphs(World& w, cudaStream_t s, Enqueue enqueue, std::vector<cudaGraphExec_t>* execs) {
  execs->assign(w.layers_, nullptr);
  for (int l = 0; l < w.layers_; ++l) {
    w.layer_ = l;
    cudaGraph_t graph;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CUDA_OK(enqueue());
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    CUDA_OK(cudaGraphInstantiate(&(*execs)[l], graph, 0));
    CUDA_OK(cudaGraphDestroy(graph));
  }
}

// One step of w.layer_: `enqueue` run eagerly, or that layer's captured graph replayed; then the
// step against the reference.
template <class Enqueue>
void RunStep(World& w, cudaStream_t s, bool eager, Enqueue enqueue, const std::vector<cudaGraphExec_t>& execs,
             int batch, int step) {
  if (eager) {
    CUDA_OK(enqueue());
  } else {
    CUDA_OK(cudaGraphLaunch(execs[w.layer_], s));
  }
  CUDA_OK(cudaStreamSynchronize(s));
  ASSERT_NO_FATAL_FAILURE(
      w.CompareStep(batch, 0, std::string(eager ? "eager" : "graph") + " step " + std::to_string(step)));
}

// One graph captured for max_batch, replayed with different *batch_size values (0 included),
// interleaved with eager launches on the same state: every step matches the reference.
TEST(ResolveGpu, GraphReplayMatchesEagerAndReference) {
  REQUIRE_GPU();
  const Config c{256, 512, 1152, 64, 40};
  World w(c, 2, 4242);
  ASSERT_NO_FATAL_FAILURE(w.Init());
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto enqueue = [&] { return LaunchResolve(w.GpuDesc(0), w.ws_, w.ws_bytes_, s); };
  std::vector<cudaGraphExec_t> execs;
  ASSERT_NO_FATAL_FAILURE(CaptureLayerGraphs(w, s, enqueue, &execs));
  const int batches[] = {64, 1, 7, 0, 33, 64, 2, 50};
  for (int step = 0; step < c.steps; ++step) {
    w.layer_ = step % 2;
    const int batch = w.MakeStep(batches[step % 8], 0.03);
    ASSERT_NO_FATAL_FAILURE(w.Upload(batch));
    ASSERT_NO_FATAL_FAILURE(RunStep(w, s, step % 3 == 2, enqueue, execs, batch, step));
  }
  ASSERT_NO_FATAL_FAILURE(w.CompareWholeArena("graph"));
  for (auto e : execs) cudaGraphExecDestroy(e);
  cudaStreamDestroy(s);
}

// A programmatic launch (ResolveLaunchConfig::order = LaunchOrder::kProgrammatic) behind a kernel that lets it
// launch at once but writes the selections only ~30 us later: every block must wait for that
// kernel before it reads anything, so each step, eager or replayed from a graph that captured
// both kernels, equals the reference for the selections the producer wrote (the positions buffer
// holds padding until then).
TEST(ResolveGpu, ProgrammaticLaunchWaitsForTheKernelBeforeIt) {
  REQUIRE_GPU();
  if (!testing::CanLaunchProgrammatic()) GTEST_SKIP() << "programmatic launches need compute capability 9.0";
  const Config c{2048, 4096, 656, 8, 16};
  World w(c, 2, 515);
  ASSERT_NO_FATAL_FAILURE(w.Init());
  ResolveLaunchConfig config;
  CUDA_OK(PrepareResolveLaunch(w.g_, &config));
  config.order = LaunchOrder::kProgrammatic;
  const size_t n = w.pos_.size();
  int32_t* src = nullptr;
  CUDA_OK(cudaMalloc(&src, n * 4));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto enqueue = [&] {
    testing::LaunchLateProducer(w.d_pos_, src, n, 30.0, s);
    return LaunchResolve(w.GpuDesc(0), w.ws_, w.ws_bytes_, config, s);
  };
  std::vector<cudaGraphExec_t> execs;
  ASSERT_NO_FATAL_FAILURE(CaptureLayerGraphs(w, s, enqueue, &execs));
  for (int step = 0; step < c.steps; ++step) {
    w.layer_ = step % 2;
    const int batch = w.MakeStep(RandomBatch(w), 0.03);
    ASSERT_NO_FATAL_FAILURE(w.Upload(batch));
    CUDA_OK(cudaMemcpy(src, w.d_pos_, n * 4, cudaMemcpyDeviceToDevice));
    CUDA_OK(cudaMemset(w.d_pos_, 0xff, n * 4));  // padding until the producer writes
    ASSERT_NO_FATAL_FAILURE(RunStep(w, s, step % 4 < 2, enqueue, execs, batch, step));
  }
  ASSERT_NO_FATAL_FAILURE(w.CompareWholeArena("programmatic"));
  for (auto e : execs) cudaGraphExecDestroy(e);
  cudaStreamDestroy(s);
  cudaFree(src);
}

// RESOLVE beside the kernel before it (LaunchOrder::kBeside), as an engine runs one range's RESOLVE
// beside another range's attention: the kernel before (NeighbourKernel) lets its dependents launch
// at once and then watches the arena's step counter. Each step, eager or replayed from a graph that
// captured the three kernels, RESOLVE must do its step while that kernel still runs (the counter
// advances under it), complete only after it (the kernel after RESOLVE finds its last write), and
// equal the reference. The budget of blocks leaves SMs to the kernel before, as an engine would.
// With early_dependents, a programmatic dependent of RESOLVE follows it (EarlyWatcherKernel).
void ExpectResolveBesideTheKernelBefore(uint64_t seed, bool early_dependents) {
  const Config c{2048, 4096, 656, 8, 16};
  World w(c, 2, seed);
  ASSERT_NO_FATAL_FAILURE(w.Init());
  ResolveLaunchConfig config;
  CUDA_OK(PrepareResolveLaunch(w.g_, &config));
  config.order = LaunchOrder::kBeside;
  config.max_blocks = 12;
  config.early_dependents = early_dependents;
  int* out = nullptr;
  CUDA_OK(cudaMalloc(&out, 5 * sizeof(int)));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto enqueue = [&] {
    const ResolveDesc d = w.GpuDesc(0);
    // With the watcher: 5 ms after RESOLVE's step, so that the watcher, launched when RESOLVE's
    // blocks have all started, finds the kernel before still running.
    testing::NeighbourKernel<<<1, 32, 0, s>>>(&d.arena.counters->steps, 20'000'000ull,
                                              early_dependents ? 5'000'000ull : 100'000ull, out);
    cudaError_t e = LaunchResolve(d, w.ws_, w.ws_bytes_, config, s);
    if (e == cudaSuccess && early_dependents) {
      e = internal::LaunchInOrder(testing::EarlyWatcherKernel, dim3(1), dim3(32), 0, s, true, out);
    }
    testing::FollowerKernel<<<1, 32, 0, s>>>(out);
    return e != cudaSuccess ? e : cudaGetLastError();
  };
  std::vector<cudaGraphExec_t> execs;
  ASSERT_NO_FATAL_FAILURE(CaptureLayerGraphs(w, s, enqueue, &execs));
  for (int step = 0; step < c.steps; ++step) {
    w.layer_ = step % 2;
    const int batch = w.MakeStep(RandomBatch(w), 0.0);
    ASSERT_NO_FATAL_FAILURE(w.Upload(batch));
    CUDA_OK(cudaMemset(out, 0, 5 * sizeof(int)));
    ASSERT_NO_FATAL_FAILURE(RunStep(w, s, step % 4 < 2, enqueue, execs, batch, step));
    int got[5];
    CUDA_OK(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost));
    EXPECT_EQ(got[0], 1) << "step " << step << ": RESOLVE did not run while the kernel before it ran";
    EXPECT_EQ(got[2], 1) << "step " << step << ": the kernel after RESOLVE ran before the kernel before it ended";
    if (early_dependents) {
      EXPECT_EQ(got[3], 1) << "step " << step << ": the dependent did not start before RESOLVE completed";
      EXPECT_EQ(got[4], 1) << "step " << step << ": the dependent's wait returned before RESOLVE completed";
    }
  }
  ASSERT_NO_FATAL_FAILURE(w.CompareWholeArena(early_dependents ? "early dependents" : "beside"));
  for (auto e : execs) cudaGraphExecDestroy(e);
  cudaStreamDestroy(s);
  cudaFree(out);
}

TEST(ResolveGpu, BesideLaunchRunsBesideTheKernelBeforeIt) {
  REQUIRE_GPU();
  if (!testing::CanLaunchProgrammatic()) GTEST_SKIP() << "programmatic launches need compute capability 9.0";
  ExpectResolveBesideTheKernelBefore(616, false);
}

// The same RESOLVE letting its dependents launch early (ResolveLaunchConfig::early_dependents),
// followed by a programmatic dependent (EarlyWatcherKernel): the dependent starts while RESOLVE has
// not completed (it runs beside RESOLVE, as an engine's indexer of the next rows would), its wait
// still returns only after RESOLVE's completion, and the kernel after finds everything complete.
TEST(ResolveGpu, EarlyDependentsRunBesideResolve) {
  REQUIRE_GPU();
  if (!testing::CanLaunchProgrammatic()) GTEST_SKIP() << "programmatic launches need compute capability 9.0";
  ExpectResolveBesideTheKernelBefore(717, true);
}

// One workspace under launches of different max_batch in turn, as an engine's graphs per padded
// batch size run (SGLang: 2, then 1 when a request finishes), every entry all or mostly misses
// so that each row queues chunks past its own warps': each step equals the reference. The queue
// once moved with max_batch, onto a larger launch's stale plan entries, and consumers took those
// as chunks of garbage batch entries (an illegal address in the SGLang adapter on the H200).
TEST(ResolveGpu, LaunchesOfDifferentMaxBatchShareOneWorkspace) {
  REQUIRE_GPU();
  const Config c{2048, 4096, 656, 8, 0};
  World w(c, 2, 4242);
  ASSERT_NO_FATAL_FAILURE(w.Init());
  const int max_batches[] = {8, 1, 4, 2, 8, 1, 3, 1, 2, 1, 8, 5};
  int step = 0;
  for (const int mb : max_batches) {
    w.launch_max_batch_ = mb;
    w.layer_ = step % 2;
    const int batch = w.MakeStep(mb, 0.0);
    ASSERT_NO_FATAL_FAILURE(w.Upload(batch));
    CUDA_OK(LaunchResolve(w.GpuDesc(0), w.ws_, w.ws_bytes_, 0));
    CUDA_OK(cudaDeviceSynchronize());
    ASSERT_NO_FATAL_FAILURE(
        w.CompareStep(batch, 0, "max_batch " + std::to_string(mb) + " step " + std::to_string(step++)));
  }
  ASSERT_NO_FATAL_FAILURE(w.CompareWholeArena("max_batch varies"));
}

// Rule 7 under a CUDA graph captured for a max_batch larger than the grid's row blocks (k = 2048:
// one or two blocks per SM, so a block plans several entries, real and padded): one graph and
// eager launches over device batch sizes from 0 to max_batch (and out of range), garbage in the
// padded entries' rows, seq_lens and positions. Outputs (every padded column kPadding), the miss
// plan (padded summaries (kPadding, -1, 0)), tables and counters equal the reference's each step.
TEST(ResolveGpu, PaddedEntriesPublishPaddingAtEveryBatchSize) {
  REQUIRE_GPU();
  const Config c{2048, 4096, 64, 300, 24};
  World w(c, 2, 7777, /*with_plan=*/true);
  w.WithPageTable(16, 7, /*no_out=*/false);
  ASSERT_NO_FATAL_FAILURE(w.Init());
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraphExec_t exec;
  w.layer_ = 1;
  {
    cudaGraph_t graph;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CUDA_OK(LaunchResolve(w.GpuDesc(0), w.ws_, w.ws_bytes_, s));
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphDestroy(graph));
  }
  // Around the grid's row-block count (one or two waves of 132 SMs on an H200), 0, all, beyond.
  const int batches[] = {300, 0, 1, 131, 133, 150, 264, 299, 7, 265, 0, 300};
  int step = 0;
  for (int batch : batches) {
    for (int way = 0; way < 2; ++way, ++step) {  // 0: the graph, 1: eager
      w.layer_ = way == 0 ? 1 : step % 2;
      w.MakeStep(batch, 0.03);
      ASSERT_NO_FATAL_FAILURE(w.Upload(batch));
      if (way == 0) {
        CUDA_OK(cudaGraphLaunch(exec, s));
      } else {
        CUDA_OK(LaunchResolve(w.GpuDesc(0), w.ws_, w.ws_bytes_, s));
      }
      CUDA_OK(cudaStreamSynchronize(s));
      ASSERT_NO_FATAL_FAILURE(w.CompareStep(batch, 0,
                                            std::string(way == 0 ? "graph" : "eager") + " batch " +
                                                std::to_string(batch) + " step " + std::to_string(step)));
    }
  }
  // A device batch size outside [0, max_batch] is clamped: -4 pads every entry, 400 covers all.
  for (int batch : {-4, 400}) {
    w.layer_ = 1;
    w.MakeStep(std::max(0, std::min(batch, c.max_batch)), 0.0);
    ASSERT_NO_FATAL_FAILURE(w.Upload(batch));
    CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaStreamSynchronize(s));
    ASSERT_NO_FATAL_FAILURE(w.CompareStep(batch, 0, "clamped batch " + std::to_string(batch)));
  }
  ASSERT_NO_FATAL_FAILURE(w.CompareWholeArena("padding"));
  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(s);
}

// Rule 10: rows of -1 inside the batch and garbage in columns at or past seq_len publish
// kPadding with no error bit, and everything else equals the reference: outputs, page table, miss
// plan, tables and counters, eager and under graph replay. Rows are short (seq_len from k / 2) so
// that many lists end before column k.
TEST(ResolveGpu, EnginePaddingPublishesPaddingWithoutErrors) {
  REQUIRE_GPU();
  for (const Config& c : {Config{2048, 4096, 656, 64, 30}, Config{256, 512, 1152, 16, 60}, Config{8, 16, 48, 5, 60}}) {
    World w(c, 2, 4242 + c.k, /*with_plan=*/true);
    w.WithPageTable(64, 3, /*no_out=*/false);
    w.engine_padding_p_ = 0.4;
    ASSERT_NO_FATAL_FAILURE(w.Init());
    for (int step = 0; step < c.steps; ++step) {
      w.layer_ = w.UniI(0, 1);
      const int batch = w.MakeStep(RandomBatch(w), 0.0);
      ASSERT_NO_FATAL_FAILURE(w.Upload(batch));
      CUDA_OK(LaunchResolve(w.GpuDesc(0), w.ws_, w.ws_bytes_, 0));
      CUDA_OK(cudaDeviceSynchronize());
      uint32_t err = 0;
      CUDA_OK(cudaMemcpy(&err, w.d_err_, 4, cudaMemcpyDeviceToHost));
      ASSERT_EQ(err, 0u) << Name(c) << " step " << step << ": engine padding raised an error";
      ASSERT_NO_FATAL_FAILURE(w.CompareStep(batch, 0, Name(c) + " step " + std::to_string(step)));
    }
    ASSERT_NO_FATAL_FAILURE(w.CompareWholeArena(Name(c)));
  }
}

// Rule 8 alone: no out_slots, the page table (plain record indices) of a graph and of eager
// launches over varying batch sizes and invalid rows equals the reference's, and the whole
// arena stays the reference's.
TEST(ResolveGpu, PageTableWithoutOutSlotsMatchesReference) {
  REQUIRE_GPU();
  const Config c{2048, 4096, 1152, 16, 30};
  World w(c, 2, 2468);
  w.WithPageTable(1, 0, /*no_out=*/true);
  ASSERT_NO_FATAL_FAILURE(w.Init());
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraphExec_t exec;
  w.layer_ = 0;
  {
    cudaGraph_t graph;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CUDA_OK(LaunchResolve(w.GpuDesc(0), w.ws_, w.ws_bytes_, s));
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphDestroy(graph));
  }
  for (int step = 0; step < c.steps; ++step) {
    const bool graph = step % 2 == 0;
    w.layer_ = graph ? 0 : 1;
    const int batch = w.MakeStep(step % 5 == 4 ? 0 : RandomBatch(w), 0.05);
    ASSERT_NO_FATAL_FAILURE(w.Upload(batch));
    if (graph) {
      CUDA_OK(cudaGraphLaunch(exec, s));
    } else {
      CUDA_OK(LaunchResolve(w.GpuDesc(0), w.ws_, w.ws_bytes_, s));
    }
    CUDA_OK(cudaStreamSynchronize(s));
    ASSERT_NO_FATAL_FAILURE(w.CompareStep(batch, 0, "page table only, step " + std::to_string(step)));
  }
  ASSERT_NO_FATAL_FAILURE(w.CompareWholeArena("page table only"));
  // Bad parameters are refused on the host.
  ResolveDesc d = w.GpuDesc(0);
  d.page_records = 0;
  EXPECT_EQ(LaunchResolve(d, w.ws_, w.ws_bytes_, s), cudaErrorInvalidValue);
  EXPECT_NE(std::string(LastLaunchError()).find("page_records"), std::string::npos) << LastLaunchError();
  d.page_records = 1 << 20;
  d.page_offset = 1 << 12;
  EXPECT_EQ(LaunchResolve(d, w.ws_, w.ws_bytes_, s), cudaErrorInvalidValue);
  EXPECT_NE(std::string(LastLaunchError()).find("overflow"), std::string::npos) << LastLaunchError();
  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(s);
}

// The device figures asked for once (PrepareResolveLaunch, as the CUDA backend does at session
// open) give the launches of the figures asked for at every launch: every step matches the
// reference, eager and graph-captured. A config prepared for another geometry is not used (the
// launcher asks the driver again), so a stale config cannot change a kernel's grid.
TEST(ResolveGpu, PreparedLaunchConfigMatchesReference) {
  REQUIRE_GPU();
  const Config c{2048, 4096, 656, 16, 40};
  World w(c, 2, 5150);
  ASSERT_NO_FATAL_FAILURE(w.Init());
  int dev = -1, sms = 0;
  CUDA_OK(cudaGetDevice(&dev));
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  ResolveLaunchConfig cfg;
  CUDA_OK(PrepareResolveLaunch(w.g_, &cfg));
  EXPECT_EQ(cfg.device, dev);
  EXPECT_EQ(cfg.sms, sms);
  EXPECT_EQ(cfg.k, c.k);
  EXPECT_EQ(cfg.slots, c.B);
  EXPECT_EQ(cfg.record_bytes, c.rb);
  EXPECT_GE(cfg.blocks_per_sm, 1);
  EXPECT_GT(cfg.smem, 0u);
  EXPECT_LE(cfg.smem, static_cast<unsigned>(cfg.smem_optin));
  ResolveLaunchConfig other;
  CUDA_OK(PrepareResolveLaunch(ArenaGeometry{4, 2, 512, 256, 1152}, &other));

  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraphExec_t exec;
  w.layer_ = 0;
  {
    cudaGraph_t graph;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CUDA_OK(LaunchResolve(w.GpuDesc(0), w.ws_, w.ws_bytes_, cfg, s));
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphDestroy(graph));
  }
  for (int step = 0; step < c.steps; ++step) {
    const int how = step % 3;  // 0: the prepared config, 1: another geometry's, 2: the captured graph
    w.layer_ = how == 2 ? 0 : step % 2;
    const int batch = w.MakeStep(RandomBatch(w), 0.03);
    ASSERT_NO_FATAL_FAILURE(w.Upload(batch));
    if (how == 2) {
      CUDA_OK(cudaGraphLaunch(exec, s));
    } else {
      CUDA_OK(LaunchResolve(w.GpuDesc(0), w.ws_, w.ws_bytes_, how == 0 ? cfg : other, s));
    }
    CUDA_OK(cudaStreamSynchronize(s));
    ASSERT_NO_FATAL_FAILURE(
        w.CompareStep(batch, 0, "prepared config, way " + std::to_string(how) + " step " + std::to_string(step)));
  }
  ASSERT_NO_FATAL_FAILURE(w.CompareWholeArena("prepared config"));
  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(s);

  // A geometry RESOLVE cannot run is refused by Prepare with the launcher's own reason.
  ResolveLaunchConfig too_big;
  EXPECT_EQ(PrepareResolveLaunch(ArenaGeometry{4, 1, 200000, 2048, 656}, &too_big), cudaErrorInvalidValue);
  EXPECT_NE(std::string(LastLaunchError()).find("bytes of shared memory per row block"), std::string::npos)
      << LastLaunchError();
  EXPECT_EQ(too_big.device, -1);
  EXPECT_EQ(PrepareResolveLaunch(ArenaGeometry{4, 1, 512, 256, 24}, &too_big), cudaErrorInvalidValue);
  EXPECT_NE(std::string(LastLaunchError()).find("unsupported record_bytes: 24"), std::string::npos);
}

// A budget of blocks (ResolveLaunchConfig::max_blocks, ABI 1.13's hs_resolve_args.max_blocks):
// fewer row blocks than rows, each planning several and fetching with few consumers, and no
// helpers at budgets below the batch; every step still equals the reference, in a graph too.
TEST(ResolveGpu, ABudgetOfBlocksMatchesReference) {
  REQUIRE_GPU();
  const Config c{2048, 4096, 656, 16, 24};
  World w(c, 2, 6160);
  ASSERT_NO_FATAL_FAILURE(w.Init());
  ResolveLaunchConfig cfg;
  CUDA_OK(PrepareResolveLaunch(w.g_, &cfg));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int budgets[] = {1, 2, 5, 16, 24};
  cudaGraphExec_t exec;
  w.layer_ = 1;
  {
    ResolveLaunchConfig three = cfg;
    three.max_blocks = 3;
    cudaGraph_t graph;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CUDA_OK(LaunchResolve(w.GpuDesc(0), w.ws_, w.ws_bytes_, three, s));
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphDestroy(graph));
  }
  for (int step = 0; step < c.steps; ++step) {
    const bool graph = step % 4 == 3;
    const int budget = graph ? 3 : budgets[step % 5];
    w.layer_ = graph ? 1 : step % 2;
    const int batch = w.MakeStep(RandomBatch(w), step % 2 ? 0.1 : 0.03);
    ASSERT_NO_FATAL_FAILURE(w.Upload(batch));
    if (graph) {
      CUDA_OK(cudaGraphLaunch(exec, s));
    } else {
      ResolveLaunchConfig how = cfg;
      how.max_blocks = budget;
      CUDA_OK(LaunchResolve(w.GpuDesc(0), w.ws_, w.ws_bytes_, how, s));
    }
    CUDA_OK(cudaStreamSynchronize(s));
    ASSERT_NO_FATAL_FAILURE(
        w.CompareStep(batch, 0, "budget " + std::to_string(budget) + " blocks, step " + std::to_string(step)));
  }
  ASSERT_NO_FATAL_FAILURE(w.CompareWholeArena("budget of blocks"));
  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(s);
}

// Random steps (as the budget test's) each launched with its own tuning, `tune(step)` applied to
// the prepared config; every step and then the whole arena equal the reference.
void ExpectTunedStepsMatchReference(uint64_t seed, const std::function<void(int, ResolveLaunchConfig*)>& tune,
                                    const std::string& what) {
  const Config c{2048, 4096, 656, 16, 24};
  World w(c, 2, seed);
  ASSERT_NO_FATAL_FAILURE(w.Init());
  ResolveLaunchConfig cfg;
  CUDA_OK(PrepareResolveLaunch(w.g_, &cfg));
  for (int step = 0; step < c.steps; ++step) {
    ResolveLaunchConfig how = cfg;
    tune(step, &how);
    w.layer_ = step % 2;
    const int batch = w.MakeStep(RandomBatch(w), step % 2 ? 0.1 : 0.0);
    ASSERT_NO_FATAL_FAILURE(w.Upload(batch));
    CUDA_OK(LaunchResolve(w.GpuDesc(0), w.ws_, w.ws_bytes_, how, 0));
    CUDA_OK(cudaDeviceSynchronize());
    ASSERT_NO_FATAL_FAILURE(w.CompareStep(batch, 0,
                                          what + ": consumer blocks " + std::to_string(how.consumer_blocks) +
                                              ", consumer warps " + std::to_string(how.consumer_warps) + ", budget " +
                                              std::to_string(how.max_blocks) + ", step " + std::to_string(step)));
  }
  ASSERT_NO_FATAL_FAILURE(w.CompareWholeArena(what));
}

// Fewer consumer blocks (ResolveLaunchConfig::consumer_blocks): every row keeps its planner, only
// the first blocks take queue chunks, alone or under a budget of blocks.
TEST(ResolveGpu, FewerConsumerBlocksMatchReference) {
  REQUIRE_GPU();
  ExpectTunedStepsMatchReference(
      6161,
      [](int step, ResolveLaunchConfig* how) {
        const int consumers[] = {1, 2, 7, 16, 40};
        how->consumer_blocks = consumers[step % 5];
        how->max_blocks = step % 3 == 2 ? 5 : 0;
      },
      "fewer consumer blocks");
}

// More consumer warps a block (ResolveLaunchConfig::consumer_warps): one to all sixteen of each
// consumer block's warps take queue chunks, those a budget of blocks gets by default (0), and
// sixteen on the whole GPU, for which a workspace sized for this batch holds too few END entries
// (the launcher lowers the count to what it holds).
TEST(ResolveGpu, ConsumerWarpsMatchReference) {
  REQUIRE_GPU();
  ExpectTunedStepsMatchReference(
      7272,
      [](int step, ResolveLaunchConfig* how) {
        const int warps[] = {1, 3, 16, 0};
        const int budgets[] = {0, 5, 16};
        how->consumer_warps = warps[step % 4];
        how->max_blocks = budgets[step % 3];
        how->consumer_blocks = step % 5 == 4 ? 3 : 0;
      },
      "consumer warps");
}

// The benchmark's memory floor (LaunchResolveMemoryFloor) reads and writes back a no-IO step's
// tables and changes nothing: the arena still equals the reference's, and a RESOLVE step after it
// matches the reference as usual. Null scratch and an unprepared config are refused on the host.
TEST(ResolveGpu, MemoryFloorChangesNothing) {
  REQUIRE_GPU();
  const Config c{2048, 4096, 656, 8, 2};
  World w(c, 2, 99);
  ASSERT_NO_FATAL_FAILURE(w.Init());
  ResolveLaunchConfig config;
  CUDA_OK(PrepareResolveLaunch(w.g_, &config));
  int32_t* scratch = nullptr;
  CUDA_OK(cudaMalloc(&scratch, static_cast<size_t>(c.max_batch) * c.k * 4));
  for (int step = 0; step < c.steps; ++step) {
    w.layer_ = step % 2;
    const int batch = w.MakeStep(step == 0 ? c.max_batch : 5, 0.1);
    ASSERT_NO_FATAL_FAILURE(w.Upload(batch));
    CUDA_OK(LaunchResolveMemoryFloor(w.GpuDesc(0), config, scratch, 0));
    CUDA_OK(cudaDeviceSynchronize());
    ASSERT_NO_FATAL_FAILURE(w.CompareWholeArena("after the memory floor, step " + std::to_string(step)));
    CUDA_OK(LaunchResolve(w.GpuDesc(0), w.ws_, w.ws_bytes_, config, 0));
    CUDA_OK(cudaDeviceSynchronize());
    ASSERT_NO_FATAL_FAILURE(w.CompareStep(batch, 0, "step " + std::to_string(step)));
  }
  EXPECT_EQ(LaunchResolveMemoryFloor(w.GpuDesc(0), config, nullptr, 0), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchResolveMemoryFloor(w.GpuDesc(0), ResolveLaunchConfig{}, scratch, 0), cudaErrorInvalidValue);
  cudaFree(scratch);
}

TEST(ResolveGpu, RejectsUnsupportedInputOnHost) {
  REQUIRE_GPU();
  ResolveDesc d{};
  d.arena.geometry = ArenaGeometry{4, 1, 512, 256, 24};
  EXPECT_EQ(LaunchResolve(d, nullptr, 0, 0), cudaErrorInvalidValue);
  EXPECT_NE(std::string(LastLaunchError()).find("unsupported record_bytes: 24"), std::string::npos)
      << LastLaunchError();
  // Workspace too small.
  World w(Config{256, 512, 656, 4, 1}, 1, 3);
  ASSERT_NO_FATAL_FAILURE(w.Init());
  EXPECT_EQ(LaunchResolve(w.GpuDesc(0), w.ws_, w.ws_bytes_ - 8, 0), cudaErrorInvalidValue);
  EXPECT_NE(std::string(LastLaunchError()).find("workspace"), std::string::npos);
  StoreDesc sd{};
  sd.arena.geometry = ArenaGeometry{4, 1, 512, 256, 100};
  EXPECT_EQ(LaunchStore(sd, 0), cudaErrorInvalidValue);
  EXPECT_NE(std::string(LastLaunchError()).find("unsupported record_bytes: 100"), std::string::npos);
}

}  // namespace
}  // namespace hisparse
