// `hisparse-bench trace`: replay a selection trace (TRACE_FORMAT.md) through a cache policy, or
// run the locality study over one or more traces.
//
//   hisparse-bench trace --trace FILE --slots B --policy {lru,belady,staging,hint,lru2}
//                        [--hints R] [--record-bytes N] [--json]
//   hisparse-bench trace --trace FILE [--trace FILE ...] --policy all|P1,P2
//                        (--ratios R1,R2,... | --slots B1,B2,...) [--hints R1,R2,...] [--study]
//                        [--record-bytes N] [--json]
//
// One trace, one policy and one B give the replay result as before; several of any (or --ratios,
// or --study) give the study: locality (overlaps, reuse distances) and every policy at every B.
//
// Exit codes: 0 ok, 1 the trace could not be read or is malformed (the message, with its line
// number, goes to stderr), 2 bad usage (including B < the trace's k).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "bench_cmd.h"
#include "hisparse/trace/locality.h"
#include "hisparse/trace/replay.h"
#include "hisparse/trace/trace.h"

namespace hisparse::bench {
namespace {

constexpr char kUsage[] =
    "usage: hisparse-bench trace --trace FILE --slots B --policy {lru,belady,staging,hint,lru2}\n"
    "                            [--hints R] [--record-bytes N] [--json]\n"
    "       hisparse-bench trace --trace FILE [--trace FILE ...] --policy {all,P1,P2,...}\n"
    "                            {--ratios R1,R2,... | --slots B1,B2,...} [--hints R1,R2,...]\n"
    "                            [--study] [--record-bytes N] [--json]\n"
    "  Replays a selection trace (plain or .gz) with B slots per (request, layer); B >= k.\n"
    "  Policies: lru (RESOLVE), belady (offline optimum), staging (last step only), hint (LRU that\n"
    "  evicts unhinted slots first; version-2 traces), lru2 (LRU-2); all = every one of them.\n"
    "  --hints: hint depths as multiples of k (h = R*k of each record's hints, best first; 0 = none);\n"
    "  default: every hint in the trace. The study runs hint once per R.\n"
    "  Prints selections, hits, misses, hit rate and misses per record (p50 / p99) per layer and\n"
    "  in total (and bytes fetched with --record-bytes), as a table or, with --json, as JSON.\n"
    "  The study (several traces, policies or B, --ratios, or --study) adds the locality of each\n"
    "  trace: consecutive-step and adjacent-layer overlap, reuse-distance histogram; B = ratio*k.\n"
    "  Its JSON is {\"traces\": [one object per trace]}.\n";

int UsageError(const std::string& what) {
  std::fprintf(stderr, "hisparse-bench trace: %s\n%s", what.c_str(), kUsage);
  return 2;
}

int Failed(const absl::Status& status) {
  if (absl::IsFailedPrecondition(status)) return UsageError(std::string(status.message()));
  std::fprintf(stderr, "hisparse-bench trace: %s\n", std::string(status.message()).c_str());
  return 1;
}

struct Args {
  std::vector<std::string> traces;
  std::vector<trace::Policy> policies;
  std::vector<int32_t> slots;
  std::vector<double> ratios;
  std::vector<double> hint_ratios;
  int64_t record_bytes = 0;
  bool json = false;
  bool study = false;
};

// Parses one flag's value into *args; an error message, or empty.
std::string Parse(absl::string_view name, const std::string& value, Args* a) {
  if (name == "--trace") {
    a->traces.push_back(value);
  } else if (name == "--policy") {
    for (absl::string_view p : absl::StrSplit(value, ',')) {
      if (p == "all") {
        a->policies.insert(a->policies.end(), {trace::Policy::kLru, trace::Policy::kBelady, trace::Policy::kStaging,
                                               trace::Policy::kHint, trace::Policy::kLru2});
        continue;
      }
      absl::StatusOr<trace::Policy> policy = trace::ParsePolicy(p);
      if (!policy.ok()) return std::string(policy.status().message());
      a->policies.push_back(*policy);
    }
  } else if (name == "--slots") {
    for (absl::string_view v : absl::StrSplit(value, ',')) {
      int64_t b;
      if (!absl::SimpleAtoi(v, &b) || b < 1 || b > (int64_t{1} << 30)) {
        return "--slots needs positive integers, got '" + value + "'";
      }
      a->slots.push_back(static_cast<int32_t>(b));
    }
  } else if (name == "--ratios") {
    for (absl::string_view v : absl::StrSplit(value, ',')) {
      double r;
      if (!absl::SimpleAtod(v, &r) || !(r >= 1.0) || r > 1024) {
        return "--ratios needs numbers in [1, 1024] (B/k), got '" + value + "'";
      }
      a->ratios.push_back(r);
    }
  } else if (name == "--hints") {
    for (absl::string_view v : absl::StrSplit(value, ',')) {
      double r;
      if (!absl::SimpleAtod(v, &r) || !(r >= 0.0) || r > 1024) {
        return "--hints needs numbers in [0, 1024] (hint depth / k), got '" + value + "'";
      }
      a->hint_ratios.push_back(r);
    }
  } else if (name == "--record-bytes") {
    if (!absl::SimpleAtoi(value, &a->record_bytes) || a->record_bytes < 1 || a->record_bytes > (int64_t{1} << 30)) {
      return "--record-bytes needs a positive integer, got '" + value + "'";
    }
  } else {
    return "unknown argument '" + std::string(name) + "'";
  }
  return "";
}

}  // namespace

int TraceMain(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--json" || arg == "--study") {
      (arg == "--json" ? a.json : a.study) = true;
      continue;
    }
    std::string name, value;
    const bool has_value = TakeFlag(argc, argv, &i, &name, &value);
    if (name != "--trace" && name != "--slots" && name != "--policy" && name != "--ratios" && name != "--hints" &&
        name != "--record-bytes") {
      return UsageError("unknown argument '" + std::string(arg) + "'");
    }
    if (!has_value) return UsageError(name + " needs a value");
    if (std::string error = Parse(name, value, &a); !error.empty()) return UsageError(error);
  }
  if (a.traces.empty()) return UsageError("--trace is required");
  if (a.slots.empty() && a.ratios.empty()) return UsageError("--slots or --ratios is required");
  if (a.policies.empty()) return UsageError("--policy is required");

  const bool study = a.study || a.traces.size() > 1 || a.policies.size() > 1 || a.slots.size() > 1 ||
                     !a.ratios.empty() || a.hint_ratios.size() > 1;
  if (!study) {
    trace::ReplayOptions options;
    options.slots = a.slots[0];
    options.policy = a.policies[0];
    options.record_bytes = static_cast<uint32_t>(a.record_bytes);
    absl::StatusOr<trace::ReplayResult> result;
    if (a.hint_ratios.empty()) {
      result = trace::ReplayTrace(a.traces[0], options);
    } else {
      // The depth is a multiple of the trace's k, known once its header is read.
      absl::StatusOr<std::unique_ptr<trace::TraceReader>> reader = trace::TraceReader::Open(a.traces[0]);
      if (!reader.ok()) return Failed(reader.status());
      options.hint_depth = static_cast<int32_t>(std::lround(a.hint_ratios[0] * (*reader)->header().k));
      reader->reset();
      result = trace::ReplayTrace(a.traces[0], options);
    }
    if (!result.ok()) return Failed(result.status());
    const std::string text =
        a.json ? trace::ReplayResultJson(*result, a.traces[0]) : trace::ReplayResultTable(*result, a.traces[0]);
    std::fputs(text.c_str(), stdout);
    return 0;
  }

  trace::StudyOptions options{a.policies, a.slots, a.ratios, static_cast<uint32_t>(a.record_bytes), a.hint_ratios};
  if (a.json) std::fputs("{\"traces\": [\n", stdout);
  for (size_t i = 0; i < a.traces.size(); ++i) {
    absl::StatusOr<trace::LocalityStudy> s = trace::StudyTrace(a.traces[i], options);
    if (!s.ok()) {
      if (a.json) std::fputs("]}\n", stdout);  // what was printed stays valid JSON
      return Failed(s.status());
    }
    if (a.json) {
      if (i > 0) std::fputs(",\n", stdout);
      std::string text = trace::LocalityStudyJson(*s);
      text.pop_back();  // its newline: the separator decides
      std::fputs(text.c_str(), stdout);
    } else {
      std::fputs(((i > 0 ? "\n" : "") + trace::LocalityStudyTable(*s)).c_str(), stdout);
    }
    std::fflush(stdout);
  }
  if (a.json) std::fputs("\n]}\n", stdout);
  return 0;
}

}  // namespace hisparse::bench
