// hisparse-keeper end to end: the real binary runs hisparse-keeper-probe (keeper_probe_main.cc),
// whose reports come back on a pipe (its stdout), one line per event; the keeper's own log goes
// to a file the tests read at the end. Every wait is bounded (60 s) and none is a sleep.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hisparse/common/daemon_process.h"
#include "hisparse/common/fd_store.h"
#include "hisparse/common/unique_fd.h"

namespace hisparse {
namespace keeper_test {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int kWaitMs = 60000;

// Test binaries and executables share build/bin (the top-level CMakeLists.txt).
std::string BinDir() { return ExecutableDir(); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The value of `key=` in a probe's report ("start pid=12 names=a:b ..."), up to the next space.
std::string Field(absl::string_view line, absl::string_view key) {
  const std::string k = absl::StrCat(" ", key, "=");
  const std::string padded = absl::StrCat(" ", line);
  const size_t at = padded.find(k);
  if (at == std::string::npos) return "<none>";
  const size_t from = at + k.size();
  return padded.substr(from, padded.find(' ', from) - from);
}

// The probe's command line: its path, then `args`.
std::vector<std::string> Probe(std::vector<std::string> args) {
  args.insert(args.begin(), BinDir() + "/hisparse-keeper-probe");
  return args;
}

// One hisparse-keeper process running `program` (the probe, mostly) in a temporary directory of
// its own, which "@DIR@" in any argument names. Killed (SIGKILL, which its child follows) if a test
// ends with it still running.
class Keeper {
 public:
  Keeper(const std::vector<std::string>& keeper_flags, const std::vector<std::string>& program) {
    char tmpl[] = "/tmp/hs-keeper-test-XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    log_path_ = dir_ + "/keeper.log";
    std::vector<std::string> args = {BinDir() + "/hisparse-keeper"};
    args.insert(args.end(), keeper_flags.begin(), keeper_flags.end());
    args.push_back("--");
    args.insert(args.end(), program.begin(), program.end());
    std::vector<char*> argv;
    for (std::string& a : args) {
      a = absl::StrReplaceAll(a, {{"@DIR@", dir_}});
      argv.push_back(a.data());
    }
    argv.push_back(nullptr);
    int out[2];
    EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
    const int log = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    EXPECT_GE(log, 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(log, STDERR_FILENO);
      ::setenv("TMPDIR", dir_.c_str(), 1);  // the keeper's directory lands in ours
      ::execv(argv[0], argv.data());
      ::_exit(126);
    }
    ::close(out[1]);
    ::close(log);
    out_.Reset(out[0]);
  }
  ~Keeper() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status;
      WaitForChildExit(pid_, kWaitMs, &status);
    }
    (void)std::system(absl::StrCat("rm -rf ", dir_).c_str());
  }

  pid_t pid() const { return pid_; }
  const std::string& dir() const { return dir_; }
  std::string Log() const { return ReadFile(log_path_); }

  // The probe's next report; nullopt when its stdout closed or nothing came within 60 s.
  std::optional<std::string> NextLine() {
    const absl::Time deadline = absl::Now() + absl::Milliseconds(kWaitMs);
    while (true) {
      const size_t nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        lines_.push_back(line);
        return line;
      }
      const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (left <= 0) return std::nullopt;
      pollfd p{out_.get(), POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(out_.get(), buf, sizeof(buf));
      if (n <= 0) return std::nullopt;
      buffer_.append(buf, static_cast<size_t>(n));
    }
  }
  // Reads reports up to the first that starts with `prefix` (an "error" report fails the test).
  std::string WaitFor(absl::string_view prefix) {
    while (std::optional<std::string> line = NextLine()) {
      EXPECT_THAT(*line, ::testing::Not(StartsWith("error"))) << Transcript();
      if (absl::StartsWith(*line, prefix)) return *line;
    }
    ADD_FAILURE() << "no report starting with \"" << prefix << "\" within " << kWaitMs << " ms\n" << Transcript();
    return "";
  }
  void Signal(int sig) { ASSERT_EQ(::kill(pid_, sig), 0); }
  // The keeper's wait status once it has exited (-1 when it did not within 60 s).
  int WaitExit() {
    int status = -1;
    if (!WaitForChildExit(pid_, kWaitMs, &status)) return -1;
    pid_ = -1;
    return status;
  }
  std::string Transcript() const {
    std::string t = "probe reports:\n";
    for (const std::string& l : lines_) absl::StrAppend(&t, "  ", l, "\n");
    return absl::StrCat(t, "keeper log:\n", Log());
  }

