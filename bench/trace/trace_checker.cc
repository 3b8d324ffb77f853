// TraceChecker: the rules of TRACE_FORMAT.md that the reader and the writer share.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/trace/trace.h"

namespace hisparse::trace {

absl::Status TraceChecker::Check(const TraceRecord& r) {
  if (r.step < 0) return absl::InvalidArgumentError(absl::StrCat("step ", r.step, " is negative"));
  if (r.step < step_) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", r.step, " after step ", step_, ": steps must not decrease"));
  }
  if (r.layer < 0 || r.layer >= layers_) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", r.layer, " outside [0, ", layers_, ") (header: layers ", layers_, ")"));
  }
  if (r.request < 0) {
    return absl::InvalidArgumentError(absl::StrCat("request ", r.request, " is negative"));
  }
  if (r.seq_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat("seq_len ", r.seq_len, " must be >= 1"));
  }
  if (r.positions.size() > static_cast<size_t>(k_)) {
    return absl::InvalidArgumentError(absl::StrCat(r.positions.size(), " positions, more than k = ", k_));
  }
  for (int32_t p : r.positions) {
    if (p < 0 || p >= r.seq_len) {
      return absl::InvalidArgumentError(absl::StrCat("position ", p, " outside [0, seq_len = ", r.seq_len, ")"));
    }
  }
  scratch_.assign(r.positions.begin(), r.positions.end());
  std::sort(scratch_.begin(), scratch_.end());
  auto dup = std::adjacent_find(scratch_.begin(), scratch_.end());
  if (dup != scratch_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("position ", *dup, " selected twice"));
  }
  HS_RETURN_IF_ERROR(CheckHints(r));
  if (r.step != step_) {
    step_ = r.step;
    seen_.clear();
  }
  if (!seen_.emplace(r.layer, r.request).second) {
    return absl::InvalidArgumentError(
        absl::StrCat("(layer ", r.layer, ", request ", r.request, ") appears twice in step ", r.step));
  }
  return absl::OkStatus();
}

absl::Status TraceChecker::CheckHints(const TraceRecord& r) {
  if (r.hints.empty()) return absl::OkStatus();
  if (hints_ == 0) {
    return absl::InvalidArgumentError("hints in a version-1 trace (version 2 with a 'hints' header key has them)");
  }
  if (r.hints.size() > static_cast<size_t>(hints_)) {
    return absl::InvalidArgumentError(absl::StrCat(r.hints.size(), " hints, more than hints = ", hints_));
  }
  for (int32_t p : r.hints) {
    if (p < 0 || p >= r.seq_len) {
      return absl::InvalidArgumentError(absl::StrCat("hint ", p, " outside [0, seq_len = ", r.seq_len, ")"));
    }
  }
  hint_scratch_.assign(r.hints.begin(), r.hints.end());
  std::sort(hint_scratch_.begin(), hint_scratch_.end());
  auto dup = std::adjacent_find(hint_scratch_.begin(), hint_scratch_.end());
  if (dup != hint_scratch_.end()) return absl::InvalidArgumentError(absl::StrCat("hint ", *dup, " given twice"));
  for (int32_t p : hint_scratch_) {
    if (std::binary_search(scratch_.begin(), scratch_.end(), p)) {
      return absl::InvalidArgumentError(absl::StrCat("hint ", p, " is also selected"));
    }
  }
  return absl::OkStatus();
}

}  // namespace hisparse::trace
