#include "hisparse/common/fd_channel_codec.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace hisparse {

bool ParseWireDecimal(absl::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return absl::SimpleAtoi(s, out);
}

namespace {

constexpr char kWant[] = "malformed request: want \"HSFD2 <session_id> <token> <object>\"";

// The code an absl::StatusCodeToString name spells, or false; kOk is no error's code.
bool StatusCodeFromName(absl::string_view name, absl::StatusCode* code) {
  for (int c = 1; c <= static_cast<int>(absl::StatusCode::kUnauthenticated); ++c) {
    if (absl::StatusCodeToString(static_cast<absl::StatusCode>(c)) == name) {
      *code = static_cast<absl::StatusCode>(c);
      return true;
    }
  }
  return false;
}

}  // namespace

absl::StatusOr<FdObject> DecodeFdObject(absl::string_view object) {
  if (object == "arena") return FdObject(FdArena{});
  if (absl::string_view rest = object; absl::ConsumePrefix(&rest, "slab ")) {
    FdSlab slab;
    if (!ParseWireDecimal(rest, &slab.n)) {
      return absl::InvalidArgumentError(absl::StrCat("bad slab number in \"", absl::CHexEscape(object), "\""));
    }
    return FdObject(slab);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown fd object \"", absl::CHexEscape(object), "\" (want \"arena\" or \"slab N\")"));
}

namespace {

bool IsLowerHex(absl::string_view s) { return s.find_first_not_of("0123456789abcdef") == absl::string_view::npos; }

absl::StatusOr<FdReply> DecodeOk(absl::string_view text, bool has_fd) {
  FdOk ok;
  if (absl::ConsumePrefix(&text, "cuda-ipc ")) {
    if (has_fd) return absl::InvalidArgumentError("a cuda-ipc reply came with a descriptor");
    std::vector<absl::string_view> f = absl::StrSplit(text, ' ');
    if (f.size() != 2 || !ParseWireDecimal(f[0], &ok.bytes) || f[1].size() != 2 * kCudaIpcHandleBytes ||
        !IsLowerHex(f[1])) {
      return absl::InvalidArgumentError("malformed cuda-ipc reply: want \"OK cuda-ipc <bytes> <128 hex digits>\"");
    }
    ok.form = FdForm::kCudaIpc;
    ok.handle = absl::HexStringToBytes(f[1]);
    return FdReply(std::move(ok));
  }
  (void)absl::ConsumePrefix(&text, "fd ");  // version 2; version 1 says "OK <bytes>"
  if (!ParseWireDecimal(text, &ok.bytes)) {
    return absl::InvalidArgumentError("malformed reply: want \"OK fd <bytes>\" or \"OK cuda-ipc <bytes> <handle>\"");
  }
  if (!has_fd) return absl::InvalidArgumentError("an fd reply came without a descriptor");
  return FdReply(std::move(ok));
}

}  // namespace

std::string FdObjectName(const FdObject& object) {
  if (const auto* s = std::get_if<FdSlab>(&object)) return absl::StrCat("slab ", s->n);
  return "arena";
}

std::string EncodeFdRequest(const FdRequest& r) {
  return absl::StrCat(r.version == FdVersion::kV1 ? "HSFD1 " : "HSFD2 ", r.session_id, " ", r.token, " ",
                      FdObjectName(r.object));
}

absl::StatusOr<FdRequest> DecodeFdRequest(absl::string_view packet) {
  std::vector<absl::string_view> parts = absl::StrSplit(packet, absl::MaxSplits(' ', 3));
  FdRequest r;
  if (parts.size() != 4 || (parts[0] != "HSFD1" && parts[0] != "HSFD2") || !ParseWireDecimal(parts[1], &r.session_id)) {
    return absl::InvalidArgumentError(kWant);
  }
  r.version = parts[0] == "HSFD1" ? FdVersion::kV1 : FdVersion::kV2;
  r.token = std::string(parts[2]);
  auto object = DecodeFdObject(parts[3]);
  if (!object.ok()) return object.status();
  r.object = *object;
  return r;
}

std::string EncodeFdReply(const FdReply& r, FdVersion version) {
  if (const auto* err = std::get_if<FdErr>(&r)) {
    const absl::StatusCode code = err->code == absl::StatusCode::kOk ? absl::StatusCode::kInternal : err->code;
    return absl::StrCat("ERR ", absl::StatusCodeToString(code), " ", err->message);
  }
  const FdOk& ok = std::get<FdOk>(r);
  if (ok.form == FdForm::kFd) return absl::StrCat(version == FdVersion::kV1 ? "OK " : "OK fd ", ok.bytes);
  if (version == FdVersion::kV1) {
    return EncodeFdReply(FdErr{absl::StatusCode::kFailedPrecondition,
                               "this session's GPU arena is shared as a cudaIpc handle, which this request form "
                               "cannot carry (fetch it with HSFD2)"},
                         version);
  }
  return absl::StrCat("OK cuda-ipc ", ok.bytes, " ", absl::BytesToHexString(ok.handle));
}

absl::StatusOr<FdReply> DecodeFdReply(absl::string_view packet, bool has_fd) {
  absl::string_view text = packet;
  if (absl::ConsumePrefix(&text, "OK ")) return DecodeOk(text, has_fd);
  if (absl::ConsumePrefix(&text, "ERR ")) {
    if (has_fd) return absl::InvalidArgumentError("an error reply came with a descriptor");
    std::pair<absl::string_view, absl::string_view> f = absl::StrSplit(text, absl::MaxSplits(' ', 1));
    FdErr err;
    if (!StatusCodeFromName(f.first, &err.code)) {
      return absl::InvalidArgumentError(
          absl::StrCat("an error reply names no status code: \"", absl::CHexEscape(f.first), "\""));
    }
    err.message = std::string(f.second);
    return FdReply(std::move(err));
  }
  return absl::InvalidArgumentError("a reply that is neither \"OK ...\" nor \"ERR <CODE> ...\"");
}

absl::Status FdReplyStatus(const FdReply& r) {
  if (const auto* err = std::get_if<FdErr>(&r)) return absl::Status(err->code, err->message);
  return absl::OkStatus();
}

}  // namespace hisparse
