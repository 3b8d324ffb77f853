// The workload of `hisparse-bench resolve --draft-tokens` (issue 18's benchmark): multi-query
// RESOLVE steps of speculative decoding, built and held on the host, and their outcome on the CPU
// reference. Plain C++ (no CUDA): the GPU timer (resolve_draft_cmd.cu) uploads what this builds,
// and the smoke mode and tests/bench run it on the CPU reference alone.
//
// One point: `batch` rows, q = draft_tokens + 1 query tokens a step, k selections per query token,
// B = slots (the sizing: (n + 2) * k). Every row's query tokens of the timed step are the
// positions context + t (t < q), so seq_len = context + q, and every list selects among the
// positions [0, context) below the step's first query token (valid for every t; no list selects a
// tail position, so every selection is a regular hit or a miss).
//
// Selections (DraftWorkload::Lists): per row, one chain of lists L_0, L_1, ..., q lists a step.
// L_0 is the first k positions of a seeded random permutation of [0, context). L_{c+1} is L_c with
// k - kept of its entries replaced, kept = round(overlap * k): the k - kept indices to replace are
// a uniformly random subset of [0, k), and each gets the next position of the permutation, so a
// replacement ("fresh") position was never selected before by any list of the row. Consecutive
// lists thus share exactly `kept` positions (80% by default), also across a step boundary (list 0
// of a step keeps `kept` of the previous step's list n), as consecutive query tokens of a decode do.
//
// Steady state: warmup_steps steps run on the CPU reference (tables only: kResolveFlagNoFetch)
// before the timed step, enough that the B slots are full; the previous step's union is then
// resident, as in a real decode. Two arenas of the same B are warmed up alike from the same lists:
// the multi-query one (draft_tokens = n, one launch a step) and a single-query one (draft_tokens
// = 0, each list of a step resolved in turn as its own launch, list t at seq_len context + t + 1).
// In the timed step every fresh position is a miss and every kept one a hit, so the multi-query
// launch and the q separate launches both fetch q * (k - kept) records a row, list 0 alone
// k - kept.
//
// Thread-safety: none needed (plain values); not thread-safe to share a DraftState while running.
#ifndef HISPARSE_BENCH_DRAFT_WORKLOAD_H_
#define HISPARSE_BENCH_DRAFT_WORKLOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hisparse/kernels/arena_layout.h"
#include "hisparse/kernels/resolve.h"

namespace hisparse::bench {

struct DraftPoint {
  int32_t batch = 1;
  int32_t draft_tokens = 0;  // n; q = n + 1 lists a step
  int32_t k = 2048;
  int32_t slots = 0;  // B; 0: (n + 2) * k
  int32_t context = 16384;
  uint32_t record_bytes = 656;
  double overlap = 0.8;  // fraction of list t's positions that list t + 1 keeps
  uint64_t seed = 1;

  int32_t Queries() const { return draft_tokens + 1; }
  int32_t Slots() const { return slots > 0 ? slots : (draft_tokens + 2) * k; }
  int32_t Kept() const;  // round(overlap * k)
  // The multi-query geometry (draft_tokens = n) and the single-query one (0), same B, one layer.
  ArenaGeometry MultiGeometry() const;
  ArenaGeometry SingleGeometry() const;
  // Warm-up steps before the timed one: enough for the B slots to be full, plus one.
  int32_t WarmupSteps() const;
  // Positions the chains draw: k + (lists - 1) * (k - kept) must fit in [0, context).
  int64_t FreshNeeded() const;
};

// One (row, layer)'s tables: slot_pos and lru of every row, [batch][B] each.
struct DraftTables {
  std::vector<int32_t> slot_pos;
  std::vector<int32_t> lru;
};

// What the CPU reference made of one RESOLVE launch of the timed step.
struct DraftOutcome {
  std::vector<int32_t> out;  // out_slots of the launch
  uint64_t misses = 0;       // counters' growth: records fetched
  uint64_t hits = 0;
  uint32_t errors = 0;  // ResolveError bits
};

struct DraftWorkload {
  DraftPoint point;
  int32_t steps = 0;           // warm-up steps + the timed one (the last)
  std::vector<int32_t> lists;  // [steps][batch][q][k]
  DraftTables multi_before;    // the multi-query arena before the timed step
  DraftTables single_before;   // the single-query arena before the timed step
  DraftOutcome multi;          // the timed step as one multi-query launch
  DraftTables multi_after;
  std::vector<DraftOutcome> separate;  // [q]: list t of the timed step as launch t, in turn
  DraftTables separate_after;
  DraftOutcome single;  // list 0 alone, one single-query launch from single_before

  int32_t SeqLen() const { return point.context + point.Queries(); }
  // [batch][q][k] lists of `step` (the timed step is steps - 1).
  const int32_t* Step(int32_t step) const;
  // [batch][k] list t of the timed step, rows back to back (one single-query launch's positions).
  std::vector<int32_t> TimedList(int32_t t) const;
};

// Builds the lists, warms both arenas up and runs the timed step's three variants on the CPU
// reference. INVALID_ARGUMENT for a point that cannot be built (k < 1, overlap outside [0, 1),
// B too small for one step's union, context too small for the chains, a geometry that
// ValidateArenaGeometry rejects).
absl::StatusOr<DraftWorkload> MakeDraftWorkload(const DraftPoint& p);

// Checks the workload's own promises (the properties above): consecutive lists share exactly
// kept positions, fresh positions were never selected before, the previous step's union is
// resident in both arenas, no variant reported an error, the misses are q * (k - kept) (multi and
// separate) and k - kept (list 0) a row, and every output of the multi-query step names a slot
// that holds its position afterwards. Returns "" when all hold, else what failed.
std::string CheckDraftWorkload(const DraftWorkload& w);

}  // namespace hisparse::bench

#endif  // HISPARSE_BENCH_DRAFT_WORKLOAD_H_
