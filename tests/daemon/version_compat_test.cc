// The version rule of OpenSession (common/include/hisparse/common/version_compat.h), alone and
// through SessionManager::OpenSession.
#include "hisparse/common/version_compat.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace hisparse {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(VersionCompatTest, ParsesSemanticVersions) {
  absl::StatusOr<SemVer> v = ParseSemVer("1.12.3-rc1");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->major, 1u);
  EXPECT_EQ(v->minor, 12u);
  EXPECT_EQ(v->patch, 3u);
  for (const char* bad : {"", "1", "1.2", "1.2.3.4", "1..3", "a.b.c", "1.2.x", "-1.2.3", "1.2.99999999999"}) {
    EXPECT_EQ(ParseSemVer(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(VersionCompatTest, ServesOlderMinorsOfItsMajor) {
  EXPECT_TRUE(CheckClientVersion("1.4.2", "1.4.2").ok());
  EXPECT_TRUE(CheckClientVersion("1.3.9", "1.4.0").ok());  // the previous minor
  EXPECT_TRUE(CheckClientVersion("1.0.0", "1.4.0").ok());
  EXPECT_TRUE(CheckClientVersion("1.4.7", "1.4.0").ok());  // patches do not change the protocol
  EXPECT_TRUE(CheckClientVersion("", "1.4.0").ok());       // a client older than the field
}

TEST(VersionCompatTest, RefusesNewerMinorsAndOtherMajorsNamingBoth) {
  const absl::Status newer = CheckClientVersion("1.5.0", "1.4.2");
  EXPECT_EQ(newer.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(newer.message()),
              AllOf(HasSubstr("client hisparse 1.5.0"), HasSubstr("daemon hisparse 1.4.2"), HasSubstr("newer minor")));
  for (const char* other : {"2.0.0", "0.9.0"}) {
    const absl::Status s = CheckClientVersion(other, "1.4.2");
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << other;
    EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr(std::string("client hisparse ") + other),
                                                HasSubstr("daemon hisparse 1.4.2"), HasSubstr("another major")));
  }
  EXPECT_EQ(CheckClientVersion("latest", "1.4.2").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hisparse
