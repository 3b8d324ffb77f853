// SessionEntry: what the daemon keeps of one session (or, once it ended keeping durable requests,
// of its orphan): its identity, geometry, tenant, arena, requests and shared pages. Plain data;
// The modules over SessionCore change it under the core's mutex, or under its shared side and the
// session's own lock (session_core.h, "Locks"). A request's state is its RequestTable's (request_table.h).
#ifndef HISPARSE_DAEMON_SESSION_ENTRY_H_
#define HISPARSE_DAEMON_SESSION_ENTRY_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "hisparse/daemon/arena.h"
#include "hisparse/daemon/page_pool.h"
#include "hisparse/daemon/page_sharers.h"
#include "hisparse/daemon/request_table.h"
#include "hisparse/v1/hisparse.pb.h"

namespace hisparse {

// Where a session's notices go (its stream): SessionManager::SetEventSink. Called outside the
// lock, must not block; false when the notice will not be delivered.
using SessionEventSink = std::function<bool(const v1::SessionEvent&)>;

struct SessionEntry {
  // The session's own lock, for the hot calls, which hold the node's mutex shared
  // (session_core.h, "Locks"): its requests, sharers and their data. Apart, so the entry moves.
  std::unique_ptr<absl::Mutex> mu = std::make_unique<absl::Mutex>();
  uint64_t id = 0;
  std::string token;
  std::string engine_name;
  v1::Geometry geometry;
  uint32_t records_per_page = 0;  // page_bytes / record_bytes
  uint32_t pages_per_entry = 0;   // the most pages one layer of a request may have
  pid_t peer_pid = 0;
  uint32_t tenant_uid = 0;  // the owner: the uid of the Session stream's peer
  // The daemon's ordinal of the GPU its arena is on (geometry.gpu, or the GPU its gpu_uuid names),
  // -1 for a host arena: whose budget the arena counts against.
  int32_t device = -1;
  RequestTable requests;     // every request's state, kept with the ledger's rows and LRU times
  uint64_t arena_bytes = 0;  // accounted against its device's budget and its tenant's quota
  // The slot arena in its sharing form (arena.h), chosen at open and never null after it (null in
  // an orphan). Shared with Stats and the fd channel, which use it outside the lock.
  std::shared_ptr<const Arena> arena;
  std::shared_ptr<SessionEventSink> sink;
  // Pages held by more than one request of the session (shared prefixes), and who pays for each.
  PageSharers sharers;
  bool imports_closed = false;  // set as the session closes: no new import grant
  std::string group;            // its TP group's name (OpenSession.group), empty: none
  uint32_t group_rank = 0;
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_SESSION_ENTRY_H_
