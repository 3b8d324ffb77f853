// ChooseDevice over every (configured device, probe result) pair: the probe is injected, so the
// GPU cases run on machines without one.
#include "hisparse/daemon/device_choice.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hisparse {
namespace device_choice_test {

using ::testing::HasSubstr;

const GpuProbe kTwoGpus{absl::OkStatus(), 2};
const GpuProbe kNoDriver{absl::UnavailableError("no CUDA driver (libcuda.so.1 not found)"), 0};
const GpuProbe kZeroGpus{absl::OkStatus(), 0};

TEST(DeviceChoiceTest, AutoTakesGpuArenasWhenTheProbeFindsAGpu) {
  absl::StatusOr<DeviceChoice> c = ChooseDevice(DeviceKind::kAuto, kTwoGpus);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->gpu_arenas);
  EXPECT_STREQ(c->device(), "cuda");
  EXPECT_THAT(c->why, HasSubstr("2 GPU(s)"));
}

TEST(DeviceChoiceTest, AutoFallsBackToHostArenasAndSaysWhy) {
  for (const GpuProbe& probe : {kNoDriver, kZeroGpus}) {
    absl::StatusOr<DeviceChoice> c = ChooseDevice(DeviceKind::kAuto, probe);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_FALSE(c->gpu_arenas);
    EXPECT_STREQ(c->device(), "host");
    EXPECT_THAT(c->why, HasSubstr("no usable GPU"));
  }
  EXPECT_THAT(ChooseDevice(DeviceKind::kAuto, kNoDriver)->why, HasSubstr("libcuda.so.1 not found"));
  EXPECT_THAT(ChooseDevice(DeviceKind::kAuto, kZeroGpus)->why, HasSubstr("sees 0 GPU(s)"));
}

TEST(DeviceChoiceTest, CudaTakesGpuArenas) {
  absl::StatusOr<DeviceChoice> c = ChooseDevice(DeviceKind::kCuda, kTwoGpus);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->gpu_arenas);
  EXPECT_STREQ(c->device(), "cuda");
}

TEST(DeviceChoiceTest, CudaWithoutAGpuFailsStart) {
  for (const GpuProbe& probe : {kNoDriver, kZeroGpus}) {
    absl::StatusOr<DeviceChoice> c = ChooseDevice(DeviceKind::kCuda, probe);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(c.status().message(), HasSubstr("device: cuda"));
  }
}

TEST(DeviceChoiceTest, HostKeepsHostArenasEvenWithAGpu) {
  for (const GpuProbe& probe : {kTwoGpus, kNoDriver, kZeroGpus}) {
    absl::StatusOr<DeviceChoice> c = ChooseDevice(DeviceKind::kHost, probe);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_FALSE(c->gpu_arenas);
    EXPECT_STREQ(c->device(), "host");
    EXPECT_THAT(c->why, HasSubstr("explicitly"));
  }
}

}  // namespace device_choice_test
}  // namespace hisparse
