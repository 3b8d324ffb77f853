// See host_tables.h.
#include "host_tables.h"

#include <algorithm>
#include <cctype>
#include <random>
#include <utility>

#include "hisparse/kernels/arena_layout.h"

namespace hisparse::bench {

bool ParseHostLayout(const std::string& s, HostLayout* out) {
  if (s == "contiguous") {
    *out = HostLayout::kContiguous;
  } else if (s == "paged") {
    *out = HostLayout::kPaged;
  } else {
    return false;
  }
  return true;
}

const char* HostLayoutName(HostLayout l) { return l == HostLayout::kContiguous ? "contiguous" : "paged"; }

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

size_t HostTablesBytes(HostLayout layout, size_t page_bytes, int rows, int seq, uint32_t record_bytes) {
  if (layout == HostLayout::kContiguous) return static_cast<size_t>(rows) * seq * record_bytes;
  const size_t r = page_bytes / record_bytes;
  if (r == 0) return 0;
  return static_cast<size_t>(rows) * ((seq + r - 1) / r) * page_bytes;
}

bool BuildHostTables(HostLayout layout, size_t pool_bytes, size_t page_bytes, int rows, int seq, uint32_t record_bytes,
                     uint32_t seed, HostTables* out, std::string* error) {
  const size_t need = HostTablesBytes(layout, page_bytes, rows, seq, record_bytes);
  if (layout == HostLayout::kPaged && (page_bytes % 16 != 0 || page_bytes < record_bytes)) {
    *error = "--page-size must be a multiple of 16 holding at least one record";
    return false;
  }
  if (need == 0 || need > pool_bytes) {
    *error = "the pool (" + std::to_string(pool_bytes) + " bytes) cannot hold " + std::to_string(rows) + " rows of " +
             std::to_string(seq) + " records in the " + HostLayoutName(layout) + " layout (" + std::to_string(need) +
             " bytes): raise --pool";
    return false;
  }
  HostTables t;
  if (layout == HostLayout::kContiguous) {
    t.records_per_page = kContiguousRecordsPerPage;
    t.pages_per_entry = 1;
    for (int r = 0; r < rows; ++r) t.offsets.push_back(static_cast<size_t>(r) * seq * record_bytes);
  } else {
    t.records_per_page = static_cast<uint32_t>(page_bytes / record_bytes);
    t.pages_per_entry = static_cast<uint32_t>((seq + t.records_per_page - 1) / t.records_per_page);
    const size_t pages = static_cast<size_t>(rows) * t.pages_per_entry;
    // Distinct random frames: a partial Fisher-Yates shuffle over every frame of the pool.
    std::vector<uint32_t> frames(pool_bytes / page_bytes);
    for (size_t f = 0; f < frames.size(); ++f) frames[f] = static_cast<uint32_t>(f);
    std::mt19937_64 rng(seed);
    for (size_t i = 0; i < pages; ++i) {
      std::uniform_int_distribution<size_t> pick(i, frames.size() - 1);
      std::swap(frames[i], frames[pick(rng)]);
      t.offsets.push_back(static_cast<size_t>(frames[i]) * page_bytes);
    }
  }
  *out = std::move(t);
  return true;
}

}  // namespace hisparse::bench
