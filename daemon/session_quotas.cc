// Tenants' shares of the node: rejection reasons, the pool segments one tenant may hold, what
// a run may claim, whether evicting can admit, and the per-tenant session quota. Part of
// SessionManager (session_manager.h); every *Locked function runs under its mutex.
#include <algorithm>
#include <functional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "hisparse/common/log.h"
#include "hisparse/daemon/session_manager.h"

namespace hisparse {

// With quotas set, one tenant must never keep another with unused quota out. Segments are
// exclusive, so that holds only while the pool has a share for each tenant: say how many.
void SessionManager::LogQuotaCoverage(uint32_t share, uint32_t segments, const QuotaOptions& q, uint32_t max_sessions) {
  if (share == UINT32_MAX) return;
  const uint32_t tenants = segments / std::max<uint32_t>(share, 1);
  if (tenants < 2) {
    LOG(WARNING) << "quotas: one tenant may hold " << share << " of the pool's " << segments
                 << " segments, so a single tenant can fill the pool; raise host_pool.size or lower "
                    "quotas.host_bytes / quotas.segments";
  } else {
    LOG(INFO) << "quotas: the pool's " << segments << " segments give " << tenants << " tenants their full share of "
              << share << " segments at once";
  }
  if (q.sessions != 0 && max_sessions / q.sessions < std::max<uint32_t>(tenants, 2)) {
    LOG(WARNING) << "quotas: limits.max_sessions (" << max_sessions << ") admits only " << max_sessions / q.sessions
                 << " tenants at their quotas.sessions (" << q.sessions << ")";
  }
}

uint32_t SessionManager::SegmentsPerTenantLocked() const {
  const QuotaOptions& q = options_.quotas;
  if (q.segments != 0) return q.segments;
  if (q.host_bytes == 0) return UINT32_MAX;
  const uint64_t segment = pool_->segment_bytes();
  return static_cast<uint32_t>(std::min<uint64_t>((q.host_bytes + segment - 1) / segment, UINT32_MAX));
}

uint32_t SessionManager::SegmentsHeldLocked(uint32_t tenant) const {
  uint32_t held = 0;
  for (const auto& [sid, s] : sessions_) {
    if (TenantOf(*s) == tenant) held += pool_->SegmentsOf(sid);
  }
  return held;
}

uint32_t SessionManager::SegmentsPerTenant() const {
  absl::MutexLock lock(&mu_);
  return SegmentsPerTenantLocked();
}

absl::StatusOr<HostPool::Run> SessionManager::AllocateRunLocked(const Session& s, uint64_t bytes,
                                                                uint32_t* tenant_segments) {
  const uint32_t share = SegmentsPerTenantLocked();
  bool claimed = false;
  absl::StatusOr<HostPool::Run> run = pool_->Allocate(s.id, bytes, *tenant_segments < share, &claimed);
  if (claimed) ++*tenant_segments;
  if (run.ok() || !absl::IsResourceExhausted(run.status())) return run;
  if (*tenant_segments >= share) {
    return Reject(RejectReason::kQuota,
                  absl::ResourceExhaustedError(absl::StrCat(
                      "tenant uid ", TenantOf(s), " holds ", *tenant_segments, " pool segments, its share (quotas.",
                      options_.quotas.segments != 0 ? "segments" : "host_bytes / segment size", ") is ", share,
                      ", and this session's segments have no room for a run of ", bytes, " bytes")));
  }
  return Reject(RejectReason::kPoolFull, run.status());
}

bool SessionManager::EvictionCouldAdmitLocked(const Session& s, uint64_t run_bytes, uint32_t layers) const {
  const uint32_t tenant = TenantOf(s);
  // What the tenant's requests hold in each segment, and which sessions are the tenant's.
  absl::flat_hash_map<uint32_t, uint64_t> held_in;
  absl::flat_hash_set<uint64_t> tenant_sessions;
  for (const auto& [sid, other] : sessions_) {
    if (TenantOf(*other) != tenant) continue;
    tenant_sessions.insert(sid);
    for (const auto& [rid, r] : other->requests) {
      for (const HostPool::Run& run : r.runs) held_in[run.segment] += run.bytes;
    }
  }
  // Runs each segment could take for `s` with the tenant's requests gone: its own segments keep
  // their free bytes plus what the tenant holds there; free ones and those of the tenant's other
  // sessions (which fall free) are whole. Another tenant's segment is out of reach.
  std::vector<uint64_t> runs_per_segment;
  for (uint32_t i = 0; i < pool_->segment_count(); ++i) {
    const HostPool::SegmentState seg = pool_->GetSegment(i);
    uint64_t room = 0;
    if (seg.owner == s.id) {
      auto it = held_in.find(i);
      room = seg.free_bytes + (it == held_in.end() ? 0 : it->second);
    } else if (seg.owner == HostPool::kNoOwner || tenant_sessions.contains(seg.owner)) {
      room = seg.capacity;
    }
    if (room >= run_bytes) runs_per_segment.push_back(room / run_bytes);
  }
  // The tenant may hold at most its share of segments: count the roomiest ones.
  std::sort(runs_per_segment.begin(), runs_per_segment.end(), std::greater<>());
  const size_t usable = std::min<size_t>(runs_per_segment.size(), SegmentsPerTenantLocked());
  uint64_t fit = 0;
  for (size_t i = 0; i < usable && fit < layers; ++i) fit += runs_per_segment[i];
  return fit >= layers;
}

absl::Status SessionManager::CheckSessionQuotaLocked(uint32_t tenant, uint64_t arena_bytes) {
  const QuotaOptions& q = options_.quotas;
  const TenantUsage u = UsageLocked(tenant);
  if (q.arena_bytes != 0 && u.arena_bytes + arena_bytes > q.arena_bytes) {
    return Reject(RejectReason::kQuota, absl::ResourceExhaustedError(absl::StrCat(
                                            "tenant uid ", tenant, " would hold ", u.arena_bytes + arena_bytes,
                                            " slot-arena bytes; its quota (quotas.arena_bytes) is ", q.arena_bytes)));
  }
  if (q.sessions != 0 && u.sessions + 1 > q.sessions) {
    return Reject(RejectReason::kQuota,
                  absl::ResourceExhaustedError(absl::StrCat("tenant uid ", tenant, " holds ", u.sessions,
                                                            " sessions; its quota (quotas.sessions) is ", q.sessions)));
  }
  return absl::OkStatus();
}

}  // namespace hisparse
