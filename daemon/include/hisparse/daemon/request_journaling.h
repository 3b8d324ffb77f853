// RequestJournaling: durable requests across the daemon's restarts (request_journaling.cc and
// docs/DESIGN.md, "Restarts without loss"). It hears of every change to a request that may be
// durable (SessionCore's RequestChanges), decides under the core's lock a record per touched
// request (a Put when it is durable, a Forget when the journal held it and it is not), and commits
// them to the RequestJournal (request_journal.h) after the lock. At start it restores what a former
// life journaled as orphans (Durability's).
#ifndef HISPARSE_DAEMON_REQUEST_JOURNALING_H_
#define HISPARSE_DAEMON_REQUEST_JOURNALING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "hisparse/daemon/durability.h"
#include "hisparse/daemon/request_journal.h"
#include "hisparse/daemon/session_core.h"

namespace hisparse {

class RequestJournaling final : public RequestChanges {
 public:
  // `journal` (not owned) null: every call is a no-op.
  RequestJournaling(SessionCore& core, Durability& durability, RequestJournal* journal);

  // RequestChanges, under the core's mutex (shared, for a hot call).
  void TouchedLocked(const SessionEntry& s, const RequestEntry& r) override;
  void LeftLocked(uint64_t session_id, uint64_t request_id) override;

  // Commits what this thread's call decided (and waits for what other calls decided before):
  // every public call that can change a durable request runs it as it returns.
  void Flush() ABSL_LOCKS_EXCLUDED(core_.mu_);
  // At start, before any session: every durable request a former life journaled (validated by
  // PlanRecovery, its slabs already in the pool) becomes an orphan of its old session again.
  // Sessions of a tenant beyond max_orphans_per_tenant are released. Returns the requests restored.
  absl::StatusOr<size_t> RestoreOrphans(const std::vector<journal::Put>& puts) ABSL_LOCKS_EXCLUDED(core_.mu_);

 private:
  // The records for the touched requests, and the new slabs they reference.
  JournalBatch DecideLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_, mu_);

  SessionCore& core_;
  Durability& durability_;
  RequestJournal* const journal_;
  // Its own, last in the order (session_core.h, "Locks"): hot calls touch requests under the
  // node's mutex held shared.
  absl::Mutex mu_ ABSL_ACQUIRED_AFTER(core_.ledger_mu_);
  // Requests touched since the last decision, those the journal holds, the records' sequence.
  std::vector<JournalKey> touched_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<JournalKey> journaled_ ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<bool> pending_{false};  // !touched_.empty(), readable without the lock
  std::atomic<uint64_t> decided_{0};  // the ticket of the newest batch decided
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_REQUEST_JOURNALING_H_
