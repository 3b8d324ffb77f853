// The daemon <-> import worker channel: see hisparse/common/import_channel.h.
#include "hisparse/common/import_channel.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace hisparse {
namespace {

constexpr char kMagic[4] = {'H', 'S', 'I', 'C'};
enum class Type : uint32_t { kHello = 1, kAck = 2, kSlab = 3, kPages = 4, kRegister = 5, kUnregister = 6 };
constexpr size_t kPageRefBytes = 4 + 8;

void Put32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void Put64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Reads fixed-size fields off the front of a packet; any read past the end marks it short.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : rest_(bytes) {}
  uint32_t U32() { return static_cast<uint32_t>(Take(4)); }
  uint64_t U64() { return Take(8); }
  std::string_view Bytes(size_t n) {
    if (n > rest_.size()) {
      short_ = true;
      return {};
    }
    std::string_view v = rest_.substr(0, n);
    rest_.remove_prefix(n);
    return v;
  }
  bool short_read() const { return short_; }
  size_t left() const { return rest_.size(); }

 private:
  uint64_t Take(size_t n) {
    std::string_view b = Bytes(n);
    uint64_t v = 0;
    for (size_t i = 0; i < b.size(); ++i) v |= uint64_t{static_cast<uint8_t>(b[i])} << (8 * i);
    return v;
  }
  std::string_view rest_;
  bool short_ = false;
};

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("import channel: ", what));
}

bool IsGrantId(std::string_view s) {
  if (s.size() != kImportGrantIdChars) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

void PutGrantId(std::string* out, const std::string& id) {
  std::string fixed = id.substr(0, kImportGrantIdChars);
  fixed.resize(kImportGrantIdChars, '\0');  // a wrong id encodes, and decodes as malformed
  *out += fixed;
}

struct Encoder {
  std::string* out;
  void operator()(const ChannelHello& m) const {
    Put32(out, static_cast<uint32_t>(Type::kHello));
    Put32(out, m.version);
    Put32(out, static_cast<uint32_t>(m.worker_address.size()));
    *out += m.worker_address;
  }
  void operator()(const ChannelAck& m) const {
    Put32(out, static_cast<uint32_t>(Type::kAck));
    Put64(out, m.seq);
    Put32(out, static_cast<uint32_t>(m.code));
    const std::string_view text = std::string_view(m.message).substr(0, kImportChannelMaxAckMessage);
    Put32(out, static_cast<uint32_t>(text.size()));
    *out += text;
  }
  void operator()(const ChannelSlab& m) const {
    Put32(out, static_cast<uint32_t>(Type::kSlab));
    Put64(out, m.bytes);
  }
  void operator()(const ChannelPages& m) const {
    Put32(out, static_cast<uint32_t>(Type::kPages));
    Put32(out, static_cast<uint32_t>(m.refs.size()));
    for (const ChannelPageRef& r : m.refs) {
      Put32(out, r.slab);
      Put64(out, r.offset);
    }
  }
  void operator()(const ChannelRegister& m) const {
    Put32(out, static_cast<uint32_t>(Type::kRegister));
    Put64(out, m.seq);
    PutGrantId(out, m.grant_id);
    Put32(out, m.layout.num_layers);
    Put32(out, m.layout.capacity_tokens);
    Put32(out, m.layout.records_per_page);
    Put32(out, m.layout.record_bytes);
    Put64(out, m.page_bytes);
    Put64(out, static_cast<uint64_t>(m.expires_unix_ns));
  }
  void operator()(const ChannelUnregister& m) const {
    Put32(out, static_cast<uint32_t>(Type::kUnregister));
    Put64(out, m.seq);
    PutGrantId(out, m.grant_id);
  }
};

absl::StatusOr<ChannelMessage> DecodeBody(Type type, Reader& in) {
  switch (type) {
    case Type::kHello: {
      ChannelHello m;
      m.version = in.U32();
      const uint32_t n = in.U32();
      if (n == 0 || n > kImportChannelMaxAddress) return Malformed("hello: the worker address length is out of range");
      m.worker_address = std::string(in.Bytes(n));
      return m;
    }
    case Type::kAck: {
      ChannelAck m;
      m.seq = in.U64();
      const uint32_t code = in.U32();
      if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated))
        return Malformed("ack: unknown status code");
      m.code = static_cast<absl::StatusCode>(code);
      const uint32_t n = in.U32();
      if (n > kImportChannelMaxAckMessage) return Malformed("ack: message too long");
      m.message = std::string(in.Bytes(n));
      return m;
    }
    case Type::kSlab: {
      ChannelSlab m;
      m.bytes = in.U64();
      if (m.bytes == 0 && !in.short_read()) return Malformed("slab: zero bytes");
      return m;
    }
    case Type::kPages: {
      ChannelPages m;
      const uint32_t n = in.U32();
      if (n == 0 || n > kImportChannelPagesPerPacket) return Malformed("pages: count out of range");
      if (in.left() != uint64_t{n} * kPageRefBytes) return Malformed("pages: length does not match the count");
      m.refs.resize(n);
      for (ChannelPageRef& r : m.refs) {
        r.slab = in.U32();
        r.offset = in.U64();
      }
      return m;
    }
    case Type::kRegister: {
      ChannelRegister m;
      m.seq = in.U64();
      m.grant_id = std::string(in.Bytes(kImportGrantIdChars));
      m.layout.num_layers = in.U32();
      m.layout.capacity_tokens = in.U32();
      m.layout.records_per_page = in.U32();
      m.layout.record_bytes = in.U32();
      m.page_bytes = in.U64();
      m.expires_unix_ns = static_cast<int64_t>(in.U64());
      if (!in.short_read() && !IsGrantId(m.grant_id)) return Malformed("register: bad grant id");
      return m;
    }
    case Type::kUnregister: {
      ChannelUnregister m;
      m.seq = in.U64();
      m.grant_id = std::string(in.Bytes(kImportGrantIdChars));
      if (!in.short_read() && !IsGrantId(m.grant_id)) return Malformed("unregister: bad grant id");
      return m;
    }
  }
  return Malformed(absl::StrCat("unknown message type ", static_cast<uint32_t>(type)));
}

}  // namespace

std::string EncodeChannelMessage(const ChannelMessage& m) {
  std::string out(kMagic, sizeof(kMagic));
  std::visit(Encoder{&out}, m);
  return out;
}

absl::StatusOr<ChannelMessage> DecodeChannelMessage(std::string_view packet) {
  if (packet.size() > kImportChannelMaxPacket) return Malformed("packet too long");
  Reader in(packet);
  if (in.Bytes(sizeof(kMagic)) != std::string_view(kMagic, sizeof(kMagic))) return Malformed("bad magic");
  const auto type = static_cast<Type>(in.U32());
  if (in.short_read()) return Malformed("packet too short");
  absl::StatusOr<ChannelMessage> m = DecodeBody(type, in);
  if (!m.ok()) return m;
  if (in.short_read()) return Malformed("packet too short");
  if (in.left() != 0) return Malformed("trailing bytes");
  return m;
}

}  // namespace hisparse
