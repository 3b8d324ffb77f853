// `hisparse-bench control`: load on the daemon's control plane. N threads, each with its own
// session through the C ABI (what an engine links), admit / extend / release as fast as the
// daemon answers, and every call's latency is kept.
//
//   hisparse-bench control [--sessions N] [--seconds T | --calls M]
//                          [--daemon unix:PATH | --host-pool-size SIZE [--host-pool-segment-size SIZE]
//                           [--host-pool-page-size SIZE]]
//                          [--layers L] [--record-bytes R] [--budget TOKENS] [--pool-pressure | --batch N]
//                          [--backend host|cuda]
//
// --backend cuda: the sessions use the CUDA backend on GPU 0 (arena in GPU memory, each slab
// registered with CUDA as the engine's would be), so admission pays what an engine's does; the
// default is the host backend (no GPU needed).
//
// Each worker loops: Admit (budget tokens), Extend (to twice the budget) every other request,
// Release. "admit_release" is the sum of one request's Admit and Release latencies: what a
// request's entry and exit cost an engine, extends and the loop's own time excluded.
//
// --batch N: each worker admits N requests in one AdmitBatch (all or nothing) and releases them in
// one ReleaseBatch, no Extend; "admit" and "release" are then per call (N requests each) and
// "admit_release" is one request's share of the pair, (admit + release) / N. --batch 1 is the
// batched RPC with one item; without --batch the single Admit / Release path runs. A daemon this
// command starts for --batch gets pages of 64KiB unless --host-pool-page-size says otherwise (with
// the daemon's 2MiB pages, 8 sessions of 64 requests of 4 layers would need 4GiB of pool).
//
// With --batch N the admitted requests are also preempted and brought back twice before their
// release: N single Parks and N single Resumes ("park", "resume": per call; "park_resume": one
// request's share, (N parks + N resumes) / N), then one ParkBatch and one ResumeBatch (all or
// nothing; "park_batch", "resume_batch": per call; "park_resume_batch": (ParkBatch + ResumeBatch) /
// N). These calls do not count against --calls M, which counts admissions and releases as before.
//
// --pool-pressure: workers hold up to max_requests requests each, with a budget sized so that all
// of them together ask for twice the pool; the pool fills and RESOURCE_EXHAUSTED must appear. A
// worker that is refused releases its oldest request and goes on. Every held request carries a
// signature in its first and last records, checked before release: a refusal must never cost
// anyone their data.
//
// Without --daemon it starts its own hisparsed (beside this binary, or $HISPARSE_DAEMON_BIN).
// The lifecycle calls go over each session's control lane where the daemon serves one
// (hisparse/common/control_lane.h); HISPARSE_CONTROL_LANE=0 sends them over gRPC instead, and
// "control_lane_sessions" says how many sessions used a lane from open to end.
// Output: one JSON object on stdout. At the end, with every session's requests released, Stats
// must show an exactly empty pool and no requests (the daemon should serve only this run).
// Exit codes: 0 ok; 1 an unexpected error, a corrupted record, a non-empty pool at the end, or
// (with --pool-pressure) no RESOURCE_EXHAUSTED seen; 2 bad usage.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/barrier.h"
#include "bench_cmd.h"
#include "hisparse/common/daemon_process.h"
#include "hisparse/hisparse.hpp"

