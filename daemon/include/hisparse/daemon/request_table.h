// RequestTable: the one place that says what state a request is in.
//
// Every request the daemon holds is in exactly one RequestState, kept here and nowhere else:
//
//   state       holds a row   holds its pages   whose table                     what it may do
//   kLive       yes           yes               its live session's              extend, park, be evicted
//   kParked     no            yes               its live session's              resume, be evicted (first)
//   kImporting  yes           yes (registered)  its live session's              commit or abort its grant
//   kOrphaned   no            yes               the orphan of its ended session be adopted, expire
//
// The transitions, and who makes them (every one through this class, which moves the ledger's
// rows and parked flags with the state in the same call, so the two cannot disagree):
//
//   (none)     -> kLive       Admit          Admit, a shared-prefix Admit, a TP group's reservation
//                                            (admissions.cc, shared_prefixes.cc, group_requests.cc)
//   kLive      -> kImporting  BeginImport    Admit with begin_import (imports.cc)
//   kImporting -> kLive       CommitImport   CommitImport (imports.cc)
//   kLive      -> kParked     Park           Park, ParkBatch, ResumeBatch's undo (parking.cc,
//                                            batches.cc)
//   kParked    -> kLive       Resume         Resume, ResumeBatch, ParkBatch's undo
//   kLive,
//   kParked    -> kOrphaned   Orphan         the end of a session that keeps durable requests: every
//                                            request it keeps, at once (durability.cc)
//   kOrphaned  -> kParked     AdoptFrom      Adopt: every request of the orphan, into the adopter
//   any        -> (none)      Erase          Release, eviction, an import's abort or expiry, a lease's
//                                            end, a session's end, a batch's rollback
//
// An importing request is never parked, orphaned, extended or evicted: those callers refuse it
// (FAILED_PRECONDITION) before asking for a transition. A table is one session's (or one
// orphan's, under the ended session's id) and is bound to the node's AdmissionLedger, which keeps
// the tenant sums, rows and LRU times; the table is the ledger's only caller for a session's and a
// request's lifecycle (AddSession, Admit, Park, Resume, Release, OrphanSession, AdoptOrphan,
// RemoveSession). What a request holds besides its state (pages, charges, lease, group share) is
// plain data in RequestEntry that its owner module keeps.
//
// Not thread-safe: a session's table changes under the node's mutex held exclusively, or under its
// shared side and the session's own lock, with the ledger's lock for the calls that move the
// ledger (session_core.h, "Locks").
#ifndef HISPARSE_DAEMON_REQUEST_TABLE_H_
#define HISPARSE_DAEMON_REQUEST_TABLE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hisparse/daemon/admission_ledger.h"
#include "hisparse/daemon/page_pool.h"

namespace hisparse {

enum class RequestState : uint8_t { kLive, kParked, kImporting, kOrphaned };
// "live", "parked", "importing", "orphaned".
const char* RequestStateName(RequestState state);
// Whether a request in `state` holds a row of its session's slot arena.
constexpr bool HoldsRow(RequestState state) {
  return state == RequestState::kLive || state == RequestState::kImporting;
}

// One request of a session. Its state, row and import grant are the table's (read-only here);
// the rest is data its modules keep.
struct RequestEntry {
  uint64_t id = 0;
  absl::Time admitted_at;
  uint32_t capacity_tokens = 0;
  // Per layer, in position order: page i holds positions [i * R, (i + 1) * R), R the session's
  // records_per_page. Each holds one reference in the pool; a page another request of the
  // session holds too is in the session's sharers (shared_prefixes.cc).
  std::vector<std::vector<PagePool::Page>> pages;
  // The pages the ledger charges this request: its own, and the shared ones it is first of.
  uint64_t charged_pages = 0;
  // Which admission made this request: unique for the daemon's life (never reused, unlike request
  // ids), so a victim chosen under the lock and evicted after it is the same request and not one
  // released and admitted again under its id meanwhile. Set at construction; a move (adoption)
  // keeps it.
  uint64_t generation = NewGeneration();
  // Durable while the clock is before it (SetLease, AdmitRequest.lease_seconds): the request
  // then outlives its session's end as an orphan. Never set on an importing request.
  absl::Time lease_end = absl::InfinitePast();
  // A TP-group request (group_requests.cc): its pages are the group's (one set for every rank,
  // owned in the pool by the group's owner) and this is the session's share, its row. `attached`:
  // this rank's engine admitted it (false: reserved for it by another rank's admission).
  bool in_group = false;
  bool attached = true;

