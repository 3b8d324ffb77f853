// Fuzz target: the fd channel's codec (hisparse/common/fd_channel_codec.h) on its own. Each step
// of the input either decodes raw bytes as a request and as a reply (which must never crash, and
// whatever decodes must encode back to bytes that decode to the same value), or builds a typed
// request or reply from the input and checks decode(encode(x)) == x. Anything else aborts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <variant>

#include "absl/status/status.h"
#include "fuzz_check.h"
#include "fuzz_input.h"
#include "fuzz_reach.h"
#include "hisparse/common/fd_channel_codec.h"

namespace hisparse::fuzz {
namespace {

constexpr int kMaxSteps = 64;

FdVersion PickVersion(FuzzInput& in) { return (in.Read<uint8_t>() & 1) != 0 ? FdVersion::kV1 : FdVersion::kV2; }

// A token as the wire can carry it: no spaces.
std::string PickToken(FuzzInput& in) {
  std::string t = in.String(64);
  for (char& c : t) {
    if (c == ' ') c = '_';
  }
  return t;
}

void RawRequest(const std::string& bytes) {
  auto r = DecodeFdRequest(bytes);
  if (!r.ok()) {
    Expect(absl::IsInvalidArgument(r.status()) && !r.status().message().empty(),
           "a request decode error that is not InvalidArgument with a message: " + r.status().ToString());
    return;
  }
  const std::string again = EncodeFdRequest(*r);
  auto back = DecodeFdRequest(again);
  Expect(back.ok() && *back == *r, "a decoded request does not survive its own encoding: " + again);
}

void RawReply(const std::string& bytes, bool has_fd) {
  auto r = DecodeFdReply(bytes, has_fd);
  if (!r.ok()) {
    Expect(absl::IsInvalidArgument(r.status()) && !r.status().message().empty(),
           "a reply decode error that is not InvalidArgument with a message: " + r.status().ToString());
    return;
  }
  const auto* ok = std::get_if<FdOk>(&*r);
  Expect(ok != nullptr || !FdReplyStatus(*r).ok(), "an error reply whose status is OK: " + bytes);
  Expect(ok == nullptr || (ok->form == FdForm::kFd) == has_fd, "a grant decoded in the wrong form: " + bytes);
  Expect(ok == nullptr || ok->form == FdForm::kFd || ok->handle.size() == kCudaIpcHandleBytes,
         "a cudaIpc handle of the wrong size: " + bytes);
  const std::string again = EncodeFdReply(*r, FdVersion::kV2);
  auto back = DecodeFdReply(again, has_fd);
  Expect(back.ok() && *back == *r, "a decoded reply does not survive its own encoding: " + again);
}

void TypedRequest(FuzzInput& in) {
  FdRequest r;
  r.version = PickVersion(in);
  r.session_id = in.Read<uint64_t>();
  r.token = PickToken(in);
  if ((in.Read<uint8_t>() & 1) != 0) {
    r.object = FdSlab{in.Read<uint64_t>()};
  }
  const std::string bytes = EncodeFdRequest(r);
  auto back = DecodeFdRequest(bytes);
  Expect(back.ok() && *back == r, "decode(encode(request)) differs: " + bytes);
}

void TypedReply(FuzzInput& in) {
  const FdVersion version = PickVersion(in);
  FdReply r;
  switch (in.Small(0, 2)) {
    case 0:
      r = FdOk{in.Read<uint64_t>(), FdForm::kFd, ""};
      break;
    case 1: {
      FdOk ok{in.Read<uint64_t>(), FdForm::kCudaIpc, std::string(kCudaIpcHandleBytes, '\0')};
      for (char& c : ok.handle) c = static_cast<char>(in.Read<uint8_t>());
      r = ok;
      break;
    }
    default:
      r = FdErr{static_cast<absl::StatusCode>(in.Small(1, 16)), in.String(200)};
      break;
  }
  const auto* ok = std::get_if<FdOk>(&r);
  const bool has_fd = ok != nullptr && ok->form == FdForm::kFd;
  const std::string bytes = EncodeFdReply(r, version);
  auto back = DecodeFdReply(bytes, has_fd);
  Expect(back.ok(), "an encoded reply does not decode: " + bytes);
  if (ok != nullptr && ok->form == FdForm::kCudaIpc && version == FdVersion::kV1) {
    Expect(absl::IsFailedPrecondition(FdReplyStatus(*back)), "a version-1 cudaIpc grant is not refused: " + bytes);
    return;
  }
  Expect(*back == r, "decode(encode(reply)) differs: " + bytes);
}

}  // namespace
}  // namespace hisparse::fuzz

// What the replay holds the corpus to (fuzz_reach.h): each kind of step.
HS_FUZZ_STEP_KINDS("raw", "typed request", "typed reply", "shaped")

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hisparse::fuzz;  // NOLINT(google-build-using-namespace): the target's own
  FuzzInput in(data, size);
  for (int i = 0; i < kMaxSteps && !in.empty(); ++i) {
    switch (in.Small(0, 3)) {
      case 0: {
        const std::string raw = in.String(255);
        Reached("raw");
        RawRequest(raw);
        RawReply(raw, false);
        RawReply(raw, true);
        break;
      }
      case 1:
        Reached("typed request");
        TypedRequest(in);
        break;
      case 2:
        Reached("typed reply");
        TypedReply(in);
        break;
      default: {  // protocol-shaped bytes, mutated: "OK fd 12", "ERR NOT_FOUND x", "HSFD2 1 t arena"
        static const char* const kStems[] = {"OK ", "OK fd ", "OK cuda-ipc ", "ERR ", "HSFD1 ", "HSFD2 "};
        const std::string raw = kStems[in.Small(0, 5)] + in.String(200);
        Reached("shaped");
        RawRequest(raw);
        RawReply(raw, (in.Read<uint8_t>() & 1) != 0);
        break;
      }
    }
  }
  return 0;
}
