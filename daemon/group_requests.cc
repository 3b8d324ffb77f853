// GroupRequests: one host copy of a request for every rank of a TP group (group_requests.h):
// group requests' pages, shares and charges; the groups and their membership are TpGroups'
// (tp_groups.h). docs/DESIGN.md, "TP groups".
//
// The models hisparse serves (MLA: DeepSeek DSA, GLM-5) replicate the latent KV record on every
// TP rank, so plain TP keeps world_size identical host copies. A group removes them: sessions of
// one tenant join a group at OpenSession (name, rank, size), and a request admitted with
// AdmitRequest.group has ONE set of pages, owned in the pool by the group (TpGroup::owner, an id of
// the session counter, so never a session's), and a row in EVERY member's session. A name is its
// tenant's own: groups are keyed by (uid, name), so a session joins only a group of its own uid,
// and no other uid can take (squat) the name a tenant's TP engine will use.
//
// Admission: the first rank to admit an id reserves it for all, all or nothing (every member's
// free row, the tenant's quota, the pool); each member gets a Request (its share) at once, marked
// not attached for the ranks that did not ask yet. Their own Admit of that id attaches: it answers
// the reserved row and the same pages. A call before every rank joined is FAILED_PRECONDITION.
// A group admission never evicts. Extend follows the same pattern: the first rank's grows the
// group's pages for every share, another rank's Extend to that capacity answers them.
//
// References and charges: each share holds one pool reference to each page, so a page's count is
// its holders and the pool's pages_shared counts group pages that serve several ranks. The tenant
// is charged the pages once: the first holder's share carries them (Request::charged_pages, the
// ledger's count), the others 0; a departing payer passes the charge to the next holder, as shared
// prefixes do. quotas.requests counts shares (a row each): a TP-8 group request counts 8.
//
// Release: each rank releases its own share (Release, eviction of that share, or its session's
// end); the pages go with the last share. The group ends with its last member; a rank freed by a
// dead session may be joined again, and the new session holds shares of later requests only.
//
// Writes: pages are writable from every rank. MLA ranks compute the same latent bytes, so every
// rank's append writing its newest record to the host page writes what the others write: each
// rank's RESOLVE reads exactly what it would read from pages of its own, and the data path is
// unchanged. A prefill may be stored by one rank only once the engine orders that store before
// the other ranks' first RESOLVE (TP engines do: a collective follows the prefill on every rank)
// and each rank appends the step's token before it (the newest token's slot is in its own arena).
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "hisparse/common/log.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/daemon/deferred_log.h"
#include "hisparse/daemon/group_requests.h"
#include "hisparse/daemon/shared_prefixes.h"

