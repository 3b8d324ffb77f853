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

TEST(CtlTest, UnreachableDaemonExitsTwo) {
  CommandResult r = Ctl("unix:/nonexistent/hisparsed.sock", "--timeout-ms 200 stats");
  EXPECT_EQ(r.exit_code, 2);
  r = Ctl("tcp:nothing", "stats");
  EXPECT_EQ(r.exit_code, 2);
}

}  // namespace ctl_test
}  // namespace hisparse::testing
