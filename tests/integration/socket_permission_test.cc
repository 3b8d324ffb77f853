// A user outside the socket's group is told so at once — "permission denied on the socket (mode,
// group): add the user to that group" — by the library (HS_ERR_PERMISSION_DENIED, not UNAVAILABLE
// after the timeout) and by hisparse-ctl (exit 77, not 2), against a real hisparsed. The client
// runs as nobody in a forked child, so the test needs root (it skips, saying so, otherwise).
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "test_support.h"

namespace hisparse::testing {
namespace socket_permission_test {

constexpr uid_t kNobody = 65534;
constexpr gid_t kNogroup = 65534;

struct ChildResult {
  int exit_code = -1;
  std::string out;  // stdout and stderr
  double seconds = 0;
};

// Runs argv as nobody:nogroup, without supplementary groups: fork, drop the ids, exec. Between
// fork and exec only async-signal-safe calls (the parent has threads).
ChildResult RunAsNobody(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int pipefd[2];
  ChildResult r;
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return r;
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipefd[1], 1);
    ::dup2(pipefd[1], 2);
    if (::setgroups(0, nullptr) != 0 || ::setgid(kNogroup) != 0 || ::setuid(kNobody) != 0) ::_exit(126);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(pipefd[1]);
  if (pid < 0) {  // no child: waitpid(-1) below would reap any, the test's daemon too
    ::close(pipefd[0]);
    return r;
  }
  char buf[4096];
  for (ssize_t n; (n = ::read(pipefd[0], buf, sizeof(buf))) > 0;) r.out.append(buf, n);
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string Dir(const std::string& path) { return path.substr(0, path.rfind('/')); }

class SocketPermissionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root, to run the client as another uid (nobody) than the daemon's";
    daemon_ = StartDaemon();
    ASSERT_NE(daemon_, nullptr);
  }
  std::unique_ptr<DaemonProcess> daemon_;
};

// The socket (0660, root's group) refuses nobody; its directory lets nobody through.
TEST_F(SocketPermissionTest, OutsideTheGroupIsToldAtOnceByTheLibraryAndTheCli) {
  ASSERT_EQ(::chmod(Dir(daemon_->socket_path()).c_str(), 0711), 0);
  const std::string want = "permission denied on the socket " + daemon_->socket_path() +
                           " (mode 0660, group root): add the user to "
                           "that group";

  // The library: measured around hs_session_open itself, in the child (a 60 s timeout is set, so
  // a fall-back to "cannot reach" could not pass).
  const ChildResult lib = RunAsNobody({BinDir() + "/hisparse-test-client", daemon_->address(), "open-timed"});
  ASSERT_EQ(lib.exit_code, 0) << lib.out;
  EXPECT_NE(lib.out.find("rc=" + std::to_string(HS_ERR_PERMISSION_DENIED) + " "), std::string::npos) << lib.out;
  EXPECT_NE(lib.out.find(want), std::string::npos) << lib.out;
  const size_t at = lib.out.find("ms=");
  ASSERT_NE(at, std::string::npos) << lib.out;
  const double ms = std::strtod(lib.out.c_str() + at + 3, nullptr);
  EXPECT_LT(ms, 100.0) << lib.out;
  std::printf("library: permission denied after %.3f ms\n", ms);

  // The CLI: its own exit status; with a 60 s timeout it would still be waiting were it "unreachable".
  const ChildResult ctl =
      RunAsNobody({BinDir() + "/hisparse-ctl", "--daemon", daemon_->address(), "--timeout-ms", "60000", "stats"});
  EXPECT_EQ(ctl.exit_code, 77) << ctl.out;
  EXPECT_NE(ctl.out.find(want), std::string::npos) << ctl.out;
  EXPECT_EQ(ctl.out.find("cannot reach"), std::string::npos) << ctl.out;
  EXPECT_LT(ctl.seconds, 30.0) << ctl.out;
}

// The daemon's private directory (0700) refuses nobody before the socket does: it is named.
TEST_F(SocketPermissionTest, ADirectoryThatRefusesIsNamed) {
  const std::string dir = Dir(daemon_->socket_path());
  ASSERT_EQ(::chmod(dir.c_str(), 0700), 0);
  const ChildResult ctl = RunAsNobody({BinDir() + "/hisparse-ctl", "--daemon", daemon_->address(), "stats"});
  EXPECT_EQ(ctl.exit_code, 77) << ctl.out;
  EXPECT_NE(ctl.out.find("permission denied on the socket's directory " + dir + " (mode 0700, group root)"),
            std::string::npos)
      << ctl.out;
}

// Root (in every group, in effect) is not refused: the check does not get in the way.
TEST_F(SocketPermissionTest, AMemberIsServed) {
  const CommandResult r = Ctl(daemon_->address(), "stats");
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

}  // namespace socket_permission_test
}  // namespace hisparse::testing
