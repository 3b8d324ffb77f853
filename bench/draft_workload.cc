// See draft_workload.h.
#include "draft_workload.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace hisparse::bench {
namespace {

// A (row, layer) grid of one layer in plain host memory for the CPU reference, tables only: every
// launch on it runs with kResolveFlagNoFetch, so records and host records are never touched
// (ArenaView::records and the host bases stay null). Owns its vectors; not thread-safe.
class TableArena {
 public:
  TableArena(const ArenaGeometry& g, int32_t capacity)
      : g_(g),
        slot_pos_(static_cast<size_t>(g.max_rows) * g.slots),
        lru_(slot_pos_.size()),
        bases_(g.max_rows, nullptr),
        caps_(g.max_rows, capacity) {
    for (int32_t r = 0; r < g.max_rows; ++r) ResetRowReference(View(), r);
  }

  ArenaView View() {
    ArenaView v{};
    v.geometry = g_;
    v.counters = &counters_;
    v.slot_pos = slot_pos_.data();
    v.lru = lru_.data();
    v.records = nullptr;
    return v;
  }
  DraftTables Tables() const { return DraftTables{slot_pos_, lru_}; }

  // One launch over every row: positions [rows][Q][k], every row at seq_len, q query tokens each
  // (multi-query geometry) or one list (single-query geometry, q = 1).
  DraftOutcome Resolve(const int32_t* positions, int32_t seq_len, int32_t q) {
    const int32_t batch = g_.max_rows;
    std::vector<int32_t> rows(batch), seqs(batch, seq_len), counts(batch, q);
    for (int32_t r = 0; r < batch; ++r) rows[r] = r;
    DraftOutcome o;
    o.out.assign(static_cast<size_t>(batch) * g_.TailSlots() * g_.k, 0);
    const ArenaCounters before = counters_;
    ResolveDesc d{};
    d.arena = View();
    d.host = HostRecordMap{bases_.data(), caps_.data()};
    d.layer = 0;
    d.max_batch = batch;
    d.batch_size = &batch;
    d.rows = rows.data();
    d.seq_lens = seqs.data();
    d.positions = positions;
    d.out_slots = o.out.data();
    d.flags = kResolveFlagNoFetch;
    d.query_counts = g_.draft_tokens > 0 ? counts.data() : nullptr;
    o.errors = ResolveReference(d);
    o.misses = counters_.misses - before.misses;
    o.hits = counters_.hits - before.hits;
    return o;
  }

 private:
  ArenaGeometry g_;
  ArenaCounters counters_{};
  std::vector<int32_t> slot_pos_, lru_;
  std::vector<uint8_t*> bases_;
  std::vector<int32_t> caps_;
};

// The chain of `lists` lists of one row (draft_workload.h), list c at out + c * stride.
void MakeChain(const DraftPoint& p, int32_t row, int32_t lists, int32_t* out, size_t stride) {
  std::mt19937_64 rng(p.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(row));
  auto below = [&rng](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); };
  // The first FreshNeeded() entries of a random permutation of [0, context) (partial Fisher-Yates).
  std::vector<int32_t> perm(p.context);
  for (int32_t i = 0; i < p.context; ++i) perm[i] = i;
  const int64_t need = p.FreshNeeded();
  for (int64_t i = 0; i < need; ++i) std::swap(perm[i], perm[i + below(p.context - i)]);
  const int32_t k = p.k, fresh = k - p.Kept();
  int64_t next = 0;
  std::vector<int32_t> idx(k);
  for (int32_t j = 0; j < k; ++j) out[j] = perm[next++];
  for (int32_t c = 1; c < lists; ++c) {
    int32_t* cur = out + c * stride;
    std::copy(out + (c - 1) * stride, out + (c - 1) * stride + k, cur);
    // A uniformly random set of `fresh` indices of [0, k): the first `fresh` of a shuffle.
    for (int32_t j = 0; j < k; ++j) idx[j] = j;
    for (int32_t j = 0; j < fresh; ++j) std::swap(idx[j], idx[j + below(k - j)]);
    for (int32_t j = 0; j < fresh; ++j) cur[idx[j]] = perm[next++];
  }
}

std::vector<int32_t> Gather(const DraftWorkload& w, int32_t step, int32_t t) {
  const DraftPoint& p = w.point;
  const int32_t q = p.Queries(), k = p.k;
  const int32_t* s = w.Step(step);
  std::vector<int32_t> v(static_cast<size_t>(p.batch) * k);
  for (int32_t r = 0; r < p.batch; ++r) {
    std::copy_n(s + (static_cast<size_t>(r) * q + t) * k, k, v.begin() + static_cast<size_t>(r) * k);
  }
  return v;
}

