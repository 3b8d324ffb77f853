// The fd channel's wire format, in one place: the typed requests and replies that the daemon's
// FdServer and the client's ClientSession exchange over the SOCK_SEQPACKET fd socket, and the one
// encoder and decoder of their bytes. Nothing else formats or parses these packets.
//
// Requests (one packet each):
//   "HSFD1 <session_id> <token> arena"        version 1: the reply is "OK <bytes>" + fd
//   "HSFD2 <session_id> <token> slab <N>"     version 2: "OK fd <bytes>" + fd, or, for a GPU arena
//                                             shared as a cudaIpc handle, "OK cuda-ipc <bytes>
//                                             <128 lowercase hex digits>" without a descriptor
//                                             (the object is "arena" or "slab <N>", a host-pool
//                                             slab; the segmented pool's "segment <N>" is gone)
// Errors, in either version: "ERR <CODE> <message>" (CODE as absl::StatusCodeToString spells it),
// without a descriptor. Both versions stay accepted so old clients and old daemons interoperate.
//
// Plain values and pure functions: thread-safe, nothing owned but the strings.
#ifndef HISPARSE_COMMON_FD_CHANNEL_CODEC_H_
#define HISPARSE_COMMON_FD_CHANNEL_CODEC_H_

#include <cstdint>
#include <string>
#include <variant>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hisparse {

// The request's version prefix: HSFD1 or HSFD2.
enum class FdVersion : int { kV1 = 1, kV2 = 2 };

// What a request fetches: the session's slot arena, or one host-pool slab (page_pool.h).
struct FdArena {
  bool operator==(const FdArena&) const { return true; }
};
struct FdSlab {
  uint64_t n = 0;
  bool operator==(const FdSlab& o) const { return n == o.n; }
};
using FdObject = std::variant<FdArena, FdSlab>;

struct FdRequest {
  FdVersion version = FdVersion::kV2;
  uint64_t session_id = 0;
  std::string token;  // no spaces (the daemon's tokens are hex); may be empty
  FdObject object;
  bool operator==(const FdRequest& o) const {
    return version == o.version && session_id == o.session_id && token == o.token && object == o.object;
  }
};

// A granted fetch. kFd: the object's descriptor travels beside the packet (SCM_RIGHTS) and
// `handle` is empty. kCudaIpc (version 2 only): no descriptor; `handle` is the 64-byte cudaIpc
// handle of the GPU arena.
enum class FdForm { kFd, kCudaIpc };
inline constexpr size_t kCudaIpcHandleBytes = 64;
struct FdOk {
  uint64_t bytes = 0;
  FdForm form = FdForm::kFd;
  std::string handle;
  bool operator==(const FdOk& o) const { return bytes == o.bytes && form == o.form && handle == o.handle; }
};
// A refusal: `code` is never kOk.
struct FdErr {
  absl::StatusCode code = absl::StatusCode::kInternal;
  std::string message;  // may hold spaces; no NUL-termination assumptions
  bool operator==(const FdErr& o) const { return code == o.code && message == o.message; }
};
using FdReply = std::variant<FdOk, FdErr>;

// A wire number: plain decimal digits only (no sign, no spaces), fitting a uint64. The fd socket's
// packets (these and the control lane's hello, control_lane.h) have one spelling of a number.
bool ParseWireDecimal(absl::string_view s, uint64_t* out);

// The request's packet. `r.token` must hold no space (it would not decode back).
std::string EncodeFdRequest(const FdRequest& r);
// InvalidArgument naming what is wrong for anything that is not exactly a request above (an
// unknown version, a session id that is not a decimal uint64, a missing token, an object other
// than "arena" or "slab <uint64>").
absl::StatusOr<FdRequest> DecodeFdRequest(absl::string_view packet);
// "arena" or "slab N" (the request's last field), and back: InvalidArgument for anything else.
std::string FdObjectName(const FdObject& object);
absl::StatusOr<FdObject> DecodeFdObject(absl::string_view object);

// The reply's packet in the form `version` uses. A kCudaIpc grant cannot be said in version 1: it
// becomes FAILED_PRECONDITION telling to fetch with HSFD2. An FdErr with code kOk reads INTERNAL.
std::string EncodeFdReply(const FdReply& r, FdVersion version);
// Decodes a reply of either version; `has_fd` is whether a descriptor came with the packet (an fd
// grant needs one; a cudaIpc grant and an error must have none). InvalidArgument for anything
// else, including an ERR whose code is not a known absl code name.
absl::StatusOr<FdReply> DecodeFdReply(absl::string_view packet, bool has_fd);

// An error reply as a status (the daemon's code and message); OkStatus for a grant.
absl::Status FdReplyStatus(const FdReply& r);

}  // namespace hisparse

#endif  // HISPARSE_COMMON_FD_CHANNEL_CODEC_H_
