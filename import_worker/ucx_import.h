// UcxImport: the UCX side of imports (AdmitRequest.begin_import), inside hisparse-import-worker —
// one ucp context and one worker for the process's life, the open grants' page tables (pointers
// into the worker's own mappings of the granted pages), and a progress thread.
//
// What a peer can make the daemon do: the context has UCP_FEATURE_AM only (no RMA), so the worker
// installs no handler for UCX's software put or get, registers no memory and hands out no remote
// key; a peer's only way in is an active message. The import write handler (id kImportWriteAmId)
// decodes each message's header with the strict codec of hisparse/common/import_message.h, looks
// its grant up by the secret id, refuses it unless the grant is open, unexpired and the layer and
// positions lie inside it, and copies the eager payload into the pages that the grant's own page
// table names (PlanImportWrite). Each write is answered (kImportReplyAmId) on the writer's reply
// endpoint. Rendezvous messages are refused (kNotEager): their data is released unread.
//
// Ownership: the context, the worker and the reply requests in flight are owned here. A grant's
// pages are mapped by the caller (worker.cc), which unmaps them only after Unregister has
// returned; Unregister takes the mutex that the progress thread holds while it delivers messages,
// so no write lands after it.
//
// Thread-safe: one mutex serializes every UCX call (the worker is created single-threaded); the
// progress thread holds it while progressing, never while it sleeps or logs.
#ifndef HISPARSE_IMPORT_WORKER_UCX_IMPORT_H_
#define HISPARSE_IMPORT_WORKER_UCX_IMPORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "hisparse/common/import_message.h"

namespace hisparse {

class UcxImport {
 public:
  struct Options {
    std::string ucx_tls;          // UCX_TLS ("" keeps UCX's default)
    std::string ucx_net_devices;  // UCX_NET_DEVICES ("" keeps UCX's default: every interface)
    absl::Duration tick = absl::Milliseconds(100);
  };
  // One grant as writes are checked against it.
  struct Grant {
    ImportLayout layout;
    uint64_t page_bytes = 0;                      // each page's length (>= records_per_page * record_bytes)
    std::vector<std::vector<uint8_t*>> pages;     // [layer][page]: ImportPagesPerLayer(layout) pages per layer
    absl::Time expires = absl::InfiniteFuture();  // writes at or after it are refused (kExpired)
  };
  static absl::StatusOr<std::unique_ptr<UcxImport>> Start(Options options);
  ~UcxImport();
  UcxImport(const UcxImport&) = delete;
  UcxImport& operator=(const UcxImport&) = delete;

  // What a writer connects to, fixed for the object's life.
  std::string WorkerAddress() const { return worker_address_; }
  // Opens `grant_id` for checked writes into `grant`'s pages. InvalidArgument if the page table
  // does not match the layout; AlreadyExists for an id registered twice.
  absl::Status Register(const std::string& grant_id, const Grant& grant);
  // Ends `grant_id`: no write into its pages happens after this returns. A no-op for an unknown id.
  void Unregister(const std::string& grant_id);

  // Called by UCX from inside ucp_worker_progress (the progress thread, which holds mu_ there):
  // one write, checked, applied or refused, and answered.
  void OnWrite(const void* header, size_t header_length, void* data, size_t length, bool rendezvous, void* reply_ep);

 private:
  struct Handles;  // the ucp handles, kept out of this header
  struct Counters {
    uint64_t written = 0, refused = 0, bytes = 0;
    ImportCode last_refusal = ImportCode::kOk;
  };
  explicit UcxImport(Options options);
  void ProgressLoop();
  ImportCode Apply(const ImportWrite& w, const uint8_t* payload, size_t length) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Reply(void* reply_ep, uint64_t seq, ImportCode code) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  std::unique_ptr<Handles> ucp_;
  std::string worker_address_;  // written once in Start
  int wakeup_fd_ = -1;          // the worker's, owned by UCX
  int stop_fd_ = -1;            // an eventfd that ends the progress thread; owned here
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Grant> grants_ ABSL_GUARDED_BY(mu_);
  Counters counters_ ABSL_GUARDED_BY(mu_);
  std::thread progress_;
};

}  // namespace hisparse

#endif  // HISPARSE_IMPORT_WORKER_UCX_IMPORT_H_
