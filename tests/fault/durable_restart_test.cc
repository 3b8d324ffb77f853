// Issue 19, part 3, end to end: an engine process (hisparse-durable-engine, the C ABI on the host
// backend) against a real hisparsed on a temporary socket admits a durable request, stores a
// prompt, decodes, and is SIGKILLed mid-decode (after a step's appends, before its RESOLVEs); a new
// engine process of the same engine name adopts the request, resumes it and decodes on. Every
// step's RESOLVE output (slots) and gathered record bytes are compared with uninterrupted runs:
//   - the steps before the kill equal an uninterrupted run's, slots and bytes;
//   - the steps after it equal, slots and bytes, those of an uninterrupted run that parks and
//     resumes the request at the same step (what the adoption does to its row: the dead engine's
//     slot state died with its arena, so the new row starts EMPTY, DESIGN.md "Durable requests");
//   - their gathered bytes, what attention reads, equal the plain uninterrupted run's at every
//     step, and every gathered record is the one stored at its position.
// And a lease that ends with nobody adopting leaves the pool empty and the tenant's quota free.
// HISPARSE_DURABLE_STEPS sets the decode steps (default 64; the kill comes at 5/8 of them).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "engine_runs.h"
#include "gtest/gtest.h"
#include "hisparse/common/daemon_process.h"
#include "hisparse/v1/hisparse.grpc.pb.h"

namespace hisparse {
namespace durable_restart_test {

using fault::BinDir;
using fault::Lines;
using fault::WaitUntil;

int Steps() {
  const char* env = std::getenv("HISPARSE_DURABLE_STEPS");
  return env != nullptr && std::atoi(env) >= 8 ? std::atoi(env) : 64;
}

// Runs the engine with `args` to its end; returns its wait status.
int RunEngine(const std::vector<std::string>& args) {
  const std::string bin = BinDir() + "/hisparse-durable-engine";
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(bin.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execv(bin.c_str(), argv.data());
    ::_exit(127);
  }
  if (pid < 0) return -1;  // no child to wait for: waitpid(-1) would reap any
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

// hisparse-ctl --daemon ADDRESS ARGS: its stdout.
std::string Ctl(const std::string& address, const std::string& args) {
  std::string out;
  FILE* p = ::popen((BinDir() + "/hisparse-ctl --daemon " + address + " " + args + " 2>/dev/null").c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, got);
  ::pclose(p);
  return out;
}

v1::StatsResponse Stats(const std::string& address) {
  auto stub = v1::HiSparse::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::StatsResponse r;
  EXPECT_TRUE(stub->Stats(&ctx, v1::StatsRequest(), &r).ok());
  return r;
}

class DurableRestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/durable_restart_" + std::to_string(::getpid());
    ::mkdir(dir_.c_str(), 0700);
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  void Start(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--host-pool-size",      "64MiB", "--host-pool-page-size", "4KiB",
                                     "--host-pool-slab-size", "1MiB",  "--log-level",           "warning"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto d = DaemonProcess::Start(args);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
  }
  std::string Out(const std::string& name) const { return dir_ + "/" + name; }

  std::unique_ptr<DaemonProcess> daemon_;
  std::string dir_;
};

TEST_F(DurableRestartTest, AKilledEngineIsAdoptedAndDecodesOnExactly) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const int steps = Steps();
  const int kill_at = steps * 5 / 8;
  const std::string n = std::to_string(steps), k = std::to_string(kill_at), a = daemon_->address();
  ASSERT_EQ(RunEngine({a, Out("straight"), "run", n}), 0);
  ASSERT_EQ(RunEngine({a, Out("parked"), "run", n, "--park-at", k}), 0);
  const int killed = RunEngine({a, Out("killed"), "run", n, "--die-at", k});
  ASSERT_TRUE(WIFSIGNALED(killed) && WTERMSIG(killed) == SIGKILL) << "status " << killed;
  // The daemon saw the engine die: its request is orphaned, pages kept, nothing else.
  ASSERT_TRUE(WaitUntil([&] { return Stats(a).orphaned_requests() == 1 && Stats(a).sessions() == 0; }))
      << Stats(a).DebugString();
  EXPECT_GT(Stats(a).orphaned_bytes(), 0u);
  EXPECT_NE(Ctl(a, "requests").find("orphaned "), std::string::npos) << Ctl(a, "requests");
  ASSERT_EQ(RunEngine({a, Out("adopted"), "adopt", n, k}), 0);

  const std::vector<std::string> straight = Lines(Out("straight")), parked = Lines(Out("parked")),
                                 before = Lines(Out("killed")), after = Lines(Out("adopted"));
  ASSERT_NO_FATAL_FAILURE(fault::ExpectAdoptedRunExact(straight, parked, before, after, steps, kill_at));
  // The adopter released it: nothing is held.
  ASSERT_TRUE(WaitUntil([&] {
    const v1::StatsResponse st = Stats(a);
    return st.sessions() == 0 && st.orphaned_requests() == 0 && st.host_pool().pages_used() == 0;
  })) << Stats(a).DebugString();
}

TEST_F(DurableRestartTest, ALeaseThatEndsUnadoptedLeavesThePoolEmpty) {
  // One request per tenant: the orphan holds the quota until its lease ends.
  ASSERT_NO_FATAL_FAILURE(Start({"--set", "quotas.requests=1"}));
  const std::string a = daemon_->address();
  const int killed = RunEngine({a, Out("killed"), "run", "16", "--die-at", "8", "--lease", "3"});
  ASSERT_TRUE(WIFSIGNALED(killed) && WTERMSIG(killed) == SIGKILL) << "status " << killed;
  // Orphaned (unless the lease ran out already), then released by the daemon's sweep.
  ASSERT_TRUE(WaitUntil([&] {
    const v1::StatsResponse st = Stats(a);
    return st.sessions() == 0 && st.orphaned_requests() == 0 && st.lease_expiries() == 1 &&
           st.host_pool().pages_used() == 0 && st.host_pool().slabs() == 0;
  })) << Stats(a).DebugString();
  // The tenant's quota is free: the same engine admits (its one request) again.
  ASSERT_EQ(RunEngine({a, Out("again"), "run", "4", "--lease", "0"}), 0);
  EXPECT_EQ(Lines(Out("again")).size(), 8u);
}

}  // namespace durable_restart_test
}  // namespace hisparse
