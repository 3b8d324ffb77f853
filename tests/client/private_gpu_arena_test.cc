// PrivateGpuArenaAllowed: the CUDA backend keeps a private GPU arena (which the daemon cannot see)
// only when the engine asked for one; otherwise session open fails and says what to do.
#include "device_backend.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hisparse {
namespace private_gpu_arena_test {

using ::testing::HasSubstr;

TEST(PrivateGpuArenaTest, AllowedOnlyWhenTheEngineAsks) {
  EXPECT_TRUE(PrivateGpuArenaAllowed("1").ok());
  for (const char* request : {static_cast<const char*>(nullptr), "", "0", "yes", "11"}) {
    absl::Status st = PrivateGpuArenaAllowed(request);
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << (request ? request : "(unset)");
    EXPECT_THAT(st.message(), HasSubstr("HISPARSE_PRIVATE_GPU_ARENA=1"));
    EXPECT_THAT(st.message(), HasSubstr("device: auto or cuda"));
  }
}

}  // namespace private_gpu_arena_test
}  // namespace hisparse