namespace hisparse::bench {
namespace {

constexpr char kUsage[] =
    "usage: hisparse-bench control [--sessions N] [--seconds T | --calls M]\n"
    "         [--daemon unix:PATH | --host-pool-size SIZE [--host-pool-segment-size SIZE]\n"
    "          [--host-pool-page-size SIZE]]\n"
    "         [--layers L] [--record-bytes R] [--budget TOKENS] [--pool-pressure | --batch N]\n"
    "         [--backend host|cuda]\n"
    "  N concurrent sessions (default 8) admit / extend / release for T seconds (default 5) or\n"
    "  M calls per session; prints calls, errors and latency percentiles as JSON, then checks\n"
    "  that the daemon's pool is empty. Without --daemon, starts hisparsed with a pool of SIZE\n"
    "  (default 256MiB, segments of 16MiB). --batch N: N requests per AdmitBatch / ReleaseBatch,\n"
    "  parked and resumed N single calls at a time, then in one ParkBatch and one ResumeBatch.\n";

// Calls (one latency each), then per-request shares (kAdmitRelease and after).
enum Kind {
  kAdmit,
  kExtend,
  kRelease,
  kPark,
  kResume,
  kParkBatch,
  kResumeBatch,
  kAdmitRelease,
  kParkResume,
  kParkResumeBatch,
  kKinds
};
constexpr const char* kKindNames[kKinds] = {"admit",       "extend",           "release",      "park",
                                            "resume",      "park_batch",       "resume_batch", "admit_release",
                                            "park_resume", "park_resume_batch"};
constexpr uint32_t kRows = 64;
constexpr uint64_t kMagic = 0x6869737061727365;  // "hisparse"

struct Config {
  int sessions = 8;
  double seconds = 5;
  int64_t calls = 0;  // per session; 0: run for `seconds`
  std::string daemon;
  std::string pool_size = "256MiB";
  std::string segment_size = "16MiB";
  std::string page_size;  // empty: the daemon's default, or 64KiB with --batch
  uint32_t layers = 4;
  uint32_t record_bytes = 128;
  uint32_t budget = 0;  // 0: 256, or sized to fill the pool with --pool-pressure
  bool pool_pressure = false;
  uint32_t batch = 0;  // 0: single Admit / Extend / Release; N: N requests per AdmitBatch / ReleaseBatch
  bool cuda = false;   // --backend cuda: the CUDA backend on GPU 0
};

// What one worker saw. Merged after the run; no sharing while it runs.
struct WorkerResult {
  std::vector<uint32_t> ns[kKinds];        // latencies in nanoseconds
  std::map<std::string, uint64_t> errors;  // "kind: code" -> count
  uint64_t pool_full = 0;                  // RESOURCE_EXHAUSTED with rows to spare: the pool
  uint64_t corrupted = 0;
  uint64_t requests = 0;      // admitted and released
  std::string fatal;          // the session could not be opened
  bool control_lane = false;  // its calls went over its control lane from open to end (hs_session_info)
};

// A held request's signature: its id and session at position 0 of layer 0, and again at the last
// position of the last layer, both inside what Extend copies when runs move.
struct Signature {
  uint64_t magic, session, request;
};

class Worker {
 public:
  Worker(const Config& config, const std::string& address, uint32_t budget, int index)
      : config_(config), address_(address), budget_(budget), index_(index) {}

  void Open() {
    hs_session_options o = HS_SESSION_OPTIONS_INIT;
    o.daemon_address = address_.c_str();
    const std::string name = absl::StrCat("bench-control-", index_);
    o.engine_name = name.c_str();
    o.num_layers = config_.layers;
    o.record_bytes = config_.record_bytes;
    o.k = 16;
    o.slots = 32;
    o.max_requests = std::max(kRows, config_.batch);
    o.backend = config_.cuda ? HS_BACKEND_CUDA : HS_BACKEND_HOST;
    o.gpu = config_.cuda ? 0 : -1;
    if (Error e = Session::Open(o, &session_)) {
      result_.fatal = absl::StrCat("session ", index_, ": ", hs_result_string(e.code), ": ", e.message);
      return;
    }
    hs_session_info info;
    session_.Info(&info);
    session_id_ = info.session_id;
    result_.control_lane = info.control_lane != 0;
  }

  void Run(std::chrono::steady_clock::time_point until) {
    if (!session_.is_open()) return;
    for (uint64_t id = 1;; ++id) {
      if (config_.calls > 0 ? calls_ >= config_.calls : std::chrono::steady_clock::now() >= until) break;
      if (config_.pool_pressure) {
        PressureStep(id);
      } else if (config_.batch > 0) {
        BatchStep(id);
      } else {
        SteadyStep(id);
      }
    }
    while (!held_.empty()) ReleaseOldest();
    hs_session_info info;
    if (session_.Info(&info) || info.control_lane == 0) result_.control_lane = false;  // it broke on the way
    session_.Close();
  }

  WorkerResult& result() { return result_; }

 private:
  using Clock = std::chrono::steady_clock;

  // One timed call; the latency goes to `kind` when `keep`.
  template <typename F>
  Error Timed(Kind kind, F&& call, uint32_t* ns_out = nullptr, bool counted = true) {
    const auto t0 = Clock::now();
    Error e = call();
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    const uint32_t clamped = static_cast<uint32_t>(std::min<int64_t>(ns, UINT32_MAX));
    result_.ns[kind].push_back(clamped);
    if (ns_out != nullptr) *ns_out = clamped;
    if (counted) ++calls_;
    if (e) ++result_.errors[absl::StrCat(kKindNames[kind], ": ", hs_result_string(e.code))];
    return e;
  }

