// The control plane under hostile or careless peers, against real hisparsed processes: an engine
// that never reads its event stream cannot stall an eviction, idle connections cannot starve the
// metrics server, an emptied config file cannot drop the quotas on SIGHUP, and an engine name
// that is not UTF-8 is refused with a message.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "hisparse/common/unique_fd.h"
#include "test_support.h"

namespace hisparse::testing {
namespace hardening_test {

using Clock = std::chrono::steady_clock;

v1::OpenSession HostOpen(uint32_t max_requests) {
  v1::OpenSession open;
  open.set_engine_name("hardening-test");
  v1::Geometry* g = open.mutable_geometry();
  g->set_gpu(-1);
  g->set_num_layers(1);
  g->set_record_bytes(64);
  g->set_k(1);
  g->set_slots(1);
  g->set_max_requests(max_requests);
  return open;
}

TEST(HardeningTest, EvictDoesNotWaitOnAStreamNobodyReads) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const std::string a = daemon->address();
  // An engine that opens a session and then never reads its stream. Without BDP probing its
  // receive window stays at 64 KiB, which the notices below fill many times over.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  auto lazy = v1::HiSparse::NewStub(grpc::CreateCustomChannel(a, grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext lazy_ctx;
  auto stream = lazy->Session(&lazy_ctx);
  v1::SessionRequest open;
  *open.mutable_open() = HostOpen(256);
  ASSERT_TRUE(stream->Write(open));
  v1::SessionEvent opened;
  ASSERT_TRUE(stream->Read(&opened));
  ASSERT_TRUE(opened.has_opened());
  v1::SessionRef ref;
  ref.set_session_id(opened.opened().session_id());
  ref.set_token(opened.opened().token());

  constexpr int kRequests = 200;
  for (int id = 1; id <= kRequests; ++id) {
    v1::AdmitRequest req;
    *req.mutable_session() = ref;
    req.set_request_id(id);
    req.set_token_budget(4);
    grpc::ClientContext ctx;
    v1::AdmitResponse resp;
    ASSERT_TRUE(lazy->Admit(&ctx, req, &resp).ok()) << id;
  }
  // The operator evicts every request, each with a 16 KiB reason: every Evict answers.
  auto admin = RawStub(a);
  const std::string reason(16 << 10, 'r');
  for (int id = 1; id <= kRequests; ++id) {
    v1::EvictRequest req;
    req.set_session_id(ref.session_id());
    req.set_request_id(id);
    req.set_reason(reason);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::EvictResponse resp;
    const grpc::Status st = admin->Evict(&ctx, req, &resp);
    ASSERT_TRUE(st.ok()) << "evict " << id << ": " << st.error_message();
    EXPECT_GT(resp.freed_bytes(), 0u);
  }
  const v1::StatsResponse st = Stats(a);
  EXPECT_EQ(st.requests(), 0u);
  EXPECT_EQ(st.evictions(), uint64_t{kRequests});
  EXPECT_EQ(st.host_pool().used_bytes(), 0u);
  EXPECT_GT(st.undelivered_notices(), 0u);  // counted, not waited for
  std::printf("%d evictions of a session that does not read: %lu notices undelivered\n", kRequests,
              static_cast<unsigned long>(st.undelivered_notices()));
  lazy_ctx.TryCancel();
  (void)stream->Finish();
}

int FreeLoopbackPort() {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return 0;
  socklen_t len = sizeof(addr);
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.sin_port);
}

