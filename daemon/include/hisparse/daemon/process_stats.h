// ProcessStats: what the standard process_* metrics report of hisparsed itself (open and maximum
// descriptors, resident and virtual memory, CPU time, start time), read from procfs at scrape time.
//
// prometheus-cpp has no process collector, so the daemon reads them itself, with the names and
// meanings of Prometheus' client libraries (Go, Python), so that stock alerts and dashboards work.
// ParseProcessStats is pure (it takes the files' text); ReadProcessStats reads /proc. Thread-safe.
#ifndef HISPARSE_DAEMON_PROCESS_STATS_H_
#define HISPARSE_DAEMON_PROCESS_STATS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hisparse {

struct ProcessStats {
  double cpu_seconds = 0;         // user + system CPU time
  double start_time_seconds = 0;  // since the Unix epoch
  uint64_t resident_bytes = 0;    // RSS
  uint64_t virtual_bytes = 0;     // address space
  uint64_t open_fds = 0;          // entries of /proc/self/fd
  uint64_t max_fds = 0;           // RLIMIT_NOFILE, soft
};

// Fills cpu_seconds, start_time_seconds, resident_bytes and virtual_bytes from the text of
// /proc/<pid>/stat and of /proc/stat (its btime line), with the clock tick and page size given.
absl::StatusOr<ProcessStats> ParseProcessStats(absl::string_view pid_stat, absl::string_view proc_stat,
                                               long ticks_per_second, long page_bytes);

// This process's stats: /proc/self/stat, /proc/stat, /proc/self/fd and getrlimit.
absl::StatusOr<ProcessStats> ReadProcessStats();

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_PROCESS_STATS_H_
