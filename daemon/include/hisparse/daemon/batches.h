// Batches: the N requests an engine schedules in a step, in one call under one lock (batches.cc
// says what each mode does and counts). Each item is what the single call would do (Admissions,
// Imports, Parking, the core's release), with the same checks and messages; the batch adds the
// duplicate check and, for ALL_OR_NOTHING, the rollback. The call's error concerns the whole batch
// (the session, the item count, the mode); an item's own is in its result.
#ifndef HISPARSE_DAEMON_BATCHES_H_
#define HISPARSE_DAEMON_BATCHES_H_

#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "hisparse/daemon/admissions.h"
#include "hisparse/daemon/durability.h"
#include "hisparse/daemon/imports.h"
#include "hisparse/daemon/session_core.h"
#include "hisparse/v1/hisparse.pb.h"

namespace hisparse {

class Batches {
 public:
  using Session = SessionEntry;
  using Request = RequestEntry;
  static constexpr int kMaxItems = 1024;
  Batches(SessionCore& core, Admissions& admissions, Imports& imports, Durability& durability);

  absl::StatusOr<v1::AdmitBatchResponse> AdmitBatch(const v1::AdmitBatchRequest& req) ABSL_LOCKS_EXCLUDED(core_.mu_);
  absl::StatusOr<v1::ReleaseBatchResponse> ReleaseBatch(const v1::ReleaseBatchRequest& req)
      ABSL_LOCKS_EXCLUDED(core_.mu_);
  absl::StatusOr<v1::ParkBatchResponse> ParkBatch(const v1::ParkBatchRequest& req) ABSL_LOCKS_EXCLUDED(core_.mu_);
  absl::StatusOr<v1::ResumeBatchResponse> ResumeBatch(const v1::ResumeBatchRequest& req) ABSL_LOCKS_EXCLUDED(core_.mu_);

 private:
  // The import items a batch admitted (item index, opened grant), for FinishImports.
  using OpenedImports = std::vector<std::pair<int, Imports::Opened>>;
  v1::AdmitBatchResponse AdmitAllOrNothingLocked(Session& s, const v1::AdmitBatchRequest& req, OpenedImports* opened)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_);
  absl::StatusOr<v1::AdmitBatchResponse> AdmitEachItem(const v1::AdmitBatchRequest& req, OpenedImports* opened)
      ABSL_LOCKS_EXCLUDED(core_.mu_);
  // The pages items `from`.. of the batch take in `s`'s own slabs (those of a valid budget), at most
  // UINT32_MAX: what a batch that wanted a new slab has made before it tries again.
  static uint64_t ItemPages(const Session& s, const v1::AdmitBatchRequest& req, int from);
  // An item wanted a new slab: the slabs for items `from`.. are made instead, when the tenant's
  // quota would let it hold them all.
  void WantAllItemsLocked(const Session& s, const v1::AdmitBatchRequest& req, int from,
                          PagePool::SlabsOutsideLocks& outside)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_);
  // One item: Admissions::AdmitLocked, or for an import item Imports::OpenLocked, recorded in
  // `opened` under `index`.
  SessionCore::AdmitOutcome AdmitItemLocked(const v1::AdmitRequest& one, int index, OpenedImports* opened)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_);
  // ALL_OR_NOTHING failed at item `failed` (with `why`): every other item the batch admitted is
  // released again and every result rewritten, the others ABORTED.
  void FailAllOrNothingLocked(Session& s, const v1::AdmitBatchRequest& req, int failed, const absl::Status& why,
                              v1::AdmitBatchResponse* resp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_);
  void UndoItemLocked(Session& s, uint64_t request_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_);
  // Registers the batch's opened imports outside the lock, then publishes them (PER_ITEM: a failed
  // one is freed; ALL_OR_NOTHING: any failure revokes them all and rolls the batch back).
  void FinishImports(const v1::AdmitBatchRequest& req, const OpenedImports& opened, v1::AdmitBatchResponse* resp)
      ABSL_LOCKS_EXCLUDED(core_.mu_);
  // PER_ITEM under evict_lru_idle: the victim whose eviction may admit `item` after `evictions`
  // tries, or none. Never a request in `batch` (admitted by it).
  std::optional<SessionCore::Victim> VictimLocked(const Session& s, const v1::AdmitItem& item, int evictions,
                                                  const absl::flat_hash_set<uint64_t>& batch) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_);
  // ReleaseBatch's importing items, each aborted as Release aborts it: per item the abort's result,
  // or nullopt for an item that is not importing.
  absl::StatusOr<std::vector<std::optional<absl::Status>>> AbortImportingItems(const v1::ReleaseBatchRequest& req)
      ABSL_LOCKS_EXCLUDED(core_.mu_);

  SessionCore& core_;
  Admissions& admissions_;
  Imports& imports_;
  Durability& durability_;
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_BATCHES_H_
