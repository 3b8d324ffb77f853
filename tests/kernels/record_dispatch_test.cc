// DispatchRecordBytes (kernels/record_dispatch.h): a size with its own kernel runs with UPR equal
// to its 16-byte units (CopyChunk would move the wrong bytes otherwise), every other size with
// the generic UPR = 0, and what the callable returns comes back.
#include "record_dispatch.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace hisparse {
namespace record_dispatch_test {

int UprFor(uint32_t record_bytes) {
  return internal::DispatchRecordBytes(record_bytes, [](auto upr) { return decltype(upr)::value; });
}

TEST(DispatchRecordBytes, SpecialisedSizesGetTheirUnits) {
  for (const uint32_t rb : {512u, 656u, 1152u}) {
    EXPECT_EQ(UprFor(rb), static_cast<int>(rb / 16)) << rb << " B";
  }
}

TEST(DispatchRecordBytes, EveryOtherSizeIsGeneric) {
  for (const uint32_t rb : {16u, 496u, 528u, 640u, 672u, 1136u, 1168u, 4112u, 16384u}) {
    EXPECT_EQ(UprFor(rb), 0) << rb << " B";
  }
}

TEST(DispatchRecordBytes, CallsOnceAndReturnsVoidToo) {
  int calls = 0;
  internal::DispatchRecordBytes(656, [&](auto) { ++calls; });
  EXPECT_EQ(calls, 1);
}

}  // namespace record_dispatch_test
}  // namespace hisparse
