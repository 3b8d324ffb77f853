// Durability: requests that outlive their session (durability.cc and docs/DESIGN.md, "Durable
// requests"). A request whose lease runs when its session ends stays, parked, in an orphan until a
// session of the same tenant and engine name adopts it or the lease ends. A module over SessionCore
// (session_core.h); the orphans, limits and policy are DurableRequests' (durable_requests.h), which
// it keeps under the core's mutex. Codes: SetLease, ListAdoptable and Adopt in hisparse.proto.
#ifndef HISPARSE_DAEMON_DURABILITY_H_
#define HISPARSE_DAEMON_DURABILITY_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hisparse/daemon/deferred_log.h"
#include "hisparse/daemon/durable_requests.h"
#include "hisparse/daemon/session_core.h"
#include "hisparse/v1/hisparse.pb.h"

namespace hisparse {

class Durability {
 public:
  using Session = SessionEntry;
  using Request = RequestEntry;
  explicit Durability(SessionCore& core);
  // Every module shares the core's one mutex. A module that holds it and calls a *Locked function
  // here says so first (clang's analysis cannot see that two modules' cores are one object).
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK(core_.mu_, core_.ledger_mu_) {
    core_.mu_.AssertHeld();
    core_.ledger_mu_.AssertHeld();
  }
  // The same for the node's mutex held shared (a hot call).
  void AssertReaderHeld() const ABSL_ASSERT_SHARED_LOCK(core_.mu_) { core_.mu_.AssertReaderHeld(); }

  // durability.max_lease_seconds and max_orphans_per_tenant, live (SIGHUP): leases already granted
  // and orphans already kept stay.
  void SetMaxLeaseSeconds(uint32_t seconds) ABSL_LOCKS_EXCLUDED(core_.mu_);
  void SetMaxOrphansPerTenant(uint32_t orphans) ABSL_LOCKS_EXCLUDED(core_.mu_);
  absl::StatusOr<v1::SetLeaseResponse> SetLease(const v1::SetLeaseRequest& req) ABSL_LOCKS_EXCLUDED(core_.mu_);
  absl::StatusOr<v1::AdoptResponse> Adopt(const v1::AdoptRequest& req) ABSL_LOCKS_EXCLUDED(core_.mu_);
  // Releases every orphaned request whose lease has ended and forgets the orphans left empty;
  // returns how many.
  size_t ExpireLeases() ABSL_LOCKS_EXCLUDED(core_.mu_);
  // A lease an admission asks for: bad input, or beyond the limit.
  absl::Status CheckLeaseLocked(uint32_t lease_seconds, bool importing) const ABSL_SHARED_LOCKS_REQUIRED(core_.mu_);

  // A session that has ended (out of the core's sessions, its imports revoked): releases every
  // request that is not durable now (every one, when its tenant holds max_orphans_per_tenant
  // orphans already), then, when durable ones are left, parks them and moves them (with their
  // sharers) into a new orphan of the same id; else the session leaves the ledger. Returns the
  // requests released.
  size_t EndSessionLocked(Session& dead, DeferredLog& log) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_);
  // Releases the orphan's requests whose lease ended by `now` and forgets the orphan once empty.
  size_t ExpireOrphanLocked(uint64_t orphan_id, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_);
  // Evict of an orphaned request (an operator's, or its tenant's): released at once, nobody to tell.
  absl::StatusOr<v1::EvictResponse> EvictOrphanLocked(const v1::EvictRequest& req, std::optional<uint32_t> only_uid,
                                                      DeferredLog& log)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_);
  // CheckInvariants' part for orphans: ledger, pool and requests agree; returns their pages.
  absl::StatusOr<uint64_t> CheckOrphansLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_);
  // Stats' durable and orphan figures (of `only_uid`'s sessions alone, when set).
  void FillStatsLocked(std::optional<uint32_t> only_uid, v1::StatsResponse* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_);

  // The orphans themselves, for the listings and the journal.
  DurableRequests& orphans() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_) { return durable_; }
  const DurableRequests& orphans() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_) { return durable_; }

 private:
  SessionCore& core_;
  DurableRequests durable_ ABSL_GUARDED_BY(core_.mu_);
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_DURABILITY_H_
