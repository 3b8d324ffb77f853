// ImportWriter: the prefill side of an import (hisparse-bench import). Connects a UCX worker of
// its own to the daemon's (ImportGrant.worker_address) and puts a request's records, in the
// grant's page layout, with ucp_put_nbx; then flushes. The records come from a buffer per layer
// laid out by position (what a prefill engine holds after prefill).
//
// Owns its ucp context, worker, endpoint and unpacked rkeys; releases them on every path.
// Not thread-safe: one thread drives it.
#ifndef HISPARSE_BENCH_IMPORT_WRITER_H_
#define HISPARSE_BENCH_IMPORT_WRITER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hisparse/v1/hisparse.pb.h"

namespace hisparse::bench {

class ImportWriter {
 public:
  // `tls`: UCX_TLS for this side ("" keeps UCX's choice or the environment's).
  static absl::StatusOr<std::unique_ptr<ImportWriter>> Connect(const std::string& worker_address,
                                                               const std::string& tls);
  ~ImportWriter();
  ImportWriter(const ImportWriter&) = delete;
  ImportWriter& operator=(const ImportWriter&) = delete;

  // Puts layers[l] (capacity_tokens * record_bytes bytes, position order) into the grant's pages
  // of layer l, one put per page, a bounded number in flight. Call Flush before committing.
  absl::Status Put(const v1::ImportGrant& grant, const std::vector<std::vector<uint8_t>>& layers);
  // Waits until every put so far has landed in the target's memory (ucp_ep_flush_nbx).
  absl::Status Flush();

 private:
  struct Handles;
  ImportWriter();
  absl::Status Wait(void* request);  // a ucs_status_ptr_t
  std::unique_ptr<Handles> ucp_;
};

// The records of `grant` for pattern `seed` (import_pattern.h): one buffer per layer.
std::vector<std::vector<uint8_t>> PatternRecords(const v1::ImportGrant& grant, uint64_t seed);

// Puts nothing: copies the same bytes the same way (one memcpy per page-sized chunk) into a
// local, pre-touched buffer, for comparison. Returns the seconds it took.
double MemcpyLikeImport(const v1::ImportGrant& grant, const std::vector<std::vector<uint8_t>>& layers);

}  // namespace hisparse::bench

#endif  // HISPARSE_BENCH_IMPORT_WRITER_H_
