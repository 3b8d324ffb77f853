// RequestJournal: durable requests kept across the daemon's own restarts (docs/DESIGN.md,
// "Restarts without loss").
//
// The pool's slabs are sealed memfds; their memory lives as long as some process holds them. The
// daemon hands each slab that holds a durable request's page to its service manager's fd store
// (sd_notify FDSTORE: systemd's, or hisparse-keeper's where there is no systemd), and beside them
// one more memfd, this journal, which says what the slabs hold: for every durable request its
// session's tenant, engine name and layout, its capacity, lease and pages. A daemon that starts
// with these fds (LISTEN_FDS) reads the journal (PlanRecovery), takes the slabs back into its pool
// and every durable request back as an orphan of its old session, adoptable exactly as if its
// engine had died (durable_requests.h): same pages, same bytes, no prefill again.
//
// Nothing here is a tenant's to plant: the store takes fds only from the daemon's own process
// (systemd's NotifyAccess=main; the keeper checks the sender's pid), the journal is never handed
// out, and a slab fd is taken back only if it carries the pool's seals.
//
// What is written, and when. Each Put is a request whole (its pages, lease, session), so the
// newest record of a (session, request) is all there is to know of it, and a Forget ends it. The
// session manager decides records under its lock (a sequence number each, and a ticket per batch)
// and commits them after it, before its reply: no engine learns of pages that the journal does not
// hold yet. Batches are written in ticket order, so the file's order is the decision order. A
// record is one pwrite into a memfd: a SIGKILL cannot lose what was written, and a kill in the
// middle of a write can only tear the last commit, which no reply had announced. The journal
// compacts itself (a new generation holding only the live requests) once it is more than twice
// their size.
//
// Thread-safe.
#ifndef HISPARSE_DAEMON_REQUEST_JOURNAL_H_
#define HISPARSE_DAEMON_REQUEST_JOURNAL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "hisparse/common/fd_store.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/daemon/journal.pb.h"
#include "hisparse/daemon/page_pool.h"

namespace hisparse {

// A request as the journal names it.
struct JournalKey {
  uint64_t session_id = 0;
  uint64_t request_id = 0;
  bool operator==(const JournalKey& o) const { return session_id == o.session_id && request_id == o.request_id; }
  template <typename H>
  friend H AbslHashValue(H h, const JournalKey& k) {
    return H::combine(std::move(h), k.session_id, k.request_id);
  }
};

// What the session manager decided under its lock, to commit after it.
struct JournalBatch {
  struct NewSlab {
    uint64_t id = 0;
    UniqueFd fd;  // a dup of the slab's memfd
  };
  uint64_t ticket = 0;                   // RequestJournal::TakeTicket, under the node's lock
  std::vector<NewSlab> slabs;            // slabs the records reference that the store lacks
  std::vector<journal::Record> records;  // in decision order, seq set
};

class RequestJournal {
 public:
  static constexpr uint32_t kFormat = 1;
  // The most slabs the journal puts in the store: the service manager passes their names back in
  // one environment string, which the kernel caps at 128 KiB (FileDescriptorStoreMax= must allow
  // this many, plus two for the journal). Durable requests on slabs beyond it do not survive a
  // restart (Stats::unstored_slabs).
  static constexpr size_t kMaxStoredSlabs = 8192;

  // A new generation of the journal in `store`, holding `initial` (the requests recovered at
  // start, whose slabs `stored_slabs` the store has already); once it is stored, the store's
  // `stale_names` (the journals it replaces) are removed.
  static absl::StatusOr<std::unique_ptr<RequestJournal>> Start(std::unique_ptr<FdStore> store,
                                                               const journal::Header& header,
                                                               const std::vector<journal::Put>& initial,
                                                               const std::set<uint64_t>& stored_slabs,
                                                               const std::vector<std::string>& stale_names);
  ~RequestJournal();

  // ---- Under the node's lock (SessionCore's mutex, held exclusively) ----
  // The next batch's ticket: batches commit in ticket order.
  uint64_t TakeTicket() { return next_ticket_.fetch_add(1, std::memory_order_relaxed); }
  // Whether slab `id` is new to the store and fits in it (kMaxStoredSlabs); the first caller to
  // ask claims it and adds its fd to its batch.
  bool ClaimSlab(uint64_t id) ABSL_LOCKS_EXCLUDED(slabs_mu_);
  // A claim whose fd could not be had: the slab is new to the store again.
  void UnclaimSlab(uint64_t id) ABSL_LOCKS_EXCLUDED(slabs_mu_);

  // ---- After it ----
  // Waits for the batches of earlier tickets, stores the batch's slabs (and waits until the
  // manager has them: BARRIER), then appends its records. An error is logged by the caller; the
  // ticket is used either way.
  absl::Status Commit(JournalBatch batch) ABSL_LOCKS_EXCLUDED(mu_, slabs_mu_);
  // Waits until every batch up to `ticket` is committed.
  void WaitCommitted(uint64_t ticket) ABSL_LOCKS_EXCLUDED(mu_);
  // The newest ticket committed (every earlier one is too); readable without a lock.
  uint64_t committed() const { return committed_.load(std::memory_order_acquire); }
  // What the start took back from the former daemon, for Stats.
  void NoteRecovery(uint64_t recovered, uint64_t dropped, bool refused, double seconds) ABSL_LOCKS_EXCLUDED(mu_);
  // The pool dropped slab `id` (its worker, after the punch): it leaves the store.
  void SlabGone(uint64_t id) ABSL_LOCKS_EXCLUDED(slabs_mu_);

