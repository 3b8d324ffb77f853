// hisparse-demo: the main job on the embedded default.
//
// Starts a hisparsed on a temporary socket (or attaches to --daemon), opens a session, admits a
// batch of synthetic requests, prefills their KV into the host pool, reads a sample back through
// the client and checks every byte; then runs decode steps: each step, per layer, a synthetic
// indexer selects k positions with locality, the newest token's record is appended, RESOLVE
// runs, and the demo checks that every output slot holds exactly the host record of its position.
// It prints hit rate, misses per step and steps per second, the pool's stats, releases
// everything, and exits 0 only if every check held.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "demo_memory.h"
#include "hisparse/common/daemon_process.h"
#include "hisparse/common/version.h"
#include "hisparse/hisparse.hpp"
#include "synthetic_indexer.h"

namespace {

using hisparse::Error;
using hisparse::demo::DemoMemory;
using hisparse::demo::FillRecord;
using hisparse::demo::SyntheticIndexer;

struct Flags {
  std::string daemon;
  std::string host_pool_size = "1GiB";
  int requests = 8;
  int layers = 4;
  int record_bytes = 656;
  int k = 256;
  int slots = 512;
  int context = 4096;
  int steps = 64;
  uint64_t seed = 1;
  std::string backend = "auto";
  int gpu = 0;
};

int Fail(const char* what, const Error& e) {
  std::fprintf(stderr, "hisparse-demo: %s failed: %s (%s)\n", what, e.message.c_str(), hs_result_string(e.code));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"hisparse-demo: admit, prefill, decode with RESOLVE, and check every byte"};
  app.set_version_flag("--version", "hisparse-demo " HISPARSE_VERSION);
  app.add_option("--daemon", f.daemon, "attach to this daemon (unix:PATH) instead of starting one");
  app.add_option("--host-pool-size", f.host_pool_size, "pool of the daemon the demo starts");
  app.add_option("--requests", f.requests, "requests in the batch")->check(CLI::Range(1, 4096));
  app.add_option("--layers", f.layers, "sparse layers")->check(CLI::Range(1, 1024));
  app.add_option("--record-bytes", f.record_bytes, "bytes per KV record (656: fp8 MLA, 1152: bf16 MLA)");
  app.add_option("--k", f.k, "positions selected per step")->check(CLI::Range(1, 65536));
  app.add_option("--slots", f.slots, "B: GPU slots per (request, layer), >= k");
  app.add_option("--context", f.context, "prompt tokens per request")->check(CLI::Range(1, 1 << 24));
  app.add_option("--steps", f.steps, "decode steps")->check(CLI::Range(0, 1 << 20));
  app.add_option("--seed", f.seed, "seed of the synthetic indexer");
  app.add_option("--backend", f.backend, "auto (CUDA when a GPU is present), cuda, host")
      ->check(CLI::IsMember({"auto", "cuda", "host"}));
  app.add_option("--gpu", f.gpu, "GPU index for the CUDA backend");
  CLI11_PARSE(app, argc, argv);

  const bool cuda = f.backend == "cuda" || (f.backend == "auto" && DemoMemory::CudaAvailable());
  std::unique_ptr<hisparse::DaemonProcess> daemon;
  if (f.daemon.empty()) {
    std::vector<std::string> daemon_args = {"--host-pool-size", f.host_pool_size, "--log-level", "warning"};
    // The two-process GPU path: the daemon owns the session's slot arena in GPU memory.
    if (cuda) daemon_args.insert(daemon_args.end(), {"--device", "cuda"});
    auto d = hisparse::DaemonProcess::Start(daemon_args);
    if (!d.ok()) {
      std::fprintf(stderr, "hisparse-demo: cannot start hisparsed: %s\n", std::string(d.status().message()).c_str());
      return 1;
    }
    daemon = std::move(*d);
    f.daemon = daemon->address();
    std::printf("started hisparsed (pid %d) on %s with a %s host pool\n", daemon->pid(), f.daemon.c_str(),
                f.host_pool_size.c_str());
  }

  hs_session_options o = HS_SESSION_OPTIONS_INIT;
  o.daemon_address = f.daemon.c_str();
  o.engine_name = "hisparse-demo";
  o.num_layers = f.layers;
  o.record_bytes = f.record_bytes;
  o.k = f.k;
  o.slots = f.slots;
  o.max_requests = f.requests;
  o.backend = cuda ? HS_BACKEND_CUDA : HS_BACKEND_HOST;
  o.gpu = cuda ? f.gpu : -1;
  hisparse::Session session;
  if (Error e = hisparse::Session::Open(o, &session)) return Fail("open session", e);
  hs_session_info info;
  session.Info(&info);
  const char* backend_name = info.backend == HS_BACKEND_CUDA ? "CUDA backend" : "host backend";
  std::printf("session %lu: %d layers, %d B records, k %d, B %d, %d requests, arena %.1f MiB (%s)\n", info.session_id,
              f.layers, f.record_bytes, f.k, f.slots, f.requests, info.arena_bytes / 1048576.0, backend_name);
  // Everything the data path reads or writes lives where the backend's kernels run.
  DemoMemory mem(info.backend == HS_BACKEND_CUDA);
  const size_t slot_block = static_cast<size_t>(f.slots + 1) * info.record_stride;

