// Locality statistics of a selection trace, computed in one streaming pass over its records:
//
//  - Consecutive-step overlap per layer: for each record with an earlier record in its (request,
//    layer) stream, |S_now ∩ S_previous| / |S_now|; averaged over those records. This is the
//    figure DeepSeek-V3.2's analysis reports (35-50% in middle layers, ~1.5% in layers 0-1).
//  - Adjacent-layer overlap per layer pair (l, l+1): for each (request, step) holding both,
//    |S_l ∩ S_l+1| / |S_l|; averaged.
//  - Reuse distance: for each selection, the steps until the same (request, layer) selects the
//    position again, in log2 buckets [1], [2,3], [4,7], ...; "never reused" when it is not
//    selected again before the trace ends (so a short trace counts more of those). Per layer and
//    in total; the counts add up to the selections.
//
// The newest token counts like any other position here (it is a real selection; only replay
// treats it as free).
//
// Ownership: LocalityMeter owns its copies of the selections it needs (the previous record of
// every stream, the current step's records, each stream's last-use table). Thread-safety: none;
// one thread feeds a meter.
#ifndef HISPARSE_TRACE_LOCALITY_H_
#define HISPARSE_TRACE_LOCALITY_H_

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "hisparse/trace/replay.h"
#include "hisparse/trace/trace.h"

namespace hisparse::trace {

struct MeanStat {
  double sum = 0;
  uint64_t count = 0;  // records (or record pairs) averaged
  double mean() const { return count ? sum / count : 0.0; }
};

struct ReuseHistogram {
  std::vector<uint64_t> buckets;  // buckets[b]: reuse distances d with 2^b <= d < 2^(b+1)
  uint64_t never = 0;             // selections not selected again within the trace
  uint64_t total() const;
};

struct LocalityStats {
  int32_t layers = 0;
  std::vector<MeanStat> consecutive;  // [layer]
  std::vector<MeanStat> adjacent;     // [l] for the pair (l, l+1); layers - 1 entries
  std::vector<ReuseHistogram> reuse;  // [layer]
  ReuseHistogram reuse_total;
  // The mean of the per-layer means over layers first..last (of the pairs (l, l+1) with
  // first <= l <= last for MeanAdjacent), each layer weighted alike; 0 when the range is empty.
  double MeanConsecutive(int32_t first, int32_t last) const;
  double MeanAdjacent(int32_t first, int32_t last) const;
};

class LocalityMeter {
 public:
  explicit LocalityMeter(int32_t layers);
  // Records must come in a valid trace's order (steps non-decreasing); `r` is not kept.
  void Add(const TraceRecord& r);
  LocalityStats Finish();  // the meter is spent afterwards

 private:
  void FlushStep();

  int32_t layers_;
  LocalityStats stats_;
  int64_t step_ = -1;
  struct StepRecords {
    std::vector<std::vector<int32_t>> sel;  // [layer] sorted positions
    std::vector<char> present;              // [layer] a record was seen
  };
  std::map<int64_t, StepRecords> step_sel_;                           // request -> this step's records
  std::map<std::pair<int64_t, int32_t>, std::vector<int32_t>> prev_;  // (request, layer) -> sorted
  // (request, layer) -> position -> step of its last selection.
  std::map<std::pair<int64_t, int32_t>, std::unordered_map<int32_t, int64_t>> last_use_;
  std::vector<int32_t> scratch_;
};

// The study of one trace: its locality and its replay through several policies and B.
struct LocalityStudy {
  std::string trace_path;
  int32_t k = 0;
  int32_t layers = 0;
  uint64_t records = 0;
  uint64_t streams = 0;
  LocalityStats locality;
  struct Run {
    double ratio = 0;        // B / k as asked for (0 when B was given directly)
    double hint_ratio = -1;  // kHint: hint depth / k as asked for (-1: every hint of the trace)
    ReplayResult result;
  };
  std::vector<Run> runs;  // policies outer (kHint once per hint ratio), B inner, in the order asked for
};

struct StudyOptions {
  std::vector<Policy> policies;
  std::vector<int32_t> slots;  // B values replayed as given
  std::vector<double> ratios;  // B = ceil(ratio * k) each; every ratio >= 1
  uint32_t record_bytes = 0;   // as ReplayOptions
  // kHint runs once per ratio r >= 0 with hint_depth = round(r * k) (0: no hints, which is lru);
  // empty: once with every hint the trace has.
  std::vector<double> hint_ratios;
};

// "hint@0.5" for a kHint run at hint ratio 0.5, "hint" at every hint; the policy name otherwise.
std::string RunLabel(const LocalityStudy::Run& run);

// Loads `path` once, measures its locality and replays it through every policy at every B.
// Errors as LoadTrace and Replay; INVALID_ARGUMENT for a ratio below 1 or a negative hint ratio.
absl::StatusOr<LocalityStudy> StudyTrace(const std::string& path, const StudyOptions& options);

// The same over records in memory (validated like a file: INVALID_ARGUMENT "record N: what").
absl::StatusOr<LocalityStudy> StudyRecords(const TraceHeader& header, const std::vector<TraceRecord>& records,
                                           const StudyOptions& options);

// One JSON object; a table for people.
std::string LocalityStudyJson(const LocalityStudy& study);
std::string LocalityStudyTable(const LocalityStudy& study);

}  // namespace hisparse::trace

#endif  // HISPARSE_TRACE_LOCALITY_H_
