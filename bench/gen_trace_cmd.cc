// `hisparse-bench gen-trace`: write a synthetic selection trace (generate.h) and, with --measure,
// report the locality it achieved, so a preset's calibration is read off, not assumed.
//
//   hisparse-bench gen-trace --preset {dsv32,stress,local} [--seed S] [--requests R] [--layers L]
//                            [--steps N] [--context C] [--k K] [--hints H] [--out FILE[.gz]]
//                            [--measure] [--json]
//
// Exit codes: 0 ok, 1 the file could not be written, 2 bad usage.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "bench_cmd.h"
#include "hisparse/trace/generate.h"
#include "hisparse/trace/locality.h"

namespace hisparse::bench {
namespace {

constexpr char kUsage[] =
    "usage: hisparse-bench gen-trace --preset {dsv32,stress,local} [--seed S] [--requests R]\n"
    "         [--layers L] [--steps N] [--context C] [--k K] [--hints H] [--out FILE[.gz]]\n"
    "         [--measure] [--json]\n"
    "  Writes a synthetic selection trace (TRACE_FORMAT.md version 1; gzip when FILE ends in .gz):\n"
    "  R requests x L layers, N decode steps from seq_len C, k positions a record. --hints H > 0\n"
    "  writes version 2 with up to H retention hints a record (the next-best positions by the\n"
    "  same score, best first); the selections do not change.\n"
    "  Defaults: --seed 1 --requests 4 --layers 4 --steps 256 --context 32768 --k 2048 --hints 0.\n"
    "  --measure prints the consecutive-step overlap per layer and the adjacent-layer overlap the\n"
    "  trace achieved (--json: as one JSON object). --out or --measure is required.\n";

int UsageError(const std::string& what) {
  std::fprintf(stderr, "hisparse-bench gen-trace: %s\n%s", what.c_str(), kUsage);
  return 2;
}

std::string Means(const std::vector<trace::MeanStat>& v, bool json) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    absl::StrAppendFormat(&out, "%s%.4f", i ? (json ? ", " : " ") : "", v[i].mean());
  }
  return out;
}

}  // namespace

int GenTraceMain(int argc, char** argv) {
  std::string preset_name, out_path;
  int64_t seed = 1, requests = 4, layers = 4, steps = 256, context = 32768, k = 2048, hints = 0;
  bool measure = false, json = false;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--measure" || arg == "--json") {
      (arg == "--json" ? json : measure) = true;
      continue;
    }
    std::string name, value;
    if (!TakeFlag(argc, argv, &i, &name, &value)) return UsageError(name + " needs a value");
    int64_t* number = name == "--seed"       ? &seed
                      : name == "--requests" ? &requests
                      : name == "--layers"   ? &layers
                      : name == "--steps"    ? &steps
                      : name == "--context"  ? &context
                      : name == "--k"        ? &k
                      : name == "--hints"    ? &hints
                                             : nullptr;
    if (name == "--preset") {
      preset_name = value;
    } else if (name == "--out") {
      out_path = value;
    } else if (number == nullptr) {
      return UsageError(absl::StrCat("unknown argument '", arg, "'"));
    } else if (const bool zero_ok = name == "--seed" || name == "--hints";
               !absl::SimpleAtoi(value, number) || *number < (zero_ok ? 0 : 1) || *number > (int64_t{1} << 30)) {
      return UsageError(absl::StrCat(name, " needs a ", zero_ok ? "non-negative" : "positive",
                                     " integer up to 2^30, got '", value, "'"));
    }
  }
  if (preset_name.empty()) return UsageError("--preset is required");
  if (out_path.empty() && !measure) return UsageError("--out or --measure is required");
  absl::StatusOr<trace::GeneratorPreset> preset = trace::FindPreset(preset_name);
  if (!preset.ok()) return UsageError(std::string(preset.status().message()));

  trace::GeneratorOptions o;
  o.preset = *preset;
  o.seed = static_cast<uint64_t>(seed);
  o.requests = static_cast<int32_t>(requests);
  o.layers = static_cast<int32_t>(layers);
  o.steps = static_cast<int32_t>(steps);
  o.context = static_cast<int32_t>(context);
  o.k = static_cast<int32_t>(k);
  o.hints = static_cast<int32_t>(hints);

  std::unique_ptr<trace::TraceWriter> writer;
  if (!out_path.empty()) {
    absl::StatusOr<std::unique_ptr<trace::TraceWriter>> w =
        trace::TraceWriter::Create(out_path, trace::GeneratedHeader(o));
    if (!w.ok()) {
      std::fprintf(stderr, "hisparse-bench gen-trace: %s\n", std::string(w.status().message()).c_str());
      return absl::IsInvalidArgument(w.status()) ? 2 : 1;
    }
    writer = std::move(*w);
  }
  trace::LocalityMeter meter(o.layers);
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = trace::GenerateTrace(o, [&](const trace::TraceRecord& r) {
    if (measure) meter.Add(r);
    return writer ? writer->Write(r) : absl::OkStatus();
  });
  if (status.ok() && writer) status = writer->Close();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!status.ok()) {
    std::fprintf(stderr, "hisparse-bench gen-trace: %s\n", std::string(status.message()).c_str());
    return absl::IsInvalidArgument(status) ? 2 : 1;
  }
  if (!measure) return 0;
  const trace::LocalityStats stats = meter.Finish();
  const std::string generator = trace::GeneratedHeader(o).extra.back().second;
  if (json) {
    std::printf(
        "{\"preset\": \"%s\", \"generator\": \"%s\", \"seconds\": %.3f,\n"
        " \"consecutive\": [%s],\n \"adjacent\": [%s]}\n",
        o.preset.name.c_str(), generator.c_str(), seconds, Means(stats.consecutive, true).c_str(),
        Means(stats.adjacent, true).c_str());
  } else {
    std::printf(
        "%s  (%.2f s)\nconsecutive-step overlap per layer: %s\nadjacent-layer overlap "
        "(l, l+1):        %s\n",
        generator.c_str(), seconds, Means(stats.consecutive, false).c_str(), Means(stats.adjacent, false).c_str());
  }
  return 0;
}

}  // namespace hisparse::bench
