// Every memfd the daemon hands out is sealed against resizing (a tenant's ftruncate of its segment
// would otherwise turn the daemon's next copy into SIGBUS), on ordinary and on huge pages, and the
// pool's run copy moves exactly the bytes it should.
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/daemon/host_pool.h"

namespace hisparse {
namespace {

constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
constexpr uint64_t kMiB = uint64_t{1} << 20;

// What a hostile engine does with a descriptor it fetched: each resize must fail with EPERM, and
// no further seal (F_SEAL_WRITE would fault the daemon's writes) can be added.
void ExpectSizeSealed(int fd, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(::fcntl(fd, F_GET_SEALS) & kSizeSeals, kSizeSeals);
  const off_t size = ::lseek(fd, 0, SEEK_END);
  ASSERT_GT(size, 0);
  errno = 0;
  EXPECT_EQ(::ftruncate(fd, 0), -1);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_EQ(::ftruncate(fd, size + static_cast<off_t>(4 * kMiB)), -1);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(::lseek(fd, 0, SEEK_END), size);
}

uint64_t FreeHugePages() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t value = 0;
  while (in >> key >> value) {
    if (key == "HugePages_Free:") return value;
    in.ignore(256, '\n');
  }
  return 0;
}

TEST(MemfdSealTest, OrdinaryMemfdIsSizeSealed) {
  auto fd = CreateMemfd("seal-test", 4 * kMiB, /*try_hugetlb=*/false, nullptr);
  ASSERT_TRUE(fd.ok()) << fd.status();
  ExpectSizeSealed(fd->get(), "ordinary");
}

TEST(MemfdSealTest, HugetlbMemfdIsSizeSealed) {
  if (FreeHugePages() < 2) GTEST_SKIP() << "no free huge pages (vm.nr_hugepages) on this host";
  bool huge = false;
  auto fd = CreateMemfd("seal-test-huge", 4 * kMiB, /*try_hugetlb=*/true, &huge);
  ASSERT_TRUE(fd.ok()) << fd.status();
  ASSERT_TRUE(huge);
  ExpectSizeSealed(fd->get(), "hugetlb");
}

// Pool segments, and the fresh memfd a segment gets when it passes to another owner.
void ExpectPoolSealed(HostPool::Hugepages hugepages) {
  HostPool::Options o;
  o.size_bytes = 8 * kMiB;
  o.segment_bytes = 4 * kMiB;
  o.hugepages = hugepages;
  o.pretouch_threads = 1;
  auto pool = HostPool::Create(o);
  ASSERT_TRUE(pool.ok()) << pool.status();
  for (uint32_t owner = 1; owner <= 3; ++owner) {  // owners 2 and 3 get replaced memory
    auto a = (*pool)->Allocate(owner, 3 * kMiB);
    auto b = (*pool)->Allocate(owner, 3 * kMiB);
    ASSERT_TRUE(a.ok() && b.ok());
    for (const HostPool::Run& run : {*a, *b}) {
      auto fd = (*pool)->SegmentFdFor(owner, run.segment);
      ASSERT_TRUE(fd.ok()) << fd.status();
      ExpectSizeSealed(*fd, "owner " + std::to_string(owner) + " segment " + std::to_string(run.segment));
    }
    ASSERT_TRUE((*pool)->Free(owner, *a).ok());
    ASSERT_TRUE((*pool)->Free(owner, *b).ok());
  }
}

TEST(MemfdSealTest, PoolSegmentsAndTheirReplacementsAreSizeSealed) { ExpectPoolSealed(HostPool::Hugepages::kOff); }

TEST(MemfdSealTest, HugetlbPoolSegmentsAndTheirReplacementsAreSizeSealed) {
  if (FreeHugePages() < 8) GTEST_SKIP() << "fewer than 8 free huge pages (vm.nr_hugepages) on this host";
  ExpectPoolSealed(HostPool::Hugepages::kOn);
}

TEST(HostPoolCopyTest, CopyRunMovesExactlyTheRunsBytes) {
  HostPool::Options o;
  o.size_bytes = 8 * kMiB;
  o.segment_bytes = 4 * kMiB;
  o.hugepages = HostPool::Hugepages::kOff;
  o.pretouch_threads = 1;
  auto pool = HostPool::Create(o);
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto from = (*pool)->Allocate(1, 3 * kMiB);
  auto to = (*pool)->Allocate(1, 3 * kMiB + 4096);
  ASSERT_TRUE(from.ok() && to.ok());
  ASSERT_NE(from->segment, to->segment);
  uint8_t* src = (*pool)->SegmentData(from->segment) + from->offset;
  uint8_t* dst = (*pool)->SegmentData(to->segment) + to->offset;
  for (uint64_t i = 0; i < from->bytes; ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  std::memset(dst, 0xee, to->bytes);
  ASSERT_TRUE((*pool)->CopyRun(1, *from, *to, from->bytes).ok());
  EXPECT_EQ(std::memcmp(src, dst, from->bytes), 0);
  EXPECT_EQ(dst[from->bytes], 0xee);  // nothing past the copy
  // Another owner's runs, and more bytes than a run holds, are refused and copy nothing.
  EXPECT_EQ((*pool)->CopyRun(2, *from, *to, 1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*pool)->CopyRun(1, *to, *from, to->bytes).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hisparse
