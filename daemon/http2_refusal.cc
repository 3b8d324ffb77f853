#include "hisparse/daemon/http2_refusal.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"

namespace hisparse {
namespace {

constexpr absl::string_view kClientPreface("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24);
constexpr size_t kFrameHeaderBytes = 9;
constexpr uint32_t kMaxFrameBytes = 16384;  // SETTINGS_MAX_FRAME_SIZE's default, which we never raise
constexpr uint8_t kHeaders = 0x1, kSettings = 0x4, kGoawayType = 0x7;
constexpr uint8_t kEndStream = 0x1, kAck = 0x1, kEndHeaders = 0x4;
constexpr uint32_t kEnhanceYourCalm = 0xb;
constexpr int kResourceExhausted = 8;  // grpc-status
constexpr size_t kMaxMessageBytes = 1024;

void AppendU32(std::string* out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out->push_back(static_cast<char>((v >> shift) & 0xff));
}

std::string Frame(uint8_t type, uint8_t flags, uint32_t stream, absl::string_view payload) {
  std::string out;
  const auto length = static_cast<uint32_t>(payload.size());
  out.push_back(static_cast<char>((length >> 16) & 0xff));
  out.push_back(static_cast<char>((length >> 8) & 0xff));
  out.push_back(static_cast<char>(length & 0xff));
  out.push_back(static_cast<char>(type));
  out.push_back(static_cast<char>(flags));
  AppendU32(&out, stream & 0x7fffffff);
  out.append(payload.data(), payload.size());
  return out;
}

// HPACK's integer with an N-bit prefix (RFC 7541, 5.1); `first` holds the bits above the prefix.
void AppendHpackInt(std::string* out, uint8_t first, int prefix_bits, size_t v) {
  const size_t max_prefix = (size_t{1} << prefix_bits) - 1;
  if (v < max_prefix) {
    out->push_back(static_cast<char>(first | v));
    return;
  }
  out->push_back(static_cast<char>(first | max_prefix));
  v -= max_prefix;
  while (v >= 128) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// A literal header field without indexing, its name literal too (RFC 7541, 6.2.2), no Huffman.
void AppendLiteral(std::string* out, absl::string_view name, absl::string_view value) {
  out->push_back(0);
  AppendHpackInt(out, 0, 7, name.size());
  out->append(name.data(), name.size());
  AppendHpackInt(out, 0, 7, value.size());
  out->append(value.data(), value.size());
}

// grpc-message is percent-encoded: bytes outside 0x20..0x7e, and '%' itself.
std::string PercentEncode(absl::string_view s) {
  std::string out;
  for (const char c : s) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x20 || b > 0x7e || b == '%') {
      out += absl::StrFormat("%%%02X", b);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace

Http2Refusal::Http2Refusal(std::string message) : message_(std::move(message)) {
  if (message_.size() > kMaxMessageBytes) message_.resize(kMaxMessageBytes);
}

std::string Http2Refusal::ServerPreface() { return Frame(kSettings, 0, 0, ""); }

std::string Http2Refusal::TrailersOnly(uint32_t stream, absl::string_view message) {
  std::string block;
  block.push_back(static_cast<char>(0x88));  // :status 200 (static table, index 8)
  AppendLiteral(&block, "content-type", "application/grpc");
  AppendLiteral(&block, "grpc-status", std::to_string(kResourceExhausted));
  AppendLiteral(&block, "grpc-message", PercentEncode(message.substr(0, kMaxMessageBytes)));
  return Frame(kHeaders, kEndStream | kEndHeaders, stream, block);
}

std::string Http2Refusal::Goaway(uint32_t last_stream, absl::string_view debug) {
  std::string payload;
  AppendU32(&payload, last_stream & 0x7fffffff);
  AppendU32(&payload, kEnhanceYourCalm);
  const absl::string_view cut = debug.substr(0, kMaxMessageBytes);
  payload.append(cut.data(), cut.size());
  return Frame(kGoawayType, 0, 0, payload);
}

std::string Http2Refusal::Feed(absl::string_view bytes) {
  if (answered_ || failed_) return "";
  in_.append(bytes.data(), bytes.size());
  if (!preface_seen_) {
    const size_t n = std::min(in_.size(), kClientPreface.size());
    if (absl::string_view(in_).substr(0, n) != kClientPreface.substr(0, n)) {
      failed_ = true;
      return "";
    }
    if (in_.size() < kClientPreface.size()) return "";
    in_.erase(0, kClientPreface.size());
    preface_seen_ = true;
  }
  std::string out;
  while (in_.size() >= kFrameHeaderBytes) {
    const auto byte = [this](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(in_[i])); };
    const uint32_t length = byte(0) << 16 | byte(1) << 8 | byte(2);
    const uint8_t type = static_cast<uint8_t>(byte(3)), flags = static_cast<uint8_t>(byte(4));
    const uint32_t stream = (byte(5) << 24 | byte(6) << 16 | byte(7) << 8 | byte(8)) & 0x7fffffff;
    if (length > kMaxFrameBytes) {
      failed_ = true;
      return out;
    }
    if (in_.size() < kFrameHeaderBytes + length) break;  // the rest of the frame is still coming
    in_.erase(0, kFrameHeaderBytes + length);
    if (type == kSettings && (flags & kAck) == 0) out += Frame(kSettings, kAck, 0, "");
    if (type == kHeaders && stream != 0) {
      out += TrailersOnly(stream, message_);
      out += Goaway(stream, message_);
      answered_ = true;
      in_.clear();
      break;
    }
  }
  return out;
}

}  // namespace hisparse
