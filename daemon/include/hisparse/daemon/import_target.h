// ImportTarget: the seam between the session manager's import grants (session_import.cc) and the
// transport that lets a remote writer put records into granted pages (UcxImport, ucx_import.h).
//
// The session manager decides which memory a grant covers and when it stops being writable; the
// target registers that memory with its transport and revokes it. A grant's memory is registered
// under the grant's id; Unregister revokes every remote key of that grant (a writer holding one
// gets errors from then on, where the transport checks keys at all: see docs/DESIGN.md).
//
// Thread-safe: every method may be called from any thread. Called outside the session manager's
// lock (registration is transport I/O).
#ifndef HISPARSE_DAEMON_IMPORT_TARGET_H_
#define HISPARSE_DAEMON_IMPORT_TARGET_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace hisparse {

class ImportTarget {
 public:
  // A range of the daemon's memory to make remotely writable.
  struct Span {
    uint8_t* addr = nullptr;
    uint64_t bytes = 0;
  };
  // One registered span as a remote writer sees it: its address here and its packed remote key.
  struct Region {
    uint64_t remote_addr = 0;
    uint64_t bytes = 0;
    std::string rkey;
  };
  virtual ~ImportTarget() = default;
  // What a writer connects to (the worker address), fixed for the target's life.
  virtual std::string WorkerAddress() const = 0;
  // Registers `spans` (remote write) under `grant_id`, one Region per span in their order. All or
  // nothing: on failure nothing stays registered.
  virtual absl::StatusOr<std::vector<Region>> Register(const std::string& grant_id, const std::vector<Span>& spans) = 0;
  // Revokes and unregisters everything of `grant_id`; a no-op for an unknown id.
  virtual void Unregister(const std::string& grant_id) = 0;
};

// The daemon's import transport: a UCX worker on `ucx_tls` (ucx_import.h) whose progress thread
// also calls `on_tick` (grant expiry) at least every 100 ms. Built without UCX: Unimplemented.
absl::StatusOr<std::unique_ptr<ImportTarget>> StartImportTarget(const std::string& ucx_tls,
                                                                const std::function<void()>& on_tick);

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_IMPORT_TARGET_H_