  void SteadyStep(uint64_t id) {
    uint32_t admit_ns = 0, release_ns = 0;
    if (Timed(
            kAdmit, [&] { return session_.Admit(id, budget_ / 2, budget_); }, &admit_ns))
      return;
    if (id % 2 == 0) Timed(kExtend, [&] { return session_.Extend(id, budget_ * 2); });
    if (Timed(
            kRelease, [&] { return session_.Release(id); }, &release_ns))
      return;
    result_.ns[kAdmitRelease].push_back(admit_ns + release_ns);
    ++result_.requests;
  }

  // Requests (step - 1) * N + 1 .. step * N: one AdmitBatch, one ReleaseBatch.
  void BatchStep(uint64_t step) {
    const uint32_t n = config_.batch;
    std::vector<uint64_t> ids(n);
    for (uint32_t i = 0; i < n; ++i) ids[i] = (step - 1) * n + i + 1;
    const std::vector<uint32_t> contexts(n, budget_ / 2), budgets(n, budget_);
    std::vector<hs_result> results(n);
    uint32_t admit_ns = 0, release_ns = 0;
    auto every_item = [&](hs_result call) { return EveryItem(call, ids, results); };
    if (Timed(
            kAdmit,
            [&] {
              return every_item(hs_admit_batch(session_.get(), n, ids.data(), contexts.data(), budgets.data(),
                                               HS_BATCH_ALL_OR_NOTHING, results.data(), nullptr, nullptr));
            },
            &admit_ns))
      return;
    ParkResumeStep(ids, results);
    if (Timed(
            kRelease, [&] { return every_item(hs_release_batch(session_.get(), n, ids.data(), results.data())); },
            &release_ns))
      return;
    result_.ns[kAdmitRelease].push_back((admit_ns + release_ns) / n);
    result_.requests += n;
  }

  // The call's error, else the first item's that failed.
  static Error EveryItem(hs_result call, const std::vector<uint64_t>& ids, const std::vector<hs_result>& results) {
    Error e = Error::From(call);
    for (size_t i = 0; !e && i < ids.size(); ++i) {
      if (results[i] != HS_OK) e = Error{results[i], absl::StrCat("request ", ids[i], " of the batch")};
    }
    return e;
  }

  // The batch's requests parked and resumed one call at a time, then in one call each way.
  void ParkResumeStep(const std::vector<uint64_t>& ids, std::vector<hs_result>& results) {
    const uint32_t n = static_cast<uint32_t>(ids.size());
    uint64_t single_ns = 0;
    for (Kind kind : {kPark, kResume}) {
      for (uint64_t id : ids) {
        uint32_t ns = 0;
        hs_request_info info = HS_REQUEST_INFO_INIT;
        const auto call = [&] {
          return Error::From(kind == kPark ? hs_park(session_.get(), id) : hs_resume(session_.get(), id, &info));
        };
        if (Timed(kind, call, &ns, /*counted=*/false)) return;
        single_ns += ns;
      }
    }
    result_.ns[kParkResume].push_back(static_cast<uint32_t>(single_ns / n));
    uint32_t park_ns = 0, resume_ns = 0;
    const auto park = [&] {
      return EveryItem(hs_park_batch(session_.get(), n, ids.data(), HS_BATCH_ALL_OR_NOTHING, results.data()), ids,
                       results);
    };
    if (Timed(kParkBatch, park, &park_ns, /*counted=*/false)) return;
    const auto resume = [&] {
      return EveryItem(
          hs_resume_batch(session_.get(), n, ids.data(), HS_BATCH_ALL_OR_NOTHING, results.data(), nullptr, nullptr),
          ids, results);
    };
    if (Timed(kResumeBatch, resume, &resume_ns, /*counted=*/false)) return;
    result_.ns[kParkResumeBatch].push_back((park_ns + resume_ns) / n);
  }

  void PressureStep(uint64_t id) {
    uint32_t admit_ns = 0;
    Error e = Timed(
        kAdmit, [&] { return session_.Admit(id, budget_ / 2, budget_); }, &admit_ns);
    if (e) {
      if (e.code == HS_ERR_RESOURCE_EXHAUSTED && held_.size() < kRows) ++result_.pool_full;
      if (!held_.empty()) ReleaseOldest();
      return;
    }
    held_.push_back({id, admit_ns});
    Stamp(id, true);
    if (id % 4 == 0) {
      // A refused Extend must leave the request exactly as it was, signature included.
      Timed(kExtend, [&] { return session_.Extend(id, budget_ * 2); });
    }
  }

