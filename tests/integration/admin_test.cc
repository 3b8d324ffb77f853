// Operating the daemon: hisparse-ctl's commands, eviction with notice, drain and health, metrics,
// SIGHUP reload — against real hisparsed processes.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/common/version.h"
#include "test_support.h"

namespace hisparse::testing {
namespace admin_test {

grpc::health::v1::HealthCheckResponse::ServingStatus Health(const std::string& address) {
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service("hisparse.v1.HiSparse");
  grpc::health::v1::HealthCheckResponse resp;
  EXPECT_TRUE(stub->Check(&ctx, req, &resp).ok());
  return resp.status();
}

TEST(AdminTest, EveryCommandHumanAndJson) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const std::string a = daemon->address();
  Session s;
  ASSERT_TRUE(Session::Open(SmallGeometry(a), &s).ok());
  ASSERT_TRUE(s.Admit(11, 10, 1000).ok());
  ASSERT_TRUE(s.Admit(12, 10, 1000).ok());
  hs_session_info info;
  s.Info(&info);
  const std::string sid = std::to_string(info.session_id);

  CommandResult r = Ctl(a, "status");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("SERVING"), std::string::npos) << r.out;
  r = Ctl(a, "--json status");
  EXPECT_NE(r.out.find("\"health\": \"SERVING\""), std::string::npos) << r.out;
  r = Ctl(a, "sessions");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("integration-test"), std::string::npos) << r.out;
  r = Ctl(a, "sessions --json");
  EXPECT_NE(r.out.find("\"session_id\": " + sid), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"requests\": 2"), std::string::npos) << r.out;
  r = Ctl(a, "requests --session " + sid + " --json");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("\"request_id\": 11"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"request_id\": 12"), std::string::npos) << r.out;
  EXPECT_EQ(Ctl(a, "requests --session 999").exit_code, 1);  // the daemon says no such session
  r = Ctl(a, "config");
  EXPECT_NE(r.out.find("host_pool:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("size: 64MiB"), std::string::npos) << r.out;
  r = Ctl(a, "--json watch --count 2 --interval 0.05");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n') >= 2, true) << r.out;
  r = Ctl(a, "stats");
  EXPECT_NE(r.out.find("HIT RATE"), std::string::npos) << r.out;
  const std::string completion = Ctl(a, "completion bash").out;
  EXPECT_NE(completion.find("complete -F _hisparse_ctl hisparse-ctl"), std::string::npos) << completion;
  EXPECT_NE(completion.find("evict"), std::string::npos) << completion;  // generated from the table
  EXPECT_NE(Ctl(a, "man").out.find(".B evict"), std::string::npos);
  EXPECT_EQ(Ctl(a, "no-such-command").exit_code, 64);  // EX_USAGE

  // evict: the engine hears of it, then the memory is gone.
  r = Ctl(a, "evict 11 --session " + sid + " --reason test");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("evicted request 11"), std::string::npos) << r.out;
  uint64_t ids[4];
  size_t n = 0;
  ASSERT_TRUE(WaitUntil([&] { return hs_poll_evicted(s.get(), ids, 4, &n) != HS_OK || n != 0; }));
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(ids[0], 11u);
  void* rec = nullptr;
  EXPECT_EQ(s.RecordPtr(11, 0, 0, &rec).code, HS_ERR_NOT_FOUND);  // the client forgot it too
  v1::StatsResponse st = Stats(a);
  EXPECT_EQ(st.requests(), 1u);
  EXPECT_EQ(st.evictions(), 1u);
  EXPECT_EQ(Ctl(a, "evict 11 --session " + sid).exit_code, 1);  // already gone
}

TEST(AdminTest, DrainTurnsHealthNotServingRefusesAdmissionsAndExitsWhenIdle) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const std::string a = daemon->address();
  EXPECT_EQ(Health(a), grpc::health::v1::HealthCheckResponse::SERVING);
  Session s;
  ASSERT_TRUE(Session::Open(SmallGeometry(a), &s).ok());
  ASSERT_TRUE(s.Admit(1, 10, 100).ok());
  CommandResult r = Ctl(a, "drain --no-wait");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(Health(a), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(s.Admit(2, 10, 100).code, HS_ERR_FAILED_PRECONDITION);
  EXPECT_EQ(Ctl(a, "status").exit_code, 1);  // answers, but does not serve
  EXPECT_TRUE(s.Release(1).ok());            // what is held can still be released
  v1::StatsResponse st = Stats(a);
  EXPECT_TRUE(st.draining());
  s.Close();  // the last session ends: the daemon exits
  const absl::StatusOr<int> status = daemon->WaitExit(30000);
  ASSERT_TRUE(status.ok()) << status.status();
  // 75 (kDrainedExitCode): a drain is a graceful restart, which the systemd unit restarts.
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 75) << *status;
}

