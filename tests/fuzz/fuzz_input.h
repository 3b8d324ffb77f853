// FuzzInput: reads typed values off a fuzzer's byte string, front to back; once the bytes run out
// every read returns zero. A small stand-in for libFuzzer's FuzzedDataProvider, which ships with
// clang only: the corpus replay tests build these targets with gcc too.
//
// Borrows the bytes (they must outlive the reader). Not thread-safe.
#ifndef HISPARSE_TESTS_FUZZ_FUZZ_INPUT_H_
#define HISPARSE_TESTS_FUZZ_FUZZ_INPUT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace hisparse::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }

  // The next byte, not consumed (0 once the bytes run out).
  uint8_t Peek() const { return pos_ < size_ ? data_[pos_] : 0; }

  template <typename T>
  T Read() {
    T value{};
    const size_t n = std::min(sizeof(T), size_ - pos_);
    if (n > 0) std::memcpy(&value, data_ + pos_, n);
    pos_ += n;
    return value;
  }

  // A value in [lo, hi] (inclusive), from one byte: fuzzers mutate bytes, so small ranges stay
  // one byte wide and mutations move between interesting neighbours.
  uint32_t Small(uint32_t lo, uint32_t hi) { return lo + Read<uint8_t>() % (hi - lo + 1); }

  // Either a small value in [lo, hi] or, when the selector byte says so, a full 32-bit value: the
  // handlers must reject out-of-range values as cleanly as they accept in-range ones.
  uint32_t SmallOrRaw(uint32_t lo, uint32_t hi) {
    return (Read<uint8_t>() & 7) == 0 ? Read<uint32_t>() : Small(lo, hi);
  }

  // A string of up to `max` bytes, length-prefixed by one byte.
  std::string String(size_t max) {
    const size_t len = std::min<size_t>({Read<uint8_t>(), max, size_ - std::min(pos_, size_)});
    std::string out(reinterpret_cast<const char*>(data_ + std::min(pos_, size_)), len);
    pos_ += len;
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace hisparse::fuzz

#endif  // HISPARSE_TESTS_FUZZ_FUZZ_INPUT_H_
