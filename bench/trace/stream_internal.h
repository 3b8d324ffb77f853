// A trace in memory as its (request, layer) streams, shared by the policy replayers of
// hisparse_trace. Internal: not installed, not part of its API.
//
// Ownership: a Stream owns its flattened records. Thread-safety: plain values; a const Stream may
// be read from several threads.
#ifndef HISPARSE_BENCH_TRACE_STREAM_INTERNAL_H_
#define HISPARSE_BENCH_TRACE_STREAM_INTERNAL_H_

#include <cstdint>
#include <vector>

#include "hisparse/trace/replay.h"

namespace hisparse::trace::internal {

// One (request, layer) stream: its records in step order, flattened as
// [seq_len, n, m, p1 .. pn, q1 .. qm] (n selections, m hints best first).
struct Stream {
  int32_t layer = 0;
  std::vector<int32_t> data;
};

// One record of a stream, pointing into its data.
struct RecordView {
  int32_t index;  // record index within the stream (0 = its first step)
  int32_t seq_len;
  const int32_t* positions;
  int32_t n;
  const int32_t* hints;
  int32_t m;
};

// Calls f(RecordView) for each record of `s`, in order.
template <typename F>
void ForEachRecord(const Stream& s, F f) {
  int32_t t = 0;
  for (size_t i = 0; i < s.data.size(); ++t) {
    const int32_t n = s.data[i + 1], m = s.data[i + 2];
    const int32_t* p = &s.data[i + 3];
    f(RecordView{t, s.data[i], p, n, p + n, m});
    i += 3 + static_cast<size_t>(n) + m;
  }
}

// The online policies that share RESOLVE's slot mechanics (online_policy.cc).
enum class OnlineVictims {
  kLru,   // the i-th miss takes the i-th least recently used slot holding no hit: RESOLVE's rule 2
  kHint,  // the same over the slots holding neither a hit nor a hinted position, then the hinted
  kLru2,  // LRU-2: the slot whose position's second most recent selection is oldest
};

// Replays `s` with `slots` regular slots under RESOLVE's semantics (resolve.h rules 1-3: the
// newest token is a free hit in slot B and touches no slot; misses in selection order take
// victims; new LRU order = untouched, then the filled slots in miss order, then the hit slots),
// victims chosen by `victims`; kHint reads the first hint_depth hints of each record (all when
// hint_depth < 0). Appends each record's misses to *record_misses.
ReplayCounts ReplayOnline(const Stream& s, int32_t slots, OnlineVictims victims, int32_t hint_depth,
                          std::vector<uint32_t>* record_misses);

}  // namespace hisparse::trace::internal

#endif  // HISPARSE_BENCH_TRACE_STREAM_INTERNAL_H_
