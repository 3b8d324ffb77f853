// The CPU reference of TOP-K (topk.h): the oracle the CUDA kernel is held equal to, and what the
// host backend runs. Written for obviousness: sort a row's selectable (key, position) pairs.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "hisparse/kernels/topk.h"

namespace hisparse {

std::string CheckTopkDesc(const TopkDesc& d) {
  if (d.scores == nullptr || d.positions == nullptr) return "scores and positions must not be null";
  if (reinterpret_cast<uintptr_t>(d.scores) % alignof(float) != 0) return "scores must be 4-byte aligned";
  if (d.k < 1) return "k must be at least 1";
  if (d.cols < 0 || d.rows < 0) return "cols and rows must not be negative";
  if (d.cols > kTopkMaxCols) return "cols must be at most 2^30";
  if (d.ld < d.cols) return "ld must be at least cols";
  if (d.rows > 0 && d.ld > std::numeric_limits<int64_t>::max() / d.rows) return "rows * ld overflows";
  if (d.after_target < 0) return "after_target must not be negative";
  return "";
}

void TopkReference(const TopkDesc& d) {
  const int32_t active = d.batch_size ? std::max(0, std::min(*d.batch_size, d.rows)) : d.rows;
  std::vector<std::pair<uint32_t, int32_t>> sel;
  for (int32_t i = 0; i < d.rows; ++i) {
    int32_t* out = d.positions + static_cast<int64_t>(i) * d.k;
    std::fill(out, out + d.k, -1);
    if (i >= active) continue;
    const int32_t n = d.seq_lens ? std::max(0, std::min(d.seq_lens[i], d.cols)) : d.cols;
    const float* x = d.scores + static_cast<int64_t>(i) * d.ld;
    sel.clear();
    for (int32_t j = 0; j < n; ++j) {
      uint32_t bits;
      std::memcpy(&bits, &x[j], sizeof bits);
      const uint32_t key = TopkKey(bits);
      if (TopkSelectable(key)) sel.emplace_back(key, j);
    }
    if (static_cast<int64_t>(sel.size()) > d.k) {
      // Larger key first; among equal keys the lower position (rule 4).
      std::nth_element(sel.begin(), sel.begin() + d.k, sel.end(), [](const auto& a, const auto& b) {
        return a.first != b.first ? a.first > b.first : a.second < b.second;
      });
      sel.resize(d.k);
    }
    std::sort(sel.begin(), sel.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    for (size_t j = 0; j < sel.size(); ++j) out[j] = sel[j].second;
  }
}

}  // namespace hisparse
