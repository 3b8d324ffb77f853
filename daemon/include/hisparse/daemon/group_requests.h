// GroupRequests: one host copy of a request for every rank of a TP group (group_requests.cc says
// how): its pages, each rank's share and who is charged. A module over SessionCore (session_core.h)
// without state of its own; the groups and their membership are TpGroups' (tp_groups.h), kept in
// the core. Every function runs under the core's mutex.
#ifndef HISPARSE_DAEMON_GROUP_REQUESTS_H_
#define HISPARSE_DAEMON_GROUP_REQUESTS_H_

#include <cstdint>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/daemon/session_core.h"
#include "hisparse/v1/hisparse.pb.h"

namespace hisparse {

class GroupRequests {
 public:
  using Session = SessionEntry;
  using Request = RequestEntry;
  // Admit with AdmitRequest.group: reserve for every rank, or attach this rank's share.
  static SessionCore::AdmitOutcome AdmitLocked(SessionCore& core, Session& s, const v1::AdmitRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu_, core.ledger_mu_);
  // Extend of a group request: the first rank's grows the group's pages for every share (all or
  // nothing); a rank's Extend to the capacity the request has already answers its pages.
  static absl::StatusOr<v1::ExtendResponse> ExtendLocked(SessionCore& core, Session& s, Request& r,
                                                         const v1::ExtendRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu_, core.ledger_mu_);
  // Releases `s`'s share of a group request: its row, one reference to each page, the charge
  // passed to the next holder; the pages go with the last share.
  static void ReleaseShareLocked(SessionCore& core, Session& s, Request& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu_, core.ledger_mu_);
  // Pages of `r` that releasing it leaves held (shared with another request, or another rank).
  static uint64_t UnfreedPagesOfLocked(const SessionCore& core, const Session& s, const Request& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu_, core.ledger_mu_);
  // A dup of slab `slab` of the group of `s` (a member), as PagePool::DupSlabFd.
  static absl::StatusOr<UniqueFd> DupSlabLocked(const SessionCore& core, const Session& s, uint64_t slab,
                                                uint64_t* bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu_, core.ledger_mu_);
  // Stats' group figures: GroupStats, HostPoolStats.group_bytes, each member's SessionStats.group.
  static void FillStatsLocked(const SessionCore& core, std::optional<uint32_t> only_uid, v1::StatsResponse* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu_, core.ledger_mu_);
  // The group half of CheckInvariants: members, shares, references and charges; `paid` receives
  // the group pages each session is charged for, `pages` the groups' distinct pages.
  static absl::Status CheckLocked(const SessionCore& core, absl::flat_hash_map<uint64_t, uint64_t>* paid,
                                  uint64_t* pages) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu_, core.ledger_mu_);
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_GROUP_REQUESTS_H_
