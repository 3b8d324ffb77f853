// JSON pieces shared by the renderings of replay (replay_format.cc) and of the locality study
// (locality_format.cc). Internal to hisparse_trace: not installed, not part of its API.
#ifndef HISPARSE_BENCH_TRACE_FORMAT_INTERNAL_H_
#define HISPARSE_BENCH_TRACE_FORMAT_INTERNAL_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "hisparse/trace/replay.h"

namespace hisparse::trace::internal {

// `s` as a quoted JSON string.
std::string JsonString(absl::string_view s);
// The members of a counts object, without braces: selections, hits, misses, hit_rate,
// bytes_fetched (when record_bytes > 0) and the per-record miss percentiles.
std::string CountsJson(const ReplayCounts& c, uint32_t record_bytes);

}  // namespace hisparse::trace::internal

#endif  // HISPARSE_BENCH_TRACE_FORMAT_INTERNAL_H_
