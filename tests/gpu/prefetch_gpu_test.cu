// Exact layer-wise prefetch on the GPU: layers that share an anchor's selection get the anchor's
// miss plan replayed on a side stream (LaunchReplay, ordered by events) instead of a RESOLVE of
// their own. Over many steps, in eager and in CUDA-graph mode, every layer's slot table, LRU order,
// slot bytes and the counters must equal those of plain per-layer RESOLVE (a second arena driven
// the plain way), and the anchor's out_slots must equal each follower's own RESOLVE outputs.
// The recorded plan itself is checked against the CPU reference's. Skips without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "gtest/gtest.h"
#include "hisparse/kernels/arena_layout.h"
#include "hisparse/kernels/resolve.h"
#include "hisparse/kernels/resolve_cuda.h"

namespace hisparse {
namespace {

struct Config {
  int k, B;
  uint32_t rb;
  int max_batch;
  int steps;
  bool graph;
};

std::string Name(const ::testing::TestParamInfo<Config>& info) {
  const Config& c = info.param;
  return "k" + std::to_string(c.k) + "_B" + std::to_string(c.B) + "_rb" + std::to_string(c.rb) + "_mb" +
         std::to_string(c.max_batch) + (c.graph ? "_graph" : "_eager");
}

// Layers 1, 2 follow anchor 0; layer 3 is an anchor with follower 4.
const std::vector<int> kAnchor = {0, 0, 0, 3, 3};

class PrefetchWorld {
 public:
  explicit PrefetchWorld(const Config& c) : c_(c), rng_(99 + c.k + c.B + c.rb + c.max_batch + (c.graph ? 7 : 0)) {}
  ~PrefetchWorld() {
    for (void* p : allocs_) cudaFree(p);
    if (pool_) cudaFreeHost(pool_);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    for (cudaStream_t s : {s_plain_, s_main_, s_side_}) {
      if (s) cudaStreamDestroy(s);
    }
    for (cudaGraphExec_t x : {exec_plain_, exec_pref_}) {
      if (x) cudaGraphExecDestroy(x);
    }
  }

  template <typename T>
  T* Alloc(size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
    allocs_.push_back(p);
    return static_cast<T*>(p);
  }

  // Before Init: host records in pages of R records, the first `shared` of row 1 row 0's.
  void Paged(uint32_t records_per_page, int shared) {
    R_ = records_per_page;
    shared_ = shared;
  }
  HostRecordMap GpuHost() const { return HostRecordMap{d_base_, d_cap_, R_, ppe_}; }
  HostRecordMap RefHost(uint8_t* const* base) const { return HostRecordMap{base, ref_caps_.data(), R_, ppe_}; }

