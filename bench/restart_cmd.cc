// `hisparse-bench restart`: what a daemon restart costs durable requests (issue 42). hisparsed runs
// under hisparse-keeper (the fd store; systemd's in production), both beside this binary. One
// session (C ABI, host backend) admits durable requests until they hold --fill of the pool, and
// stores every record (the pool's memory is really in use, as an engine's prompt would make it);
// each request's first and last record of every layer carry a signature. Then its session ends
// (the requests become orphans, as after an engine's death), the daemon is SIGKILLed, and the
// clock runs until a new session of the same engine sees every request
// adoptable again ("kill_to_adoptable_s"; "kill_to_serving_s": until a session opens at all;
// "kill_to_exit_s": until the killed daemon is gone, its mappings of the pool torn down by the
// kernel; "daemon_recovery_s": the new daemon's own account, Stats.restart.recovery_seconds). The
// new session adopts them ("adopt_s"), checks every signature and one whole request's records,
// and releases everything; the pool must end empty.
//
// Before the fill, the admit latency with the journal on: durable admissions (lease) and their
// releases, one at a time, against this daemon, and the same against a second daemon started
// without a keeper (no fd store, so no journal): "admit_release_us" {journal, no_journal}, p50 and
// p99 of one request's Admit + Release.
//
//   hisparse-bench restart [--pool SIZE] [--fill F] [--page-size SIZE] [--slab-size SIZE]
//                          [--layers L] [--record-bytes R] [--tokens T] [--latency-calls N] [--smoke]
//                          [--ride-through] [--backend host|cuda]
//
// --ride-through: the filling engine stays (issue 42, part 2): after the kill the same session
// notices its end ("kill_to_noticed_s"), recovers (hs_session_recover: "recover_s", the client's
// own account; "kill_to_recovered_s") and checks its requests through the recovered handle, which
// took over its slab mappings (and, with --backend cuda, their registrations) and kept the
// arena's address ("arena_moved"). --backend cuda (GPU 0): the rider is a CUDA-backend session
// (its arena on the GPU, every slab registered with it), which adopts what the host-backend filler
// left ("adopt_s": mapping and registering the pool once), parked, before the kill.
//
// $HISPARSE_RESTART_LOG_LEVEL sets the kept daemon's log level (warning; info shows when it died,
// started and served).
//
// Defaults: --pool 1GiB --fill 0.9 --page-size 2MiB --slab-size 64MiB --layers 8 --record-bytes
// 1152 --tokens 8192 --latency-calls 2000. --smoke: a 32MiB pool of 64KiB pages, 64 tokens, 200
// latency calls (ctest runs it). Output: one JSON object on stdout. Exit codes: 0 ok; 1 a failure,
// a lost or corrupted request, or a pool not empty at the end; 2 bad usage.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench_cmd.h"
#include "hisparse/common/daemon_process.h"
#include "hisparse/common/size_parse.h"
#include "hisparse/hisparse.h"
#include "hisparse/v1/hisparse.grpc.pb.h"