namespace hisparse {

SessionCore::AdmitOutcome GroupRequests::AdmitLocked(SessionCore& core, Session& s, const v1::AdmitRequest& req) {
  const uint64_t id = req.request_id();
  if (s.group.empty()) {
    return {absl::FailedPreconditionError(absl::StrCat(
        "session ", s.id, " is in no TP group (OpenSession.group): admit request ", id, " without group"))};
  }
  if (req.parent_request_id() != 0 || req.prefix_tokens() != 0 || req.begin_import()) {
    return {absl::InvalidArgumentError("a group admission takes no parent_request_id, prefix_tokens or begin_import")};
  }
  TpGroup& group = *core.groups_.Find(s);  // a member's: the group lives while it does
  const std::string name = absl::StrCat("group \"", s.group, "\"");
  if (Request* found = s.requests.Find(id); found != nullptr) {
    Request& r = *found;
    if (!r.in_group || r.attached) {
      return {absl::AlreadyExistsError(absl::StrCat("request ", id, " is already admitted in this session"))};
    }
    if (req.token_budget() != r.capacity_tokens) {
      return {absl::InvalidArgumentError(absl::StrCat("token_budget (", req.token_budget(), ") differs from ", name,
                                                      "'s reservation of request ", id, " (", r.capacity_tokens,
                                                      " tokens)"))};
    }
    r.attached = true;
    core.ledger_.Touch(s.id, id);
    return {core.AdmitAnswerLocked(s, r)};
  }
  if (group.requests.count(id) != 0) {
    return {absl::FailedPreconditionError(absl::StrCat(name, " holds request ", id, " without a row of rank ",
                                                       s.group_rank, " (released, or admitted before it joined)"))};
  }
  std::vector<std::string> missing;
  for (size_t rank = 0; rank < group.ranks.size(); ++rank) {
    if (group.ranks[rank] == 0) missing.push_back(absl::StrCat(rank));
  }
  if (!missing.empty()) {
    return {absl::FailedPreconditionError(absl::StrCat(name, " lacks rank(s) ", absl::StrJoin(missing, ", "), " of ",
                                                       group.ranks.size(),
                                                       ": every rank's session must be open to admit for the group"))};
  }
  // Every rank gets a share under this id: a rank whose session already uses it for a request of
  // its own (admitted without group) would be given a second request of that name.
  for (size_t rank = 0; rank < group.ranks.size(); ++rank) {
    if (core.sessions_.at(group.ranks[rank])->requests.contains(id)) {
      return {absl::AlreadyExistsError(absl::StrCat("request ", id, " is already admitted in rank ", rank,
                                                    "'s session ", group.ranks[rank], " (without group): ", name,
                                                    " cannot reserve it for every rank; nothing was reserved"))};
    }
  }
  const uint32_t size = static_cast<uint32_t>(group.ranks.size());
  const uint64_t per_layer = core.PagesFor(s, req.token_budget());
  const uint64_t total = per_layer * s.geometry.num_layers();
  // Reserve as every admission does (request_table.h): the caller's tenant charged for the pages
  // and one request per rank, a free row in every rank's session, the pages the group's.
  ReserveOutcome reserved = Reserve(core.ledger_, core.pages_, ReserveSpec{s.id, group.ranks, group.owner, total});
  if (!reserved.reservation.has_value()) {
    if (reserved.failed_row >= 0) {
      const auto rank = static_cast<uint32_t>(reserved.failed_row);
      reserved.status =
          absl::ResourceExhaustedError(absl::StrCat(name, " rank ", rank, " (session ", group.ranks[rank],
                                                    "): ", reserved.status.message(), "; nothing was reserved"));
    }
    return {core.RefusedLocked(std::move(reserved)).result};  // a group admission never evicts: no lacked_room
  }
  const std::vector<uint32_t> rows = reserved.reservation->rows();
  const std::vector<PagePool::Page> pages = reserved.reservation->TakePages();
  for (const PagePool::Page& p : pages) {
    for (uint32_t extra = 1; extra < size; ++extra) {
      // The group holds the page: AddRef fails only at the reference limit.
      if (absl::Status st = core.pool_->AddRef(group.owner, p); !st.ok())
        LOCKED_LOG(ERROR) << "accounting error: " << st;
    }
  }
  TpGroup::Held& held = group.requests[id];
  for (uint32_t layer = 0; layer < s.geometry.num_layers(); ++layer) {
    held.pages.emplace_back(pages.begin() + layer * per_layer, pages.begin() + (layer + 1) * per_layer);
  }
  held.holders.push_back(s.id);  // the caller pays; then the others in rank order
  for (uint64_t member : group.ranks) {
    if (member != s.id) held.holders.push_back(member);
  }
  const absl::Time now = absl::Now();
  for (uint32_t rank = 0; rank < size; ++rank) {
    const uint64_t member = group.ranks[rank];
    Request r;
    r.id = id;
    r.admitted_at = now;
    r.capacity_tokens = req.token_budget();
    r.pages = held.pages;
    r.in_group = true;
    r.attached = member == s.id;
    r.charged_pages = member == s.id ? total : 0;
    core.sessions_.at(member)->requests.Admit(std::move(r), rows[rank]);
  }
  ++core.admissions_;
  return {core.AdmitAnswerLocked(s, *s.requests.Find(id))};
}

absl::StatusOr<v1::ExtendResponse> GroupRequests::ExtendLocked(SessionCore& core, Session& s, Request& r,
                                                               const v1::ExtendRequest& req) {
  HS_RETURN_IF_ERROR(core.CheckBudget(s, req.token_budget()));
  TpGroup& group = *core.groups_.Find(s);
  TpGroup::Held& held = group.requests.at(r.id);
  auto answer = [&] {
    core.mu_.AssertHeld();  // called below, under the lock ExtendGroupLocked holds
    v1::ExtendResponse resp;
    resp.set_capacity_tokens(r.capacity_tokens);
    resp.set_moved(false);
    core.FillLayers(s, r, resp.mutable_layers());
    return resp;
  };
  if (req.token_budget() == r.capacity_tokens) {
    core.ledger_.Touch(s.id, r.id);
    return answer();  // another rank extended it: this rank's half
  }
  if (req.token_budget() < r.capacity_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("token_budget (", req.token_budget(),
                                                   ") is below the group request's capacity (", r.capacity_tokens,
                                                   "): extend to it, or beyond"));
  }
  const uint64_t extra = core.PagesFor(s, req.token_budget()) - r.pages[0].size();
  const uint64_t payer = held.holders.front();
  if (std::optional<Refusal> refusal = core.ledger_.CheckGrow(payer, extra * r.pages.size(), 0)) {
    return core.Reject(*std::move(refusal));
  }
  core.ledger_.Touch(s.id, r.id);
  // The same pages as a session's Extend, under the group's owner (a full pool counted).
  absl::StatusOr<SessionCore::Layers> taken = core.TakeLayerPages(group.owner, held.pages, extra);
  if (absl::IsResourceExhausted(taken.status())) return core.Reject(RejectReason::kPoolFull, taken.status());
  HS_RETURN_IF_ERROR(taken.status());
  const SessionCore::Layers& added = *taken;
  for (size_t layer = 0; layer < added.size(); ++layer) {
    for (const PagePool::Page& p : added[layer]) {
      for (size_t extra_holder = 1; extra_holder < held.holders.size(); ++extra_holder) {
        if (absl::Status st = core.pool_->AddRef(group.owner, p); !st.ok())
          LOCKED_LOG(ERROR) << "accounting error: " << st;
      }
    }
    held.pages[layer].insert(held.pages[layer].end(), added[layer].begin(), added[layer].end());
  }
  for (uint64_t member : held.holders) {
    Request& share = *core.sessions_.at(member)->requests.Find(r.id);
    share.pages = held.pages;
    share.capacity_tokens = req.token_budget();
    if (member == payer) {
      share.charged_pages += extra * share.pages.size();
      core.ledger_.SetPages(member, r.id, share.charged_pages);
    }
  }
  return answer();
}

