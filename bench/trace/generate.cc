// The synthetic selection generator (generate.h).
//
// Cost per (request, layer, step) is O(seq_len): the flicker draws, one pass to score the
// candidates and nth_element for the top k. Maintaining the scores incrementally would not lower
// that: the flicker is redrawn for (a fraction of) every position each step, and the top k of
// changed scores needs a pass anyway. A 4-layer, 4-request, 256-step, 32k-context trace with
// k = 2048 takes about 2 s of one core (writing it as .gz about 3 s more).
#include "hisparse/trace/generate.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "hisparse/common/status_macros.h"

namespace hisparse::trace {
namespace {

// xoshiro256** seeded through splitmix64: fast, and the same sequence everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& w : s_) w = SplitMix(&seed);
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  // Approximately N(0, 1): the sum of four 16-bit uniforms (Irwin-Hall), one draw each. Its tails
  // stop at +-3.46, which only matters far beyond the top-k thresholds used here (~1.5).
  float Normal() {
    const uint64_t x = Next();
    const uint32_t sum = static_cast<uint32_t>((x & 0xffff) + ((x >> 16) & 0xffff) + ((x >> 32) & 0xffff) + (x >> 48));
    constexpr float kScale = 1.0f / 37837.23f;  // 65536 * sqrt(4 / 12)
    return (static_cast<float>(sum) - 131070.0f) * kScale;
  }
  int32_t Below(int32_t n) { return static_cast<int32_t>(Uniform() * n); }  // [0, n)

