// SharedPrefixes: Admit naming a parent request, and the bookkeeping that keeps both exact
// whichever is released first (shared_prefixes.h).
//
// A child admitted with (parent, prefix_tokens = P) references, in every layer, the parent's full
// pages below P (pages [0, P / R), R records per page) with one more reference each in the pool;
// the wire marks them read_only, which the kernels and the host backend honour (a store or append
// into one is refused). When P ends inside a page, that page is the child's own: the daemon copies
// the parent's records [R * (P / R), P) into it. The rest of the child's capacity is fresh pages.
//
// Accounting: the tenant is charged each distinct page once. A page held by several requests of
// the session is in Session::sharers (page_sharers.h) with its holders in the order they took it;
// the first holder pays for it (Request::charged_pages, the ledger's count for the request).
// Releasing a holder passes the charge to the next, so the ledger's sum stays the pool's count of
// the session's referenced pages. Sharing is within a session: the pool's pages belong to one owner.
//
// Decisions: the bound on P is the parent's capacity_tokens (what the daemon knows; the engine
// knows what it wrote, and a prefix of positions it never stored shares its unwritten bytes); a
// parked parent may be shared from (its host pages are whole), an importing one may not (its records
// are not there until commit: FAILED_PRECONDITION), nor a TP-group share (its pages are the
// group's, in the pool under the group's owner: FAILED_PRECONDITION); a parent of another session is
// NOT_FOUND, as for any request id of another session.
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "hisparse/common/log.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/daemon/deferred_log.h"
#include "hisparse/daemon/durable_requests.h"
#include "hisparse/daemon/shared_prefixes.h"

