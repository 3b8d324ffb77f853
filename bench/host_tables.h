// Host page tables for the RESOLVE benches: where every row's host records lie in one mapped
// pool, as kernels/include/hisparse/kernels/arena_layout.h ("Host page tables") reads them, in one
// of three layouts over the same pool:
//   contiguous  row r's run of seq records at pool offset r * seq * record_bytes (back to back);
//   paged       pages of R = page_bytes / record_bytes records (a record never straddles a page),
//               each page at a distinct page frame of the pool (frame f at f * page_bytes) drawn
//               at random (seeded), so the pages of a row are scattered over the whole pool;
//   slabs       the same pages, but each row's pages fill the fewest slabs of slab_bytes it needs
//               (distinct slab frames drawn at random over the pool), in random page order inside
//               them: what the daemon's pool (daemon/page_pool.h) hands one request whose pages
//               stay within its own slabs while those slabs are fragmented.
// Plain C++ (no CUDA): the tables are offsets that the caller adds to the pool's device or host
// address.
#ifndef HISPARSE_BENCH_HOST_TABLES_H_
#define HISPARSE_BENCH_HOST_TABLES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hisparse::bench {

enum class HostLayout { kContiguous, kPaged, kSlabs };

// Parses "contiguous" / "paged" / "slabs"; false on anything else.
bool ParseHostLayout(const std::string& s, HostLayout* out);
const char* HostLayoutName(HostLayout l);
// Parses a byte size: digits with an optional K, M, G or T suffix (powers of 1024); 0 on error.
size_t ParseBytes(const std::string& s);

// One layer's tables of `rows` rows: offsets[r * pages_per_entry + i] is the pool offset of row
// r's page i (for contiguous, of its run).
struct HostTables {
  std::vector<size_t> offsets;
  uint32_t records_per_page = 0;
  uint32_t pages_per_entry = 0;

  // The pool offset of position p of row r.
  size_t Offset(int r, int p, uint32_t record_bytes) const {
    const uint32_t u = static_cast<uint32_t>(p);
    return offsets[static_cast<size_t>(r) * pages_per_entry + u / records_per_page] +
           static_cast<size_t>(u % records_per_page) * record_bytes;
  }
  // The table in an address space whose pool starts at `base`.
  std::vector<uint8_t*> At(uint8_t* base) const;
};

// Where pages go: the page size (paged, slabs) and the slab size (slabs: a multiple of it).
struct PageGeometry {
  size_t page_bytes = 0;
  size_t slab_bytes = 0;
};

// Lays out `rows` rows of `seq` records in a pool of pool_bytes. Returns false and says why in
// *error when the pool is too small, page_bytes is not a multiple of 16 holding >= 1 record, or
// (slabs) slab_bytes is not a whole number of pages.
bool BuildHostTables(HostLayout layout, size_t pool_bytes, PageGeometry geo, int rows, int seq, uint32_t record_bytes,
                     uint32_t seed, HostTables* out, std::string* error);

// The pool bytes `layout` needs for rows x seq records (paged: whole pages; slabs: whole slabs).
size_t HostTablesBytes(HostLayout layout, PageGeometry geo, int rows, int seq, uint32_t record_bytes);

// What hisparse-bench resolve --prewarm reads before a launch, to make part of its translations of
// host memory ahead of it: device addresses, each the start of a translation page (`page` bytes of
// address space, what the GPU caches one translation for; the pool's start where the pool begins
// inside its first page).
struct PrewarmShape {
  size_t page = size_t{64} << 10;
  double fraction = 0;  // of the distinct pages the launch's misses lie in, read in `first`
  double extra = 0;     // pages no miss lies in, per needed page, read in `first` too (a prediction's misses)
  double gap = 0;       // pages of the pool no miss lies in, per needed page, read after `first` (another launch's)
};
struct PrewarmReads {
  std::vector<long long> first, gap;
  long long needed = 0;  // distinct pages the launch's misses lie in
  long long hit = 0;     // of those, read in `first` (its first `hit` addresses)
};
// The misses are selections hits..k-1 of each of `batch` rows (pos: k a row) at seq_len `seq`, their
// records where `t` puts them in a pool of pool_bytes at device address `pool_dev`. The needed
// pages are taken in a seeded random order. The extra pages are drawn from the rows' own records (a
// prediction's wrong pages), the gap's from the whole pool (other rows' or layers'); no page is read
// twice, and each list has as many as a bounded search finds.
PrewarmReads PlanPrewarm(const HostTables& t, uintptr_t pool_dev, size_t pool_bytes, const std::vector<int32_t>& pos,
                         int batch, int k, int hits, int seq, uint32_t record_bytes, const PrewarmShape& shape,
                         uint32_t seed);

}  // namespace hisparse::bench

#endif  // HISPARSE_BENCH_HOST_TABLES_H_
