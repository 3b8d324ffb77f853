// AdmissionLedger: the node's admission accounting as plain numbers, testable alone.
//
// It holds, per session, its tenant, its slot-arena bytes and its row table; per request, its row,
// the host-pool pages it holds and when it was last used; per tenant, the sums of those. From them
// it decides the quota refusals (host bytes and pages, charged in whole pages; requests, sessions,
// arena bytes), the free row, the victim of admission.on_pool_full = evict_lru_idle and whether
// evicting could admit at all. It touches no pool, fd, arena, proto or
// socket: the modules over SessionCore (session_core.h) make the pool calls at the edges and records their
// outcome here. Time comes from an injected clock, so the LRU order is deterministic in tests;
// ties are broken by (last_used, session_id, request_id).
//
// Not thread-safe: SessionCore keeps it under its ledger_mu_ (session_core.h, "Locks").
#ifndef HISPARSE_DAEMON_ADMISSION_LEDGER_H_
#define HISPARSE_DAEMON_ADMISSION_LEDGER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace hisparse {

// Why an admission or session open was refused: the one list that Stats' rejections_by_reason
// and the metrics' hisparse_rejections_total{reason} both follow.
enum class RejectReason { kPoolFull, kRowsFull, kDraining, kSessionLimit, kArenaBudget, kHostArenaBudget, kQuota };
inline constexpr RejectReason kRejectReasons[] = {
    RejectReason::kPoolFull,    RejectReason::kRowsFull,        RejectReason::kDraining, RejectReason::kSessionLimit,
    RejectReason::kArenaBudget, RejectReason::kHostArenaBudget, RejectReason::kQuota};
// "pool_full", "rows_full", "draining", "session_limit", "arena_budget", "host_arena_budget", "quota".
const char* RejectReasonName(RejectReason reason);

// A refusal: the reason it is counted under, and what the caller is told.
struct Refusal {
  RejectReason reason;
  absl::Status status;
};

class AdmissionLedger {
 public:
  // Hard per-tenant limits (tenant = the uid that opened the session); 0 = unlimited.
  struct Quotas {
    uint64_t host_bytes = 0;
    uint64_t arena_bytes = 0;
    uint32_t requests = 0;
    uint32_t sessions = 0;
    // Host-pool pages one tenant may hold (besides host_bytes, which counts them in bytes).
    uint64_t pages = 0;
  };
  struct RequestKey {
    uint64_t session_id = 0, request_id = 0;
    bool operator==(const RequestKey& o) const { return session_id == o.session_id && request_id == o.request_id; }
  };
  struct TenantUsage {
    uint64_t pages = 0, arena_bytes = 0, requests = 0;
    uint32_t sessions = 0;
    bool operator==(const TenantUsage& o) const {
      return pages == o.pages && arena_bytes == o.arena_bytes && requests == o.requests && sessions == o.sessions;
    }
  };
  using Clock = std::function<absl::Time()>;
  // Host bytes a tenant holds outside its requests: retired slabs an engine may still hold, not
  // yet seen freed (PagePool::RetiredBytesOf). CheckGrow charges them, in whole pages, against
  // quotas.host_bytes and quotas.pages; Usage and the invariants do not count them.
  using OutsideBytes = std::function<uint64_t(uint32_t tenant)>;

  AdmissionLedger(const Quotas& quotas, uint64_t page_bytes, Clock clock, OutsideBytes outside = nullptr);

  void SetQuotas(const Quotas& quotas) { quotas_ = quotas; }
  const Quotas& quotas() const { return quotas_; }
  uint64_t page_bytes() const { return page_bytes_; }

  // Sessions. CheckOpenSession: whether `tenant` may hold one more session of `arena_bytes`.
  std::optional<Refusal> CheckOpenSession(uint32_t tenant, uint64_t arena_bytes) const;
  // A new session with `rows` request rows (session ids are never reused).
  void AddSession(uint64_t session_id, uint32_t tenant, uint32_t rows, uint64_t arena_bytes);
  // Forgets the session and every request it held. No-op for an unknown id.
  void RemoveSession(uint64_t session_id);
  bool HasSession(uint64_t session_id) const { return sessions_.count(session_id) != 0; }
  // Durable requests (SessionManager, durability.cc). OrphanSession: the session has ended
  // but keeps its requests, every one parked (a live one is parked here): it stops counting as
  // one of its tenant's sessions and its arena bytes are returned; its requests and pages still
  // count against the tenant's quotas. An orphan is never a victim (PickVictim) nor a row holder.
  // AdoptOrphan: every request of orphan `orphan_id` moves, parked, into session `session_id`
  // (same tenant; the caller has checked the ids are free there) and the orphan is forgotten.
  void OrphanSession(uint64_t session_id);
  void AdoptOrphan(uint64_t orphan_id, uint64_t session_id);
  bool IsOrphan(uint64_t session_id) const;