  struct Stats {
    uint64_t generation = 0;
    uint64_t bytes = 0;          // of the current generation's memfd
    uint64_t live_requests = 0;  // durable requests it holds
    uint64_t stored_slabs = 0;
    uint64_t unstored_slabs = 0;  // slabs of durable requests the store had no room for
    uint64_t compactions = 0;
    uint64_t failures = 0;  // commits or slab moves the store refused
    // What this start took back (NoteRecovery).
    uint64_t recovered_requests = 0;
    uint64_t dropped_requests = 0;
    bool refused = false;
    double recovery_seconds = 0;
  };
  Stats GetStats() const ABSL_LOCKS_EXCLUDED(mu_, slabs_mu_);

  // The store's name of slab `id`: "s<id in hex>".
  static std::string SlabName(uint64_t id);
  // The framing of a record in the memfd: [u32 length][u32 crc32c of the bytes][the bytes].
  static std::string Frame(const journal::Record& record);
  static uint32_t Crc32c(const uint8_t* data, size_t size);

 private:
  RequestJournal(std::unique_ptr<FdStore> store, journal::Header header);
  // Writes a whole new generation (header + every live Put) and swaps it in.
  absl::Status CompactLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AppendLocked(const std::string& bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores `slabs` (the store's Put), then a BARRIER.
  absl::Status StoreSlabs(std::vector<JournalBatch::NewSlab>& slabs) ABSL_LOCKS_EXCLUDED(slabs_mu_);

  const std::unique_ptr<FdStore> store_;
  mutable absl::Mutex mu_;
  journal::Header header_ ABSL_GUARDED_BY(mu_);
  UniqueFd fd_ ABSL_GUARDED_BY(mu_);
  uint64_t end_ ABSL_GUARDED_BY(mu_) = 0;
  // A batch failed to reach the file: the next commit writes a whole new generation.
  bool rewrite_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> next_ticket_{1};          // the one to take next
  uint64_t committing_ ABSL_GUARDED_BY(mu_) = 1;  // the one whose turn it is
  std::atomic<uint64_t> committed_{0};            // committing_ - 1
  // The newest Put of each live request, framed: what a compaction writes again (in seq order).
  struct Live {
    uint64_t seq = 0;
    std::string framed;
  };
  absl::flat_hash_map<JournalKey, Live> live_ ABSL_GUARDED_BY(mu_);
  uint64_t live_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t compactions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t recovered_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  bool refused_ ABSL_GUARDED_BY(mu_) = false;
  double recovery_seconds_ ABSL_GUARDED_BY(mu_) = 0;

  mutable absl::Mutex slabs_mu_;                                      // a leaf: never held across I/O
  absl::flat_hash_set<uint64_t> claimed_ ABSL_GUARDED_BY(slabs_mu_);  // in the store, or on the way
  // Claimed by a batch whose Put has not happened yet, and those of them the pool dropped meanwhile
  // (StoreSlabs removes those again right after their Put).
  absl::flat_hash_set<uint64_t> unstored_claims_ ABSL_GUARDED_BY(slabs_mu_);
  absl::flat_hash_set<uint64_t> gone_before_stored_ ABSL_GUARDED_BY(slabs_mu_);
  uint64_t unstored_slabs_ ABSL_GUARDED_BY(slabs_mu_) = 0;
};

// Stats' restart figures (v1::RestartStats) from the journal.
void FillRestartStats(const RequestJournal& journal, v1::RestartStats* out);

// ---- Recovery ----

// What a starting daemon does with the fds its store gave back (PlanRecovery).
struct RecoveryPlan {
  // Set when a journal was found: the header of the one taken (the old life's epoch).
  bool found = false;
  journal::Header header;
  // The journal was not taken: why (logged as an error; every slab is then scrubbed).
  std::string refused;
  // The durable requests to restore, validated against their slabs, leases unexpired.
  std::vector<journal::Put> puts;
  // Their slabs, each with its owner (the request's session) and each page's references.
  std::vector<PagePool::RecoveredSlab> slabs;
  // Slabs nothing restored references: to punch, then drop from the store.
  std::vector<std::pair<std::string, UniqueFd>> unused;
  // Store names to drop (older journals, unknown names); their fds are closed already.
  std::vector<std::string> stale_names;
  // Requests not restored, and why, one line each (logged).
  std::vector<std::string> dropped;
  uint64_t dropped_requests = 0;  // requests found but not restored, a refused journal's included
  uint64_t expired = 0;           // of those: leases that ended while the daemon was away

  // The epoch of the daemon life about to start: one past the journal's (refused or not: its
  // ids may still be held), 0 without a journal.
  uint64_t next_epoch() const { return found ? header.epoch() + 1 : 0; }
};

// Reads the fds a daemon got at start (LISTEN_FDS: "journal-<generation>" and "s<slab id, hex>"),
// takes the newest journal whose header is whole, and checks it against the slabs and this
// daemon: the page size, every slab's seals and size, every page inside its slab, one session
// per slab, each request's layout; a request whose slab is missing, whose lease ended by `now`,
// or which does not fit in `budget_bytes` (whole sessions, oldest first) is dropped with a line
// saying why. A journal that fails its own framing before its end, or whose records go backwards,
// is refused whole.
RecoveryPlan PlanRecovery(std::vector<ListenFd> fds, uint64_t page_bytes, uint64_t budget_bytes, absl::Time now);

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_REQUEST_JOURNAL_H_
