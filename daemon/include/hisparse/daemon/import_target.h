// ImportTarget: the seam between the session manager's import grants (session_import.cc) and the
// transport that takes a remote writer's records into granted pages (UcxImport, ucx_import.h).
//
// The session manager decides which pages a grant covers and when it stops being writable; the
// target keeps, per open grant, that grant's layout and page table, and writes a remote writer's
// records only after checking them against it (hisparse/common/import_message.h): the writer
// names a grant (its secret id), a layer and positions, never an address. No daemon memory is
// registered for remote access. Unregister ends the grant: once it returns, nothing more is
// written into its pages (the session manager frees them only after that).
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
#include "hisparse/common/import_message.h"

namespace hisparse {

class ImportTarget {
 public:
  // One grant as the target checks writes against it.
  struct Grant {
    ImportLayout layout;
    uint64_t page_bytes = 0;                      // each page's length (>= records_per_page * record_bytes)
    std::vector<std::vector<uint8_t*>> pages;     // [layer][page]: ImportPagesPerLayer(layout) pages per layer
    absl::Time expires = absl::InfiniteFuture();  // writes at or after it are refused (kExpired)
  };
  virtual ~ImportTarget() = default;
  // What a writer connects to (the worker address), fixed for the target's life.
  virtual std::string WorkerAddress() const = 0;
  // Opens `grant_id` for writes into `grant`'s pages. InvalidArgument if the page table does not
  // match the layout; AlreadyExists for an id registered twice.
  virtual absl::Status Register(const std::string& grant_id, Grant grant) = 0;
  // Ends `grant_id`: no write into its pages happens after this returns. A no-op for an unknown id.
  virtual void Unregister(const std::string& grant_id) = 0;
};

struct ImportTargetOptions {
  std::string ucx_tls;            // UCX_TLS for the daemon's worker ("" keeps UCX's default)
  std::string ucx_net_devices;    // UCX_NET_DEVICES ("" keeps UCX's default: every interface)
  std::function<void()> on_tick;  // grant expiry, called at least every 100 ms
};

// The daemon's import transport: a UCX worker (ucx_import.h) whose progress thread also calls
// `on_tick`. Built without UCX: Unimplemented.
absl::StatusOr<std::unique_ptr<ImportTarget>> StartImportTarget(const ImportTargetOptions& options);

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_IMPORT_TARGET_H_
