#include "hisparse/common/path_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace hisparse {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// The pid the holder wrote, as text ("" when unreadable).
std::string ReadHolder(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return "";
  return std::string(absl::StripAsciiWhitespace(absl::string_view(buf, static_cast<size_t>(n))));
}

}  // namespace

absl::StatusOr<PathLock> PathLock::Acquire(const std::string& lock_path) {
  // A few rounds at most: each retry means a holder removed the file between our open and flock.
  for (int attempt = 0; attempt < 16; ++attempt) {
    UniqueFd fd(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!fd.valid()) return Errno("cannot open lock file", lock_path);
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK) return Errno("flock", lock_path);
      const std::string holder = ReadHolder(fd.get());
      return absl::FailedPreconditionError(
          absl::StrCat("another hisparsed (pid ", holder.empty() ? "unknown" : holder, ") holds ", lock_path,
                       " and serves this socket; stop it first or choose another listen path"));
    }
    struct stat locked {};
    struct stat named {};
    if (::fstat(fd.get(), &locked) != 0) return Errno("fstat", lock_path);
    if (::stat(lock_path.c_str(), &named) != 0 || named.st_ino != locked.st_ino || named.st_dev != locked.st_dev) {
      continue;  // the previous holder removed the file we locked: lock the one the path names now
    }
    const std::string pid = absl::StrCat(::getpid(), "\n");
    if (::ftruncate(fd.get(), 0) != 0 ||
        ::pwrite(fd.get(), pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
      return Errno("cannot record the pid in", lock_path);
    }
    PathLock lock;
    lock.path_ = lock_path;
    lock.fd_ = std::move(fd);
    return lock;
  }
  return absl::UnavailableError(
      absl::StrCat("lock file ", lock_path, " keeps being replaced; is a daemon restarting?"));
}

PathLock& PathLock::operator=(PathLock&& o) noexcept {
  if (this != &o) {
    Release();
    path_ = std::move(o.path_);
    fd_ = std::move(o.fd_);
  }
  return *this;
}

PathLock::~PathLock() { Release(); }

void PathLock::Release() {
  if (!fd_.valid()) return;
  // Unlink while holding the lock, then let go: see the header.
  ::unlink(path_.c_str());
  fd_.Reset();
}

}  // namespace hisparse
