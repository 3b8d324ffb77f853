// UniqueFd owns one file descriptor and closes it when destroyed. Move-only.
// MappedRegion owns one mmap()ed range and unmaps it when destroyed. Move-only.
// Neither is thread-safe; each has exactly one owner.
#ifndef HISPARSE_COMMON_UNIQUE_FD_H_
#define HISPARSE_COMMON_UNIQUE_FD_H_

#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"

namespace hisparse {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.Release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) Reset(o.Release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() { return std::exchange(fd_, -1); }
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

class MappedRegion {
 public:
  MappedRegion() = default;
  ~MappedRegion() { Reset(); }
  MappedRegion(MappedRegion&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  MappedRegion& operator=(MappedRegion&& o) noexcept;
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  // Maps `size` bytes of `fd` from `offset` (a multiple of the file's page size), shared and
  // read-write.
  static absl::StatusOr<MappedRegion> MapShared(int fd, size_t size, uint64_t offset = 0);
  // Maps this region's size of `fd` (from offset 0) in place of what the region maps, at the same
  // address (MAP_FIXED): whoever kept the address now reads the new file. A failure leaves the
  // region empty (unmapped).
  absl::Status RemapShared(int fd);

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  void Reset();

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Creates an anonymous memory file of `size` bytes (memfd_create, close-on-exec), sealed against
// shrinking, growing and further seals (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) whether or not
// it is on huge pages: whoever holds a descriptor of it can never change its size. With
// `try_hugetlb`, asks for huge pages first; `*used_hugetlb` says what was granted.
absl::StatusOr<UniqueFd> CreateMemfd(const char* name, size_t size, bool try_hugetlb, bool* used_hugetlb);

// `what: strerror(error)` as a status: RESOURCE_EXHAUSTED when the system ran out of something
// (ENOMEM, EMFILE, ENFILE, ENOSPC, EAGAIN), INTERNAL otherwise.
absl::Status ErrnoStatus(int error, absl::string_view what);

// OK when `fd` is a memfd carrying CreateMemfd's seals (shrink, grow, seal); FailedPrecondition
// saying what it lacks otherwise. A daemon takes a slab back at start only so (request_journal.h).
absl::Status CheckSizeSeals(int fd);

// Size of the file behind fd (fstat).
absl::StatusOr<size_t> FileSize(int fd);

}  // namespace hisparse

#endif  // HISPARSE_COMMON_UNIQUE_FD_H_
