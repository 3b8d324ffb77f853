// Durability: leases, orphans, adoption (durability.h). Here the pool's side (pages released,
// slabs handed over); the orphans, limits, counters and policy are DurableRequests'
// (durable_requests.h). docs/DESIGN.md, "Durable requests".
//
// A lease is a time: SetLease (or AdmitRequest.lease_seconds) makes the request durable until now
// + lease_seconds, at most durability.max_lease_seconds; the engine renews it as it likes, and 0
// clears it. When a session ends, cleanly or by its engine's death, every request that is not
// durable then is released at once, as before; the durable ones are parked and move into an
// orphan: the ended session's requests, sharers, geometry, tenant and engine name under the same
// id, without arena, token, sink or rows. The orphan's slabs stay in the pool under that id
// (session ids are never reused, and no live session has it, so nobody can map them meanwhile),
// their idle ones retired as for any ended session. An orphan counts against its tenant's quotas
// in requests, pages and host bytes, but not in sessions, arena bytes or rows, and its requests
// are never eviction victims (their lease is a promise; the max lease and the quotas bound it).
// Orphans per tenant are capped too (durability.max_orphans_per_tenant, live): a session of a
// tenant that holds the cap already ends as one without durable requests would, releasing them
// (counted in Stats.orphans_refused); the orphans it has keep their promise.
//
// Adoption is per orphan, all of its requests at once: they share the orphan's slabs, so moving
// them together moves whole slabs (PagePool::HandOverSlabs) and no slab is ever split between two
// owners. The adopter must be of the same tenant (uid) and engine name, and of a geometry whose
// host layout is the same (num_layers, record_bytes, records per page) and whose page tables can
// hold every request; each request keeps its id (ALREADY_EXISTS when the adopter uses one) and
// its lease, and arrives parked: the engine Resumes it, which resets the new row (its old row's
// slot state died with the old arena, possibly mid-step), and the first RESOLVE fetches what it
// selects. The records themselves never moved, so decoding continues exactly.
//
// An importing request is never durable: a lease at Admit with begin_import is INVALID_ARGUMENT,
// SetLease on one FAILED_PRECONDITION (set it after CommitImport), so at the session's end an
// import is always aborted with it, as before. Nor is a TP-group request (its pages are the
// group's, owned by no session, so no adopter could take them over): a lease at Admit with group
// is INVALID_ARGUMENT, SetLease on one FAILED_PRECONDITION; a rank's end drops its share.
//
// Leases end by the clock (Options::clock): ExpireLeases, which the daemon runs periodically,
// releases what ran out; Adopt and ListAdoptable also skip (and Adopt first releases) requests
// whose lease has ended though the sweep has not run yet. Across the daemon's own restarts, durable
// requests are kept where the daemon runs under a service manager's fd store (request_journal.h,
// request_journaling.cc); without one, the daemon's end ends everything.
#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "hisparse/common/log.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/daemon/deferred_log.h"
#include "hisparse/daemon/durability.h"
#include "hisparse/daemon/shared_prefixes.h"

namespace hisparse {

Durability::Durability(SessionCore& core)
    : core_(core), durable_(core.options_.max_lease_seconds, core.options_.max_orphans_per_tenant) {}

absl::Status Durability::CheckLeaseLocked(uint32_t lease_seconds, bool importing) const {
  return durable_.CheckLease(lease_seconds, importing);
}

void Durability::SetMaxLeaseSeconds(uint32_t seconds) {
  NodeLock lock(core_);
  durable_.SetMaxLeaseSeconds(seconds);
}

void Durability::SetMaxOrphansPerTenant(uint32_t orphans) {
  NodeLock lock(core_);
  durable_.SetMaxOrphansPerTenant(orphans);
}

absl::StatusOr<v1::SetLeaseResponse> Durability::SetLease(const v1::SetLeaseRequest& req) {
  NodeLock lock(core_);
  HS_ASSIGN_OR_RETURN(Request * r, core_.FindRequestLocked(req.session(), req.request_id()));
  if (r->importing()) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", r->id,
                     " is importing: an importing request is never durable; set its lease after "
                     "CommitImport"));
  }
  if (r->in_group && req.lease_seconds() != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", r->id, " is a TP-group request: a group request is never durable"));
  }
  HS_RETURN_IF_ERROR(durable_.CheckLease(req.lease_seconds(), /*importing=*/false));
  const absl::Time now = core_.Now();
  r->lease_end = DurableRequests::LeaseEnd(now, req.lease_seconds());
  core_.TouchedLocked(*core_.sessions_.at(req.session().session_id()), *r);
  v1::SetLeaseResponse resp;
  resp.set_lease_seconds_left(DurableRequests::LeaseLeft(*r, now));
  return resp;
}

