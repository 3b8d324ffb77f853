// PathLock: one holder per path, the holder's pid in the refusal, the lock gone with its holder.
#include "hisparse/common/path_lock.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hisparse {
namespace path_lock_test {

using ::testing::HasSubstr;

class PathLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/hs-lock-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/hisparsed.sock.lock";
  }
  void TearDown() override {
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  std::string dir_, path_;
};

TEST_F(PathLockTest, SecondHolderIsRefusedWithTheFirstsPid) {
  auto first = PathLock::Acquire(path_);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->held());
  // flock conflicts between open file descriptions, so a second open in this process stands in
  // for a second daemon.
  auto second = PathLock::Acquire(path_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr(absl::StrCat("pid ", ::getpid())));
  EXPECT_THAT(second.status().message(), HasSubstr(path_));
}

TEST_F(PathLockTest, ReleasedLockRemovesItsFileAndCanBeRetaken) {
  {
    auto first = PathLock::Acquire(path_);
    ASSERT_TRUE(first.ok()) << first.status();
    PathLock moved = *std::move(first);  // the owner may move; the lock goes with it
    EXPECT_TRUE(moved.held());
    EXPECT_EQ(::access(path_.c_str(), F_OK), 0);
  }
  EXPECT_NE(::access(path_.c_str(), F_OK), 0);
  auto again = PathLock::Acquire(path_);
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST_F(PathLockTest, AStaleFileFromAKilledHolderDoesNotBlock) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto lock = PathLock::Acquire(path_);
    const char c = lock.ok() ? 'y' : 'n';
    (void)!::write(ready[1], &c, 1);
    ::pause();
    ::_exit(0);
  }
  // The child waits in pause() until killed: on every path out, a failed assertion's too.
  struct Reaper {
    pid_t pid;
    void Kill() {
      if (pid <= 0) return;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      pid = -1;
    }
    ~Reaper() { Kill(); }
  } holder{child};
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  auto while_alive = PathLock::Acquire(path_);
  ASSERT_FALSE(while_alive.ok());
  EXPECT_THAT(while_alive.status().message(), HasSubstr(absl::StrCat("pid ", child)));
  holder.Kill();
  EXPECT_EQ(::access(path_.c_str(), F_OK), 0);  // the file stays behind: SIGKILL ran no cleanup
  auto after = PathLock::Acquire(path_);
  EXPECT_TRUE(after.ok()) << after.status();
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST_F(PathLockTest, UnwritableDirectoryIsAnError) {
  auto lock = PathLock::Acquire(dir_ + "/no/such/dir/x.lock");
  ASSERT_FALSE(lock.ok());
  EXPECT_THAT(lock.status().message(), HasSubstr("cannot open lock file"));
}

}  // namespace path_lock_test
}  // namespace hisparse
