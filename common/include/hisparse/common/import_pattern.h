// The deterministic record contents of import tests and benchmarks: what `hisparse-bench import`
// writes for (seed, request, layer, position), and what the tests expect to read back. Every
// 8-byte word of a record differs, and so does every record of every layer and request.
#ifndef HISPARSE_COMMON_IMPORT_PATTERN_H_
#define HISPARSE_COMMON_IMPORT_PATTERN_H_

#include <cstdint>
#include <cstring>

namespace hisparse {

inline uint64_t ImportPatternWord(uint64_t seed, uint64_t request, uint32_t layer, uint32_t position, uint32_t word) {
  // splitmix64 of the coordinates
  uint64_t z = seed ^ (request * 0x9e3779b97f4a7c15ull) ^ (uint64_t{layer} << 48) ^ (uint64_t{position} << 16) ^ word;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Fills the record_bytes (a multiple of 8) of one record.
inline void FillImportRecord(uint8_t* dst, uint32_t record_bytes, uint64_t seed, uint64_t request, uint32_t layer,
                             uint32_t position) {
  for (uint32_t w = 0; w < record_bytes / 8; ++w) {
    const uint64_t v = ImportPatternWord(seed, request, layer, position, w);
    std::memcpy(dst + uint64_t{w} * 8, &v, 8);
  }
}

}  // namespace hisparse

#endif  // HISPARSE_COMMON_IMPORT_PATTERN_H_