// A connection to the port, or an invalid fd when connect takes over 10 s (a listener that no
// longer accepts: connect waits on SYN retries for minutes otherwise).
UniqueFd ConnectLoopback(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM, 0));
  timeval connect_timeout{10, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &connect_timeout, sizeof(connect_timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return UniqueFd();
  return fd;
}

TEST(HardeningTest, MetricsAnswerBesideManyIdleConnections) {
  const int port = FreeLoopbackPort();
  auto daemon = StartDaemon({"--host-pool-size", "64MiB", "--host-pool-page-size", "4KiB", "--host-pool-slab-size",
                             "4MiB", "--metrics-listen", "127.0.0.1:" + std::to_string(port)});
  ASSERT_NE(daemon, nullptr);
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 300; ++i) {
    idle.push_back(ConnectLoopback(port));
    ASSERT_TRUE(idle.back().valid()) << i;
  }
  // A scrape now still answers, within a bounded wait (the read gives up after 30 s).
  const auto start = Clock::now();
  UniqueFd scrape = ConnectLoopback(port);
  ASSERT_TRUE(scrape.valid());
  timeval timeout{30, 0};
  ::setsockopt(scrape.get(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
  ASSERT_EQ(::write(scrape.get(), req.data(), req.size()), static_cast<ssize_t>(req.size()));
  std::string out;
  char buf[8192];
  for (ssize_t n; (n = ::read(scrape.get(), buf, sizeof(buf))) > 0;) out.append(buf, n);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_NE(out.find("hisparse_up 1"), std::string::npos) << "no scrape answer in " << seconds << " s";
  std::printf("scrape beside 300 idle connections answered in %.2f s\n", seconds);
}

// The body of GET /metrics on the loopback port, or "" when it does not answer within 30 s.
std::string ScrapeMetrics(int port) {
  UniqueFd fd = ConnectLoopback(port);
  if (!fd.valid()) return "";
  timeval timeout{30, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
  if (::write(fd.get(), req.data(), req.size()) != static_cast<ssize_t>(req.size())) return "";
  std::string out;
  char buf[8192];
  for (ssize_t n; (n = ::read(fd.get(), buf, sizeof(buf))) > 0;) out.append(buf, n);
  return out;
}

// A metrics port another process holds stops the start with the port and the key to change named,
// and leaves neither socket behind (the fd channel's used to stay).
TEST(HardeningTest, MetricsPortInUseIsNamedAndLeavesNoSocket) {
  auto first = StartDaemon({"--host-pool-size", "64MiB", "--host-pool-page-size", "4KiB", "--host-pool-slab-size",
                            "4MiB", "--metrics-listen", "127.0.0.1:0"});
  ASSERT_NE(first, nullptr);
  const absl::StatusOr<int> port = first->ListeningTcpPort();
  ASSERT_TRUE(port.ok()) << port.status();
  char dir[] = "/tmp/hisparse-port-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string sock = std::string(dir) + "/hisparsed.sock";
  const CommandResult second = RunCommand(
      "sh -c '" + BinDir() + "/hisparsed --listen unix:" + sock +
      " --host-pool-size 64MiB --host-pool-page-size 4KiB --host-pool-slab-size 4MiB --set host_pool.mlock=false "
      "--metrics-listen 127.0.0.1:" +
      std::to_string(*port) + " 2>&1'");
  EXPECT_NE(second.exit_code, 0) << second.out;
  EXPECT_NE(second.out.find("port " + std::to_string(*port) + " is in use"), std::string::npos) << second.out;
  EXPECT_NE(second.out.find("metrics.listen (--metrics-listen)"), std::string::npos) << second.out;
  EXPECT_NE(::access(sock.c_str(), F_OK), 0) << "control socket left behind";
  EXPECT_NE(::access((sock + ".fd").c_str(), F_OK), 0) << "fd-channel socket left behind";
  ::unlink((sock + ".lock").c_str());
  ::rmdir(dir);
}

// An IPv6 metrics address, in brackets, is served and scraped over IPv6 where the host has ::1: by
// civetweb where it was built with IPv6, else by the daemon's own server (metrics_http.h; Debian
// 12's civetweb has none). The refusal branch stays for a daemon built before that server.
TEST(HardeningTest, MetricsListenOnIpv6ServesOrSaysWhyNot) {
  UniqueFd probe(::socket(AF_INET6, SOCK_STREAM, 0));
  sockaddr_in6 lo6{};
  lo6.sin6_family = AF_INET6;
  lo6.sin6_addr = in6addr_loopback;
  if (!probe.valid() || ::bind(probe.get(), reinterpret_cast<sockaddr*>(&lo6), sizeof(lo6)) != 0) {
    GTEST_SKIP() << "this host has no IPv6 loopback (::1)";
  }
  probe = UniqueFd();
  const std::vector<std::string> args = {"--host-pool-size",      "64MiB", "--host-pool-page-size", "4KiB",
                                         "--host-pool-slab-size", "4MiB",  "--metrics-listen",      "[::1]:0"};
  auto started = DaemonProcess::Start(args, 20000);
  if (!started.ok()) {
    char dir[] = "/tmp/hisparse-ipv6-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    std::string cmd = BinDir() + "/hisparsed --listen unix:" + dir + "/s.sock";
    for (const std::string& a : args) cmd += " " + a;
    const CommandResult r = RunCommand("sh -c '" + cmd + " 2>&1'");
    ::rmdir(dir);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("built without IPv6"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("0.0.0.0:9464"), std::string::npos) << r.out;
    std::printf("IPv6 metrics refused, as this civetweb has no IPv6: %s\n", r.out.c_str());
    return;
  }
  const std::unique_ptr<DaemonProcess> daemon = std::move(*started);
  const absl::StatusOr<int> port = daemon->ListeningTcpPort();
  ASSERT_TRUE(port.ok()) << port.status();
  UniqueFd fd(::socket(AF_INET6, SOCK_STREAM, 0));
  lo6.sin6_port = htons(*port);
  ASSERT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&lo6), sizeof(lo6)), 0);
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: [::1]\r\n\r\n";
  ASSERT_EQ(::write(fd.get(), req.data(), req.size()), static_cast<ssize_t>(req.size()));
  std::string out;
  char buf[8192];
  for (ssize_t n; (n = ::read(fd.get(), buf, sizeof(buf))) > 0;) out.append(buf, n);
  EXPECT_NE(out.find("\nhisparse_up 1\n"), std::string::npos) << out.substr(0, 500);
}

