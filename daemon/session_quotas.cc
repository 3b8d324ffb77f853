// Tenants' shares of the node at the pool's edge: the pages a request takes, whether evicting can
// admit, the victim. The numbers and decisions are AdmissionLedger's (admission_ledger.h); this
// is the part of SessionManager (session_manager.h) that feeds it the pool's state. Every
// *Locked function runs under its mutex.
#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "hisparse/common/log.h"
#include "hisparse/daemon/session_manager.h"

namespace hisparse {

absl::Status SessionManager::Reject(Refusal refusal) { return Reject(refusal.reason, std::move(refusal.status)); }

absl::StatusOr<std::vector<PagePool::Page>> SessionManager::AllocatePagesLocked(uint64_t owner, uint64_t count,
                                                                                const PagePool::Page* after) {
  if (count > UINT32_MAX) {
    return Reject(RejectReason::kPoolFull,
                  absl::ResourceExhaustedError(absl::StrCat("a request of ", count, " pages exceeds any host pool")));
  }
  absl::StatusOr<std::vector<PagePool::Page>> pages = pages_.Allocate(owner, static_cast<uint32_t>(count), after);
  if (pages.ok() || !absl::IsResourceExhausted(pages.status())) return pages;
  return Reject(RejectReason::kPoolFull, pages.status());
}

SessionManager::AdmitOutcome SessionManager::RefusedLocked(ReserveOutcome outcome) {
  absl::Status status =
      outcome.counted.has_value() ? Reject(*outcome.counted, std::move(outcome.status)) : std::move(outcome.status);
  return {std::move(status), outcome.lacked_room};
}

bool SessionManager::EvictionCouldAdmitLocked(const Session& s, uint64_t need_pages) const {
  const PagePool::Stats st = pool_->GetStats();
  // What the pool could give this session now: its own slabs' free pages, every page of budget not
  // in a slab of another session, and other sessions' idle slabs.
  const uint64_t available = (st.ready_bytes + st.unallocated_bytes) / st.page_bytes + pool_->FreePagesOf(s.id) +
                             pool_->ReclaimablePagesFor(s.id);
  return ledger_.EvictionCouldAdmit(s.id, need_pages, available);
}

std::optional<SessionManager::Victim> SessionManager::PickVictimLocked(uint64_t session_id) const {
  std::optional<AdmissionLedger::RequestKey> key = ledger_.PickVictim(session_id);
  if (!key.has_value()) return std::nullopt;
  auto it = sessions_.find(key->session_id);
  if (it == sessions_.end()) return std::nullopt;
  const Request* r = it->second->requests.Find(key->request_id);
  if (r == nullptr || r->importing()) return std::nullopt;
  return Victim{key->session_id, key->request_id, r->generation, it->second->sink};
}

size_t SessionManager::SweepRetiredSlabs() {
  NotifySlabDepartures();
  return pool_unlocked_->SweepRetired();  // punches outside every lock
}

void SessionManager::NotifySlabDepartures() {
  if (!pool_unlocked_->HasDepartures()) return;  // the common case, without the lock
  std::vector<std::pair<std::shared_ptr<EventSink>, v1::SessionEvent>> notices;
  {
    absl::MutexLock lock(&mu_);
    absl::flat_hash_map<uint64_t, size_t> notice_of;  // session id -> its entry of `notices`
    auto tell = [&](uint64_t session_id, uint64_t slab) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = sessions_.find(session_id);
      if (it == sessions_.end() || it->second->sink == nullptr) return;  // ended: nobody maps it now
      auto [at, fresh] = notice_of.try_emplace(session_id, notices.size());
      if (fresh) notices.emplace_back(it->second->sink, v1::SessionEvent());
      notices[at->second].second.mutable_slab_retired()->add_slabs(slab);
    };
    for (const PagePool::Departure& d : pool_->TakeDepartures()) {
      if (sessions_.contains(d.owner)) {
        tell(d.owner, d.slab);
        continue;
      }
      for (const auto& [key, group] : groups_.all()) {  // a TP group's slab: every member maps it
        if (group.owner != d.owner) continue;
        for (uint64_t member : group.ranks) tell(member, d.slab);
      }
    }
  }
  for (auto& [sink, event] : notices) {
    // Undelivered (the stream is gone or its outbox full): the engine keeps a mapping of a slab
    // whose memory is punched out, until its session ends.
    if (!(*sink)(event)) {
      absl::MutexLock lock(&mu_);
      ++undelivered_notices_;
    }
  }
}

}  // namespace hisparse
