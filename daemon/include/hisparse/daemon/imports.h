// Imports: a prefill node writes a request's records into its pages (imports.cc and
// docs/DESIGN.md, "Import"). A request admitted with begin_import holds its pages and row like any
// other but is importing (its RequestTable's state) until the transfer agent commits or aborts its
// grant. A module over SessionCore (session_core.h) and Admissions; the grants' lives are
// ImportGrants' (import_grants.h), kept under the core's mutex. Codes: CommitImport in hisparse.proto.
#ifndef HISPARSE_DAEMON_IMPORTS_H_
#define HISPARSE_DAEMON_IMPORTS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hisparse/daemon/admissions.h"
#include "hisparse/daemon/deferred_log.h"
#include "hisparse/daemon/durability.h"
#include "hisparse/daemon/import_grants.h"
#include "hisparse/daemon/import_target.h"
#include "hisparse/daemon/session_core.h"
#include "hisparse/v1/hisparse.pb.h"

namespace hisparse {

class Imports {
 public:
  using Session = SessionEntry;
  using Request = RequestEntry;
  Imports(SessionCore& core, Admissions& admissions, Durability& durability);
  // Every module shares the core's one mutex. A module that holds it and calls a *Locked function
  // here says so first (clang's analysis cannot see that two modules' cores are one object).
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK(core_.mu_, core_.ledger_mu_) {
    core_.mu_.AssertHeld();
    core_.ledger_mu_.AssertHeld();
  }

  // Where granted memory is registered for remote writes; null (the default): imports are
  // refused with FailedPrecondition. Not owned; must outlive every call that can reach it.
  void SetTarget(ImportTarget* target) ABSL_LOCKS_EXCLUDED(core_.mu_);
  // Admit with begin_import: admits as Admit does (without evicting), marks the request importing,
  // registers its pages with the target and answers the grant.
  absl::StatusOr<v1::AdmitResponse> Admit(const v1::AdmitRequest& req) ABSL_LOCKS_EXCLUDED(core_.mu_);
  // The transfer agent's calls, by grant; `caller_uid` must be the session's tenant.
  absl::Status Commit(const v1::CommitImportRequest& req, uint32_t caller_uid) ABSL_LOCKS_EXCLUDED(core_.mu_);
  absl::Status Abort(const v1::AbortImportRequest& req, uint32_t caller_uid) ABSL_LOCKS_EXCLUDED(core_.mu_);
  // Aborts every open grant whose expiry (options.clock) has passed; returns how many.
  size_t Expire() ABSL_LOCKS_EXCLUDED(core_.mu_);
  // The target lost these grants (its worker died): each open one is aborted with `reason`. A
  // grant busy at that moment stays open and expires. Returns how many were aborted.
  size_t AbortLost(const std::vector<std::string>& grant_ids, const std::string& reason) ABSL_LOCKS_EXCLUDED(core_.mu_);
  // Release of an importing request: an abort. Unset when the request is not importing.
  std::optional<absl::Status> ReleaseIfImporting(const v1::ReleaseRequest& req) ABSL_LOCKS_EXCLUDED(core_.mu_);
  // Aborts the import of request `request_id` of `session_id` under grant `grant_id`, as Release
  // does (its memory revoked outside the lock first).
  absl::Status AbortReleased(const std::string& grant_id, uint64_t session_id, uint64_t request_id)
      ABSL_LOCKS_EXCLUDED(core_.mu_);
  // Before a session closes: waits out its busy grants and revokes the rest (their requests are
  // released with the session).
  void RevokeOf(uint64_t session_id) ABSL_LOCKS_EXCLUDED(core_.mu_);

  // An import admitted under the lock whose pages are not registered yet (Admit's first step, and
  // an AdmitBatch import item's): its grant is busy, so nothing else finishes it and its session
  // waits for it before closing.
  struct Opened {
    std::string grant_id;
    uint64_t session_id = 0;
    uint64_t request_id = 0;
    ImportTarget* target = nullptr;                  // not owned (SetTarget's)
    PagePool* pool = nullptr;                        // the core's (thread-safe itself): dups the slabs' memfds
    std::vector<std::vector<PagePool::Page>> pages;  // per layer, in position order
    uint64_t page_bytes = 0;
    ImportLayout layout;  // what the grant covers (the target checks every write against it)
    absl::Time expires;
  };
  // Refuses where imports are off or the session closes, admits as Admissions::AdmitLocked (never
  // evicting), marks the request importing under a new busy grant and fills resp (the grant's header).
  absl::StatusOr<Opened> OpenLocked(const v1::AdmitRequest& req, v1::AdmitResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_);
  // Opens the grant's pages for checked writes at its target (outside the lock): hands it a dup
  // of each slab's memfd and the pages' offsets (the target's worker maps them itself).
  static absl::Status Register(const Opened& o);
  // After Register, under the lock again: Publish makes the grant usable (not busy) and adds the
  // worker address to resp (its log line joins `log`, written after the lock); Drop forgets the
  // grant and frees the request (its pages no longer open to writes: never registered, or
  // unregistered by the caller first).
  void PublishLocked(const Opened& o, v1::AdmitResponse* resp, DeferredLog& log)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_);
  void DropLocked(const Opened& o) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_);
  // Forgets an unregistered grant whose request the caller releases itself (a batch's rollback).
  void ForgetLocked(const std::string& grant_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_);
  // Stats' import figures.
  void FillStatsLocked(v1::StatsResponse* out) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_);

 private:
  enum class Outcome { kCommit, kAbort, kExpire };
  // Commit, abort or expire one grant: checks it (session, request, tenant) and marks it busy
  // under the lock, revokes its memory outside it, then makes the request live or frees it and
  // tells the session. `caller_uid` unset: the daemon itself.
  absl::Status Finish(const std::string& grant_id, uint64_t session_id, uint64_t request_id,
                      std::optional<uint32_t> caller_uid, Outcome outcome, const std::string& reason)
      ABSL_LOCKS_EXCLUDED(core_.mu_);
  // Finish of each of `grants` (those finished meanwhile are refused and skipped); how many it finished.
  size_t FinishEach(const std::vector<ImportGrants::Ref>& grants, Outcome outcome, const std::string& reason)
      ABSL_LOCKS_EXCLUDED(core_.mu_);

  SessionCore& core_;
  Admissions& admissions_;
  Durability& durability_;
  ImportTarget* target_ ABSL_GUARDED_BY(core_.mu_) = nullptr;
  ImportGrants grants_ ABSL_GUARDED_BY(core_.mu_);  // open and spent import grants
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_IMPORTS_H_
