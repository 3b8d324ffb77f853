// Admissions: a request admitted, extended, released or evicted (admissions.cc says in what order
// it checks). A module over SessionCore (session_core.h): the request's state is its session's
// RequestTable's, its quota the ledger's, its pages the pool's; a request naming a parent is
// SharedPrefixes', one of a TP group GroupRequests'. An import's admission is Imports' (imports.h).
#ifndef HISPARSE_DAEMON_ADMISSIONS_H_
#define HISPARSE_DAEMON_ADMISSIONS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "hisparse/daemon/durability.h"
#include "hisparse/daemon/session_core.h"
#include "hisparse/v1/hisparse.pb.h"

namespace hisparse {

class Admissions {
 public:
  using Session = SessionEntry;
  using Request = RequestEntry;
  Admissions(SessionCore& core, Durability& durability);
  // Every module shares the core's one mutex. A module that holds it and calls a *Locked function
  // here says so first (clang's analysis cannot see that two modules' cores are one object).
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK(core_.mu_, core_.ledger_mu_) {
    core_.mu_.AssertHeld();
    core_.ledger_mu_.AssertHeld();
  }

  // A request that is not an import: a free row of the session's arena and, per layer, the pages
  // of token_budget records; all or nothing. Under admission.on_pool_full = evict_lru_idle a full
  // pool evicts the tenant's least recently used request (its session told first) and tries again.
  absl::StatusOr<v1::AdmitResponse> Admit(const v1::AdmitRequest& req) ABSL_LOCKS_EXCLUDED(core_.mu_);
  // One try of Admit (an import's too, which Imports marks importing after it): no eviction.
  SessionCore::AdmitOutcome AdmitLocked(const v1::AdmitRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_);
  // Extend appends pages to every layer and never moves a record; all or nothing.
  absl::StatusOr<v1::ExtendResponse> Extend(const v1::ExtendRequest& req) ABSL_LOCKS_EXCLUDED(core_.mu_);
  // Release, hot (session_core.h, "Locks"): answered, or unset for a request that is importing
  // (its release is Imports' abort) or a TP group's share (Release below).
  std::optional<absl::Status> ReleaseHot(const v1::ReleaseRequest& req) ABSL_LOCKS_EXCLUDED(core_.mu_);
  // Release of a request that is not importing, under the node's lock.
  absl::Status Release(const v1::ReleaseRequest& req) ABSL_LOCKS_EXCLUDED(core_.mu_);
  // An operator's (or, with `only_uid`, a tenant's) eviction: the session hears of it before its
  // memory is released. An orphan's request is Durability's.
  absl::StatusOr<v1::EvictResponse> Evict(const v1::EvictRequest& req, std::optional<uint32_t> only_uid)
      ABSL_LOCKS_EXCLUDED(core_.mu_);

 private:
  // One try of Admit or Extend: Unavailable when it wanted a slab made outside the locks.
  absl::StatusOr<v1::AdmitResponse> AdmitOnce(const v1::AdmitRequest& req) ABSL_LOCKS_EXCLUDED(core_.mu_);
  absl::StatusOr<v1::ExtendResponse> ExtendOnce(const v1::ExtendRequest& req) ABSL_LOCKS_EXCLUDED(core_.mu_);
  // A hot call whose pages `wanted` a slab made outside the locks (Unavailable): that answer, or,
  // when its quota refuses it (`refusal`), the refusal, counted, and nothing made for it.
  absl::Status UnlessRefusedLocked(absl::Status wanted, std::optional<Refusal> refusal)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.ledger_mu_);
  // A plain request's Admit under its session's lock (the node's mutex shared); deferred when it
  // lacked room and evicting may make some.
  SessionCore::AdmitOutcome AdmitHot(const v1::AdmitRequest& req) ABSL_LOCKS_EXCLUDED(core_.mu_);
  // The checks every admission makes first, in order: draining (a refusal, counted), then
  // ValidRequest's: the id, the budget, the context.
  absl::Status CheckRequestLocked(const Session& s, const v1::AdmitRequest& req) ABSL_SHARED_LOCKS_REQUIRED(core_.mu_)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.ledger_mu_);
  static absl::Status ValidRequest(const Session& s, const v1::AdmitRequest& req);
  // Then, for a request of the session's own pages: its id is free, its lease allowed.
  absl::Status CheckOwnLocked(const Session& s, const v1::AdmitRequest& req) ABSL_SHARED_LOCKS_REQUIRED(core_.mu_);
  // Reserve, then commit, a request of `s`'s own pages (no parent, no group): the request, in its
  // table with its pages not yet laid out by layer (AnswerLocked does, after the ledger's lock), or
  // why not. With `defer_room`, a want of room is answered deferred (uncounted), for the exclusive
  // path.
  struct Committed {
    Request* request = nullptr;  // null: refused
    std::vector<PagePool::Page> pages;
    SessionCore::AdmitOutcome refused;
  };
  // `taken`: its pages, taken beforehand (Reserve's); null: Reserve takes them.
  Committed CommitOwnLocked(Session& s, const v1::AdmitRequest& req, bool defer_room,
                            absl::StatusOr<std::vector<PagePool::Page>>* taken) ABSL_SHARED_LOCKS_REQUIRED(core_.mu_)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.ledger_mu_);
  // The committed request's pages laid out by layer, and its answer (under `s`'s lock).
  v1::AdmitResponse AnswerLocked(Session& s, const Committed& committed) ABSL_SHARED_LOCKS_REQUIRED(core_.mu_);
  // FailedPrecondition for an importing request, which is extended after its commit.
  static absl::Status NotImporting(const Request& r);
  // Extend of a request of `s`'s own pages (not importing), under the node's lock.
  absl::StatusOr<v1::ExtendResponse> ExtendOwnLocked(Session& s, Request& r, const v1::ExtendRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_);
  // Its parts, which a hot Extend runs with the pages taken before the ledger's lock
  // (SessionCore::TakeLayerPages): the pages each layer needs more (or why the budget is refused);
  // the commit; the answer.
  using Layers = SessionCore::Layers;
  static absl::StatusOr<uint64_t> ExtraPages(const Session& s, const Request& r, const v1::ExtendRequest& req);
  void CommitExtendLocked(Session& s, Request& r, uint32_t token_budget, uint64_t extra, const Layers& added)
      ABSL_SHARED_LOCKS_REQUIRED(core_.mu_) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.ledger_mu_);
  v1::ExtendResponse ExtendAnswerLocked(const Session& s, const Request& r) ABSL_SHARED_LOCKS_REQUIRED(core_.mu_);

  SessionCore& core_;
  Durability& durability_;
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_ADMISSIONS_H_
