// The RESOLVE bench's host layouts (bench/host_tables.h): the paged layout puts every page of
// every row at a distinct page frame inside the pool, records never straddle a page, and a pool
// too small for a layout is refused with the reason.
#include "host_tables.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace hisparse::bench {
namespace {

TEST(BenchHostTables, PagedPagesAreDistinctFramesInsideThePool) {
  const size_t page = size_t{2} << 20, pool = size_t{64} << 20;
  HostTables t;
  std::string why;
  ASSERT_TRUE(BuildHostTables(HostLayout::kPaged, pool, page, 3, 10000, 656, 7, &t, &why)) << why;
  EXPECT_EQ(t.records_per_page, page / 656);
  EXPECT_EQ(t.pages_per_entry, (10000 + t.records_per_page - 1) / t.records_per_page);
  std::set<size_t> frames(t.offsets.begin(), t.offsets.end());
  EXPECT_EQ(frames.size(), t.offsets.size());
  for (size_t off : t.offsets) {
    EXPECT_EQ(off % page, 0u);
    EXPECT_LE(off + page, pool);
  }
  // Position p: page p / R, never past the page's end; consecutive positions of a page adjacent.
  for (int p : {0, 1, 3195, 3196, 9999}) {
    const size_t o = t.Offset(2, p, 656);
    const size_t first = t.offsets[2 * t.pages_per_entry + p / t.records_per_page];
    EXPECT_GE(o, first);
    EXPECT_LE(o + 656, first + page);
  }
  EXPECT_EQ(t.Offset(1, 6, 656), t.Offset(1, 5, 656) + 656);
}

TEST(BenchHostTables, ContiguousRunsBackToBack) {
  HostTables t;
  std::string why;
  ASSERT_TRUE(BuildHostTables(HostLayout::kContiguous, 1 << 20, 0, 4, 100, 1152, 1, &t, &why)) << why;
  EXPECT_EQ(t.pages_per_entry, 1u);
  EXPECT_EQ(t.Offset(3, 99, 1152), (3 * 100 + 99) * size_t{1152});
}

TEST(BenchHostTables, RefusesWhatDoesNotFit) {
  HostTables t;
  std::string why;
  EXPECT_FALSE(BuildHostTables(HostLayout::kPaged, size_t{4} << 20, size_t{2} << 20, 2, 10000, 656, 1, &t, &why));
  EXPECT_NE(why.find("raise --pool"), std::string::npos) << why;
  EXPECT_FALSE(BuildHostTables(HostLayout::kPaged, size_t{4} << 20, 100, 1, 10, 656, 1, &t, &why));
  EXPECT_NE(why.find("--page-size"), std::string::npos) << why;
  EXPECT_EQ(ParseBytes("2M"), size_t{2} << 20);
  EXPECT_EQ(ParseBytes("64G"), size_t{64} << 30);
  EXPECT_EQ(ParseBytes("3280"), 3280u);
  EXPECT_EQ(ParseBytes("2MB"), 0u);
  EXPECT_EQ(ParseBytes("x"), 0u);
}

}  // namespace
}  // namespace hisparse::bench
