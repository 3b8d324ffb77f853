// The import wire messages (docs/DESIGN.md, "Import"): what a prefill-side writer sends the
// daemon's UCX worker as active messages, and the daemon's answer to each. Pure functions over
// bytes, shared by the daemon (daemon/ucx_import.cc), the writer (bench/import_writer.cc) and the
// fuzzer (tests/fuzz/import_message_fuzzer.cc); no UCX here.
//
// A write is one active message (id kImportWriteAmId): header = EncodeImportWrite(w), payload =
// w.count records of w.record_bytes, positions w.first .. w.first + w.count - 1 of layer w.layer,
// in position order. The message names no address: the daemon finds the grant by its id (the
// 128-bit secret of ImportGrant.grant_id) and computes every destination from that grant's own
// page table (PlanImportWrite), so a write lands in the grant's pages or nowhere.
// The answer (id kImportReplyAmId, to the writer's reply endpoint) is EncodeImportReply: the
// write's sequence number and an ImportCode.
//
// Integers are little-endian. Decoding is strict: exact lengths, the magic, lowercase hex grant
// ids; anything else is InvalidArgument with a message. Thread-safe (no state).
#ifndef HISPARSE_COMMON_IMPORT_MESSAGE_H_
#define HISPARSE_COMMON_IMPORT_MESSAGE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace hisparse {

inline constexpr unsigned kImportWriteAmId = 0x4853;  // writer -> daemon
inline constexpr unsigned kImportReplyAmId = 0x4854;  // daemon -> writer
// The most record bytes one write may carry (a bound on what the daemon copies per message).
inline constexpr uint64_t kMaxImportWriteBytes = uint64_t{4} << 20;
inline constexpr size_t kImportGrantIdChars = 32;

// One write's header.
struct ImportWrite {
  std::string grant_id;  // 32 lowercase hex digits
  uint64_t seq = 0;      // the writer's, echoed in the reply
  uint32_t layer = 0;
  uint32_t first = 0;         // first position
  uint32_t count = 0;         // records in the payload
  uint32_t record_bytes = 0;  // as the writer believes the grant says; must equal it
};
bool operator==(const ImportWrite& a, const ImportWrite& b);
inline constexpr size_t kImportWriteHeaderBytes = 4 + kImportGrantIdChars + 8 + 4 * 4;

std::string EncodeImportWrite(const ImportWrite& w);
absl::StatusOr<ImportWrite> DecodeImportWrite(std::string_view header);

// The daemon's answer to one write. Anything but kOk wrote nothing.
enum class ImportCode : uint32_t {
  kOk = 0,
  kMalformed = 1,     // the header does not decode, or its record_bytes / payload length is wrong
  kUnknownGrant = 2,  // no open grant has this id (never issued, another daemon's, committed, aborted, expired)
  kExpired = 3,       // the grant's time is up (its expiry sweep has not run yet)
  kOutOfRange = 4,    // the layer or a position lies outside the grant
  kNotEager = 5,      // a rendezvous message: the daemon takes writes as eager payloads only
};
const char* ImportCodeName(ImportCode code);

struct ImportReply {
  uint64_t seq = 0;
  ImportCode code = ImportCode::kOk;
};
bool operator==(const ImportReply& a, const ImportReply& b);
inline constexpr size_t kImportReplyBytes = 4 + 8 + 4;
std::string EncodeImportReply(const ImportReply& r);
absl::StatusOr<ImportReply> DecodeImportReply(std::string_view bytes);

// What a grant covers, as the daemon registered it.
struct ImportLayout {
  uint32_t num_layers = 0;
  uint32_t capacity_tokens = 0;  // positions per layer
  uint32_t records_per_page = 0;
  uint32_t record_bytes = 0;
};
// A piece of a write that lands in one page: bytes [src_offset, src_offset + bytes) of the payload
// go to page `page` (of the write's layer) at byte `page_offset`.
struct ImportChunk {
  uint32_t page = 0;
  uint64_t page_offset = 0;
  uint64_t src_offset = 0;
  uint64_t bytes = 0;
};
// The pages the layout's layers each hold: ceil(capacity_tokens / records_per_page).
uint64_t ImportPagesPerLayer(const ImportLayout& layout);
// Checks `w` with a payload of `payload_bytes` against `layout` and splits it at page boundaries.
// Every chunk lies inside its page (page_offset + bytes <= records_per_page * record_bytes), its
// page is below ImportPagesPerLayer, and the chunks cover the payload exactly once, in order.
// Errors: kMalformed (record_bytes differs, count 0, payload length not count * record_bytes or
// above kMaxImportWriteBytes), kOutOfRange (layer or positions outside the layout), as the
// returned code; never an exception, whatever the numbers.
struct ImportPlan {
  ImportCode code = ImportCode::kOk;
  std::vector<ImportChunk> chunks;
};
ImportPlan PlanImportWrite(const ImportLayout& layout, const ImportWrite& w, uint64_t payload_bytes);

}  // namespace hisparse

#endif  // HISPARSE_COMMON_IMPORT_MESSAGE_H_
