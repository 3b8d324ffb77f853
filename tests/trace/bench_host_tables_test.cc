// The RESOLVE bench's host layouts (bench/host_tables.h): the paged layout puts every page of
// every row at a distinct page frame inside the pool, records never straddle a page, the slabs
// layout keeps each row's pages inside its own slabs, and a pool too small for a layout is refused
// with the reason.
#include "host_tables.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace hisparse::bench {
namespace bench_host_tables_test {

TEST(BenchHostTables, PagedPagesAreDistinctFramesInsideThePool) {
  const size_t page = size_t{2} << 20, pool = size_t{64} << 20;
  HostTables t;
  std::string why;
  ASSERT_TRUE(BuildHostTables(HostLayout::kPaged, pool, {page, 0}, 3, 10000, 656, 7, &t, &why)) << why;
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

TEST(BenchHostTables, SlabsKeepEachRowInsideItsOwnSlabs) {
  // 10000 records of 656 B in 256 KiB pages: 26 pages a row, two 4 MiB slabs (16 pages each).
  const PageGeometry geo{size_t{256} << 10, size_t{4} << 20};
  const size_t pool = size_t{256} << 20;
  HostTables t;
  std::string why;
  ASSERT_TRUE(BuildHostTables(HostLayout::kSlabs, pool, geo, 5, 10000, 656, 3, &t, &why)) << why;
  EXPECT_EQ(t.records_per_page, geo.page_bytes / 656);
  ASSERT_EQ(t.pages_per_entry, 26u);
  std::set<size_t> all(t.offsets.begin(), t.offsets.end());
  EXPECT_EQ(all.size(), t.offsets.size());  // no page frame twice
  std::set<size_t> slabs_seen;
  for (int r = 0; r < 5; ++r) {
    std::set<size_t> row_slabs;
    bool in_order = true;
    for (uint32_t i = 0; i < t.pages_per_entry; ++i) {
      const size_t off = t.offsets[r * t.pages_per_entry + i];
      EXPECT_EQ(off % geo.page_bytes, 0u);
      EXPECT_LE(off + geo.page_bytes, pool);
      row_slabs.insert(off / geo.slab_bytes);
      if (i > 0 && off != t.offsets[r * t.pages_per_entry + i - 1] + geo.page_bytes) in_order = false;
    }
    EXPECT_EQ(row_slabs.size(), 2u) << "row " << r;  // the fewest slabs that hold 26 pages
    EXPECT_FALSE(in_order) << "row " << r << ": pages should be shuffled inside the slabs";
    for (size_t s : row_slabs) EXPECT_TRUE(slabs_seen.insert(s).second) << "slab shared by two rows";
  }
  EXPECT_EQ(HostTablesBytes(HostLayout::kSlabs, geo, 5, 10000, 656), 5 * 2 * geo.slab_bytes);
}

TEST(BenchHostTables, ContiguousRunsBackToBack) {
  HostTables t;
  std::string why;
  ASSERT_TRUE(BuildHostTables(HostLayout::kContiguous, 1 << 20, {}, 4, 100, 1152, 1, &t, &why)) << why;
  EXPECT_EQ(t.pages_per_entry, 1u);
  EXPECT_EQ(t.Offset(3, 99, 1152), (3 * 100 + 99) * size_t{1152});
}

TEST(BenchHostTables, RefusesWhatDoesNotFit) {
  HostTables t;
  std::string why;
  EXPECT_FALSE(BuildHostTables(HostLayout::kPaged, size_t{4} << 20, {size_t{2} << 20, 0}, 2, 10000, 656, 1, &t, &why));
  EXPECT_NE(why.find("raise --pool"), std::string::npos) << why;
  EXPECT_FALSE(BuildHostTables(HostLayout::kPaged, size_t{4} << 20, {100, 0}, 1, 10, 656, 1, &t, &why));
  EXPECT_NE(why.find("--page-size"), std::string::npos) << why;
  EXPECT_FALSE(BuildHostTables(HostLayout::kSlabs, size_t{64} << 20, {size_t{2} << 20, size_t{3} << 20}, 1, 10, 656, 1,
                               &t, &why));
  EXPECT_NE(why.find("--slab-size"), std::string::npos) << why;
  EXPECT_EQ(ParseBytes("2M"), size_t{2} << 20);
  EXPECT_EQ(ParseBytes("64G"), size_t{64} << 30);
  EXPECT_EQ(ParseBytes("3280"), 3280u);
  EXPECT_EQ(ParseBytes("2MB"), 0u);
  EXPECT_EQ(ParseBytes("x"), 0u);
}

}  // namespace bench_host_tables_test
}  // namespace hisparse::bench
