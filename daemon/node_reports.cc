// NodeReports (node_reports.h): Stats; the listings, a page at a time — ListRequests (every
// admitted request, or one session's, orphaned durable ones too) and ListAdoptable (what ended
// sessions of the caller's tenant and engine name left); and the accounting invariants.
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/daemon/deferred_log.h"
#include "hisparse/daemon/group_requests.h"
#include "hisparse/daemon/node_reports.h"
#include "hisparse/daemon/request_journal.h"
#include "hisparse/daemon/shared_prefixes.h"
#include "hisparse/v1/arena_kind.h"

namespace hisparse {

namespace {

// A page token is "SESSION_ID:REQUEST_ID", the last request of the page before (ListAdoptable:
// the ended session's id).
std::string PageToken(uint64_t session_id, uint64_t request_id) { return absl::StrCat(session_id, ":", request_id); }

absl::StatusOr<std::pair<uint64_t, uint64_t>> ParsePageToken(const std::string& token) {
  std::pair<uint64_t, uint64_t> after{0, 0};
  if (token.empty()) return after;
  const std::vector<absl::string_view> parts = absl::StrSplit(token, ':');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &after.first) || !absl::SimpleAtoi(parts[1], &after.second)) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token \"", absl::CHexEscape(token.substr(0, 64)), "\" is not one this daemon handed out"));
  }
  return after;
}

uint32_t PageSize(uint32_t asked) {
  return asked == 0 ? NodeReports::kDefaultPageSize : std::min<uint32_t>(asked, NodeReports::kMaxPageSize);
}

// The wire's word for a request's state (request_table.h).
v1::RequestState WireState(RequestState state) {
  switch (state) {
    case RequestState::kLive:
      return v1::REQUEST_STATE_LIVE;
    case RequestState::kParked:
      return v1::REQUEST_STATE_PARKED;
    case RequestState::kImporting:
      return v1::REQUEST_STATE_IMPORTING;
    case RequestState::kOrphaned:
      return v1::REQUEST_STATE_ORPHANED;
  }
  return v1::REQUEST_STATE_LIVE;
}

}  // namespace

NodeReports::NodeReports(SessionCore& core, const Durability& durability, const Imports& imports)
    : core_(core), durability_(durability), imports_(imports) {}

absl::StatusOr<v1::ListRequestsResponse> NodeReports::ListRequests(const v1::ListRequestsRequest& req,
                                                                   std::optional<uint32_t> only_uid) const {
  HS_ASSIGN_OR_RETURN(const auto after, ParsePageToken(req.page_token()));
  const uint32_t page_size = PageSize(req.page_size());
  const uint64_t session_id = req.session_id();
  NodeLock lock(core_);
  durability_.AssertHeld();
  // Orphans (ended sessions' durable requests, durability.cc) are listed under their ended
  // session's id, which no live session has.
  const auto find = [this](uint64_t sid) -> const Session* {
    core_.mu_.AssertHeld();
    durability_.AssertHeld();
    auto it = core_.sessions_.find(sid);
    if (it != core_.sessions_.end()) return it->second.get();
    auto oit = durability_.orphans().all().find(sid);
    return oit == durability_.orphans().all().end() ? nullptr : oit->second.get();
  };
  if (session_id != 0) {
    const Session* named = find(session_id);
    if (named == nullptr) return absl::NotFoundError(absl::StrCat("no session ", session_id));
    if (only_uid.has_value() && named->tenant_uid != *only_uid) {
      return absl::PermissionDeniedError(
          absl::StrCat("session ", session_id, " belongs to another tenant; only an admin may list it"));
    }
  }
  // Sessions (a tenant's own only, with `only_uid`) and their requests in id order, from just after
  // the token, until the page is full.
  std::vector<uint64_t> sids;
  const auto& live = core_.sessions_;
  for (const auto* map : {&live, &durability_.orphans().all()}) {
    for (const auto& [sid, s] : *map) {
      if (only_uid.has_value() && s->tenant_uid != *only_uid) continue;
      if ((session_id == 0 || sid == session_id) && sid >= after.first) sids.push_back(sid);
    }
  }
  std::sort(sids.begin(), sids.end());
  v1::ListRequestsResponse out;
  const absl::Time now = absl::Now();
  for (uint64_t sid : sids) {
    const Session& s = *find(sid);
    const absl::Time lease_now = core_.Now();
    std::vector<uint64_t> rids;
    for (const auto& [rid, r] : s.requests) {
      if (sid > after.first || rid > after.second) rids.push_back(rid);
    }
    std::sort(rids.begin(), rids.end());
    for (uint64_t rid : rids) {
      if (static_cast<uint32_t>(out.requests_size()) == page_size) {
        const v1::RequestInfo& last = out.requests(out.requests_size() - 1);
        out.set_next_page_token(PageToken(last.session_id(), last.request_id()));
        return out;
      }
      const Request& r = *s.requests.Find(rid);
      v1::RequestInfo* info = out.add_requests();
      info->set_session_id(sid);
      info->set_request_id(rid);
      info->set_row(r.row());
      info->set_capacity_tokens(r.capacity_tokens);
      info->set_host_bytes(r.PageCount() * core_.pool_->page_bytes());
      info->set_age_seconds(absl::ToDoubleSeconds(now - r.admitted_at));
      info->set_state(WireState(r.state()));
      info->set_shared_bytes(SharedPrefixes::SharedPagesOf(s, r) * core_.pool_->page_bytes());
      info->set_durable(r.lease_end > lease_now);
      info->set_lease_seconds_left(DurableRequests::LeaseLeft(r, lease_now));
      if (r.in_group) core_.groups_.FillInfo(s, r, info);  // tp_groups.h
    }
  }
  return out;
}