  // ---- admit and prefill ----
  const uint32_t budget = static_cast<uint32_t>(f.context + f.steps);
  std::vector<int32_t> rows(f.requests);
  std::vector<uint8_t> prompt(static_cast<size_t>(f.layers) * f.context * f.record_bytes);
  uint8_t* prompt_d = mem.Alloc<uint8_t>(prompt.size());
  for (int r = 0; r < f.requests; ++r) {
    const uint64_t id = r + 1;
    hs_request_info ri = HS_REQUEST_INFO_INIT;
    if (Error e = session.Admit(id, f.context, budget, &ri)) return Fail("admit", e);
    rows[r] = static_cast<int32_t>(ri.row);
    for (int l = 0; l < f.layers; ++l) {
      for (int p = 0; p < f.context; ++p) {
        FillRecord(id, l, p, &prompt[(static_cast<size_t>(l) * f.context + p) * f.record_bytes], f.record_bytes);
      }
    }
    const int64_t token_stride = f.record_bytes, layer_stride = int64_t{f.context} * f.record_bytes;
    mem.Upload(prompt_d, prompt.data(), prompt.size());
    if (Error e = Error::From(
            hs_store(session.get(), id, 0, f.context, f.context, prompt_d, layer_stride, token_stride, nullptr))) {
      return Fail("store", e);
    }
  }
  // Read a sample back through the client's mapping and check every byte.
  std::vector<uint8_t> expect(f.record_bytes);
  uint64_t checked = 0, bad = 0;
  for (int r = 0; r < f.requests; ++r) {
    for (int l = 0; l < f.layers; ++l) {
      for (int p = 0; p < f.context; p += std::max(1, f.context / 64)) {
        void* rec = nullptr;
        if (Error e = session.RecordPtr(r + 1, l, p, &rec)) return Fail("record pointer", e);
        FillRecord(r + 1, l, p, expect.data(), f.record_bytes);
        bad += std::memcmp(rec, expect.data(), f.record_bytes) != 0;
        ++checked;
      }
    }
  }
  std::printf("prefill: %d requests x %d layers x %d tokens stored; %lu sampled records read back, %lu wrong\n",
              f.requests, f.layers, f.context, checked, bad);

