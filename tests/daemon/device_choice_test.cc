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

// A container on a GPU node started without the NVIDIA container runtime: the kernel driver is
// there, libcuda.so.1 is not. auto serves host arenas and warns with what the container needs;
// cuda refuses to start, saying the same.
TEST(DeviceChoiceTest, AGpuNodesContainerWithoutLibcudaIsToldWhatItNeeds) {
  const GpuProbe probe{absl::UnavailableError("no CUDA driver (dlopen libcuda.so.1: not found)"), 0,
                       DriverView::kMissingOnGpuNode};
  absl::StatusOr<DeviceChoice> c = ChooseDevice(DeviceKind::kAuto, probe);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->gpu_arenas);
  EXPECT_TRUE(c->warn);
  for (const char* want : {"libcuda.so.1 is not in this container", "NVIDIA container runtime", "runtimeClassName",
                           "NVIDIA_DRIVER_CAPABILITIES=compute,utility", "slot arenas in host memory"}) {
    EXPECT_THAT(c->why, HasSubstr(want));
  }
  absl::StatusOr<DeviceChoice> refused = ChooseDevice(DeviceKind::kCuda, probe);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("NVIDIA container runtime"));
}

// A machine without NVIDIA GPUs (CI, a CPU node): auto serves host arenas without a warning.
TEST(DeviceChoiceTest, AMachineWithoutTheDriverIsNoWarning) {
  const GpuProbe probe{absl::UnavailableError("no CUDA driver (dlopen libcuda.so.1: not found)"), 0,
                       DriverView::kNoDriver};
  absl::StatusOr<DeviceChoice> c = ChooseDevice(DeviceKind::kAuto, probe);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->warn);
  EXPECT_THAT(c->why, HasSubstr("no NVIDIA driver on this machine"));
  EXPECT_THAT(std::string(ChooseDevice(DeviceKind::kCuda, probe).status().message()),
              HasSubstr("no NVIDIA driver on this machine"));
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
