// DurableRequests: leases and the orphans that keep durable requests past their session's end
// (docs/DESIGN.md, "Durable requests"; durability.cc, the Durability module, is the pool's side of it).
//
// A lease is a time: a request is durable while the clock is before its lease_end, set by
// SetLease or AdmitRequest.lease_seconds, at most max_lease_seconds ahead. When a session ends,
// its durable requests (never an importing one, nor a TP-group share) move into an orphan: a
// SessionEntry under the ended session's id, without arena, token, sink or rows, every request
// kOrphaned (request_table.h). A tenant keeps at most max_orphans_per_tenant orphans (0: no cap);
// a session of a tenant at the cap ends as one without durable requests would, counted as a
// refusal. This class holds the orphans, the limits and the counters, and decides what is plain
// policy (lease bounds, the cap, whether an adopter fits); releasing pages and moving slabs stay
// with the manager, which owns the pool.
//
// Not thread-safe: SessionManager calls it under its mutex.
#ifndef HISPARSE_DAEMON_DURABLE_REQUESTS_H_
#define HISPARSE_DAEMON_DURABLE_REQUESTS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "hisparse/daemon/admission_ledger.h"
#include "hisparse/daemon/request_table.h"
#include "hisparse/daemon/session_entry.h"
#include "hisparse/v1/hisparse.pb.h"

namespace hisparse {

class DurableRequests {
 public:
  using Orphans = absl::flat_hash_map<uint64_t, std::unique_ptr<SessionEntry>>;

  // durability.max_lease_seconds (0: no durable requests) and durability.max_orphans_per_tenant.
  DurableRequests(uint32_t max_lease_seconds, uint32_t max_orphans_per_tenant)
      : max_lease_seconds_(max_lease_seconds), max_orphans_per_tenant_(max_orphans_per_tenant) {}

  // ---- Leases ----
  // Live (SIGHUP): a lower max bounds later leases only; a lower cap applies to sessions that end
  // from now on.
  void SetMaxLeaseSeconds(uint32_t seconds) { max_lease_seconds_ = seconds; }
  void SetMaxOrphansPerTenant(uint32_t orphans) { max_orphans_per_tenant_ = orphans; }
  // OK for 0; else INVALID_ARGUMENT for an importing request or one above the max,
  // FAILED_PRECONDITION while durable requests are off.
  absl::Status CheckLease(uint32_t lease_seconds, bool importing) const;
  // The lease_end of a lease of `lease_seconds` taken at `now` (0: none).
  static absl::Time LeaseEnd(absl::Time now, uint32_t lease_seconds);
  static double LeaseLeft(const RequestEntry& r, absl::Time now);
  // Whether `r` outlives its session's end at `now`: its lease runs and it is not importing.
  static bool Durable(const RequestEntry& r, absl::Time now) { return !r.importing() && r.lease_end > now; }

  // ---- Orphans ----
  // Whether a session of `tenant` that ends now with durable requests may keep them as an orphan.
  // At the cap: RESOURCE_EXHAUSTED saying so, counted in orphans_refused().
  absl::Status MayKeep(uint32_t tenant);
  // Moves `dead`'s requests (every one durable) and sharers into a new orphan of the same id,
  // every request kOrphaned (RequestTable::Orphan); `dead` keeps its arena and sink for the caller.
  absl::Status Keep(SessionEntry& dead);
  SessionEntry* Find(uint64_t id);
  bool contains(uint64_t id) const { return orphans_.contains(id); }
  const Orphans& all() const { return orphans_; }
  std::vector<uint64_t> Ids() const;
  // The orphan, out of this set (adoption); null when there is none.
  std::unique_ptr<SessionEntry> Take(uint64_t id);
  // Forgets an orphan that holds nothing any more (its table closed by the caller).
  void Forget(uint64_t id) { orphans_.erase(id); }
  // Adopt's checks of the adopter against the orphan, after the tenant's and engine name's: the
  // host layout (num_layers, record_bytes, records per page), draining, each request's pages
  // against the adopter's page tables, and its id free there. OK, or the refusal.
  static absl::Status CheckAdopt(const SessionEntry& adopter, const SessionEntry& orphan, bool draining);

  // ---- Figures ----
  void CountExpiries(uint64_t released) { lease_expiries_ += released; }
  uint64_t lease_expiries() const { return lease_expiries_; }
  uint64_t orphans_refused() const { return orphans_refused_; }
  // Stats' orphan figures (of `only_uid`'s orphans alone, when set), the ledger's distinct pages
  // each, and the counters. The live sessions' durable_requests are the caller's.
  void FillStats(std::optional<uint32_t> only_uid, const AdmissionLedger& ledger, v1::StatsResponse* out) const;

 private:
  uint32_t max_lease_seconds_;
  uint32_t max_orphans_per_tenant_;
  // Ended sessions that keep durable requests, by the ended session's id. Their slabs stay under
  // that id in the pool until adopted (PagePool::HandOverSlabs) or emptied.
  Orphans orphans_;
  uint64_t lease_expiries_ = 0;
  uint64_t orphans_refused_ = 0;  // ends over max_orphans_per_tenant, since start
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_DURABLE_REQUESTS_H_
