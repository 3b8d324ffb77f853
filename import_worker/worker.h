// hisparse-import-worker: the UCX side of imports, in a process of its own (docs/DESIGN.md,
// "Import"). hisparsed starts it with one end of a SOCK_SEQPACKET pair and talks to it by the
// messages of hisparse/common/import_channel.h: the worker answers kHello with its UCX worker
// address, then opens and closes grants as the daemon says. For each grant it maps exactly the
// granted pages (from the slab descriptors the daemon hands it; the descriptors are closed once
// mapped) and unmaps them when the grant closes, after UcxImport::Unregister has returned.
//
// Why a process: UCX parses what remote peers send, and a peer can kill the process that runs it
// (UCX 1.13 once aborted on an assertion after a writer died mid-transfer) or make it buffer
// what it sends. Here that ends the worker, whose memory limit (RLIMIT_DATA) bounds what UCX can
// buffer; the daemon aborts the worker's open grants, restarts it, and serves on.
#ifndef HISPARSE_IMPORT_WORKER_WORKER_H_
#define HISPARSE_IMPORT_WORKER_WORKER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace hisparse {

struct ImportWorkerOptions {
  int channel_fd = -1;              // the daemon's end is the peer
  std::string ucx_tls;              // UCX_TLS ("" keeps UCX's default)
  std::string ucx_net_devices;      // UCX_NET_DEVICES ("" keeps UCX's default)
  uint64_t memory_limit_bytes = 0;  // RLIMIT_DATA, set before UCX starts (0: left as inherited)
};

// Serves the channel until the daemon closes it (OK) or sends what does not decode, or UCX cannot
// start (an error, which the daemon also reads as the channel's end).
absl::Status RunImportWorker(const ImportWorkerOptions& options);

}  // namespace hisparse

#endif  // HISPARSE_IMPORT_WORKER_WORKER_H_
