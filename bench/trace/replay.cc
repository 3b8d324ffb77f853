// Trace replay through lru / belady / staging / hint / lru2 (replay.h).
#include "hisparse/trace/replay.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/kernels/resolve.h"
#include "stream_internal.h"

namespace hisparse::trace {
namespace {

using internal::ForEachRecord;
using internal::RecordView;
using internal::Stream;

// LRU is the real RESOLVE on a one-row, one-layer arena reset per stream. NoFetch: the records
// section is never touched, so no host pool exists; every seq_len is within the row's capacity.
class LruReplayer {
 public:
  LruReplayer(int32_t slots, int32_t k)
      : g_{1, 1, slots, k, kRecordAlign},
        storage_(ComputeArenaOffsets(g_).total_bytes / sizeof(uint64_t) + 1),
        view_(ArenaView::Of(storage_.data(), g_)),
        positions_(k),
        out_(k) {}

  // Appends each record's misses to *record_misses.
  absl::StatusOr<ReplayCounts> Run(const Stream& s, std::vector<uint32_t>* record_misses) {
    ResetRowReference(view_, 0);
    *view_.counters = ArenaCounters{};
    uint8_t* const no_host[1] = {nullptr};
    const int32_t capacity = std::numeric_limits<int32_t>::max();
    const int32_t row = 0, one = 1;
    ReplayCounts c;
    absl::Status status;
    ForEachRecord(s, [&](const RecordView& r) {
      int32_t seq_len = r.seq_len;
      const int32_t *p = r.positions, n = r.n;
      std::fill(std::copy(p, p + n, positions_.begin()), positions_.end(), kPadding);
      c.selections += n;
      ResolveDesc d{};
      d.arena = view_;
      d.host = HostRecordMap{no_host, &capacity};
      d.layer = 0;
      d.max_batch = 1;
      d.batch_size = &one;
      d.rows = &row;
      d.seq_lens = &seq_len;
      d.positions = positions_.data();
      d.out_slots = out_.data();
      d.flags = kResolveFlagNoFetch;
      const uint64_t before = view_.counters->misses;
      if (ResolveReference(d) != 0 && status.ok()) {
        status = absl::InternalError("RESOLVE rejected a validated trace record");
      }
      record_misses->push_back(static_cast<uint32_t>(view_.counters->misses - before));
    });
    HS_RETURN_IF_ERROR(status);
    c.hits = view_.counters->hits;
    c.misses = view_.counters->misses;
    return c;
  }

