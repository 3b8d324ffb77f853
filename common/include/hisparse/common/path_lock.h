// PathLock: an exclusive advisory lock (flock) on a lock file, held for the owner's lifetime, so
// that at most one process serves a given socket path. The lock file records the holder's pid for
// the message a second process gets. The kernel drops the lock when the holder dies, however it
// dies, so a lock file left behind by a killed daemon never blocks a restart.
//
// The file is removed by the holder when the PathLock is destroyed, while still holding the lock;
// a process that opened the old file in that moment notices (the path no longer names the inode it
// locked) and tries again, so two holders can never coexist.
//
// Move-only, one owner; not thread-safe (it has no state to share).
#ifndef HISPARSE_COMMON_PATH_LOCK_H_
#define HISPARSE_COMMON_PATH_LOCK_H_

#include <string>

#include "absl/status/statusor.h"
#include "hisparse/common/unique_fd.h"

namespace hisparse {

class PathLock {
 public:
  // Creates (mode 0644) or opens `lock_path` and takes the lock without waiting. FailedPrecondition
  // naming the holder's pid when another live process holds it; other errors as the syscalls say.
  static absl::StatusOr<PathLock> Acquire(const std::string& lock_path);

  PathLock() = default;
  PathLock(PathLock&&) noexcept = default;
  PathLock& operator=(PathLock&& o) noexcept;
  PathLock(const PathLock&) = delete;
  PathLock& operator=(const PathLock&) = delete;
  ~PathLock();

  bool held() const { return fd_.valid(); }
  const std::string& path() const { return path_; }

 private:
  void Release();
  std::string path_;
  UniqueFd fd_;
};

}  // namespace hisparse

#endif  // HISPARSE_COMMON_PATH_LOCK_H_
