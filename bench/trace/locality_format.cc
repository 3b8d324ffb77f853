// JSON and table renderings of a LocalityStudy (locality.h).
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "format_internal.h"
#include "hisparse/trace/locality.h"

namespace hisparse::trace {
namespace {

using internal::CountsJson;
using internal::JsonString;

// "1", "2-3", "4-7", ...: the steps a log2 bucket of reuse distances covers.
std::string BucketLabel(size_t b) {
  if (b == 0) return "1";
  return absl::StrCat(uint64_t{1} << b, "-", (uint64_t{2} << b) - 1);
}

std::string ReuseJson(const ReuseHistogram& h) {
  std::string out = "{\"counts\": [";
  for (size_t b = 0; b < h.buckets.size(); ++b) absl::StrAppend(&out, b ? ", " : "", h.buckets[b]);
  absl::StrAppend(&out, "], \"never\": ", h.never, "}");
  return out;
}

std::string MeansJson(const std::vector<MeanStat>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) absl::StrAppendFormat(&out, "%s%.4f", i ? ", " : "", v[i].mean());
  return out + "]";
}

}  // namespace

std::string LocalityStudyJson(const LocalityStudy& s) {
  const LocalityStats& loc = s.locality;
  std::string out = absl::StrCat("{\"trace\": ", JsonString(s.trace_path), ", \"k\": ", s.k, ", \"layers\": ", s.layers,
                                 ", \"records\": ", s.records, ", \"streams\": ", s.streams);
  absl::StrAppend(&out, ",\n \"overlap\": {\"consecutive\": ", MeansJson(loc.consecutive),
                  ", \"adjacent\": ", MeansJson(loc.adjacent), "}");
  absl::StrAppend(&out, ",\n \"reuse_distance\": {\"buckets\": [");
  for (size_t b = 0; b < loc.reuse_total.buckets.size(); ++b) {
    absl::StrAppend(&out, b ? ", " : "", "\"", BucketLabel(b), "\"");
  }
  absl::StrAppend(&out, "], \"total\": ", ReuseJson(loc.reuse_total), ", \"per_layer\": [");
  for (size_t l = 0; l < loc.reuse.size(); ++l) {
    absl::StrAppend(&out, l ? ",\n   " : "\n   ", ReuseJson(loc.reuse[l]));
  }
  absl::StrAppend(&out, "]},\n \"replays\": [");
  for (size_t i = 0; i < s.runs.size(); ++i) {
    const ReplayResult& r = s.runs[i].result;
    absl::StrAppend(&out, i ? ",\n  " : "\n  ", "{\"policy\": \"", PolicyName(r.policy), "\"");
    if (s.runs[i].ratio > 0) absl::StrAppendFormat(&out, ", \"ratio\": %g", s.runs[i].ratio);
    if (r.policy == Policy::kHint) {
      absl::StrAppend(&out, ", \"label\": ", JsonString(RunLabel(s.runs[i])), ", \"hint_depth\": ", r.hint_depth);
      if (s.runs[i].hint_ratio >= 0) absl::StrAppendFormat(&out, ", \"hint_ratio\": %g", s.runs[i].hint_ratio);
    }
    absl::StrAppend(&out, ", \"slots\": ", r.slots, ", \"total\": {", CountsJson(r.total, r.record_bytes),
                    "}, \"per_layer\": [");
    for (size_t l = 0; l < r.per_layer.size(); ++l) {
      absl::StrAppend(&out, l ? ", " : "", "{", CountsJson(r.per_layer[l], r.record_bytes), "}");
    }
    absl::StrAppend(&out, "]}");
  }
  absl::StrAppend(&out, "]}\n");
  return out;
}

std::string LocalityStudyTable(const LocalityStudy& s) {
  const LocalityStats& loc = s.locality;
  std::string out = absl::StrFormat("trace %s: k = %d, %d layers, %d records, %d streams\n", s.trace_path, s.k,
                                    s.layers, s.records, s.streams);
  absl::StrAppendFormat(&out, "\n%-24s", "overlap \\ layer");
  for (int32_t l = 0; l < s.layers; ++l) absl::StrAppendFormat(&out, " %6d", l);
  absl::StrAppendFormat(&out, "\n%-24s", "consecutive steps");
  for (const MeanStat& m : loc.consecutive) absl::StrAppendFormat(&out, " %6.3f", m.mean());
  absl::StrAppendFormat(&out, "\n%-24s", "layer l and l+1");
  for (const MeanStat& m : loc.adjacent) absl::StrAppendFormat(&out, " %6.3f", m.mean());

  const ReuseHistogram& h = loc.reuse_total;
  const double total = static_cast<double>(h.total());
  absl::StrAppend(&out, "\n\nreuse distance (steps), share of selections:\n");
  for (size_t b = 0; b < h.buckets.size(); ++b) {
    absl::StrAppendFormat(&out, " %9s", BucketLabel(b));
  }
  absl::StrAppendFormat(&out, " %9s\n", "never");
  for (size_t b = 0; b < h.buckets.size(); ++b) {
    absl::StrAppendFormat(&out, " %9.4f", total > 0 ? h.buckets[b] / total : 0.0);
  }
  absl::StrAppendFormat(&out, " %9.4f\n", total > 0 ? h.never / total : 0.0);

  absl::StrAppendFormat(&out, "\n%-10s %6s %7s %8s %8s %8s", "policy", "B/k", "B", "hit_rate", "miss p50", "miss p99");
  for (int32_t l = 0; l < s.layers; ++l) absl::StrAppendFormat(&out, " %7s", absl::StrCat("L", l));
  out.push_back('\n');
  for (const LocalityStudy::Run& run : s.runs) {
    const ReplayResult& r = run.result;
    absl::StrAppendFormat(&out, "%-10s %6.3g %7d %8.4f %8d %8d", RunLabel(run), static_cast<double>(r.slots) / r.k,
                          r.slots, r.total.hit_rate(), r.total.misses_p50, r.total.misses_p99);
    for (const ReplayCounts& c : r.per_layer) absl::StrAppendFormat(&out, " %7.4f", c.hit_rate());
    out.push_back('\n');
  }
  return out;
}

}  // namespace hisparse::trace
