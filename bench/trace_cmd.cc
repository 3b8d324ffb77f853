// `hisparse-bench trace`: replay a selection trace (TRACE_FORMAT.md) through a cache policy.
//
//   hisparse-bench trace --trace FILE --slots B --policy {lru,belady,staging}
//                        [--record-bytes N] [--json]
//
// Exit codes: 0 ok, 1 the trace could not be read or is malformed (the message, with its line
// number, goes to stderr), 2 bad usage (including B < the trace's k).
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "bench_cmd.h"
#include "hisparse/trace/replay.h"

namespace hisparse::bench {
namespace {

constexpr char kUsage[] =
    "usage: hisparse-bench trace --trace FILE --slots B --policy {lru,belady,staging}\n"
    "                            [--record-bytes N] [--json]\n"
    "  Replays a selection trace (plain or .gz) with B slots per (request, layer); B >= k.\n"
    "  Prints selections, hits, misses and hit rate per layer and in total (and bytes fetched\n"
    "  with --record-bytes), as a table or, with --json, as one JSON object.\n";

int UsageError(const std::string& what) {
  std::fprintf(stderr, "hisparse-bench trace: %s\n%s", what.c_str(), kUsage);
  return 2;
}

}  // namespace

int TraceMain(int argc, char** argv) {
  std::string path, policy_name;
  int64_t slots = -1, record_bytes = 0;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--json") {
      json = true;
      continue;
    }
    // --name VALUE or --name=VALUE
    std::string value;
    const size_t eq = arg.find('=');
    const absl::string_view name = arg.substr(0, eq);
    if (name != "--trace" && name != "--slots" && name != "--policy" && name != "--record-bytes") {
      return UsageError("unknown argument '" + std::string(arg) + "'");
    }
    if (eq != absl::string_view::npos) {
      value = std::string(arg.substr(eq + 1));
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return UsageError(std::string(name) + " needs a value");
    }
    if (name == "--trace") {
      path = value;
    } else if (name == "--policy") {
      policy_name = value;
    } else {
      int64_t& out = name == "--slots" ? slots : record_bytes;
      if (!absl::SimpleAtoi(value, &out) || out < 1 || out > (int64_t{1} << 30)) {
        return UsageError(std::string(name) + " needs a positive integer, got '" + value + "'");
      }
    }
  }
  if (path.empty()) return UsageError("--trace is required");
  if (slots < 1) return UsageError("--slots is required");
  if (policy_name.empty()) return UsageError("--policy is required");
  absl::StatusOr<trace::Policy> policy = trace::ParsePolicy(policy_name);
  if (!policy.ok()) return UsageError(std::string(policy.status().message()));

  trace::ReplayOptions options;
  options.slots = static_cast<int32_t>(slots);
  options.policy = *policy;
  options.record_bytes = static_cast<uint32_t>(record_bytes);
  absl::StatusOr<trace::ReplayResult> result = trace::ReplayTrace(path, options);
  if (!result.ok()) {
    if (absl::IsFailedPrecondition(result.status())) {
      return UsageError(std::string(result.status().message()));
    }
    std::fprintf(stderr, "hisparse-bench trace: %s\n",
                 std::string(result.status().message()).c_str());
    return 1;
  }
  const std::string text =
      json ? trace::ReplayResultJson(*result, path) : trace::ReplayResultTable(*result, path);
  std::fputs(text.c_str(), stdout);
  return 0;
}

}  // namespace hisparse::bench
