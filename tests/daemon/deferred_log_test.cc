// DeferredLog: nothing is written until Flush (or the end of its scope), then every line in order,
// with the file and line of its DEFERRED_LOG; below the threshold nothing is kept.
#include "hisparse/daemon/deferred_log.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

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

}  // namespace deferred_log_test
}  // namespace hisparse