namespace hisparse::bench {
namespace {

constexpr char kUsage[] =
    "usage: hisparse-bench restart [--pool SIZE] [--fill F] [--page-size SIZE] [--slab-size SIZE]\n"
    "         [--layers L] [--record-bytes R] [--tokens T] [--latency-calls N] [--smoke]\n"
    "         [--ride-through] [--backend host|cuda]\n"
    "  Fills the pool of a hisparsed run under hisparse-keeper with durable requests, SIGKILLs it,\n"
    "  and times until every request is adoptable again; checks their bytes; and times durable\n"
    "  admit+release with and without the journal.\n";

constexpr char kEngine[] = "restart-bench";
constexpr uint64_t kMagic = 0x4853525354415254ull;  // "HSRSTART"

struct Config {
  uint64_t pool = 1ull << 30;
  double fill = 0.9;
  uint64_t page = 2ull << 20;
  uint64_t slab = 64ull << 20;
  uint32_t layers = 8;
  uint32_t record_bytes = 1152;
  uint32_t tokens = 8192;
  int latency_calls = 2000;
  bool ride_through = false;  // the filling session recovers itself (hs_session_recover)
  bool cuda = false;          // the engine on the CUDA backend, GPU 0
};

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

std::string BinDir() { return ExecutableDir(); }

std::string DaemonBinary() { return FindDaemonBinary().value_or(BinDir() + "/hisparsed"); }

struct Signature {
  uint64_t magic, request, layer, position;
};

// A session of the bench's engine against `address`, retried until the daemon answers (it may be
// starting); null after `seconds`.
hs_session* OpenSession(const Config& c, const std::string& address, double seconds, bool cuda = false) {
  hs_session_options o = HS_SESSION_OPTIONS_INIT;
  o.daemon_address = address.c_str();
  o.engine_name = kEngine;
  o.gpu = cuda ? 0 : -1;
  o.num_layers = c.layers;
  o.record_bytes = c.record_bytes;
  o.k = 1;
  o.slots = 1;
  o.max_requests = 4096;
  o.backend = cuda ? HS_BACKEND_CUDA : HS_BACKEND_HOST;
  o.max_context_tokens = c.tokens;
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    hs_session* s = nullptr;
    if (hs_session_open(&o, &s) == HS_OK) return s;
    if (Clock::now() >= deadline) {
      std::fprintf(stderr, "restart: cannot open a session: %s\n", hs_last_error());
      return nullptr;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

bool Stamp(hs_session* s, uint64_t id, const Config& c, bool write) {
  for (uint32_t layer = 0; layer < c.layers; ++layer) {
    for (uint32_t pos : {0u, c.tokens - 1}) {
      void* p = nullptr;
      if (hs_record_ptr(s, id, layer, pos, &p) != HS_OK || p == nullptr) return false;
      const Signature want{kMagic, id, layer, pos};
      if (write) {
        std::memcpy(p, &want, sizeof(want));
      } else if (std::memcmp(p, &want, sizeof(want)) != 0) {
        return false;
      }
    }
  }
  return true;
}

// The byte every record holds at offset i before its signature: what hs_store wrote.
uint8_t Fill(uint32_t layer, uint32_t pos, uint32_t i) { return static_cast<uint8_t>(layer * 29 + pos * 7 + i); }

// One request's Admit (durable when lease > 0) + Release, `calls` times: the pairs' latencies, us.
std::vector<double> AdmitReleaseLatencies(hs_session* s, uint32_t tokens, uint32_t lease, int calls) {
  std::vector<double> us;
  for (int i = 0; i < calls; ++i) {
    hs_admit_args a = HS_ADMIT_ARGS_INIT;
    a.request_id = 1'000'000 + static_cast<uint64_t>(i);
    a.token_budget = tokens;
    a.lease_seconds = lease;
    const auto t0 = Clock::now();
    if (hs_admit2(s, &a, nullptr) != HS_OK || hs_release(s, a.request_id) != HS_OK) {
      std::fprintf(stderr, "restart: admit/release: %s\n", hs_last_error());
      return {};
    }
    us.push_back(Seconds(t0, Clock::now()) * 1e6);
  }
  std::sort(us.begin(), us.end());
  return us;
}

// The daemon's own account of its start's recovery (Stats.restart.recovery_seconds); -1 unread.
double DaemonRecoverySeconds(const std::string& address) {
  auto stub = v1::HiSparse::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::StatsResponse st;
  return stub->Stats(&ctx, v1::StatsRequest(), &st).ok() ? st.restart().recovery_seconds() : -1;
}

double Quantile(const std::vector<double>& sorted, double q) {
  return sorted.empty() ? 0 : sorted[std::min(sorted.size() - 1, static_cast<size_t>(q * sorted.size()))];
}

// The kept daemon's log level: $HISPARSE_RESTART_LOG_LEVEL (info shows its timeline), else warning.
std::string LogLevel() {
  const char* level = std::getenv("HISPARSE_RESTART_LOG_LEVEL");
  return level != nullptr && *level != '\0' ? level : "warning";
}

class KeptDaemon {
 public:
  KeptDaemon(const Config& c, const std::string& dir) : dir_(dir), address_("unix:" + dir + "/hisparsed.sock") {
    const std::vector<std::string> args = {BinDir() + "/hisparse-keeper",
                                           "--restart-delay-ms",
                                           "0",
                                           "--child-pid-file",
                                           dir + "/pid",
                                           "--",
                                           DaemonBinary(),
                                           "--listen",
                                           address_,
                                           "--metrics-listen",
                                           "",
                                           "--log-level",
                                           LogLevel(),
                                           "--host-pool-size",
                                           std::to_string(c.pool),
                                           "--host-pool-page-size",
                                           std::to_string(c.page),
                                           "--host-pool-slab-size",
                                           std::to_string(c.slab),
                                           "--set",
                                           "limits.max_requests_per_session=4096",
                                           "--set",
                                           "quotas.requests=0",
                                           "--set",
                                           "import.enabled=false"};
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(126);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }
  ~KeptDaemon() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  const std::string& address() const { return address_; }
  pid_t DaemonPid() const {
    std::ifstream in(dir_ + "/pid");
    pid_t pid = 0;
    in >> pid;
    return pid;
  }
  // The keeper's daemon of now, to be killed: its pid, or 0 (and why, on stderr) when the pid file
  // names none: kill(0) would signal this process's group, kill(-1) every process it may.
  pid_t DaemonToKill() const {
    const pid_t pid = DaemonPid();
    if (pid > 0) return pid;
    std::fprintf(stderr, "restart: %s/pid names no daemon (read %d)\n", dir_.c_str(), static_cast<int>(pid));
    return 0;
  }

 private:
  std::string dir_, address_;
  pid_t pid_ = -1;
};

bool ParseArgs(int argc, char** argv, Config* c) {
  for (int i = 1; i < argc; ++i) {
    std::string name, value;
    if (std::string(argv[i]) == "--smoke") {
      c->pool = 32ull << 20;
      c->page = 64ull << 10;
      c->slab = 1ull << 20;
      c->layers = 2;
      c->record_bytes = 64;
      c->tokens = 64;
      c->latency_calls = 200;
      continue;
    }
    if (std::string(argv[i]) == "--ride-through") {
      c->ride_through = true;
      continue;
    }
    if (!TakeFlag(argc, argv, &i, &name, &value)) return false;
    absl::StatusOr<uint64_t> size = ParseByteSize(value);
    if (name == "--pool" && size.ok()) {
      c->pool = *size;
    } else if (name == "--page-size" && size.ok()) {
      c->page = *size;
    } else if (name == "--slab-size" && size.ok()) {
      c->slab = *size;
    } else if (name == "--fill") {
      c->fill = std::atof(value.c_str());
    } else if (name == "--layers") {
      c->layers = static_cast<uint32_t>(std::atoi(value.c_str()));
    } else if (name == "--record-bytes") {
      c->record_bytes = static_cast<uint32_t>(std::atoi(value.c_str()));
    } else if (name == "--tokens") {
      c->tokens = static_cast<uint32_t>(std::atoi(value.c_str()));
    } else if (name == "--latency-calls") {
      c->latency_calls = std::atoi(value.c_str());
    } else if (name == "--backend" && (value == "host" || value == "cuda")) {
      c->cuda = value == "cuda";
    } else {
      return false;
    }
  }
  return c->fill > 0 && c->fill <= 1 && c->layers > 0 && c->tokens > 1 && c->record_bytes >= sizeof(Signature) &&
         c->latency_calls >= 0;
}

// Durable requests until they hold `fill` of the pool, every record stored: their ids.
std::vector<uint64_t> FillPool(hs_session* s, const Config& c) {
  const uint64_t per_request = c.layers * ((uint64_t{c.tokens} * c.record_bytes + c.page - 1) / c.page) * c.page;
  const uint64_t count = std::max<uint64_t>(1, static_cast<uint64_t>(c.fill * c.pool) / per_request);
  std::vector<uint8_t> prompt(uint64_t{c.layers} * c.tokens * c.record_bytes);
  for (uint32_t l = 0; l < c.layers; ++l) {
    for (uint32_t p = 0; p < c.tokens; ++p) {
      uint8_t* rec = &prompt[(uint64_t{l} * c.tokens + p) * c.record_bytes];
      for (uint32_t i = 0; i < c.record_bytes; ++i) rec[i] = Fill(l, p, i);
    }
  }
  std::vector<uint64_t> ids;
  for (uint64_t id = 1; id <= count; ++id) {
    hs_admit_args a = HS_ADMIT_ARGS_INIT;
    a.request_id = id;
    a.context_tokens = c.tokens;
    a.token_budget = c.tokens;
    a.lease_seconds = 3600;
    if (hs_admit2(s, &a, nullptr) != HS_OK) {
      std::fprintf(stderr, "restart: admitting request %llu of %llu: %s\n", static_cast<unsigned long long>(id),
                   static_cast<unsigned long long>(count), hs_last_error());
      return {};
    }
    if (hs_store(s, id, 0, static_cast<int32_t>(c.tokens), static_cast<int32_t>(c.tokens), prompt.data(),
                 int64_t{c.tokens} * c.record_bytes, c.record_bytes, nullptr) != HS_OK ||
        !Stamp(s, id, c, true)) {
      std::fprintf(stderr, "restart: storing request %llu: %s\n", static_cast<unsigned long long>(id), hs_last_error());
      return {};
    }
    ids.push_back(id);
  }
  return ids;
}

// Every record of request `id` but the signatures: what hs_store wrote.
bool WholeRequestIntact(hs_session* s, uint64_t id, const Config& c) {
  for (uint32_t l = 0; l < c.layers; ++l) {
    for (uint32_t p = 1; p + 1 < c.tokens; ++p) {
      void* rec = nullptr;
      if (hs_record_ptr(s, id, l, p, &rec) != HS_OK) return false;
      for (uint32_t i = 0; i < c.record_bytes; ++i) {
        if (static_cast<const uint8_t*>(rec)[i] != Fill(l, p, i)) return false;
      }
    }
  }
  return true;
}

// --ride-through, after the fill: the daemon SIGKILLed under the live session `s`, which notices,
// recovers and checks its requests. Prints the JSON line; whether every request came back intact.
bool RideThrough(const Config& c, KeptDaemon& kept, hs_session* s, const std::vector<uint64_t>& ids, double fill_s,
                 uint64_t held, double adopt_s) {
  hs_session_info before = HS_SESSION_INFO_INIT;
  hs_session_get_info(s, &before);
  const pid_t old = kept.DaemonToKill();
  if (old == 0) return false;
  const auto killed = Clock::now();
  ::kill(old, SIGKILL);
  hs_session_state state = HS_SESSION_LIVE;
  while (hs_session_get_state(s, &state) == HS_OK && state == HS_SESSION_LIVE && Seconds(killed, Clock::now()) < 120) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const auto noticed = Clock::now();
  hs_recovery rec = HS_RECOVERY_INIT;
  const bool recovered = hs_session_recover(s, 120000, &rec) == HS_OK;
  if (!recovered) std::fprintf(stderr, "restart: recover: %s\n", hs_last_error());
  const auto done = Clock::now();
  hs_session_info after = HS_SESSION_INFO_INIT;
  hs_session_get_info(s, &after);
  size_t intact = 0;
  for (uint64_t id : ids) intact += recovered && Stamp(s, id, c, false) ? 1 : 0;
  const bool whole = recovered && WholeRequestIntact(s, ids[ids.size() / 2], c);
  for (uint64_t id : ids) hs_release(s, id);
  const bool ok = recovered && rec.kept == ids.size() && rec.lost == 0 && intact == ids.size() && whole;
  std::printf(
      "{\"bench\":\"restart\",\"mode\":\"ride_through\",\"backend\":\"%s\",\"pool_bytes\":%llu,\"page_bytes\":%llu,"
      "\"slab_bytes\":%llu,\"held_bytes\":%llu,\"requests\":%zu,\"layers\":%u,\"tokens\":%u,\"record_bytes\":%u,"
      "\"fill_s\":%.3f,\"adopt_s\":%.4f,\"kill_to_noticed_s\":%.4f,\"recover_s\":%.4f,\"reopen_s\":%.4f,\"kill_to_"
      "recovered_s\":%.4f,"
      "\"daemon_recovery_s\":%.4f,\"attempts\":%u,\"kept\":%zu,\"lost\":%zu,\"arena_moved\":%s,"
      "\"arena_same_address\":%s,\"signatures_intact\":%zu,\"whole_request_intact\":%s,\"ok\":%s}\n",
      c.cuda ? "cuda" : "host", static_cast<unsigned long long>(c.pool), static_cast<unsigned long long>(c.page),
      static_cast<unsigned long long>(c.slab), static_cast<unsigned long long>(held), ids.size(), c.layers, c.tokens,
      c.record_bytes, fill_s, adopt_s, Seconds(killed, noticed), rec.seconds, rec.reopen_seconds, Seconds(killed, done),
      DaemonRecoverySeconds(kept.address()), rec.attempts, rec.kept, rec.lost, rec.arena_moved ? "true" : "false",
      before.slot_base == after.slot_base ? "true" : "false", intact, whole ? "true" : "false", ok ? "true" : "false");
  return ok;
}

// The default mode, after the fill: the filler's session ends, the daemon is SIGKILLed, and a new
// session of the engine adopts everything and checks it. Prints the JSON line; whether every
// request came back intact.
bool AdoptAfterTheKill(const Config& c, KeptDaemon& kept, hs_session* s, const std::vector<uint64_t>& ids,
                       double fill_s, uint64_t held, const std::vector<double>& journal_us,
                       const std::vector<double>& plain_us) {
  // The filling engine goes first (its session ends: the requests are the daemon's orphans, as
  // after an engine's death), so that the adopter maps the pool alone, as a restarted engine
  // would; closing it after the kill would count unmapping 58 GiB (at a 64 GiB pool) in this
  // process into the restart, and an adopter sharing the process with those mappings took up to
  // 10 s, the control call's deadline, to map them again.
  hs_session_close(s);
  const pid_t old = kept.DaemonToKill();
  if (old == 0) return false;
  const auto killed = Clock::now();
  ::kill(old, SIGKILL);
  // Until the kernel has torn the killed daemon down (its mappings of the pool) and the keeper
  // reaped it.
  while (::kill(old, 0) == 0 && Seconds(killed, Clock::now()) < 120) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const auto exited = Clock::now();
  hs_session* heir = nullptr;
  for (;;) {  // the keeper's next daemon, not the dying one
    heir = OpenSession(c, kept.address(), 60);
    if (heir == nullptr || kept.DaemonPid() != old) break;
    hs_session_close(heir);
  }
  if (heir == nullptr) return false;
  const auto serving = Clock::now();
  std::vector<uint64_t> dead(ids.size() + 1), rids(ids.size() + 1);
  size_t n = 0;
  while (hs_list_adoptable(heir, dead.data(), rids.data(), nullptr, dead.size(), &n) == HS_OK && n < ids.size()) {
    if (Seconds(killed, Clock::now()) > 120) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const auto adoptable = Clock::now();
  size_t adopted = 0;
  const bool listed = n == ids.size();
  if (listed && hs_adopt(heir, dead[0], rids.data(), rids.size(), &adopted) != HS_OK) {
    std::fprintf(stderr, "restart: adopt: %s\n", hs_last_error());
  }
  const auto adopted_at = Clock::now();
  const double daemon_recovery_s = DaemonRecoverySeconds(kept.address());
  size_t intact = 0;
  for (uint64_t id : ids) intact += Stamp(heir, id, c, false) ? 1 : 0;
  const bool whole = WholeRequestIntact(heir, ids[ids.size() / 2], c);
  for (uint64_t id : ids) hs_release(heir, id);
  hs_session_close(heir);
  const bool ok = listed && adopted == ids.size() && intact == ids.size() && whole;
  std::printf(
      "{\"bench\":\"restart\",\"pool_bytes\":%llu,\"page_bytes\":%llu,\"slab_bytes\":%llu,\"held_bytes\":%llu,"
      "\"requests\":%zu,\"layers\":%u,\"tokens\":%u,\"record_bytes\":%u,\"fill_s\":%.3f,"
      "\"kill_to_exit_s\":%.4f,\"daemon_recovery_s\":%.4f,\"kill_to_serving_s\":%.4f,\"kill_to_adoptable_s\":%.4f,"
      "\"adopt_s\":%.4f,\"adoptable\":%zu,"
      "\"adopted\":%zu,\"signatures_intact\":%zu,\"whole_request_intact\":%s,"
      "\"admit_release_us\":{\"journal\":{\"p50\":%.1f,\"p99\":%.1f},\"no_journal\":{\"p50\":%.1f,\"p99\":%.1f},"
      "\"calls\":%d},\"ok\":%s}\n",
      static_cast<unsigned long long>(c.pool), static_cast<unsigned long long>(c.page),
      static_cast<unsigned long long>(c.slab), static_cast<unsigned long long>(held), ids.size(), c.layers, c.tokens,
      c.record_bytes, fill_s, Seconds(killed, exited), daemon_recovery_s, Seconds(killed, serving),
      Seconds(killed, adoptable), Seconds(adoptable, adopted_at), n, adopted, intact, whole ? "true" : "false",
      Quantile(journal_us, 0.5), Quantile(journal_us, 0.99), Quantile(plain_us, 0.5), Quantile(plain_us, 0.99),
      c.latency_calls, ok ? "true" : "false");
  return ok;
}

}  // namespace

int RestartMain(int argc, char** argv) {
  Config c;
  if (!ParseArgs(argc, argv, &c)) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  char tmpl[] = "/tmp/hisparse-restart-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl;
  int rc = 1;
  {
    KeptDaemon kept(c, dir);
    hs_session* s = OpenSession(c, kept.address(), 60);
    if (s == nullptr) return 1;
    // The admit latency, journal on (this daemon) and off (one started without a keeper).
    const std::vector<double> journal_us = AdmitReleaseLatencies(s, c.tokens, 3600, c.latency_calls);
    std::vector<double> plain_us;
    {
      Config small = c;
      small.pool = std::min<uint64_t>(c.pool, 256ull << 20);
      absl::StatusOr<std::unique_ptr<DaemonProcess>> plain = DaemonProcess::Start(
          {"--host-pool-size", std::to_string(small.pool), "--host-pool-page-size", std::to_string(c.page),
           "--host-pool-slab-size", std::to_string(c.slab), "--log-level", "warning", "--set", "import.enabled=false"},
          120000);
      if (!plain.ok()) {
        std::fprintf(stderr, "restart: %s\n", std::string(plain.status().message()).c_str());
        return 1;
      }
      hs_session* ps = OpenSession(small, (*plain)->address(), 60);
      if (ps == nullptr) return 1;
      plain_us = AdmitReleaseLatencies(ps, c.tokens, 3600, c.latency_calls);
      hs_session_close(ps);
    }
    const auto fill_start = Clock::now();
    const std::vector<uint64_t> ids = FillPool(s, c);
    if (ids.empty()) return 1;
    const double fill_s = Seconds(fill_start, Clock::now());
    const uint64_t held =
        ids.size() * c.layers * ((uint64_t{c.tokens} * c.record_bytes + c.page - 1) / c.page) * c.page;
    if (c.ride_through) {
      double adopt_s = 0;
      if (c.cuda) {           // the filler's requests, adopted by a CUDA-backend session (hs_store took host memory)
        hs_session_close(s);  // its requests become orphans of this engine
        s = OpenSession(c, kept.address(), 60, true);
        if (s == nullptr) return 1;
        std::vector<uint64_t> from(ids.size() + 1), rids(ids.size() + 1);
        size_t n = 0, adopted = 0;
        const auto t0 = Clock::now();
        while (hs_list_adoptable(s, from.data(), rids.data(), nullptr, from.size(), &n) == HS_OK && n < ids.size() &&
               Seconds(t0, Clock::now()) < 120) {  // the filler's session ends asynchronously
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        if (n != ids.size() || hs_adopt(s, from[0], rids.data(), rids.size(), &adopted) != HS_OK ||
            adopted != ids.size()) {
          std::fprintf(stderr, "restart: the CUDA session's adoption: %s\n", hs_last_error());
          return 1;
        }
        adopt_s = Seconds(t0, Clock::now());
      }
      rc = RideThrough(c, kept, s, ids, fill_s, held, adopt_s) ? 0 : 1;
      hs_session_close(s);
    } else {
      rc = AdoptAfterTheKill(c, kept, s, ids, fill_s, held, journal_us, plain_us) ? 0 : 1;
    }
  }
  std::string rm = "rm -rf " + dir;
  (void)std::system(rm.c_str());
  return rc;
}

}  // namespace hisparse::bench
