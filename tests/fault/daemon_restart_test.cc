// Issue 42, part 1, end to end: durable requests outlive hisparsed itself. A real hisparsed runs
// under hisparse-keeper (the fd store a service manager keeps; systemd's plays this part in
// production), and the engine is hisparse-durable-engine (the C ABI, host backend). The engine
// admits durable request 7 and plain request 8, stores their prompts, decodes, and holds mid-decode;
// then the daemon goes away:
//   - SIGKILLed, with the engine alive (the keeper starts it again);
//   - upgraded: the engine died first (its request an orphan), then the binary at the daemon's path
//     is replaced and the keeper restarts the daemon (SIGUSR2: SIGTERM, then the new binary).
// Afterwards a new engine of the same name finds exactly request 7 adoptable (request 8 is lost,
// never served), adopts it and decodes on: every step's slots and gathered bytes equal an
// uninterrupted run that parks and resumes at the same step (what adoption does to its row), and
// the gathered bytes equal the plain uninterrupted run's. When the adopter is done, no page is
// held and the keeper holds no slab, only the journal. HISPARSE_RESTART_BACKEND=cuda runs the
// engines on the CUDA backend (tools/gpu/restart-plan.sh does on the GPU host).
//
// Issue 42, part 2: the engine rides through. It holds mid-decode and stays alive while the daemon
// is SIGKILLed, or upgraded to a new binary; it sees its session end, finds RESOLVE refused on its
// old row, recovers (hs_session_recover) and decodes on in the same process: request 7 is kept (a
// new row, the same pages: every later step equals the uninterrupted run's), request 8 is reported
// lost and refused, and nothing is held once the engine is done.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "engine_runs.h"
#include "gtest/gtest.h"
#include "hisparse/v1/hisparse.grpc.pb.h"

namespace hisparse {
namespace daemon_restart_test {

using fault::BinDir;
using fault::Lines;
using fault::WaitUntil;

pid_t Spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // nothing outlives a test that aborts
    if (::getppid() != parent) ::_exit(126);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  if (pid < 0) ADD_FAILURE() << "fork: " << std::strerror(errno);
  return pid;
}

// The wait status of child `pid`; -1 for no child (a failed Spawn): waitpid(-1) would reap any
// child, the keeper too.
int Wait(pid_t pid) {
  if (pid <= 0) return -1;
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

// SIGKILL to child `pid` and its reaping; nothing for no child (kill(-1) signals every process the
// test may signal, kill(0) its own group).
void KillAndWait(pid_t pid) {
  if (pid <= 0) return;
  ::kill(pid, SIGKILL);
  Wait(pid);
}

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// The memfds a process holds, by name ("hisparse-slab", "hisparse-journal"), counted.
int MemfdsOf(pid_t pid, const std::string& name) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::error_code ignored;
    const std::string target = std::filesystem::read_symlink(e.path(), ignored).string();
    if (target.find("memfd:" + name) != std::string::npos) ++n;
  }
  return n;
}

class DaemonRestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/daemon_restart_" + std::to_string(::getpid());
    std::filesystem::remove_all(dir_);
    ::mkdir(dir_.c_str(), 0700);
    address_ = "unix:" + dir_ + "/d.sock";
    InstallDaemon();
  }
  void TearDown() override {
    if (keeper_ > 0) {
      ::kill(keeper_, SIGTERM);
      Wait(keeper_);
    }
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  // The daemon's binary at dir/hisparsed: a fresh copy, renamed over whatever was there (an
  // upgrade replaces the file; the running daemon keeps its own).
  void InstallDaemon() {
    std::filesystem::copy_file(BinDir() + "/hisparsed", dir_ + "/hisparsed.new",
                               std::filesystem::copy_options::overwrite_existing);
    ::chmod((dir_ + "/hisparsed.new").c_str(), 0755);
    ASSERT_EQ(::rename((dir_ + "/hisparsed.new").c_str(), (dir_ + "/hisparsed").c_str()), 0);
  }
  void StartKeeper() {
    keeper_ = Spawn({BinDir() + "/hisparse-keeper", "--restart-delay-ms", "50", "--child-pid-file", dir_ + "/pid", "--",
                     dir_ + "/hisparsed", "--listen", address_, "--metrics-listen", "", "--host-pool-size", "64MiB",
                     "--host-pool-page-size", "4KiB", "--host-pool-slab-size", "1MiB", "--log-level", "info"});
    ASSERT_TRUE(WaitUntil([&] { return DaemonPid() > 0 && Serving(); })) << "the daemon did not come up";
  }
  pid_t DaemonPid() const {
    std::ifstream in(dir_ + "/pid");
    pid_t pid = 0;
    in >> pid;
    return pid;
  }
  bool Serving() const {
    auto stub = v1::HiSparse::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    v1::StatsResponse r;
    return stub->Stats(&ctx, v1::StatsRequest(), &r).ok();
  }
  v1::StatsResponse Stats() const {
    auto stub = v1::HiSparse::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::StatsResponse r;
    EXPECT_TRUE(stub->Stats(&ctx, v1::StatsRequest(), &r).ok());
    return r;
  }
  // After the old daemon died: the keeper's next one serves.
  void WaitForRestart(pid_t old) {
    ASSERT_TRUE(WaitUntil([&] { return DaemonPid() != old && DaemonPid() > 0 && Serving(); }))
        << "the keeper did not start the daemon again";
  }
  // HISPARSE_RESTART_BACKEND=cuda (a GPU host, a CUDA build): the engines use the CUDA backend.
  std::vector<std::string> Engine(std::vector<std::string> args) {
    args.insert(args.begin(), {BinDir() + "/hisparse-durable-engine", address_});
    const char* backend = std::getenv("HISPARSE_RESTART_BACKEND");
    if (backend != nullptr && std::string(backend) == "cuda") args.insert(args.end(), {"--backend", "cuda"});
    return args;
  }
  std::string Out(const std::string& name) const { return dir_ + "/" + name; }

  // The uninterrupted runs of the same engine (in the first daemon), then a run held at step
  // `hold`: the engine's pid.
  pid_t RunToHold(int steps, int hold) {
    const std::string n = std::to_string(steps), h = std::to_string(hold);
    EXPECT_EQ(Wait(Spawn(Engine({Out("straight"), "run", n}))), 0);
    EXPECT_EQ(Wait(Spawn(Engine({Out("parked"), "run", n, "--park-at", h}))), 0);
    const pid_t engine = Spawn(Engine({Out("held"), "run", n, "--hold-at", h, "--plain"}));
    EXPECT_TRUE(WaitUntil([&] { return Exists(Out("held.held")); })) << "the engine did not reach its hold";
    return engine;
  }
  // A new engine adopts request 7 (it must be the only adoptable request) and decodes on; its
  // lines are compared with the uninterrupted runs.
  void AdoptAndCompare(int steps, int hold) {
    ASSERT_EQ(Wait(Spawn(Engine({Out("adopted"), "adopt", std::to_string(steps), std::to_string(hold)}))), 0);
    const std::vector<std::string> straight = Lines(Out("straight")), parked = Lines(Out("parked")),
                                   before = Lines(Out("held")), after = Lines(Out("adopted"));
    fault::ExpectAdoptedRunExact(straight, parked, before, after, steps, hold);
  }
  // Nothing held once the adopter released its request: no page, no orphan, and the keeper keeps
  // the journal alone.
  void ExpectNothingHeld() {
    ASSERT_TRUE(WaitUntil([&] {
      const v1::StatsResponse st = Stats();
      return st.sessions() == 0 && st.orphaned_requests() == 0 && st.host_pool().pages_used() == 0 &&
             MemfdsOf(keeper_, "hisparse-slab") == 0;
    })) << Stats().DebugString()
        << " keeper slabs " << MemfdsOf(keeper_, "hisparse-slab");
    EXPECT_EQ(MemfdsOf(keeper_, "hisparse-journal"), 1);
  }

  // An engine that rides through at step `hold`: the uninterrupted runs first, then the riding
  // engine, held; `restart` takes the daemon down and back; then the engine's lines and report are
  // checked and nothing may stay held.
  template <typename Restart>
  void RideThrough(int steps, int hold, Restart&& restart) {
    const std::string n = std::to_string(steps), h = std::to_string(hold);
    ASSERT_EQ(Wait(Spawn(Engine({Out("straight"), "run", n}))), 0);
    ASSERT_EQ(Wait(Spawn(Engine({Out("parked"), "run", n, "--park-at", h}))), 0);
    const pid_t engine = Spawn(Engine({Out("riding"), "run", n, "--ride-through-at", h, "--plain"}));
    ASSERT_TRUE(WaitUntil([&] { return Exists(Out("riding.held")); })) << "the engine did not reach its hold";
    const uint64_t first_session = Stats().session_stats(0).session_id();
    ASSERT_NO_FATAL_FAILURE(restart());
    ASSERT_EQ(Wait(engine), 0) << "the engine did not ride through";
    const std::vector<std::string> lines = Lines(Out("riding"));
    const size_t cut = static_cast<size_t>(hold) * 2;
    ASSERT_GE(lines.size(), cut);
    fault::ExpectAdoptedRunExact(Lines(Out("straight")), Lines(Out("parked")),
                                 std::vector<std::string>(lines.begin(), lines.begin() + cut),
                                 std::vector<std::string>(lines.begin() + cut, lines.end()), steps, hold);
    // Refused while its state was unknown (hs_result_string of HS_ERR_UNAVAILABLE); 7 kept (a row, its
    // capacity); 8 lost, and a store into it refused (HS_ERR_NOT_FOUND).
    const std::vector<std::string> ride = Lines(Out("riding.ride"));
    ASSERT_EQ(ride.size(), 6u);
    EXPECT_EQ(ride[0], "refused unavailable");
    std::istringstream kept(ride[1]);
    std::string word;
    uint64_t id = 0;
    int row = -1;
    uint32_t capacity = 0;
    kept >> word >> id >> row >> capacity;
    EXPECT_EQ(word, "kept");
    EXPECT_EQ(id, 7u);
    EXPECT_GE(row, 0) << "kept, but parked: " << ride[1];
    EXPECT_EQ(capacity, 40u + steps);
    EXPECT_EQ(ride[2], "lost 8 not found");
    EXPECT_EQ(ride[3].rfind("sessions " + std::to_string(first_session) + " ", 0), 0u) << ride[3];
    // The new daemon's arena in place of the old: what graphs captured kept is still the arena.
    EXPECT_EQ(ride[4], "arena kept same");
    // The request's slab: the mapping taken over from the ended session (the same memfd).
    EXPECT_EQ(ride[5], "records same");
    ASSERT_NO_FATAL_FAILURE(ExpectNothingHeld());
  }

  std::string dir_, address_;
  pid_t keeper_ = -1;
};

