// hisparse-ctl against a real daemon: human and JSON output, exit codes.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "test_support.h"

namespace hisparse::testing {
namespace {

struct CtlRun {
  int exit_code = -1;
  std::string out;
};

// Runs hisparse-ctl (beside this test binary) with `args`, capturing stdout.
CtlRun Ctl(const std::string& args) {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  self[n > 0 ? n : 0] = 0;
  std::string dir(self);
  dir = dir.substr(0, dir.rfind('/'));
  CtlRun r;
  FILE* p = ::popen((dir + "/hisparse-ctl " + args + " 2>/dev/null").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, got);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(CtlTest, StatsJsonNamesThePoolPlainly) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const std::string address = daemon->address();
  Session s;
  ASSERT_TRUE(Session::Open(SmallGeometry(address), &s).ok());
  ASSERT_TRUE(s.Admit(1, 10, 1000).ok());
  CtlRun r = Ctl("--daemon " + address + " stats --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"capacity_bytes\": 67108864"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"used_bytes\": 256000"), std::string::npos) << r.out;  // 4 layers x 1000 x 64 B
  EXPECT_NE(r.out.find("\"free_bytes\": 66852864"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"sessions\": 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"requests\": 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"fragmentation\": "), std::string::npos) << r.out;
}

TEST(CtlTest, StatsTableIsReadable) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  CtlRun r = Ctl("--daemon " + daemon->address() + " stats");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("CAPACITY"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("64.0 MiB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sessions 0, requests 0"), std::string::npos) << r.out;
}

TEST(CtlTest, UnreachableDaemonExitsTwo) {
  CtlRun r = Ctl("--daemon unix:/nonexistent/hisparsed.sock --timeout-ms 200 stats");
  EXPECT_EQ(r.exit_code, 2);
  r = Ctl("--daemon tcp:nothing stats");
  EXPECT_EQ(r.exit_code, 2);
}

}  // namespace
}  // namespace hisparse::testing
