// Fuzz target: the import wire messages (hisparse/common/import_message.h), what a remote writer
// sends the daemon's UCX worker. Each step of the input either decodes raw bytes as a write header
// and as a reply (never a crash; whatever decodes encodes back to the same bytes), or plans a write
// of fuzzed numbers against a fuzzed grant layout and checks what the daemon would copy: refused
// with a code and no chunk, or chunks that each lie inside one page of the grant's layer, whose
// positions are the write's and inside the grant, and that cover the payload exactly once, in
// order. The daemon <-> import worker channel (hisparse/common/import_channel.h) gets the same
// treatment: raw bytes decode or are refused with InvalidArgument, whatever decodes encodes back
// to the same bytes, and a message built from fuzzed fields survives its encoding. Anything else
// aborts.
#include <algorithm>
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "fuzz_input.h"
#include "fuzz_reach.h"
#include "hisparse/common/import_channel.h"
#include "hisparse/common/import_message.h"

namespace hisparse::fuzz {
namespace {

constexpr int kMaxSteps = 64;

void RawBytes(const std::string& bytes) {
  auto w = DecodeImportWrite(bytes);
  if (w.ok()) {
    Expect(EncodeImportWrite(*w) == bytes, "a decoded write header does not encode back to its bytes");
  } else {
    Expect(absl::IsInvalidArgument(w.status()) && !w.status().message().empty(),
           "a write decode error that is not InvalidArgument with a message: " + w.status().ToString());
  }
  auto c = DecodeChannelMessage(bytes);
  if (c.ok()) {
    Expect(EncodeChannelMessage(*c) == bytes, "a decoded channel message does not encode back to its bytes");
  } else {
    Expect(absl::IsInvalidArgument(c.status()) && !c.status().message().empty(),
           "a channel decode error that is not InvalidArgument with a message: " + c.status().ToString());
  }
  auto r = DecodeImportReply(bytes);
  if (r.ok()) {
    Expect(EncodeImportReply(*r) == bytes, "a decoded reply does not encode back to its bytes");
  } else {
    Expect(absl::IsInvalidArgument(r.status()), "a reply decode error that is not InvalidArgument");
  }
}

// A header-shaped input: the magic and a valid grant id, fuzzed numbers (and sometimes a bad byte).
void ShapedHeader(FuzzInput& in) {
  ImportWrite w{std::string(kImportGrantIdChars, 'a'),
                in.Read<uint64_t>(),
                in.Read<uint32_t>(),
                in.Read<uint32_t>(),
                in.Read<uint32_t>(),
                in.Read<uint32_t>()};
  std::string bytes = EncodeImportWrite(w);
  auto back = DecodeImportWrite(bytes);
  Expect(back.ok() && *back == w, "a write header does not survive its encoding");
  if ((in.Read<uint8_t>() & 1) != 0) {
    bytes[in.Read<uint8_t>() % bytes.size()] = static_cast<char>(in.Read<uint8_t>());
  }
  if ((in.Read<uint8_t>() & 3) == 0) bytes.resize(in.Read<uint8_t>() % (bytes.size() + 8), 'x');
  RawBytes(bytes);
}

// A channel message of each kind from fuzzed fields: a valid one survives its encoding; then
// some bytes of it changed or cut, as RawBytes checks any input.
void ShapedChannelMessage(FuzzInput& in) {
  const std::string id(kImportGrantIdChars, 'f');
  ChannelMessage m;
  switch (in.Small(0, 5)) {
    case 0:
      m = ChannelHello{in.Read<uint32_t>(), std::string(in.Small(1, 64), 'a')};
      break;
    case 1:
      m = ChannelAck{in.Read<uint64_t>(), static_cast<absl::StatusCode>(in.Small(0, 16)), in.String(40)};
      break;
    case 2:
      m = ChannelSlab{in.Read<uint64_t>() | 1};
      break;
    case 3: {
      ChannelPages p;
      p.refs.resize(in.Small(1, 8));
      for (ChannelPageRef& r : p.refs) r = {in.Read<uint32_t>(), in.Read<uint64_t>()};
      m = p;
      break;
    }
    case 4:
      m = ChannelRegister{
          in.Read<uint64_t>(), id,
          ImportLayout{in.Read<uint32_t>(), in.Read<uint32_t>(), in.Read<uint32_t>(), in.Read<uint32_t>()},
          in.Read<uint64_t>(), static_cast<int64_t>(in.Read<uint64_t>())};
      break;
    default:
      m = ChannelUnregister{in.Read<uint64_t>(), id};
      break;
  }
  std::string bytes = EncodeChannelMessage(m);
  auto back = DecodeChannelMessage(bytes);
  Expect(back.ok() && back->index() == m.index() && EncodeChannelMessage(*back) == bytes,
         "a channel message does not survive its encoding");
  if ((in.Read<uint8_t>() & 1) != 0) {
    bytes[in.Read<uint8_t>() % bytes.size()] = static_cast<char>(in.Read<uint8_t>());
  }
  if ((in.Read<uint8_t>() & 3) == 0) bytes.resize(in.Read<uint8_t>() % (bytes.size() + 8), 'x');
  RawBytes(bytes);
}

void Plan(FuzzInput& in) {
  ImportLayout layout;
  layout.num_layers = in.SmallOrRaw(0, 8);
  layout.capacity_tokens = in.SmallOrRaw(0, 5000);
  layout.records_per_page = in.SmallOrRaw(0, 300);
  layout.record_bytes = in.SmallOrRaw(0, 1024);
  ImportWrite w;
  w.grant_id = std::string(kImportGrantIdChars, '0');
  w.layer = in.SmallOrRaw(0, 9);
  w.first = in.SmallOrRaw(0, 5000);
  w.count = in.SmallOrRaw(0, 5000);
  w.record_bytes = (in.Read<uint8_t>() & 7) == 0 ? in.Read<uint32_t>() : layout.record_bytes;
  const uint64_t payload = (in.Read<uint8_t>() & 7) == 0 ? in.Read<uint64_t>() : uint64_t{w.count} * w.record_bytes;
  // A real layout's pages hold at least a few KiB, so a write spans a bounded number of them; keep
  // each input fast by skipping layouts that would plan millions of one-byte chunks.
  const uint64_t page_used = uint64_t{layout.records_per_page} * layout.record_bytes;
  if (page_used != 0 && std::min(payload, kMaxImportWriteBytes) / page_used > 4096) return;
  const ImportPlan plan = PlanImportWrite(layout, w, payload);
  if (plan.code != ImportCode::kOk) {
    Expect(plan.chunks.empty(), "a refused write planned chunks");
    return;
  }
  const uint64_t rb = layout.record_bytes, page_bytes = uint64_t{layout.records_per_page} * rb;
  Expect(w.layer < layout.num_layers, "a write to a layer outside the grant was accepted");
  Expect(uint64_t{w.first} + w.count <= layout.capacity_tokens, "a write past the grant's positions was accepted");
  Expect(payload == uint64_t{w.count} * rb && payload <= kMaxImportWriteBytes && w.count > 0,
         "a write whose payload is not count records was accepted");
  uint64_t src = 0;
  for (const ImportChunk& c : plan.chunks) {
    Expect(c.page < ImportPagesPerLayer(layout), "a chunk lands on a page the grant's layer does not have");
    Expect(c.bytes > 0 && c.page_offset + c.bytes <= page_bytes, "a chunk runs past its page");
    Expect(c.page_offset % rb == 0 && c.bytes % rb == 0, "a chunk is not whole records");
    Expect(c.src_offset == src, "chunks do not cover the payload in order");
    // The positions the chunk writes are the write's own.
    const uint64_t first_pos = uint64_t{c.page} * layout.records_per_page + c.page_offset / rb;
    Expect(first_pos == w.first + c.src_offset / rb, "a chunk writes other positions than the write's");
    Expect(first_pos + c.bytes / rb <= layout.capacity_tokens, "a chunk writes a position outside the grant");
    src += c.bytes;
  }
  Expect(src == payload, "the chunks do not cover the payload");
}

}  // namespace
}  // namespace hisparse::fuzz

// What the replay holds the corpus to (fuzz_reach.h): each kind of step.
HS_FUZZ_STEP_KINDS("raw", "header", "channel message", "plan")

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hisparse::fuzz;  // NOLINT(google-build-using-namespace): the target's own
  FuzzInput in(data, size);
  for (int i = 0; i < kMaxSteps && !in.empty(); ++i) {
    switch (in.Small(0, 3)) {
      case 0:
        Reached("raw");
        RawBytes(in.String(80));
        break;
      case 1:
        Reached("header");
        ShapedHeader(in);
        break;
      case 3:
        Reached("channel message");
        ShapedChannelMessage(in);
        break;
      default:
        Reached("plan");
        Plan(in);
        break;
    }
  }
  return 0;
}
