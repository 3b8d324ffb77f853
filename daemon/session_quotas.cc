// Tenants' shares of the node at the pool's edge: what a run may claim, whether evicting can
// admit, the victim. The numbers and decisions are AdmissionLedger's (admission_ledger.h); this
// is the part of SessionManager (session_manager.h) that feeds it the pool's state. Every
// *Locked function runs under its mutex.
#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

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

uint32_t SessionManager::SegmentsPerTenant() const {
  absl::MutexLock lock(&mu_);
  return ledger_.SegmentsPerTenant();
}

std::vector<AdmissionLedger::Hold> SessionManager::HoldsOf(const std::vector<HostPool::Run>& runs) {
  std::vector<AdmissionLedger::Hold> holds;
  holds.reserve(runs.size());
  for (const HostPool::Run& run : runs) holds.push_back(AdmissionLedger::Hold{run.segment, run.bytes});
  return holds;
}

absl::Status SessionManager::Reject(Refusal refusal) { return Reject(refusal.reason, std::move(refusal.status)); }

absl::StatusOr<HostPool::Run> SessionManager::AllocateRunLocked(const Session& s, uint64_t bytes,
                                                                uint32_t* tenant_segments) {
  const uint32_t share = ledger_.SegmentsPerTenant();
  bool claimed = false;
  absl::StatusOr<HostPool::Run> run = pool_->Allocate(s.id, bytes, *tenant_segments < share, &claimed);
  if (claimed) ++*tenant_segments;
  if (run.ok() || !absl::IsResourceExhausted(run.status())) return run;
  return Reject(ledger_.RoomRefusal(s.id, bytes, *tenant_segments, run.status()));
}

bool SessionManager::EvictionCouldAdmitLocked(const Session& s, uint64_t run_bytes, uint32_t layers) const {
  std::vector<AdmissionLedger::SegmentView> segments;
  segments.reserve(pool_->segment_count());
  for (uint32_t i = 0; i < pool_->segment_count(); ++i) {
    const HostPool::SegmentState seg = pool_->GetSegment(i);
    segments.push_back(AdmissionLedger::SegmentView{seg.owner, seg.capacity, seg.free_bytes});
  }
  return ledger_.EvictionCouldAdmit(s.id, run_bytes, layers, segments);
}

std::optional<SessionManager::Victim> SessionManager::PickVictimLocked(uint64_t session_id) const {
  std::optional<AdmissionLedger::RequestKey> key = ledger_.PickVictim(session_id);
  if (!key.has_value()) return std::nullopt;
  auto it = sessions_.find(key->session_id);
  if (it == sessions_.end()) return std::nullopt;
  return Victim{key->session_id, key->request_id, it->second->sink};
}

}  // namespace hisparse