// drain --cancel: the daemon admits again, health is SERVING, and the drain's exit once idle is off:
// the last session ending leaves it serving, and SIGTERM then stops it with 0, not a drain's 75.
TEST(AdminTest, DrainCancelAdmitsAgainAndDoesNotExitWhenIdle) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const std::string a = daemon->address();
  CommandResult r = Ctl(a, "drain --cancel");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, "not draining: nothing to cancel\n");
  Session s;
  ASSERT_TRUE(Session::Open(SmallGeometry(a), &s).ok());
  ASSERT_TRUE(s.Admit(1, 10, 100).ok());
  ASSERT_EQ(Ctl(a, "drain --no-wait").exit_code, 0);
  EXPECT_EQ(Health(a), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(s.Admit(2, 10, 100).code, HS_ERR_FAILED_PRECONDITION);
  Session refused;
  EXPECT_EQ(Session::Open(SmallGeometry(a), &refused).code, HS_ERR_FAILED_PRECONDITION);

  r = Ctl(a, "drain --cancel --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, "{\"cancelled\": true, \"sessions\": 1}\n");
  EXPECT_EQ(Health(a), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_FALSE(Stats(a).draining());
  EXPECT_EQ(Ctl(a, "status").exit_code, 0);
  EXPECT_TRUE(s.Admit(2, 10, 100).ok());
  Session second;
  ASSERT_TRUE(Session::Open(SmallGeometry(a), &second).ok());
  EXPECT_EQ(Ctl(a, "drain --cancel --no-wait").exit_code, 64);  // --cancel waits for nothing

  // Every session ends: a drain that was not cancelled would stop the daemon now (75).
  s.Close();
  second.Close();
  ASSERT_TRUE(WaitUntil([&] { return Stats(a).sessions() == 0; }));
  Session after;
  ASSERT_TRUE(Session::Open(SmallGeometry(a), &after).ok());
  EXPECT_TRUE(after.Admit(1, 10, 100).ok());
  after.Close();
  ASSERT_TRUE(WaitUntil([&] { return Stats(a).sessions() == 0; }));
  EXPECT_EQ(Health(a), grpc::health::v1::HealthCheckResponse::SERVING);
  const int status = daemon->Signal(SIGTERM);  // waits for the exit
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// A drain whose exit_when_idle went idle cannot be cancelled any more: the daemon is exiting 75.
TEST(AdminTest, DrainCancelAfterTheDrainWentIdleIsRefused) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const std::string a = daemon->address();
  // No session: the drain is idle at once and the daemon stops; a cancel either reaches a daemon
  // that refuses it (1) or finds none (2), never one that turns SERVING again.
  ASSERT_EQ(Ctl(a, "drain --no-wait").exit_code, 0);
  const int cancel = Ctl(a, "--timeout-ms 2000 drain --cancel").exit_code;
  EXPECT_TRUE(cancel == 1 || cancel == 2) << cancel;
  const absl::StatusOr<int> status = daemon->WaitExit(30000);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 75) << *status;
}

std::string HttpGet(int port, const std::string& path) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return "";
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!::write(fd.get(), req.data(), req.size());
  std::string out;
  char buf[8192];
  ssize_t n;
  while ((n = ::read(fd.get(), buf, sizeof(buf))) > 0) out.append(buf, n);
  const size_t body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

TEST(AdminTest, MetricsScrapeIsValidPrometheusExposition) {
  // Port 0: the kernel picks a free port as the daemon binds, and the test reads it back.
  auto daemon = StartDaemon({"--host-pool-size", "64MiB", "--host-pool-page-size", "4KiB", "--host-pool-slab-size",
                             "4MiB", "--metrics-listen", "127.0.0.1:0"});
  ASSERT_NE(daemon, nullptr);
  const absl::StatusOr<int> port_or = daemon->ListeningTcpPort();
  ASSERT_TRUE(port_or.ok()) << port_or.status();
  const int port = *port_or;
  ASSERT_GT(port, 0);
  const std::string a = daemon->address();
  Session s;
  ASSERT_TRUE(Session::Open(SmallGeometry(a), &s).ok());
  ASSERT_TRUE(s.Admit(1, 10, 1000).ok());
  EXPECT_EQ(s.Admit(2, 10, 1u << 30).code, HS_ERR_INVALID_ARGUMENT);
  const std::string text = HttpGet(port, "/metrics");
  ASSERT_FALSE(text.empty());
  for (const char* want :
       {"hisparse_host_pool_bytes{state=\"used\"} 262144", "hisparse_sessions 1", "hisparse_requests 1",
        "hisparse_admissions_total 1", "hisparse_rejections_total{reason=\"pool_full\"} 0",
        "hisparse_rpc_duration_seconds_bucket{method=\"Admit\"", "hisparse_control_lanes 1",
        "hisparse_control_lane_hellos_total{result=\"opened\"} 1",
        "hisparse_control_lane_hellos_total{result=\"refused\"} 0",
        "hisparse_resolve_hits_total{gpu=\"-1\",session=\"1\"} 0",
        "hisparse_resolve_rejected_rows_total{gpu=\"-1\",session=\"1\"} 0", "# TYPE hisparse_evictions_total counter",
        "hisparse_build_info{version=\"" HISPARSE_VERSION "\"} 1"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
  // promtool (Debian's prometheus package) lints the exposition when it is installed.
  if (RunCommand("command -v promtool").exit_code == 0) {
    char path[] = "/tmp/hisparse-metrics-XXXXXX";
    const int fd = ::mkstemp(path);
    ASSERT_GE(fd, 0);
    (void)!::write(fd, text.data(), text.size());
    ::close(fd);
    CommandResult lint = RunCommand("promtool check metrics < " + std::string(path) + " 2>&1");
    ::unlink(path);
    // prometheus-cpp's own exposer_* summary is not ours to rename; judge only hisparse_ lines.
    std::string ours;
    for (size_t i = 0, j; i < lint.out.size(); i = j + 1) {
      j = lint.out.find('\n', i);
      if (j == std::string::npos) j = lint.out.size();
      const std::string line = lint.out.substr(i, j - i);
      if (line.find("hisparse_") != std::string::npos) ours += line + "\n";
    }
    EXPECT_TRUE(ours.empty()) << "promtool:\n" << lint.out;
  } else {
    std::printf("promtool not installed: exposition lint skipped\n");
  }
}

// durability.max_lease_seconds changes on SIGHUP: a lowered bound refuses later leases (SetLease and
// admission) above it, while a lease granted before keeps its deadline (its orphan stays adoptable
// with more time left than the new bound).
TEST(AdminTest, SighupLowersTheLeaseBoundForLaterLeasesOnly) {
  char dir[] = "/tmp/hisparse-cfg-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/hisparsed.yaml";
  const std::string pool = "host_pool:\n  size: 64MiB\n  page_size: 4KiB\n  slab_size: 4MiB\n";
  std::ofstream(path) << pool << "durability:\n  max_lease_seconds: 600\n";
  auto daemon = StartDaemon({"--config", path});
  ASSERT_NE(daemon, nullptr);
  const std::string a = daemon->address();
  Session s;
  ASSERT_TRUE(Session::Open(SmallGeometry(a), &s).ok());
  hs_request_info info = HS_REQUEST_INFO_INIT;
  ASSERT_EQ(hs_admit_durable(s.get(), 1, 16, 64, 500, &info), HS_OK) << hs_last_error();
  std::ofstream(path) << pool << "durability:\n  max_lease_seconds: 100\n";
  ::kill(daemon->pid(), SIGHUP);
  std::string cfg;
  EXPECT_TRUE(WaitUntil([&] {
    cfg = Ctl(a, "config").out;
    return cfg.find("max_lease_seconds: 100\n") != std::string::npos;
  })) << cfg;
  EXPECT_EQ(hs_set_lease(s.get(), 1, 500), HS_ERR_INVALID_ARGUMENT) << "a renewal above the new bound";
  EXPECT_EQ(hs_admit_durable(s.get(), 2, 16, 64, 101, &info), HS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(hs_admit_durable(s.get(), 3, 16, 64, 100, &info), HS_OK) << hs_last_error();
  // Request 1's lease of 500 s still runs past the new bound: its orphan keeps that deadline.
  s.Close();
  Session next;
  ASSERT_TRUE(Session::Open(SmallGeometry(a), &next).ok());
  uint64_t dead[4] = {}, ids[4] = {};
  double left[4] = {};
  size_t count = 0;
  // The daemon ends the old session as its stream closes: poll until its orphan is there.
  EXPECT_TRUE(
      WaitUntil([&] { return hs_list_adoptable(next.get(), dead, ids, left, 4, &count) == HS_OK && count == 2; }));
  ASSERT_EQ(count, 2u);
  EXPECT_EQ(ids[0], 1u);
  EXPECT_GT(left[0], 100.0);
  EXPECT_LE(left[0], 500.0);
  EXPECT_EQ(ids[1], 3u);
  EXPECT_LE(left[1], 100.0);
  ::unlink(path.c_str());
  ::rmdir(dir);
}

TEST(AdminTest, SighupReloadsWhatCanChangeLiveAndKeepsFlagOverrides) {
  char dir[] = "/tmp/hisparse-cfg-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/hisparsed.yaml";
  std::ofstream(path)
      << "host_pool:\n  size: 64MiB\n  page_size: 4KiB\n  slab_size: 4MiB\nlimits:\n  max_sessions: 8\n";
  auto daemon = StartDaemon({"--config", path});
  ASSERT_NE(daemon, nullptr);
  const std::string a = daemon->address();
  std::ofstream(path)
      << "host_pool:\n  size: 128MiB\n  page_size: 4KiB\n  slab_size: 4MiB\nlimits:\n  max_sessions: 1\n"
      << "  max_tokens_per_request: 4096\nlog_level: debug\n";
  ::kill(daemon->pid(), SIGHUP);
  std::string cfg;
  WaitUntil([&] {
    cfg = Ctl(a, "config").out;
    return cfg.find("max_sessions: 1\n") != std::string::npos;
  });
  EXPECT_NE(cfg.find("max_sessions: 1\n"), std::string::npos) << cfg;
  // StartDaemon passes --log-level warning: a flag keeps overriding the file across reloads.
  EXPECT_NE(cfg.find("log_level: warning"), std::string::npos) << cfg;
  EXPECT_NE(cfg.find("size: 64MiB"), std::string::npos) << "the pool cannot change live\n" << cfg;
  // Sessions' page-table strides derive from it: it waits for a restart, and config says so.
  EXPECT_EQ(cfg.find("max_tokens_per_request: 4096"), std::string::npos) << cfg;
  Session one, two;
  ASSERT_TRUE(Session::Open(SmallGeometry(a), &one).ok());
  EXPECT_EQ(Session::Open(SmallGeometry(a), &two).code, HS_ERR_RESOURCE_EXHAUSTED);
  ::unlink(path.c_str());
  ::rmdir(dir);
}

// After SIGHUP: ctl status and config show the last reload's outcome and the restart-only keys
// whose file value differs from the running one, and /metrics counts them; a refused file shows
// with its reason and leaves the pending keys as they were; a file back at the running value
// clears them.
TEST(AdminTest, ReloadOutcomeAndRestartPendingKeysInStatusConfigAndMetrics) {
  char dir[] = "/tmp/hisparse-cfg-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/hisparsed.yaml";
  std::ofstream(path)
      << "host_pool:\n  size: 64MiB\n  page_size: 4KiB\n  slab_size: 4MiB\nlimits:\n  max_sessions: 8\n";
  auto daemon = StartDaemon({"--config", path, "--metrics-listen", "127.0.0.1:0"});
  ASSERT_NE(daemon, nullptr);
  const std::string a = daemon->address();
  const absl::StatusOr<int> port = daemon->ListeningTcpPort();
  ASSERT_TRUE(port.ok()) << port.status();
  CommandResult r = Ctl(a, "status");
  EXPECT_NE(r.out.find("reload     none since start\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("pending until a restart"), std::string::npos) << r.out;
  EXPECT_NE(HttpGet(*port, "/metrics").find("\nhisparse_config_restart_pending_keys 0\n"), std::string::npos);

  // host_pool.size needs a restart; limits.max_sessions changes live.
  std::ofstream(path)
      << "host_pool:\n  size: 128MiB\n  page_size: 4KiB\n  slab_size: 4MiB\nlimits:\n  max_sessions: 3\n";
  ASSERT_EQ(::kill(daemon->pid(), SIGHUP), 0);
  ASSERT_TRUE(WaitUntil([&] { return Ctl(a, "config").out.find("max_sessions: 3\n") != std::string::npos; }));
  const std::string pending = "host_pool.size: running \"64MiB\", file \"128MiB\"\n";
  r = Ctl(a, "status");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("reload     applied at 20"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pending until a restart"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(pending), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("max_sessions: running"), std::string::npos) << "a live key is not pending\n" << r.out;
  r = Ctl(a, "config");
  EXPECT_NE(r.out.find("size: 64MiB\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n# last reload: applied at "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n#   " + pending), std::string::npos) << r.out;
  r = Ctl(a, "status --json");
  EXPECT_NE(r.out.find("\"ok\": true, \"error\": \"\", \"pending_restart\": [{\"key\": \"host_pool.size\", "
                       "\"running\": \"64MiB\", \"file\": \"128MiB\"}]}"),
            std::string::npos)
      << r.out;
  if (RunCommand("python3 -c 'import json'").exit_code == 0) {
    r = RunCommand(
        BinDir() + "/hisparse-ctl --daemon " + a +
        " config --json | python3 -c 'import json, sys; d = json.load(sys.stdin); "
        "print(d[\"limits\"][\"max_sessions\"], d[\"reload\"][\"ok\"], d[\"reload\"][\"pending_restart\"])'");
    EXPECT_EQ(r.out, "3 True [{'key': 'host_pool.size', 'running': '64MiB', 'file': '128MiB'}]\n") << r.out;
  }
  std::string metrics = HttpGet(*port, "/metrics");
  EXPECT_NE(metrics.find("\nhisparse_config_restart_pending_keys 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\nhisparse_config_last_reload_successful 1\n"), std::string::npos) << metrics;

  // A refused file: the outcome and its reason; the running config and the pending keys stay.
  std::ofstream(path) << "host_pool:\n  size: 128MiB\nlimits:\n  max_sessions: 0\n";
  ASSERT_EQ(::kill(daemon->pid(), SIGHUP), 0);
  ASSERT_TRUE(WaitUntil([&] { return Ctl(a, "status").out.find("REFUSED") != std::string::npos; }));
  r = Ctl(a, "status");
  EXPECT_NE(r.out.find("reload     REFUSED at 20"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the running config kept: " + path + ": limits.max_sessions: must be >= 1, got 0"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(pending), std::string::npos) << r.out;
  EXPECT_NE(Ctl(a, "config").out.find("max_sessions: 3\n"), std::string::npos);
  EXPECT_NE(Ctl(a, "status --json").out.find("\"ok\": false, \"error\": \"" + path + ": limits.max_sessions"),
            std::string::npos);
  metrics = HttpGet(*port, "/metrics");
  EXPECT_NE(metrics.find("\nhisparse_config_last_reload_successful 0\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\nhisparse_config_restart_pending_keys 1\n"), std::string::npos) << metrics;

  // The file back at the running pool size: nothing pending.
  std::ofstream(path)
      << "host_pool:\n  size: 64MiB\n  page_size: 4KiB\n  slab_size: 4MiB\nlimits:\n  max_sessions: 4\n";
  ASSERT_EQ(::kill(daemon->pid(), SIGHUP), 0);
  ASSERT_TRUE(WaitUntil([&] { return Ctl(a, "config").out.find("max_sessions: 4\n") != std::string::npos; }));
  r = Ctl(a, "status");
  EXPECT_NE(r.out.find("reload     applied at 20"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("pending until a restart"), std::string::npos) << r.out;
  EXPECT_NE(HttpGet(*port, "/metrics").find("\nhisparse_config_restart_pending_keys 0\n"), std::string::npos);
  ::unlink(path.c_str());
  ::rmdir(dir);
}

}  // namespace admin_test
}  // namespace hisparse::testing