// Runs `body` with this process's stderr (which the daemon it starts inherits) in `path`.
template <typename Body>
void WithStderrIn(const std::string& path, Body body) {
  std::fflush(stderr);
  UniqueFd saved(::dup(2));
  UniqueFd file(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  ::dup2(file.get(), 2);
  body();
  std::fflush(stderr);
  ::dup2(saved.get(), 2);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(HardeningTest, SighupWithAnEmptyConfigKeepsTheQuotas) {
  char dir[] = "/tmp/hisparse-empty-cfg-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/hisparsed.yaml";
  const std::string log = std::string(dir) + "/daemon.log";
  std::ofstream(path) << "host_pool:\n  size: 64MiB\n  page_size: 4KiB\n  slab_size: 4MiB\nquotas:\n  requests: 1\n";
  std::unique_ptr<DaemonProcess> daemon;
  const int port = FreeLoopbackPort();
  WithStderrIn(log, [&] {
    daemon = StartDaemon({"--config", path, "--metrics-listen", "127.0.0.1:" + std::to_string(port)});
  });
  ASSERT_NE(daemon, nullptr);
  const std::string a = daemon->address();
  Session s;
  ASSERT_TRUE(Session::Open(SmallGeometry(a), &s).ok());
  ASSERT_TRUE(s.Admit(1, 10, 100).ok());
  EXPECT_EQ(s.Admit(2, 10, 100).code, HS_ERR_RESOURCE_EXHAUSTED);
  EXPECT_NE(ScrapeMetrics(port).find("\nhisparse_config_last_reload_successful 1\n"), std::string::npos);

  std::ofstream(path, std::ios::trunc).close();  // the file is emptied
  ASSERT_EQ(::kill(daemon->pid(), SIGHUP), 0);
  bool refused = false;
  for (const auto deadline = Clock::now() + std::chrono::seconds(10); !refused && Clock::now() < deadline;) {
    refused = ReadFile(log).find("keeping the running config") != std::string::npos;
    if (!refused) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(refused) << ReadFile(log);
  EXPECT_NE(ReadFile(log).find("empty"), std::string::npos) << ReadFile(log);
  EXPECT_EQ(s.Admit(2, 10, 100).code, HS_ERR_RESOURCE_EXHAUSTED);  // quotas.requests still 1
  // The refusal shows in the reload metrics an alert reads (HisparseConfigReloadFailed).
  const std::string metrics = ScrapeMetrics(port);
  EXPECT_NE(metrics.find("\nhisparse_config_last_reload_successful 0\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\nhisparse_config_reloads_total{result=\"failure\"} 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\nhisparse_serving 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\nprocess_open_fds "), std::string::npos) << metrics;
  EXPECT_NE(Ctl(a, "config").out.find("requests: 1\n"), std::string::npos) << Ctl(a, "config").out;
  s.Close();
  daemon.reset();
  ::unlink(path.c_str());
  ::unlink(log.c_str());
  ::rmdir(dir);
}

// log_format json: one object per line, each carrying NODE_NAME (as hisparse_build_info does);
// the daemon's last line after a drain says why it exits 75.
TEST(HardeningTest, JsonLogsCarryTheNodeAndADrainSaysWhyItExits) {
  char dir[] = "/tmp/hisparse-jsonlog-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string log = std::string(dir) + "/daemon.log";
  ::setenv("NODE_NAME", "gpu-node-7", 1);
  absl::StatusOr<std::unique_ptr<DaemonProcess>> started;
  WithStderrIn(log, [&] {
    started =
        DaemonProcess::Start({"--host-pool-size", "64MiB", "--host-pool-page-size", "4KiB", "--host-pool-slab-size",
                              "4MiB", "--set", "log_format=json", "--set", "log_priority_prefix=off", "--log-level",
                              "info", "--metrics-listen", "127.0.0.1:0"});
  });
  ::unsetenv("NODE_NAME");
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<DaemonProcess> daemon = std::move(*started);
  const absl::StatusOr<int> port = daemon->ListeningTcpPort();
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_NE(ScrapeMetrics(*port).find("hisparse_build_info{node=\"gpu-node-7\",version="), std::string::npos);
  ASSERT_EQ(Ctl(daemon->address(), "drain --no-wait").exit_code, 0);
  const absl::StatusOr<int> status = daemon->WaitExit(30000);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 75) << *status;
  const std::string text = ReadFile(log);
  std::istringstream lines(text);
  std::string line, last;
  int n = 0;
  while (std::getline(lines, line)) {
    ++n;
    EXPECT_EQ(line.rfind("{\"time\":\"", 0), 0u) << line;
    EXPECT_NE(line.find(",\"node\":\"gpu-node-7\","), std::string::npos) << line;
    EXPECT_EQ(line.back(), '}') << line;
    last = line;
  }
  EXPECT_GT(n, 3) << text;
  EXPECT_NE(last.find("exiting 75 (EX_TEMPFAIL): a drain (hisparse-ctl drain) went idle"), std::string::npos) << text;
  EXPECT_EQ(text.find("shutting down"), std::string::npos) << "a drain is not a signal:\n" << text;
  ::unlink(log.c_str());
  ::rmdir(dir);
}

TEST(HardeningTest, EngineNameThatIsNotUtf8IsRefusedWithAMessage) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  auto stub = RawStub(daemon->address());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto stream = stub->Session(&ctx);
  v1::SessionRequest open;
  *open.mutable_open() = HostOpen(1);
  open.mutable_open()->set_engine_name("engine-\xff\xfe");
  ASSERT_TRUE(stream->Write(open));
  v1::SessionEvent event;
  EXPECT_FALSE(stream->Read(&event));
  const grpc::Status st = stream->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_NE(st.error_message().find("UTF-8"), std::string::npos) << st.error_message();
  EXPECT_EQ(Stats(daemon->address()).sessions(), 0u);
}

// hisparse-ctl requests follows the daemon's pages (1000 requests a page by default) to the end.
TEST(HardeningTest, CtlRequestsFollowsEveryPage) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const std::string a = daemon->address();
  hs_session_options o = SmallGeometry(a);
  o.max_requests = 2500;
  Session s;
  ASSERT_TRUE(Session::Open(o, &s).ok());
  constexpr int kRequests = 2345;
  for (int id = 1; id <= kRequests; ++id) ASSERT_TRUE(s.Admit(id, 1, 1).ok()) << id;
  const CommandResult r = Ctl(a, "requests --json");
  ASSERT_EQ(r.exit_code, 0);
  size_t listed = 0;
  for (size_t at = 0; (at = r.out.find("\"request_id\": ", at)) != std::string::npos; ++at) ++listed;
  EXPECT_EQ(listed, size_t{kRequests});
  EXPECT_NE(r.out.find("\"request_id\": " + std::to_string(kRequests) + ","), std::string::npos);
}

}  // namespace hardening_test
}  // namespace hisparse::testing