absl::Status CheckPoint(const DraftPoint& p) {
  if (p.batch < 1 || p.k < 1 || p.context < 1 || p.draft_tokens < 0 || p.draft_tokens > kMaxDraftTokens) {
    return absl::InvalidArgumentError(absl::StrCat("draft point: batch ", p.batch, ", k ", p.k, ", context ", p.context,
                                                   ", draft_tokens ", p.draft_tokens, " out of range"));
  }
  if (!(p.overlap >= 0 && p.overlap < 1) || p.Kept() >= p.k) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft point: overlap ", p.overlap, " must keep fewer than k = ", p.k, " positions (overlap in [0, 1))"));
  }
  if (const char* why = ValidateArenaGeometry(p.MultiGeometry())) {
    return absl::InvalidArgumentError(absl::StrCat("draft point: ", why));
  }
  const int64_t step_union = p.k + static_cast<int64_t>(p.Queries() - 1) * (p.k - p.Kept());
  if (step_union > p.Slots()) {
    return absl::InvalidArgumentError(absl::StrCat("draft point: B = ", p.Slots(), " is below one step's union of ",
                                                   step_union, " positions (rule 8c)"));
  }
  if (p.FreshNeeded() > p.context) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft point: the chains need ", p.FreshNeeded(), " distinct positions, context is ", p.context));
  }
  return absl::OkStatus();
}

}  // namespace

int32_t DraftPoint::Kept() const { return static_cast<int32_t>(std::lround(overlap * k)); }

ArenaGeometry DraftPoint::MultiGeometry() const {
  ArenaGeometry g{batch, 1, Slots(), k, record_bytes};
  g.draft_tokens = draft_tokens;
  return g;
}

ArenaGeometry DraftPoint::SingleGeometry() const { return ArenaGeometry{batch, 1, Slots(), k, record_bytes}; }

int32_t DraftPoint::WarmupSteps() const {
  const int64_t fresh = std::max(1, k - Kept());
  const int64_t lists_to_fill = (std::max<int64_t>(0, Slots() - k) + fresh - 1) / fresh + 1;
  return static_cast<int32_t>((lists_to_fill + Queries() - 1) / Queries() + 1);
}

int64_t DraftPoint::FreshNeeded() const {
  const int64_t lists = static_cast<int64_t>(WarmupSteps() + 1) * Queries();
  return k + (lists - 1) * (k - Kept());
}

const int32_t* DraftWorkload::Step(int32_t step) const {
  return lists.data() + static_cast<size_t>(step) * point.batch * point.Queries() * point.k;
}

std::vector<int32_t> DraftWorkload::TimedList(int32_t t) const { return Gather(*this, steps - 1, t); }

absl::StatusOr<DraftWorkload> MakeDraftWorkload(const DraftPoint& p) {
  if (absl::Status s = CheckPoint(p); !s.ok()) return s;
  DraftWorkload w;
  w.point = p;
  w.steps = p.WarmupSteps() + 1;
  const int32_t q = p.Queries(), k = p.k;
  const size_t step_stride = static_cast<size_t>(p.batch) * q * k;
  w.lists.assign(step_stride * w.steps, kPadding);
  // List c of row r = list (c % q) of step c / q: stride between consecutive lists of a row is k
  // inside a step and jumps a step's block at a step boundary, so build each chain apart.
  std::vector<int32_t> chain(static_cast<size_t>(w.steps) * q * k);
  for (int32_t r = 0; r < p.batch; ++r) {
    MakeChain(p, r, w.steps * q, chain.data(), static_cast<size_t>(k));
    for (int32_t s = 0; s < w.steps; ++s) {
      std::copy_n(chain.data() + static_cast<size_t>(s) * q * k, static_cast<size_t>(q) * k,
                  w.lists.data() + s * step_stride + static_cast<size_t>(r) * q * k);
    }
  }

  const int32_t capacity = w.SeqLen();
  TableArena multi(p.MultiGeometry(), capacity), single(p.SingleGeometry(), capacity);
  for (int32_t s = 0; s + 1 < w.steps; ++s) {
    if (multi.Resolve(w.Step(s), w.SeqLen(), q).errors != 0) {
      return absl::InternalError(absl::StrCat("warm-up step ", s, " was refused by the multi-query reference"));
    }
    for (int32_t t = 0; t < q; ++t) {
      if (single.Resolve(Gather(w, s, t).data(), p.context + t + 1, 1).errors != 0) {
        return absl::InternalError(absl::StrCat("warm-up step ", s, " list ", t, " was refused by the reference"));
      }
    }
  }
  w.multi_before = multi.Tables();
  w.single_before = single.Tables();
  w.multi = multi.Resolve(w.Step(w.steps - 1), w.SeqLen(), q);
  w.multi_after = multi.Tables();
  TableArena alone = single;  // list 0 alone, from the same state as the separate launches
  w.single = alone.Resolve(w.TimedList(0).data(), p.context + 1, 1);
  for (int32_t t = 0; t < q; ++t) w.separate.push_back(single.Resolve(w.TimedList(t).data(), p.context + t + 1, 1));
  w.separate_after = single.Tables();
  return w;
}