// Orphans of the caller's tenant and engine name, then their requests whose lease runs, in id
// order from just after the token, until the page is full: as ListRequests pages.
absl::StatusOr<v1::ListAdoptableResponse> NodeReports::ListAdoptable(const v1::ListAdoptableRequest& req) const {
  HS_ASSIGN_OR_RETURN(const auto after, ParsePageToken(req.page_token()));
  const uint32_t page_size = PageSize(req.page_size());
  NodeLock lock(core_);
  durability_.AssertHeld();
  HS_ASSIGN_OR_RETURN(const Session* found, core_.FindLocked(req.session()));
  const Session& me = *found;
  const absl::Time now = core_.Now();
  std::vector<uint64_t> ids;
  for (const auto& [id, o] : durability_.orphans().all()) {
    if (o->tenant_uid == me.tenant_uid && o->engine_name == me.engine_name && id >= after.first) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  v1::ListAdoptableResponse out;
  for (uint64_t id : ids) {
    const Session& o = *durability_.orphans().all().at(id);
    std::vector<uint64_t> rids;
    for (const auto& [rid, r] : o.requests) {
      if (r.lease_end > now && (id > after.first || rid > after.second)) rids.push_back(rid);
    }
    std::sort(rids.begin(), rids.end());
    for (uint64_t rid : rids) {
      if (static_cast<uint32_t>(out.requests_size()) == page_size) {
        const v1::AdoptableRequest& last = out.requests(out.requests_size() - 1);
        out.set_next_page_token(PageToken(last.dead_session_id(), last.request_id()));
        return out;
      }
      const Request& r = *o.requests.Find(rid);
      v1::AdoptableRequest* a = out.add_requests();
      a->set_dead_session_id(id);
      a->set_request_id(rid);
      a->set_lease_seconds_left(DurableRequests::LeaseLeft(r, now));
      a->set_capacity_tokens(r.capacity_tokens);
      a->set_host_bytes(r.PageCount() * core_.pool_->page_bytes());
    }
  }
  return out;
}

void NodeReports::FillHostPoolLocked(std::optional<uint32_t> only_uid, v1::HostPoolStats* hp) const {
  const PagePool::Stats ps = core_.pool_->GetStats();
  const uint64_t used = ps.pages_used * ps.page_bytes;
  hp->set_capacity_bytes(ps.budget_bytes);
  hp->set_used_bytes(used);
  hp->set_free_bytes(ps.budget_bytes - std::min(used, ps.budget_bytes));
  hp->set_fragmentation(used >= ps.budget_bytes ? 0.0
                                                : static_cast<double>(ps.pages_free * ps.page_bytes) /
                                                      static_cast<double>(ps.budget_bytes - used));
  hp->set_largest_free_run_bytes(ps.ready_bytes + ps.unallocated_bytes);
  hp->set_hugepages(ps.hugepages);
  hp->set_locked(ps.locked);
  hp->set_page_bytes(ps.page_bytes);
  hp->set_slab_bytes(ps.slab_bytes);
  hp->set_pages_used(ps.pages_used);
  hp->set_pages_free(ps.pages_free);
  hp->set_pages_reserved(ps.pages_reserved);
  hp->set_pages_shared(ps.pages_shared);
  hp->set_shared_bytes(ps.pages_shared * ps.page_bytes);
  hp->set_slabs(ps.slabs);
  hp->set_ready_slabs(ps.ready_slabs);
  hp->set_scrub_queue(ps.scrub_queue);
  hp->set_slabs_made_inline(ps.slabs_made_inline);
  if (only_uid.has_value()) {
    const PagePool::Retired mine = core_.pool_->RetiredOf(*only_uid);
    hp->set_retired_bytes(mine.bytes);
    hp->set_retired_slabs(mine.slabs);
  } else {
    hp->set_retired_bytes(ps.retired_bytes);
    hp->set_retired_slabs(ps.retired_slabs);
  }
  for (const auto& [owner, slabs] : core_.pool_->SlabsByOwner()) {
    if (core_.groups_.IsOwner(owner)) continue;  // in GroupStats.slabs
    if (!only_uid.has_value() ||
        (core_.sessions_.contains(owner) && core_.sessions_.at(owner)->tenant_uid == *only_uid)) {
      (*hp->mutable_slabs_by_session())[owner] = slabs;
    }
  }
}

void NodeReports::FillSessionsLocked(std::optional<uint32_t> only_uid, v1::StatsResponse* out,
                                     std::vector<std::pair<int, std::shared_ptr<const Arena>>>* counters) const {
  const uint64_t page_bytes = core_.pool_->page_bytes();
  uint32_t sessions = 0, requests = 0, parked = 0, importing = 0;
  for (const auto& [id, s] : core_.sessions_) {
    if (only_uid.has_value() && s->tenant_uid != *only_uid) continue;
    ++sessions;
    requests += static_cast<uint32_t>(s->requests.size());
    v1::SessionStats* ss = out->add_session_stats();
    ss->set_session_id(id);
    ss->set_engine_name(s->engine_name);
    *ss->mutable_geometry() = s->geometry;
    ss->set_requests(static_cast<uint32_t>(s->requests.size()));
    parked += static_cast<uint32_t>(s->requests.Count(RequestState::kParked));
    importing += static_cast<uint32_t>(s->requests.Count(RequestState::kImporting));
    ss->set_host_bytes(core_.ledger_.PagesOf(id) * page_bytes);  // distinct pages: shared ones once
    ss->set_arena_bytes(s->arena_bytes);
    ss->set_peer_pid(s->peer_pid);
    v1::SetArenaKind(s->arena->kind(), ss);
    counters->emplace_back(out->session_stats_size() - 1, s->arena);
  }
  out->set_sessions(sessions);
  out->set_requests(requests);
  out->set_parked_requests(parked);
  out->set_importing_requests(importing);
}

v1::StatsResponse NodeReports::Stats(std::optional<uint32_t> only_uid) const {
  v1::StatsResponse out;
  // Arenas' counters are read after the lock is dropped: a GPU arena's is a device copy, which may
  // wait on the GPU.
  std::vector<std::pair<int, std::shared_ptr<const Arena>>> counters;
  {
    NodeLock lock(core_);
    out.set_version(core_.options_.version);
    out.set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - core_.start_time_));
    out.set_device(std::string(DeviceKindName(core_.options_.device)));
    FillHostPoolLocked(only_uid, out.mutable_host_pool());
    out.set_admissions(core_.admissions_);
    out.set_rejections(core_.rejections_);
    out.set_draining(core_.draining_);
    out.set_evictions(core_.evictions_);
    out.set_undelivered_notices(core_.undelivered_notices_);
    for (const auto& [reason, count] : core_.rejections_by_reason_) {
      v1::RejectionCount* rc = out.add_rejections_by_reason();
      rc->set_reason(reason);
      rc->set_count(count);
    }
    for (const auto& [device, bytes] : core_.arena_bytes_by_device_)
      (*out.mutable_arena_bytes_by_device())[device] = bytes;
    out.set_arena_budget_bytes(core_.options_.arena_budget_bytes);
    FillSessionsLocked(only_uid, &out, &counters);
    imports_.AssertHeld();
    durability_.AssertHeld();
    imports_.FillStatsLocked(&out);
    durability_.FillStatsLocked(only_uid, &out);
    GroupRequests::FillStatsLocked(core_, only_uid, &out);
  }
  if (core_.options_.journal != nullptr)
    FillRestartStats(*core_.options_.journal, out.mutable_restart());  // request_journaling.cc
  // Without stopping the engine: the kernels' atomics land in device memory, and a copy of it
  // sees them as of some recent point, which is all stats need.
  for (const auto& [index, arena] : counters) {
    ArenaCounters c{};
    absl::Status st = arena->ReadCounters(&c);
    if (!st.ok()) {
      LOCKED_LOG(WARNING) << "reading a slot arena's counters: " << st;
      continue;
    }
    v1::SessionStats* ss = out.mutable_session_stats(index);
    ss->set_hits(c.hits);
    ss->set_misses(c.misses);
    ss->set_bytes_fetched(c.bytes_fetched);
    ss->set_rejected(c.rejected);
  }
  return out;
}

