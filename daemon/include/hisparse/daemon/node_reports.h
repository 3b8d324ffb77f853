// NodeReports: what the node holds, read out — Stats, the request listings a page at a time, and
// the accounting invariants (node_reports.cc). Reads SessionCore (session_core.h), Durability's
// orphans and Imports' counts; changes nothing.
#ifndef HISPARSE_DAEMON_NODE_REPORTS_H_
#define HISPARSE_DAEMON_NODE_REPORTS_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "hisparse/daemon/durability.h"
#include "hisparse/daemon/imports.h"
#include "hisparse/daemon/session_core.h"
#include "hisparse/v1/hisparse.pb.h"

namespace hisparse {

class NodeReports {
 public:
  using Session = SessionEntry;
  using Request = RequestEntry;
  static constexpr uint32_t kDefaultPageSize = 1000;
  static constexpr uint32_t kMaxPageSize = 10000;
  NodeReports(SessionCore& core, const Durability& durability, const Imports& imports);

  // Node figures, and every session (only_uid unset: an admin's view) or only the sessions of
  // tenant `only_uid`; then `sessions` and `requests` count those alone, while the pool, arena
  // and admission counters stay the node's.
  v1::StatsResponse Stats(std::optional<uint32_t> only_uid) const ABSL_LOCKS_EXCLUDED(core_.mu_);
  // Requests in (session_id, request_id) order, orphaned durable ones too, one page at a time: at
  // most page_size (0: kDefaultPageSize; above kMaxPageSize: kMaxPageSize), after page_token. With
  // `only_uid` set, only that tenant's, and a session of another tenant is PermissionDenied.
  absl::StatusOr<v1::ListRequestsResponse> ListRequests(const v1::ListRequestsRequest& req,
                                                        std::optional<uint32_t> only_uid) const
      ABSL_LOCKS_EXCLUDED(core_.mu_);
  // What ended sessions of the caller's tenant and engine name left, adoptable.
  absl::StatusOr<v1::ListAdoptableResponse> ListAdoptable(const v1::ListAdoptableRequest& req) const
      ABSL_LOCKS_EXCLUDED(core_.mu_);
  // Accounting invariants, exact: the pool's and the ledger's own; pool used pages == the
  // ledger's == the distinct pages of every request; each page's reference count == the requests
  // of its session that hold it; a shared page's holders are the session's sharers list, the
  // first of which is charged for it; each request's row (none when parked) is the ledger's;
  // each session's pages in the pool are the ledger's count for it.
  absl::Status CheckInvariants() const ABSL_LOCKS_EXCLUDED(core_.mu_);
  // The daemon's mapping of the record of (request, layer, position) of a session, for tests.
  absl::StatusOr<uint8_t*> RecordForTest(uint64_t session_id, uint64_t request_id, uint32_t layer,
                                         uint32_t position) const ABSL_LOCKS_EXCLUDED(core_.mu_);

 private:
  // Stats' parts: the host pool (slabs and retired bytes of only_uid's sessions alone, when set),
  // and the sessions with their requests (each arena whose counters Stats reads after the lock, by
  // its index in session_stats, into *counters).
  void FillHostPoolLocked(std::optional<uint32_t> only_uid, v1::HostPoolStats* hp) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_);
  void FillSessionsLocked(std::optional<uint32_t> only_uid, v1::StatsResponse* out,
                          std::vector<std::pair<int, std::shared_ptr<const Arena>>>* counters) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_);

  SessionCore& core_;
  const Durability& durability_;
  const Imports& imports_;
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_NODE_REPORTS_H_
