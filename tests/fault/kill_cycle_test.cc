// Kill cycles: one daemon, and engine processes (hisparse-test-client) SIGKILLed again and again
// at random points of their life: while opening, mid-churn of admits and releases, while holding
// requests. Whatever the moment, the daemon must reclaim everything the dead session held, and
// after the last cycle the node must be exactly empty: no sessions, no requests, no pool bytes,
// no pages or slabs held. The daemon must also still answer, i.e. not have crashed.
//
// HISPARSE_KILL_CYCLES sets the number of cycles (default 200, about 20 s here); the seed is
// printed so that a failing sequence can be replayed with HISPARSE_KILL_SEED.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "gtest/gtest.h"
#include "hisparse/common/daemon_process.h"
#include "hisparse/v1/hisparse.grpc.pb.h"

namespace hisparse {
namespace kill_cycle_test {

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v ? std::atoi(v) : fallback;
}

std::string ClientBinary() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "";
  self[n] = '\0';
  const std::string path(self);
  return path.substr(0, path.rfind('/')) + "/hisparse-test-client";
}

// Starts a client with stdout and stderr discarded: it is killed, and what it says is noise.
// Its argument vector is built before fork(): between fork() and exec() the child of a process with
// gRPC's threads may call only async-signal-safe functions (no malloc, no stdio).
pid_t Spawn(const std::string& binary, const std::vector<std::string>& args) {
  std::vector<char*> argv = {const_cast<char*>(binary.c_str())};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) {
      ::dup2(null, STDOUT_FILENO);
      ::dup2(null, STDERR_FILENO);
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  if (pid < 0) ADD_FAILURE() << "fork: " << std::strerror(errno);
  return pid;
}

class StatsProbe {
 public:
  explicit StatsProbe(const std::string& address)
      : stub_(v1::HiSparse::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {}
  bool Get(v1::StatsResponse* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub_->Stats(&ctx, v1::StatsRequest(), out).ok();
  }

 private:
  std::unique_ptr<v1::HiSparse::Stub> stub_;
};

TEST(KillCycleTest, NodeIsEmptyAfterManyKilledClients) {
  const int cycles = EnvInt("HISPARSE_KILL_CYCLES", 200);
  const unsigned seed = static_cast<unsigned>(EnvInt("HISPARSE_KILL_SEED", static_cast<int>(std::random_device()())));
  std::printf("kill cycles: %d, seed %u (HISPARSE_KILL_SEED replays it)\n", cycles, seed);
  std::mt19937 rng(seed);

  // Small pages and slabs so that a few hundred held requests spread over many of them.
  auto daemon =
      DaemonProcess::Start({"--host-pool-size", "64MiB", "--host-pool-page-size", "64KiB", "--host-pool-slab-size",
                            "1MiB", "--pretouch-threads", "1", "--log-level", "warning"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string address = (*daemon)->address();
  const std::string client = ClientBinary();
  ASSERT_EQ(::access(client.c_str(), X_OK), 0) << "no hisparse-test-client beside this test: " << client;
  StatsProbe probe(address);

  const auto start = std::chrono::steady_clock::now();
  int abnormal_exits = 0;
  // Up to three clients alive at once, so kills land while other sessions are mid-call.
  std::vector<pid_t> alive;
  for (int cycle = 0; cycle < cycles; ++cycle) {
    std::vector<std::string> args = {address};
    if (rng() % 2 == 0) {
      args.push_back("churn");
    } else {
      args.push_back("hold");
      // At most 16 requests of 512 KB: three holders fit the 64 MiB pool, so no client is refused.
      args.push_back(std::to_string(1 + rng() % 16));
    }
    const pid_t pid = Spawn(client, args);
    if (pid <= 0) break;  // Spawn recorded the failure; kill(-1) below would signal every process
    alive.push_back(pid);
    // Kill at a random point: 0..30 ms covers exec, library load, Session open, the fd channel
    // and the first admits; longer lives reach steady churn or the hold.
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 30000));
    if (alive.size() >= 3 || rng() % 2 == 0) {
      const size_t victim = rng() % alive.size();
      ::kill(alive[victim], SIGKILL);
      int status = 0;
      ::waitpid(alive[victim], &status, 0);
      // A client that exits by itself (not killed) failed to open or admit: a daemon refusal.
      if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)) ++abnormal_exits;
      alive.erase(alive.begin() + static_cast<std::ptrdiff_t>(victim));
    }
  }
  for (pid_t pid : alive) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }

  // Reclaim is prompt (peer_death_test measures it); this loop only bounds the wait.
  v1::StatsResponse st;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    ASSERT_TRUE(probe.Get(&st)) << "the daemon stopped answering";
    if (st.sessions() == 0 && st.host_pool().used_bytes() == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%d cycles in %.1f s: admissions %lu, rejections %lu, clients that exited by themselves %d\n", cycles,
              seconds, static_cast<unsigned long>(st.admissions()), static_cast<unsigned long>(st.rejections()),
              abnormal_exits);
  EXPECT_EQ(st.sessions(), 0u);
  EXPECT_EQ(st.requests(), 0u);
  EXPECT_EQ(st.host_pool().used_bytes(), 0u);
  EXPECT_EQ(st.host_pool().pages_used(), 0u);
  EXPECT_EQ(st.host_pool().slabs(), 0u);
  EXPECT_EQ(st.host_pool().free_bytes(), st.host_pool().capacity_bytes());
  EXPECT_EQ(abnormal_exits, 0) << "clients failed on their own: the daemon refused a well-formed session";
  // The daemon is still the same process: it neither crashed nor restarted.
  EXPECT_EQ(::kill((*daemon)->pid(), 0), 0);
}

}  // namespace kill_cycle_test
}  // namespace hisparse
