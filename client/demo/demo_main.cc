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
#include "hisparse/common/daemon_process.h"
#include "hisparse/hisparse.hpp"
#include "synthetic_indexer.h"

namespace {

using hisparse::Error;
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
};

int Fail(const char* what, const Error& e) {
  std::fprintf(stderr, "hisparse-demo: %s failed: %s (%s)\n", what, e.message.c_str(), hs_result_string(e.code));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"hisparse-demo: admit, prefill, decode with RESOLVE, and check every byte"};
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
  CLI11_PARSE(app, argc, argv);

  std::unique_ptr<hisparse::DaemonProcess> daemon;
  if (f.daemon.empty()) {
    auto d = hisparse::DaemonProcess::Start({"--host-pool-size", f.host_pool_size, "--log-level", "warning"});
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
  o.backend = HS_BACKEND_HOST;
  hisparse::Session session;
  if (Error e = hisparse::Session::Open(o, &session)) return Fail("open session", e);
  hs_session_info info;
  session.Info(&info);
  std::printf("session %lu: %d layers, %d B records, k %d, B %d, %d requests, arena %.1f MiB (host backend)\n",
              info.session_id, f.layers, f.record_bytes, f.k, f.slots, f.requests, info.arena_bytes / 1048576.0);

  // ---- admit and prefill ----
  const uint32_t budget = static_cast<uint32_t>(f.context + f.steps);
  std::vector<int32_t> rows(f.requests);
  std::vector<uint8_t> prompt(static_cast<size_t>(f.layers) * f.context * f.record_bytes);
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
    if (Error e = Error::From(hs_store(session.get(), id, 0, f.context, f.context, prompt.data(), layer_stride,
                                       token_stride, nullptr))) {
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
  uint64_t selections = 0, slot_checks = 0, slot_bad = 0;
  hs_stats before;
  session.Stats(&before);
  const auto t0 = std::chrono::steady_clock::now();
  for (int step = 0; step < f.steps; ++step) {
    for (int r = 0; r < f.requests; ++r) ++seq_lens[r];  // this step's token joins the sequence
    for (int l = 0; l < f.layers; ++l) {
      for (int r = 0; r < f.requests; ++r) {
        FillRecord(r + 1, l, seq_lens[r] - 1, &newest[static_cast<size_t>(r) * f.record_bytes], f.record_bytes);
      }
      if (Error e = Error::From(hs_append(session.get(), l, f.requests, nullptr, rows.data(), seq_lens.data(),
                                          newest.data(), f.record_bytes, nullptr))) {
        return Fail("append", e);
      }
      for (int r = 0; r < f.requests; ++r) {
        selection.clear();
        indexers[r * f.layers + l].Select(seq_lens[r], &selection);
        selection.resize(f.k, -1);
        std::copy(selection.begin(), selection.end(), positions.begin() + static_cast<size_t>(r) * f.k);
      }
      hs_resolve_args args = HS_RESOLVE_ARGS_INIT;
      args.layer = l;
      args.max_batch = f.requests;
      args.rows = rows.data();
      args.seq_lens = seq_lens.data();
      args.positions = positions.data();
      args.out_slots = out_slots.data();
      if (Error e = session.Resolve(args)) return Fail("resolve", e);
      // Exactness: every output slot holds the host record of its position, byte for byte.
      for (int r = 0; r < f.requests; ++r) {
        for (int j = 0; j < f.k; ++j) {
          const int32_t p = positions[static_cast<size_t>(r) * f.k + j];
          if (p < 0) continue;
          ++selections;
          const int32_t s = out_slots[static_cast<size_t>(r) * f.k + j];
          const uint8_t* slot = static_cast<const uint8_t*>(info.slot_base) +
                                ((static_cast<size_t>(rows[r]) * f.layers + l) * (f.slots + 1) + s) * info.record_stride;
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
  std::printf("decode: %d steps x %d layers x %d requests, k %d: hit rate %.1f%%, %.1f misses per (request, layer, step), "
              "%.1f steps/s (host backend, with checks)\n",
              f.steps, f.layers, f.requests, f.k, hits + misses ? 100.0 * hits / (hits + misses) : 0.0,
              f.steps ? static_cast<double>(misses) / (static_cast<double>(f.steps) * f.layers * f.requests) : 0.0,
              seconds > 0 ? f.steps / seconds : 0.0);
  std::printf("exactness: %lu output slots checked against the host records, %lu wrong; counters %lu hits + %lu misses "
              "= %lu selections\n",
              slot_checks, slot_bad, hits, misses, selections);
  std::printf("pool: capacity %.1f MiB, used %.1f MiB, free %.1f MiB, fragmentation %.1f%%; node: %u sessions, %u requests\n",
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