void GroupRequests::ReleaseShareLocked(SessionCore& core, Session& s, Request& r) {
  TpGroup* found = core.groups_.Find(s);
  if (found == nullptr) {
    LOCKED_LOG(ERROR) << "accounting error: session " << s.id << " holds a share of request " << r.id << " of no group";
    return;
  }
  TpGroup& group = *found;
  for (const std::vector<PagePool::Page>& layer : r.pages) {
    absl::Status st = core.pool_->ReleaseAll(group.owner, layer);
    if (!st.ok()) LOCKED_LOG(ERROR) << "accounting error releasing pages of group \"" << s.group << "\": " << st;
  }
  r.pages.clear();  // the share itself leaves the session's table in ReleaseRequestLocked
  auto hit = group.requests.find(r.id);
  if (hit == group.requests.end()) return;
  std::vector<uint64_t>& holders = hit->second.holders;
  const bool was_payer = !holders.empty() && holders.front() == s.id;
  holders.erase(std::remove(holders.begin(), holders.end(), s.id), holders.end());
  if (holders.empty()) {
    group.requests.erase(hit);
    return;
  }
  if (was_payer) {
    Request& next = *core.sessions_.at(holders.front())->requests.Find(r.id);
    next.charged_pages = r.charged_pages;
    core.ledger_.SetPages(holders.front(), r.id, next.charged_pages);
  }
}

uint64_t GroupRequests::UnfreedPagesOfLocked(const SessionCore& core, const Session& s, const Request& r) {
  if (!r.in_group) return SharedPrefixes::SharedPagesOf(s, r);
  const TpGroup* group = core.groups_.Find(s);
  if (group == nullptr) return 0;
  auto hit = group->requests.find(r.id);
  return hit != group->requests.end() && hit->second.holders.size() > 1 ? r.PageCount() : 0;
}

absl::StatusOr<UniqueFd> GroupRequests::DupSlabLocked(const SessionCore& core, const Session& s, uint64_t slab,
                                                      uint64_t* bytes) {
  const TpGroup* group = core.groups_.Find(s);
  if (group == nullptr) return absl::PermissionDeniedError(absl::StrCat("slab ", slab, " is not this session's"));
  // Leaves the daemon for this tenant's engine, as DupFdFor's own slabs do.
  absl::StatusOr<UniqueFd> fd = core.pool_->DupSlabFd(group->owner, slab, bytes, s.tenant_uid);
  if (absl::IsPermissionDenied(fd.status())) {
    return absl::PermissionDeniedError(
        absl::StrCat("slab ", slab, " belongs neither to this session nor to its group \"", s.group, "\""));
  }
  return fd;
}

