// A seeded synthetic selection-trace generator (`hisparse-bench gen-trace`).
//
// Each (request, layer) selects, every decode step, the top-k positions of a latent score plus
// the newest token. The score of position p in layer l at step t is
//
//   static_w * S_l(p) + flicker_w * F_l(t, p) + topic_w * [p lies in an active topic span]
//
// - S_l (static relevance): N(0,1) per position, an AR(1) chain over layers with correlation
//   static_layer_corr between adjacent layers, so nearby layers want the same positions.
// - F_l (flicker): sqrt(shared) * G(t, p) + sqrt(1 - shared) * E_l(t, p), with G common to the
//   request's layers and E_l the layer's own; each is redrawn for a fraction flicker_renew of the
//   positions every step. Positions far above the top-k threshold stay selected; those near it
//   flip in and out, which is what makes the selections of consecutive steps overlap partially.
// - Topic spans: `topics` spans of topic_span tokens per request, shared by its layers; each jumps
//   to a random place with probability topic_jump a step (a new segment of the context becomes
//   relevant).
// - Attention sinks (the first sink_tokens positions) and a recency window (the newest
//   recency_window positions) are always selected in the layers whose profile says so.
// Every request starts at seq_len = context and grows by one token a step. A layer below
// first_layers uses the `shallow` profile, the others `deep` (DeepSeek-V3.2's first two layers
// select almost at random while its middle layers are stable).
//
// Determinism: the output depends only on the options (own xoshiro256** and an integer
// approximation of the normal distribution, no <random> distributions, whose results differ
// between standard libraries), so a seed names the same trace on every machine.
//
// Thread-safety: the functions are reentrant.
#ifndef HISPARSE_TRACE_GENERATE_H_
#define HISPARSE_TRACE_GENERATE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "hisparse/trace/trace.h"

namespace hisparse::trace {

// How one layer turns the latent components into a score.
struct LayerProfile {
  double static_w = 0;
  double flicker_w = 0;
  double flicker_shared = 0;  // share of the flicker variance common to the request's layers
  double topic_w = 0;
  bool sinks = false;    // the first sink_tokens positions are always selected
  bool recency = false;  // the newest recency_window positions are always selected
};

struct GeneratorPreset {
  std::string name;
  int32_t first_layers = 0;  // layers [0, first_layers) use `shallow`
  LayerProfile shallow;
  LayerProfile deep;
  double static_layer_corr = 0;  // correlation of S_l and S_{l+1}
  double flicker_renew = 1;      // fraction of flicker values redrawn a step, in (0, 1]
  // Sizes in tokens at k = 2048; topic_span and recency_window scale with k (at least 1 token),
  // so a preset's overlaps hold at any k with the same k / context.
  int32_t topics = 0;
  int32_t topic_span = 0;
  double topic_jump = 0;  // probability a span moves, per step
  int32_t sink_tokens = 0;
  int32_t recency_window = 0;
};

// "dsv32" (DeepSeek-V3.2-like: middle layers overlap ~0.44 step to step, layers 0-1 near the
// random floor k/seq_len, adjacent middle layers >= 0.7), "stress" (overlap ~0.2), "local" (the
// small trained model of FACTS.md, overlap 0.6-0.9). Calibrated at k/context = 1/16; the measured
// figures are in bench/RESULTS.md and checked by tests/trace/trace_generate_test.cc.
absl::StatusOr<GeneratorPreset> FindPreset(absl::string_view name);
std::vector<std::string> PresetNames();

struct GeneratorOptions {
  GeneratorPreset preset;
  uint64_t seed = 1;
  int32_t requests = 1;
  int32_t layers = 1;
  int32_t steps = 1;
  int32_t context = 1;  // seq_len at step 0
  int32_t k = 1;
  // Retention hints per record (a version-2 trace when > 0): the candidates ranked just below the
  // selected ones by the same latent score, best first; 0 writes none (and version 1). The
  // selections are the same with and without hints.
  int32_t hints = 0;
};

// The header a generated trace carries: k, layers, hints and `source`/`generator` keys naming
// the options, so a trace file says how to make it again.
TraceHeader GeneratedHeader(const GeneratorOptions& options);

// Generates the trace, calling `emit` with each record in file order (step, then request, then
// layer; positions ascending, hints best first). Stops at and returns the first error `emit`
// returns. INVALID_ARGUMENT for options out of range (all counts >= 1, hints >= 0, context +
// steps < 2^31).
absl::Status GenerateTrace(const GeneratorOptions& options,
                           const std::function<absl::Status(const TraceRecord&)>& emit);

}  // namespace hisparse::trace

#endif  // HISPARSE_TRACE_GENERATE_H_