namespace hisparse {

SessionCore::AdmitOutcome SharedPrefixes::AdmitLocked(SessionCore& core, Session& s, const v1::AdmitRequest& req) {
  const uint64_t id = req.request_id();
  const uint32_t prefix = req.prefix_tokens();
  if (req.parent_request_id() == 0) {
    return {absl::InvalidArgumentError(absl::StrCat("prefix_tokens (", prefix, ") needs a parent_request_id"))};
  }
  if (prefix == 0) return {absl::InvalidArgumentError("a parent_request_id needs prefix_tokens >= 1")};
  if (req.parent_request_id() == id) {
    return {absl::InvalidArgumentError(absl::StrCat("request ", id, " cannot be its own parent"))};
  }
  const Request* found = s.requests.Find(req.parent_request_id());
  if (found == nullptr) {
    return {absl::NotFoundError(
        absl::StrCat("parent request ", req.parent_request_id(), " is not admitted in this session"))};
  }
  const Request& parent = *found;
  if (parent.in_group) {
    return {absl::FailedPreconditionError(absl::StrCat("parent request ", parent.id,
                                                       " is a TP-group request: its pages are the group's, not "
                                                       "this session's, so no request may share a prefix of them"))};
  }
  if (parent.importing()) {
    return {absl::FailedPreconditionError(absl::StrCat("parent request ", parent.id,
                                                       " is importing: its records are not there yet; share "
                                                       "from it after CommitImport"))};
  }
  if (prefix > parent.capacity_tokens) {
    return {absl::InvalidArgumentError(absl::StrCat("prefix_tokens (", prefix, ") exceeds the parent's capacity (",
                                                    parent.capacity_tokens, " tokens)"))};
  }
  if (prefix > req.token_budget()) {
    return {absl::InvalidArgumentError(
        absl::StrCat("prefix_tokens (", prefix, ") exceeds token_budget (", req.token_budget(), ")"))};
  }
  const uint32_t layers = s.geometry.num_layers();
  const uint64_t shared = prefix / s.records_per_page;  // full pages per layer
  const uint64_t tail_records = prefix % s.records_per_page;
  const uint64_t fresh = core.PagesFor(s, req.token_budget()) - shared;  // per layer
  const uint64_t total = fresh * layers;
  // Reserve (the quota, a row, the fresh pages: none when the child lies inside its parent's).
  ReserveOutcome reserved = Reserve(core.ledger_, core.pages_, ReserveSpec{s.id, {s.id}, s.id, total});
  if (!reserved.reservation.has_value()) return core.RefusedLocked(std::move(reserved));
  const std::vector<PagePool::Page>& got = reserved.reservation->pages();
  // The partial page's prefix records, copied before anything is shared: a failure leaves nothing
  // (the reservation gives its pages back).
  for (uint32_t layer = 0; tail_records != 0 && layer < layers; ++layer) {
    absl::StatusOr<uint8_t*> src = core.pool_->PageData(s.id, parent.pages[layer][shared]);
    absl::StatusOr<uint8_t*> dst = core.pool_->PageData(s.id, got[layer * fresh]);
    if (!src.ok() || !dst.ok()) {
      return {absl::InternalError(
          absl::StrCat("copying the prefix's partial page: ", (src.ok() ? dst.status() : src.status()).message()))};
    }
    std::memcpy(*dst, *src, tail_records * s.geometry.record_bytes());
  }
  Request r;
  r.id = id;
  r.admitted_at = absl::Now();
  r.capacity_tokens = req.token_budget();
  r.charged_pages = total;
  r.lease_end = DurableRequests::LeaseEnd(core.Now(), req.lease_seconds());
  for (uint32_t layer = 0; layer < layers; ++layer) {
    std::vector<PagePool::Page> pages(parent.pages[layer].begin(), parent.pages[layer].begin() + shared);
    pages.insert(pages.end(), got.begin() + layer * fresh, got.begin() + (layer + 1) * fresh);
    r.pages.push_back(std::move(pages));
  }
  for (uint32_t layer = 0; layer < layers; ++layer) {
    for (uint64_t i = 0; i < shared; ++i) {
      const PagePool::Page& p = r.pages[layer][i];
      // The parent holds it: AddRef fails only at the reference limit, 2^32 tables of one page.
      if (absl::Status st = core.pool_->AddRef(s.id, p); !st.ok()) {
        LOCKED_LOG(ERROR) << "accounting error sharing a page of session " << s.id << ": " << st;
      }
      s.sharers.Share(p, parent.id, id);
    }
  }
  (void)reserved.reservation->TakePages();  // committed: the request holds them now
  const Request& added = s.requests.Admit(std::move(r), reserved.reservation->rows()[0]);
  core.TouchedLocked(s, added);
  ++core.admissions_;
  return {core.AdmitAnswerLocked(s, added)};
}

void SharedPrefixes::UnshareLocked(SessionCore& core, Session& s, const Request& r) {
  // A page whose payer `r` was is charged to its next holder (page_sharers.h).
  for (uint64_t payer : s.sharers.Unshare(r.id, r.pages)) {
    if (Request* next = s.requests.Find(payer); next != nullptr) {
      ++next->charged_pages;
      core.ledger_.SetPages(s.id, next->id, next->charged_pages);
    }
  }
}

uint64_t SharedPrefixes::SharedPagesOf(const Session& s, const Request& r) { return s.sharers.SharedOf(r.pages); }

absl::Status SharedPrefixes::CheckLocked(const SessionCore& core, const Session& s, uint64_t* distinct) {
  // Every page's holders among the session's requests, in no particular order.
  std::map<PagePool::Page, std::vector<uint64_t>> holders;
  uint64_t charged = 0;
  for (const auto& [rid, r] : s.requests) {
    if (r.in_group) continue;  // the group's pages: CheckGroupsLocked (group_requests.cc)
    for (const auto& layer : r.pages) {
      for (const PagePool::Page& p : layer) holders[p].push_back(rid);
    }
    charged += r.charged_pages;
  }
  *distinct = holders.size();
  if (charged != holders.size()) {
    return absl::InternalError(absl::StrCat("session ", s.id, ": requests are charged ", charged, " pages, they hold ",
                                            holders.size(), " distinct ones"));
  }
  absl::flat_hash_map<uint64_t, uint64_t> pays;
  for (const auto& [p, who] : holders) {
    if (core.pool_->RefCount(p) != who.size()) {
      return absl::InternalError(absl::StrCat("session ", s.id, ": page ", p.index, " of slab ", p.slab, " has ",
                                              core.pool_->RefCount(p), " references, ", who.size(),
                                              " requests hold it"));
    }
    auto it = s.sharers.all().find(p);
    if ((who.size() > 1) != (it != s.sharers.all().end())) {
      return absl::InternalError(absl::StrCat("session ", s.id, ": page ", p.index, " of slab ", p.slab, " is held by ",
                                              who.size(), " requests, sharers disagree"));
    }
    if (it == s.sharers.all().end()) {
      ++pays[who.front()];
      continue;
    }
    std::vector<uint64_t> listed = it->second;
    std::vector<uint64_t> actual = who;
    std::sort(listed.begin(), listed.end());
    std::sort(actual.begin(), actual.end());
    if (listed != actual) {
      return absl::InternalError(absl::StrCat("session ", s.id, ": page ", p.index, " of slab ", p.slab,
                                              ": its sharers list is not its holders"));
    }
    ++pays[it->second.front()];
  }
  for (const auto& [p, listed] : s.sharers.all()) {
    if (holders.count(p) == 0) {
      return absl::InternalError(absl::StrCat("session ", s.id, ": sharers lists page ", p.index, " of slab ", p.slab,
                                              ", which no request holds"));
    }
  }
  for (const auto& [rid, r] : s.requests) {
    if (r.in_group) continue;
    const uint64_t want = pays.contains(rid) ? pays.at(rid) : 0;
    if (r.charged_pages != want) {
      return absl::InternalError(absl::StrCat("session ", s.id, " request ", rid, ": charged ", r.charged_pages,
                                              " pages, it is the first holder of ", want));
    }
  }
  return absl::OkStatus();
}

}  // namespace hisparse