  RequestState state() const { return state_; }
  bool importing() const { return state_ == RequestState::kImporting; }
  // Parked or orphaned: holds no row.
  bool parked() const { return !HoldsRow(state_); }
  // The ledger's row; meaningless unless HoldsRow(state()).
  uint32_t row() const { return row_; }
  // The open import grant's id while importing; empty otherwise.
  const std::string& import_grant() const { return import_grant_; }
  uint64_t PageCount() const;
  static uint64_t NewGeneration();

 private:
  friend class RequestTable;
  RequestState state_ = RequestState::kLive;
  uint32_t row_ = 0;
  std::string import_grant_;
};

class RequestTable {
 public:
  using Map = absl::flat_hash_map<uint64_t, RequestEntry>;

  // Unbound and empty: Open binds it.
  RequestTable() = default;
  // A new session `session_id` of `tenant` with `rows` rows and `arena_bytes` of arena, recorded
  // in `ledger` (not owned; it outlives the table).
  static RequestTable Open(AdmissionLedger* ledger, uint64_t session_id, uint32_t tenant, uint32_t rows,
                           uint64_t arena_bytes);
  RequestTable(RequestTable&& other) noexcept;
  RequestTable& operator=(RequestTable&& other) noexcept;
  RequestTable(const RequestTable&) = delete;
  RequestTable& operator=(const RequestTable&) = delete;

  uint64_t session_id() const { return session_id_; }

  // Lookup. Find: null when the session holds no request `id`. An entry's address holds until
  // the next Admit or AdoptFrom of this table (they may rehash it) or its Erase.
  RequestEntry* Find(uint64_t id);
  const RequestEntry* Find(uint64_t id) const;
  bool contains(uint64_t id) const { return requests_.contains(id); }
  size_t size() const { return requests_.size(); }
  bool empty() const { return requests_.empty(); }
  // How many requests are in `state`.
  size_t Count(RequestState state) const;
  // Iteration (read-only: a state changes through the transitions below). Ids(): every request's
  // id, for loops that change or erase what they visit.
  Map::const_iterator begin() const { return requests_.begin(); }
  Map::const_iterator end() const { return requests_.end(); }
  std::vector<uint64_t> Ids() const;

  // ---- Transitions (see the top of this file). Each checks its from-state: a wrong one is a
  // caller's bug, refused with InternalError, and changes nothing. ----
  // (none) -> kLive in `row` (a FreeRow of the ledger), charged r.charged_pages; used now. The
  // id must be free (the caller checked: AlreadyExists is the caller's answer). The commit of an
  // admission.
  RequestEntry& Admit(RequestEntry r, uint32_t row);
  // kLive -> kImporting under `grant_id`.
  absl::Status BeginImport(RequestEntry& r, std::string grant_id);
  // kImporting -> kLive; used now.
  absl::Status CommitImport(RequestEntry& r);
  // kLive -> kParked: its row is free again.
  absl::Status Park(RequestEntry& r);
  // kParked -> kLive in `row` (a FreeRow of the ledger); used now.
  absl::Status Resume(RequestEntry& r, uint32_t row);
  // any -> (none): forgets request `id` and frees its row; its pages must be released already.
  void Erase(uint64_t id);
  // The session ended keeping these requests: every one -> kOrphaned (none may be importing),
  // and the session becomes an orphan in the ledger (no rows, no session or arena count).
  absl::Status Orphan();
  // Every request of `orphan` moves into this table, kOrphaned -> kParked, under its id; `orphan`
  // is left empty and unbound (its ledger entry is gone). The ids must be free here.
  absl::Status AdoptFrom(RequestTable& orphan);
  // The session (or orphan) is gone: it leaves the ledger with every request it still held (their
  // pages released by the caller). The table is left empty and unbound.
  void Close();

  // Exact: every request's state agrees with the ledger (its row, parked or not, orphan or not).
  absl::Status CheckInvariants() const;

 private:
  RequestTable(AdmissionLedger* ledger, uint64_t session_id) : ledger_(ledger), session_id_(session_id) {}
  absl::Status WrongState(const RequestEntry& r, const char* transition) const;