TEST_F(DaemonRestartTest, AnEngineRidesThroughASigkilledDaemon) {
  ASSERT_NO_FATAL_FAILURE(StartKeeper());
  RideThrough(24, 13, [&] {
    const pid_t old = DaemonPid();
    ASSERT_GT(old, 0);
    ASSERT_EQ(::kill(old, SIGKILL), 0);
    ASSERT_NO_FATAL_FAILURE(WaitForRestart(old));
  });
}

TEST_F(DaemonRestartTest, AnEngineRidesThroughAnUpgrade) {
  ASSERT_NO_FATAL_FAILURE(StartKeeper());
  RideThrough(24, 7, [&] {
    ASSERT_NO_FATAL_FAILURE(InstallDaemon());  // the new binary
    const pid_t old = DaemonPid();
    ASSERT_EQ(::kill(keeper_, SIGUSR2), 0);
    ASSERT_NO_FATAL_FAILURE(WaitForRestart(old));
  });
}

TEST_F(DaemonRestartTest, ASigkilledDaemonComesBackWithEveryDurableRequest) {
  ASSERT_NO_FATAL_FAILURE(StartKeeper());
  const int steps = 24, hold = 15;
  const pid_t engine = RunToHold(steps, hold);
  EXPECT_GT(MemfdsOf(keeper_, "hisparse-slab"), 0);  // the durable request's slabs are in the store
  const pid_t old = DaemonPid();
  ASSERT_GT(old, 0);
  ASSERT_EQ(::kill(old, SIGKILL), 0);
  ASSERT_NO_FATAL_FAILURE(WaitForRestart(old));
  // The engine cannot go on with the daemon it knew (riding through is issue 42, part 2).
  KillAndWait(engine);
  const v1::StatsResponse st = Stats();
  EXPECT_EQ(st.orphaned_requests(), 1u) << st.DebugString();  // 7; 8 was not durable
  EXPECT_TRUE(st.restart().journal());
  EXPECT_EQ(st.restart().recovered_requests(), 1u);
  EXPECT_EQ(st.restart().dropped_requests(), 0u);
  EXPECT_EQ(st.restart().journal_requests(), 1u);
  ASSERT_NO_FATAL_FAILURE(AdoptAndCompare(steps, hold));
  ASSERT_NO_FATAL_FAILURE(ExpectNothingHeld());
}

TEST_F(DaemonRestartTest, AnUpgradeKeepsTheOrphanOfAnEngineThatDiedBefore) {
  ASSERT_NO_FATAL_FAILURE(StartKeeper());
  const int steps = 24, hold = 9;
  const pid_t engine = RunToHold(steps, hold);
  KillAndWait(engine);
  ASSERT_TRUE(WaitUntil([&] { return Stats().orphaned_requests() == 1 && Stats().sessions() == 0; }))
      << Stats().DebugString();
  ASSERT_NO_FATAL_FAILURE(InstallDaemon());  // the new binary
  const pid_t old = DaemonPid();
  ASSERT_EQ(::kill(keeper_, SIGUSR2), 0);
  ASSERT_NO_FATAL_FAILURE(WaitForRestart(old));
  EXPECT_EQ(Stats().orphaned_requests(), 1u) << Stats().DebugString();
  ASSERT_NO_FATAL_FAILURE(AdoptAndCompare(steps, hold));
  ASSERT_NO_FATAL_FAILURE(ExpectNothingHeld());
}

}  // namespace daemon_restart_test
}  // namespace hisparse
