// The channel between hisparsed and its import worker (docs/DESIGN.md, "Import"): one
// SOCK_SEQPACKET socket pair, one message per packet. The worker (hisparse-import-worker, a
// process of its own) runs the UCX side of imports; the daemon tells it which grants are open and
// hands it, per grant, the slab descriptors and page offsets the grant's records go to. Pure
// functions over bytes, shared by both ends and the import fuzzer; no sockets here.
//
// Worker -> daemon: kHello once (protocol version, the UCX worker address writers connect to),
// then one kAck per kRegister / kUnregister, in order.
// Daemon -> worker, one grant at a time: kSlab (with the slab's memfd attached) for each slab the
// grant touches, kPages (the grant's page table in pieces: layer-major, each page a slab index of
// this grant and a byte offset in it), then kRegister, which consumes what came before it; or
// kUnregister, after whose kAck the worker writes nothing more into that grant's pages.
//
// Integers are little-endian. Decoding is strict (exact lengths, known type, bounded counts,
// lowercase hex grant ids): anything else is InvalidArgument with a message. Each end treats a
// message that does not decode as the end of the channel. Thread-safe (no state).
#ifndef HISPARSE_COMMON_IMPORT_CHANNEL_H_
#define HISPARSE_COMMON_IMPORT_CHANNEL_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "hisparse/common/import_message.h"

namespace hisparse {

// Bumped whenever a message's layout changes: a worker of another version is refused at kHello.
inline constexpr uint32_t kImportChannelVersion = 1;
// The largest packet either end sends or accepts (kPages pieces stay under it).
inline constexpr size_t kImportChannelMaxPacket = 64 << 10;
// Page references per kPages packet.
inline constexpr size_t kImportChannelPagesPerPacket = 4096;
inline constexpr size_t kImportChannelMaxAddress = 16 << 10;
inline constexpr size_t kImportChannelMaxAckMessage = 1024;

struct ChannelHello {
  uint32_t version = kImportChannelVersion;
  std::string worker_address;  // UCX's, opaque; 1 .. kImportChannelMaxAddress bytes
};
struct ChannelAck {
  uint64_t seq = 0;
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string message;  // at most kImportChannelMaxAckMessage bytes
};
struct ChannelSlab {
  uint64_t bytes = 0;  // the memfd's size (the worker checks it with fstat)
};
struct ChannelPageRef {
  uint32_t slab = 0;    // index among the kSlab messages since the last kRegister
  uint64_t offset = 0;  // the page's first byte in that slab
};
struct ChannelPages {
  std::vector<ChannelPageRef> refs;  // 1 .. kImportChannelPagesPerPacket
};
struct ChannelRegister {
  uint64_t seq = 0;
  std::string grant_id;  // kImportGrantIdChars lowercase hex digits
  ImportLayout layout;
  uint64_t page_bytes = 0;
  int64_t expires_unix_ns = 0;  // writes at or after it are refused (kExpired)
};
struct ChannelUnregister {
  uint64_t seq = 0;
  std::string grant_id;
};

using ChannelMessage =
    std::variant<ChannelHello, ChannelAck, ChannelSlab, ChannelPages, ChannelRegister, ChannelUnregister>;

std::string EncodeChannelMessage(const ChannelMessage& m);
absl::StatusOr<ChannelMessage> DecodeChannelMessage(std::string_view packet);

}  // namespace hisparse

#endif  // HISPARSE_COMMON_IMPORT_CHANNEL_H_
