// Score rows that exercise TOP-K's paths (topk.h), shared by the reference's test and the GPU
// test that holds the kernel equal to it: spread and crowded values (the radix search's early
// and late ends, and a bucket too large to keep), ties at the k-th score, -inf and NaN, rows
// shorter than k, rows cut by seq_lens, and a row stride that breaks 16-byte alignment.
#ifndef HISPARSE_TESTS_KERNELS_TOPK_CASES_H_
#define HISPARSE_TESTS_KERNELS_TOPK_CASES_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace hisparse::testing {

// One score row of `n` values of the named kind.
inline std::vector<float> TopkRow(const std::string& kind, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x(n);
  std::normal_distribution<float> normal(3.0f, 1.0f);
  std::uniform_int_distribution<int> small(0, 7);
  const float inf = std::numeric_limits<float>::infinity();
  for (int j = 0; j < n; ++j) {
    if (kind == "normal") {
      x[j] = normal(rng);
    } else if (kind == "relu") {  // an indexer's: many exact zeros, the rest positive
      x[j] = std::max(0.0f, normal(rng) - 3.5f);
    } else if (kind == "ties") {  // eight values: a bucket of ties far larger than what is kept
      x[j] = static_cast<float>(small(rng));
    } else if (kind == "equal") {
      x[j] = 1.5f;
    } else if (kind == "narrow") {  // one octave, close together: the search runs all four bytes
      x[j] = 1.0f + static_cast<float>(rng() % 4096) * 1e-6f;
    } else if (kind == "specials") {  // -inf, NaN, +inf, -0, +0 and negatives among ordinary scores
      const int r = static_cast<int>(rng() % 10);
      x[j] = r == 0   ? -inf
             : r == 1 ? std::numeric_limits<float>::quiet_NaN()
             : r == 2 ? -std::numeric_limits<float>::quiet_NaN()
             : r == 3 ? (rng() % 50 == 0 ? inf : -0.0f)
             : r == 4 ? 0.0f
                      : normal(rng) - 3.0f;
    } else if (kind == "padded") {  // an indexer's row past its length: -inf
      x[j] = j < n / 3 ? normal(rng) : -inf;
    } else {  // "wide": magnitudes across the whole float range
      x[j] = std::ldexp(normal(rng), static_cast<int>(rng() % 200) - 100);
    }
  }
  return x;
}

inline const std::vector<std::string>& TopkKinds() {
  static const std::vector<std::string> kinds = {"normal", "relu",     "ties",   "equal",
                                                 "narrow", "specials", "padded", "wide"};
  return kinds;
}

}  // namespace hisparse::testing

#endif  // HISPARSE_TESTS_KERNELS_TOPK_CASES_H_
