// MemoryHeadroom against fake /proc and cgroup files: the two refusal paths (MemAvailable, the
// cgroup limit, v2 and v1), the walk up to the tightest ancestor, and huge pages counted apart.
#include "hisparse/daemon/memory_headroom.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hisparse {
namespace memory_headroom_test {

using ::testing::HasSubstr;

constexpr uint64_t kGiB = uint64_t{1} << 30;

class MemoryHeadroomTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/hs-memhead-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    sources_.meminfo = dir_ + "/meminfo";
    sources_.self_cgroup = dir_ + "/cgroup";
    sources_.cgroup_root = dir_ + "/sys";
    sources_.self_status = dir_ + "/status";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void Write(const std::string& rel, const std::string& text) {
    const std::filesystem::path p = dir_ + "/" + rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  // A meminfo with MemAvailable `gib` GiB and `huge_free` free 2 MiB pages (`huge_rsvd` reserved).
  void Meminfo(uint64_t gib, uint64_t huge_free = 0, uint64_t huge_rsvd = 0) {
    Write("meminfo", "MemTotal:       263902256 kB\nMemFree:        1000 kB\nMemAvailable:   " +
                         std::to_string(gib * 1024 * 1024) + " kB\nHugePages_Total:    " + std::to_string(huge_free) +
                         "\nHugePages_Free:     " + std::to_string(huge_free) +
                         "\nHugePages_Rsvd:     " + std::to_string(huge_rsvd) + "\nHugepagesize:       2048 kB\n");
  }

  std::string dir_;
  MemorySources sources_;
};

TEST_F(MemoryHeadroomTest, MemAvailableAloneWithoutCgroupLimits) {
  Meminfo(16);
  Write("cgroup", "0::/\n");  // v2 root: no memory.max there
  auto h = ReadMemoryHeadroom(sources_);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->mem_available, 16 * kGiB);
  EXPECT_FALSE(h->cgroup_limit.has_value());
  EXPECT_EQ(h->bytes(), 16 * kGiB);
  EXPECT_TRUE(CheckMemoryFits(*h, 16 * kGiB, "pool").ok());
  // Refusal path 1: more than MemAvailable, with the numbers.
  const absl::Status st = CheckMemoryFits(*h, 64 * kGiB, "the host pool (host_pool.size)");
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(st.message(), HasSubstr("the host pool (host_pool.size) needs 64.0 GiB (68719476736 bytes)"));
  EXPECT_THAT(st.message(), HasSubstr("may take only 16.0 GiB (17179869184 bytes): MemAvailable 16.0 GiB"));
}

TEST_F(MemoryHeadroomTest, CgroupV2LimitOfAnAncestorCaps) {
  Meminfo(100);
  Write("cgroup", "0::/system.slice/hisparsed.service\n");
  Write("sys/system.slice/memory.max", "8589934592\n");             // 8 GiB on the parent
  Write("sys/system.slice/hisparsed.service/memory.max", "max\n");  // none on the leaf
  auto h = ReadMemoryHeadroom(sources_);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE(h->cgroup_limit.has_value());
  EXPECT_EQ(*h->cgroup_limit, 8 * kGiB);
  EXPECT_EQ(h->cgroup_limit_file, sources_.cgroup_root + "/system.slice/memory.max");
  EXPECT_EQ(h->bytes(), 8 * kGiB);
  // Refusal path 2: fits MemAvailable, not the cgroup.
  const absl::Status st = CheckMemoryFits(*h, 32 * kGiB, "pool");
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(st.message(), HasSubstr("(8589934592 bytes): MemAvailable 100 GiB, cgroup limit "));
  EXPECT_THAT(st.message(), HasSubstr(" GiB (" + sources_.cgroup_root + "/system.slice/memory.max)"));
}

TEST_F(MemoryHeadroomTest, CgroupV2OnAHybridHostLivesUnderUnified) {
  Meminfo(100);
  Write("cgroup", "0::/pod\n");
  Write("sys/unified/pod/memory.max", "4294967296\n");
  auto h = ReadMemoryHeadroom(sources_);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->bytes(), 4 * kGiB);
}

TEST_F(MemoryHeadroomTest, CgroupV1LimitAndItsUnlimitedSpelling) {
  Meminfo(100);
  // The process's v1 path may not exist in this mount namespace (a container sees its own cgroup
  // at the mount root): the walk reaches the root's file.
  Write("cgroup", "12:pids:/x\n4:memory:/process_api/abc\n0::/\n");
  Write("sys/memory/memory.limit_in_bytes", "2147483648\n");
  auto h = ReadMemoryHeadroom(sources_);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->bytes(), 2 * kGiB);
  EXPECT_EQ(CheckMemoryFits(*h, 3 * kGiB, "pool").code(), absl::StatusCode::kResourceExhausted);
  // v1 writes "no limit" as a huge number.
  Write("sys/memory/memory.limit_in_bytes", "9223372036854771712\n");
  h = ReadMemoryHeadroom(sources_);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_FALSE(h->cgroup_limit.has_value());
  EXPECT_EQ(h->bytes(), 100 * kGiB);
}

TEST_F(MemoryHeadroomTest, TheTightestOfV1AndV2Wins) {
  Meminfo(100);
  Write("cgroup", "4:memory:/a\n0::/a\n");
  Write("sys/a/memory.max", "6442450944\n");
  Write("sys/memory/a/memory.limit_in_bytes", "3221225472\n");
  auto h = ReadMemoryHeadroom(sources_);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->bytes(), 3 * kGiB);
}

TEST_F(MemoryHeadroomTest, FreeHugePagesTakeThePoolApartFromOrdinaryMemory) {
  Meminfo(4, /*huge_free=*/4096, /*huge_rsvd=*/1024);  // 8 GiB free, 2 GiB of it promised
  Write("cgroup", "0::/\n");
  auto h = ReadMemoryHeadroom(sources_);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->hugetlb_free, 6 * kGiB);
  EXPECT_EQ(OrdinaryPoolBytes(*h, 8 * kGiB, /*may_use_hugetlb=*/true), 2 * kGiB);
  EXPECT_EQ(OrdinaryPoolBytes(*h, 8 * kGiB, /*may_use_hugetlb=*/false), 8 * kGiB);
  EXPECT_EQ(OrdinaryPoolBytes(*h, 1 * kGiB, /*may_use_hugetlb=*/true), 0u);
}

TEST_F(MemoryHeadroomTest, ReadsWhatThisProcessHoldsAlready) {
  Meminfo(16);
  Write("status", "Name:\thisparsed\nVmSize:\t  900000 kB\nVmRSS:\t   65536 kB\nThreads:\t4\n");
  auto h = ReadMemoryHeadroom(sources_);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->self_rss, uint64_t{64} << 20);
}

TEST_F(MemoryHeadroomTest, MissingOrBrokenMeminfoIsAnError) {
  EXPECT_EQ(ReadMemoryHeadroom(sources_).status().code(), absl::StatusCode::kNotFound);
  Write("meminfo", "MemTotal: 1000 kB\n");
  EXPECT_EQ(ReadMemoryHeadroom(sources_).status().code(), absl::StatusCode::kNotFound);
  // No cgroup file at all: MemAvailable alone.
  Meminfo(2);
  auto h = ReadMemoryHeadroom(sources_);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->bytes(), 2 * kGiB);
}

// The running system's numbers parse (whatever they are).
TEST(MemoryHeadroomSystemTest, ThisMachineReads) {
  auto h = ReadMemoryHeadroom();
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_GT(h->bytes(), 0u);
}

}  // namespace memory_headroom_test
}  // namespace hisparse