  static uint64_t SplitMix(uint64_t* x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// Redraws a fraction `renew` of v[0, n): all of it at 1, else positions spaced by geometric gaps.
void Renew(std::vector<float>* v, int32_t n, double renew, Rng* rng) {
  float* d = v->data();
  if (renew >= 1.0) {
    for (int32_t p = 0; p < n; ++p) d[p] = rng->Normal();
    return;
  }
  const double log_keep = std::log1p(-renew);
  for (int64_t p = 0;;) {
    p += static_cast<int64_t>(std::log(1.0 - rng->Uniform()) / log_keep);
    if (p >= n) return;
    d[p] = rng->Normal();
    ++p;
  }
}

// A float's order as an unsigned integer, so (score, position) packs into one sortable word.
uint32_t OrderedBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// One request's latent state, grown by one position a step.
class RequestState {
 public:
  RequestState(const GeneratorOptions& o, int32_t request)
      : o_(o),
        p_(o.preset),
        layers_(o.layers),
        topic_span_(Scaled(p_.topic_span, o.k)),
        recency_window_(Scaled(p_.recency_window, o.k)) {
    uint64_t mix = o.seed ^ (0x51ed270b27c5a4e1ull * (static_cast<uint64_t>(request) + 1));
    rng_ = std::make_unique<Rng>(Rng::SplitMix(&mix));
    const size_t cap = static_cast<size_t>(o.context) + o.steps;
    static_.assign(layers_, std::vector<float>());
    own_.assign(layers_, std::vector<float>());
    for (int32_t l = 0; l < layers_; ++l) {
      static_[l].reserve(cap);
      if (Profile(l).flicker_w > 0 && Profile(l).flicker_shared < 1) own_[l].resize(cap);
    }
    for (int32_t l = 0; l < layers_; ++l) {
      if (Profile(l).flicker_w > 0 && Profile(l).flicker_shared > 0) shared_.resize(cap);
    }
    for (int32_t p = 0; p < o.context; ++p) AddPosition();
    for (int32_t i = 0; i < p_.topics; ++i) topics_.push_back(RandomSpanStart(o.context));
    for (auto& f : own_) Renew(&f, f.empty() ? 0 : o.context, 1.0, rng_.get());
    Renew(&shared_, shared_.empty() ? 0 : o.context, 1.0, rng_.get());
  }

  // Advances to `seq_len` (from step 1 on, one new token) and fills one record per layer: its
  // selection (*out) and its hints (*hints, when options.hints > 0).
  void Step(int32_t step, int32_t seq_len, std::vector<std::vector<int32_t>>* out,
            std::vector<std::vector<int32_t>>* hints) {
    if (step > 0) {
      AddPosition();
      for (int32_t& start : topics_) {
        if (rng_->Uniform() < p_.topic_jump) start = RandomSpanStart(seq_len);
      }
      Renew(&shared_, shared_.empty() ? 0 : seq_len, p_.flicker_renew, rng_.get());
      for (auto& f : own_) Renew(&f, f.empty() ? 0 : seq_len, p_.flicker_renew, rng_.get());
    }
    for (int32_t l = 0; l < layers_; ++l) Select(l, seq_len, &(*out)[l], &(*hints)[l]);
  }

 private:
  static int32_t Scaled(int32_t tokens_at_2048, int32_t k) {
    if (tokens_at_2048 == 0) return 0;
    return static_cast<int32_t>(std::max<int64_t>(1, int64_t{tokens_at_2048} * k / 2048));
  }

  const LayerProfile& Profile(int32_t l) const { return l < p_.first_layers ? p_.shallow : p_.deep; }

  int32_t RandomSpanStart(int32_t seq_len) { return rng_->Below(std::max(1, seq_len - topic_span_)); }

  void AddPosition() {
    const double c = p_.static_layer_corr, rest = std::sqrt(std::max(0.0, 1 - c * c));
    float prev = 0;
    for (int32_t l = 0; l < layers_; ++l) {
      const float z = rng_->Normal();
      prev = l == 0 ? z : static_cast<float>(c * prev + rest * z);
      static_[l].push_back(prev);
    }
  }

  // The top `want` candidates by score join the forced positions; the next o_.hints candidates by
  // the same score, best first, are the record's hints (none when every candidate is selected).
  void Select(int32_t l, int32_t seq_len, std::vector<int32_t>* sel, std::vector<int32_t>* hints) {
    const LayerProfile& prof = Profile(l);
    const int32_t k = o_.k, newest = seq_len - 1;
    sel->clear();
    hints->clear();
    if (seq_len <= k) {
      for (int32_t p = 0; p < seq_len; ++p) sel->push_back(p);
      return;
    }
    // Forced first, in priority order: the newest token, the sinks, then the recency window
    // newest first; the candidates are what lies between the sinks and the window.
    sel->push_back(newest);
    int32_t lo = 0, hi = newest;
    if (prof.sinks) {
      lo = std::min({p_.sink_tokens, hi, k - 1});
      for (int32_t p = 0; p < lo; ++p) sel->push_back(p);
    }
    if (prof.recency) {
      const int32_t w = std::min({recency_window_, hi - lo, k - static_cast<int32_t>(sel->size())});
      for (int32_t i = 0; i < w; ++i) sel->push_back(--hi);
    }
    const int32_t want = k - static_cast<int32_t>(sel->size());
    if (want >= hi - lo) {
      for (int32_t p = lo; p < hi; ++p) sel->push_back(p);
    } else if (want > 0) {
      Score(l, prof, lo, hi);
      keys_.resize(hi - lo);
      for (int32_t p = lo; p < hi; ++p) {
        keys_[p - lo] = (static_cast<uint64_t>(OrderedBits(score_[p - lo])) << 32) | static_cast<uint32_t>(p);
      }
      std::nth_element(keys_.begin(), keys_.begin() + want, keys_.end(), std::greater<>());
      for (int32_t i = 0; i < want; ++i) sel->push_back(static_cast<int32_t>(keys_[i] & 0xffffffffu));
      // The selection above is what it is without hints: nth_element leaves [0, want) alone here.
      const int32_t h = std::min<int32_t>(o_.hints, hi - lo - want);
      if (h > 0) {
        auto first = keys_.begin() + want;
        std::nth_element(first, first + h, keys_.end(), std::greater<>());
        std::sort(first, first + h, std::greater<>());
        for (auto it = first; it != first + h; ++it) hints->push_back(static_cast<int32_t>(*it & 0xffffffffu));
      }
    }
    std::sort(sel->begin(), sel->end());
  }

  // score_[p - lo] for the candidates p in [lo, hi).
  void Score(int32_t l, const LayerProfile& prof, int32_t lo, int32_t hi) {
    score_.resize(hi - lo);
    const float ws = static_cast<float>(prof.static_w);
    const float wg = static_cast<float>(prof.flicker_w * std::sqrt(prof.flicker_shared));
    const float we = static_cast<float>(prof.flicker_w * std::sqrt(1 - prof.flicker_shared));
    const float* s = static_[l].data();
    const float* g = shared_.empty() ? nullptr : shared_.data();
    const float* e = own_[l].empty() ? nullptr : own_[l].data();
    for (int32_t p = lo; p < hi; ++p) {
      float v = ws * s[p];
      if (g != nullptr && wg != 0) v += wg * g[p];
      if (e != nullptr) v += we * e[p];
      score_[p - lo] = v;
    }
    if (prof.topic_w == 0) return;
    for (int32_t start : topics_) {
      const int32_t a = std::max(start, lo), b = std::min(start + topic_span_, hi);
      for (int32_t p = a; p < b; ++p) score_[p - lo] += static_cast<float>(prof.topic_w);
    }
  }

  const GeneratorOptions& o_;
  const GeneratorPreset& p_;
  const int32_t layers_;
  const int32_t topic_span_;      // scaled to k
  const int32_t recency_window_;  // scaled to k
  std::unique_ptr<Rng> rng_;
  std::vector<std::vector<float>> static_;  // [layer][position]
  std::vector<std::vector<float>> own_;     // [layer][position] E_l; empty when unused
  std::vector<float> shared_;               // G; empty when no layer uses it
  std::vector<int32_t> topics_;             // span starts
  std::vector<float> score_;
  std::vector<uint64_t> keys_;
};

absl::Status CheckOptions(const GeneratorOptions& o) {
  if (o.hints < 0) return absl::InvalidArgumentError(absl::StrCat("hints must be >= 0 (got ", o.hints, ")"));
  if (o.requests < 1 || o.layers < 1 || o.steps < 1 || o.context < 1 || o.k < 1) {
    return absl::InvalidArgumentError(absl::StrCat("requests, layers, steps, context and k must all be >= 1 (got ",
                                                   o.requests, ", ", o.layers, ", ", o.steps, ", ", o.context, ", ",
                                                   o.k, ")"));
  }
  if (static_cast<int64_t>(o.context) + o.steps >= std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError("context + steps must stay below 2^31");
  }
  const GeneratorPreset& p = o.preset;
  if (!(p.flicker_renew > 0 && p.flicker_renew <= 1) || p.static_layer_corr < -1 || p.static_layer_corr > 1 ||
      p.topics < 0 || p.topic_span < 0 || p.sink_tokens < 0 || p.recency_window < 0) {
    return absl::InvalidArgumentError(absl::StrCat("preset '", p.name, "' is out of range"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GeneratorPreset> FindPreset(absl::string_view name) {
  GeneratorPreset p;
  p.name = std::string(name);
  p.sink_tokens = 4;
  p.recency_window = 32;
  if (name == "dsv32") {
    // Layers 0-1 select at random (fresh own noise only); the middle layers are static relevance
    // plus a flicker mostly shared between layers: the per-step change comes from the query,
    // which adjacent layers share, so they agree with each other more than with the last step.
    p.first_layers = 2;
    p.shallow = LayerProfile{0, 1, 0, 0, false, false};
    p.deep = LayerProfile{1, 0.6, 0.95, 0.8, true, true};
    p.static_layer_corr = 0.97;
    p.flicker_renew = 1;
    p.topics = 4;
    p.topic_span = 128;
    p.topic_jump = 0.05;
  } else if (name == "stress") {
    p.deep = LayerProfile{1, 1.35, 0.9, 0.5, true, true};
    p.static_layer_corr = 0.9;
    p.flicker_renew = 1;
    p.topics = 4;
    p.topic_span = 128;
    p.topic_jump = 0.1;
  } else if (name == "local") {
    p.deep = LayerProfile{1, 0.6, 0.5, 1.0, true, true};
    p.static_layer_corr = 0.8;
    p.flicker_renew = 0.3;
    p.topics = 4;
    p.topic_span = 128;
    p.topic_jump = 0.02;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown preset '", name, "' (expected ", absl::StrJoin(PresetNames(), ", "), ")"));
  }
  return p;
}

std::vector<std::string> PresetNames() { return {"dsv32", "stress", "local"}; }

TraceHeader GeneratedHeader(const GeneratorOptions& o) {
  TraceHeader h;
  h.k = o.k;
  h.layers = o.layers;
  h.hints = o.hints;
  h.extra.emplace_back("source", "synthetic");
  h.extra.emplace_back(
      "generator", absl::StrCat("hisparse-bench gen-trace --preset ", o.preset.name, " --seed ", o.seed, " --requests ",
                                o.requests, " --layers ", o.layers, " --steps ", o.steps, " --context ", o.context,
                                " --k ", o.k, o.hints > 0 ? absl::StrCat(" --hints ", o.hints) : ""));
  return h;
}

absl::Status GenerateTrace(const GeneratorOptions& o, const std::function<absl::Status(const TraceRecord&)>& emit) {
  HS_RETURN_IF_ERROR(CheckOptions(o));
  std::vector<std::unique_ptr<RequestState>> requests;
  for (int32_t r = 0; r < o.requests; ++r) requests.push_back(std::make_unique<RequestState>(o, r));
  std::vector<std::vector<int32_t>> sel(o.layers), hints(o.layers);
  TraceRecord rec;
  for (int32_t t = 0; t < o.steps; ++t) {
    const int32_t seq_len = o.context + t;
    for (int32_t r = 0; r < o.requests; ++r) {
      requests[r]->Step(t, seq_len, &sel, &hints);
      for (int32_t l = 0; l < o.layers; ++l) {
        rec.step = t;
        rec.layer = l;
        rec.request = r;
        rec.seq_len = seq_len;
        rec.positions.swap(sel[l]);
        rec.hints.swap(hints[l]);
        HS_RETURN_IF_ERROR(emit(rec));
        rec.positions.swap(sel[l]);
        rec.hints.swap(hints[l]);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace hisparse::trace