 private:
  ArenaGeometry g_;
  std::vector<uint64_t> storage_;
  ArenaView view_;
  std::vector<int32_t> positions_, out_;
};

ReplayCounts ReplayBelady(const Stream& s, int32_t slots, std::vector<uint32_t>* record_misses) {
  constexpr int32_t kNever = std::numeric_limits<int32_t>::max();
  // next[i]: the record index of the next non-newest selection of the position at data[i].
  std::vector<int32_t> next(s.data.size(), kNever);
  std::vector<RecordView> records;  // for the reverse scan
  ForEachRecord(s, [&](const RecordView& r) { records.push_back(r); });
  std::unordered_map<int32_t, int32_t> next_seen;
  for (auto r = records.rbegin(); r != records.rend(); ++r) {
    const size_t offset = static_cast<size_t>(r->positions - s.data.data());
    for (int32_t j = 0; j < r->n; ++j) {
      const int32_t p = r->positions[j];
      if (p == r->seq_len - 1) continue;  // a newest-token selection costs nothing: not a use
      auto it = next_seen.find(p);
      next[offset + j] = it == next_seen.end() ? kNever : it->second;
      next_seen[p] = r->index;
    }
  }

  ReplayCounts c;
  std::unordered_map<int32_t, int32_t> resident;  // position -> its next use
  std::set<std::pair<int32_t, int32_t>> by_next;  // (next use, position) of evictable residents
  std::vector<std::pair<int32_t, int32_t>> keep;  // (next use, position) selected this step
  ForEachRecord(s, [&](const RecordView& r) {
    const int32_t seq_len = r.seq_len, n = r.n;
    const int32_t* p = r.positions;
    c.selections += n;
    keep.clear();
    int32_t misses = 0;
    for (int32_t j = 0; j < n; ++j) {
      if (p[j] == seq_len - 1) {
        ++c.hits;
        continue;
      }
      const int32_t nu = next[p - s.data.data() + j];
      auto it = resident.find(p[j]);
      if (it != resident.end()) {
        ++c.hits;
        by_next.erase({it->second, p[j]});  // selected now: not evictable this step
      } else {
        ++misses;
      }
      keep.emplace_back(nu, p[j]);
    }
    // Hits + misses <= k <= B, so enough unselected residents exist to make room.
    int64_t need = static_cast<int64_t>(resident.size()) + misses - slots;
    for (; need > 0; --need) {
      auto victim = std::prev(by_next.end());
      resident.erase(victim->second);
      by_next.erase(victim);
    }
    for (const auto& [nu, pos] : keep) {
      resident[pos] = nu;
      by_next.emplace(nu, pos);
    }
    c.misses += misses;
    record_misses->push_back(static_cast<uint32_t>(misses));
  });
  return c;
}

ReplayCounts ReplayStaging(const Stream& s, std::vector<uint32_t>* record_misses) {
  ReplayCounts c;
  std::vector<int32_t> prev, cur;  // sorted selections of the previous and current record
  ForEachRecord(s, [&](const RecordView& r) {
    const int32_t seq_len = r.seq_len, n = r.n;
    const int32_t* p = r.positions;
    c.selections += n;
    uint32_t misses = 0;
    for (int32_t j = 0; j < n; ++j) {
      const bool hit = p[j] == seq_len - 1 || std::binary_search(prev.begin(), prev.end(), p[j]);
      ++(hit ? c.hits : c.misses);
      misses += !hit;
    }
    record_misses->push_back(misses);
    cur.assign(p, p + n);
    std::sort(cur.begin(), cur.end());
    std::swap(prev, cur);
  });
  return c;
}

void AddTo(ReplayCounts* sum, const ReplayCounts& c) {
  sum->selections += c.selections;
  sum->hits += c.hits;
  sum->misses += c.misses;
}

absl::Status CheckSlots(const TraceHeader& h, const ReplayOptions& o) {
  if (o.slots < 1 || o.slots < h.k) {
    return absl::FailedPreconditionError(
        absl::StrCat("replay needs slots (B) >= k: B = ", o.slots, ", trace k = ", h.k));
  }
  return absl::OkStatus();
}

// Nearest-rank percentile q (0 < q <= 1) of `v`, which it reorders.
uint32_t Percentile(std::vector<uint32_t>* v, double q) {
  if (v->empty()) return 0;
  size_t rank = static_cast<size_t>(std::ceil(q * v->size()));
  rank = std::clamp<size_t>(rank, 1, v->size()) - 1;
  std::nth_element(v->begin(), v->begin() + rank, v->end());
  return (*v)[rank];
}

void SetMissPercentiles(std::vector<uint32_t>* misses, ReplayCounts* c) {
  c->misses_max = misses->empty() ? 0 : *std::max_element(misses->begin(), misses->end());
  c->misses_p99 = Percentile(misses, 0.99);
  c->misses_p50 = Percentile(misses, 0.50);
}

}  // namespace

struct LoadedTrace::Impl {
  TraceHeader header;
  std::map<std::pair<int64_t, int32_t>, size_t> index;  // (request, layer) -> streams index
  std::vector<Stream> streams;
  uint64_t records = 0;
};

// Builds a LoadedTrace record by record; a friend of LoadedTrace.
class TraceLoader {
 public:
  explicit TraceLoader(const TraceHeader& header) : impl_(std::make_unique<LoadedTrace::Impl>()) {
    impl_->header = header;
  }
  void Add(const TraceRecord& r) {
    auto [it, fresh] = impl_->index.try_emplace({r.request, r.layer}, impl_->streams.size());
    if (fresh) impl_->streams.push_back(Stream{r.layer, {}});
    std::vector<int32_t>& d = impl_->streams[it->second].data;
    d.push_back(r.seq_len);
    d.push_back(static_cast<int32_t>(r.positions.size()));
    d.push_back(static_cast<int32_t>(r.hints.size()));
    d.insert(d.end(), r.positions.begin(), r.positions.end());
    d.insert(d.end(), r.hints.begin(), r.hints.end());
    ++impl_->records;
  }
  LoadedTrace Finish() { return LoadedTrace(std::move(impl_)); }

