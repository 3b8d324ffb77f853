// See host_tables.h.
#include "host_tables.h"

#include <algorithm>
#include <cctype>
#include <random>
#include <unordered_set>
#include <utility>

#include "hisparse/kernels/arena_layout.h"

namespace hisparse::bench {

bool ParseHostLayout(const std::string& s, HostLayout* out) {
  if (s == "contiguous") {
    *out = HostLayout::kContiguous;
  } else if (s == "paged") {
    *out = HostLayout::kPaged;
  } else if (s == "slabs") {
    *out = HostLayout::kSlabs;
  } else {
    return false;
  }
  return true;
}

const char* HostLayoutName(HostLayout l) {
  switch (l) {
    case HostLayout::kContiguous:
      return "contiguous";
    case HostLayout::kPaged:
      return "paged";
    case HostLayout::kSlabs:
      return "slabs";
  }
  return "?";
}

size_t ParseBytes(const std::string& s) {
  size_t i = 0, v = 0;
  for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) v = v * 10 + (s[i] - '0');
  if (i == 0) return 0;
  if (i == s.size()) return v;
  if (i + 1 != s.size()) return 0;
  switch (std::toupper(static_cast<unsigned char>(s[i]))) {
    case 'K':
      return v << 10;
    case 'M':
      return v << 20;
    case 'G':
      return v << 30;
    case 'T':
      return v << 40;
    default:
      return 0;
  }
}

std::vector<uint8_t*> HostTables::At(uint8_t* base) const {
  std::vector<uint8_t*> t(offsets.size());
  for (size_t i = 0; i < offsets.size(); ++i) t[i] = base + offsets[i];
  return t;
}

namespace {

size_t PagesPerRow(PageGeometry geo, int seq, uint32_t record_bytes) {
  const size_t r = geo.page_bytes / record_bytes;
  return r == 0 ? 0 : (seq + r - 1) / r;
}

// Distinct random frames of [0, frames): a partial Fisher-Yates shuffle, the first `count`.
std::vector<uint32_t> PickFrames(size_t frames, size_t count, std::mt19937_64& rng) {
  std::vector<uint32_t> f(frames);
  for (size_t i = 0; i < frames; ++i) f[i] = static_cast<uint32_t>(i);
  for (size_t i = 0; i < count; ++i) {
    std::uniform_int_distribution<size_t> pick(i, frames - 1);
    std::swap(f[i], f[pick(rng)]);
  }
  f.resize(count);
  return f;
}

}  // namespace

size_t HostTablesBytes(HostLayout layout, PageGeometry geo, int rows, int seq, uint32_t record_bytes) {
  if (layout == HostLayout::kContiguous) return static_cast<size_t>(rows) * seq * record_bytes;
  const size_t pages = PagesPerRow(geo, seq, record_bytes);
  if (pages == 0) return 0;
  if (layout == HostLayout::kPaged) return static_cast<size_t>(rows) * pages * geo.page_bytes;
  const size_t slab_pages = geo.slab_bytes / geo.page_bytes;
  if (slab_pages == 0) return 0;
  return static_cast<size_t>(rows) * ((pages + slab_pages - 1) / slab_pages) * geo.slab_bytes;
}