size_t Durability::EndSessionLocked(Session& dead, DeferredLog& log) {
  const absl::Time now = core_.Now();
  const auto durable = [now](const Request& r) { return DurableRequests::Durable(r, now); };
  bool keep_durable = true;
  if (std::any_of(dead.requests.begin(), dead.requests.end(),
                  [&](const auto& entry) { return durable(entry.second); })) {
    if (absl::Status may = durable_.MayKeep(dead.tenant_uid); !may.ok()) {
      keep_durable = false;
      DEFERRED_LOG(log, WARNING) << "session " << dead.id << " of uid " << dead.tenant_uid
                                 << " ended with durable requests, but " << may.message() << ": released them";
    }
  }
  size_t released = 0;
  for (uint64_t id : dead.requests.Ids()) {
    Request& r = *dead.requests.Find(id);
    if (keep_durable && durable(r)) continue;
    core_.ReleaseRequestLocked(dead, r);  // a page it shared passes its charge on to the next holder
    ++released;
  }
  core_.pool_->RetireIdleOf(dead.id);
  if (dead.requests.empty()) {
    dead.requests.Close();
    return released;
  }
  // Into an orphan of the same id (durable_requests.h). None is importing (durable() above), so
  // orphaning cannot fail.
  const size_t kept = dead.requests.size();
  if (absl::Status st = durable_.Keep(dead); !st.ok()) LOCKED_LOG(ERROR) << "accounting error: " << st;
  DEFERRED_LOG(log, INFO) << "session " << dead.id << " ended with " << kept
                          << " durable requests: kept, parked, for a session of uid " << dead.tenant_uid << " ("
                          << dead.engine_name << ") to adopt";
  return released;
}

size_t Durability::ExpireOrphanLocked(uint64_t orphan_id, absl::Time now) {
  Session* found = durable_.Find(orphan_id);
  if (found == nullptr) return 0;
  Session& o = *found;
  size_t released = 0;
  for (uint64_t id : o.requests.Ids()) {
    Request& r = *o.requests.Find(id);
    if (r.lease_end > now) continue;
    core_.ReleaseRequestLocked(o, r);
    ++released;
  }
  durable_.CountExpiries(released);
  core_.pool_->RetireIdleOf(orphan_id);  // slabs it emptied leave it (dropped outside the lock)
  if (o.requests.empty()) {
    o.requests.Close();
    durable_.Forget(orphan_id);
  }
  return released;
}

size_t Durability::ExpireLeases() {
  DeferredLog log;  // written once the lock is released
  NodeLock lock(core_);
  const absl::Time now = core_.Now();
  size_t released = 0;
  for (uint64_t id : durable_.Ids()) released += ExpireOrphanLocked(id, now);
  if (released != 0) DEFERRED_LOG(log, INFO) << "leases ended: released " << released << " orphaned durable requests";
  return released;
}

absl::StatusOr<v1::AdoptResponse> Durability::Adopt(const v1::AdoptRequest& req) {
  DeferredLog log;  // written once the lock is released
  NodeLock lock(core_);
  HS_ASSIGN_OR_RETURN(Session * me, core_.FindLocked(req.session()));
  const uint64_t orphan_id = req.dead_session_id();
  const Session* found = durable_.Find(orphan_id);
  if (found == nullptr) {
    return absl::NotFoundError(absl::StrCat("no ended session ", orphan_id, " holds a durable request"));
  }
  const Session& o = *found;
  if (o.tenant_uid != me->tenant_uid) {
    return absl::PermissionDeniedError(absl::StrCat("ended session ", orphan_id, " belongs to another tenant"));
  }
  if (o.engine_name != me->engine_name) {
    return absl::PermissionDeniedError(absl::StrCat("ended session ", orphan_id, " was engine \"", o.engine_name,
                                                    "\", not \"", me->engine_name, "\""));
  }
  // What has run out by now is released first (the sweep may not have come yet): it is not the
  // adopter's to have, and a refusal below must not count it.
  const absl::Time now = core_.Now();
  ExpireOrphanLocked(orphan_id, now);
  if (!durable_.contains(orphan_id)) {
    return absl::NotFoundError(absl::StrCat("every lease of ended session ", orphan_id, " has ended"));
  }
  HS_RETURN_IF_ERROR(DurableRequests::CheckAdopt(*me, *durable_.Find(orphan_id), core_.draining_));
  std::unique_ptr<Session> orphan = durable_.Take(orphan_id);
  absl::StatusOr<uint32_t> slabs = core_.pool_->HandOverSlabs(orphan_id, me->id);
  if (!slabs.ok())
    LOCKED_LOG(ERROR) << "accounting error adopting ended session " << orphan_id << ": " << slabs.status();
  // Pages of different slabs: the sharers maps never collide.
  me->sharers.Merge(orphan->sharers);
  std::vector<uint64_t> rids = orphan->requests.Ids();
  std::sort(rids.begin(), rids.end());
  // kOrphaned -> kParked here, and in the ledger; CheckAdopt found every id free.
  if (absl::Status st = me->requests.AdoptFrom(orphan->requests); !st.ok())
    LOCKED_LOG(ERROR) << "accounting error: " << st;
  v1::AdoptResponse resp;
  for (uint64_t rid : rids) {
    const Request& r = *me->requests.Find(rid);
    core_.LeftLocked(orphan_id, rid);  // its Forget there, its Put here
    core_.TouchedLocked(*me, r);
    v1::AdoptedRequest* a = resp.add_requests();
    a->set_request_id(rid);
    a->set_capacity_tokens(r.capacity_tokens);
    a->set_lease_seconds_left(DurableRequests::LeaseLeft(r, now));
    core_.FillLayers(*me, r, a->mutable_layers());
  }
  DEFERRED_LOG(log, INFO) << "session " << me->id << " adopted " << rids.size() << " durable requests of ended session "
                          << orphan_id << " (" << slabs.value_or(0) << " slabs)";
  return resp;
}

