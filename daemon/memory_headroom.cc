#include "hisparse/daemon/memory_headroom.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "hisparse/common/size_parse.h"

namespace hisparse {
namespace {

// cgroup v1 writes "no limit" as a huge page-aligned number (PAGE_COUNTER_MAX pages in bytes).
constexpr uint64_t kV1Unlimited = uint64_t{1} << 62;

std::optional<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A limit file's value: a byte count, or nullopt for "max" / unlimited / unreadable.
std::optional<uint64_t> ReadLimit(const std::string& path) {
  const auto text = ReadSmallFile(path);
  if (!text.has_value()) return std::nullopt;
  const absl::string_view v = absl::StripAsciiWhitespace(*text);
  uint64_t bytes = 0;
  if (v == "max" || !absl::SimpleAtoi(v, &bytes) || bytes >= kV1Unlimited) return std::nullopt;
  return bytes;
}

// Applies the limit file `name` of `dir` and of every ancestor of `dir` up to `mount`.
void TightestOnPath(const std::string& mount, absl::string_view cgroup_path, const std::string& name,
                    MemoryHeadroom& h) {
  std::string rel(absl::StripSuffix(cgroup_path, "/"));
  for (;;) {
    const std::string file = absl::StrCat(mount, rel, "/", name);
    if (const auto limit = ReadLimit(file); limit.has_value() && (!h.cgroup_limit || *limit < *h.cgroup_limit)) {
      h.cgroup_limit = *limit;
      h.cgroup_limit_file = file;
    }
    if (rel.empty()) return;
    rel.resize(rel.rfind('/') == std::string::npos ? 0 : rel.rfind('/'));
  }
}

}  // namespace

uint64_t MemoryHeadroom::bytes() const {
  return cgroup_limit.has_value() ? std::min(mem_available, *cgroup_limit) : mem_available;
}

std::string MemoryHeadroom::Describe() const {
  std::string s = absl::StrCat("MemAvailable ", FormatByteSize(mem_available));
  if (hugetlb_free != 0) absl::StrAppend(&s, " (and ", FormatByteSize(hugetlb_free), " of free huge pages)");
  if (cgroup_limit.has_value()) {
    absl::StrAppend(&s, ", cgroup limit ", FormatByteSize(*cgroup_limit), " (", cgroup_limit_file, ")");
  } else {
    absl::StrAppend(&s, ", no cgroup memory limit");
  }
  return s;
}

absl::StatusOr<MemoryHeadroom> ReadMemoryHeadroom(const MemorySources& sources) {
  MemoryHeadroom h;
  const auto meminfo = ReadSmallFile(sources.meminfo);
  if (!meminfo.has_value()) return absl::NotFoundError(absl::StrCat("cannot read ", sources.meminfo));
  std::optional<uint64_t> available, huge_free, huge_page;
  uint64_t huge_reserved = 0;  // free pages promised to mappings already
  for (absl::string_view line : absl::StrSplit(*meminfo, '\n')) {
    const std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 2) continue;
    uint64_t value = 0;
    const bool kib = f.size() == 3 && f[2] == "kB";
    if (!absl::SimpleAtoi(f[1], &value) || (f.size() == 3 && !kib)) continue;
    if (f[0] == "MemAvailable:") available = value * (kib ? 1024 : 1);
    if (f[0] == "HugePages_Free:") huge_free = value;
    if (f[0] == "HugePages_Rsvd:") huge_reserved = value;
    if (f[0] == "Hugepagesize:") huge_page = value * (kib ? 1024 : 1);
  }
  if (!available.has_value()) {
    return absl::NotFoundError(absl::StrCat(sources.meminfo, " has no readable MemAvailable line"));
  }
  h.mem_available = *available;
  if (huge_free.has_value() && huge_page.has_value()) {
    h.hugetlb_free = (*huge_free - std::min(*huge_free, huge_reserved)) * *huge_page;
  }

  if (const auto status = ReadSmallFile(sources.self_status); status.has_value()) {
    for (absl::string_view line : absl::StrSplit(*status, '\n')) {
      uint64_t kib = 0;
      if (absl::ConsumePrefix(&line, "VmRSS:") && absl::ConsumeSuffix(&line, "kB") &&
          absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib)) {
        h.self_rss = kib * 1024;
      }
    }
  }

  // Lines are "hierarchy-id:controllers:path"; v2's is "0::path", v1's memory one names "memory".
  const auto cgroups = ReadSmallFile(sources.self_cgroup);
  if (!cgroups.has_value()) return h;
  for (absl::string_view line : absl::StrSplit(*cgroups, '\n', absl::SkipEmpty())) {
    const std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    if (f[0] == "0" && f[1].empty()) {
      TightestOnPath(sources.cgroup_root, f[2], "memory.max", h);
      TightestOnPath(sources.cgroup_root + "/unified", f[2], "memory.max", h);
    }
    const std::vector<absl::string_view> controllers = absl::StrSplit(f[1], ',');
    if (std::find(controllers.begin(), controllers.end(), "memory") != controllers.end()) {
      TightestOnPath(sources.cgroup_root + "/memory", f[2], "memory.limit_in_bytes", h);
    }
  }
  return h;
}

uint64_t OrdinaryPoolBytes(const MemoryHeadroom& headroom, uint64_t pool_bytes, bool may_use_hugetlb) {
  return may_use_hugetlb ? pool_bytes - std::min(pool_bytes, headroom.hugetlb_free) : pool_bytes;
}

absl::Status CheckMemoryFits(const MemoryHeadroom& headroom, uint64_t need_bytes, absl::string_view what) {
  if (need_bytes <= headroom.bytes()) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      what, " needs ", FormatByteSize(need_bytes), " (", need_bytes, " bytes) but this process may take only ",
      FormatByteSize(headroom.bytes()), " (", headroom.bytes(), " bytes): ", headroom.Describe()));
}

}  // namespace hisparse
