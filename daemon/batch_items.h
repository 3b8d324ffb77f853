// What every batched lifecycle call of SessionManager shares (batches.cc,
// batches.cc): the item-count check, an item's status on the wire, the duplicate
// check, and ALL_OR_NOTHING's answer for the items a failing one stopped. Internal to the daemon.
// Stateless but SeenIds, which one call owns and uses from one thread.
#ifndef HISPARSE_DAEMON_BATCH_ITEMS_H_
#define HISPARSE_DAEMON_BATCH_ITEMS_H_

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "hisparse/v1/hisparse.pb.h"

namespace hisparse::batch {

// 1..max entries in `field`, else InvalidArgument.
inline absl::Status CheckSize(int size, int max, const char* field) {
  if (size < 1 || size > max) {
    return absl::InvalidArgumentError(absl::StrCat(field, " must hold 1..", max, " entries, got ", size));
  }
  return absl::OkStatus();
}

// ALL_OR_NOTHING or PER_ITEM, else InvalidArgument.
inline absl::Status CheckMode(v1::BatchMode mode) {
  if (mode == v1::BATCH_MODE_ALL_OR_NOTHING || mode == v1::BATCH_MODE_PER_ITEM) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("mode must be BATCH_MODE_ALL_OR_NOTHING or BATCH_MODE_PER_ITEM, got ", mode));
}

inline void SetItemStatus(const absl::Status& status, v1::ItemStatus* out) {
  out->set_code(static_cast<int32_t>(status.code()));
  out->set_message(std::string(status.message()));
}

// What an item that ALL_OR_NOTHING did not keep says: undone (before the failing item `failed`)
// or not tried (after it).
inline absl::Status Aborted(int item, int failed, uint64_t failed_id, const char* undone) {
  return absl::AbortedError(absl::StrCat(item < failed ? undone : "not tried", ": items[", failed, "] (request ",
                                         failed_id, ") failed the batch"));
}

// The first index at which each request id appears; InvalidArgument for a later one.
class SeenIds {
 public:
  absl::Status Add(uint64_t request_id, int index) {
    auto [it, inserted] = first_.emplace(request_id, index);
    if (inserted) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("request_id ", request_id, " is named twice in this batch (items ",
                                                   it->second, " and ", index, ")"));
  }

 private:
  absl::flat_hash_map<uint64_t, int> first_;
};

}  // namespace hisparse::batch

#endif  // HISPARSE_DAEMON_BATCH_ITEMS_H_
