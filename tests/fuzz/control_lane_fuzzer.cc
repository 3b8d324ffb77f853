// Fuzz target: the control lane's codec (hisparse/common/control_lane.h), what the daemon reads from
// a tenant's lane before any request handler sees it. Each step of the input either feeds packets
// of raw bytes to a LaneAssembler (which must refuse or gather them, never crash, and a gathered
// message must be what its header promised and survive its own encoding), frames a message and
// gathers it back (decode(encode(x)) == x, every packet within the size limit), or decodes a raw
// hello and a raw hello reply. Anything else aborts.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "fuzz_check.h"
#include "fuzz_input.h"
#include "fuzz_reach.h"
#include "hisparse/common/control_lane.h"

namespace hisparse::fuzz {
namespace {

constexpr int kMaxSteps = 64;

// A packet: either raw bytes, or a well-formed header (flags, tag, total) over raw body bytes, so
// that mutations reach the assembler's checks beyond "too short".
std::string PickPacket(FuzzInput& in) {
  if ((in.Read<uint8_t>() & 1) == 0) return in.String(255);
  std::string p(kLaneHeaderBytes, '\0');
  p[0] = static_cast<char>(in.Small(0, 3));
  p[1] = static_cast<char>(in.Read<uint8_t>());
  const uint32_t total = in.SmallOrRaw(0, 600);
  for (int i = 0; i < 4; ++i) p[4 + i] = static_cast<char>((total >> (8 * i)) & 0xff);
  return p + in.String(255);
}

void Packets(FuzzInput& in) {
  const size_t max_body = in.Small(0, 255) * 4;
  LaneAssembler a(max_body);
  const int n = static_cast<int>(in.Small(1, 8));
  bool refused = false;
  for (int i = 0; i < n && !a.done(); ++i) {
    const absl::Status st = a.Add(PickPacket(in));
    if (!st.ok()) {
      Expect(absl::IsInvalidArgument(st) && !st.message().empty(),
             "a refusal that is not InvalidArgument: " + st.ToString());
      Expect(a.done(), "a refused message still takes packets");
      refused = true;
      break;
    }
  }
  if (!a.done() || refused) return;
  Expect(!a.Add(std::string(kLaneHeaderBytes, '\0')).ok(), "a packet after the last was taken");
  const LaneMessage m = a.Take();
  Expect(m.body.size() <= max_body, "a gathered message above the bound");
  LaneAssembler again(max_body);
  for (const std::string& p : EncodeLaneMessage(m.tag, m.body))
    Expect(again.Add(p).ok(), "a re-encoded packet refused");
  Expect(again.done(), "a re-encoded message left unfinished");
  const LaneMessage back = again.Take();
  Expect(back.tag == m.tag && back.body == m.body, "a gathered message does not survive its own encoding");
}

void Typed(FuzzInput& in) {
  const auto tag = in.Read<uint8_t>();
  const std::string piece = in.String(255);
  std::string body;
  // Up to ~100 KiB from a repeated piece: several packets.
  for (uint32_t i = 0, n = in.Small(0, 255) * 2; i < n; ++i) body += piece;
  const std::vector<std::string> packets = EncodeLaneMessage(tag, body);
  LaneAssembler a(body.size());
  for (size_t i = 0; i < packets.size(); ++i) {
    Expect(packets[i].size() <= kLanePacketBytes, "a packet above the limit");
    Expect(!a.done(), "a message gathered before its last packet");
    Expect(a.Add(packets[i]).ok(), "an encoded packet refused");
  }
  Expect(a.done(), "an encoded message left unfinished");
  const LaneMessage m = a.Take();
  Expect(m.tag == tag && m.body == body, "decode(encode(message)) differs");
  if (!body.empty()) {
    LaneAssembler small(body.size() - 1);
    Expect(!small.Add(packets[0]).ok(), "a message above the bound was taken");
  }
}

void Hello(const std::string& raw) {
  auto hello = DecodeLaneHello(raw);
  if (!hello.ok()) {
    Expect(absl::IsInvalidArgument(hello.status()), "a hello refusal that is not InvalidArgument");
  } else {
    Expect(IsLaneHello(raw), "a decoded hello that IsLaneHello denies");
    auto back = DecodeLaneHello(EncodeLaneHello(*hello));
    Expect(back.ok() && back->session_id == hello->session_id && back->token == hello->token,
           "a decoded hello does not survive its own encoding");
  }
  const absl::Status reply = DecodeLaneHelloReply(raw);
  Expect(!reply.ok() || raw == "OK lane", "a reply other than OK lane read as OK");
}

}  // namespace
}  // namespace hisparse::fuzz

HS_FUZZ_STEP_KINDS("packets", "typed", "hello")

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hisparse::fuzz;  // NOLINT(google-build-using-namespace): the target's own
  FuzzInput in(data, size);
  for (int i = 0; i < kMaxSteps && !in.empty(); ++i) {
    switch (in.Small(0, 2)) {
      case 0:
        Reached("packets");
        Packets(in);
        break;
      case 1:
        Reached("typed");
        Typed(in);
        break;
      default: {
        static const char* const kStems[] = {"", "HSLANE1 ", "HSLANE1 1 ", "OK ", "ERR "};
        const std::string raw = kStems[in.Small(0, 4)] + in.String(200);
        Reached("hello");
        Hello(raw);
        break;
      }
    }
  }
  return 0;
}