  // Requests. CheckGrow: whether the session's tenant may hold `more_pages` and `more_requests`
  // more (quotas.pages; quotas.host_bytes, charged as more_pages * page_bytes; quotas.requests).
  std::optional<Refusal> CheckGrow(uint64_t session_id, uint64_t more_pages, uint32_t more_requests) const;
  // The lowest free row of the session, or kRowsFull.
  std::optional<Refusal> FreeRow(uint64_t session_id, uint32_t* row) const;
  // Records an admitted request in `row` (which FreeRow gave) holding `pages`; used now.
  void Admit(uint64_t session_id, uint64_t request_id, uint32_t row, uint64_t pages);
  // The request holds `pages` now (an Extend appended some).
  void SetPages(uint64_t session_id, uint64_t request_id, uint64_t pages);
  // The request is used now (an Extend, even one that then fails for want of room).
  void Touch(uint64_t session_id, uint64_t request_id);
  // Forgets the request, freeing its row (a parked request holds none).
  void Release(uint64_t session_id, uint64_t request_id);
  bool HasRequest(uint64_t session_id, uint64_t request_id) const;
  // Park: the request frees its row and keeps its pages; it still counts as one of its tenant's
  // requests (quotas.requests) and its pages as the tenant's. Resume: it takes `row` (which
  // FreeRow gave) again; used now. No-ops for an unknown request, or one already in that state.
  void Park(uint64_t session_id, uint64_t request_id);
  void Resume(uint64_t session_id, uint64_t request_id, uint32_t row);
  bool IsParked(uint64_t session_id, uint64_t request_id) const;

  // evict_lru_idle: a parked request of the session's tenant before any live one; among those,
  // the least recently used, smallest (last_used, session_id, request_id) first.
  std::optional<RequestKey> PickVictim(uint64_t session_id) const;
  // Whether `need_pages` could be had for the session once every request of its tenant were gone,
  // given the pages the pool could give it now (`available_pages`): their pages return to the
  // budget as their slabs empty. When not, evicting cannot make the admission succeed.
  bool EvictionCouldAdmit(uint64_t session_id, uint64_t need_pages, uint64_t available_pages) const;

  TenantUsage Usage(uint32_t tenant) const;
  // Pages held by every request: must equal the pool's used pages.
  uint64_t used_pages() const { return used_pages_; }
  // Pages the session's requests hold: must equal the pool's count for it.
  uint64_t PagesOf(uint64_t session_id) const;
  // The request's row; nullopt for an unknown or a parked request.
  std::optional<uint32_t> RowOf(uint64_t session_id, uint64_t request_id) const;

  // Exact and total: used pages == sum of every request's pages; every tenant's kept sums ==
  // what its sessions (orphans too) hold; no tenant kept that holds nothing; rows unique and the row tables
  // exactly the rows of live (not parked) requests.
  absl::Status CheckInvariants() const;

 private:
  struct Request {
    uint32_t row = 0;  // meaningless while parked
    absl::Time last_used;
    uint64_t pages = 0;
    bool parked = false;
  };
  // A session's request rows, used or free, as a bitmap: the lowest free row is a scan of 64-row
  // words (FreeRow runs under the ledger's lock on every admission, and a session may have
  // thousands of rows).
  class RowSet {
   public:
    void Assign(uint32_t rows) {
      size_ = rows;
      words_.assign((rows + 63) / 64, 0);
    }
    void Clear() { Assign(0); }
    uint32_t size() const { return size_; }
    bool empty() const { return size_ == 0; }
    bool Used(uint32_t row) const { return (words_[row / 64] >> (row % 64)) & 1; }
    void Set(uint32_t row, bool used) {
      const uint64_t bit = uint64_t{1} << (row % 64);
      words_[row / 64] = used ? words_[row / 64] | bit : words_[row / 64] & ~bit;
    }
    // The lowest free row, or size() when every row is used.
    uint32_t LowestFree() const;
    bool operator==(const RowSet& o) const { return size_ == o.size_ && words_ == o.words_; }
    bool operator!=(const RowSet& o) const { return !(*this == o); }

   private:
    uint32_t size_ = 0;
    std::vector<uint64_t> words_;  // bits past size_ stay 0
  };
  struct Session {
    uint32_t tenant = 0;
    bool orphan = false;  // ended, keeping its durable (parked) requests
    uint64_t arena_bytes = 0;
    RowSet row_used;
    std::map<uint64_t, Request> requests;
  };
  Session* Find(uint64_t session_id);
  const Session* Find(uint64_t session_id) const;

  Quotas quotas_;
  uint64_t page_bytes_;
  Clock clock_;
  OutsideBytes outside_;
  std::map<uint64_t, Session> sessions_;
  std::map<uint32_t, TenantUsage> tenants_;  // kept sums; a tenant that holds nothing is erased
  uint64_t used_pages_ = 0;
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_ADMISSION_LEDGER_H_
