#include "hisparse/common/unique_fd.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace hisparse {

absl::Status ErrnoStatus(int error, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(error));
  switch (error) {
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case ENOSPC:
    case EAGAIN:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

MappedRegion& MappedRegion::operator=(MappedRegion&& o) noexcept {
  if (this != &o) {
    Reset();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

void MappedRegion::Reset() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

absl::StatusOr<MappedRegion> MappedRegion::MapShared(int fd, size_t size, uint64_t offset) {
  if (size == 0) return absl::InvalidArgumentError("cannot map 0 bytes");
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) {
    return ErrnoStatus(errno, absl::StrCat("mmap of ", size, " bytes at offset ", offset, " failed"));
  }
  MappedRegion r;
  r.data_ = static_cast<uint8_t*>(p);
  r.size_ = size;
  return r;
}

absl::Status MappedRegion::RemapShared(int fd) {
  if (data_ == nullptr) return absl::FailedPreconditionError("remap of an empty region");
  void* p = ::mmap(data_, size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    Reset();  // what MAP_FIXED left of the old mapping goes too
    return ErrnoStatus(err, absl::StrCat("mmap of ", size_, " bytes in place failed"));
  }
  return absl::OkStatus();
}

namespace {

// The size is the contract with every process that maps the memfd: with shrinking forbidden no
// page the daemon maps can vanish under it (a tenant's ftruncate would turn the daemon's next copy
// into SIGBUS), and growing is forbidden so that a tenant cannot make the node hold more than it
// was given. F_SEAL_SEAL keeps anyone from adding (or later lifting) seals, so no holder can add
// F_SEAL_WRITE and fault the daemon's writes either. Writes stay allowed: both sides write.
// hugetlbfs supports these seals since Linux 4.16.
constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

absl::Status SealSize(int fd, const char* name) {
  if (::fcntl(fd, F_ADD_SEALS, kSizeSeals) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot seal memfd ", name, " against resizing: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckSizeSeals(int fd) {
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) return absl::FailedPreconditionError(absl::StrCat("not a sealable memfd: ", std::strerror(errno)));
  if ((seals & kSizeSeals) != kSizeSeals) {
    return absl::FailedPreconditionError(
        absl::StrCat("a memfd without the size seals (seals 0x", absl::Hex(seals), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> CreateMemfd(const char* name, size_t size, bool try_hugetlb, bool* used_hugetlb) {
  if (used_hugetlb != nullptr) *used_hugetlb = false;
  if (try_hugetlb) {
    // Huge pages must be reserved by the host (vm.nr_hugepages); the size must be a multiple of
    // the huge page size. Any failure (a kernel too old to seal hugetlb memfds included) falls
    // back to ordinary pages.
    constexpr size_t kHuge = 2u << 20;
    if (size % kHuge == 0) {
      UniqueFd fd(::memfd_create(name, MFD_CLOEXEC | MFD_HUGETLB | MFD_ALLOW_SEALING));
      if (fd.valid() && ::ftruncate(fd.get(), static_cast<off_t>(size)) == 0 && SealSize(fd.get(), name).ok()) {
        // Reserve the pages now: a hugetlb mapping that cannot be backed fails here, not later.
        void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
        if (p != MAP_FAILED) {
          ::munmap(p, size);
          if (used_hugetlb != nullptr) *used_hugetlb = true;
          return fd;
        }
      }
    }
  }
  UniqueFd fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) {
    return ErrnoStatus(errno, absl::StrCat("memfd_create(", name, ") failed"));
  }
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("ftruncate of memfd ", name, " to ", size, " bytes failed: ", std::strerror(errno)));
  }
  if (absl::Status st = SealSize(fd.get(), name); !st.ok()) return st;
  return fd;
}

absl::StatusOr<size_t> FileSize(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return absl::InternalError(absl::StrCat("fstat failed: ", std::strerror(errno)));
  return static_cast<size_t>(st.st_size);
}

}  // namespace hisparse