  // Writes (write = true) or verifies the request's signature records.
  bool Stamp(uint64_t id, bool write) {
    const Signature want{kMagic, session_id_, id};
    bool ok = true;
    const uint32_t places[2][2] = {{0, 0}, {config_.layers - 1, budget_ - 1}};
    for (const auto& place : places) {
      void* p = nullptr;
      if (session_.RecordPtr(id, place[0], place[1], &p) || p == nullptr) return false;
      if (write) {
        std::memcpy(p, &want, sizeof(want));
      } else {
        ok &= std::memcmp(p, &want, sizeof(want)) == 0;
      }
    }
    return ok;
  }

  void ReleaseOldest() {
    const Held h = held_.front();
    held_.pop_front();
    if (!Stamp(h.id, false)) ++result_.corrupted;
    uint32_t release_ns = 0;
    if (!Timed(
            kRelease, [&] { return session_.Release(h.id); }, &release_ns)) {
      result_.ns[kAdmitRelease].push_back(h.admit_ns + release_ns);
      ++result_.requests;
    }
  }

  struct Held {
    uint64_t id;
    uint32_t admit_ns;
  };
  const Config& config_;
  const std::string address_;
  const uint32_t budget_;
  const int index_;
  Session session_;
  uint64_t session_id_ = 0;
  int64_t calls_ = 0;
  std::deque<Held> held_;
  WorkerResult result_;
};

// "p50": 12.3 in microseconds, over sorted latencies.
std::string Percentiles(std::vector<uint32_t>& ns) {
  if (ns.empty()) return "{\"count\": 0}";
  std::sort(ns.begin(), ns.end());
  auto at = [&](double q) {
    const size_t i = std::min(ns.size() - 1, static_cast<size_t>(q * static_cast<double>(ns.size())));
    return ns[i] / 1000.0;
  };
  return absl::StrFormat("{\"count\": %u, \"p50_us\": %.1f, \"p90_us\": %.1f, \"p99_us\": %.1f, \"max_us\": %.1f}",
                         ns.size(), at(0.50), at(0.90), at(0.99), ns.back() / 1000.0);
}

int UsageError(const std::string& what) {
  std::fprintf(stderr, "hisparse-bench control: %s\n%s", what.c_str(), kUsage);
  return 2;
}

// Parses the flags into *c; returns an exit code when the command should stop (-1 to go on).
int ParseFlags(int argc, char** argv, Config* c) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--pool-pressure") {
      c->pool_pressure = true;
      continue;
    }
    std::string name, value;
    if (!TakeFlag(argc, argv, &i, &name, &value)) return UsageError(name + " needs a value");
    int64_t n = 0;
    const bool is_int = absl::SimpleAtoi(value, &n);
    auto positive = [&](auto* out, int64_t hi) {
      if (!is_int || n < 1 || n > hi) return false;
      *out = static_cast<std::remove_pointer_t<decltype(out)>>(n);
      return true;
    };
    bool ok = true;
    if (name == "--sessions") {
      ok = positive(&c->sessions, 4096);
    } else if (name == "--calls") {
      ok = positive(&c->calls, int64_t{1} << 40);
    } else if (name == "--seconds") {
      ok = absl::SimpleAtod(value, &c->seconds) && c->seconds > 0 && c->seconds < 86400;
    } else if (name == "--layers") {
      ok = positive(&c->layers, 1024);
    } else if (name == "--record-bytes") {
      ok = positive(&c->record_bytes, 16384) && c->record_bytes % 16 == 0;
    } else if (name == "--batch") {
      ok = positive(&c->batch, HS_BATCH_MAX_ITEMS);
    } else if (name == "--budget") {
      ok = positive(&c->budget, int64_t{1} << 30);
    } else if (name == "--daemon") {
      c->daemon = value;
    } else if (name == "--host-pool-size") {
      c->pool_size = value;
    } else if (name == "--host-pool-segment-size") {
      c->segment_size = value;
    } else if (name == "--host-pool-page-size") {
      c->page_size = value;
    } else if (name == "--backend") {
      ok = value == "host" || value == "cuda";
      c->cuda = value == "cuda";
    } else {
      return UsageError("unknown argument '" + name + "'");
    }
    if (!ok) return UsageError(absl::StrCat(name, ": bad value '", value, "'"));
  }
  if (c->pool_pressure && c->batch > 0) return UsageError("--batch and --pool-pressure do not combine");
  if (c->batch > 0 && c->page_size.empty()) c->page_size = "64KiB";
  if (c->calls > 0 && c->pool_pressure && c->calls < 2 * kRows) {
    return UsageError("--pool-pressure needs --calls of at least 128 per session to fill the pool");
  }
  return -1;
}

