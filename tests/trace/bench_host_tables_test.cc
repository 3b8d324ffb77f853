// The RESOLVE bench's host layouts (bench/host_tables.h): the paged layout puts every page of
// every row at a distinct page frame inside the pool, records never straddle a page, the slabs
// layout keeps each row's pages inside its own slabs, and a pool too small for a layout is refused
// with the reason. --prewarm's reads: the asked fraction of the pages a launch's misses lie in,
// each once, and extra and gap pages that none lies in.
#include "host_tables.h"

#include <gtest/gtest.h>

#include <cstdint>
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

TEST(BenchHostTables, PrewarmReadsTheAskedShareOfTheMissesPagesAndOthersApart) {
  // 4 rows of 20000 records in 64 KiB pages (99 records a page), the pool 4 KiB into a translation
  // page.
  const size_t page = size_t{64} << 10;
  HostTables t;
  std::string why;
  ASSERT_TRUE(BuildHostTables(HostLayout::kPaged, size_t{64} << 20, {page, 0}, 4, 20000, 656, 5, &t, &why)) << why;
  const uintptr_t base = (uintptr_t{1} << 40) + 4096;
  const int k = 64, hits = 16;
  std::vector<int32_t> pos(4 * k);
  for (int r = 0; r < 4; ++r) {
    for (int j = 0; j < k; ++j) pos[r * k + j] = j < hits ? j : 100 + 311 * j + r;  // misses from 5,072 on
  }
  std::set<long long> needed;
  for (int r = 0; r < 4; ++r) {
    for (int j = hits; j < k; ++j) {
      needed.insert(static_cast<long long>((base + t.Offset(r, pos[r * k + j], 656)) / page));
    }
  }
  const PrewarmReads all =
      PlanPrewarm(t, base, size_t{64} << 20, pos, 4, k, hits, 20000, 656, {page, 1.0, 0.5, 2.0}, 9);
  EXPECT_EQ(all.needed, static_cast<long long>(needed.size()));
  EXPECT_EQ(all.hit, all.needed);
  std::set<long long> seen;
  for (size_t i = 0; i < all.first.size(); ++i) {
    const long long a = all.first[i];
    EXPECT_GE(a, static_cast<long long>(base));
    EXPECT_TRUE(a % static_cast<long long>(page) == 0 || a == static_cast<long long>(base)) << a;
    const long long pg = a / static_cast<long long>(page);
    EXPECT_TRUE(seen.insert(pg).second) << "page read twice: " << pg;
    EXPECT_EQ(needed.count(pg) == 1, i < static_cast<size_t>(all.hit)) << i;  // needed first, then none
  }
  EXPECT_EQ(static_cast<long long>(all.first.size()) - all.hit, std::llround(0.5 * all.needed));
  EXPECT_EQ(static_cast<long long>(all.gap.size()), 2 * all.needed);
  for (const long long a : all.gap) {
    const long long pg = a / static_cast<long long>(page);
    EXPECT_EQ(needed.count(pg), 0u);
    EXPECT_TRUE(seen.insert(pg).second) << "gap page read before: " << pg;
  }
  // A fraction reads that share of the needed pages and nothing else; the same seed, the same reads.
  const PrewarmReads half = PlanPrewarm(t, base, size_t{64} << 20, pos, 4, k, hits, 20000, 656, {page, 0.5, 0, 0}, 9);
  EXPECT_EQ(half.hit, std::llround(0.5 * half.needed));
  EXPECT_EQ(static_cast<long long>(half.first.size()), half.hit);
  EXPECT_TRUE(half.gap.empty());
  EXPECT_EQ(PlanPrewarm(t, base, size_t{64} << 20, pos, 4, k, hits, 20000, 656, {page, 0.5, 0, 0}, 9).first,
            half.first);

  // Contiguous: row 0's position 0 lies at the pool's start, inside a page that begins before it.
  HostTables c;
  ASSERT_TRUE(BuildHostTables(HostLayout::kContiguous, size_t{64} << 20, {}, 1, 20000, 656, 5, &c, &why)) << why;
  const std::vector<int32_t> first_only{0};
  const PrewarmReads clamped =
      PlanPrewarm(c, base, size_t{64} << 20, first_only, 1, 1, 0, 20000, 656, {page, 1.0, 0, 0}, 9);
  ASSERT_EQ(clamped.first.size(), 1u);
  EXPECT_EQ(clamped.first[0], static_cast<long long>(base));
}

}  // namespace bench_host_tables_test
}  // namespace hisparse::bench
