// hisparse-ctl against a real daemon: human and JSON output, exit codes.
#include <sys/wait.h>
#include <unistd.h>

#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "test_support.h"

namespace hisparse::testing {
namespace ctl_test {

TEST(CtlTest, StatsJsonNamesThePoolPlainly) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const std::string address = daemon->address();
  Session s;
  ASSERT_TRUE(Session::Open(SmallGeometry(address), &s).ok());
  ASSERT_TRUE(s.Admit(1, 10, 1000).ok());
  CommandResult r = Ctl(address, "stats --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"capacity_bytes\": 67108864"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"used_bytes\": 262144"), std::string::npos) << r.out;  // 4 layers x 16 pages of 4 KiB
  EXPECT_NE(r.out.find("\"free_bytes\": 66846720"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"sessions\": 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"requests\": 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"fragmentation\": "), std::string::npos) << r.out;
}

TEST(CtlTest, StatsTableIsReadable) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  CommandResult r = Ctl(daemon->address(), "stats");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("CAPACITY"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("64.0 MiB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sessions 0, requests 0"), std::string::npos) << r.out;
}

TEST(CtlTest, UnreachableDaemonExitsTwoAndBadUsage64) {
  CommandResult r = Ctl("unix:/nonexistent/hisparsed.sock", "--timeout-ms 200 stats");
  EXPECT_EQ(r.exit_code, 2);
  // Bad usage is EX_USAGE, apart from "unreachable".
  EXPECT_EQ(Ctl("tcp:nothing", "stats").exit_code, 64);
  EXPECT_EQ(Ctl("unix:/nonexistent/hisparsed.sock", "no-such-command").exit_code, 64);
  EXPECT_EQ(Ctl("unix:/nonexistent/hisparsed.sock", "evict").exit_code, 64);  // REQUEST missing
  EXPECT_EQ(Ctl("unix:/nonexistent/hisparsed.sock", "completion fish").exit_code, 64);
}

// config --json is one JSON object of the config's keys, typed (python3's json module reads it).
TEST(CtlTest, ConfigJsonIsJson) {
  if (RunCommand("python3 -c 'import json'").exit_code != 0) GTEST_SKIP() << "no python3 to read the JSON with";
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const CommandResult r =
      RunCommand(BinDir() + "/hisparse-ctl --daemon " + daemon->address() +
                 " config --json | python3 -c 'import json, sys; d = json.load(sys.stdin); "
                 "print(repr(d[\"host_pool\"][\"size\"]), repr(d[\"limits\"][\"max_sessions\"]), "
                 "repr(d[\"host_pool\"][\"hugepages\"]), repr(d[\"host_pool\"][\"mlock\"]), repr(d[\"log_level\"]))'");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, "'64MiB' 256 'auto' False 'warning'\n");
}

// watch into a pipe: the tables one after another, no terminal escapes.
TEST(CtlTest, WatchWritesNoEscapesIntoAPipe) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const CommandResult r = Ctl(daemon->address(), "watch --count 2 --interval 0.05");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find('\033'), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("refresh 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("CAPACITY"), std::string::npos) << r.out;
}

// bash completion goes past the first word: a command's own flags, and completion's shells.
TEST(CtlTest, BashCompletionKnowsEachCommandsFlags) {
  if (RunCommand("command -v bash").exit_code != 0) GTEST_SKIP() << "no bash";
  const std::string ctl = BinDir() + "/hisparse-ctl";
  auto complete = [&](const std::string& words, int cword) {
    return RunCommand("bash -c 'source <(" + ctl + " completion bash); COMP_WORDS=(" + words +
                      "); COMP_CWORD=" + std::to_string(cword) + "; _hisparse_ctl; echo \"${COMPREPLY[*]}\"'")
        .out;
  };
  EXPECT_EQ(complete("hisparse-ctl evict --s", 2), "--session\n");
  EXPECT_EQ(complete("hisparse-ctl --daemon unix:/x drain --", 4), "--help --json --no-wait --timeout --cancel\n");
  EXPECT_EQ(complete("hisparse-ctl completion \"\"", 2), "bash zsh\n");
  EXPECT_NE(complete("hisparse-ctl st", 1).find("stats"), std::string::npos);
}