void GroupRequests::FillStatsLocked(const SessionCore& core, std::optional<uint32_t> only_uid, v1::StatsResponse* out) {
  const uint64_t page_bytes = core.pool_->page_bytes();
  uint64_t group_pages = 0;
  for (const auto& [key, group] : core.groups_.all()) {
    const uint64_t pages = core.pool_->PagesOf(group.owner);
    group_pages += pages;
    if (only_uid.has_value() && group.tenant_uid != *only_uid) continue;
    v1::GroupStats* gs = out->add_groups();
    gs->set_name(key.second);
    gs->set_tenant_uid(group.tenant_uid);
    gs->set_size(static_cast<uint32_t>(group.ranks.size()));
    for (uint64_t member : group.ranks) gs->add_rank_sessions(member);
    gs->set_requests(static_cast<uint32_t>(group.requests.size()));
    gs->set_host_bytes(pages * page_bytes);
    uint32_t shares = 0;
    for (const auto& [id, held] : group.requests) shares += static_cast<uint32_t>(held.holders.size());
    gs->set_shares(shares);
    gs->set_slabs(core.pool_->SlabsOf(group.owner));
  }
  out->mutable_host_pool()->set_group_bytes(group_pages * page_bytes);
  for (v1::SessionStats& ss : *out->mutable_session_stats()) {
    const Session& s = *core.sessions_.at(ss.session_id());
    if (s.group.empty()) continue;
    ss.mutable_group()->set_name(s.group);
    ss.mutable_group()->set_rank(s.group_rank);
    ss.mutable_group()->set_size(static_cast<uint32_t>(core.groups_.Find(s)->ranks.size()));
  }
}

absl::Status GroupRequests::CheckLocked(const SessionCore& core, absl::flat_hash_map<uint64_t, uint64_t>* paid,
                                        uint64_t* pages) {
  auto bad = [](auto... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  *pages = 0;
  for (const auto& [key, group] : core.groups_.all()) {
    const std::string& name = key.second;
    if (group.tenant_uid != key.first) {
      return bad("group \"", name, "\" of uid ", key.first, " has tenant ", group.tenant_uid);
    }
    uint64_t distinct = 0;
    for (uint32_t rank = 0; rank < group.ranks.size(); ++rank) {
      const uint64_t member = group.ranks[rank];
      if (member == 0) continue;
      auto it = core.sessions_.find(member);
      if (it == core.sessions_.end() || TpGroups::KeyOf(*it->second) != key || it->second->group_rank != rank) {
        return bad("group \"", name, "\" rank ", rank, " names session ", member, ", which is not that member");
      }
      for (const auto& [rid, r] : it->second->requests) {
        if (r.in_group && group.requests.count(rid) == 0) {
          return bad("session ", member, " holds a share of request ", rid, ", which group \"", name, "\" lacks");
        }
      }
    }
    for (const auto& [rid, held] : group.requests) {
      if (held.holders.empty()) return bad("group \"", name, "\" request ", rid, " has no holder");
      for (size_t i = 0; i < held.holders.size(); ++i) {
        const uint64_t member = held.holders[i];
        auto it = core.sessions_.find(member);
        const Request* r = nullptr;
        if (it != core.sessions_.end() && TpGroups::KeyOf(*it->second) == key) {
          const Request* share = it->second->requests.Find(rid);
          if (share != nullptr && share->in_group) r = share;
        }
        if (r == nullptr) return bad("group \"", name, "\" request ", rid, ": holder ", member, " holds no share");
        if (r->pages != held.pages) return bad("group \"", name, "\" request ", rid, ": session ", member, "'s pages");
        const uint64_t want = i == 0 ? r->PageCount() : 0;
        if (r->charged_pages != want) {
          return bad("group \"", name, "\" request ", rid, ": session ", member, " charged ", r->charged_pages,
                     " pages, want ", want);
        }
        (*paid)[member] += want;
      }
      for (const auto& layer : held.pages) {
        for (const PagePool::Page& p : layer) {
          if (core.pool_->RefCount(p) != held.holders.size()) {
            return bad("group \"", name, "\" request ", rid, ": page ", p.index, " of slab ", p.slab, " has ",
                       core.pool_->RefCount(p), " references, ", held.holders.size(), " holders");
          }
          ++distinct;
        }
      }
    }
    if (core.pool_->PagesOf(group.owner) != distinct) {
      return bad("group \"", name, "\" requests hold ", distinct, " pages, the pool counts ",
                 core.pool_->PagesOf(group.owner));
    }
    *pages += distinct;
  }
  return absl::OkStatus();
}

}  // namespace hisparse
