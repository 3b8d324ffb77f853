// UcxImport: the daemon's UCX side of imports (AdmitRequest.begin_import) — one ucp context and
// one worker for the daemon's life, the memory handles of every live grant, and a progress thread.
//
// Ownership: the context, the worker and every ucp_mem_h are owned here and released on every
// path (Unregister, or the destructor for grants still registered). A grant's memory itself is
// the page pool's; the session manager keeps it alive until Unregister has returned.
//
// Progress: a passive target of RMA puts needs no progress on shared memory (CMA writes into this
// process directly) but does on TCP (the target worker receives the data) and for wire-up, so a
// thread progresses the worker, sleeping on its wakeup fd between events, and calls `on_tick`
// (the grant expiry) at least every `tick`.
//
// Thread-safe: one mutex serializes every UCX call (the worker is created single-threaded); the
// progress thread holds it only while progressing, never while it waits.
#ifndef HISPARSE_DAEMON_UCX_IMPORT_H_
#define HISPARSE_DAEMON_UCX_IMPORT_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "hisparse/daemon/import_target.h"

namespace hisparse {

class UcxImport final : public ImportTarget {
 public:
  struct Options {
    // UCX_TLS for the daemon's context ("" keeps UCX's default or the environment's UCX_TLS).
    std::string tls;
    std::function<void()> on_tick;  // may be empty; called from the progress thread, no lock held
    absl::Duration tick = absl::Milliseconds(100);
  };
  static absl::StatusOr<std::unique_ptr<UcxImport>> Start(Options options);
  ~UcxImport() override;
  UcxImport(const UcxImport&) = delete;
  UcxImport& operator=(const UcxImport&) = delete;

  std::string WorkerAddress() const override { return worker_address_; }
  absl::StatusOr<std::vector<Region>> Register(const std::string& grant_id, const std::vector<Span>& spans) override;
  void Unregister(const std::string& grant_id) override;

 private:
  struct Handles;  // the ucp handles, kept out of this header
  explicit UcxImport(Options options);
  void ProgressLoop();

  const Options options_;
  std::unique_ptr<Handles> ucp_;
  std::string worker_address_;  // written once in Start
  int wakeup_fd_ = -1;          // the worker's, owned by UCX
  int stop_fd_ = -1;            // an eventfd that ends the progress thread; owned here
  mutable absl::Mutex mu_;
  // Per grant, its memory handles (ucp_mem_h as void*), mapped in Register.
  absl::flat_hash_map<std::string, std::vector<void*>> grants_ ABSL_GUARDED_BY(mu_);
  std::thread progress_;
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_UCX_IMPORT_H_
