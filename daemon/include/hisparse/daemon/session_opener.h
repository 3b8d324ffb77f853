// SessionOpener: a session's opening and its memory handed out (session_opener.cc). Open checks
// the engine's geometry and version, charges the tenant's arena quota and the device's budget,
// creates the slot arena outside the lock and inserts the session; DupFdFor gives the session's
// owner its arena and slabs. A module over SessionCore (session_core.h).
#ifndef HISPARSE_DAEMON_SESSION_OPENER_H_
#define HISPARSE_DAEMON_SESSION_OPENER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "hisparse/common/fd_channel_codec.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/common/unix_socket.h"
#include "hisparse/daemon/arena.h"
#include "hisparse/daemon/session_core.h"
#include "hisparse/v1/hisparse.pb.h"

namespace hisparse {

class SessionOpener {
 public:
  explicit SessionOpener(SessionCore& core);

  // Opens a session for an engine that declared `open`; `owner` (the kernel's word on the peer)
  // binds it: its uid is the session's tenant.
  absl::StatusOr<v1::SessionOpened> Open(const v1::OpenSession& open, const PeerCredentials& owner)
      ABSL_LOCKS_EXCLUDED(core_.mu_);
  // PermissionDenied unless `ref` names a live session that `uid` owns.
  absl::Status CheckOwner(const v1::SessionRef& ref, uint32_t uid) const ABSL_LOCKS_EXCLUDED(core_.mu_);
  // A dup of the descriptor of `object` (the arena or a slab) of a live session that `peer` owns;
  // see SessionManager::DupFdFor.
  absl::StatusOr<UniqueFd> DupFdFor(uint64_t session_id, const std::string& token, const FdObject& object,
                                    const PeerCredentials& peer, uint64_t* bytes, std::string* ipc_handle)
      ABSL_LOCKS_EXCLUDED(core_.mu_);
  void SetEventSink(uint64_t session_id, SessionEventSink sink) ABSL_LOCKS_EXCLUDED(core_.mu_);

 private:
  // What Open decided from an OpenSession before taking a lock: the checked geometry's arena, its
  // device and the session's limits (session_opener.cc).
  struct OpenPlan;
  // Checks `open` against the daemon's limits (no lock held, none of its state changed).
  absl::StatusOr<OpenPlan> PlanOpen(const v1::OpenSession& open) const ABSL_LOCKS_EXCLUDED(core_.mu_);
  // Whether the node takes the session (draining, the session limit, its group, the tenant's quota,
  // the host-arena and device budgets); reserves the arena's bytes on its device if so.
  absl::Status ReserveArenaLocked(const v1::OpenSession& open, const OpenPlan& plan, const SessionEntry& session,
                                  uint32_t uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_);
  // Gives back what ReserveArenaLocked reserved (an open that failed after it).
  void ReturnArenaLocked(const OpenPlan& plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, core_.ledger_mu_);
  // The answer to the engine: the session, its arena, its pages and the daemon.
  v1::SessionOpened OpenedLocked(const SessionEntry& session, uint64_t page_bytes, double create_seconds) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_);
  // The session's slot arena of `layout`: on GPU `gpu` from the allocator, else a host memfd.
  // Touches no shared state: called outside the lock.
  absl::StatusOr<std::unique_ptr<Arena>> CreateArena(bool on_gpu, int gpu, const ArenaOffsets& layout) const;
  // This daemon's ordinal of the GPU a session's geometry names: the one whose UUID is
  // geometry.gpu_uuid (FailedPrecondition when it sees none such), else geometry.gpu.
  absl::StatusOr<int> DaemonGpuOf(const v1::Geometry& g, bool on_gpu) const;

  SessionCore& core_;
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_SESSION_OPENER_H_