 private:
  std::string dir_, log_path_;
  pid_t pid_ = -1;
  UniqueFd out_;
  std::string buffer_;
  std::vector<std::string> lines_;
};

void ExpectStoppedWithZero(Keeper& keeper) {
  const int status = keeper.WaitExit();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "wait status " << status << "\n" << keeper.Transcript();
}

// The brief's scenario: stored, SIGKILLed, restarted with the memfd, removed, stopped.
void RunKillOnce(bool barrier) {
  Keeper keeper({"--restart-delay-ms", "10", "--verbose"},
                barrier ? Probe({"kill-once"}) : Probe({"kill-once", "nobarrier"}));
  const std::string first = keeper.WaitFor("start");
  EXPECT_EQ(Field(first, "names"), "");
  EXPECT_EQ(Field(first, "open"), "0");
  keeper.WaitFor("put slab-1");
  const std::string second = keeper.WaitFor("start");
  EXPECT_NE(Field(second, "pid"), Field(first, "pid"));
  EXPECT_EQ(Field(second, "names"), "slab-1");
  EXPECT_EQ(Field(second, "open"), "1");  // the slab, and nothing of the keeper's
  keeper.WaitFor("pattern ok");
  keeper.WaitFor("removed");
  ExpectStoppedWithZero(keeper);
  const std::string log = keeper.Log();
  EXPECT_THAT(log, HasSubstr("killed by signal 9")) << log;
  EXPECT_THAT(log, HasSubstr("stored slab-1")) << log;
  EXPECT_THAT(log, HasSubstr("removed slab-1 (1 fds; 0 stored in all)")) << log;
  EXPECT_THAT(log, HasSubstr("exited with status 0: stopping")) << log;
  // The keeper's directory and socket went with it.
  EXPECT_NE(::access(Field(first, "notify").c_str(), F_OK), 0);
}

TEST(KeeperTest, AStoredMemfdSurvivesASigkill) { RunKillOnce(/*barrier=*/true); }

// Without the barrier the message may still be queued when the child dies: the keeper reads every
// queued message before it handles the exit.
TEST(KeeperTest, AStoreSentJustBeforeDyingStillCounts) { RunKillOnce(/*barrier=*/false); }

TEST(KeeperTest, Sigusr2RestartsTheChildWithTheStoreAndThePidFile) {
  Keeper keeper({"--child-pid-file", "@DIR@/child.pid"}, Probe({"serve"}));
  const std::string pid_file = keeper.dir() + "/child.pid";
  const std::string first = keeper.WaitFor("start");
  keeper.WaitFor("put slab-1");
  keeper.WaitFor("ready");
  EXPECT_EQ(ReadFile(pid_file), Field(first, "pid") + "\n");
  keeper.Signal(SIGUSR2);
  keeper.WaitFor("term");
  const std::string second = keeper.WaitFor("start");
  EXPECT_NE(Field(second, "pid"), Field(first, "pid"));
  EXPECT_EQ(Field(second, "names"), "slab-1");
  keeper.WaitFor("pattern ok");
  keeper.WaitFor("ready");
  EXPECT_EQ(ReadFile(pid_file), Field(second, "pid") + "\n");
  keeper.Signal(SIGTERM);
  keeper.WaitFor("term");
  ExpectStoppedWithZero(keeper);
  EXPECT_NE(::access(pid_file.c_str(), F_OK), 0);
}

TEST(KeeperTest, SighupIsForwardedAndSigtermStops) {
  Keeper keeper({}, Probe({"serve"}));
  const std::string first = keeper.WaitFor("start");
  keeper.WaitFor("ready");
  keeper.Signal(SIGHUP);
  keeper.WaitFor("hup");
  keeper.Signal(SIGTERM);
  keeper.WaitFor("term");
  ExpectStoppedWithZero(keeper);
  EXPECT_FALSE(keeper.NextLine().has_value()) << "the probe started again";
  EXPECT_NE(::access(Field(first, "notify").c_str(), F_OK), 0);
}

TEST(KeeperTest, ACrashLoopIsRestarted) {
  // 75 (EX_TEMPFAIL, hisparsed's "come back") is restarted as any failure is.
  Keeper keeper({"--restart-delay-ms", "5"}, Probe({"crash", "75"}));
  keeper.WaitFor("start");
  keeper.WaitFor("start");
  keeper.WaitFor("start");
  keeper.Signal(SIGTERM);
  ExpectStoppedWithZero(keeper);
  const std::string log = keeper.Log();
  EXPECT_THAT(log, HasSubstr("exited with status 75")) << log;
  EXPECT_THAT(log, HasSubstr("restarting in 10 ms")) << log;  // the second wait, doubled
}

TEST(KeeperTest, MessagesFromAnotherProcessAreIgnored) {
  Keeper keeper({}, Probe({"serve"}));
  const std::string first = keeper.WaitFor("start");
  keeper.WaitFor("ready");
  // This process is not the keeper's child: its memfd must not be stored. The barrier returns
  // because the keeper closes a refused message's descriptors, which also says it was processed.
  auto store = FdStore::Connect(Field(first, "notify"));
  ASSERT_TRUE(store.ok()) << store.status();
  auto memfd = CreateMemfd("foreign", 4096, false, nullptr);
  ASSERT_TRUE(memfd.ok()) << memfd.status();
  ASSERT_TRUE((*store)->Put("foreign", memfd->get()).ok());
  ASSERT_TRUE((*store)->Barrier(absl::Milliseconds(kWaitMs)).ok());
  keeper.Signal(SIGUSR2);
  const std::string second = keeper.WaitFor("start");
  EXPECT_EQ(Field(second, "names"), "slab-1");
  keeper.WaitFor("ready");
  keeper.Signal(SIGTERM);
  ExpectStoppedWithZero(keeper);
  EXPECT_THAT(keeper.Log(), HasSubstr(absl::StrCat("ignoring messages from pid ", ::getpid())));
}

TEST(KeeperTest, AProgramThatCannotRunIsRefusedAtOnce) {
  Keeper keeper({}, {"@DIR@/no-such-program"});
  const int status = keeper.WaitExit();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 127) << "wait status " << status;
  EXPECT_THAT(keeper.Log(), HasSubstr("no-such-program: No such file or directory"));
}

}  // namespace keeper_test
}  // namespace hisparse
