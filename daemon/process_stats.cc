#include "hisparse/daemon/process_stats.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace hisparse {
namespace {

absl::StatusOr<std::string> ReadFile(const char* path) {
  std::ifstream in(path);
  if (!in) return absl::UnavailableError(absl::StrCat("cannot read ", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

absl::StatusOr<ProcessStats> ParseProcessStats(absl::string_view pid_stat, absl::string_view proc_stat,
                                               long ticks_per_second, long page_bytes) {
  if (ticks_per_second <= 0 || page_bytes <= 0) return absl::InvalidArgumentError("bad clock tick or page size");
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so fields start after the
  // last ')'. Counting from state as field 3 (proc(5)): utime 14, stime 15, starttime 22, vsize 23,
  // rss 24 (pages).
  const size_t close = pid_stat.rfind(')');
  if (close == absl::string_view::npos) return absl::InvalidArgumentError("/proc/self/stat: no ')' after comm");
  const std::vector<absl::string_view> f = absl::StrSplit(pid_stat.substr(close + 1), ' ', absl::SkipWhitespace());
  constexpr size_t kFirst = 3;  // f[0] is field 3
  if (f.size() < 24 - kFirst + 1) return absl::InvalidArgumentError("/proc/self/stat: too few fields");
  uint64_t utime = 0, stime = 0, start_ticks = 0, vsize = 0;
  int64_t rss_pages = 0;
  if (!absl::SimpleAtoi(f[14 - kFirst], &utime) || !absl::SimpleAtoi(f[15 - kFirst], &stime) ||
      !absl::SimpleAtoi(f[22 - kFirst], &start_ticks) || !absl::SimpleAtoi(f[23 - kFirst], &vsize) ||
      !absl::SimpleAtoi(f[24 - kFirst], &rss_pages)) {
    return absl::InvalidArgumentError("/proc/self/stat: a field is not a number");
  }
  uint64_t btime = 0;
  bool have_btime = false;
  for (absl::string_view line : absl::StrSplit(proc_stat, '\n')) {
    if (absl::ConsumePrefix(&line, "btime ")) have_btime = absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &btime);
  }
  if (!have_btime) return absl::InvalidArgumentError("/proc/stat: no btime line");
  ProcessStats s;
  s.cpu_seconds = static_cast<double>(utime + stime) / ticks_per_second;
  s.start_time_seconds = static_cast<double>(btime) + static_cast<double>(start_ticks) / ticks_per_second;
  s.virtual_bytes = vsize;
  s.resident_bytes = rss_pages > 0 ? static_cast<uint64_t>(rss_pages) * static_cast<uint64_t>(page_bytes) : 0;
  return s;
}

absl::StatusOr<ProcessStats> ReadProcessStats() {
  absl::StatusOr<std::string> pid_stat = ReadFile("/proc/self/stat");
  if (!pid_stat.ok()) return pid_stat.status();
  absl::StatusOr<std::string> proc_stat = ReadFile("/proc/stat");
  if (!proc_stat.ok()) return proc_stat.status();
  absl::StatusOr<ProcessStats> s =
      ParseProcessStats(*pid_stat, *proc_stat, ::sysconf(_SC_CLK_TCK), ::sysconf(_SC_PAGESIZE));
  if (!s.ok()) return s.status();
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return absl::UnavailableError("cannot list /proc/self/fd");
  uint64_t entries = 0;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] != '.') ++entries;
  }
  ::closedir(dir);
  s->open_fds = entries > 0 ? entries - 1 : 0;  // less the descriptor opendir held while listing
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0) s->max_fds = r.rlim_cur;
  return s;
}

}  // namespace hisparse
