// SyntheticIndexer: a stand-in for a sparse-attention indexer (DSA / NSA / Quest) that picks k
// positions per (request, layer, step) with the locality real indexers show: the newest tokens
// (a recency window), sticky hot spots that drift slowly and sometimes jump, and a random tail.
// Deterministic for a seed. Not thread-safe.
#ifndef HISPARSE_CLIENT_DEMO_SYNTHETIC_INDEXER_H_
#define HISPARSE_CLIENT_DEMO_SYNTHETIC_INDEXER_H_

#include <algorithm>
#include <cstdint>
#include <random>
#include <unordered_set>
#include <vector>

namespace hisparse::demo {

class SyntheticIndexer {
 public:
  SyntheticIndexer(uint64_t seed, int k, int hot_spots = 6) : rng_(seed), k_(k), hot_spots_(hot_spots) {}

  // Appends k positions in [0, seq_len) (fewer when seq_len < k; the caller pads with -1).
  void Select(int32_t seq_len, std::vector<int32_t>* out) {
    const int want = std::min<int32_t>(k_, seq_len);
    if (centers_.empty()) {
      for (int i = 0; i < hot_spots_; ++i) centers_.push_back(Uniform(seq_len));
    }
    chosen_.clear();
    auto take = [&](int32_t p) {
      if (p >= 0 && p < seq_len && static_cast<int>(chosen_.size()) < want && chosen_.insert(p).second)
        out->push_back(p);
    };
    take(seq_len - 1);  // the newest token: always selected, RESOLVE maps it to its own slot
    for (int32_t i = 1; i <= want / 4; ++i) take(seq_len - 1 - i);  // recency window
    const int span = std::max(1, want / (2 * hot_spots_));
    for (int32_t& c : centers_) {
      // Drift a little every step; now and then jump to a new topic.
      if (Uniform(100) < 3) c = Uniform(seq_len);
      c = std::clamp<int32_t>(c + Uniform(9) - 4, 0, seq_len - 1);
      for (int i = 0; i < span; ++i) take(c - span / 2 + i);
    }
    while (static_cast<int>(chosen_.size()) < want) take(Uniform(seq_len));  // the random tail
  }

 private:
  int32_t Uniform(int32_t n) { return static_cast<int32_t>(rng_() % static_cast<uint64_t>(n)); }
  std::mt19937_64 rng_;
  int k_;
  int hot_spots_;
  std::vector<int32_t> centers_;
  std::unordered_set<int32_t> chosen_;
};

// The KV record of (request, layer, position): a deterministic byte pattern, so that any record
// found anywhere can be checked against what it must be.
inline void FillRecord(uint64_t request, uint32_t layer, uint32_t position, uint8_t* out, uint32_t bytes) {
  uint64_t x = (request * 0x9E3779B97F4A7C15ull) ^ (uint64_t{layer} << 40) ^ position;
  for (uint32_t i = 0; i < bytes; i += 8) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    const uint64_t v = x * 0x2545F4914F6CDD1Dull;
    for (uint32_t b = 0; b < 8 && i + b < bytes; ++b) out[i + b] = static_cast<uint8_t>(v >> (8 * b));
  }
}

}  // namespace hisparse::demo

#endif  // HISPARSE_CLIENT_DEMO_SYNTHETIC_INDEXER_H_
