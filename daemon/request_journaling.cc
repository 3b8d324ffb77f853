// RequestJournaling: the request journal's side here (request_journaling.h, request_journal.h;
// docs/DESIGN.md, "Restarts without loss"): what each call decides for the journal under the lock, its commit after it,
// and the durable requests a former life journaled, restored as orphans at start.
//
// A call that may change a durable request touches it (SessionCore::TouchedLocked: admission with a lease,
// Extend, SetLease, any release, adoption) and SessionManager flushes as the call returns. The flush
// decides, under the lock, a record per touched request from what it is now (a Put when it is
// durable, a Forget when the journal held it and it is not), takes a ticket, and commits the batch
// after the lock; then it waits until every batch decided before is committed too, so that no call
// answers before the journal holds what it did, even when another call's flush took its records.
#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "hisparse/common/log.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/daemon/deferred_log.h"
#include "hisparse/daemon/request_journaling.h"

namespace hisparse {
namespace {

journal::Session SessionRecord(const SessionEntry& s) {
  journal::Session out;
  out.set_id(s.id);
  out.set_tenant_uid(s.tenant_uid);
  out.set_engine_name(s.engine_name);
  *out.mutable_geometry() = s.geometry;
  out.set_records_per_page(s.records_per_page);
  out.set_pages_per_entry(s.pages_per_entry);
  return out;
}

}  // namespace

RequestJournaling::RequestJournaling(SessionCore& core, Durability& durability, RequestJournal* journal)
    : core_(core), durability_(durability), journal_(journal) {}

void FillRestartStats(const RequestJournal& journal, v1::RestartStats* out) {
  const RequestJournal::Stats j = journal.GetStats();
  out->set_journal(true);
  out->set_journal_generation(j.generation);
  out->set_journal_bytes(j.bytes);
  out->set_journal_requests(j.live_requests);
  out->set_stored_slabs(j.stored_slabs);
  out->set_unstored_slabs(j.unstored_slabs);
  out->set_journal_failures(j.failures);
  out->set_recovered_requests(j.recovered_requests);
  out->set_dropped_requests(j.dropped_requests);
  out->set_journal_refused(j.refused);
  out->set_recovery_seconds(j.recovery_seconds);
}

void RequestJournaling::TouchedLocked(const SessionEntry& s, const RequestEntry& r) {
  if (journal_ == nullptr) return;  // fixed at construction: no lock for a daemon without one
  absl::MutexLock lock(&mu_);
  const JournalKey key{s.id, r.id};
  // Most requests never had a lease: no clock read for them.
  const bool never_leased = r.lease_end == absl::InfinitePast();
  if (!journaled_.contains(key) && (never_leased || r.in_group || !DurableRequests::Durable(r, core_.Now()))) return;
  touched_.push_back(key);
  pending_.store(true, std::memory_order_release);
}

void RequestJournaling::LeftLocked(uint64_t session_id, uint64_t request_id) {
  if (journal_ == nullptr) return;
  absl::MutexLock lock(&mu_);
  const JournalKey key{session_id, request_id};
  if (!journaled_.contains(key)) return;
  touched_.push_back(key);
  pending_.store(true, std::memory_order_release);
}

JournalBatch RequestJournaling::DecideLocked() {
  JournalBatch batch;
  batch.ticket = journal_->TakeTicket();
  durability_.AssertHeld();
  std::vector<JournalKey> touched = std::exchange(touched_, {});
  const absl::Time now = core_.Now();
  absl::flat_hash_set<JournalKey> seen;
  for (const JournalKey& key : touched) {
    if (!seen.insert(key).second) continue;
    const SessionEntry* s = nullptr;
    if (auto it = core_.sessions_.find(key.session_id); it != core_.sessions_.end()) {
      s = it->second.get();
    } else {
      s = durability_.orphans().Find(key.session_id);
    }
    const RequestEntry* r = s != nullptr ? s->requests.Find(key.request_id) : nullptr;
    const bool durable = r != nullptr && !r->in_group && DurableRequests::Durable(*r, now);
    journal::Record record;
    if (durable) {
      journal::Put* put = record.mutable_put();
      *put->mutable_session() = SessionRecord(*s);
      put->set_request_id(r->id);
      put->set_capacity_tokens(r->capacity_tokens);
      put->set_lease_end_unix_nanos(absl::ToUnixNanos(r->lease_end));
      put->set_order(r->generation);
      std::set<uint64_t> slabs;
      for (const std::vector<PagePool::Page>& pages : r->pages) {
        journal::Layer* layer = put->add_layers();
        for (const PagePool::Page& p : pages) {
          layer->add_slab(p.slab);
          layer->add_index(p.index);
          slabs.insert(p.slab);
        }
      }
      for (uint64_t slab : slabs) {
        if (!journal_->ClaimSlab(slab)) continue;
        absl::StatusOr<UniqueFd> fd = core_.pool_->DupSlabFd(s->id, slab);
        if (!fd.ok()) {
          LOCKED_LOG(ERROR) << "journal: slab " << slab << " of session " << s->id << ": " << fd.status();
          journal_->UnclaimSlab(slab);  // the next record that names it tries again
          continue;
        }
        batch.slabs.push_back(JournalBatch::NewSlab{slab, *std::move(fd)});
      }
      journaled_.insert(key);
    } else if (journaled_.erase(key) != 0) {
      record.mutable_forget()->set_session_id(key.session_id);
      record.mutable_forget()->set_request_id(key.request_id);
    } else {
      continue;
    }
    record.set_seq(++seq_);
    batch.records.push_back(std::move(record));
  }
  decided_.store(batch.ticket, std::memory_order_release);
  pending_.store(false, std::memory_order_release);
  return batch;
}

void RequestJournaling::Flush() {
  RequestJournal* const journal = journal_;
  if (journal == nullptr) return;
  // pending is read before decided: a flush that took this call's records stored its ticket in
  // decided before it cleared pending.
  if (!pending_.load(std::memory_order_acquire) && journal->committed() >= decided_.load(std::memory_order_acquire)) {
    return;
  }
  std::optional<JournalBatch> batch;
  uint64_t wait_for = 0;
  {
    NodeLock lock(core_);
    absl::MutexLock touched(&mu_);
    if (!touched_.empty()) batch = DecideLocked();
    wait_for = decided_.load(std::memory_order_relaxed);
  }
  if (batch.has_value()) {
    const size_t records = batch->records.size();
    if (absl::Status st = journal->Commit(*std::move(batch)); !st.ok()) {
      LOCKED_LOG(ERROR) << "request journal: committing " << records << " records: " << st
                        << "; a restart may not find these durable requests as they are now";
    }
  }
  journal->WaitCommitted(wait_for);
}

absl::StatusOr<size_t> RequestJournaling::RestoreOrphans(const std::vector<journal::Put>& puts) {
  std::map<uint64_t, std::vector<const journal::Put*>> by_session;
  for (const journal::Put& put : puts) by_session[put.session().id()].push_back(&put);
  DeferredLog log;  // written once the lock is released
  NodeLock lock(core_);
  durability_.AssertHeld();
  if (!core_.sessions_.empty() || !durability_.orphans().all().empty()) {
    return absl::FailedPreconditionError("orphans are restored at start, before any session");
  }
  size_t restored = 0;
  for (auto& [id, group] : by_session) {
    // In admission order: of the requests sharing a page the earliest pays for it.
    std::sort(group.begin(), group.end(),
              [](const journal::Put* a, const journal::Put* b) { return a->order() < b->order(); });
    const journal::Session& rec = group.front()->session();
    SessionEntry dead;
    dead.id = id;
    dead.engine_name = rec.engine_name();
    dead.geometry = rec.geometry();
    dead.records_per_page = rec.records_per_page();
    dead.pages_per_entry = rec.pages_per_entry();
    dead.tenant_uid = rec.tenant_uid();
    dead.requests = RequestTable::Open(&core_.ledger_, id, rec.tenant_uid(), static_cast<uint32_t>(group.size()), 0);
    std::map<PagePool::Page, std::vector<uint64_t>> holders;
    for (const journal::Put* put : group) {
      for (const journal::Layer& layer : put->layers()) {
        for (int i = 0; i < layer.slab_size(); ++i)
          holders[{layer.slab(i), layer.index(i)}].push_back(put->request_id());
      }
    }
    uint32_t row = 0;
    for (const journal::Put* put : group) {
      RequestEntry r;
      r.id = put->request_id();
      r.admitted_at = absl::Now();
      r.capacity_tokens = put->capacity_tokens();
      r.lease_end = absl::FromUnixNanos(put->lease_end_unix_nanos());
      for (const journal::Layer& layer : put->layers()) {
        std::vector<PagePool::Page>& pages = r.pages.emplace_back();
        for (int i = 0; i < layer.slab_size(); ++i) {
          const PagePool::Page p{layer.slab(i), layer.index(i)};
          pages.push_back(p);
          if (holders.at(p).front() == r.id) ++r.charged_pages;
        }
      }
      dead.requests.Admit(std::move(r), row++);
      absl::MutexLock touched(&mu_);
      journaled_.insert(JournalKey{id, put->request_id()});
    }
    for (const auto& [page, who] : holders) {
      for (size_t i = 1; i < who.size(); ++i) dead.sharers.Share(page, who.front(), who[i]);
    }
    restored += group.size();
    core_.next_session_id_ = std::max(core_.next_session_id_, id + 1);
    if (absl::Status may = durability_.orphans().MayKeep(dead.tenant_uid); !may.ok()) {
      DEFERRED_LOG(log, WARNING) << "restart: session " << id << " of uid " << dead.tenant_uid << " kept "
                                 << group.size() << " durable requests, but " << may.message() << ": released them";
      for (uint64_t rid : dead.requests.Ids()) core_.ReleaseRequestLocked(dead, *dead.requests.Find(rid));
      restored -= group.size();
      core_.pool_->RetireIdleOf(id);
      dead.requests.Close();
      continue;
    }
    core_.pool_->RetireIdleOf(id);  // slabs whose every page died with the former life
    HS_RETURN_IF_ERROR(durability_.orphans().Keep(dead));
    DEFERRED_LOG(log, INFO) << "restart: session " << id << " of uid " << dead.tenant_uid << " (" << dead.engine_name
                            << "): " << group.size()
                            << " durable requests kept, parked, for a session of the same tenant and engine to adopt";
  }
  return restored;
}

}  // namespace hisparse