absl::StatusOr<v1::EvictResponse> Durability::EvictOrphanLocked(const v1::EvictRequest& req,
                                                                std::optional<uint32_t> only_uid, DeferredLog& log) {
  Session& o = *durable_.Find(req.session_id());  // the caller found it
  if (only_uid.has_value() && o.tenant_uid != *only_uid) {
    return absl::PermissionDeniedError(
        absl::StrCat("session ", req.session_id(), " belongs to another tenant; only an admin may evict from it"));
  }
  Request* r = o.requests.Find(req.request_id());
  if (r == nullptr) {
    return absl::NotFoundError(absl::StrCat("no request ", req.request_id(), " in session ", req.session_id()));
  }
  const uint64_t freed = (r->PageCount() - SharedPrefixes::SharedPagesOf(o, *r)) * core_.pool_->page_bytes();
  core_.ReleaseRequestLocked(o, *r);
  ++core_.evictions_;
  core_.pool_->RetireIdleOf(o.id);
  DEFERRED_LOG(log, INFO) << "evicted orphaned durable request " << req.request_id() << " of ended session " << o.id
                          << " (" << freed << " bytes; "
                          << (req.reason().empty() ? "evicted by an operator" : req.reason()) << ")";
  if (o.requests.empty()) {
    const uint64_t orphan_id = o.id;
    o.requests.Close();
    durable_.Forget(orphan_id);
  }
  v1::EvictResponse resp;
  resp.set_freed_bytes(freed);
  return resp;
}

absl::StatusOr<uint64_t> Durability::CheckOrphansLocked() const {
  uint64_t total = 0;
  for (const auto& [id, o] : durable_.all()) {
    if (core_.sessions_.contains(id))
      return absl::InternalError(absl::StrCat("orphan ", id, " is also a live session"));
    if (!core_.ledger_.IsOrphan(id))
      return absl::InternalError(absl::StrCat("orphan ", id, " is not one in the ledger"));
    if (o->requests.empty()) return absl::InternalError(absl::StrCat("orphan ", id, " holds no request"));
    // Every request kOrphaned, none holding a row, as the ledger says: request_table.h.
    HS_RETURN_IF_ERROR(o->requests.CheckInvariants());
    uint64_t pages = 0;
    HS_RETURN_IF_ERROR(SharedPrefixes::CheckLocked(core_, *o, &pages));
    if (core_.ledger_.PagesOf(id) != pages || core_.pool_->PagesOf(id) != pages) {
      return absl::InternalError(absl::StrCat("orphan ", id, ": requests hold ", pages, " pages, the ledger counts ",
                                              core_.ledger_.PagesOf(id), ", the pool ", core_.pool_->PagesOf(id)));
    }
    total += pages;
  }
  return total;
}

void Durability::FillStatsLocked(std::optional<uint32_t> only_uid, v1::StatsResponse* out) const {
  const absl::Time now = core_.Now();
  uint32_t durable = 0;
  for (const auto& [id, s] : core_.sessions_) {
    if (only_uid.has_value() && s->tenant_uid != *only_uid) continue;
    for (const auto& [rid, r] : s->requests) durable += r.lease_end > now ? 1 : 0;
  }
  out->set_durable_requests(durable);
  durable_.FillStats(only_uid, core_.ledger_, out);
}

}  // namespace hisparse