absl::Status NodeReports::CheckInvariants() const {
  NodeLock lock(core_);
  HS_RETURN_IF_ERROR(core_.pool_->CheckInvariants());
  HS_RETURN_IF_ERROR(core_.ledger_.CheckInvariants());
  absl::flat_hash_map<uint64_t, uint64_t> group_paid;  // session -> group pages it is charged for
  uint64_t live = 0;
  HS_RETURN_IF_ERROR(GroupRequests::CheckLocked(core_, &group_paid, &live));
  for (const auto& [id, s] : core_.sessions_) {
    // States, rows and the ledger: exact by construction (request_table.h), checked all the same.
    HS_RETURN_IF_ERROR(s->requests.CheckInvariants());
    for (const auto& [rid, r] : s->requests) {
      if (r.pages.size() != s->geometry.num_layers()) {
        return absl::InternalError(absl::StrCat("session ", id, " request ", rid, ": pages for ", r.pages.size(),
                                                " layers, the geometry has ", s->geometry.num_layers()));
      }
      for (const auto& layer : r.pages) {
        if (layer.size() != core_.PagesFor(*s, r.capacity_tokens)) {
          return absl::InternalError(absl::StrCat("session ", id, " request ", rid, ": a layer of ", layer.size(),
                                                  " pages for ", r.capacity_tokens, " tokens"));
        }
      }
    }
    // Distinct pages (a shared one once): the pool's count for the session and the ledger's, which
    // also charges the session the group pages it pays for.
    uint64_t pages = 0;
    HS_RETURN_IF_ERROR(SharedPrefixes::CheckLocked(core_, *s, &pages));
    const uint64_t paid = group_paid.contains(id) ? group_paid.at(id) : 0;
    if (core_.ledger_.PagesOf(id) != pages + paid || core_.pool_->PagesOf(id) != pages) {
      return absl::InternalError(absl::StrCat("session ", id, ": requests hold ", pages, " pages (and ", paid,
                                              " group pages charged), the ledger counts ", core_.ledger_.PagesOf(id),
                                              ", the pool ", core_.pool_->PagesOf(id)));
    }
    live += pages;
  }
  durability_.AssertHeld();
  HS_ASSIGN_OR_RETURN(const uint64_t orphaned, durability_.CheckOrphansLocked());
  live += orphaned;
  const PagePool::Stats ps = core_.pool_->GetStats();
  if (ps.pages_used != live || core_.ledger_.used_pages() != live) {
    return absl::InternalError(absl::StrCat("pool uses ", ps.pages_used, " pages, the ledger ",
                                            core_.ledger_.used_pages(), ", live requests ", live));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> NodeReports::RecordForTest(uint64_t session_id, uint64_t request_id, uint32_t layer,
                                                    uint32_t position) const {
  NodeLock lock(core_);
  auto it = core_.sessions_.find(session_id);
  if (it == core_.sessions_.end()) return absl::NotFoundError("no such session");
  const Session& s = *it->second;
  const Request* r = s.requests.Find(request_id);
  if (r == nullptr || layer >= r->pages.size() || position >= r->capacity_tokens) {
    return absl::InvalidArgumentError("no such request, layer or position");
  }
  const PagePool::Page& page = r->pages[layer][position / s.records_per_page];
  return core_.pool_->PageDataForTest(page) + uint64_t{position % s.records_per_page} * s.geometry.record_bytes();
}

}  // namespace hisparse