 private:
  std::unique_ptr<LoadedTrace::Impl> impl_;
};

LoadedTrace::LoadedTrace(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LoadedTrace::LoadedTrace(LoadedTrace&&) noexcept = default;
LoadedTrace& LoadedTrace::operator=(LoadedTrace&&) noexcept = default;
LoadedTrace::~LoadedTrace() = default;
const TraceHeader& LoadedTrace::header() const { return impl_->header; }
uint64_t LoadedTrace::records() const { return impl_->records; }
uint64_t LoadedTrace::streams() const { return impl_->streams.size(); }

absl::StatusOr<Policy> ParsePolicy(absl::string_view name) {
  if (name == "lru") return Policy::kLru;
  if (name == "belady") return Policy::kBelady;
  if (name == "staging") return Policy::kStaging;
  if (name == "hint") return Policy::kHint;
  if (name == "lru2") return Policy::kLru2;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown policy '", name, "' (expected lru, belady, staging, hint or lru2)"));
}

const char* PolicyName(Policy policy) {
  switch (policy) {
    case Policy::kLru:
      return "lru";
    case Policy::kBelady:
      return "belady";
    case Policy::kStaging:
      return "staging";
    case Policy::kHint:
      return "hint";
    case Policy::kLru2:
      return "lru2";
  }
  return "?";
}

absl::StatusOr<LoadedTrace> LoadTrace(const std::string& path, const RecordObserver& observe) {
  HS_ASSIGN_OR_RETURN(std::unique_ptr<TraceReader> reader, TraceReader::Open(path));
  TraceLoader loader(reader->header());
  TraceRecord r;
  while (true) {
    HS_ASSIGN_OR_RETURN(bool more, reader->Next(&r));
    if (!more) break;
    if (observe) observe(r);
    loader.Add(r);
  }
  return loader.Finish();
}

absl::StatusOr<LoadedTrace> LoadRecords(const TraceHeader& header, const std::vector<TraceRecord>& records,
                                        const RecordObserver& observe) {
  if (header.k < 1 || header.layers < 1) {
    return absl::InvalidArgumentError("trace header needs k >= 1 and layers >= 1");
  }
  TraceChecker checker(header);
  TraceLoader loader(header);
  for (size_t i = 0; i < records.size(); ++i) {
    absl::Status s = checker.Check(records[i]);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("record ", i, ": ", s.message()));
    if (observe) observe(records[i]);
    loader.Add(records[i]);
  }
  return loader.Finish();
}

absl::StatusOr<ReplayResult> Replay(const LoadedTrace& trace, const ReplayOptions& o) {
  const TraceHeader& h = trace.header();
  HS_RETURN_IF_ERROR(CheckSlots(h, o));
  ReplayResult res;
  res.policy = o.policy;
  res.slots = o.slots;
  res.k = h.k;
  res.layers = h.layers;
  res.record_bytes = o.record_bytes;
  res.hint_depth = o.policy == Policy::kHint ? o.hint_depth : -1;
  res.records = trace.records();
  res.streams = trace.streams();
  res.per_layer.resize(h.layers);
  std::vector<std::vector<uint32_t>> layer_misses(h.layers);  // per record, for the percentiles
  std::unique_ptr<LruReplayer> lru;
  if (o.policy == Policy::kLru) lru = std::make_unique<LruReplayer>(o.slots, h.k);
  for (const Stream& s : trace.impl_->streams) {
    ReplayCounts c;
    std::vector<uint32_t>* misses = &layer_misses[s.layer];
    switch (o.policy) {
      case Policy::kLru: {
        HS_ASSIGN_OR_RETURN(c, lru->Run(s, misses));
        break;
      }
      case Policy::kBelady:
        c = ReplayBelady(s, o.slots, misses);
        break;
      case Policy::kStaging:
        c = ReplayStaging(s, misses);
        break;
      case Policy::kHint:
        c = internal::ReplayOnline(s, o.slots, internal::OnlineVictims::kHint, o.hint_depth, misses);
        break;
      case Policy::kLru2:
        c = internal::ReplayOnline(s, o.slots, internal::OnlineVictims::kLru2, 0, misses);
        break;
    }
    AddTo(&res.per_layer[s.layer], c);
    AddTo(&res.total, c);
  }
  std::vector<uint32_t> all;
  for (int32_t l = 0; l < h.layers; ++l) {
    all.insert(all.end(), layer_misses[l].begin(), layer_misses[l].end());
    SetMissPercentiles(&layer_misses[l], &res.per_layer[l]);
  }
  SetMissPercentiles(&all, &res.total);
  return res;
}

absl::StatusOr<ReplayResult> ReplayTrace(const std::string& path, const ReplayOptions& options) {
  HS_ASSIGN_OR_RETURN(std::unique_ptr<TraceReader> reader, TraceReader::Open(path));
  // Checked before loading so a bad B fails fast, without reading a large trace first.
  HS_RETURN_IF_ERROR(CheckSlots(reader->header(), options));
  reader.reset();
  HS_ASSIGN_OR_RETURN(LoadedTrace trace, LoadTrace(path));
  return Replay(trace, options);
}

absl::StatusOr<ReplayResult> ReplayRecords(const TraceHeader& header, const std::vector<TraceRecord>& records,
                                           const ReplayOptions& options) {
  if (header.k >= 1 && header.layers >= 1) HS_RETURN_IF_ERROR(CheckSlots(header, options));
  HS_ASSIGN_OR_RETURN(LoadedTrace trace, LoadRecords(header, records));
  return Replay(trace, options);
}

}  // namespace hisparse::trace
