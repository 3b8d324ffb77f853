#include "hisparse/common/control_lane.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "hisparse/common/fd_channel_codec.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/common/unix_socket.h"

namespace hisparse {
namespace {

constexpr absl::string_view kHelloPrefix = "HSLANE1 ";
constexpr absl::string_view kHelloOk = "OK lane";
constexpr uint8_t kMore = 1;

absl::Status LaneErrno(absl::string_view what) {
  const int e = errno;
  const std::string msg = absl::StrCat("control lane ", what, ": ", std::strerror(e));
  if (e == EPIPE || e == ECONNRESET || e == ENOTCONN) return absl::UnavailableError(msg);
  if (e == EAGAIN || e == EWOULDBLOCK)
    return absl::DeadlineExceededError(absl::StrCat("control lane ", what, ": timed out"));
  return absl::InternalError(msg);
}

void PutHeader(char* out, uint8_t flags, uint8_t tag, uint32_t total) {
  out[0] = static_cast<char>(flags);
  out[1] = static_cast<char>(tag);
  out[2] = 0;
  out[3] = 0;
  for (int i = 0; i < 4; ++i) out[4 + i] = static_cast<char>((total >> (8 * i)) & 0xff);
}

uint32_t TotalOf(absl::string_view packet) {
  uint32_t total = 0;
  for (int i = 0; i < 4; ++i) total |= uint32_t{static_cast<uint8_t>(packet[4 + i])} << (8 * i);
  return total;
}

}  // namespace

const char* LaneVerbName(LaneVerb verb) {
  switch (verb) {
    case LaneVerb::kAdmit:
      return "admit";
    case LaneVerb::kExtend:
      return "extend";
    case LaneVerb::kRelease:
      return "release";
    case LaneVerb::kAdmitBatch:
      return "admit batch";
    case LaneVerb::kReleaseBatch:
      return "release batch";
    case LaneVerb::kPark:
      return "park";
    case LaneVerb::kResume:
      return "resume";
    case LaneVerb::kParkBatch:
      return "park batch";
    case LaneVerb::kResumeBatch:
      return "resume batch";
  }
  return "unknown";
}

std::string EncodeLaneHello(const LaneHello& hello) {
  return absl::StrCat(kHelloPrefix, hello.session_id, " ", hello.token);
}

bool IsLaneHello(absl::string_view packet) { return absl::StartsWith(packet, kHelloPrefix); }

absl::StatusOr<LaneHello> DecodeLaneHello(absl::string_view packet) {
  absl::string_view rest = packet;
  if (!absl::ConsumePrefix(&rest, kHelloPrefix)) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a lane hello: \"", absl::CHexEscape(packet.substr(0, 64)), "\""));
  }
  const std::vector<absl::string_view> fields = absl::StrSplit(rest, ' ');
  LaneHello hello;
  if (fields.size() != 2 || !ParseWireDecimal(fields[0], &hello.session_id) || fields[1].empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad lane hello \"", absl::CHexEscape(packet.substr(0, 128)), "\" (want HSLANE1 <id> <token>)"));
  }
  hello.token = std::string(fields[1]);
  return hello;
}

std::string EncodeLaneHelloReply(const absl::Status& status) {
  if (status.ok()) return std::string(kHelloOk);
  return EncodeFdReply(FdErr{status.code(), std::string(status.message())}, FdVersion::kV2);
}

absl::Status DecodeLaneHelloReply(absl::string_view packet) {
  if (packet == kHelloOk) return absl::OkStatus();
  absl::StatusOr<FdReply> reply = DecodeFdReply(packet, /*has_fd=*/false);
  if (!reply.ok() || FdReplyStatus(*reply).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a lane hello reply: \"", absl::CHexEscape(packet.substr(0, 128)), "\""));
  }
  return FdReplyStatus(*reply);
}

