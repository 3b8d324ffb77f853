// Isolation and access: socket group and SO_PEERCRED admission, per-tenant quotas, admission
// under pressure (evict with notice), the session's binding to its peer, and TP group names that
// another uid cannot squat.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "test_support.h"

namespace hisparse::testing {
namespace access_test {

int RunAsNobody(const std::string& cmd) {
  const std::string full = "setpriv --reuid=65534 --regid=65534 --clear-groups " + cmd + " >/dev/null 2>&1";
  const int status = std::system(full.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class AccessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::getuid() != 0 || std::system("command -v setpriv >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "needs root and setpriv to act as another user";
    }
    if (RunAsNobody(BinDir() + "/hisparse-ctl --help") != 0) {
      GTEST_SKIP() << "user nobody cannot run the binaries in " << BinDir() << " (a parent folder is not traversable)";
    }
  }
  // Lets another user reach the daemon's socket directory (mkdtemp makes it 0700).
  static void OpenDir(const DaemonProcess& d) {
    const std::string dir = d.socket_path().substr(0, d.socket_path().rfind('/'));
    ::chmod(dir.c_str(), 0755);
    ::chmod(BinDir().c_str(), 0755);
  }
};

TEST_F(AccessTest, SocketModeKeepsOtherUsersOut) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  OpenDir(*daemon);
  struct stat st;
  ASSERT_EQ(::stat(daemon->socket_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  ASSERT_EQ(::stat((daemon->socket_path() + ".fd").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  // nobody is neither the owner nor in the group: the kernel refuses the connect, and the CLI
  // says so with its own status (socket_permission_test.cc checks the message).
  EXPECT_EQ(RunAsNobody(BinDir() + "/hisparse-ctl --timeout-ms 500 --daemon " + daemon->address() + " stats"), 77);
}

TEST_F(AccessTest, PeerCredentialsDecideWhoIsAdmitted) {
  // Group nogroup (65534) may open the sockets; only uid 12345 is admitted by the policy.
  auto refused = StartDaemon({"--host-pool-size", "64MiB", "--host-pool-page-size", "4KiB", "--host-pool-slab-size",
                              "4MiB", "--set", "access.socket_group=65534", "--set", "access.allowed_uids=12345"});
  ASSERT_NE(refused, nullptr);
  OpenDir(*refused);
  EXPECT_EQ(RunAsNobody(BinDir() + "/hisparse-ctl --timeout-ms 500 --daemon " + refused->address() + " stats"), 2);
  EXPECT_EQ(RunAsNobody(BinDir() + "/hisparse-test-client " + refused->address() + " hold 1"), 1);
  // Root (the operator) always passes.
  EXPECT_EQ(Stats(refused->address()).sessions(), 0u);

  auto admitted = StartDaemon({"--host-pool-size", "64MiB", "--host-pool-page-size", "4KiB", "--host-pool-slab-size",
                               "4MiB", "--set", "access.socket_group=65534", "--set", "access.allowed_gids=65534"});
  ASSERT_NE(admitted, nullptr);
  OpenDir(*admitted);
  EXPECT_EQ(RunAsNobody(BinDir() + "/hisparse-ctl --timeout-ms 2000 --daemon " + admitted->address() + " stats"), 0);
}

// Issue 39, item 5: TP group names are their tenant's. Another uid (nobody) takes the name a TP
// engine will use first, holding its rank 0; the engine's ranks open and admit as if the name
// were free, and each tenant sees its own group.
TEST_F(AccessTest, AnotherUidCannotSquatATpGroupName) {
  auto daemon = StartDaemon({"--host-pool-size", "64MiB", "--host-pool-page-size", "4KiB", "--host-pool-slab-size",
                             "4MiB", "--set", "access.socket_group=65534"});
  ASSERT_NE(daemon, nullptr);
  OpenDir(*daemon);
  const std::string a = daemon->address();
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const pid_t squatter = ::fork();
  ASSERT_GE(squatter, 0) << "fork";  // no Reaper for -1: kill(-1) signals every process we may
  if (squatter == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    const int null = ::open("/dev/null", O_WRONLY);  // nothing of ours stays open in it
    ::dup2(null, STDERR_FILENO);
    ::close(out[0]);
    const std::string client = BinDir() + "/hisparse-test-client";
    ::execlp("setpriv", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", client.c_str(), a.c_str(),
             "group", "run-42", "0", "2", "0", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(out[1]);
  // Killed on every path out of the test, a failed assertion's too.
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      ::kill(pid, SIGKILL);
      int status = 0;
      ::waitpid(pid, &status, 0);
    }
  } reap{squatter};
  char line[64] = {};
  const ssize_t got = ::read(out[0], line, sizeof(line) - 1);  // "READY <session id>" once it holds the rank
  ::close(out[0]);
  ASSERT_GT(got, 0) << "the squatter did not open its session";
  ASSERT_EQ(std::string(line).rfind("READY", 0), 0u) << line;

  hs_session_options o = SmallGeometry(a);
  o.group = "run-42";
  o.group_size = 2;
  Session ranks[2];
  for (uint32_t rank = 0; rank < 2; ++rank) {
    o.group_rank = rank;
    const Error opened = Session::Open(o, &ranks[rank]);
    EXPECT_TRUE(opened.ok()) << "rank " << rank << ": " << opened.message;
  }
  hs_request_info info = HS_REQUEST_INFO_INIT;
  EXPECT_EQ(hs_admit_group(ranks[0].get(), 1, 10, 64, &info), HS_OK) << hs_last_error();
  EXPECT_EQ(hs_admit_group(ranks[1].get(), 1, 10, 64, &info), HS_OK) << hs_last_error();
  const v1::StatsResponse st = Stats(a);
  ASSERT_EQ(st.groups_size(), 2);
  for (const auto& g : st.groups()) {
    EXPECT_EQ(g.name(), "run-42");
    EXPECT_EQ(g.requests(), g.tenant_uid() == ::getuid() ? 1u : 0u) << g.tenant_uid();
  }
}

TEST(QuotaTest, TenantQuotasAreHard) {
  // Host bytes are charged in whole 4 KiB pages (1000 tokens of 64 B: 16 pages a layer).
  auto daemon = StartDaemon({"--host-pool-size", "64MiB", "--host-pool-page-size", "4KiB", "--host-pool-slab-size",
                             "4MiB", "--set", "quotas.requests=2", "--set", "quotas.host_bytes=1MiB"});
  ASSERT_NE(daemon, nullptr);
  const std::string a = daemon->address();
  Session s1, s2;
  ASSERT_TRUE(Session::Open(SmallGeometry(a), &s1).ok());
  ASSERT_TRUE(Session::Open(SmallGeometry(a), &s2).ok());  // same uid: the same tenant
  ASSERT_TRUE(s1.Admit(1, 10, 1000).ok());                 // 262,144 B
  Error big = s2.Admit(2, 10, 4000);                       // +1,032,192 B > 1 MiB
  EXPECT_EQ(big.code, HS_ERR_RESOURCE_EXHAUSTED);
  EXPECT_NE(big.message.find("quotas.host_bytes"), std::string::npos) << big.message;
  ASSERT_TRUE(s2.Admit(2, 10, 1000).ok());
  Error third = s1.Admit(3, 10, 10);
  EXPECT_EQ(third.code, HS_ERR_RESOURCE_EXHAUSTED);
  EXPECT_NE(third.message.find("quotas.requests"), std::string::npos) << third.message;
  v1::StatsResponse st = Stats(a);
  EXPECT_EQ(st.requests(), 2u);
  bool counted = false;
  for (const auto& rc : st.rejections_by_reason()) counted |= rc.reason() == "quota" && rc.count() == 2;
  EXPECT_TRUE(counted);
  // The sessions are bound to this process: the daemon saw our pid over the fd channel.
  for (const auto& ss : st.session_stats()) EXPECT_EQ(ss.peer_pid(), ::getpid());
}

TEST(AdmissionUnderPressureTest, FullPoolEvictsTheTenantsOldestRequestAfterNotice) {
  // 16384 pages of 4 KiB; each request takes 4 layers x 250 pages in a slab of its own (1000 or
  // 1024 pages): 16 requests fill the pool.
  auto daemon = StartDaemon({"--host-pool-size", "64MiB", "--host-pool-page-size", "4KiB", "--host-pool-slab-size",
                             "4MiB", "--set", "admission.on_pool_full=evict_lru_idle"});
  ASSERT_NE(daemon, nullptr);
  const std::string a = daemon->address();
  hs_session_options o = SmallGeometry(a);
  o.max_requests = 32;
  Session old_session, new_session;
  ASSERT_TRUE(Session::Open(o, &old_session).ok());
  ASSERT_TRUE(Session::Open(o, &new_session).ok());
  for (uint64_t id = 1; id <= 16; ++id) ASSERT_TRUE(old_session.Admit(id, 10, 16000).ok()) << id;
  // The pool is full: this admission evicts request 1 (the oldest), whose session hears first.
  ASSERT_TRUE(new_session.Admit(100, 10, 16000).ok());
  uint64_t ids[4];
  size_t n = 0;
  ASSERT_TRUE(WaitUntil([&] { return hs_poll_evicted(old_session.get(), ids, 4, &n) != HS_OK || n != 0; }));
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(ids[0], 1u);
  v1::StatsResponse st = Stats(a);
  EXPECT_EQ(st.requests(), 16u);
  EXPECT_EQ(st.evictions(), 1u);
  // Exactly the 16 live requests' pages are in use, each tenant charged for its own: request 1's
  // pages went back to the pool before request 100 took them (4 layers x 250 pages of 4 KiB).
  constexpr uint64_t kRequestBytes = 4ull * 16000 * 64;
  EXPECT_EQ(st.host_pool().used_bytes(), 16 * kRequestBytes);
  hs_session_info old_info = HS_SESSION_INFO_INIT, new_info = HS_SESSION_INFO_INIT;
  ASSERT_TRUE(old_session.Info(&old_info).ok());
  ASSERT_TRUE(new_session.Info(&new_info).ok());
  ASSERT_EQ(st.session_stats_size(), 2);
  for (const auto& ss : st.session_stats()) {
    const bool old_one = ss.session_id() == old_info.session_id;
    EXPECT_TRUE(old_one || ss.session_id() == new_info.session_id) << ss.session_id();
    EXPECT_EQ(ss.requests(), old_one ? 15u : 1u);
    EXPECT_EQ(ss.host_bytes(), (old_one ? 15 : 1) * kRequestBytes);
  }
}

TEST(AdmissionUnderPressureTest, RejectIsTheDefault) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  hs_session_options o = SmallGeometry(daemon->address());
  o.max_requests = 32;
  Session s;
  ASSERT_TRUE(Session::Open(o, &s).ok());
  for (uint64_t id = 1; id <= 16; ++id) ASSERT_TRUE(s.Admit(id, 10, 16000).ok());
  EXPECT_EQ(s.Admit(17, 10, 16000).code, HS_ERR_RESOURCE_EXHAUSTED);
  EXPECT_EQ(Stats(daemon->address()).evictions(), 0u);
}

}  // namespace access_test
}  // namespace hisparse::testing
