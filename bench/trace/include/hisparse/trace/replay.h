// Replay of a selection trace through a cache policy with B slots per (request, layer), giving
// the hit / miss accounting of TRACE_FORMAT.md per layer and in total.
//
// Policies (each (request, layer) stream has its own B slots and is replayed on its own; the
// newest-token rule applies to all: position seq_len - 1 is always a hit and occupies no slot):
//  - kLru:     the real RESOLVE (ResolveReference) on a one-row arena, without moving bytes.
//  - kBelady:  offline optimal: a miss with no free slot evicts the resident position not
//              selected in the current step whose next selection in this stream is farthest
//              (never beats any; ties go to the larger position).
//  - kStaging: a staging buffer that holds exactly the previous step's selection of this stream
//              (its newest token included); a hit is a position that stream selected in its
//              previous record too. B only has to be >= k (the buffer holds k).
//  - kHint:    hint-aware LRU: RESOLVE's mechanics (same hits, same LRU order updates), but the
//              misses take their victims first among the slots holding neither a hit nor one of
//              the record's hints (version-2 traces; the first hint_depth of them), in LRU order,
//              then among the hinted ones, in LRU order. With no hints (hint_depth 0, or a
//              version-1 trace) it is kLru exactly.
//  - kLru2:    LRU-2 (O'Neil, O'Neil, Weikum, SIGMOD 1993) over per-step selections: the victim is
//              the slot whose position's second most recent selection is oldest (selected once:
//              first), ties in LRU order; same mechanics as kLru otherwise.
// kHint and kLru2 run on a simulator of RESOLVE's rules 1-3 (online_policy.cc), not on RESOLVE
// itself; kHint at depth 0 reproduces kLru's counts exactly (trace_replay_test holds them equal).
//
// Replay reads the whole trace into memory first (Belady needs the future; positions are kept as
// int32, smaller than the text), then replays stream by stream. A LoadedTrace keeps that copy so
// one trace can be replayed through several policies and B without reading the file again.
//
// Ownership: a LoadedTrace owns its copy of the records. Thread-safety: the functions are
// reentrant; a const LoadedTrace may be replayed from several threads; results are plain values.
#ifndef HISPARSE_TRACE_REPLAY_H_
#define HISPARSE_TRACE_REPLAY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "hisparse/trace/trace.h"

namespace hisparse::trace {

enum class Policy { kLru, kBelady, kStaging, kHint, kLru2 };

// "lru", "belady", "staging", "hint", "lru2"; INVALID_ARGUMENT otherwise.
absl::StatusOr<Policy> ParsePolicy(absl::string_view name);
const char* PolicyName(Policy policy);

struct ReplayOptions {
  int32_t slots = 0;  // B per (request, layer); must be >= the trace's k
  Policy policy = Policy::kLru;
  uint32_t record_bytes = 0;  // bytes of one KV record; 0: bytes_fetched is not reported
  int32_t hint_depth = -1;    // kHint: use the first hint_depth hints of each record; < 0: all
};

struct ReplayCounts {
  uint64_t selections = 0;  // selected positions (padding excluded)
  uint64_t hits = 0;        // newest token included
  uint64_t misses = 0;
  // Misses of one record (one request, layer and step): nearest-rank percentiles over the records
  // counted here. A step's fetch time follows its misses, so the tail matters, not only the mean.
  uint32_t misses_p50 = 0;
  uint32_t misses_p99 = 0;
  uint32_t misses_max = 0;
  double hit_rate() const { return selections ? static_cast<double>(hits) / selections : 0.0; }
};

struct ReplayResult {
  Policy policy = Policy::kLru;
  int32_t slots = 0;
  int32_t k = 0;
  int32_t layers = 0;
  uint32_t record_bytes = 0;
  int32_t hint_depth = -1;  // as ReplayOptions (kHint only)
  uint64_t records = 0;     // S lines
  uint64_t streams = 0;     // distinct (request, layer) pairs
  std::vector<ReplayCounts> per_layer;
  ReplayCounts total;
};

// A trace in memory as its (request, layer) streams. Move-only.
class LoadedTrace {
 public:
  LoadedTrace(LoadedTrace&&) noexcept;
  LoadedTrace& operator=(LoadedTrace&&) noexcept;
  ~LoadedTrace();

  const TraceHeader& header() const;
  uint64_t records() const;  // S lines
  uint64_t streams() const;  // distinct (request, layer) pairs

 private:
  struct Impl;
  explicit LoadedTrace(std::unique_ptr<Impl> impl);
  friend class TraceLoader;
  friend absl::StatusOr<ReplayResult> Replay(const LoadedTrace&, const ReplayOptions&);
  std::unique_ptr<Impl> impl_;
};

// Called with every record as it is loaded, in file order (locality statistics use it to see the
// trace in the same pass).
using RecordObserver = std::function<void(const TraceRecord&)>;

// Reads the trace at `path` into memory. NOT_FOUND when it cannot be opened; INVALID_ARGUMENT
// ("PATH:LINE: what") when it is malformed.
absl::StatusOr<LoadedTrace> LoadTrace(const std::string& path, const RecordObserver& observe = nullptr);
// The same over records in memory (validated like a file: INVALID_ARGUMENT "record N: what").
absl::StatusOr<LoadedTrace> LoadRecords(const TraceHeader& header, const std::vector<TraceRecord>& records,
                                        const RecordObserver& observe = nullptr);

// Replays a loaded trace: FAILED_PRECONDITION when slots < k or slots < 1.
absl::StatusOr<ReplayResult> Replay(const LoadedTrace& trace, const ReplayOptions& options);

// Replays the trace at `path`. NOT_FOUND when it cannot be opened; INVALID_ARGUMENT
// ("PATH:LINE: what") when it is malformed; FAILED_PRECONDITION when slots < k or slots < 1.
absl::StatusOr<ReplayResult> ReplayTrace(const std::string& path, const ReplayOptions& options);

// The same over records in memory (validated like a file: INVALID_ARGUMENT "record N: what").
absl::StatusOr<ReplayResult> ReplayRecords(const TraceHeader& header, const std::vector<TraceRecord>& records,
                                           const ReplayOptions& options);

// Renderings for the CLI: one JSON object (bytes_fetched only when record_bytes > 0), or a table.
std::string ReplayResultJson(const ReplayResult& result, absl::string_view trace_path);
std::string ReplayResultTable(const ReplayResult& result, absl::string_view trace_path);

}  // namespace hisparse::trace

#endif  // HISPARSE_TRACE_REPLAY_H_
