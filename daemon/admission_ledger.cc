// The admission ledger: see admission_ledger.h.
#include "hisparse/daemon/admission_ledger.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace hisparse {

const char* RejectReasonName(RejectReason reason) {
  switch (reason) {
    case RejectReason::kPoolFull:
      return "pool_full";
    case RejectReason::kRowsFull:
      return "rows_full";
    case RejectReason::kDraining:
      return "draining";
    case RejectReason::kSessionLimit:
      return "session_limit";
    case RejectReason::kArenaBudget:
      return "arena_budget";
    case RejectReason::kHostArenaBudget:
      return "host_arena_budget";
    case RejectReason::kQuota:
      return "quota";
  }
  return "unknown";
}

AdmissionLedger::AdmissionLedger(const Quotas& quotas, uint64_t page_bytes, Clock clock, OutsideBytes outside)
    : quotas_(quotas),
      page_bytes_(std::max<uint64_t>(page_bytes, 1)),
      clock_(std::move(clock)),
      outside_(std::move(outside)) {}

AdmissionLedger::Session* AdmissionLedger::Find(uint64_t session_id) {
  auto it = sessions_.find(session_id);
  return it == sessions_.end() ? nullptr : &it->second;
}

const AdmissionLedger::Session* AdmissionLedger::Find(uint64_t session_id) const {
  auto it = sessions_.find(session_id);
  return it == sessions_.end() ? nullptr : &it->second;
}

AdmissionLedger::TenantUsage AdmissionLedger::Usage(uint32_t tenant) const {
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? TenantUsage{} : it->second;
}

std::optional<Refusal> AdmissionLedger::CheckOpenSession(uint32_t tenant, uint64_t arena_bytes) const {
  const TenantUsage u = Usage(tenant);
  if (quotas_.arena_bytes != 0 && u.arena_bytes + arena_bytes > quotas_.arena_bytes) {
    return Refusal{RejectReason::kQuota,
                   absl::ResourceExhaustedError(
                       absl::StrCat("tenant uid ", tenant, " would hold ", u.arena_bytes + arena_bytes,
                                    " slot-arena bytes; its quota (quotas.arena_bytes) is ", quotas_.arena_bytes))};
  }
  if (quotas_.sessions != 0 && u.sessions + 1 > quotas_.sessions) {
    return Refusal{RejectReason::kQuota, absl::ResourceExhaustedError(absl::StrCat(
                                             "tenant uid ", tenant, " holds ", u.sessions,
                                             " sessions; its quota (quotas.sessions) is ", quotas_.sessions))};
  }
  return std::nullopt;
}

uint32_t AdmissionLedger::RowSet::LowestFree() const {
  for (size_t w = 0; w < words_.size(); ++w) {
    if (~words_[w] == 0) continue;
    const uint32_t row = static_cast<uint32_t>(w * 64) + static_cast<uint32_t>(__builtin_ctzll(~words_[w]));
    return row < size_ ? row : size_;  // a free bit past the end is no row
  }
  return size_;
}

void AdmissionLedger::AddSession(uint64_t session_id, uint32_t tenant, uint32_t rows, uint64_t arena_bytes) {
  Session& s = sessions_[session_id];
  s.tenant = tenant;
  s.arena_bytes = arena_bytes;
  s.row_used.Assign(rows);
  TenantUsage& u = tenants_[tenant];
  ++u.sessions;
  u.arena_bytes += arena_bytes;
}

void AdmissionLedger::RemoveSession(uint64_t session_id) {
  Session* s = Find(session_id);
  if (s == nullptr) return;
  while (!s->requests.empty()) Release(session_id, s->requests.begin()->first);
  TenantUsage& u = tenants_[s->tenant];
  if (!s->orphan) --u.sessions;
  u.arena_bytes -= s->arena_bytes;
  if (u == TenantUsage{}) tenants_.erase(s->tenant);
  sessions_.erase(session_id);
}

void AdmissionLedger::OrphanSession(uint64_t session_id) {
  Session* s = Find(session_id);
  if (s == nullptr || s->orphan) return;
  for (const auto& [rid, r] : s->requests) Park(session_id, rid);
  TenantUsage& u = tenants_[s->tenant];
  --u.sessions;
  u.arena_bytes -= s->arena_bytes;
  s->arena_bytes = 0;
  s->row_used.Clear();
  s->orphan = true;
}

void AdmissionLedger::AdoptOrphan(uint64_t orphan_id, uint64_t session_id) {
  Session* from = Find(orphan_id);
  Session* to = Find(session_id);
  if (from == nullptr || to == nullptr || !from->orphan || to->orphan || from->tenant != to->tenant) return;
  for (auto& [rid, r] : from->requests) {
    if (to->requests.count(rid) == 0) to->requests.emplace(rid, r);
  }
  // The tenant's sums do not change: the same requests and pages, one tenant.
  sessions_.erase(orphan_id);
}

