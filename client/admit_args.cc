#include "admit_args.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace hisparse {
namespace {

constexpr uint32_t kKnownFlags = HS_ADMIT_GROUP | HS_ADMIT_IMPORT;

// Every contradiction of `a`, one phrase each.
std::vector<std::string> Contradictions(const hs_admit_args& a) {
  std::vector<std::string> why;
  const bool parent = a.parent_request_id != 0;
  const bool group = (a.flags & HS_ADMIT_GROUP) != 0;
  const bool import = (a.flags & HS_ADMIT_IMPORT) != 0;
  if ((a.flags & ~kKnownFlags) != 0) {
    why.push_back(
        absl::StrCat("flags 0x", absl::Hex(a.flags), " has unknown bits (known: HS_ADMIT_GROUP, HS_ADMIT_IMPORT)"));
  }
  if (parent && a.prefix_tokens == 0)
    why.push_back("parent_request_id without prefix_tokens (a shared prefix needs both)");
  if (!parent && a.prefix_tokens != 0)
    why.push_back("prefix_tokens without parent_request_id (a shared prefix needs both)");
  if (group && parent) why.push_back("HS_ADMIT_GROUP with parent_request_id (a group request shares no prefix)");
  if (group && a.lease_seconds != 0)
    why.push_back("HS_ADMIT_GROUP with lease_seconds (a group request is never durable)");
  if (group && import) why.push_back("HS_ADMIT_GROUP with HS_ADMIT_IMPORT (a group request is never imported)");
  if (import && parent) why.push_back("HS_ADMIT_IMPORT with parent_request_id (an import writes every record)");
  if (import && a.lease_seconds != 0) {
    why.push_back(
        "HS_ADMIT_IMPORT with lease_seconds (an importing request is never durable: set the lease after "
        "hs_await_import)");
  }
  return why;
}

}  // namespace

absl::Status CheckAdmitArgs(const hs_admit_args& a) {
  const std::vector<std::string> why = Contradictions(a);
  if (why.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("admit request ", a.request_id, ": ", absl::StrJoin(why, "; ")));
}

absl::Status CheckBatchAdmitArgs(const hs_admit_args& a, size_t index) {
  std::vector<std::string> why = Contradictions(a);
  if (a.parent_request_id != 0 || a.prefix_tokens != 0) {
    why.push_back(
        "parent_request_id / prefix_tokens in a batch (the daemon's batch admits no shared prefix: use hs_admit2)");
  }
  if ((a.flags & HS_ADMIT_GROUP) != 0) {
    why.push_back("HS_ADMIT_GROUP in a batch (the daemon's batch admits no group request: use hs_admit2)");
  }
  if (why.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("items[", index, "] (request ", a.request_id, "): ", absl::StrJoin(why, "; ")));
}

}  // namespace hisparse
