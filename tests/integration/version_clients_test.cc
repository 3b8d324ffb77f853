// Issue 40: the daemon serves a client of an older minor release of its major and refuses a newer
// minor or another major, naming both versions (common/include/hisparse/common/version_compat.h),
// held with real client processes against a real hisparsed. Each client is this build's libhisparse
// compiled to report another release at OpenSession (version_client_main.cc; CMakeLists.txt
// derives the releases from project(VERSION), as this test derives what it expects from
// HISPARSE_VERSION): nothing here names a version.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "hisparse/common/version.h"
#include "hisparse/common/version_compat.h"
#include "test_support.h"

namespace hisparse::testing {
namespace {

using ::testing::HasSubstr;

SemVer Mine() {
  absl::StatusOr<SemVer> v = ParseSemVer(HISPARSE_VERSION);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? *v : SemVer{};
}

// hisparse-version-client-KIND against `address`; stderr joins stdout.
CommandResult RunClient(const std::string& kind, const std::string& address) {
  return RunCommand(BinDir() + "/hisparse-version-client-" + kind + " " + address + " 2>&1");
}

TEST(VersionClientsTest, AClientOfThePreviousMinorOpensAdmitsStoresAndReleases) {
  const SemVer mine = Mine();
  if (mine.minor == 0) GTEST_SKIP() << "hisparse " HISPARSE_VERSION " is the first minor of its major: no older one";
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  const CommandResult r = RunClient("prev-minor", d->address());
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("reports hisparse ", mine.major, ".", mine.minor - 1, ".0\n")));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("admit, store, release OK"));
  // The session ended with the client and left nothing behind.
  EXPECT_TRUE(WaitUntil([&] { return Stats(d->address()).sessions() == 0; })) << Stats(d->address()).DebugString();
  EXPECT_EQ(Stats(d->address()).host_pool().used_bytes(), 0u);
}

TEST(VersionClientsTest, ANewerMinorAndAnotherMajorAreRefusedNamingBothVersions) {
  const SemVer mine = Mine();
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  for (const auto& [kind, version] :
       {std::pair<std::string, std::string>{"next-minor", absl::StrCat(mine.major, ".", mine.minor + 1, ".0")},
        std::pair<std::string, std::string>{"next-major", absl::StrCat(mine.major + 1, ".0.0")}}) {
    SCOPED_TRACE(kind);
    const CommandResult r = RunClient(kind, d->address());
    EXPECT_THAT(r.out, HasSubstr("reports hisparse " + version + "\n"));
    EXPECT_EQ(r.exit_code, 3) << r.out;  // refused: FAILED_PRECONDITION
    EXPECT_THAT(r.out, HasSubstr("client hisparse " + version));
    EXPECT_THAT(r.out, HasSubstr("daemon hisparse " HISPARSE_VERSION));
  }
  // The refused opened nothing, and the daemon still serves this release's clients.
  EXPECT_EQ(Stats(d->address()).sessions(), 0u);
  Session s;
  const Error opened = Session::Open(SmallGeometry(d->address()), &s);
  EXPECT_TRUE(opened.ok()) << opened.message;
}

}  // namespace
}  // namespace hisparse::testing
