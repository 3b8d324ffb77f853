// Every memfd the daemon hands out is sealed against resizing (a tenant's ftruncate of its slab
// would otherwise turn the daemon's touch of it into SIGBUS), on ordinary and on huge pages.
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/daemon/page_pool.h"

namespace hisparse {
namespace memfd_seal_test {

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

// Pool slabs: ready ones from the reserve, ones made on demand, and the new memory that follows a
// slab another owner left.
void ExpectPoolSealed(PagePool::Hugepages hugepages) {
  PagePool::Options o;
  o.budget_bytes = 8 * kMiB;
  o.page_bytes = 2 * kMiB;
  o.slab_bytes = 4 * kMiB;
  o.reserve_slabs = 1;
  o.hugepages = hugepages;
  o.pretouch_threads = 1;
  auto pool = PagePool::Create(o);
  ASSERT_TRUE(pool.ok()) << pool.status();
  for (uint32_t owner = 1; owner <= 3; ++owner) {  // owners 2 and 3 get memory owner 1 left
    (*pool)->WaitIdle();
    auto pages = (*pool)->Allocate(owner, 3);  // a slab of 2 pages from the reserve, one made of 1
    ASSERT_TRUE(pages.ok()) << pages.status();
    for (const PagePool::Page& p : *pages) {
      auto fd = (*pool)->DupSlabFd(owner, p.slab);
      ASSERT_TRUE(fd.ok()) << fd.status();
      ExpectSizeSealed(fd->get(), "owner " + std::to_string(owner) + " slab " + std::to_string(p.slab));
    }
    ASSERT_TRUE((*pool)->ReleaseAll(owner, *pages).ok());
  }
}

TEST(MemfdSealTest, PoolSlabsAndTheirReplacementsAreSizeSealed) { ExpectPoolSealed(PagePool::Hugepages::kOff); }

TEST(MemfdSealTest, HugetlbPoolSlabsAndTheirReplacementsAreSizeSealed) {
  if (FreeHugePages() < 8) GTEST_SKIP() << "fewer than 8 free huge pages (vm.nr_hugepages) on this host";
  ExpectPoolSealed(PagePool::Hugepages::kOn);
}

}  // namespace memfd_seal_test
}  // namespace hisparse
