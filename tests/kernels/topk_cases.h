// Score rows that exercise TOP-K's paths (topk.h), shared by the reference's test and the GPU
// test that holds the kernel equal to it: spread and crowded values (the radix search's early
// and late ends, and a bucket too large to keep), scores shaped as a serving run's indexer's,
// scores of one leading byte (pass 0 leaves the whole row in the bucket), a rising row (the
// blocks of a cluster hold unlike leading bytes), ties at the k-th score, -inf and NaN, rows
// shorter than k, rows cut by seq_lens, and a row stride that breaks 16-byte alignment.
#ifndef HISPARSE_TESTS_KERNELS_TOPK_CASES_H_
#define HISPARSE_TESTS_KERNELS_TOPK_CASES_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "hisparse/kernels/topk.h"

namespace hisparse::testing {

// One score row of `n` values of the named kind.
inline std::vector<float> TopkRow(const std::string& kind, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x(n);
  std::normal_distribution<float> normal(3.0f, 1.0f);
  std::uniform_int_distribution<int> small(0, 7);
  // bench/RESULTS.md, "How the serving scores' bytes crowd": positive, median 3.1, nine in ten
  // within [2, 8) (one leading byte), the 2,048th largest of 131,107 at 6.0-6.8 and a few hundred
  // at 8 and above (the byte above it). A log-normal of these parameters has all of that.
  std::lognormal_distribution<float> serving(1.13f, 0.337f);
  const float inf = std::numeric_limits<float>::infinity();
  for (int j = 0; j < n; ++j) {
    if (kind == "normal") {
      x[j] = normal(rng);
    } else if (kind == "serving") {  // shaped as a serving run's indexer scores (above)
      x[j] = serving(rng);
    } else if (kind == "relu") {  // an indexer's: many exact zeros, the rest positive
      x[j] = std::max(0.0f, normal(rng) - 3.5f);
    } else if (kind == "onebyte") {  // nonnegative, all of one leading byte: pass 0 keeps the whole row
      x[j] = std::min(7.99f, 2.0f + 1.5f * std::fabs(normal(rng) - 3.0f));
    } else if (kind == "ramp") {  // rising along the row: each block's share in other leading bytes
      x[j] = 0.5f + 1000.0f * static_cast<float>(j) / static_cast<float>(n) + 0.01f * normal(rng);
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
  static const std::vector<std::string> kinds = {"normal",  "serving",  "relu",   "ties", "equal", "narrow",
                                                 "onebyte", "specials", "padded", "wide", "ramp"};
  return kinds;
}

// A batch of rows for the kernel's tests, in host memory.
struct TopkBatch {
  int32_t rows = 0, cols = 0, k = 0;
  int64_t ld = 0;
  std::vector<float> scores;
  std::vector<int32_t> seq_lens;
};

// Row i is kinds[i % kinds] with its own seed; seq_lens cut some rows (and one below zero).
inline TopkBatch MakeTopkBatch(int32_t rows, int32_t cols, int64_t ld, int32_t k, uint32_t seed) {
  TopkBatch b{rows, cols, k, ld, std::vector<float>(static_cast<size_t>(rows) * ld, -1.0f), {}};
  const auto& kinds = TopkKinds();
  for (int32_t i = 0; i < rows; ++i) {
    const std::vector<float> row = TopkRow(kinds[i % kinds.size()], cols, seed + i);
    std::memcpy(&b.scores[static_cast<size_t>(i) * ld], row.data(), row.size() * sizeof(float));
    b.seq_lens.push_back(i % 5 == 3 ? cols / 2 + i : i % 7 == 6 ? -1 : cols + 3);
  }
  return b;
}

// b's descriptor over these arrays (host or device copies of b's), writing `out`.
inline TopkDesc TopkBatchDesc(const TopkBatch& b, const float* scores, const int32_t* batch_size,
                              const int32_t* seq_lens, int32_t* out) {
  TopkDesc d;
  d.scores = scores;
  d.ld = b.ld;
  d.cols = b.cols;
  d.rows = b.rows;
  d.k = b.k;
  d.batch_size = batch_size;
  d.seq_lens = seq_lens;
  d.positions = out;
  return d;
}

inline std::vector<int32_t> TopkBatchReference(const TopkBatch& b, int32_t batch_size, bool with_lens) {
  std::vector<int32_t> out(static_cast<size_t>(b.rows) * b.k);
  TopkReference(TopkBatchDesc(b, b.scores.data(), &batch_size, with_lens ? b.seq_lens.data() : nullptr, out.data()));
  return out;
}

// The shapes both kernel tests run besides the engine's: an unaligned row stride (rows start off
// 16 bytes), k past most rows, k 1, k larger than a kept bucket, and no columns at all.
struct TopkShape {
  int32_t rows, cols;
  int64_t ld;
  int32_t k;
  uint32_t seed;
  const char* what;
};
inline const std::vector<TopkShape>& TopkOddShapes() {
  static const std::vector<TopkShape> shapes = {{9, 4099, 4101, 300, 3, "ld 4101, k 300"},
                                                {9, 1000, 1001, 2048, 5, "k past the row"},
                                                {8, 40000, 40000, 1, 9, "k 1"},
                                                {8, 9000, 9000, 5000, 11, "k 5000"},
                                                {3, 0, 4, 16, 13, "no columns"}};
  return shapes;
}

}  // namespace hisparse::testing

#endif  // HISPARSE_TESTS_KERNELS_TOPK_CASES_H_
