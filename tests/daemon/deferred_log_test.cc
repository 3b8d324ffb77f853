// DeferredLog: nothing is written until Flush (or the end of its scope), then every line in order,
// with the file and line of its DEFERRED_LOG; below the threshold nothing is kept.
#include "hisparse/daemon/deferred_log.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hisparse/daemon/session_core.h"
#include "session_test_util.h"

namespace hisparse {
namespace deferred_log_test {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(DeferredLogTest, WritesNothingUntilFlushThenEveryLineInOrder) {
  SetLogThreshold(LogSeverity::kInfo);
  testing::internal::CaptureStderr();
  {
    DeferredLog log;
    DEFERRED_LOG(log, INFO) << "first " << 1;
    DEFERRED_LOG(log, WARNING) << "second";
    DEFERRED_LOG(log, DEBUG) << "below the threshold";
    const std::string before = testing::internal::GetCapturedStderr();
    EXPECT_EQ(before, "");
    testing::internal::CaptureStderr();
    log.Flush();
    const std::string flushed = testing::internal::GetCapturedStderr();
    EXPECT_THAT(flushed, HasSubstr("first 1"));
    EXPECT_THAT(flushed, HasSubstr("deferred_log_test.cc"));
    EXPECT_LT(flushed.find("first 1"), flushed.find("second"));
    EXPECT_THAT(flushed, Not(HasSubstr("below the threshold")));
    testing::internal::CaptureStderr();
    DEFERRED_LOG(log, ERROR) << "at the end of the scope";
  }
  EXPECT_THAT(testing::internal::GetCapturedStderr(), HasSubstr("at the end of the scope"));
}

TEST(LockedLogTest, WithoutADeferralALineIsWrittenAtOnce) {
  SetLogThreshold(LogSeverity::kInfo);
  ASSERT_EQ(LogDeferral::Active(), nullptr);
  testing::internal::CaptureStderr();
  LOCKED_LOG(WARNING) << "at once";
  EXPECT_THAT(testing::internal::GetCapturedStderr(), HasSubstr("at once"));
}

TEST(LockedLogTest, NestedDeferralsWriteOnceTheOutermostEnds) {
  SetLogThreshold(LogSeverity::kInfo);
  testing::internal::CaptureStderr();
  {
    LogDeferral outer;
    LOCKED_LOG(INFO) << "one";
    DeferredLog* const active = LogDeferral::Active();
    {
      LogDeferral inner;
      EXPECT_EQ(LogDeferral::Active(), active) << "the inner deferral shares the outer's log";
      LOCKED_LOG(ERROR) << "two";
    }
    EXPECT_EQ(testing::internal::GetCapturedStderr(), "") << "written while the outer deferral lived";
    testing::internal::CaptureStderr();
    LOCKED_LOG(WARNING) << "three";
    LOCKED_LOG(DEBUG) << "below the threshold";
  }
  const std::string written = testing::internal::GetCapturedStderr();
  EXPECT_LT(written.find("one"), written.find("two"));
  EXPECT_LT(written.find("two"), written.find("three"));
  EXPECT_NE(written.find("three"), std::string::npos);
  EXPECT_THAT(written, Not(HasSubstr("below the threshold")));
  EXPECT_EQ(LogDeferral::Active(), nullptr);
}

// The daemon's lock guards defer: a line reached under NodeLock or HotSession is written after
// their locks are released, and the thread writes at once again afterwards.
TEST(LockedLogTest, TheDaemonsLockGuardsDeferTheirLines) {
  SetLogThreshold(LogSeverity::kInfo);
  auto pool = PagePool::Create(session_test::TestPoolOptions(16ull << 20));
  ASSERT_TRUE(pool.ok()) << pool.status();
  SessionCore core(SessionOptions{}, *std::move(pool));
  testing::internal::CaptureStderr();
  {
    NodeLock lock(core);
    LOCKED_LOG(ERROR) << "under the node's lock";
  }
  EXPECT_THAT(testing::internal::GetCapturedStderr(), HasSubstr("under the node's lock"));
  testing::internal::CaptureStderr();
  {
    HotSession hot(core, v1::SessionRef());
    EXPECT_FALSE(hot.session().ok());
    LOCKED_LOG(WARNING) << "under a session's";
    EXPECT_NE(LogDeferral::Active(), nullptr);
  }
  EXPECT_THAT(testing::internal::GetCapturedStderr(), HasSubstr("under a session's"));
  EXPECT_EQ(LogDeferral::Active(), nullptr);
}

}  // namespace deferred_log_test
}  // namespace hisparse