// hisparsed's own statuses: 64 for the command line, 78 for the config (sysexits.h).
TEST(CtlTest, HisparsedUsageAndConfigErrorsHaveTheirOwnStatus) {
  const std::string d = BinDir() + "/hisparsed --listen unix:/nonexistent/h.sock ";
  EXPECT_EQ(RunCommand(d + "--no-such-flag").exit_code, 64);
  EXPECT_EQ(RunCommand(d + "--host-pool-size").exit_code, 64);  // no value
  EXPECT_EQ(RunCommand(d + "--set host_pool.size").exit_code, 64);
  EXPECT_EQ(RunCommand(d + "--set host_pool.size=12XB").exit_code, 78);
  EXPECT_EQ(RunCommand(d + "--set no_such.key=1").exit_code, 78);
  EXPECT_EQ(RunCommand(d + "--config /nonexistent/hisparsed.yaml").exit_code, 78);
  EXPECT_EQ(RunCommand(d + "--help").exit_code, 0);
}

// hisparsed --check-config FILE: reads the file (and the flags beside it) as a start would, starts
// nothing, and says "ok" with the keys off their defaults (0) or what is wrong, naming the key (78).
TEST(CtlTest, HisparsedCheckConfigSaysOkOrWhatIsWrongAndStartsNothing) {
  char dir[] = "/tmp/hisparse-check-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/hisparsed.yaml";
  const std::string sock = std::string(dir) + "/h.sock";
  const std::string check = BinDir() + "/hisparsed --check-config " + path + " --listen unix:" + sock + " ";
  // stderr too: the refusal is written there.
  auto run = [](const std::string& cmd) { return RunCommand("(" + cmd + " 2>&1)"); };
  struct stat st {};

  std::ofstream(path) << "host_pool:\n  size: 2GiB\nlimits:\n  max_sessions: 8\n";
  CommandResult r = run(check);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.rfind("ok: " + path + "\n", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("host_pool.size: \"1GiB\" -> \"2GiB\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("limits.max_sessions: \"256\" -> \"8\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("listen: "), std::string::npos) << "a flag counts as at start\n" << r.out;
  EXPECT_EQ(r.out.find("log_level"), std::string::npos) << "a key at its default is not listed\n" << r.out;
  EXPECT_NE(::stat(sock.c_str(), &st), 0) << "--check-config made the socket";
  EXPECT_NE(::stat((sock + ".lock").c_str(), &st), 0) << "--check-config took the socket's lock";

  // A flag's bad value is refused as at start.
  r = run(check + "--set limits.max_sessions=0");
  EXPECT_EQ(r.exit_code, 78) << r.out;
  EXPECT_NE(r.out.find("limits.max_sessions: must be >= 1, got 0"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("ok:"), std::string::npos) << r.out;

  // The file's bad value: the key, the value and what would do.
  std::ofstream(path) << "host_pool:\n  size: 100000001\n";
  r = run(check);
  EXPECT_EQ(r.exit_code, 78) << r.out;
  EXPECT_NE(r.out.find("host_pool.size: must be a multiple of 4KiB, got 100000001"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("would do"), std::string::npos) << r.out;

  // A flag that does not go with the file's keys (checked at start, not per key).
  std::ofstream(path) << "host_pool:\n  size: 1028KiB\n";
  r = run(check + "--set host_pool.hugepages=on");
  EXPECT_EQ(r.exit_code, 78) << r.out;
  EXPECT_NE(r.out.find("host_pool.size: must be a multiple of 2MiB when host_pool.hugepages is on"), std::string::npos)
      << r.out;

  // A socket group that does not exist fails a start: the check says so.
  std::ofstream(path) << "access:\n  socket_group: no-such-group-hisparse\n";
  r = run(check);
  EXPECT_EQ(r.exit_code, 78) << r.out;
  EXPECT_NE(r.out.find("access.socket_group: no group named"), std::string::npos) << r.out;

  // An unknown key, an empty file (a reload refuses it), a missing file.
  std::ofstream(path) << "limits:\n  max_sesions: 8\n";
  r = run(check);
  EXPECT_EQ(r.exit_code, 78) << r.out;
  EXPECT_NE(r.out.find("limits.max_sesions: unknown key"), std::string::npos) << r.out;
  std::ofstream(path, std::ios::trunc).flush();
  r = run(check);
  EXPECT_EQ(r.exit_code, 78) << r.out;
  EXPECT_NE(r.out.find("the config is empty"), std::string::npos) << r.out;
  EXPECT_EQ(run(BinDir() + "/hisparsed --check-config " + std::string(dir) + "/missing.yaml").exit_code, 78);
  // Not beside --config; without its FILE: usage errors.
  EXPECT_EQ(RunCommand(check + "--config " + path).exit_code, 64);
  EXPECT_EQ(RunCommand(BinDir() + "/hisparsed --check-config").exit_code, 64);
  EXPECT_NE(::stat(sock.c_str(), &st), 0);
  ::unlink(path.c_str());
  ::rmdir(dir);
}

}  // namespace ctl_test
}  // namespace hisparse::testing
