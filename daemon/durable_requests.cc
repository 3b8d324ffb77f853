// Leases and orphans: see durable_requests.h.
#include "hisparse/daemon/durable_requests.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace hisparse {

absl::Status DurableRequests::CheckLease(uint32_t lease_seconds, bool importing) const {
  if (lease_seconds == 0) return absl::OkStatus();
  if (importing) {
    return absl::InvalidArgumentError(
        "lease_seconds with begin_import: an importing request is never durable (SetLease after CommitImport)");
  }
  if (max_lease_seconds_ == 0) {
    return absl::FailedPreconditionError("durable requests are off (durability.max_lease_seconds is 0)");
  }
  if (lease_seconds > max_lease_seconds_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lease_seconds (", lease_seconds, ") exceeds durability.max_lease_seconds (", max_lease_seconds_, ")"));
  }
  return absl::OkStatus();
}

absl::Time DurableRequests::LeaseEnd(absl::Time now, uint32_t lease_seconds) {
  return lease_seconds == 0 ? absl::InfinitePast() : now + absl::Seconds(lease_seconds);
}

double DurableRequests::LeaseLeft(const RequestEntry& r, absl::Time now) {
  return r.lease_end > now ? absl::ToDoubleSeconds(r.lease_end - now) : 0.0;
}

absl::Status DurableRequests::MayKeep(uint32_t tenant) {
  const uint32_t cap = max_orphans_per_tenant_;
  if (cap == 0) return absl::OkStatus();
  const auto held = std::count_if(orphans_.begin(), orphans_.end(),
                                  [&](const auto& entry) { return entry.second->tenant_uid == tenant; });
  if (static_cast<uint64_t>(held) < cap) return absl::OkStatus();
  ++orphans_refused_;
  return absl::ResourceExhaustedError(
      absl::StrCat("the tenant holds ", held, " orphans (durability.max_orphans_per_tenant ", cap, ")"));
}

absl::Status DurableRequests::Keep(SessionEntry& dead) {
  auto orphan = std::make_unique<SessionEntry>();
  orphan->id = dead.id;
  orphan->engine_name = dead.engine_name;
  orphan->geometry = dead.geometry;
  orphan->records_per_page = dead.records_per_page;
  orphan->pages_per_entry = dead.pages_per_entry;
  orphan->peer_pid = dead.peer_pid;
  orphan->tenant_uid = dead.tenant_uid;
  orphan->imports_closed = true;
  orphan->requests = std::move(dead.requests);
  orphan->sharers.Merge(dead.sharers);
  // kLive or kParked -> kOrphaned, and in the ledger: arena and session count returned. Kept
  // (its requests are the ledger's) even when one is refused, for the invariant checks to see.
  absl::Status orphaned = orphan->requests.Orphan();
  orphans_.emplace(orphan->id, std::move(orphan));
  return orphaned;
}

SessionEntry* DurableRequests::Find(uint64_t id) {
  auto it = orphans_.find(id);
  return it == orphans_.end() ? nullptr : it->second.get();
}

std::vector<uint64_t> DurableRequests::Ids() const {
  std::vector<uint64_t> ids;
  ids.reserve(orphans_.size());
  for (const auto& [id, o] : orphans_) ids.push_back(id);
  return ids;
}

std::unique_ptr<SessionEntry> DurableRequests::Take(uint64_t id) {
  auto it = orphans_.find(id);
  if (it == orphans_.end()) return nullptr;
  std::unique_ptr<SessionEntry> orphan = std::move(it->second);
  orphans_.erase(it);
  return orphan;
}

absl::Status DurableRequests::CheckAdopt(const SessionEntry& adopter, const SessionEntry& orphan, bool draining) {
  const v1::Geometry& a = adopter.geometry;
  const v1::Geometry& o = orphan.geometry;
  if (a.num_layers() != o.num_layers() || a.record_bytes() != o.record_bytes() ||
      adopter.records_per_page != orphan.records_per_page) {
    return absl::FailedPreconditionError(
        absl::StrCat("geometry differs from ended session ", orphan.id, "'s: num_layers ", a.num_layers(), " vs ",
                     o.num_layers(), ", record_bytes ", a.record_bytes(), " vs ", o.record_bytes(),
                     ", records per page ", adopter.records_per_page, " vs ", orphan.records_per_page));
  }
  if (draining) return absl::FailedPreconditionError("the daemon is draining: no adoption");
  for (const auto& [rid, r] : orphan.requests) {
    if (!r.pages.empty() && r.pages[0].size() > adopter.pages_per_entry) {
      return absl::FailedPreconditionError(absl::StrCat("request ", rid, " holds ", r.pages[0].size(),
                                                        " pages a layer; this session's page tables hold ",
                                                        adopter.pages_per_entry, " (geometry.max_context_tokens)"));
    }
    if (adopter.requests.contains(rid)) {
      return absl::AlreadyExistsError(
          absl::StrCat("request ", rid, " of ended session ", orphan.id, " is already admitted in this session"));
    }
  }
  return absl::OkStatus();
}

void DurableRequests::FillStats(std::optional<uint32_t> only_uid, const AdmissionLedger& ledger,
                                v1::StatsResponse* out) const {
  uint32_t orphaned = 0;
  uint64_t bytes = 0;
  for (const auto& [id, o] : orphans_) {
    if (only_uid.has_value() && o->tenant_uid != *only_uid) continue;
    orphaned += static_cast<uint32_t>(o->requests.size());
    bytes += ledger.PagesOf(id) * ledger.page_bytes();  // distinct pages: a shared one once
  }
  out->set_orphaned_requests(orphaned);
  out->set_orphaned_bytes(bytes);
  out->set_lease_expiries(lease_expiries_);
  out->set_orphans_refused(orphans_refused_);
}

}  // namespace hisparse