namespace {

// Every selection of `lists` ([batch][q][k], q lists a row) names a slot of `after` that holds it.
bool OutputsHoldPositions(const DraftPoint& p, const int32_t* lists, int32_t q, const std::vector<int32_t>& out,
                          const DraftTables& after) {
  const int32_t B = p.Slots();
  for (size_t x = 0; x < static_cast<size_t>(p.batch) * q * p.k; ++x) {
    const size_t row = x / (static_cast<size_t>(q) * p.k);
    const int32_t s = out[x];
    if (s < 0 || s >= B || after.slot_pos[row * B + s] != lists[x]) return false;
  }
  return true;
}

// Every position of `positions` (n of them) is held by some regular slot of row `row`.
bool Resident(const DraftTables& t, int32_t B, size_t row, const int32_t* positions, size_t n) {
  std::vector<int32_t> held(t.slot_pos.begin() + row * B, t.slot_pos.begin() + (row + 1) * B);
  std::sort(held.begin(), held.end());
  for (size_t i = 0; i < n; ++i) {
    if (!std::binary_search(held.begin(), held.end(), positions[i])) return false;
  }
  return true;
}

}  // namespace

std::string CheckDraftWorkload(const DraftWorkload& w) {
  const DraftPoint& p = w.point;
  const int32_t q = p.Queries(), k = p.k, B = p.Slots();
  const uint64_t fresh = static_cast<uint64_t>(k - p.Kept());
  for (int32_t r = 0; r < p.batch; ++r) {
    std::vector<char> seen(p.context, 0);
    std::vector<int32_t> prev;
    for (int32_t c = 0; c < w.steps * q; ++c) {
      const int32_t* l = w.Step(c / q) + (static_cast<size_t>(r) * q + c % q) * k;
      std::vector<int32_t> cur(l, l + k);
      std::sort(cur.begin(), cur.end());
      if (std::adjacent_find(cur.begin(), cur.end()) != cur.end())
        return absl::StrCat("row ", r, " list ", c, " repeats");
      if (c > 0) {
        std::vector<int32_t> common;
        std::set_intersection(prev.begin(), prev.end(), cur.begin(), cur.end(), std::back_inserter(common));
        if (static_cast<int32_t>(common.size()) != p.Kept()) {
          return absl::StrCat("row ", r, " lists ", c - 1, " and ", c, " share ", common.size(), " positions, not ",
                              p.Kept());
        }
        for (int32_t pos : cur) {
          if (!std::binary_search(prev.begin(), prev.end(), pos) && seen[pos]) {
            return absl::StrCat("row ", r, " list ", c, ": fresh position ", pos, " was selected before");
          }
        }
      }
      for (int32_t pos : cur) seen[pos] = 1;
      prev = std::move(cur);
    }
    const int32_t* last = w.Step(w.steps - 2) + static_cast<size_t>(r) * q * k;
    if (!Resident(w.multi_before, B, r, last, static_cast<size_t>(q) * k) ||
        !Resident(w.single_before, B, r, last, static_cast<size_t>(q) * k)) {
      return absl::StrCat("row ", r, ": the previous step's union is not resident before the timed step");
    }
  }
  uint32_t errors = w.multi.errors | w.single.errors;
  uint64_t separate_misses = 0;
  for (const DraftOutcome& o : w.separate) {
    errors |= o.errors;
    separate_misses += o.misses;
  }
  if (errors != 0) return absl::StrCat("the reference refused a timed launch (error bits ", errors, ")");
  const uint64_t want = static_cast<uint64_t>(p.batch) * q * fresh;
  if (w.multi.misses != want || separate_misses != want || w.single.misses != static_cast<uint64_t>(p.batch) * fresh) {
    return absl::StrCat("misses: multi ", w.multi.misses, ", separate ", separate_misses, ", list 0 ", w.single.misses,
                        "; expected ", want, ", ", want, ", ", p.batch * fresh);
  }
  if (!OutputsHoldPositions(p, w.Step(w.steps - 1), q, w.multi.out, w.multi_after)) {
    return "a multi-query output does not name the slot holding its position";
  }
  for (int32_t t = 0; t < q; ++t) {
    if (!OutputsHoldPositions(p, w.TimedList(t).data(), 1, w.separate[t].out, w.separate_after)) {
      return absl::StrCat("an output of separate launch ", t, " does not name the slot holding its position");
    }
  }
  return "";
}

}  // namespace hisparse::bench
