// Locality statistics and the study of one trace (locality.h).
#include "hisparse/trace/locality.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "hisparse/common/status_macros.h"

namespace hisparse::trace {
namespace {

size_t IntersectionSize(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  for (auto i = a.begin(), j = b.begin(); i != a.end() && j != b.end();) {
    if (*i < *j) {
      ++i;
    } else if (*j < *i) {
      ++j;
    } else {
      ++n, ++i, ++j;
    }
  }
  return n;
}

int Log2Floor(uint64_t d) { return 63 - __builtin_clzll(d); }  // d >= 1

double MeanOfMeans(const std::vector<MeanStat>& v, int32_t first, int32_t last) {
  double sum = 0;
  int n = 0;
  for (int32_t i = std::max(first, 0); i <= last && i < static_cast<int32_t>(v.size()); ++i) {
    sum += v[i].mean();
    ++n;
  }
  return n ? sum / n : 0.0;
}

}  // namespace

uint64_t ReuseHistogram::total() const {
  uint64_t t = never;
  for (uint64_t b : buckets) t += b;
  return t;
}

double LocalityStats::MeanConsecutive(int32_t first, int32_t last) const {
  return MeanOfMeans(consecutive, first, last);
}
double LocalityStats::MeanAdjacent(int32_t first, int32_t last) const { return MeanOfMeans(adjacent, first, last); }

LocalityMeter::LocalityMeter(int32_t layers) : layers_(std::max(layers, 1)) {
  stats_.layers = layers_;
  stats_.consecutive.resize(layers_);
  stats_.adjacent.resize(layers_ - 1);
  stats_.reuse.resize(layers_);
}

void LocalityMeter::Add(const TraceRecord& r) {
  if (r.layer < 0 || r.layer >= layers_) return;  // a validated trace never has one
  if (r.step != step_) {
    FlushStep();
    step_ = r.step;
  }
  scratch_.assign(r.positions.begin(), r.positions.end());
  std::sort(scratch_.begin(), scratch_.end());
  const std::pair<int64_t, int32_t> key{r.request, r.layer};

  std::vector<int32_t>& prev = prev_[key];
  auto [it, fresh] = last_use_.try_emplace(key);
  if (!fresh && !scratch_.empty()) {
    stats_.consecutive[r.layer].sum += static_cast<double>(IntersectionSize(scratch_, prev)) / scratch_.size();
    ++stats_.consecutive[r.layer].count;
  }
  ReuseHistogram& h = stats_.reuse[r.layer];
  for (int32_t p : scratch_) {
    auto [use, first_use] = it->second.try_emplace(p, r.step);
    if (first_use) continue;
    const int b = Log2Floor(static_cast<uint64_t>(r.step - use->second));
    if (static_cast<int>(h.buckets.size()) <= b) h.buckets.resize(b + 1);
    ++h.buckets[b];
    use->second = r.step;
  }
  prev = scratch_;

  StepRecords& s = step_sel_[r.request];
  if (s.sel.empty()) {
    s.sel.resize(layers_);
    s.present.assign(layers_, 0);
  }
  s.sel[r.layer] = scratch_;
  s.present[r.layer] = 1;
}

void LocalityMeter::FlushStep() {
  for (auto& [request, s] : step_sel_) {
    for (int32_t l = 0; l + 1 < layers_; ++l) {
      if (!s.present[l] || !s.present[l + 1] || s.sel[l].empty()) continue;
      stats_.adjacent[l].sum += static_cast<double>(IntersectionSize(s.sel[l], s.sel[l + 1])) / s.sel[l].size();
      ++stats_.adjacent[l].count;
    }
  }
  step_sel_.clear();
}

LocalityStats LocalityMeter::Finish() {
  FlushStep();
  // A stream's last use of each position is the one selection never reused.
  for (const auto& [key, uses] : last_use_) stats_.reuse[key.second].never += uses.size();
  size_t width = 0;
  for (const ReuseHistogram& h : stats_.reuse) width = std::max(width, h.buckets.size());
  stats_.reuse_total.buckets.assign(width, 0);
  for (ReuseHistogram& h : stats_.reuse) {
    h.buckets.resize(width);
    for (size_t b = 0; b < width; ++b) stats_.reuse_total.buckets[b] += h.buckets[b];
    stats_.reuse_total.never += h.never;
  }
  last_use_.clear();
  prev_.clear();
  return std::move(stats_);
}

namespace {

absl::StatusOr<LocalityStudy> RunStudy(const LoadedTrace& trace, LocalityStats locality, const StudyOptions& o) {
  LocalityStudy study;
  study.k = trace.header().k;
  study.layers = trace.header().layers;
  study.records = trace.records();
  study.streams = trace.streams();
  study.locality = std::move(locality);
  std::vector<std::pair<double, int32_t>> sizes;  // (ratio or 0, B)
  for (int32_t b : o.slots) sizes.emplace_back(0.0, b);
  for (double r : o.ratios) {
    if (!(r >= 1.0) || r > 1e6) {
      return absl::InvalidArgumentError(absl::StrCat("B/k ratio must be >= 1, got ", r));
    }
    // The small margin keeps 1.5 * 2048 at 3072 despite rounding in the ratio's parsing.
    sizes.emplace_back(r, static_cast<int32_t>(std::ceil(r * study.k - 1e-6)));
  }
  std::vector<double> hint_ratios = o.hint_ratios;
  if (hint_ratios.empty()) hint_ratios.push_back(-1);
  for (double h : o.hint_ratios) {
    if (!(h >= 0) || h > 1e6) return absl::InvalidArgumentError(absl::StrCat("hint ratio must be >= 0, got ", h));
  }
  for (Policy policy : o.policies) {
    for (double h : policy == Policy::kHint ? hint_ratios : std::vector<double>{-1}) {
      const int32_t depth = h < 0 ? -1 : static_cast<int32_t>(std::lround(h * study.k));
      for (const auto& [ratio, b] : sizes) {
        HS_ASSIGN_OR_RETURN(ReplayResult result, Replay(trace, ReplayOptions{b, policy, o.record_bytes, depth}));
        study.runs.push_back(LocalityStudy::Run{ratio, h, std::move(result)});
      }
    }
  }
  return study;
}

}  // namespace

std::string RunLabel(const LocalityStudy::Run& run) {
  if (run.result.policy != Policy::kHint || run.hint_ratio < 0) return PolicyName(run.result.policy);
  return absl::StrCat("hint@", run.hint_ratio);
}

absl::StatusOr<LocalityStudy> StudyTrace(const std::string& path, const StudyOptions& options) {
  int32_t layers = 0;
  {
    // The meter needs the layer count before the first record: read the header alone first.
    HS_ASSIGN_OR_RETURN(std::unique_ptr<TraceReader> reader, TraceReader::Open(path));
    layers = reader->header().layers;
  }
  LocalityMeter meter(layers);
  HS_ASSIGN_OR_RETURN(LoadedTrace trace, LoadTrace(path, [&meter](const TraceRecord& r) { meter.Add(r); }));
  HS_ASSIGN_OR_RETURN(LocalityStudy study, RunStudy(trace, meter.Finish(), options));
  study.trace_path = path;
  return study;
}

absl::StatusOr<LocalityStudy> StudyRecords(const TraceHeader& header, const std::vector<TraceRecord>& records,
                                           const StudyOptions& options) {
  LocalityMeter meter(header.layers);
  HS_ASSIGN_OR_RETURN(LoadedTrace trace,
                      LoadRecords(header, records, [&meter](const TraceRecord& r) { meter.Add(r); }));
  return RunStudy(trace, meter.Finish(), options);
}

}  // namespace hisparse::trace