bool BuildHostTables(HostLayout layout, size_t pool_bytes, PageGeometry geo, int rows, int seq, uint32_t record_bytes,
                     uint32_t seed, HostTables* out, std::string* error) {
  if (layout != HostLayout::kContiguous && (geo.page_bytes % 16 != 0 || geo.page_bytes < record_bytes)) {
    *error = "--page-size must be a multiple of 16 holding at least one record";
    return false;
  }
  if (layout == HostLayout::kSlabs && (geo.slab_bytes < geo.page_bytes || geo.slab_bytes % geo.page_bytes != 0)) {
    *error = "--slab-size must be a whole number of pages (--page-size)";
    return false;
  }
  const size_t need = HostTablesBytes(layout, geo, rows, seq, record_bytes);
  if (need == 0 || need > pool_bytes) {
    *error = "the pool (" + std::to_string(pool_bytes) + " bytes) cannot hold " + std::to_string(rows) + " rows of " +
             std::to_string(seq) + " records in the " + HostLayoutName(layout) + " layout (" + std::to_string(need) +
             " bytes): raise --pool";
    return false;
  }
  HostTables t;
  std::mt19937_64 rng(seed);
  if (layout == HostLayout::kContiguous) {
    t.records_per_page = kContiguousRecordsPerPage;
    t.pages_per_entry = 1;
    for (int r = 0; r < rows; ++r) t.offsets.push_back(static_cast<size_t>(r) * seq * record_bytes);
  } else if (layout == HostLayout::kPaged) {
    t.records_per_page = static_cast<uint32_t>(geo.page_bytes / record_bytes);
    t.pages_per_entry = static_cast<uint32_t>(PagesPerRow(geo, seq, record_bytes));
    const size_t pages = static_cast<size_t>(rows) * t.pages_per_entry;
    for (uint32_t f : PickFrames(pool_bytes / geo.page_bytes, pages, rng)) {
      t.offsets.push_back(static_cast<size_t>(f) * geo.page_bytes);
    }
  } else {
    t.records_per_page = static_cast<uint32_t>(geo.page_bytes / record_bytes);
    t.pages_per_entry = static_cast<uint32_t>(PagesPerRow(geo, seq, record_bytes));
    const size_t slab_pages = geo.slab_bytes / geo.page_bytes;
    const size_t slabs_per_row = (t.pages_per_entry + slab_pages - 1) / slab_pages;
    const std::vector<uint32_t> slabs = PickFrames(pool_bytes / geo.slab_bytes, rows * slabs_per_row, rng);
    for (int r = 0; r < rows; ++r) {
      // The row's page frames: its slabs' pages in random order, the first pages_per_entry used.
      std::vector<size_t> frames;
      for (size_t s = 0; s < slabs_per_row; ++s) {
        const size_t base = static_cast<size_t>(slabs[r * slabs_per_row + s]) * geo.slab_bytes;
        for (size_t i = 0; i < slab_pages; ++i) frames.push_back(base + i * geo.page_bytes);
      }
      std::shuffle(frames.begin(), frames.end(), rng);
      t.offsets.insert(t.offsets.end(), frames.begin(), frames.begin() + t.pages_per_entry);
    }
  }
  *out = std::move(t);
  return true;
}

PrewarmReads PlanPrewarm(const HostTables& t, uintptr_t pool_dev, size_t pool_bytes, const std::vector<int32_t>& pos,
                         int batch, int k, int hits, int seq, uint32_t record_bytes, const PrewarmShape& shape,
                         uint32_t seed) {
  const long long tp = static_cast<long long>(shape.page);
  const long long base = static_cast<long long>(pool_dev);
  const auto page_of = [&](int r, int p) { return (base + static_cast<long long>(t.Offset(r, p, record_bytes))) / tp; };
  const auto start = [&](long long pg) { return std::max(pg * tp, base); };
  std::unordered_set<long long> needed;
  std::vector<long long> order;  // the needed pages in first-seen order, then shuffled
  for (int r = 0; r < batch; ++r) {
    for (int j = hits; j < k; ++j) {
      const long long pg = page_of(r, pos[static_cast<size_t>(r) * k + j]);
      if (needed.insert(pg).second) order.push_back(pg);
    }
  }
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  PrewarmReads out;
  out.needed = static_cast<long long>(order.size());
  out.hit = std::min(out.needed, std::llround(shape.fraction * static_cast<double>(out.needed)));
  for (long long i = 0; i < out.hit; ++i) out.first.push_back(start(order[i]));
  std::unordered_set<long long> used;
  std::uniform_int_distribution<int> any_row(0, batch - 1), any_pos(0, seq - 1);
  std::uniform_int_distribution<long long> any_page(base / tp, (base + static_cast<long long>(pool_bytes) - 1) / tp);
  // `want` pages that no miss lies in, each once, from `page` (or as many as a bounded search finds).
  const auto draw = [&](long long want, auto page, std::vector<long long>* into) {
    for (long long tries = 0; want > 0 && tries < 64 * (want + 16); ++tries) {
      const long long pg = page();
      if (needed.count(pg) == 0 && used.insert(pg).second) {
        into->push_back(start(pg));
        --want;
      }
    }
  };
  draw(
      std::llround(shape.extra * static_cast<double>(out.needed)), [&] { return page_of(any_row(rng), any_pos(rng)); },
      &out.first);
  draw(
      std::llround(shape.gap * static_cast<double>(out.needed)), [&] { return any_page(rng); }, &out.gap);
  return out;
}

}  // namespace hisparse::bench
