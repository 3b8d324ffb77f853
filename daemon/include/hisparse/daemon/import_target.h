// ImportTarget: the seam between the session manager's import grants (imports.cc) and the
// transport that takes a remote writer's records into granted pages.
//
// The session manager decides which pages a grant covers and when it stops being writable; the
// target keeps, per open grant, that grant's layout and page table, and writes a remote writer's
// records only after checking them against it (hisparse/common/import_message.h): the writer
// names a grant (its secret id), a layer and positions, never an address. No daemon memory is
// registered for remote access. Unregister ends the grant: once it returns, nothing more is
// written into its pages (the session manager frees them only after that).
//
// The daemon's target (StartImportTarget) runs UCX in a process of its own, hisparse-import-worker
// (import_worker/): a fault in UCX, or memory a hostile writer makes it buffer, ends that process,
// not the daemon. So a grant names its pages as memory the worker can map (slab descriptors and
// offsets), not as the daemon's addresses; the worker maps exactly the pages of its open grants.
//
// Thread-safe: every method may be called from any thread. Called outside the session manager's
// lock (the target takes its own).
#ifndef HISPARSE_DAEMON_IMPORT_TARGET_H_
#define HISPARSE_DAEMON_IMPORT_TARGET_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hisparse/common/import_channel.h"
#include "hisparse/common/import_message.h"
#include "hisparse/common/unique_fd.h"

namespace hisparse {

class ImportTarget {
 public:
  // One grant as the target checks writes against it.
  struct Slab {
    UniqueFd fd;         // a dup of the pool's memfd (the grant owns it)
    uint64_t bytes = 0;  // its size
  };
  struct Grant {
    ImportLayout layout;
    uint64_t page_bytes = 0;  // each page's length (>= records_per_page * record_bytes)
    std::vector<Slab> slabs;  // the slabs the pages lie in
    // [layer][page]: ImportPagesPerLayer(layout) pages per layer, each an index into `slabs` and
    // its first byte there.
    std::vector<std::vector<ChannelPageRef>> pages;
    absl::Time expires = absl::InfiniteFuture();  // writes at or after it are refused (kExpired)
  };
  virtual ~ImportTarget() = default;
  // What a writer connects to (the worker address). The daemon's target gets a new one when its
  // worker process is restarted; a grant's is the one read right after its Register.
  virtual std::string WorkerAddress() const = 0;
  // Opens `grant_id` for writes into `grant`'s pages. InvalidArgument if the page table does not
  // match the layout; AlreadyExists for an id registered twice; Unavailable while the worker is
  // down (it is restarted with backoff).
  virtual absl::Status Register(const std::string& grant_id, Grant grant) = 0;
  // Ends `grant_id`: no write into its pages happens after this returns. A no-op for an unknown id.
  virtual void Unregister(const std::string& grant_id) = 0;
};

struct ImportTargetOptions {
  std::string worker_binary;         // hisparse-import-worker's path
  std::string ucx_tls;               // UCX_TLS for the worker ("" keeps UCX's default)
  std::string ucx_net_devices;       // UCX_NET_DEVICES ("" keeps UCX's default: every interface)
  uint64_t worker_memory_bytes = 0;  // the worker's RLIMIT_DATA (0: none)
  std::function<void()> on_tick;     // grant expiry, called at least every 100 ms
  // The worker died: these grants (registered, not yet unregistered) can be written no more,
  // and `reason` says why. Called from the target's own thread, outside its locks; Unregister of
  // these ids afterwards is a no-op.
  std::function<void(std::vector<std::string> grant_ids, std::string reason)> on_lost;
};

// The daemon's import transport: hisparse-import-worker (options.worker_binary) in a process of its
// own, restarted with backoff when it dies; a thread of the target calls `on_tick`. Fails when
// the worker cannot start (its binary missing, UCX refusing the settings). Built without UCX:
// Unimplemented.
absl::StatusOr<std::unique_ptr<ImportTarget>> StartImportTarget(const ImportTargetOptions& options);

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_IMPORT_TARGET_H_
