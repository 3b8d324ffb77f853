// The acceptors' building blocks alone: RateLimitedLog with a fake clock, and AcceptGuard on a
// real listener in this process with RLIMIT_NOFILE lowered until accept fails with EMFILE.
#include "hisparse/daemon/accept_guard.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "hisparse/common/unix_socket.h"

namespace hisparse {
namespace accept_guard_test {

TEST(RateLimitedLogTest, OneLineASecondWithTheCountOfTheRest) {
  absl::Time now = absl::FromUnixSeconds(1000);
  RateLimitedLog log(absl::Seconds(1), [&now] { return now; });
  uint64_t suppressed = 99;
  EXPECT_TRUE(log.ShouldLog(&suppressed));
  EXPECT_EQ(suppressed, 0u);
  int logged = 0;
  for (int i = 0; i < 1000; ++i) {
    now += absl::Microseconds(500);  // 1000 refusals in half a second
    if (log.ShouldLog(&suppressed)) ++logged;
  }
  EXPECT_EQ(logged, 0);
  now += absl::Seconds(1);
  ASSERT_TRUE(log.ShouldLog(&suppressed));
  EXPECT_EQ(suppressed, 1000u);
  EXPECT_EQ(SuppressedNote(suppressed), " (1000 more since the last such line)");
  EXPECT_EQ(SuppressedNote(0), "");
}

int HighestOpenFd() {
  int highest = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (dirent* e = ::readdir(d)) highest = std::max(highest, std::atoi(e->d_name));
  ::closedir(d);
  return highest;
}

// Restores this process's descriptor limit however the test ends.
class LimitGuard {
 public:
  LimitGuard() { ::getrlimit(RLIMIT_NOFILE, &saved_); }
  ~LimitGuard() { ::setrlimit(RLIMIT_NOFILE, &saved_); }
  bool Lower(rlim_t soft) {
    const rlimit low{soft, saved_.rlim_max};
    return ::setrlimit(RLIMIT_NOFILE, &low) == 0;
  }

 private:
  rlimit saved_{};
};

TEST(AcceptGuardTest, ShedsPendingConnectionsWithoutDescriptorsAndRecovers) {
#ifdef HISPARSE_UBSAN_BUILD
  // UBSan's vptr check tests memory through a pipe (sanitizer_common's IsAccessibleMemoryRange):
  // with no descriptor left it reports every virtual call as a type error, here and in the daemon.
  GTEST_SKIP() << "descriptor exhaustion makes UBSan's vptr check report false errors; runs in the plain build";
#endif
  const std::string path = ::testing::TempDir() + "/accept_guard_test." + std::to_string(::getpid()) + ".sock";
  auto listener = ListenUnixSeqpacket(path, 0600);
  ASSERT_TRUE(listener.ok()) << listener.status();
  ASSERT_EQ(::fcntl(listener->get(), F_SETFL, O_NONBLOCK), 0);
  std::vector<bool> changes;
  // The backoff runs on a fake clock: the test moves it past each wait instead of sleeping.
  AcceptGuard::Clock::time_point now{};
  auto guard = AcceptGuard::Create(listener->get(),
                                   {"test channel", [&](bool up) { changes.push_back(up); }, [&] { return now; }});
  ASSERT_TRUE(guard.ok()) << guard.status();
  AcceptGuard& g = **guard;
  UniqueFd conn;
  EXPECT_EQ(g.Accept(&conn), AcceptGuard::Outcome::kIdle);
  EXPECT_EQ(g.WaitMs(), -1);

  // Two clients wait in the backlog; then no descriptor is left for accept.
  auto a = ConnectUnixSeqpacket(path);
  auto b = ConnectUnixSeqpacket(path);
  ASSERT_TRUE(a.ok() && b.ok());
  LimitGuard limit;
  std::vector<UniqueFd> filler;
  ASSERT_TRUE(limit.Lower(static_cast<rlim_t>(HighestOpenFd() + 8)));
  for (;;) {
    UniqueFd f(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!f.valid()) break;
    filler.push_back(std::move(f));
  }
  ASSERT_EQ(errno, EMFILE);

  // Each pending client is shed (its connection ends), the guard reports the channel down, and
  // nothing spins: with the backlog empty the outcome is kIdle with a probe scheduled.
  EXPECT_EQ(g.Accept(&conn), AcceptGuard::Outcome::kAgain);
  EXPECT_EQ(g.Accept(&conn), AcceptGuard::Outcome::kAgain);
  EXPECT_EQ(g.Accept(&conn), AcceptGuard::Outcome::kIdle);
  EXPECT_FALSE(conn.valid());
  EXPECT_FALSE(g.serving());
  EXPECT_EQ(g.shed(), 2u);
  EXPECT_GE(g.WaitMs(), 0);
  EXPECT_EQ(changes, std::vector<bool>{false});
  for (auto* client : {&*a, &*b}) {
    auto r = RecvPacket(client->get(), 64);
    EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();  // closed, not left waiting
  }

  // A probe while still full keeps the channel down, and backs off further.
  const int first_wait = g.WaitMs();
  now += std::chrono::milliseconds(first_wait + 1);
  g.Probe();
  EXPECT_FALSE(g.serving());
  EXPECT_GT(g.WaitMs(), first_wait);  // the backoff doubled
  // With descriptors free, a probe before the wait has passed does nothing; the next one after it
  // brings the channel back.
  filler.clear();
  g.Probe();
  EXPECT_FALSE(g.serving());
  now += std::chrono::milliseconds(g.WaitMs() + 1);
  g.Probe();
  EXPECT_TRUE(g.serving());
  EXPECT_EQ(g.WaitMs(), -1);
  EXPECT_EQ(changes, (std::vector<bool>{false, true}));
  auto c = ConnectUnixSeqpacket(path);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(g.Accept(&conn), AcceptGuard::Outcome::kAccepted);
  EXPECT_TRUE(conn.valid());
  ::unlink(path.c_str());
}

}  // namespace accept_guard_test
}  // namespace hisparse
