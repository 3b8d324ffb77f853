// SessionCore: the state and primitives every request-lifecycle module shares (session_core.h).
#include "hisparse/daemon/session_core.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "hisparse/common/log.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/daemon/deferred_log.h"
#include "hisparse/daemon/group_requests.h"
#include "hisparse/daemon/request_journal.h"
#include "hisparse/daemon/shared_prefixes.h"

namespace hisparse {
namespace {

// Constant-time comparison: the token is a capability.
bool TokenEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

SessionCore::SessionCore(const SessionOptions& options, std::unique_ptr<PagePool> pool)
    : options_(options),
      pool_(std::move(pool)),
      pool_unlocked_(pool_.get()),
      // Retired slabs an engine may still hold count against its tenant's host quota until the
      // pool sees them freed (page_pool.h); the pool is thread-safe and outlives the ledger.
      ledger_(options.quotas, pool_->page_bytes(), options.clock ? options.clock : AdmissionLedger::Clock(absl::Now),
              [pool = pool_.get()](uint32_t tenant) { return pool->RetiredBytesOf(tenant); }),
      pages_(pool_.get()) {
  absl::MutexLock lock(&mu_);
  next_session_id_ = std::max<uint64_t>(options.first_session_id, 1);
  if (options.journal != nullptr) {
    // A slab the pool drops leaves the fd store too (on the pool's worker, outside every lock).
    pool_->SetSlabDroppedHook([journal = options.journal](uint64_t slab) { journal->SlabGone(slab); });
  }
}

void SessionCore::SetRequestChanges(RequestChanges* changes) {
  absl::MutexLock lock(&mu_);
  changes_ = changes;
}

void SessionCore::TouchedLocked(const Session& s, const Request& r) {
  if (changes_ != nullptr) changes_->TouchedLocked(s, r);
}

void SessionCore::LeftLocked(uint64_t session_id, uint64_t request_id) {
  if (changes_ != nullptr) changes_->LeftLocked(session_id, request_id);
}

absl::Time SessionCore::Now() const { return options_.clock ? options_.clock() : absl::Now(); }

absl::Status SessionCore::Reject(RejectReason reason, absl::Status status) {
  ++rejections_;
  ++rejections_by_reason_[RejectReasonName(reason)];
  return status;
}

std::function<void()> SessionCore::TakeIdleCallbackLocked() {
  if (!draining_ || !sessions_.empty() || !on_idle_) return {};
  return std::exchange(on_idle_, nullptr);
}

absl::StatusOr<SessionCore::Session*> SessionCore::FindLocked(const v1::SessionRef& ref) {
  auto it = sessions_.find(ref.session_id());
  if (it == sessions_.end() || !TokenEquals(it->second->token, ref.token())) {
    return absl::PermissionDeniedError(
        absl::StrCat("session ", ref.session_id(), " is not a live session of this caller"));
  }
  return it->second.get();
}

absl::StatusOr<SessionCore::Request*> SessionCore::FindRequestLocked(const v1::SessionRef& ref, uint64_t request_id) {
  HS_ASSIGN_OR_RETURN(Session * s, FindLocked(ref));
  return RequestOf(*s, request_id);
}

absl::StatusOr<SessionCore::Request*> SessionCore::RequestOf(Session& s, uint64_t request_id) {
  Request* r = s.requests.Find(request_id);
  if (r == nullptr) {
    return absl::NotFoundError(absl::StrCat("request ", request_id, " is not admitted in this session"));
  }
  return r;
}

void SessionCore::ReleaseRequestLocked(Session& s, Request& r) {
  if (!r.in_group) return ReleaseOwnLocked(s, r);
  const uint64_t id = r.id;
  TouchedLocked(s, r);  // a Forget, when the journal holds it
  GroupRequests::ReleaseShareLocked(*this, s, r);
  s.requests.Erase(id);
}

void SessionCore::ReleaseOwnLocked(Session& s, Request& r) {
  ReleasePagesLocked(s, r);
  TouchedLocked(s, r);  // a Forget, when the journal holds it
  ForgetOwnLocked(s, r);
}

void SessionCore::ReleasePagesLocked(const Session& s, const Request& r) {
  // A page another request shares keeps that request's reference; the charge moves in ForgetOwnLocked.
  if (absl::Status st = pool_->ReleaseAll(s.id, r.pages); !st.ok()) {
    LOCKED_LOG(ERROR) << "accounting error releasing pages of session " << s.id << ": " << st;
  }
}

void SessionCore::ForgetOwnLocked(Session& s, Request& r) {
  const uint64_t id = r.id;
  SharedPrefixes::UnshareLocked(*this, s, r);
  r.pages.clear();
  s.requests.Erase(id);
}

void SessionCore::FillLayers(const Session& s, const Request& r,
                             google::protobuf::RepeatedPtrField<v1::LayerPages>* out) const {
  const uint64_t page_bytes = pool_->page_bytes();  // const in the pool
  for (size_t layer = 0; layer < r.pages.size(); ++layer) {
    v1::LayerPages* lp = out->Add();
    lp->set_layer(static_cast<uint32_t>(layer));
    for (const PagePool::Page& p : r.pages[layer]) {
      v1::PageRef* ref = lp->add_pages();
      ref->set_slab(p.slab);
      ref->set_offset(uint64_t{p.index} * page_bytes);
      if (s.sharers.IsShared(p)) ref->set_read_only(true);
    }
  }
}

uint64_t SessionCore::PagesFor(const Session& s, uint64_t tokens) {
  return (tokens + s.records_per_page - 1) / s.records_per_page;
}

absl::Status SessionCore::CheckBudget(const Session& s, uint32_t token_budget) {
  const uint64_t max_tokens = std::min<uint64_t>(uint64_t{s.records_per_page} * s.pages_per_entry, INT32_MAX);
  if (token_budget == 0 || token_budget > max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("token_budget must be 1..", max_tokens,
                     " (geometry.max_context_tokens or limits.max_tokens_per_request, in whole pages of ",
                     s.records_per_page, " records), got ", token_budget));
  }
  return absl::OkStatus();
}

v1::AdmitResponse SessionCore::AdmitAnswerLocked(const Session& s, const Request& r) const {
  v1::AdmitResponse resp;
  resp.set_row(r.row());
  resp.set_capacity_tokens(r.capacity_tokens);
  FillLayers(s, r, resp.mutable_layers());
  return resp;
}

absl::StatusOr<uint64_t> SessionCore::EvictVictim(const Victim& v, const std::string& reason) {
  v1::SessionEvent event;
  event.mutable_evicted()->set_request_id(v.request_id);
  event.mutable_evicted()->set_reason(reason);
  // The notice is posted before the memory is released, outside the lock; posting never waits on
  // the stream (the service queues it), so an engine that does not read cannot stall this.
  const bool told = v.sink != nullptr && (*v.sink)(event);
  DeferredLog log;  // written once the lock is released
  NodeLock lock(*this);
  auto it = sessions_.find(v.session_id);
  if (it == sessions_.end()) return absl::NotFoundError("the session ended while evicting");
  // The lock was dropped since the victim was chosen: only that very request may go. Its id may
  // name another one now (released and admitted again, perhaps as an import whose grant is open).
  Request* r = it->second->requests.Find(v.request_id);
  if (r == nullptr || r->generation != v.generation) {
    return absl::NotFoundError(
        absl::StrCat("request ", v.request_id, " was released while evicting (its id may name a newer request)"));
  }
  if (r->importing()) {
    return absl::FailedPreconditionError(absl::StrCat("request ", v.request_id, " is importing: it is not evicted"));
  }
  const uint64_t freed =
      (r->PageCount() - GroupRequests::UnfreedPagesOfLocked(*this, *it->second, *r)) * pool_->page_bytes();
  ReleaseRequestLocked(*it->second, *r);
  ++evictions_;
  if (!told) ++undelivered_notices_;
  DEFERRED_LOG(log, INFO) << "evicted request " << v.request_id << " of session " << v.session_id << " (" << freed
                          << " bytes; " << reason
                          << (told ? ")" : "; the notice was not delivered: its stream is gone or not read)");
  return freed;
}

absl::Status SessionCore::Reject(Refusal refusal) { return Reject(refusal.reason, std::move(refusal.status)); }

absl::StatusOr<SessionCore::Layers> SessionCore::TakeLayerPages(uint64_t owner, const Layers& layers,
                                                                uint64_t extra) const {
  if (extra > UINT32_MAX) {
    return absl::ResourceExhaustedError(absl::StrCat("a request of ", extra, " pages exceeds any host pool"));
  }
  Layers added(layers.size());
  for (size_t layer = 0; extra != 0 && layer < layers.size(); ++layer) {
    absl::StatusOr<std::vector<PagePool::Page>> got =
        pool_unlocked_->Allocate(owner, static_cast<uint32_t>(extra), &layers[layer].back());
    if (!got.ok()) {
      (void)pool_unlocked_->ReleaseAll(owner, added);  // taken a moment ago: giving them back cannot fail
      // The first layer that wants a slab made asks for every layer's: one slab, one try more.
      if (absl::IsUnavailable(got.status())) PagePool::SlabsOutsideLocks::WidenWant({owner, extra * layers.size()});
      return got.status();
    }
    added[layer] = *std::move(got);
  }
  return added;
}

SessionCore::AdmitOutcome SessionCore::RefusedLocked(ReserveOutcome outcome) {
  absl::Status status =
      outcome.counted.has_value() ? Reject(*outcome.counted, std::move(outcome.status)) : std::move(outcome.status);
  return {std::move(status), outcome.lacked_room};
}

bool SessionCore::EvictionCouldAdmitLocked(const Session& s, uint64_t need_pages) const {
  const PagePool::Stats st = pool_->GetStats();
  // What the pool could give this session now: its own slabs' free pages, every page of budget not
  // in a slab of another session, and other sessions' idle slabs.
  const uint64_t available = (st.ready_bytes + st.unallocated_bytes) / st.page_bytes + pool_->FreePagesOf(s.id) +
                             pool_->ReclaimablePagesFor(s.id);
  return ledger_.EvictionCouldAdmit(s.id, need_pages, available);
}

std::optional<SessionCore::Victim> SessionCore::PickVictimLocked(uint64_t session_id) const {
  std::optional<AdmissionLedger::RequestKey> key = ledger_.PickVictim(session_id);
  if (!key.has_value()) return std::nullopt;
  auto it = sessions_.find(key->session_id);
  if (it == sessions_.end()) return std::nullopt;
  const Request* r = it->second->requests.Find(key->request_id);
  if (r == nullptr || r->importing()) return std::nullopt;
  return Victim{key->session_id, key->request_id, r->generation, it->second->sink};
}

bool SessionCore::MakeWantedSlabs(PagePool::SlabsOutsideLocks& outside) {
  if (!outside.MakeWanted(*pool_unlocked_)) return false;
  if (outside.made() == kSlabRounds - 1) outside.Lift();
  absl::ReaderMutexLock lock(&mu_);
  if (!OwnerLiveLocked(outside.made_for())) pool_->RetireIdleOf(outside.made_for());
  return true;
}

bool SessionCore::OwnerLiveLocked(uint64_t owner) const {
  if (sessions_.contains(owner)) return true;
  for (const auto& [key, group] : groups_.all()) {
    if (group.owner == owner) return true;
  }
  return false;
}

void SessionCore::NotifySlabDepartures() {
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
