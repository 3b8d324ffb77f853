// MemoryHeadroom: how much memory this process may take before the kernel's OOM killer (or its
// cgroup's) steps in, read once at start so that a pool larger than the machine is refused before
// a byte of it is touched, and so that the node-wide host slot-arena budget has a default taken
// from the machine rather than from a constant.
//
// What is read: MemAvailable from /proc/meminfo, and the tightest memory limit on the path from
// this process's cgroup to the root of the mounted hierarchy: cgroup v2 memory.max, else cgroup v1
// memory.limit_in_bytes (both, where a host mounts both). The paths are a seam (MemorySources) so
// that tests feed fake files.
//
// Plain data and pure functions; safe from any thread.
#ifndef HISPARSE_DAEMON_MEMORY_HEADROOM_H_
#define HISPARSE_DAEMON_MEMORY_HEADROOM_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hisparse {

// Where the numbers come from; the defaults are the running system's.
struct MemorySources {
  std::string meminfo = "/proc/meminfo";
  std::string self_cgroup = "/proc/self/cgroup";
  std::string self_status = "/proc/self/status";  // VmRSS: what this process holds already
  // Mount point of the cgroup hierarchies: v2 at ROOT (or ROOT/unified on a hybrid host), v1's
  // memory controller at ROOT/memory.
  std::string cgroup_root = "/sys/fs/cgroup";
};

struct MemoryHeadroom {
  uint64_t mem_available = 0;            // MemAvailable, bytes
  uint64_t hugetlb_free = 0;             // (HugePages_Free - HugePages_Rsvd) x Hugepagesize
  std::optional<uint64_t> cgroup_limit;  // the tightest limit found; unset: none
  std::string cgroup_limit_file;         // the file that set it
  uint64_t self_rss = 0;                 // this process's VmRSS, bytes (0 when unreadable)

  // The bytes this process may still take: MemAvailable, capped by the cgroup limit.
  uint64_t bytes() const;
  // "MemAvailable 15.2GiB, cgroup limit 8GiB (/sys/fs/cgroup/x/memory.max)"
  std::string Describe() const;
};

// Of a pool of `pool_bytes` that may take huge pages first (`may_use_hugetlb`), the bytes that
// would come from ordinary memory (hugetlb pages are reserved apart from MemAvailable and from the
// memory cgroup's limit).
uint64_t OrdinaryPoolBytes(const MemoryHeadroom& headroom, uint64_t pool_bytes, bool may_use_hugetlb);

// Reads the sources. NotFound / InvalidArgument when /proc/meminfo has no MemAvailable line (the
// cgroup part is optional: a missing or unreadable cgroup file means no limit from it).
absl::StatusOr<MemoryHeadroom> ReadMemoryHeadroom(const MemorySources& sources = {});

// OK when `need_bytes` fit the headroom; ResourceExhausted naming `what`, the need and both
// numbers otherwise.
absl::Status CheckMemoryFits(const MemoryHeadroom& headroom, uint64_t need_bytes, absl::string_view what);

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_MEMORY_HEADROOM_H_