  AdmissionLedger* ledger_ = nullptr;  // not owned; null while unbound
  uint64_t session_id_ = 0;
  bool orphan_ = false;
  Map requests_;
};

// ---- Admission: reserve, then commit ----
//
// Every admission (one request, a shared-prefix child, a TP group's request for every rank) takes
// its resources in one place, Reserve: the tenant's quota for its pages and rows, a free row in
// each session that will hold it, then its pages from a PageSource. Nothing is recorded until the
// caller commits (RequestTable::Admit, once per row); a Reservation dropped uncommitted gives its
// pages back, so a failure between the two loses nothing.

// Where pages come from and go back to: the host pool (PoolPages below), or a fake in a test.
// `owner` is a session's id, or a TP group's owner id.
class PageSource {
 public:
  virtual ~PageSource() = default;
  // `count` pages of `owner`, after `after` where given (PagePool::Allocate). RESOURCE_EXHAUSTED
  // when there is no room.
  virtual absl::StatusOr<std::vector<PagePool::Page>> Allocate(uint64_t owner, uint32_t count,
                                                               const PagePool::Page* after) = 0;
  virtual absl::Status ReleaseAll(uint64_t owner, const std::vector<PagePool::Page>& pages) = 0;
};

// The host pool as a PageSource. Not owned; the pool is thread-safe itself.
class PoolPages final : public PageSource {
 public:
  explicit PoolPages(PagePool* pool) : pool_(pool) {}
  absl::StatusOr<std::vector<PagePool::Page>> Allocate(uint64_t owner, uint32_t count,
                                                       const PagePool::Page* after) override {
    return pool_->Allocate(owner, count, after);
  }
  absl::Status ReleaseAll(uint64_t owner, const std::vector<PagePool::Page>& pages) override {
    return pool_->ReleaseAll(owner, pages);
  }

 private:
  PagePool* pool_;
};

// What an admission asks for.
struct ReserveSpec {
  uint64_t charged_session = 0;        // whose tenant's quotas are checked
  std::vector<uint64_t> row_sessions;  // a free row in each, in this order (their count: requests)
  uint64_t owner = 0;                  // the pool owner of the pages
  uint64_t pages = 0;                  // 0: none (a child wholly inside its parent's pages)
};

struct ReserveOutcome;

// Resources held for an admission until it commits. Move-only; dropping it uncommitted returns
// its pages to their source.
class Reservation {
 public:
  Reservation(PageSource* source, uint64_t owner) : source_(source), owner_(owner) {}
  Reservation(Reservation&& other) noexcept;
  Reservation& operator=(Reservation&& other) noexcept;
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  ~Reservation();

  // The free row of each of ReserveSpec::row_sessions, in that order.
  const std::vector<uint32_t>& rows() const { return rows_; }
  const std::vector<PagePool::Page>& pages() const { return pages_; }
  // The pages, for the caller to commit into requests: the reservation no longer returns them.
  std::vector<PagePool::Page> TakePages() { return std::exchange(pages_, {}); }

 private:
  friend ReserveOutcome Reserve(const AdmissionLedger& ledger, PageSource& source, const ReserveSpec& spec,
                                absl::StatusOr<std::vector<PagePool::Page>>* taken);
  void Release();

  PageSource* source_ = nullptr;
  uint64_t owner_ = 0;
  std::vector<uint32_t> rows_;
  std::vector<PagePool::Page> pages_;
};

// Reserve's answer: a reservation, or why not. A refusal to count (Stats' rejections_by_reason)
// has its reason in `counted`; `failed_row` names the row_sessions entry that had no free row (-1
// otherwise); `lacked_room`: the pages did not fit (the one refusal that evicting can cure).
struct ReserveOutcome {
  std::optional<Reservation> reservation;
  absl::Status status;
  std::optional<RejectReason> counted;
  int failed_row = -1;
  bool lacked_room = false;
};
// Reserve's checks before any page: the quota (CheckGrow: spec.pages, one request per row), then a
// free row in each session (into `rows`, when given); the refusal, and which row failed. A hot
// admission asks it before taking pages, so that a refused request takes none.
std::optional<Refusal> CheckReserve(const AdmissionLedger& ledger, const ReserveSpec& spec,
                                    std::vector<uint32_t>* rows = nullptr, int* failed_row = nullptr);
// In order: the quota (CheckGrow: spec.pages, one request per row), a free row in each session,
// then the pages. Changes nothing in the ledger. `taken` (may be null): the spec.pages pages the
// caller already took from `source` for this (or why it could not), answered at the page step as
// an allocation would be, and given back on any refusal: a hot admission takes its pages before
// the ledger's lock (session_core.h, "Locks").
ReserveOutcome Reserve(const AdmissionLedger& ledger, PageSource& source, const ReserveSpec& spec,
                       absl::StatusOr<std::vector<PagePool::Page>>* taken = nullptr);

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_REQUEST_TABLE_H_
