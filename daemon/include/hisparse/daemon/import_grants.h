// ImportGrants: every import grant the daemon issued, open or spent, and what its id may still do.
//
// A grant (AdmitRequest.begin_import) is a capability: whoever holds its id may write the
// request's pages and then commit or abort it (CommitImport, AbortImport). Its life here:
//
//   Open (busy) --Publish--> open --MarkBusy--> busy --End--> spent (committed, aborted, expired)
//        \--Forget (its registration failed, or its batch rolled back; never usable)
//
// "Busy" is while the daemon registers or revokes its memory outside the lock: nothing else may
// finish it then, and a session that closes waits for its busy grants (AnyBusyOf). The last
// kSpent spent grants are remembered, so that a second use of one gets its own refusal (committed
// already, expired, aborted) rather than "no such grant". The request's state (importing) is its
// RequestTable's (request_table.h); the memory's registration is the ImportTarget's
// (import_target.h); SessionManager (imports.cc) orders the three.
//
// Not thread-safe: SessionManager calls it under its mutex.
#ifndef HISPARSE_DAEMON_IMPORT_GRANTS_H_
#define HISPARSE_DAEMON_IMPORT_GRANTS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

namespace hisparse {

// Enough of a grant id to tell grants apart in messages and logs, never enough to use it.
std::string ShortGrantId(const std::string& grant_id);

class ImportGrants {
 public:
  enum class End { kCommitted, kAborted, kExpired };
  static constexpr size_t kSpent = 4096;

  struct Grant {
    uint64_t session_id = 0;
    uint64_t request_id = 0;
    uint32_t tenant_uid = 0;
    absl::Time expires;  // by the manager's clock
    bool busy = true;
  };
  // An open grant and the request it covers: what finishing it needs.
  struct Ref {
    std::string id;
    uint64_t session_id = 0;
    uint64_t request_id = 0;
  };

  // A new grant, busy until Publish. The id must be new (ids are 128-bit secrets).
  void Open(const std::string& id, const Grant& grant);
  // Its registration done: usable.
  void Publish(const std::string& id);
  // Never usable after all (not registered, or registered and revoked by the caller): gone, and
  // not remembered as spent.
  void Forget(const std::string& id);
  // Whether `id` may be finished now for request `request_id` of session `session_id` by
  // `caller_uid` (unset: the daemon itself). The codes of CommitImport (hisparse.proto):
  // InvalidArgument (empty id), NotFound (never issued or long gone), AlreadyExists (committed),
  // FailedPrecondition (expired, aborted, or busy), PermissionDenied (another request, session
  // or tenant).
  absl::Status Check(const std::string& id, uint64_t session_id, uint64_t request_id,
                     std::optional<uint32_t> caller_uid) const;
  // An open grant that Check passed becomes busy: its memory is being revoked.
  void MarkBusy(const std::string& id);
  // Ends an open grant: remembered as spent (the oldest of kSpent forgotten) and counted.
  // Returns what it was. The id must be open.
  Grant Finish(const std::string& id, End end);
  // Ends every grant of `session_id` (none may be busy: AnyBusyOf first) as `end`; their ids.
  std::vector<std::string> FinishAllOf(uint64_t session_id, End end);

  // Open, not busy, expired by `now`.
  std::vector<Ref> Due(absl::Time now) const;
  // Those of `ids` still open.
  std::vector<Ref> StillOpen(const std::vector<std::string>& ids) const;
  bool AnyBusyOf(uint64_t session_id) const;
  bool empty() const { return open_.empty(); }
  size_t open_count() const { return open_.size(); }
  // Grants ended so far as `end`, since start.
  uint64_t ended(End end) const { return ended_[static_cast<int>(end)]; }

 private:
  struct Spent {
    uint64_t session_id = 0;
    uint64_t request_id = 0;
    End end = End::kAborted;
  };
  absl::flat_hash_map<std::string, Grant> open_;
  absl::flat_hash_map<std::string, Spent> spent_;
  std::deque<std::string> spent_order_;  // oldest first
  uint64_t ended_[3] = {0, 0, 0};
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_IMPORT_GRANTS_H_