  // ---- decode ----
  std::vector<SyntheticIndexer> indexers;
  for (int r = 0; r < f.requests; ++r) {
    for (int l = 0; l < f.layers; ++l) indexers.emplace_back(f.seed * 1000003 + r * 131 + l, f.k);
  }
  std::vector<int32_t> seq_lens(f.requests, f.context);
  std::vector<int32_t> positions(static_cast<size_t>(f.requests) * f.k), out_slots(positions.size());
  std::vector<uint8_t> newest(static_cast<size_t>(f.requests) * f.record_bytes);
  std::vector<int32_t> selection;
  int32_t* rows_d = mem.Alloc<int32_t>(rows.size());
  int32_t* seq_d = mem.Alloc<int32_t>(seq_lens.size());
  int32_t* pos_d = mem.Alloc<int32_t>(positions.size());
  int32_t* out_d = mem.Alloc<int32_t>(out_slots.size());
  uint8_t* newest_d = mem.Alloc<uint8_t>(newest.size());
  std::vector<uint8_t> slots_h(slot_block);
  mem.Upload(rows_d, rows.data(), rows.size() * sizeof(int32_t));
  double data_path_seconds = 0;
  uint64_t selections = 0, slot_checks = 0, slot_bad = 0;
  hs_stats before;
  session.Stats(&before);
  const auto t0 = std::chrono::steady_clock::now();
  for (int step = 0; step < f.steps; ++step) {
    for (int r = 0; r < f.requests; ++r) ++seq_lens[r];  // this step's token joins the sequence
    mem.Upload(seq_d, seq_lens.data(), seq_lens.size() * sizeof(int32_t));
    for (int l = 0; l < f.layers; ++l) {
      for (int r = 0; r < f.requests; ++r) {
        FillRecord(r + 1, l, seq_lens[r] - 1, &newest[static_cast<size_t>(r) * f.record_bytes], f.record_bytes);
      }
      mem.Upload(newest_d, newest.data(), newest.size());
      for (int r = 0; r < f.requests; ++r) {
        selection.clear();
        indexers[r * f.layers + l].Select(seq_lens[r], &selection);
        selection.resize(f.k, -1);
        std::copy(selection.begin(), selection.end(), positions.begin() + static_cast<size_t>(r) * f.k);
      }
      mem.Upload(pos_d, positions.data(), positions.size() * sizeof(int32_t));
      hs_resolve_args args = HS_RESOLVE_ARGS_INIT;
      args.layer = l;
      args.max_batch = f.requests;
      args.rows = rows_d;
      args.seq_lens = seq_d;
      args.positions = pos_d;
      args.out_slots = out_d;
      const auto d0 = std::chrono::steady_clock::now();
      if (Error e = Error::From(
              hs_append(session.get(), l, f.requests, nullptr, rows_d, seq_d, newest_d, f.record_bytes, nullptr))) {
        return Fail("append", e);
      }
      if (Error e = session.Resolve(args)) return Fail("resolve", e);
      mem.Sync();
      data_path_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - d0).count();
      if (Error e = Error::From(hs_check_errors(session.get()))) return Fail("data path", e);
      mem.Download(out_slots.data(), out_d, out_slots.size() * sizeof(int32_t));
      // Exactness: every output slot holds the host record of its position, byte for byte.
      for (int r = 0; r < f.requests; ++r) {
        mem.Download(
            slots_h.data(),
            static_cast<const uint8_t*>(info.slot_base) + (static_cast<size_t>(rows[r]) * f.layers + l) * slot_block,
            slot_block);
        for (int j = 0; j < f.k; ++j) {
          const int32_t p = positions[static_cast<size_t>(r) * f.k + j];
          if (p < 0) continue;
          ++selections;
          const int32_t s = out_slots[static_cast<size_t>(r) * f.k + j];
          const uint8_t* slot = slots_h.data() + static_cast<size_t>(s < 0 ? 0 : s) * info.record_stride;
          void* host = nullptr;
          if (Error e = session.RecordPtr(r + 1, l, p, &host)) return Fail("record pointer", e);
          FillRecord(r + 1, l, p, expect.data(), f.record_bytes);
          slot_bad += s < 0 || s > f.slots || std::memcmp(slot, host, f.record_bytes) != 0 ||
                      std::memcmp(host, expect.data(), f.record_bytes) != 0;
          ++slot_checks;
        }
      }
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  hs_stats after;
  if (Error e = session.Stats(&after)) return Fail("stats", e);
  const uint64_t hits = after.hits - before.hits, misses = after.misses - before.misses;
  std::printf(
      "decode: %d steps x %d layers x %d requests, k %d: hit rate %.1f%%, %.1f misses per (request, layer, step), "
      "%.1f steps/s with checks; data path (append + RESOLVE, synchronized) %.1f us per layer-step (%s)\n",
      f.steps, f.layers, f.requests, f.k, hits + misses ? 100.0 * hits / (hits + misses) : 0.0,
      f.steps ? static_cast<double>(misses) / (static_cast<double>(f.steps) * f.layers * f.requests) : 0.0,
      seconds > 0 ? f.steps / seconds : 0.0,
      f.steps ? 1e6 * data_path_seconds / (static_cast<double>(f.steps) * f.layers) : 0.0, backend_name);
  std::printf(
      "exactness: %lu output slots checked against the host records, %lu wrong; counters %lu hits + %lu misses "
      "= %lu selections\n",
      slot_checks, slot_bad, hits, misses, selections);
  std::printf(
      "pool: capacity %.1f MiB, used %.1f MiB, free %.1f MiB, fragmentation %.1f%%; node: %u sessions, %u requests\n",
      after.pool_capacity_bytes / 1048576.0, after.pool_used_bytes / 1048576.0, after.pool_free_bytes / 1048576.0,
      100.0 * after.pool_fragmentation, after.sessions, after.requests);

  for (int r = 0; r < f.requests; ++r) {
    if (Error e = session.Release(r + 1)) return Fail("release", e);
  }
  hs_stats end;
  if (Error e = session.Stats(&end)) return Fail("stats", e);
  std::printf("released: pool used %lu bytes, %u requests\n", end.pool_used_bytes, end.requests);
  session.Close();

  const bool ok = bad == 0 && slot_bad == 0 && hits + misses == selections && end.pool_used_bytes == 0;
  std::printf("%s\n", ok ? "hisparse-demo: OK" : "hisparse-demo: FAILED");
  return ok ? 0 : 1;
}
