// JSON and table renderings of a ReplayResult (replay.h).
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "format_internal.h"
#include "hisparse/trace/replay.h"

namespace hisparse::trace {
namespace internal {

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(ch));
    } else if (ch < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", ch);
    } else {
      out.push_back(static_cast<char>(ch));
    }
  }
  return out + "\"";
}

std::string CountsJson(const ReplayCounts& c, uint32_t record_bytes) {
  std::string out = absl::StrFormat(R"("selections": %d, "hits": %d, "misses": %d, "hit_rate": %.6f)", c.selections,
                                    c.hits, c.misses, c.hit_rate());
  if (record_bytes > 0) {
    absl::StrAppend(&out, ", \"bytes_fetched\": ", c.misses * static_cast<uint64_t>(record_bytes));
  }
  absl::StrAppendFormat(&out, R"(, "misses_p50": %d, "misses_p99": %d, "misses_max": %d)", c.misses_p50, c.misses_p99,
                        c.misses_max);
  return out;
}

}  // namespace internal

using internal::CountsJson;
using internal::JsonString;

std::string ReplayResultJson(const ReplayResult& r, absl::string_view trace_path) {
  std::string out = absl::StrCat("{\"trace\": ", JsonString(trace_path), ", \"policy\": \"", PolicyName(r.policy),
                                 "\", \"slots\": ", r.slots, ", \"k\": ", r.k, ", \"layers\": ", r.layers);
  if (r.record_bytes > 0) absl::StrAppend(&out, ", \"record_bytes\": ", r.record_bytes);
  if (r.policy == Policy::kHint) absl::StrAppend(&out, ", \"hint_depth\": ", r.hint_depth);
  absl::StrAppend(&out, ", \"records\": ", r.records, ", \"streams\": ", r.streams, ",\n \"total\": {",
                  CountsJson(r.total, r.record_bytes), "},\n \"per_layer\": [");
  for (size_t l = 0; l < r.per_layer.size(); ++l) {
    absl::StrAppend(&out, l ? ",\n  " : "\n  ", "{\"layer\": ", l, ", ", CountsJson(r.per_layer[l], r.record_bytes),
                    "}");
  }
  absl::StrAppend(&out, "]}\n");
  return out;
}

std::string ReplayResultTable(const ReplayResult& r, absl::string_view trace_path) {
  std::string out = absl::StrFormat(
      "trace %s: policy %s, B = %d, k = %d, %d layers, %d records, "
      "%d (request, layer) streams\n",
      trace_path, PolicyName(r.policy), r.slots, r.k, r.layers, r.records, r.streams);
  const bool bytes = r.record_bytes > 0;
  absl::StrAppendFormat(&out, "%-7s %14s %14s %14s %9s %23s%s\n", "layer", "selections", "hits", "misses", "hit_rate",
                        "misses/record p50/p99", bytes ? "  bytes_fetched" : "");
  auto row = [&](const std::string& name, const ReplayCounts& c) {
    absl::StrAppendFormat(&out, "%-7s %14d %14d %14d %9.4f %23s", name, c.selections, c.hits, c.misses, c.hit_rate(),
                          absl::StrCat(c.misses_p50, " / ", c.misses_p99));
    if (bytes) absl::StrAppendFormat(&out, "  %13d", c.misses * static_cast<uint64_t>(r.record_bytes));
    out.push_back('\n');
  };
  for (size_t l = 0; l < r.per_layer.size(); ++l) row(absl::StrCat(l), r.per_layer[l]);
  row("total", r.total);
  return out;
}

}  // namespace hisparse::trace
