// GPU test of the multi-query RESOLVE kernel (resolve.h rule 8, draft_tokens 1..4; kernels/
// resolve_multi.cu) against the CPU reference: for identical inputs both leave byte-identical
// arenas (slot tables, LRU orders, records, counters) and produce identical outputs, error flags
// and miss plans. Random query counts and overlapping lists (random acceptance advances the rows),
// padded entries (device batch sizes 0..max_batch + 1), invalid entries of every kind, a B small
// enough for union refusals, and one captured CUDA graph per layer replayed with new contents
// alternate with eager launches. With a page table (rule 9, [max_batch][Q][k] record indices over
// B + 1 + n record slots per (row, layer)) both write it, bit-equal, besides or instead of
// out_slots. draft_tokens = 0 geometries take the single-query kernel (resolve_gpu_test.cu).
// Skips when no CUDA device is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "hisparse/kernels/resolve_cuda.h"
#include "late_producer.cuh"

namespace hisparse {
namespace {

struct MqConfig {
  int n, k, B;
  uint32_t rb;
  int max_batch;
  int pt_records = 0;   // rule 9's page table in pages of this many records; 0: not written
  int pt_offset = 0;    // its page offset
  bool no_out = false;  // with a page table: out_slots null (the page table alone)
  // Every launch programmatic (ResolveLaunchConfig::order = LaunchOrder::kProgrammatic) behind a kernel that
  // writes the selections only ~30 us after it let RESOLVE launch (late_producer.cuh).
  bool programmatic = false;
  int max_blocks = 0;  // ResolveLaunchConfig::max_blocks: bounds the fetch kernel's grid
};

// Device buffer freed on scope exit.
struct DevBuf {
  void* p = nullptr;
  ~DevBuf() { cudaFree(p); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// Rule 9 on its own terms, for the entries [0, active) of a step of `layer`: a rejected entry
// (summary misses = -1) is -1 everywhere; in a valid one every selection's entry is page_offset *
// page_records + (row * layers + layer) * (B + 1 + n) + slot, where the slot is a regular one
// holding the position's host record (records: the GPU's records section after the step) or tail
// slot B + t for query token t's own position; -1 for padding, padded query rows and the
// columns past list t's query token (rule 10b: whatever they hold).
void CheckPageTable(const MqConfig& c, const ArenaGeometry& g, int layer, const uint8_t* records,
                    const HostRecordMap& host, const std::vector<int32_t>& rows, const std::vector<int32_t>& seqs,
                    const std::vector<int32_t>& qs, const std::vector<int32_t>& sel, const std::vector<int32_t>& pt,
                    const int32_t* summary, int active) {
  const int Q = g.TailSlots(), outs = Q * g.k;
  const int64_t S = static_cast<int64_t>(g.RecordSlots());
  const int64_t first = static_cast<int64_t>(c.pt_offset) * c.pt_records;
  for (int i = 0; i < active; ++i) {
    const bool rejected = summary[3 * i + 1] < 0;
    for (int x = 0; x < outs; ++x) {
      const size_t at = static_cast<size_t>(i) * outs + x;
      const int32_t p = sel[at], e = pt[at];
      const int t = x / g.k, j = x % g.k;
      if (rejected || t >= qs[i] || p == kPadding || j > seqs[i] - qs[i] + t) {
        ASSERT_EQ(e, kPadding) << "entry " << i << " x " << x;
        continue;
      }
      const int64_t base = first + (static_cast<int64_t>(rows[i]) * g.num_layers + layer) * S;
      const int64_t slot = e - base;
      const int tail_first = seqs[i] - qs[i];
      if (p >= tail_first) {
        ASSERT_EQ(slot, g.slots + (p - tail_first)) << "entry " << i << ": query token's tail slot";
      } else {
        ASSERT_TRUE(slot >= 0 && slot < g.slots) << "entry " << i << ": index " << e << " outside its regular slots";
        const uint8_t* want = host.Record(g, rows[i], layer, p);
        ASSERT_EQ(std::memcmp(records + (e - first) * c.rb, want, c.rb), 0) << "entry " << i << " position " << p;
      }
    }
  }
}

// records_per_page R < kContiguousRecordsPerPage: the host records in pages of R records dealt in
// random order over the pool, row 1's first `shared` pages of every layer row 0's, read-only.
void RunMultiQuery(const MqConfig& c, uint32_t seed, uint32_t R = kContiguousRecordsPerPage, int shared = 0) {
  std::mt19937 rng(seed);
  auto U = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int layers = 2, rows = c.max_batch + 3, Q = c.n + 1, outs = Q * c.k;
  ArenaGeometry g{rows, layers, c.B, c.k, c.rb};
  g.draft_tokens = c.n;
  ASSERT_EQ(ValidateArenaGeometry(g), nullptr);
  const ArenaOffsets off = ComputeArenaOffsets(g);
  const int cap = 4 * c.B + 400;
  // One host pool (mapped, read by both), every position filled.
  const uint32_t ppe = R == kContiguousRecordsPerPage ? 1 : (static_cast<uint32_t>(cap) + R - 1) / R;
  const size_t npages = static_cast<size_t>(rows) * layers * ppe;
  const size_t run = static_cast<size_t>(std::min<uint32_t>(R, cap)) * c.rb, pool_bytes = run * npages;
  uint8_t* pool = nullptr;
  CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&pool), pool_bytes, cudaHostAllocMapped));
  for (size_t i = 0; i < pool_bytes; ++i) pool[i] = static_cast<uint8_t>(i * 131 + (i >> 11));
  uint8_t* pool_dev = nullptr;
  CUDA_OK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&pool_dev), pool, 0));
  std::vector<size_t> order(npages);
  for (size_t i = 0; i < npages; ++i) order[i] = i;
  if (ppe > 1) std::shuffle(order.begin(), order.end(), rng);
  std::vector<uint8_t*> base_h(npages), base_d(npages);
  for (size_t i = 0; i < npages; ++i) base_h[i] = pool + order[i] * run, base_d[i] = pool_dev + order[i] * run;
  for (int l = 0; l < layers; ++l) {
    for (int pg = 0; pg < shared; ++pg) {
      const size_t from = static_cast<size_t>(l) * ppe + pg, to = (static_cast<size_t>(layers) + l) * ppe + pg;
      base_h[to] = HostRecordMap::ReadOnlyEntry(base_h[from]);
      base_d[to] = HostRecordMap::ReadOnlyEntry(base_d[from]);
    }
  }
  std::vector<int32_t> caps(rows, cap);
  DevBuf d_base, d_cap, d_arena, d_ws, d_batch, d_rows, d_seq, d_q, d_pos, d_out, d_err, d_plan, d_pt;
  CUDA_OK(cudaMalloc(&d_base.p, base_d.size() * sizeof(uint8_t*)));
  CUDA_OK(cudaMemcpy(d_base.p, base_d.data(), base_d.size() * sizeof(uint8_t*), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMalloc(&d_cap.p, rows * 4));
  CUDA_OK(cudaMemcpy(d_cap.p, caps.data(), rows * 4, cudaMemcpyHostToDevice));
  // Reference arena: reset rows, then random prefill lengths (stores) so that slots hold state.
  std::vector<uint8_t> ref(off.total_bytes, 0);
  const ArenaView rv = ArenaView::Of(ref.data(), g);
  const HostRecordMap rh{base_h.data(), caps.data(), R, ppe};
  std::vector<int> committed(rows);
  for (int r = 0; r < rows; ++r) {
    ResetRowReference(rv, r);
    committed[r] = U(1, 2 * c.B);
    std::vector<uint8_t> src(static_cast<size_t>(committed[r]) * c.rb * layers);
    for (int l = 0; l < layers; ++l) {
      for (int p = 0; p < committed[r]; ++p) {
        std::memcpy(&src[(static_cast<size_t>(l) * committed[r] + p) * c.rb], rh.Record(g, r, l, p), c.rb);
      }
    }
    // Row 1's shared pages are not its to write: its store starts past them.
    const int first = r == 1 ? std::min<int>(committed[r], shared * static_cast<int>(std::min<uint32_t>(R, cap))) : 0;
    StoreDesc sd{rv,
                 rh,
                 r,
                 first,
                 committed[r] - first,
                 committed[r],
                 src.data() + static_cast<size_t>(first) * c.rb,
                 int64_t{committed[r]} * c.rb,
                 c.rb};
    ASSERT_EQ(StoreReference(sd), 0u);
  }
  CUDA_OK(cudaMalloc(&d_arena.p, off.total_bytes));
  CUDA_OK(cudaMemcpy(d_arena.p, ref.data(), off.total_bytes, cudaMemcpyHostToDevice));
  const ArenaView gv = ArenaView::Of(d_arena.p, g);
  const HostRecordMap gh{d_base.as<uint8_t*>(), d_cap.as<int32_t>(), R, ppe};
  const size_t ws_bytes = ResolveWorkspaceBytes(g, c.max_batch);
  ASSERT_GT(ws_bytes, 0u);
  CUDA_OK(cudaMalloc(&d_ws.p, ws_bytes));
  CUDA_OK(InitResolveWorkspace(d_ws.p, ws_bytes, 0));
  const size_t sel_n = static_cast<size_t>(c.max_batch) * outs;
  CUDA_OK(cudaMalloc(&d_batch.p, 4));
  CUDA_OK(cudaMalloc(&d_rows.p, c.max_batch * 4));
  CUDA_OK(cudaMalloc(&d_seq.p, c.max_batch * 4));
  CUDA_OK(cudaMalloc(&d_q.p, c.max_batch * 4));
  CUDA_OK(cudaMalloc(&d_pos.p, sel_n * 4));
  CUDA_OK(cudaMalloc(&d_out.p, sel_n * 4));
  CUDA_OK(cudaMalloc(&d_pt.p, sel_n * 4));
  CUDA_OK(cudaMalloc(&d_err.p, 4));
  const size_t plan_bytes = MissPlan::Bytes(g, c.max_batch);
  CUDA_OK(cudaMalloc(&d_plan.p, plan_bytes));
  std::vector<uint8_t> ref_plan(plan_bytes, 0), got_plan(plan_bytes);
  CUDA_OK(cudaMemset(d_plan.p, 0, plan_bytes));
  ResolveLaunchConfig config;
  CUDA_OK(PrepareResolveLaunch(g, &config));
  config.order = c.programmatic ? LaunchOrder::kProgrammatic : LaunchOrder::kAfterCompletion;
  config.max_blocks = c.max_blocks;
  DevBuf d_src;  // programmatic: the producer's source of the selections
  if (c.programmatic) CUDA_OK(cudaMalloc(&d_src.p, sel_n * 4));

  auto desc = [&](bool gpu, int layer) {
    ResolveDesc d{};
    d.arena = gpu ? gv : rv;
    d.host = gpu ? gh : rh;
    d.layer = layer;
    d.max_batch = c.max_batch;
    d.plan = MissPlan::Of(gpu ? d_plan.p : ref_plan.data(), c.max_batch);
    d.page_records = c.pt_records;
    d.page_offset = c.pt_offset;
    return d;
  };
  // The outputs a launch writes: out_slots unless no_out, the page table when asked for.
  const bool with_pt = c.pt_records > 0, with_out = !(with_pt && c.no_out);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  auto producer = [&] {
    if (c.programmatic) testing::LaunchLateProducer(d_pos.as<int32_t>(), d_src.as<int32_t>(), sel_n, 30.0, stream);
  };
  std::vector<cudaGraphExec_t> exec(layers, nullptr);
  for (int l = 0; l < layers; ++l) {
    ResolveDesc d = desc(true, l);
    d.batch_size = d_batch.as<int32_t>();
    d.rows = d_rows.as<int32_t>();
    d.seq_lens = d_seq.as<int32_t>();
    d.query_counts = d_q.as<int32_t>();
    d.positions = d_pos.as<int32_t>();
    d.out_slots = with_out ? d_out.as<int32_t>() : nullptr;
    d.page_table = with_pt ? d_pt.as<int32_t>() : nullptr;
    d.error_flags = d_err.as<uint32_t>();
    cudaGraph_t graph;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    producer();
    CUDA_OK(LaunchResolve(d, d_ws.p, ws_bytes, config, stream));
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec[l], graph, 0));
    CUDA_OK(cudaGraphDestroy(graph));
  }

  std::vector<int32_t> prev(static_cast<size_t>(rows) * outs, kPadding);
  uint64_t refused = 0, multi = 0;
  std::vector<uint8_t> got(off.total_bytes);
  for (int step = 0; step < 60; ++step) {
    std::vector<int32_t> order(rows);
    for (int r = 0; r < rows; ++r) order[r] = r;
    std::shuffle(order.begin(), order.end(), rng);
    order.resize(c.max_batch);
    const int batch = U(0, c.max_batch + 1);  // past max_batch too: clamped
    const int active = std::min(batch, c.max_batch);
    std::vector<int32_t> qs(c.max_batch, 1), seqs(c.max_batch, 1);
    for (int i = 0; i < c.max_batch; ++i) {
      if (committed[order[i]] + Q >= cap) committed[order[i]] = U(1, c.B);  // readmitted, shorter
      qs[i] = U(1, Q);
      seqs[i] = committed[order[i]] + qs[i];
    }
    for (int l = 0; l < layers; ++l) {
      std::vector<int32_t> sel(sel_n, 0x7777);  // garbage where unused
      std::vector<int32_t> lq = qs, ls = seqs, lrows = order;
      for (int i = 0; i < active; ++i) {
        const int r = order[i];
        for (int t = 0; t < qs[i]; ++t) {
          const int len = seqs[i] - qs[i] + t + 1;
          std::vector<int32_t> list;
          auto has = [&](int p) { return std::find(list.begin(), list.end(), p) != list.end(); };
          for (int j = 0; j < c.k; ++j) {
            const int p = t == 0 ? prev[static_cast<size_t>(r) * outs + j] : sel[(i * Q + t - 1) * c.k + j];
            if (p >= 0 && p < len && !has(p) && U(0, 9) < 8) list.push_back(p);
          }
          for (int tries = 0; static_cast<int>(list.size()) < c.k && tries < 3 * c.k; ++tries) {
            const int p = U(0, len - 1);
            if (!has(p)) list.push_back(p);
          }
          std::shuffle(list.begin(), list.end(), rng);
          if (U(0, 3) == 0 && !list.empty()) list.pop_back();
          list.resize(c.k, kPadding);
          std::copy(list.begin(), list.end(), sel.begin() + (i * Q + t) * c.k);
        }
        if (U(0, 20) == 0) {  // an invalid entry
          switch (U(0, 6)) {
            case 0:
              lq[i] = Q + 1;
              break;
            case 1:
              lq[i] = 0;
              break;
            case 2:
              sel[i * outs] = seqs[i] - qs[i] + 1;
              break;  // beyond list 0's length
            case 3:
              sel[i * outs + 1] = sel[i * outs] >= 0 ? sel[i * outs] : 0;
              break;  // duplicate (or range)
            case 4:   // a later list selects twice a position an earlier list selected (or range)
              if (Q > 1) {
                sel[(i * Q + 1) * c.k] = sel[i * outs] >= 0 ? sel[i * outs] : 0;
                sel[(i * Q + 1) * c.k + 1] = sel[(i * Q + 1) * c.k];
              }
              break;
            case 5:  // a later list selects one position twice (or range)
              if (Q > 1)
                sel[(i * Q + Q - 1) * c.k + 1] = sel[(i * Q + Q - 1) * c.k] >= 0 ? sel[(i * Q + Q - 1) * c.k] : 0;
              break;
            default:
              lrows[i] = rows + 5;
              break;
          }
        }
        if (U(0, 7) == 0) {  // rule 10, not an error: vLLM's row -1, or SGLang's stale columns
          if (U(0, 1) == 0) {
            lrows[i] = kPadding;
            ls[i] = -3;
          } else {
            for (int t = 0; t < qs[i]; ++t) {
              int32_t* list = &sel[(i * Q + t) * c.k];
              for (int j = seqs[i] - qs[i] + t + 1; j < c.k; ++j) list[j] = U(0, 1) == 0 ? list[0] : -9;
            }
          }
        }
        multi += qs[i] > 1;
      }
      ResolveDesc rd = desc(false, l);
      int32_t hb = batch;
      uint32_t rerr = 0;
      std::vector<int32_t> rout(sel_n, 0x5555), rpt(sel_n, 0x3333);
      rd.batch_size = &hb;
      rd.rows = lrows.data();
      rd.seq_lens = ls.data();
      rd.query_counts = lq.data();
      rd.positions = sel.data();
      rd.out_slots = with_out ? rout.data() : nullptr;
      rd.page_table = with_pt ? rpt.data() : nullptr;
      rd.error_flags = &rerr;
      ResolveReference(rd);
      CUDA_OK(cudaMemcpy(d_batch.p, &hb, 4, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemcpy(d_rows.p, lrows.data(), c.max_batch * 4, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemcpy(d_seq.p, ls.data(), c.max_batch * 4, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemcpy(d_q.p, lq.data(), c.max_batch * 4, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemcpy(c.programmatic ? d_src.p : d_pos.p, sel.data(), sel_n * 4, cudaMemcpyHostToDevice));
      if (c.programmatic) CUDA_OK(cudaMemset(d_pos.p, 0xff, sel_n * 4));  // padding until the producer writes
      CUDA_OK(cudaMemset(d_out.p, 0x55, sel_n * 4));
      CUDA_OK(cudaMemset(d_pt.p, 0x33, sel_n * 4));
      CUDA_OK(cudaMemset(d_err.p, 0, 4));
      if (step % 2 == 0) {
        CUDA_OK(cudaGraphLaunch(exec[l], stream));
      } else {
        ResolveDesc gd = desc(true, l);
        gd.batch_size = d_batch.as<int32_t>();
        gd.rows = d_rows.as<int32_t>();
        gd.seq_lens = d_seq.as<int32_t>();
        gd.query_counts = d_q.as<int32_t>();
        gd.positions = d_pos.as<int32_t>();
        gd.out_slots = with_out ? d_out.as<int32_t>() : nullptr;
        gd.page_table = with_pt ? d_pt.as<int32_t>() : nullptr;
        gd.error_flags = d_err.as<uint32_t>();
        producer();
        CUDA_OK(LaunchResolve(gd, d_ws.p, ws_bytes, config, stream));
      }
      CUDA_OK(cudaStreamSynchronize(stream));
      std::vector<int32_t> gout(sel_n), gpt(sel_n);
      uint32_t gerr = 0;
      CUDA_OK(cudaMemcpy(gout.data(), d_out.p, sel_n * 4, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(gpt.data(), d_pt.p, sel_n * 4, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(&gerr, d_err.p, 4, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(got.data(), d_arena.p, off.total_bytes, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(got_plan.data(), d_plan.p, plan_bytes, cudaMemcpyDeviceToHost));
      const std::string where = "step " + std::to_string(step) + " layer " + std::to_string(l);
      ASSERT_EQ(gerr, rerr) << where;
      if (with_out) {
        ASSERT_EQ(gout, rout) << where << ": outputs differ";
      } else {
        ASSERT_EQ(gout, std::vector<int32_t>(sel_n, 0x55555555)) << where << ": out_slots written though null";
      }
      if (with_pt) {
        ASSERT_EQ(gpt, rpt) << where << ": page tables differ";
        ASSERT_NO_FATAL_FAILURE(CheckPageTable(c, g, l, got.data() + off.records, rh, lrows, ls, lq, sel, gpt,
                                               MissPlan::Of(ref_plan.data(), c.max_batch).summary, active));
      } else {
        ASSERT_EQ(gpt, std::vector<int32_t>(sel_n, 0x33333333)) << where << ": page table written though null";
      }
      ASSERT_EQ(std::memcmp(got.data(), ref.data(), off.records), 0) << where << ": counters or tables differ";
      ASSERT_EQ(std::memcmp(got.data(), ref.data(), off.total_bytes), 0) << where << ": records differ";
      // The plan: batch, summaries of every entry, and each valid entry's misses.
      const MissPlan rp = MissPlan::Of(ref_plan.data(), c.max_batch), gp = MissPlan::Of(got_plan.data(), c.max_batch);
      ASSERT_EQ(*gp.batch, *rp.batch) << where;
      ASSERT_EQ(std::memcmp(gp.summary, rp.summary, c.max_batch * 12), 0) << where << ": plan summaries differ";
      for (int i = 0; i < active; ++i) {
        const int m = rp.summary[3 * i + 1];
        if (m < 0) {
          ++refused;
          continue;
        }
        const size_t at = i * MissPlan::EntriesPerRow(g) * 2;
        ASSERT_EQ(std::memcmp(gp.entries + at, rp.entries + at, m * 8), 0) << where << ": plan entries differ";
        std::copy(sel.begin() + i * outs, sel.begin() + (i + 1) * outs, prev.begin() + order[i] * outs);
      }
    }
    for (int i = 0; i < active; ++i) committed[order[i]] += U(1, qs[i]);  // accepted tokens
  }
  EXPECT_GT(multi, 10u);
  EXPECT_GT(refused, 0u);
  for (cudaGraphExec_t e : exec) cudaGraphExecDestroy(e);
  cudaStreamDestroy(stream);
  cudaFreeHost(pool);
}

TEST(ResolveMultiQueryGpu, MatchesReferenceForDraftTokens1To4) {
  REQUIRE_GPU();
  // Small (refusals of unions larger than B happen), medium, and the issue's sizing B = (n+2)k.
  for (int n = 1; n <= 4; ++n) {
    for (const MqConfig& c : {MqConfig{n, 8, 12, 32, 5}, MqConfig{n, 64, 64 * (n + 1) - 40, 656, 9},
                              MqConfig{n, 256, 256 * (n + 2), 1152, 6}}) {
      SCOPED_TRACE("n " + std::to_string(c.n) + " k " + std::to_string(c.k) + " B " + std::to_string(c.B));
      ASSERT_NO_FATAL_FAILURE(RunMultiQuery(c, 1000u * n + c.k));
    }
  }
}

// Rule 9 with draft tokens: the page table, [max_batch][Q][k] over B + 1 + n record slots, bit-equal
// to the reference besides out_slots and alone, plain indices and pages with an offset.
TEST(ResolveMultiQueryGpu, PageTablesMatchReferenceForDraftTokens1To4) {
  REQUIRE_GPU();
  for (int n = 1; n <= 4; ++n) {
    for (const MqConfig& c :
         {MqConfig{n, 8, 12, 32, 5, 1, 0, false}, MqConfig{n, 64, 64 * (n + 2), 656, 9, 64, 3, false},
          MqConfig{n, 256, 256 * (n + 2), 1152, 6, 1, 0, true}}) {
      SCOPED_TRACE("n " + std::to_string(c.n) + " k " + std::to_string(c.k) + " B " + std::to_string(c.B) +
                   (c.no_out ? " page table only" : ""));
      ASSERT_NO_FATAL_FAILURE(RunMultiQuery(c, 7000u * n + c.k));
    }
  }
}

// The same over paged host tables (pages of 1 and 5 records, row 1's first 4 pages shared
// read-only with row 0): the multi-query kernel reads through the tables as the reference does.
TEST(ResolveMultiQueryGpu, PagedTablesMatchReference) {
  REQUIRE_GPU();
  for (int n : {1, 3}) {
    for (const uint32_t R : {1u, 5u}) {
      // Plain outputs, and rule 9's page table besides them (its records checked through the tables).
      for (const MqConfig& c :
           {MqConfig{n, 64, 64 * (n + 1) - 40, 656, 9}, MqConfig{n, 64, 64 * (n + 2), 656, 9, 64, 3}}) {
        SCOPED_TRACE("n " + std::to_string(n) + " R " + std::to_string(R) + " pt " + std::to_string(c.pt_records));
        ASSERT_NO_FATAL_FAILURE(RunMultiQuery(c, 7000u * n + R + c.pt_records, R, 4));
      }
    }
  }
}

// A state too large for shared memory (a large B) lives in each entry's scratch in the workspace:
// the same code over global memory, bit-equal to the reference too.
TEST(ResolveMultiQueryGpu, StateInTheWorkspaceMatchesReference) {
  REQUIRE_GPU();
  const MqConfig c{4, 1024, 32768, 32, 2};
  ArenaGeometry g{c.max_batch + 3, 2, c.B, c.k, c.rb};
  g.draft_tokens = c.n;
  ResolveLaunchConfig config;
  CUDA_OK(PrepareResolveLaunch(g, &config));
  ASSERT_EQ(config.smem, 0u) << "the state fits in shared memory: this case would not test the workspace path";
  ASSERT_NO_FATAL_FAILURE(RunMultiQuery(c, 424242u));
}

// Programmatic launches behind a late producer (eager and graph steps): the planner waits for it
// before it reads anything, so every step still equals the reference.
TEST(ResolveMultiQueryGpu, ProgrammaticLaunchWaitsForTheKernelBeforeIt) {
  REQUIRE_GPU();
  if (!testing::CanLaunchProgrammatic()) GTEST_SKIP() << "programmatic launches need compute capability 9.0";
  for (int n : {1, 3}) {
    MqConfig c{n, 256, 256 * (n + 2), 1152, 6};
    c.programmatic = true;
    SCOPED_TRACE("n " + std::to_string(n));
    ASSERT_NO_FATAL_FAILURE(RunMultiQuery(c, 31000u * n));
  }
}

// A budget of blocks (ABI 1.13's max_blocks) bounds the fetch kernel's grid to one column of
// blocks (budget 1) or a few; the planner keeps its block a row, and every step equals the reference.
TEST(ResolveMultiQueryGpu, ABudgetOfBlocksMatchesReference) {
  REQUIRE_GPU();
  for (int n : {1, 4}) {
    for (int budget : {1, 12}) {
      MqConfig c{n, 256, 256 * (n + 2), 656, 6};
      c.max_blocks = budget;
      SCOPED_TRACE("n " + std::to_string(n) + ", budget " + std::to_string(budget));
      ASSERT_NO_FATAL_FAILURE(RunMultiQuery(c, 52000u * n + budget));
    }
  }
}

TEST(ResolveMultiQueryGpu, ZeroDraftTokensKeepTheSingleQueryWorkspace) {
  ArenaGeometry g{4, 2, 512, 256, 656};
  const size_t single = ResolveWorkspaceBytes(g, 8);
  g.draft_tokens = 2;
  EXPECT_GT(ResolveWorkspaceBytes(g, 8), 0u);
  g.draft_tokens = 0;
  EXPECT_EQ(ResolveWorkspaceBytes(g, 8), single);
}

}  // namespace
}  // namespace hisparse
