// The admission ledger: see admission_ledger.h.
#include "hisparse/daemon/admission_ledger.h"

#include <algorithm>
#include <set>
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

uint64_t AdmissionLedger::Request::HeldBytes() const {
  uint64_t sum = 0;
  for (const Hold& h : holds) sum += h.bytes;
  return sum;
}

AdmissionLedger::AdmissionLedger(const Quotas& quotas, uint64_t segment_bytes, Clock clock)
    : quotas_(quotas), segment_bytes_(std::max<uint64_t>(segment_bytes, 1)), clock_(std::move(clock)) {}

AdmissionLedger::Session* AdmissionLedger::Find(uint64_t session_id) {
  auto it = sessions_.find(session_id);
  return it == sessions_.end() ? nullptr : &it->second;
}

const AdmissionLedger::Session* AdmissionLedger::Find(uint64_t session_id) const {
  auto it = sessions_.find(session_id);
  return it == sessions_.end() ? nullptr : &it->second;
}

uint32_t AdmissionLedger::SegmentsPerTenant() const {
  if (quotas_.segments != 0) return quotas_.segments;
  if (quotas_.host_bytes == 0) return UINT32_MAX;
  return static_cast<uint32_t>(
      std::min<uint64_t>((quotas_.host_bytes + segment_bytes_ - 1) / segment_bytes_, UINT32_MAX));
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

void AdmissionLedger::AddSession(uint64_t session_id, uint32_t tenant, uint32_t rows, uint64_t arena_bytes) {
  Session& s = sessions_[session_id];
  s.tenant = tenant;
  s.arena_bytes = arena_bytes;
  s.row_used.assign(rows, false);
  TenantUsage& u = tenants_[tenant];
  ++u.sessions;
  u.arena_bytes += arena_bytes;
}

void AdmissionLedger::RemoveSession(uint64_t session_id) {
  Session* s = Find(session_id);
  if (s == nullptr) return;
  while (!s->requests.empty()) Release(session_id, s->requests.begin()->first);
  TenantUsage& u = tenants_[s->tenant];
  --u.sessions;
  u.arena_bytes -= s->arena_bytes;
  if (u.sessions == 0) tenants_.erase(s->tenant);
  sessions_.erase(session_id);
}

std::optional<Refusal> AdmissionLedger::CheckGrow(uint64_t session_id, uint64_t more_host_bytes,
                                                  uint32_t more_requests) const {
  const Session* s = Find(session_id);
  if (s == nullptr) return Refusal{RejectReason::kQuota, absl::NotFoundError("no such session in the ledger")};
  const TenantUsage u = Usage(s->tenant);
  if (quotas_.host_bytes != 0 && u.host_bytes + more_host_bytes > quotas_.host_bytes) {
    return Refusal{RejectReason::kQuota,
                   absl::ResourceExhaustedError(
                       absl::StrCat("tenant uid ", s->tenant, " would hold ", u.host_bytes + more_host_bytes,
                                    " host pool bytes; its quota (quotas.host_bytes) is ", quotas_.host_bytes))};
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
  const size_t rows = s == nullptr ? 0 : s->row_used.size();
  for (uint32_t r = 0; r < rows; ++r) {
    if (!s->row_used[r]) {
      *row = r;
      return std::nullopt;
    }
  }
  return Refusal{RejectReason::kRowsFull,
                 absl::ResourceExhaustedError(absl::StrCat("all ", rows, " request rows of this session are in use"))};
}

void AdmissionLedger::Admit(uint64_t session_id, uint64_t request_id, uint32_t row, std::vector<Hold> holds) {
  Session* s = Find(session_id);
  if (s == nullptr || row >= s->row_used.size() || s->row_used[row] || s->requests.count(request_id) != 0) return;
  Request& r = s->requests[request_id];
  r.row = row;
  r.last_used = clock_();
  r.holds = std::move(holds);
  s->row_used[row] = true;
  TenantUsage& u = tenants_[s->tenant];
  ++u.requests;
  u.host_bytes += r.HeldBytes();
  used_bytes_ += r.HeldBytes();
}

void AdmissionLedger::SetHolds(uint64_t session_id, uint64_t request_id, std::vector<Hold> holds) {
  Session* s = Find(session_id);
  if (s == nullptr) return;
  auto it = s->requests.find(request_id);
  if (it == s->requests.end()) return;
  Request& r = it->second;
  TenantUsage& u = tenants_[s->tenant];
  u.host_bytes -= r.HeldBytes();
  used_bytes_ -= r.HeldBytes();
  r.holds = std::move(holds);
  u.host_bytes += r.HeldBytes();
  used_bytes_ += r.HeldBytes();
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
  u.host_bytes -= it->second.HeldBytes();
  used_bytes_ -= it->second.HeldBytes();
  s->row_used[it->second.row] = false;
  s->requests.erase(it);
}

bool AdmissionLedger::HasRequest(uint64_t session_id, uint64_t request_id) const {
  const Session* s = Find(session_id);
  return s != nullptr && s->requests.count(request_id) != 0;
}

void AdmissionLedger::SetMoving(uint64_t session_id, uint64_t request_id, bool moving) {
  Session* s = Find(session_id);
  if (s == nullptr) return;
  auto it = s->requests.find(request_id);
  if (it != s->requests.end()) it->second.moving = moving;
}

bool AdmissionLedger::IsMoving(uint64_t session_id, uint64_t request_id) const {
  const Session* s = Find(session_id);
  if (s == nullptr) return false;
  auto it = s->requests.find(request_id);
  return it != s->requests.end() && it->second.moving;
}

uint32_t AdmissionLedger::MovesIn(uint64_t session_id) const {
  const Session* s = Find(session_id);
  uint32_t n = 0;
  if (s != nullptr) {
    for (const auto& [rid, r] : s->requests) n += r.moving ? 1 : 0;
  }
  return n;
}

uint32_t AdmissionLedger::SegmentsOf(uint64_t session_id) const {
  const Session* s = Find(session_id);
  if (s == nullptr) return 0;
  std::set<uint32_t> segments;
  for (const auto& [rid, r] : s->requests) {
    for (const Hold& h : r.holds) segments.insert(h.segment);
  }
  return static_cast<uint32_t>(segments.size());
}

uint32_t AdmissionLedger::SegmentsHeld(uint32_t tenant) const {
  uint32_t held = 0;
  for (const auto& [sid, s] : sessions_) {
    if (s.tenant == tenant) held += SegmentsOf(sid);
  }
  return held;
}

std::optional<uint32_t> AdmissionLedger::RowOf(uint64_t session_id, uint64_t request_id) const {
  const Session* s = Find(session_id);
  if (s == nullptr) return std::nullopt;
  auto it = s->requests.find(request_id);
  if (it == s->requests.end()) return std::nullopt;
  return it->second.row;
}

Refusal AdmissionLedger::RoomRefusal(uint64_t session_id, uint64_t bytes, uint32_t tenant_segments,
                                     absl::Status pool_status) const {
  const uint32_t share = SegmentsPerTenant();
  if (tenant_segments < share) return Refusal{RejectReason::kPoolFull, std::move(pool_status)};
  const Session* s = Find(session_id);
  return Refusal{
      RejectReason::kQuota,
      absl::ResourceExhaustedError(absl::StrCat(
          "tenant uid ", s == nullptr ? 0 : s->tenant, " holds ", tenant_segments, " pool segments, its share (quotas.",
          quotas_.segments != 0 ? "segments" : "host_bytes / segment size", ") is ", share,
          ", and this session's segments have no room for a run of ", bytes, " bytes"))};
}

std::optional<AdmissionLedger::RequestKey> AdmissionLedger::PickVictim(uint64_t session_id) const {
  const Session* me = Find(session_id);
  if (me == nullptr) return std::nullopt;
  std::optional<std::tuple<absl::Time, uint64_t, uint64_t>> best;
  for (const auto& [sid, s] : sessions_) {
    if (s.tenant != me->tenant) continue;
    for (const auto& [rid, r] : s.requests) {
      if (r.moving) continue;
      const auto key = std::make_tuple(r.last_used, sid, rid);
      if (!best.has_value() || key < *best) best = key;
    }
  }
  if (!best.has_value()) return std::nullopt;
  return RequestKey{std::get<1>(*best), std::get<2>(*best)};
}

bool AdmissionLedger::EvictionCouldAdmit(uint64_t session_id, uint64_t run_bytes, uint32_t layers,
                                         const std::vector<SegmentView>& segments) const {
  const Session* me = Find(session_id);
  if (me == nullptr || run_bytes == 0) return false;
  // What the tenant's requests hold in each segment, and which sessions are the tenant's.
  std::map<uint32_t, uint64_t> held_in;
  std::set<uint64_t> tenant_sessions;
  for (const auto& [sid, s] : sessions_) {
    if (s.tenant != me->tenant) continue;
    tenant_sessions.insert(sid);
    for (const auto& [rid, r] : s.requests) {
      for (const Hold& h : r.holds) held_in[h.segment] += h.bytes;
    }
  }
  // Runs each segment could take for the session with the tenant's requests gone: its own
  // segments keep their free bytes plus what the tenant holds there; free ones and those of the
  // tenant's other sessions (which fall free) are whole. Another tenant's segment is out of reach.
  std::vector<uint64_t> runs_per_segment;
  for (uint32_t i = 0; i < segments.size(); ++i) {
    const SegmentView& seg = segments[i];
    uint64_t room = 0;
    if (seg.owner == session_id) {
      auto it = held_in.find(i);
      room = seg.free_bytes + (it == held_in.end() ? 0 : it->second);
    } else if (seg.owner == 0 || tenant_sessions.count(seg.owner) != 0) {
      room = seg.capacity;
    }
    if (room >= run_bytes) runs_per_segment.push_back(room / run_bytes);
  }
  // The tenant may hold at most its share of segments: count the roomiest ones.
  std::sort(runs_per_segment.begin(), runs_per_segment.end(), std::greater<>());
  const size_t usable = std::min<size_t>(runs_per_segment.size(), SegmentsPerTenant());
  uint64_t fit = 0;
  for (size_t i = 0; i < usable && fit < layers; ++i) fit += runs_per_segment[i];
  return fit >= layers;
}

absl::Status AdmissionLedger::CheckInvariants() const {
  std::map<uint32_t, TenantUsage> sums;
  uint64_t used = 0;
  for (const auto& [sid, s] : sessions_) {
    TenantUsage& u = sums[s.tenant];
    ++u.sessions;
    u.arena_bytes += s.arena_bytes;
    std::vector<bool> rows(s.row_used.size(), false);
    for (const auto& [rid, r] : s.requests) {
      if (r.row >= rows.size())
        return absl::InternalError(absl::StrCat("session ", sid, ": row ", r.row, " out of range"));
      if (rows[r.row]) return absl::InternalError(absl::StrCat("session ", sid, ": row ", r.row, " held twice"));
      rows[r.row] = true;
      ++u.requests;
      u.host_bytes += r.HeldBytes();
      used += r.HeldBytes();
    }
    if (rows != s.row_used)
      return absl::InternalError(absl::StrCat("session ", sid, ": row table disagrees with requests"));
  }
  if (used != used_bytes_) return absl::InternalError(absl::StrCat("ledger used ", used_bytes_, " != holds ", used));
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
