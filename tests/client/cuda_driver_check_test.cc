// An old NVIDIA driver is refused at session open with the driver it needs, not a CUDA error code
// (client/cuda_driver_check.h). Pure: runs without CUDA.
#include "cuda_driver_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace hisparse {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(CudaDriverCheckTest, DriversOfTheRuntimesMajorOrNewerPass) {
  EXPECT_TRUE(CheckCudaDriver(13000, 13000).ok());
  EXPECT_TRUE(CheckCudaDriver(13020, 13000).ok());
  EXPECT_TRUE(CheckCudaDriver(13000, 13010).ok());  // minor-version compatibility within a major
  EXPECT_TRUE(CheckCudaDriver(14000, 13000).ok());
}

TEST(CudaDriverCheckTest, AnOlderDriverNamesTheDriverItNeeds) {
  const absl::Status st = CheckCudaDriver(12080, 13000);  // a 570 driver: CUDA 12.8
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(st.message()),
              AllOf(HasSubstr("supports CUDA up to 12.8"), HasSubstr("built with CUDA 13.0"),
                    HasSubstr("needs NVIDIA driver 580 or newer"), HasSubstr("host backend")));
  EXPECT_THAT(std::string(st.message()), ::testing::Not(HasSubstr("insufficient")));
}

TEST(CudaDriverCheckTest, NoDriverIsUnavailableWithTheSameAdvice) {
  const absl::Status st = CheckCudaDriver(0, 13000);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(st.message()), AllOf(HasSubstr("no NVIDIA driver"), HasSubstr("580 or newer")));
}

TEST(CudaDriverCheckTest, KnowsTheDriverBranchOfEachMajor) {
  EXPECT_EQ(MinimumDriverForCuda(13), 580);
  EXPECT_EQ(MinimumDriverForCuda(12), 525);
  EXPECT_EQ(MinimumDriverForCuda(99), 0);
  EXPECT_THAT(std::string(CheckCudaDriver(98000, 99000).message()), ::testing::Not(HasSubstr("driver 0")));
}

}  // namespace
}  // namespace hisparse
