// hisparse-ctl against a real daemon: human and JSON output, exit codes.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
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
  EXPECT_EQ(complete("hisparse-ctl --daemon unix:/x drain --", 4), "--help --json --no-wait --timeout\n");
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

}  // namespace ctl_test
}  // namespace hisparse::testing
