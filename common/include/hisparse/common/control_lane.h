// The control lane: a session's admissions and releases without gRPC.
//
// Why. A unary gRPC call costs about 62 µs on the H200 host before the daemon does any work, and
// 64 callers get at most ~39,000 calls/s between them (bench/RESULTS.md, "the control plane
// against gRPC's own floor"), while an engine admits and releases a request on every arrival and
// finish. So a session may move its lifecycle calls (Admit, Extend, Release, Park, Resume and their
// batches) onto a SOCK_SEQPACKET connection of its own, to the fd socket the daemon already serves:
// the same protobuf messages, answered by the same SessionManager calls, framed here.
//
// Opening. A fresh connection to the fd socket sends one hello packet,
//   "HSLANE1 <session_id> <token>"
// and the daemon answers "OK lane" (the connection is the session's lane from then on, served by a
// thread of its own) or an fd-channel error, "ERR <CODE> <message>" (fd_channel_codec.h): an older
// daemon answers INVALID_ARGUMENT, as to any request it cannot read, and the client keeps gRPC.
// The kernel's word on the peer (SO_PEERCRED) must be the session's tenant, and the token its
// token: a lane acts for that one session only. A second lane of a session replaces the first.
//
// Messages. After the hello, each side sends whole messages: a request is a verb and a serialized
// request proto, a reply a status code and either the serialized response (OK) or the error's
// message. A message travels as one or more packets, each
//   byte 0    flags: bit 0 set when more packets of this message follow; no other bit may be set
//   byte 1    the tag: the verb (request) or the absl status code (reply), equal in every packet
//   bytes 2-3 zero
//   bytes 4-7 the message body's total length, little-endian, equal in every packet
//   then      the next (at most kLaneChunkBytes) bytes of the body
// so a reply of any size (a batch's pages) passes below the socket's packet limit. The receiver
// bounds the total before it allocates. One request is answered before the next is read: a client
// sends a request and reads its whole reply. No descriptor ever travels on a lane; one that comes is
// closed and the message refused.
//
// Plain functions and values; thread-safe as the syscalls are.
#ifndef HISPARSE_COMMON_CONTROL_LANE_H_
#define HISPARSE_COMMON_CONTROL_LANE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hisparse {

// What a lane request asks; the body is the serialized v1 request of the same name.
enum class LaneVerb : uint8_t {
  kAdmit = 1,
  kExtend = 2,
  kRelease = 3,
  kAdmitBatch = 4,
  kReleaseBatch = 5,
  kPark = 6,
  kResume = 7,
  kParkBatch = 8,
  kResumeBatch = 9,
};
inline constexpr uint8_t kLaneMaxVerb = 9;
// "admit", "release batch", ...: for logs and errors. "unknown" outside the enum.
const char* LaneVerbName(LaneVerb verb);

inline constexpr size_t kLaneHeaderBytes = 8;
inline constexpr size_t kLaneChunkBytes = 32 * 1024;  // body bytes a packet carries at most
inline constexpr size_t kLanePacketBytes = kLaneHeaderBytes + kLaneChunkBytes;
// The largest bodies each side accepts: a request as gRPC's default receive limit; a reply as
// large as a batch of the daemon's largest admissions can be.
inline constexpr size_t kLaneMaxRequestBytes = 4u << 20;
inline constexpr size_t kLaneMaxReplyBytes = 256u << 20;

struct LaneHello {
  uint64_t session_id = 0;
  std::string token;
};
std::string EncodeLaneHello(const LaneHello& hello);
// Whether `packet` is a hello at all (its prefix), whatever its fields: the fd socket serves
// fd-channel requests beside it.
bool IsLaneHello(absl::string_view packet);
// InvalidArgument naming what is wrong for anything but exactly "HSLANE1 <decimal id> <token>".
absl::StatusOr<LaneHello> DecodeLaneHello(absl::string_view packet);
// The daemon's answer to a hello: "OK lane", or the fd channel's "ERR <CODE> <message>".
std::string EncodeLaneHelloReply(const absl::Status& status);
// OkStatus for "OK lane", the daemon's error for an ERR reply; InvalidArgument for anything else.
absl::Status DecodeLaneHelloReply(absl::string_view packet);

// One whole message: a request's verb or a reply's status code, and its body.
struct LaneMessage {
  uint8_t tag = 0;
  std::string body;
};

// The packets of one message, in order (one, for an empty body).
std::vector<std::string> EncodeLaneMessage(uint8_t tag, absl::string_view body);

// Gathers one message from its packets. Add each packet as it comes until done().
class LaneAssembler {
 public:
  explicit LaneAssembler(size_t max_body) : max_body_(max_body) {}
  // InvalidArgument for a packet that cannot belong here: short, a reserved bit or byte set, a
  // total above max_body, a tag or total other than the first packet's, more body than the total
  // or a last packet that leaves it short, or a packet after the last. The message is then lost.
  absl::Status Add(absl::string_view packet);
  bool done() const { return done_; }
  // Valid once done().
  LaneMessage Take();

 private:
  const size_t max_body_;
  bool started_ = false;
  bool done_ = false;
  uint8_t tag_ = 0;
  uint32_t total_ = 0;
  std::string body_;
};

// Sends `tag` and `body` on `sock` as EncodeLaneMessage frames them. Blocking sockets wait (within
// SO_SNDTIMEO, when set: then DeadlineExceeded); a closed peer is Unavailable.
absl::Status SendLaneMessage(int sock, uint8_t tag, absl::string_view body);
// Receives one whole message of at most `max_body` bytes. A closed peer is Unavailable, an
// SO_RCVTIMEO that ran out DeadlineExceeded, a malformed packet or one carrying a descriptor
// InvalidArgument (the connection is then out of step: drop it).
absl::StatusOr<LaneMessage> RecvLaneMessage(int sock, size_t max_body);

}  // namespace hisparse

#endif  // HISPARSE_COMMON_CONTROL_LANE_H_
