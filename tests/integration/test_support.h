// Shared helpers of the integration tests: a daemon process per test, the test client as a child
// process, raw gRPC stubs for calls the client library does not make (bad tokens, health,
// reflection), and stats.
#ifndef HISPARSE_TESTS_INTEGRATION_TEST_SUPPORT_H_
#define HISPARSE_TESTS_INTEGRATION_TEST_SUPPORT_H_

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "hisparse/common/daemon_process.h"
#include "hisparse/hisparse.hpp"
#include "hisparse/v1/hisparse.grpc.pb.h"

namespace hisparse::testing {

// The folder of the running test binary: the daemon, the CLI and the test client live beside it.
inline std::string BinDir() { return ExecutableDir(); }

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout (stderr is dropped)
};

// Runs a shell command and captures its stdout and exit code.
inline CommandResult RunCommand(const std::string& cmd) {
  CommandResult r;
  FILE* p = ::popen((cmd + " 2>/dev/null").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, got);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// hisparse-ctl --daemon ADDRESS ARGS
inline CommandResult Ctl(const std::string& address, const std::string& args) {
  return RunCommand(BinDir() + "/hisparse-ctl --daemon " + address + " " + args);
}

// Waits for what the daemon does asynchronously and offers no event for (a session ends after its
// stream closed, a reload lands after SIGHUP, an eviction notice reaches the client): checks
// `done` now, then every 2 ms, until it holds or `timeout` passes. The deadline only bounds the
// wait (generous, for sanitizer builds); nothing is asserted about how long it took. Returns
// whether `done` held.
template <typename Done>
bool WaitUntil(Done&& done, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

inline std::unique_ptr<DaemonProcess> StartDaemon(std::vector<std::string> args = {}) {
  if (args.empty())
    args = {"--host-pool-size", "64MiB", "--host-pool-page-size", "4KiB", "--host-pool-slab-size", "4MiB"};
  args.push_back("--log-level");
  args.push_back("warning");
  auto d = DaemonProcess::Start(args);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(*d) : nullptr;
}

// hisparse-test-client (beside the test binary) as a child process with `args`, once it printed its
// READY line. The handle owns the child: it is killed (SIGKILL) and reaped when the handle goes, on
// every path, a failed assertion's early return included, or earlier by Kill(). The child's
// argument vector is built before fork(), so that between fork() and exec() the child (of a
// process with gRPC's threads) calls only async-signal-safe functions.
class TestClient {
 public:
  // Null (with a failure recorded) when the pipe, the fork or the exec fails or no READY comes.
  static std::unique_ptr<TestClient> Start(const std::vector<std::string>& args) {
    std::vector<std::string> words = {BinDir() + "/hisparse-test-client"};
    words.insert(words.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2: " << std::strerror(errno);
      return nullptr;
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(fds[1], STDOUT_FILENO);  // the duplicate stays open across exec
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    if (pid < 0) {
      ADD_FAILURE() << "fork: " << std::strerror(errno);
      ::close(fds[0]);
      return nullptr;
    }
    std::unique_ptr<TestClient> child(new TestClient(pid));
    // Its first line, up to the newline, EOF (the child died), 127 bytes or kReadyMs of silence.
    char line[128] = {};
    size_t got = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kReadyMs);
    for (char c = 0; got + 1 < sizeof line;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fds[0], POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) != 1) break;
      if (::read(fds[0], &c, 1) != 1 || c == '\n') break;
      line[got++] = c;
    }
    ::close(fds[0]);
    if (std::strncmp(line, "READY", 5) != 0) {
      ADD_FAILURE() << "hisparse-test-client did not print READY within " << kReadyMs << " ms (read \"" << line
                    << "\")";
      return nullptr;  // killed and reaped by the handle
    }
    return child;
  }
  static constexpr int kReadyMs = 30000;  // generous, for sanitizer builds
  TestClient(const TestClient&) = delete;
  TestClient& operator=(const TestClient&) = delete;
  ~TestClient() { Kill(); }

  pid_t pid() const { return pid_; }
  // SIGKILL and reap now; nothing the second time.
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  explicit TestClient(pid_t pid) : pid_(pid) {}
  pid_t pid_;
};

inline std::unique_ptr<v1::HiSparse::Stub> RawStub(const std::string& address) {
  return v1::HiSparse::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

inline v1::StatsResponse Stats(const std::string& address) {
  auto stub = RawStub(address);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::StatsResponse r;
  grpc::Status s = stub->Stats(&ctx, v1::StatsRequest(), &r);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return r;
}

inline hs_session_options SmallGeometry(const std::string& address) {
  hs_session_options o = HS_SESSION_OPTIONS_INIT;
  o.daemon_address = address.c_str();
  o.engine_name = "integration-test";
  o.num_layers = 4;
  o.record_bytes = 64;
  o.k = 8;
  o.slots = 16;
  o.max_requests = 8;
  o.backend = HS_BACKEND_HOST;
  return o;
}

// A RESOLVE of `layer` for max_batch entries (rows, seq_lens, positions in; out_slots out), the
// other fields at their defaults.
inline hs_resolve_args ResolveArgs(uint32_t layer, int32_t max_batch, const int32_t* rows, const int32_t* seq_lens,
                                   const int32_t* positions, int32_t* out_slots) {
  hs_resolve_args a = HS_RESOLVE_ARGS_INIT;
  a.layer = layer;
  a.max_batch = max_batch;
  a.rows = rows;
  a.seq_lens = seq_lens;
  a.positions = positions;
  a.out_slots = out_slots;
  return a;
}

}  // namespace hisparse::testing

#endif  // HISPARSE_TESTS_INTEGRATION_TEST_SUPPORT_H_
