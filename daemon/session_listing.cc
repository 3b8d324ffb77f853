// SessionManager's listings, a page at a time: ListRequests (every admitted request, or one
// session's, orphaned durable ones too) and ListAdoptable (what ended sessions of the caller's
// tenant and engine name left). Part of SessionManager (session_manager.h).
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
#include "hisparse/daemon/session_manager.h"

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
  return asked == 0 ? SessionManager::kDefaultPageSize : std::min<uint32_t>(asked, SessionManager::kMaxPageSize);
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

absl::StatusOr<v1::ListRequestsResponse> SessionManager::ListRequests(const v1::ListRequestsRequest& req,
                                                                      std::optional<uint32_t> only_uid) const {
  HS_ASSIGN_OR_RETURN(const auto after, ParsePageToken(req.page_token()));
  const uint32_t page_size = PageSize(req.page_size());
  const uint64_t session_id = req.session_id();
  absl::MutexLock lock(&mu_);
  // Orphans (ended sessions' durable requests, session_durable.cc) are listed under their ended
  // session's id, which no live session has.
  const auto find = [this](uint64_t sid) -> const Session* {
    mu_.AssertHeld();
    auto it = sessions_.find(sid);
    if (it != sessions_.end()) return it->second.get();
    auto oit = durable_.all().find(sid);
    return oit == durable_.all().end() ? nullptr : oit->second.get();
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
  for (const auto* map : {&sessions_, &durable_.all()}) {
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
    const absl::Time lease_now = Now();
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
      info->set_host_bytes(r.PageCount() * pool_->page_bytes());
      info->set_age_seconds(absl::ToDoubleSeconds(now - r.admitted_at));
      info->set_state(WireState(r.state()));
      info->set_shared_bytes(SharedPagesOf(s, r) * pool_->page_bytes());
      info->set_durable(r.lease_end > lease_now);
      info->set_lease_seconds_left(DurableRequests::LeaseLeft(r, lease_now));
      if (r.in_group) groups_.FillInfo(s, r, info);  // tp_groups.h
    }
  }
  return out;
}

// Orphans of the caller's tenant and engine name, then their requests whose lease runs, in id
// order from just after the token, until the page is full: as ListRequests pages.
absl::StatusOr<v1::ListAdoptableResponse> SessionManager::ListAdoptable(const v1::ListAdoptableRequest& req) {
  HS_ASSIGN_OR_RETURN(const auto after, ParsePageToken(req.page_token()));
  const uint32_t page_size = PageSize(req.page_size());
  absl::MutexLock lock(&mu_);
  HS_ASSIGN_OR_RETURN(const Session* found, FindLocked(req.session()));
  const Session& me = *found;
  const absl::Time now = Now();
  std::vector<uint64_t> ids;
  for (const auto& [id, o] : durable_.all()) {
    if (o->tenant_uid == me.tenant_uid && o->engine_name == me.engine_name && id >= after.first) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  v1::ListAdoptableResponse out;
  for (uint64_t id : ids) {
    const Session& o = *durable_.all().at(id);
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
      a->set_host_bytes(r.PageCount() * pool_->page_bytes());
    }
  }
  return out;
}

}  // namespace hisparse