  void Init() {
    L_ = static_cast<int>(kAnchor.size());
    g_ = ArenaGeometry{c_.max_batch + 3, L_, c_.B, c_.k, c_.rb};
    off_ = ComputeArenaOffsets(g_);
    cap_ = c_.B + 2 * c_.k + c_.steps + 16;
    // Contiguous runs, or (Paged) pages of R_ records dealt in random order over the pool, row 1's
    // first shared_ pages of every layer mapping row 0's read-only (replay reads them freely).
    ppe_ = R_ == kContiguousRecordsPerPage ? 1 : (static_cast<uint32_t>(cap_) + R_ - 1) / R_;
    const size_t run = static_cast<size_t>(std::min<uint32_t>(R_, cap_)) * c_.rb;  // one page
    const size_t runs = static_cast<size_t>(g_.max_rows) * L_ * ppe_;
    CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&pool_), run * runs, cudaHostAllocMapped | cudaHostAllocPortable));
    uint64_t* w = reinterpret_cast<uint64_t*>(pool_);
    for (size_t i = 0; i < run * runs / 8; ++i) w[i] = (i + 3) * 0x9E3779B97F4A7C15ull ^ (i >> 5);
    uint8_t* pool_dev = nullptr;
    CUDA_OK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&pool_dev), pool_, 0));
    std::vector<size_t> order(runs);
    std::iota(order.begin(), order.end(), 0);
    if (ppe_ > 1) std::shuffle(order.begin(), order.end(), rng_);
    std::vector<uint8_t*> base(runs);
    host_base_.resize(runs);
    for (size_t i = 0; i < runs; ++i) {
      base[i] = pool_dev + order[i] * run;
      host_base_[i] = pool_ + order[i] * run;
    }
    for (int l = 0; l < L_ && g_.max_rows >= 2; ++l) {
      for (int pg = 0; pg < shared_; ++pg) {
        const size_t from = static_cast<size_t>(l) * ppe_ + pg, to = (static_cast<size_t>(L_) + l) * ppe_ + pg;
        base[to] = HostRecordMap::ReadOnlyEntry(base[from]);
        host_base_[to] = HostRecordMap::ReadOnlyEntry(host_base_[from]);
      }
    }
    d_base_ = Alloc<uint8_t*>(runs * sizeof(uint8_t*));
    d_cap_ = Alloc<int32_t>(g_.max_rows * 4);
    ASSERT_NE(d_base_, nullptr);
    ASSERT_NE(d_cap_, nullptr);
    CUDA_OK(cudaMemcpy(d_base_, base.data(), runs * sizeof(uint8_t*), cudaMemcpyHostToDevice));
    std::vector<int32_t> caps(g_.max_rows, cap_);
    CUDA_OK(cudaMemcpy(d_cap_, caps.data(), caps.size() * 4, cudaMemcpyHostToDevice));
    ref_caps_ = caps;

    // Initial state: per row and anchor a random resident set; followers start with the anchor's
    // tables and their own layer's records (the state store and reset leave).
    std::vector<uint8_t> init(off_.total_bytes, 0);
    ArenaView v = ArenaView::Of(init.data(), g_);
    seq_.assign(g_.max_rows, 0);
    for (int r = 0; r < g_.max_rows; ++r) {
      seq_[r] = std::uniform_int_distribution<int>(c_.k + 2, c_.B + c_.k)(rng_);
      for (int l = 0; l < L_; ++l) {
        if (kAnchor[l] == l) {
          const int filled = std::uniform_int_distribution<int>(c_.B / 2, c_.B)(rng_);
          std::vector<int32_t> ps(seq_[r] - 1);
          std::iota(ps.begin(), ps.end(), 0);
          std::shuffle(ps.begin(), ps.end(), rng_);
          std::vector<int32_t> slots(c_.B);
          std::iota(slots.begin(), slots.end(), 0);
          std::shuffle(slots.begin(), slots.end(), rng_);
          int32_t* sp = v.SlotPos(r, l);
          int32_t* lru = v.Lru(r, l);
          for (int s = 0; s < c_.B; ++s) sp[s] = kEmptySlot;
          const int n = std::min<int>(filled, static_cast<int>(ps.size()));
          for (int i = 0; i < n; ++i) sp[slots[i]] = ps[i];
          int x = 0;
          for (int s : slots) {
            if (sp[s] == kEmptySlot) lru[x++] = s;
          }
          for (int s : slots) {
            if (sp[s] != kEmptySlot) lru[x++] = s;
          }
        } else {
          std::memcpy(v.SlotPos(r, l), v.SlotPos(r, kAnchor[l]), c_.B * 4);
          std::memcpy(v.Lru(r, l), v.Lru(r, kAnchor[l]), c_.B * 4);
        }
        for (int s = 0; s < c_.B; ++s) {
          const int p = v.SlotPos(r, l)[s];
          if (p != kEmptySlot) {
            std::memcpy(v.Record(r, l, s), RefHost(host_base_.data()).Record(g_, r, l, p), c_.rb);
          }
        }
      }
    }
    plain_ = Alloc<uint8_t>(off_.total_bytes);
    pref_ = Alloc<uint8_t>(off_.total_bytes);
    ASSERT_NE(plain_, nullptr);
    ASSERT_NE(pref_, nullptr);
    CUDA_OK(cudaMemcpy(plain_, init.data(), init.size(), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(pref_, init.data(), init.size(), cudaMemcpyHostToDevice));

    ws_bytes_ = ResolveWorkspaceBytes(g_, c_.max_batch);
    ws_plain_ = Alloc<void>(ws_bytes_);
    ws_pref_ = Alloc<void>(ws_bytes_);
    CUDA_OK(InitResolveWorkspace(ws_plain_, ws_bytes_, nullptr));
    CUDA_OK(InitResolveWorkspace(ws_pref_, ws_bytes_, nullptr));
    for (int l = 0; l < L_; ++l) {
      if (kAnchor[l] == l) {
        void* p = Alloc<void>(MissPlan::Bytes(g_, c_.max_batch));
        ASSERT_NE(p, nullptr);
        plans_.push_back(MissPlan::Of(p, c_.max_batch));
      } else {
        plans_.push_back(MissPlan{});
      }
    }
    const size_t sel = static_cast<size_t>(c_.max_batch) * c_.k;
    d_batch_ = Alloc<int32_t>(4);
    d_rows_ = Alloc<int32_t>(c_.max_batch * 4);
    d_seq_ = Alloc<int32_t>(c_.max_batch * 4);
    d_pos_ = Alloc<int32_t>(2 * sel * 4);  // [group][max_batch][k]: one selection per anchor
    d_out_plain_ = Alloc<int32_t>(L_ * sel * 4);
    d_out_pref_ = Alloc<int32_t>(L_ * sel * 4);
    d_err_plain_ = Alloc<uint32_t>(4);
    d_err_pref_ = Alloc<uint32_t>(4);
    CUDA_OK(cudaMemset(d_out_plain_, 0x7f, L_ * sel * 4));
    CUDA_OK(cudaMemset(d_out_pref_, 0x7f, L_ * sel * 4));
    CUDA_OK(cudaMemset(d_err_plain_, 0, 4));
    CUDA_OK(cudaMemset(d_err_pref_, 0, 4));
    CUDA_OK(cudaStreamCreateWithFlags(&s_plain_, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamCreateWithFlags(&s_main_, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamCreateWithFlags(&s_side_, cudaStreamNonBlocking));
    events_.resize(2 * L_ + 1);
    for (cudaEvent_t& e : events_) CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    prev_.assign(static_cast<size_t>(g_.max_rows) * 2, {});
    rows_.assign(c_.max_batch, 0);
    seqs_.assign(c_.max_batch, 0);
    pos_.assign(2 * sel, kPadding);
  }

  int Group(int anchor) const { return anchor == 0 ? 0 : 1; }

  // A selection with locality to the row's previous one (per anchor group).
  void Select(int r, int group, int seq, int32_t* sel) {
    std::vector<int32_t>& prev = prev_[static_cast<size_t>(r) * 2 + group];
    std::vector<char> used(seq, 0);
    std::vector<int32_t> out;
    auto take = [&](int p) {
      if (p >= 0 && p < seq && !used[p] && static_cast<int>(out.size()) < c_.k) {
        used[p] = 1;
        out.push_back(p);
      }
    };
    std::bernoulli_distribution keep(std::uniform_real_distribution<double>(0.6, 0.98)(rng_));
    take(seq - 1);
    for (int p : prev) {
      if (keep(rng_)) take(p);
    }
    const int want = c_.k - static_cast<int>(std::uniform_int_distribution<int>(0, 3)(rng_) == 0 ? c_.k / 16 : 0);
    for (int t = 0; static_cast<int>(out.size()) < std::min(want, seq) && t < 20 * c_.k; ++t) {
      take(std::uniform_int_distribution<int>(0, seq - 1)(rng_));
    }
    std::shuffle(out.begin(), out.end(), rng_);
    prev = out;
    out.resize(c_.k, kPadding);
    std::copy(out.begin(), out.end(), sel);
  }

  // Host inputs of one step: a random batch of distinct rows (padding after it), sequences grow,
  // sometimes an invalid entry (a duplicate position).
  void MakeStep() {
    std::vector<int> perm(g_.max_rows);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng_);
    batch_ = std::uniform_int_distribution<int>(1, c_.max_batch)(rng_);
    const size_t sel = static_cast<size_t>(c_.max_batch) * c_.k;
    for (int i = 0; i < c_.max_batch; ++i) {
      if (i >= batch_) {
        rows_[i] = -3;
        seqs_[i] = -1;
        for (int gi = 0; gi < 2; ++gi) std::fill_n(&pos_[gi * sel + static_cast<size_t>(i) * c_.k], c_.k, -77);
        continue;
      }
      const int r = perm[i];
      if (seq_[r] < cap_) ++seq_[r];
      rows_[i] = r;
      seqs_[i] = seq_[r];
      for (int gi = 0; gi < 2; ++gi) {
        int32_t* s = &pos_[gi * sel + static_cast<size_t>(i) * c_.k];
        Select(r, gi, seq_[r], s);
        if (std::uniform_int_distribution<int>(0, 40)(rng_) == 0 && s[0] >= 0) s[1] = s[0];  // invalid
      }
    }
  }

  // Outputs are poisoned before every step, so a padded entry that a launch left alone shows.
  void Upload() {
    const size_t sel = static_cast<size_t>(c_.max_batch) * c_.k;
    CUDA_OK(cudaMemset(d_out_plain_, 0x7f, L_ * sel * 4));
    CUDA_OK(cudaMemset(d_out_pref_, 0x7f, L_ * sel * 4));
    CUDA_OK(cudaMemcpy(d_batch_, &batch_, 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_rows_, rows_.data(), rows_.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_seq_, seqs_.data(), seqs_.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_pos_, pos_.data(), pos_.size() * 4, cudaMemcpyHostToDevice));
  }

  ResolveDesc Desc(uint8_t* arena, void* /*unused*/, int layer, int32_t* out, uint32_t* err) {
    ResolveDesc d{};
    d.arena = ArenaView::Of(arena, g_);
    d.host = GpuHost();
    d.layer = layer;
    d.max_batch = c_.max_batch;
    d.batch_size = d_batch_;
    d.rows = d_rows_;
    d.seq_lens = d_seq_;
    d.positions = d_pos_ + static_cast<size_t>(Group(kAnchor[layer])) * c_.max_batch * c_.k;
    d.out_slots = out + static_cast<size_t>(layer) * c_.max_batch * c_.k;
    d.error_flags = err;
    return d;
  }

  // Plain: RESOLVE on every layer. Enqueued on s_plain_.
  cudaError_t EnqueuePlain() {
    for (int l = 0; l < L_; ++l) {
      const cudaError_t e =
          LaunchResolve(Desc(plain_, nullptr, l, d_out_plain_, d_err_plain_), ws_plain_, ws_bytes_, s_plain_);
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }

  // Prefetch: anchors RESOLVE on s_main_ and record their plan; each follower's replay runs on
  // s_side_ after the anchor's event, and s_main_ waits for each follower's own event (where an
  // engine's attention of that layer would start). The side stream is joined back at the end.
  cudaError_t EnqueuePrefetch() {
    cudaError_t e = cudaSuccess;
    for (int l = 0; l < L_ && e == cudaSuccess; ++l) {
      if (kAnchor[l] == l) {
        ResolveDesc d = Desc(pref_, nullptr, l, d_out_pref_, d_err_pref_);
        d.plan = plans_[l];
        e = LaunchResolve(d, ws_pref_, ws_bytes_, s_main_);
        if (e == cudaSuccess) e = cudaEventRecord(events_[2 * l], s_main_);
        if (e == cudaSuccess) e = cudaStreamWaitEvent(s_side_, events_[2 * l], 0);
        for (int f = l + 1; f < L_ && e == cudaSuccess; ++f) {
          if (kAnchor[f] != l) continue;
          ReplayDesc r{};
          r.arena = ArenaView::Of(pref_, g_);
          r.host = GpuHost();
          r.anchor_layer = l;
          r.layer = f;
          r.max_batch = c_.max_batch;
          r.plan = plans_[l];
          e = LaunchReplay(r, s_side_);
          if (e == cudaSuccess) e = cudaEventRecord(events_[2 * f + 1], s_side_);
        }
      } else {
        e = cudaStreamWaitEvent(s_main_, events_[2 * l + 1], 0);
      }
    }
    if (e == cudaSuccess) e = cudaEventRecord(events_[2 * L_], s_side_);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(s_main_, events_[2 * L_], 0);
    return e;
  }

  void Capture() {
    cudaGraph_t graph;
    CUDA_OK(cudaStreamBeginCapture(s_plain_, cudaStreamCaptureModeThreadLocal));
    CUDA_OK(EnqueuePlain());
    CUDA_OK(cudaStreamEndCapture(s_plain_, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec_plain_, graph, 0));
    CUDA_OK(cudaGraphDestroy(graph));
    CUDA_OK(cudaStreamBeginCapture(s_main_, cudaStreamCaptureModeThreadLocal));
    CUDA_OK(EnqueuePrefetch());
    CUDA_OK(cudaStreamEndCapture(s_main_, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec_pref_, graph, 0));
    CUDA_OK(cudaGraphDestroy(graph));
  }

  void Step() {
    MakeStep();
    Upload();
    if (c_.graph) {
      CUDA_OK(cudaGraphLaunch(exec_plain_, s_plain_));
      CUDA_OK(cudaGraphLaunch(exec_pref_, s_main_));
    } else {
      CUDA_OK(EnqueuePlain());
      CUDA_OK(EnqueuePrefetch());
    }
    CUDA_OK(cudaDeviceSynchronize());
  }

  // The two arenas byte for byte, the error flags, and every layer's outputs: the plain layer's
  // own against its anchor's in the prefetch world, padded entries (rule 7: kPadding) included.
  void Compare(const std::string& what) {
    std::vector<uint8_t> a(off_.total_bytes), b(off_.total_bytes);
    CUDA_OK(cudaMemcpy(a.data(), plain_, a.size(), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(b.data(), pref_, b.size(), cudaMemcpyDeviceToHost));
    if (std::memcmp(a.data(), b.data(), a.size()) != 0) {
      size_t x = 0;
      while (a[x] == b[x]) ++x;
      const char* section = x < off_.slot_pos  ? "counters"
                            : x < off_.lru     ? "slot_pos"
                            : x < off_.records ? "lru"
                                               : "records";
      FAIL() << what << ": arenas differ first at byte " << x << " (" << section << ")";
    }
    uint32_t ea = 0, eb = 0;
    CUDA_OK(cudaMemcpy(&ea, d_err_plain_, 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(&eb, d_err_pref_, 4, cudaMemcpyDeviceToHost));
    ASSERT_EQ(ea, eb) << what;
    const size_t sel = static_cast<size_t>(c_.max_batch) * c_.k;
    std::vector<int32_t> oa(L_ * sel), ob(L_ * sel);
    CUDA_OK(cudaMemcpy(oa.data(), d_out_plain_, oa.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(ob.data(), d_out_pref_, ob.size() * 4, cudaMemcpyDeviceToHost));
    for (int l = 0; l < L_; ++l) {
      const int32_t* own = &oa[l * sel];
      const int32_t* anchor = &ob[kAnchor[l] * sel];
      for (size_t x = 0; x < sel; ++x) {
        ASSERT_EQ(own[x], anchor[x]) << what << ": layer " << l << " out_slots[" << x / c_.k << "][" << x % c_.k << "]";
        if (x >= static_cast<size_t>(batch_) * c_.k) {
          ASSERT_EQ(own[x], kPadding) << what << ": layer " << l << " padded out_slots[" << x / c_.k << "]";
        }
      }
    }
  }

  // The plan the GPU recorded for anchor 0 against the CPU reference's for the same inputs on
  // the same state (the plain arena before the step, taken as the reference).
  void CheckPlanAgainstReference(const std::string& what) {
    MakeStep();
    Upload();
    std::vector<uint8_t> ref(off_.total_bytes);
    CUDA_OK(cudaMemcpy(ref.data(), pref_, ref.size(), cudaMemcpyDeviceToHost));
    std::vector<uint8_t*> base(host_base_.begin(), host_base_.end());
    std::vector<int32_t> caps(g_.max_rows, cap_);
    ResolveDesc d{};
    d.arena = ArenaView::Of(ref.data(), g_);
    d.host = HostRecordMap{base.data(), caps.data(), R_, ppe_};
    d.layer = 0;
    d.max_batch = c_.max_batch;
    int32_t b = batch_;
    d.batch_size = &b;
    d.rows = rows_.data();
    d.seq_lens = seqs_.data();
    d.positions = pos_.data();
    std::vector<int32_t> out(static_cast<size_t>(c_.max_batch) * c_.k);
    d.out_slots = out.data();
    std::vector<int32_t> words((MissPlan::Bytes(g_, c_.max_batch) + 3) / 4);
    d.plan = MissPlan::Of(words.data(), c_.max_batch);
    ResolveReference(d);
    CUDA_OK(EnqueuePlain());
    CUDA_OK(EnqueuePrefetch());
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<int32_t> gpu(words.size());
    CUDA_OK(cudaMemcpy(gpu.data(), plans_[0].batch, gpu.size() * 4, cudaMemcpyDeviceToHost));
    const MissPlan gp = MissPlan::Of(gpu.data(), c_.max_batch);
    ASSERT_EQ(*gp.batch, batch_) << what;
    // Every entry's summary, the padded ones' (kPadding, -1, 0) included (rule 7).
    for (int i = 0; i < c_.max_batch; ++i) {
      for (int f = 0; f < 3; ++f) ASSERT_EQ(gp.summary[3 * i + f], d.plan.summary[3 * i + f]) << what << " entry " << i;
      if (i >= batch_) ASSERT_EQ(gp.summary[3 * i + 1], -1) << what << " padded entry " << i;
      const int m = d.plan.summary[3 * i + 1];
      for (int x = 0; x < 2 * m; ++x) {
        ASSERT_EQ(gp.entries[static_cast<size_t>(i) * c_.k * 2 + x],
                  d.plan.entries[static_cast<size_t>(i) * c_.k * 2 + x])
            << what << " entry " << i << " miss " << x / 2;
      }
    }
  }

  Config c_;
  std::mt19937_64 rng_;
  int L_ = 0;
  ArenaGeometry g_{};
  ArenaOffsets off_{};
  int cap_ = 0;
  int batch_ = 0;
  uint8_t* pool_ = nullptr;
  std::vector<uint8_t*> host_base_;  // the host page tables in host addresses
  std::vector<int32_t> ref_caps_;
  uint32_t R_ = kContiguousRecordsPerPage, ppe_ = 1;
  int shared_ = 0;
  std::vector<void*> allocs_;
  uint8_t** d_base_ = nullptr;
  int32_t* d_cap_ = nullptr;
  uint8_t *plain_ = nullptr, *pref_ = nullptr;
  void *ws_plain_ = nullptr, *ws_pref_ = nullptr;
  size_t ws_bytes_ = 0;
  std::vector<MissPlan> plans_;
  int32_t *d_batch_ = nullptr, *d_rows_ = nullptr, *d_seq_ = nullptr, *d_pos_ = nullptr;
  int32_t *d_out_plain_ = nullptr, *d_out_pref_ = nullptr;
  uint32_t *d_err_plain_ = nullptr, *d_err_pref_ = nullptr;
  cudaStream_t s_plain_ = nullptr, s_main_ = nullptr, s_side_ = nullptr;
  std::vector<cudaEvent_t> events_;
  cudaGraphExec_t exec_plain_ = nullptr, exec_pref_ = nullptr;
  std::vector<int> seq_;
  std::vector<int32_t> rows_, seqs_, pos_;
  std::vector<std::vector<int32_t>> prev_;
};

class PrefetchExact : public ::testing::TestWithParam<Config> {};

TEST_P(PrefetchExact, EqualsPlainResolveOnEveryLayer) {
  REQUIRE_GPU();
  PrefetchWorld w(GetParam());
  ASSERT_NO_FATAL_FAILURE(w.Init());
  ASSERT_NO_FATAL_FAILURE(w.CheckPlanAgainstReference("plan of the first step"));
  ASSERT_NO_FATAL_FAILURE(w.Compare("after the plan check"));
  if (GetParam().graph) ASSERT_NO_FATAL_FAILURE(w.Capture());
  for (int s = 0; s < GetParam().steps; ++s) {
    ASSERT_NO_FATAL_FAILURE(w.Step());
    ASSERT_NO_FATAL_FAILURE(w.Compare("step " + std::to_string(s)));
  }
}

// The same over paged host tables (pages of 5 records scattered over the pool, row 1's first 6
// pages shared read-only with row 0): replays and plain RESOLVEs read through the tables alike.
TEST_P(PrefetchExact, PagedTablesEqualPlainResolve) {
  REQUIRE_GPU();
  PrefetchWorld w(GetParam());
  w.Paged(5, 6);
  ASSERT_NO_FATAL_FAILURE(w.Init());
  ASSERT_NO_FATAL_FAILURE(w.CheckPlanAgainstReference("paged: plan of the first step"));
  ASSERT_NO_FATAL_FAILURE(w.Compare("paged: after the plan check"));
  if (GetParam().graph) ASSERT_NO_FATAL_FAILURE(w.Capture());
  for (int s = 0; s < GetParam().steps; ++s) {
    ASSERT_NO_FATAL_FAILURE(w.Step());
    ASSERT_NO_FATAL_FAILURE(w.Compare("paged step " + std::to_string(s)));
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, PrefetchExact,
                         ::testing::Values(Config{64, 128, 48, 4, 60, false}, Config{64, 128, 48, 4, 60, true},
                                           Config{256, 512, 656, 16, 40, false}, Config{256, 512, 656, 16, 40, true},
                                           Config{2048, 4096, 1152, 8, 25, false},
                                           Config{2048, 4096, 1152, 8, 25, true}, Config{512, 1024, 4112, 6, 20, true}),
                         Name);

TEST(PrefetchGpu, RejectsBadLayersOnHost) {
  REQUIRE_GPU();
  const ArenaGeometry g{2, 2, 8, 4, 32};
  ReplayDesc r{};
  r.arena.geometry = g;
  r.anchor_layer = 1;
  r.layer = 1;
  EXPECT_EQ(LaunchReplay(r, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(LastLaunchError()).find("layers must differ"), std::string::npos) << LastLaunchError();
  r.anchor_layer = 0;
  r.max_batch = 4;
  r.plan.max_batch = 2;
  EXPECT_EQ(LaunchReplay(r, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(LastLaunchError()).find("max_batch"), std::string::npos) << LastLaunchError();
}

}  // namespace
}  // namespace hisparse