// Node stats through a session of its own (the C ABI asks for one). Sessions of the run may still
// be closing in the daemon: their requests are already released, so only `sessions` can lag.
bool NodeStats(const std::string& address, hs_stats* out, std::string* error) {
  hs_session_options o = HS_SESSION_OPTIONS_INIT;
  o.daemon_address = address.c_str();
  o.engine_name = "bench-control-stats";
  o.num_layers = 1;
  o.record_bytes = 16;
  o.k = 1;
  o.slots = 1;
  o.max_requests = 1;
  o.backend = HS_BACKEND_HOST;
  Session s;
  Error e = Session::Open(o, &s);
  if (!e) e = s.Stats(out);
  if (e) *error = absl::StrCat(hs_result_string(e.code), ": ", e.message);
  return !e;
}

}  // namespace

int ControlMain(int argc, char** argv) {
  Config config;
  if (int rc = ParseFlags(argc, argv, &config); rc >= 0) return rc;

  std::unique_ptr<DaemonProcess> own_daemon;
  std::string address = config.daemon;
  double daemon_start_s = 0;
  if (address.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::string> args = {"--host-pool-size",  config.pool_size, "--host-pool-segment-size",
                                     config.segment_size, "--log-level",    "warning"};
    if (!config.page_size.empty()) args.insert(args.end(), {"--host-pool-page-size", config.page_size});
    auto d = DaemonProcess::Start(args, 120000);
    if (!d.ok()) {
      std::fprintf(stderr, "hisparse-bench control: cannot start hisparsed: %s\n", d.status().ToString().c_str());
      return 1;
    }
    daemon_start_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    own_daemon = std::move(*d);
    address = own_daemon->address();
  }

  hs_stats before = HS_STATS_INIT;
  std::string error;
  if (!NodeStats(address, &before, &error)) {
    std::fprintf(stderr, "hisparse-bench control: %s: %s\n", address.c_str(), error.c_str());
    return 1;
  }
  uint32_t budget = config.budget != 0 ? config.budget : 256;
  if (config.pool_pressure && config.budget == 0) {
    // All rows of all sessions together ask for twice the pool.
    const uint64_t per_token = uint64_t{config.layers} * config.record_bytes;
    const uint64_t want = 2 * before.pool_capacity_bytes / (uint64_t{kRows} * config.sessions * per_token) + 1;
    budget = static_cast<uint32_t>(std::max<uint64_t>(2, std::min<uint64_t>(want, UINT32_MAX / 2)));
  }

  std::vector<std::unique_ptr<Worker>> workers;
  for (int i = 0; i < config.sessions; ++i) workers.push_back(std::make_unique<Worker>(config, address, budget, i));
  // Sessions open before the clock starts: the run measures steady-state calls, not attachment.
  for (auto& w : workers) w->Open();
  absl::Barrier* start = new absl::Barrier(config.sessions + 1);  // deletes itself when passed
  std::chrono::steady_clock::time_point until;
  std::vector<std::thread> threads;
  for (auto& w : workers) {
    threads.emplace_back([&, w = w.get()] {
      if (start->Block()) delete start;
      w->Run(until);
    });
  }
  const auto t0 = std::chrono::steady_clock::now();
  until = t0 + std::chrono::microseconds(static_cast<int64_t>(config.seconds * 1e6));
  if (start->Block()) delete start;
  for (auto& t : threads) t.join();
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  WorkerResult all;
  int rc = 0;
  int on_lane = 0;
  for (auto& w : workers) {
    WorkerResult& r = w->result();
    on_lane += r.control_lane ? 1 : 0;
    if (!r.fatal.empty()) {
      std::fprintf(stderr, "hisparse-bench control: %s\n", r.fatal.c_str());
      rc = 1;
    }
    for (int k = 0; k < kKinds; ++k) all.ns[k].insert(all.ns[k].end(), r.ns[k].begin(), r.ns[k].end());
    for (const auto& [what, n] : r.errors) all.errors[what] += n;
    all.pool_full += r.pool_full;
    all.corrupted += r.corrupted;
    all.requests += r.requests;
  }

  hs_stats after = HS_STATS_INIT;
  const bool stats_ok = NodeStats(address, &after, &error);
  const bool empty = stats_ok && after.pool_used_bytes == 0 && after.requests == 0;

  uint64_t calls = 0, errors = 0;
  for (int k = 0; k < kAdmitRelease; ++k) calls += all.ns[k].size();
  std::string errors_json;
  for (const auto& [what, n] : all.errors) {
    absl::StrAppendFormat(&errors_json, "%s\"%s\": %u", errors_json.empty() ? "" : ", ", what, n);
    // In the pressure run, a refused Admit or Extend is the expected answer of a full pool.
    if (!(config.pool_pressure && absl::StrContains(what, hs_result_string(HS_ERR_RESOURCE_EXHAUSTED)) &&
          !absl::StartsWith(what, "release"))) {
      errors += n;
    }
  }
  std::string out = "{\n";
  absl::StrAppendFormat(&out, "  \"mode\": \"%s\",\n",
                        config.pool_pressure ? "pool-pressure" : (config.batch > 0 ? "batch" : "steady"));
  if (config.batch > 0) absl::StrAppendFormat(&out, "  \"batch\": %u,\n", config.batch);
  absl::StrAppendFormat(&out, "  \"daemon\": \"%s\",\n", own_daemon ? "own" : address);
  if (own_daemon) absl::StrAppendFormat(&out, "  \"daemon_start_s\": %.3f,\n", daemon_start_s);
  absl::StrAppendFormat(&out, "  \"pool_capacity_bytes\": %u,\n", before.pool_capacity_bytes);
  absl::StrAppendFormat(&out,
                        "  \"sessions\": %d,\n  \"layers\": %u,\n  \"record_bytes\": %u,\n  \"budget_tokens\": %u,\n",
                        config.sessions, config.layers, config.record_bytes, budget);
  // How the lifecycle calls travelled: sessions whose every call went over a control lane.
  absl::StrAppendFormat(&out, "  \"control_lane_sessions\": %d,\n", on_lane);
  absl::StrAppendFormat(&out, "  \"seconds\": %.3f,\n  \"calls\": %u,\n  \"calls_per_s\": %.0f,\n", elapsed, calls,
                        calls / elapsed);
  absl::StrAppendFormat(&out, "  \"requests\": %u,\n  \"requests_per_s\": %.0f,\n", all.requests,
                        all.requests / elapsed);
  absl::StrAppendFormat(&out,
                        "  \"calls_by_kind\": {\"admit\": %u, \"extend\": %u, \"release\": %u, \"park\": %u, "
                        "\"resume\": %u, \"park_batch\": %u, \"resume_batch\": %u},\n",
                        all.ns[kAdmit].size(), all.ns[kExtend].size(), all.ns[kRelease].size(), all.ns[kPark].size(),
                        all.ns[kResume].size(), all.ns[kParkBatch].size(), all.ns[kResumeBatch].size());
  absl::StrAppendFormat(&out, "  \"errors\": {%s},\n  \"unexpected_errors\": %u,\n", errors_json, errors);
  if (config.pool_pressure) {
    absl::StrAppendFormat(&out, "  \"pool_full_rejections\": %u,\n  \"corrupted_records\": %u,\n", all.pool_full,
                          all.corrupted);
  }
  out += "  \"latency\": {\n";
  for (int k = 0; k < kKinds; ++k) {
    absl::StrAppendFormat(&out, "    \"%s\": %s%s\n", kKindNames[k], Percentiles(all.ns[k]), k + 1 < kKinds ? "," : "");
  }
  out += "  },\n";
  absl::StrAppendFormat(&out, "  \"end\": {\"pool_used_bytes\": %u, \"requests\": %u, \"empty\": %s}\n",
                        after.pool_used_bytes, after.requests, empty ? "true" : "false");
  out += "}\n";
  std::fputs(out.c_str(), stdout);

  if (!stats_ok) std::fprintf(stderr, "hisparse-bench control: final Stats failed: %s\n", error.c_str());
  if (!empty) std::fprintf(stderr, "hisparse-bench control: the pool is not empty at the end\n");
  if (errors > 0) std::fprintf(stderr, "hisparse-bench control: %u unexpected errors\n", static_cast<unsigned>(errors));
  if (all.corrupted > 0) std::fprintf(stderr, "hisparse-bench control: corrupted records\n");
  if (config.pool_pressure && all.pool_full == 0) {
    std::fprintf(stderr, "hisparse-bench control: --pool-pressure never filled the pool\n");
  }
  if (!empty || errors > 0 || all.corrupted > 0 || (config.pool_pressure && all.pool_full == 0)) rc = 1;
  return rc;
}

}  // namespace hisparse::bench
