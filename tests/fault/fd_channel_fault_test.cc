// The fd channel under faults, against a real hisparsed:
//  - descriptor exhaustion (the daemon's RLIMIT_NOFILE lowered with prlimit, then filled with
//    fd-channel connections): health turns NOT_SERVING, a session open fails in bounded time
//    instead of hanging, and once the connections go the channel serves again and health is
//    SERVING;
//  - an fd channel that accepts nothing: hs_session_open honours timeout_ms;
//  - the per-peer connection cap (limits.max_fd_connections_per_peer).
#include <dirent.h>
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fault_geometry.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "hisparse/common/daemon_process.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/common/unix_socket.h"
#include "hisparse/hisparse.h"

namespace hisparse {
namespace fd_channel_fault_test {

using Clock = std::chrono::steady_clock;
using grpc::health::v1::HealthCheckResponse;

std::unique_ptr<DaemonProcess> Start(std::vector<std::string> args) {
  for (const char* a : {"--host-pool-size", "16MiB", "--host-pool-page-size", "64KiB", "--host-pool-slab-size", "1MiB",
                        "--pretouch-threads", "1", "--log-level", "warning"}) {
    args.emplace_back(a);
  }
  auto d = DaemonProcess::Start(args);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(*d) : nullptr;
}

// One health channel, connected before the daemon runs out of descriptors.
class HealthProbe {
 public:
  explicit HealthProbe(const std::string& address)
      : stub_(grpc::health::v1::Health::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {}
  HealthCheckResponse::ServingStatus Get() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::health::v1::HealthCheckRequest req;
    HealthCheckResponse resp;
    return stub_->Check(&ctx, req, &resp).ok() ? resp.status() : HealthCheckResponse::UNKNOWN;
  }
  // Polls (bounded) until health reads `want`.
  bool WaitFor(HealthCheckResponse::ServingStatus want) {
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < deadline) {
      if (Get() == want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

 private:
  std::unique_ptr<grpc::health::v1::Health::Stub> stub_;
};

// A raw fd-channel connection that sends a malformed request: "served" when the daemon answers it
// (ERR INVALID_ARGUMENT), else the daemon's reply or the error that ended the exchange.
struct Probe {
  UniqueFd conn;
  bool served = false;
  std::string answer;
};
Probe ProbeFdChannel(const std::string& path) {
  Probe p;
  auto conn = ConnectUnixSeqpacket(path, 5000);
  if (!conn.ok()) {
    p.answer = conn.status().ToString();
    return p;
  }
  p.conn = std::move(*conn);
  // A refusal may have closed the connection before this send: its answer is still queued here.
  (void)SendPacket(p.conn.get(), "hello", -1);
  auto reply = RecvPacket(p.conn.get(), 1024);
  p.answer = reply.ok() ? reply->payload : reply.status().ToString();
  p.served = reply.ok() && reply->payload.rfind("ERR INVALID_ARGUMENT", 0) == 0;
  return p;
}

hs_session_options Geometry(const std::string& address, uint32_t timeout_ms) {
  return FaultGeometry(address, "fd-fault", timeout_ms);
}

struct OpenResult {
  hs_result code = HS_OK;
  std::string error;
  double seconds = 0;
};
// hs_session_open on another thread, waited for at most `bound`: a call that hangs fails the test
// (and is left to the unblocking step the caller takes next).
std::future<OpenResult> OpenAsync(const std::string& address, uint32_t timeout_ms) {
  return std::async(std::launch::async, [address, timeout_ms] {
    const hs_session_options o = Geometry(address, timeout_ms);
    const auto t0 = Clock::now();
    hs_session* s = nullptr;
    OpenResult r;
    r.code = hs_session_open(&o, &s);
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r.code != HS_OK) r.error = hs_last_error();
    if (s != nullptr) hs_session_close(s);
    return r;
  });
}

int OpenFds(pid_t pid) {
  int n = 0;
  DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (d == nullptr) return -1;
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

TEST(FdChannelFaultTest, RecoversFromDescriptorExhaustion) {
#ifdef HISPARSE_UBSAN_BUILD
  // UBSan's vptr check tests memory through a pipe (sanitizer_common's IsAccessibleMemoryRange):
  // with no descriptor left it reports every virtual call as a type error, here and in the daemon.
  GTEST_SKIP() << "descriptor exhaustion makes UBSan's vptr check report false errors; runs in the plain build";
#endif
  auto daemon = Start({});  // the default per-peer cap (1024) is far above what this takes
  ASSERT_NE(daemon, nullptr);
  const std::string fd_path = daemon->socket_path() + ".fd";
  HealthProbe health(daemon->address());
  ASSERT_EQ(health.Get(), HealthCheckResponse::SERVING);

  // Room for a few dozen more descriptors (new ones take the lowest free numbers, so a limit just
  // above the count bounds them), then fill them with fd-channel connections.
  rlimit old_limit{};
  ASSERT_EQ(::prlimit(daemon->pid(), RLIMIT_NOFILE, nullptr, &old_limit), 0);
  const rlimit low{static_cast<rlim_t>(OpenFds(daemon->pid()) + 48), old_limit.rlim_max};
  ASSERT_EQ(::prlimit(daemon->pid(), RLIMIT_NOFILE, &low, nullptr), 0) << std::strerror(errno);
  std::vector<UniqueFd> held;
  std::string refused_with;
  for (int i = 0; i < 200 && refused_with.empty(); ++i) {
    Probe p = ProbeFdChannel(fd_path);
    if (p.served) {
      held.push_back(std::move(p.conn));
    } else {
      refused_with = p.answer;
    }
  }
  std::printf("held %zu fd-channel connections; the next one ended with: %s\n", held.size(), refused_with.c_str());
  ASSERT_FALSE(refused_with.empty()) << "the daemon never ran out of descriptors";
  EXPECT_TRUE(health.WaitFor(HealthCheckResponse::NOT_SERVING)) << "health stayed SERVING without descriptors";

  // The control socket's acceptor is out of descriptors too: a connection is closed at once
  // rather than left in the backlog (while the acceptor spins on EMFILE). A connection may also be
  // served: the fd channel's acceptor frees a descriptor for an instant while it sheds its own
  // pending connections (its reserve's exchange), and an accept that lands then succeeds and gRPC
  // greets the peer. That is not a fault; a connection left waiting is. So connect until one is
  // shed, and fail on any that neither closes nor is answered.
  int shed = 0;
  int served = 0;
  for (int attempt = 0; attempt < 20 && shed == 0; ++attempt) {
    UniqueFd control(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", daemon->socket_path().c_str());
    ASSERT_EQ(::connect(control.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    const timeval bound{10, 0};
    ASSERT_EQ(::setsockopt(control.get(), SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof(bound)), 0);
    char byte;
    const ssize_t got = ::recv(control.get(), &byte, 1, 0);
    const int err = errno;
    if (got == 0 || (got < 0 && err == ECONNRESET)) {
      ++shed;
    } else if (got > 0) {
      ++served;
    } else {
      ADD_FAILURE() << "a control connection was neither closed nor served within 10 s: " << std::strerror(err);
      break;
    }
  }
  std::printf("control connections: %d shed, %d served while the fd channel shed its own\n", shed, served);
  EXPECT_EQ(shed, 1) << "no control connection was shed in 20 tries";

  // A new session cannot be served now, but the open fails in bounded time instead of hanging.
  auto open = OpenAsync(daemon->address(), 1000);
  ASSERT_EQ(open.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "hs_session_open hung";
  const OpenResult r = open.get();
  std::printf("hs_session_open while out of descriptors: %d after %.2f s (%s)\n", r.code, r.seconds, r.error.c_str());
  EXPECT_NE(r.code, HS_OK);

  // Let go: the channel serves again and health is SERVING.
  held.clear();
  EXPECT_TRUE(health.WaitFor(HealthCheckResponse::SERVING)) << "health did not recover";
  const Probe after = ProbeFdChannel(fd_path);
  EXPECT_TRUE(after.served) << after.answer;
  ASSERT_EQ(::prlimit(daemon->pid(), RLIMIT_NOFILE, &old_limit, nullptr), 0);
  auto again = OpenAsync(daemon->address(), 5000);
  ASSERT_EQ(again.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  const OpenResult ok = again.get();
  EXPECT_EQ(ok.code, HS_OK) << ok.error;
  EXPECT_EQ(::kill(daemon->pid(), 0), 0) << "the daemon died";
}

TEST(FdChannelFaultTest, SessionOpenHonoursTimeoutWhenTheFdChannelNeverAnswers) {
  auto daemon = Start({});
  ASSERT_NE(daemon, nullptr);
  // Sessions are told to fetch from <socket>.fd: put a listener there that never accepts (the
  // daemon keeps serving its own, moved aside).
  const std::string fd_path = daemon->socket_path() + ".fd";
  ASSERT_EQ(::rename(fd_path.c_str(), (fd_path + ".moved").c_str()), 0);
  auto silent = ListenUnixSeqpacket(fd_path, 0600);
  ASSERT_TRUE(silent.ok()) << silent.status();

  auto open = OpenAsync(daemon->address(), 500);
  const bool returned = open.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  silent->Reset();  // unblocks a client that ignores its timeout, so that the test can end
  // Both sockets stay in the daemon's folder, which DaemonProcess removes whole.
  ASSERT_TRUE(returned) << "hs_session_open ignored timeout_ms on the fd channel";
  const OpenResult r = open.get();
  std::printf("hs_session_open against a silent fd channel: %d after %.2f s (%s)\n", r.code, r.seconds,
              r.error.c_str());
  EXPECT_EQ(r.code, HS_ERR_UNAVAILABLE);
  EXPECT_NE(r.error.find("did not answer in time"), std::string::npos) << r.error;
}

TEST(FdChannelFaultTest, CapsConnectionsPerPeer) {
  auto daemon = Start({"--set", "limits.max_fd_connections_per_peer=3"});
  ASSERT_NE(daemon, nullptr);
  const std::string fd_path = daemon->socket_path() + ".fd";
  std::vector<Probe> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(ProbeFdChannel(fd_path));
    ASSERT_TRUE(held.back().served) << i << ": " << held.back().answer;
  }
  // Over the cap: answered RESOURCE_EXHAUSTED (the malformed request is never read) and closed.
  Probe over = ProbeFdChannel(fd_path);
  EXPECT_FALSE(over.served);
  EXPECT_EQ(over.answer.rfind("ERR RESOURCE_EXHAUSTED", 0), 0u) << over.answer;
  EXPECT_NE(over.answer.find("limits.max_fd_connections_per_peer"), std::string::npos) << over.answer;
  // The client library passes the code on.
  auto open = OpenAsync(daemon->address(), 5000);
  ASSERT_EQ(open.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  const OpenResult refused = open.get();
  EXPECT_EQ(refused.code, HS_ERR_RESOURCE_EXHAUSTED) << refused.error;

  // A connection that ends frees its place (the daemon sees the end asynchronously: poll).
  held.pop_back();
  bool served = false;
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (!served && Clock::now() < deadline) {
    Probe p = ProbeFdChannel(fd_path);
    served = p.served;
    if (served) held.push_back(std::move(p));
  }
  EXPECT_TRUE(served) << "a freed place was not given back";
  held.clear();
  auto later = OpenAsync(daemon->address(), 5000);
  ASSERT_EQ(later.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  // The three raw connections may still be closing: retry once the daemon has seen them go.
  OpenResult ok = later.get();
  const auto retry_deadline = Clock::now() + std::chrono::seconds(20);
  while (ok.code == HS_ERR_RESOURCE_EXHAUSTED && Clock::now() < retry_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ok = OpenAsync(daemon->address(), 5000).get();
  }
  EXPECT_EQ(ok.code, HS_OK) << ok.error;
}

}  // namespace fd_channel_fault_test
}  // namespace hisparse
