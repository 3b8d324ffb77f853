// process_* metrics: /proc/<pid>/stat and /proc/stat parsed as proc(5) lays them out, and the real
// reading of this process (its descriptors counted as they open).
#include "hisparse/daemon/process_stats.h"

#include <fcntl.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace hisparse {
namespace {

// A stat line whose comm holds a space and a ')', the case a naive split gets wrong.
constexpr char kPidStat[] =
    "4242 (hisp arsed) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 "
    "250 50 0 0 20 0 9 0 1000 123456789 2048 18446744073709551615\n";
constexpr char kProcStat[] = "cpu  1 2 3 4\nintr 5\nbtime 1700000000\nprocesses 9\n";

TEST(ProcessStatsTest, ParsesFieldsAfterTheLastParenthesis) {
  auto s = ParseProcessStats(kPidStat, kProcStat, /*ticks_per_second=*/100, /*page_bytes=*/4096);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_DOUBLE_EQ(s->cpu_seconds, 3.0);                         // (250 + 50) / 100
  EXPECT_DOUBLE_EQ(s->start_time_seconds, 1700000000.0 + 10.0);  // btime + 1000 / 100
  EXPECT_EQ(s->virtual_bytes, 123456789u);
  EXPECT_EQ(s->resident_bytes, 2048u * 4096u);
}

TEST(ProcessStatsTest, RefusesWhatItCannotRead) {
  EXPECT_FALSE(ParseProcessStats("4242 hisparsed S 1", kProcStat, 100, 4096).ok());  // no ')'
  EXPECT_FALSE(ParseProcessStats("4242 (h) S 1 2 3", kProcStat, 100, 4096).ok());    // short
  EXPECT_FALSE(ParseProcessStats(kPidStat, "cpu 1 2 3\n", 100, 4096).ok());          // no btime
  EXPECT_FALSE(ParseProcessStats(kPidStat, kProcStat, 0, 4096).ok());                // no tick
}

TEST(ProcessStatsTest, ReadsThisProcess) {
  auto before = ReadProcessStats();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_GT(before->resident_bytes, 0u);
  EXPECT_GT(before->max_fds, 0u);
  EXPECT_GT(before->start_time_seconds, 1.6e9);
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  auto after = ReadProcessStats();
  ::close(fd);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->open_fds, before->open_fds + 1);
}

}  // namespace
}  // namespace hisparse
