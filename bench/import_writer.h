// ImportWriter: the prefill side of an import (hisparse-bench import). Connects a UCX worker of
// its own to the daemon's (ImportGrant.worker_address) and sends a request's records as import
// write messages (hisparse/common/import_message.h): UCX active messages, eager, each naming the
// grant, a layer and positions, each answered by the daemon with a code. The records come from a
// buffer per layer laid out by position (what a prefill engine holds after prefill).
//
// Transports: `tls` "" tries UCX's choice first and, where the daemon's shared memory refuses this
// process (UCX's shm admits only the daemon's uid), tcp. Also the misuse tests' tool: SendOne
// sends one write exactly as given, and ForgedPut tries a UCX RMA put at a daemon address.
//
// Owns its ucp context, worker and endpoint; releases them on every path. Not thread-safe: one
// thread drives it.
#ifndef HISPARSE_BENCH_IMPORT_WRITER_H_
#define HISPARSE_BENCH_IMPORT_WRITER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hisparse/common/import_message.h"
#include "hisparse/v1/hisparse.pb.h"

namespace hisparse::bench {

class ImportWriter {
 public:
  // `tls`: UCX_TLS for this side ("" as above).
  static absl::StatusOr<std::unique_ptr<ImportWriter>> Connect(const std::string& worker_address,
                                                               const std::string& tls);
  ~ImportWriter();
  ImportWriter(const ImportWriter&) = delete;
  ImportWriter& operator=(const ImportWriter&) = delete;

  // Sends layers[l] (capacity_tokens * record_bytes bytes, position order) as writes of whole
  // pages up to 1 MiB each, at most 16 unanswered, and waits for every answer: OK once the daemon has
  // written every record; else the first refusal. Commit only after it returns OK.
  absl::Status Write(const v1::ImportGrant& grant, const std::vector<std::vector<uint8_t>>& layers);
  // One write exactly as given (header `w`, `bytes` of payload; `rendezvous` forces UCX's
  // rendezvous protocol): the daemon's answer, or DeadlineExceeded when none came in 10 s.
  absl::StatusOr<ImportCode> SendOne(const ImportWrite& w, const uint8_t* payload, size_t bytes, bool rendezvous);
  // Puts `bytes` of 0xEE at daemon address `remote_addr` with UCX RMA and a key of this side's own
  // memory (the daemon hands out none), and flushes. OK if UCX reports the put complete; the
  // caller checks what it did to the daemon.
  absl::Status ForgedPut(uint64_t remote_addr, size_t bytes);
  // The transports this writer ended up with ("default", or "tcp" after shm was refused, or the
  // caller's).
  const std::string& transports() const { return transports_; }
  // UCX's reply handler (inside ucp_worker_progress): records one answer.
  void OnReply(const void* header, size_t length);

 private:
  struct Handles;
  ImportWriter();
  static absl::StatusOr<std::unique_ptr<ImportWriter>> ConnectWith(const std::string& worker_address,
                                                                   const std::string& tls);
  absl::Status Wait(void* request, int timeout_ms = -1);  // a ucs_status_ptr_t
  // Progresses until `seq` is answered or `timeout_ms` passes.
  bool AwaitReply(uint64_t seq, int timeout_ms);
  std::unique_ptr<Handles> ucp_;
  std::map<uint64_t, ImportCode> replies_;  // answers not yet taken
  uint64_t next_seq_ = 1;
  std::string transports_;
};

// The records of `grant` for pattern `seed` (import_pattern.h): one buffer per layer.
std::vector<std::vector<uint8_t>> PatternRecords(const v1::ImportGrant& grant, uint64_t seed);

// Writes nothing remote: copies the same bytes the same way (one memcpy per page-sized chunk)
// into a local, pre-touched buffer, for comparison. Returns the seconds it took.
double MemcpyLikeImport(const v1::ImportGrant& grant, const std::vector<std::vector<uint8_t>>& layers);

}  // namespace hisparse::bench

#endif  // HISPARSE_BENCH_IMPORT_WRITER_H_