bool AdmissionLedger::IsOrphan(uint64_t session_id) const {
  const Session* s = Find(session_id);
  return s != nullptr && s->orphan;
}

std::optional<Refusal> AdmissionLedger::CheckGrow(uint64_t session_id, uint64_t more_pages,
                                                  uint32_t more_requests) const {
  const Session* s = Find(session_id);
  if (s == nullptr) return Refusal{RejectReason::kQuota, absl::NotFoundError("no such session in the ledger")};
  const TenantUsage u = Usage(s->tenant);
  // Retired slabs its engines may still hold count as pages it holds (whole pages).
  const bool quota_on = quotas_.host_bytes != 0 || quotas_.pages != 0;
  const uint64_t outside_bytes = quota_on && outside_ ? outside_(s->tenant) : 0;
  const uint64_t outside = (outside_bytes + page_bytes_ - 1) / page_bytes_;
  const std::string retired =
      outside == 0 ? std::string()
                   : absl::StrCat(", ", outside, " of them retired slabs its engines may still hold, not yet freed");
  const uint64_t pages = u.pages + outside + more_pages;
  const uint64_t bytes = pages * page_bytes_;
  if (quotas_.host_bytes != 0 && bytes > quotas_.host_bytes) {
    return Refusal{RejectReason::kQuota,
                   absl::ResourceExhaustedError(absl::StrCat(
                       "tenant uid ", s->tenant, " would hold ", bytes, " host pool bytes (", pages, " pages of ",
                       page_bytes_, retired, "); its quota (quotas.host_bytes) is ", quotas_.host_bytes))};
  }
  if (quotas_.pages != 0 && pages > quotas_.pages) {
    return Refusal{RejectReason::kQuota, absl::ResourceExhaustedError(absl::StrCat(
                                             "tenant uid ", s->tenant, " would hold ", pages, " host pool pages",
                                             retired, "; its quota (quotas.pages) is ", quotas_.pages))};
  }
  if (quotas_.requests != 0 && u.requests + more_requests > quotas_.requests) {
    return Refusal{RejectReason::kQuota, absl::ResourceExhaustedError(absl::StrCat(
                                             "tenant uid ", s->tenant, " holds ", u.requests,
                                             " requests; its quota (quotas.requests) is ", quotas_.requests))};
  }
  return std::nullopt;
}

std::optional<Refusal> AdmissionLedger::FreeRow(uint64_t session_id, uint32_t* row) const {
  const Session* s = Find(session_id);
  const uint32_t rows = s == nullptr ? 0 : s->row_used.size();
  if (const uint32_t free = rows == 0 ? 0 : s->row_used.LowestFree(); free < rows) {
    *row = free;
    return std::nullopt;
  }
  return Refusal{RejectReason::kRowsFull,
                 absl::ResourceExhaustedError(absl::StrCat("all ", rows, " request rows of this session are in use"))};
}

void AdmissionLedger::Admit(uint64_t session_id, uint64_t request_id, uint32_t row, uint64_t pages) {
  Session* s = Find(session_id);
  if (s == nullptr || row >= s->row_used.size() || s->row_used.Used(row) || s->requests.count(request_id) != 0) return;
  Request& r = s->requests[request_id];
  r.row = row;
  r.last_used = clock_();
  r.pages = pages;
  s->row_used.Set(row, true);
  TenantUsage& u = tenants_[s->tenant];
  ++u.requests;
  u.pages += pages;
  used_pages_ += pages;
}

void AdmissionLedger::SetPages(uint64_t session_id, uint64_t request_id, uint64_t pages) {
  Session* s = Find(session_id);
  if (s == nullptr) return;
  auto it = s->requests.find(request_id);
  if (it == s->requests.end()) return;
  Request& r = it->second;
  TenantUsage& u = tenants_[s->tenant];
  u.pages = u.pages - r.pages + pages;
  used_pages_ = used_pages_ - r.pages + pages;
  r.pages = pages;
}

void AdmissionLedger::Touch(uint64_t session_id, uint64_t request_id) {
  Session* s = Find(session_id);
  if (s == nullptr) return;
  auto it = s->requests.find(request_id);
  if (it != s->requests.end()) it->second.last_used = clock_();
}

void AdmissionLedger::Release(uint64_t session_id, uint64_t request_id) {
  Session* s = Find(session_id);
  if (s == nullptr) return;
  auto it = s->requests.find(request_id);
  if (it == s->requests.end()) return;
  TenantUsage& u = tenants_[s->tenant];
  --u.requests;
  u.pages -= it->second.pages;
  used_pages_ -= it->second.pages;
  if (!it->second.parked) s->row_used.Set(it->second.row, false);
  s->requests.erase(it);
}

void AdmissionLedger::Park(uint64_t session_id, uint64_t request_id) {
  Session* s = Find(session_id);
  if (s == nullptr) return;
  auto it = s->requests.find(request_id);
  if (it == s->requests.end() || it->second.parked) return;
  s->row_used.Set(it->second.row, false);
  it->second.parked = true;
}