std::vector<std::string> EncodeLaneMessage(uint8_t tag, absl::string_view body) {
  std::vector<std::string> packets;
  const auto total = static_cast<uint32_t>(body.size());
  size_t at = 0;
  do {
    const size_t n = std::min(kLaneChunkBytes, body.size() - at);
    std::string p(kLaneHeaderBytes + n, '\0');
    PutHeader(p.data(), at + n < body.size() ? kMore : 0, tag, total);
    std::memcpy(p.data() + kLaneHeaderBytes, body.data() + at, n);
    packets.push_back(std::move(p));
    at += n;
  } while (at < body.size());
  return packets;
}

absl::Status LaneAssembler::Add(absl::string_view packet) {
  auto refuse = [this](absl::string_view why) {
    done_ = true;  // nothing more belongs to this message
    body_.clear();
    return absl::InvalidArgumentError(absl::StrCat("control lane: ", why));
  };
  if (done_) return refuse("a packet after the message's last");
  if (packet.size() < kLaneHeaderBytes) return refuse("a packet shorter than its header");
  const auto flags = static_cast<uint8_t>(packet[0]);
  const auto tag = static_cast<uint8_t>(packet[1]);
  if ((flags & ~kMore) != 0 || packet[2] != 0 || packet[3] != 0) return refuse("reserved header bits set");
  const uint32_t total = TotalOf(packet);
  if (!started_) {
    if (total > max_body_)
      return refuse(absl::StrCat("a message of ", total, " bytes, above the ", max_body_, " allowed"));
    started_ = true;
    tag_ = tag;
    total_ = total;
    body_.reserve(total);
  } else if (tag != tag_ || total != total_) {
    return refuse("a packet whose tag or total differs from its message's first");
  }
  const absl::string_view chunk = packet.substr(kLaneHeaderBytes);
  if (chunk.size() > total_ - body_.size()) return refuse("more body than the message's total");
  body_.append(chunk.data(), chunk.size());
  if ((flags & kMore) == 0) {
    if (body_.size() != total_) return refuse("the last packet leaves the message short of its total");
    done_ = true;
  } else if (chunk.empty()) {
    return refuse("an empty packet that says more follow");  // would let a peer spin us for free
  }
  return absl::OkStatus();
}

LaneMessage LaneAssembler::Take() {
  LaneMessage m;
  m.tag = tag_;
  m.body = std::move(body_);
  return m;
}

absl::Status SendLaneMessage(int sock, uint8_t tag, absl::string_view body) {
  const auto total = static_cast<uint32_t>(body.size());
  char header[kLaneHeaderBytes];
  size_t at = 0;
  do {
    const size_t n = std::min(kLaneChunkBytes, body.size() - at);
    PutHeader(header, at + n < body.size() ? kMore : 0, tag, total);
    iovec iov[2] = {{header, kLaneHeaderBytes}, {const_cast<char*>(body.data() + at), n}};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n == 0 ? 1 : 2;
    ssize_t sent;
    do {
      sent = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    if (sent < 0) return LaneErrno("send");
    at += n;
  } while (at < body.size());
  return absl::OkStatus();
}

absl::StatusOr<LaneMessage> RecvLaneMessage(int sock, size_t max_body) {
  LaneAssembler assembler(max_body);
  // One packet's buffer per thread, kept: a call's reply (or a lane's request) is most often one
  // small packet, and allocating and clearing 32 KiB for each was a tenth of a lane's CPU time.
  thread_local std::unique_ptr<char[]> buffer(new char[kLanePacketBytes + 1]);
  char* const packet = buffer.get();
  while (!assembler.done()) {
    UniqueFd fd;
    absl::StatusOr<size_t> n = RecvPacketInto(sock, packet, kLanePacketBytes, &fd);
    if (!n.ok()) return absl::Status(n.status().code(), absl::StrCat("control lane: ", n.status().message()));
    if (fd.valid()) return absl::InvalidArgumentError("control lane: a packet carried a descriptor");
    if (absl::Status st = assembler.Add(absl::string_view(packet, *n)); !st.ok()) return st;
  }
  return assembler.Take();
}

}  // namespace hisparse
