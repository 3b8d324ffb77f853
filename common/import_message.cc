// The import wire messages: see hisparse/common/import_message.h.
#include "hisparse/common/import_message.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace hisparse {
namespace {

constexpr char kWriteMagic[4] = {'H', 'S', 'I', 'W'};
constexpr char kReplyMagic[4] = {'H', 'S', 'I', 'R'};

void PutLe32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutLe64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t GetLe32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}
uint64_t GetLe64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}
bool IsGrantIdHex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

bool operator==(const ImportWrite& a, const ImportWrite& b) {
  return a.grant_id == b.grant_id && a.seq == b.seq && a.layer == b.layer && a.first == b.first && a.count == b.count &&
         a.record_bytes == b.record_bytes;
}
bool operator==(const ImportReply& a, const ImportReply& b) { return a.seq == b.seq && a.code == b.code; }

std::string EncodeImportWrite(const ImportWrite& w) {
  std::string out(kWriteMagic, sizeof(kWriteMagic));
  std::string id = w.grant_id.substr(0, kImportGrantIdChars);
  id.resize(kImportGrantIdChars, '\0');  // a short id encodes, and decodes as malformed
  out += id;
  PutLe64(&out, w.seq);
  PutLe32(&out, w.layer);
  PutLe32(&out, w.first);
  PutLe32(&out, w.count);
  PutLe32(&out, w.record_bytes);
  return out;
}

absl::StatusOr<ImportWrite> DecodeImportWrite(std::string_view header) {
  if (header.size() != kImportWriteHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("an import write header is ", kImportWriteHeaderBytes, " bytes, not ", header.size()));
  }
  if (std::memcmp(header.data(), kWriteMagic, sizeof(kWriteMagic)) != 0) {
    return absl::InvalidArgumentError("not an import write (bad magic)");
  }
  const char* p = header.data() + sizeof(kWriteMagic);
  ImportWrite w;
  w.grant_id.assign(p, kImportGrantIdChars);
  if (!IsGrantIdHex(w.grant_id)) return absl::InvalidArgumentError("the grant id is not 32 lowercase hex digits");
  p += kImportGrantIdChars;
  w.seq = GetLe64(p);
  w.layer = GetLe32(p + 8);
  w.first = GetLe32(p + 12);
  w.count = GetLe32(p + 16);
  w.record_bytes = GetLe32(p + 20);
  return w;
}

const char* ImportCodeName(ImportCode code) {
  switch (code) {
    case ImportCode::kOk:
      return "ok";
    case ImportCode::kMalformed:
      return "malformed";
    case ImportCode::kUnknownGrant:
      return "unknown-grant";
    case ImportCode::kExpired:
      return "expired";
    case ImportCode::kOutOfRange:
      return "out-of-range";
    case ImportCode::kNotEager:
      return "not-eager";
  }
  return "unknown-code";
}

std::string EncodeImportReply(const ImportReply& r) {
  std::string out(kReplyMagic, sizeof(kReplyMagic));
  PutLe64(&out, r.seq);
  PutLe32(&out, static_cast<uint32_t>(r.code));
  return out;
}

absl::StatusOr<ImportReply> DecodeImportReply(std::string_view bytes) {
  if (bytes.size() != kImportReplyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("an import reply is ", kImportReplyBytes, " bytes, not ", bytes.size()));
  }
  if (std::memcmp(bytes.data(), kReplyMagic, sizeof(kReplyMagic)) != 0) {
    return absl::InvalidArgumentError("not an import reply (bad magic)");
  }
  ImportReply r;
  r.seq = GetLe64(bytes.data() + 4);
  const uint32_t code = GetLe32(bytes.data() + 12);
  if (code > static_cast<uint32_t>(ImportCode::kNotEager)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown import reply code ", code));
  }
  r.code = static_cast<ImportCode>(code);
  return r;
}

uint64_t ImportPagesPerLayer(const ImportLayout& layout) {
  if (layout.records_per_page == 0) return 0;
  return (uint64_t{layout.capacity_tokens} + layout.records_per_page - 1) / layout.records_per_page;
}

ImportPlan PlanImportWrite(const ImportLayout& layout, const ImportWrite& w, uint64_t payload_bytes) {
  ImportPlan plan;
  const uint64_t rb = layout.record_bytes, per_page = layout.records_per_page;
  if (rb == 0 || per_page == 0 || w.record_bytes != rb || w.count == 0 || payload_bytes != uint64_t{w.count} * rb ||
      payload_bytes > kMaxImportWriteBytes) {
    plan.code = ImportCode::kMalformed;
    return plan;
  }
  if (w.layer >= layout.num_layers || uint64_t{w.first} + w.count > layout.capacity_tokens) {
    plan.code = ImportCode::kOutOfRange;
    return plan;
  }
  uint64_t pos = w.first, src = 0;
  const uint64_t end = uint64_t{w.first} + w.count;
  while (pos < end) {
    const uint64_t in_page = pos % per_page;
    const uint64_t n = std::min(per_page - in_page, end - pos);
    plan.chunks.push_back(ImportChunk{static_cast<uint32_t>(pos / per_page), in_page * rb, src, n * rb});
    pos += n;
    src += n * rb;
  }
  return plan;
}

}  // namespace hisparse