void AdmissionLedger::Resume(uint64_t session_id, uint64_t request_id, uint32_t row) {
  Session* s = Find(session_id);
  if (s == nullptr || row >= s->row_used.size() || s->row_used.Used(row)) return;
  auto it = s->requests.find(request_id);
  if (it == s->requests.end() || !it->second.parked) return;
  s->row_used.Set(row, true);
  it->second.row = row;
  it->second.parked = false;
  it->second.last_used = clock_();
}

bool AdmissionLedger::IsParked(uint64_t session_id, uint64_t request_id) const {
  const Session* s = Find(session_id);
  if (s == nullptr) return false;
  auto it = s->requests.find(request_id);
  return it != s->requests.end() && it->second.parked;
}

bool AdmissionLedger::HasRequest(uint64_t session_id, uint64_t request_id) const {
  const Session* s = Find(session_id);
  return s != nullptr && s->requests.count(request_id) != 0;
}

uint64_t AdmissionLedger::PagesOf(uint64_t session_id) const {
  const Session* s = Find(session_id);
  uint64_t n = 0;
  if (s != nullptr) {
    for (const auto& [rid, r] : s->requests) n += r.pages;
  }
  return n;
}

std::optional<uint32_t> AdmissionLedger::RowOf(uint64_t session_id, uint64_t request_id) const {
  const Session* s = Find(session_id);
  if (s == nullptr) return std::nullopt;
  auto it = s->requests.find(request_id);
  if (it == s->requests.end() || it->second.parked) return std::nullopt;
  return it->second.row;
}

std::optional<AdmissionLedger::RequestKey> AdmissionLedger::PickVictim(uint64_t session_id) const {
  const Session* me = Find(session_id);
  if (me == nullptr) return std::nullopt;
  // Live requests rank after every parked one: !parked is false (first) for a parked request.
  std::optional<std::tuple<bool, absl::Time, uint64_t, uint64_t>> best;
  for (const auto& [sid, s] : sessions_) {
    if (s.tenant != me->tenant || s.orphan) continue;  // an orphan's requests live out their lease
    for (const auto& [rid, r] : s.requests) {
      const auto key = std::make_tuple(!r.parked, r.last_used, sid, rid);
      if (!best.has_value() || key < *best) best = key;
    }
  }
  if (!best.has_value()) return std::nullopt;
  return RequestKey{std::get<2>(*best), std::get<3>(*best)};
}

bool AdmissionLedger::EvictionCouldAdmit(uint64_t session_id, uint64_t need_pages, uint64_t available_pages) const {
  const Session* me = Find(session_id);
  if (me == nullptr || need_pages == 0) return false;
  uint64_t evictable = Usage(me->tenant).pages;
  for (const auto& [sid, s] : sessions_) {
    if (s.tenant != me->tenant || !s.orphan) continue;
    for (const auto& [rid, r] : s.requests) evictable -= r.pages;  // never victims
  }
  return available_pages + evictable >= need_pages;
}

absl::Status AdmissionLedger::CheckInvariants() const {
  std::map<uint32_t, TenantUsage> sums;
  uint64_t used = 0;
  for (const auto& [sid, s] : sessions_) {
    TenantUsage& u = sums[s.tenant];
    if (!s.orphan) ++u.sessions;
    u.arena_bytes += s.arena_bytes;
    if (s.orphan && (s.arena_bytes != 0 || !s.row_used.empty())) {
      return absl::InternalError(absl::StrCat("orphan ", sid, " keeps an arena or rows"));
    }
    RowSet rows;
    rows.Assign(s.row_used.size());
    for (const auto& [rid, r] : s.requests) {
      ++u.requests;
      u.pages += r.pages;
      used += r.pages;
      if (r.parked) continue;
      if (r.row >= rows.size())
        return absl::InternalError(absl::StrCat("session ", sid, ": row ", r.row, " out of range"));
      if (rows.Used(r.row)) return absl::InternalError(absl::StrCat("session ", sid, ": row ", r.row, " held twice"));
      rows.Set(r.row, true);
    }
    if (rows != s.row_used)
      return absl::InternalError(absl::StrCat("session ", sid, ": row table disagrees with requests"));
  }
  if (used != used_pages_)
    return absl::InternalError(absl::StrCat("ledger used ", used_pages_, " pages != held ", used));
  if (sums.size() != tenants_.size()) {
    return absl::InternalError(absl::StrCat("ledger keeps ", tenants_.size(), " tenants, sessions name ", sums.size()));
  }
  for (const auto& [tenant, u] : sums) {
    auto it = tenants_.find(tenant);
    if (it == tenants_.end() || !(it->second == u)) {
      return absl::InternalError(absl::StrCat("tenant uid ", tenant, ": kept sums disagree with its sessions"));
    }
  }
  return absl::OkStatus();
}

}  // namespace hisparse
