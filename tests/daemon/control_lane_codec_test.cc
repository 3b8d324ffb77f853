// The control lane's wire format (common/control_lane.*): hellos, and messages framed into packets
// and gathered back, over a real SOCK_SEQPACKET socket pair too.
#include "hisparse/common/control_lane.h"

#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/common/unix_socket.h"

namespace hisparse {
namespace {

std::string Body(size_t n) {
  std::string b(n, '\0');
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<char>(i * 131 + 7);
  return b;
}

std::string Header(uint8_t flags, uint8_t tag, uint32_t total) {
  std::string h(kLaneHeaderBytes, '\0');
  h[0] = static_cast<char>(flags);
  h[1] = static_cast<char>(tag);
  for (int i = 0; i < 4; ++i) h[4 + i] = static_cast<char>((total >> (8 * i)) & 0xff);
  return h;
}

TEST(ControlLaneCodecTest, HellosRoundTripAndOnlyExactOnesDecode) {
  const std::string hello = EncodeLaneHello({42, "deadbeef"});
  EXPECT_EQ(hello, "HSLANE1 42 deadbeef");
  EXPECT_TRUE(IsLaneHello(hello));
  auto decoded = DecodeLaneHello(hello);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->session_id, 42u);
  EXPECT_EQ(decoded->token, "deadbeef");
  EXPECT_FALSE(IsLaneHello("HSFD2 42 deadbeef arena"));
  for (const char* bad : {"HSLANE1 ", "HSLANE1 42", "HSLANE1 42 ", "HSLANE1 x t", "HSLANE1 -1 t", "HSLANE1 42 t u",
                          "HSLANE1 123456789012345678901 t", "HSLANE1 18446744073709551616 t"}) {
    EXPECT_EQ(DecodeLaneHello(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(DecodeLaneHelloReply(EncodeLaneHelloReply(absl::OkStatus())).ok());
  const absl::Status refused = DecodeLaneHelloReply(EncodeLaneHelloReply(absl::PermissionDeniedError("not yours")));
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(refused.message(), "not yours");
  // What an older daemon answers to a hello it cannot read keeps its code.
  EXPECT_EQ(DecodeLaneHelloReply("ERR INVALID_ARGUMENT unknown request").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeLaneHelloReply("OK fd 4096").code(), absl::StatusCode::kInvalidArgument);
}

TEST(ControlLaneCodecTest, MessagesOfEverySizeSplitAndGatherBack) {
  for (size_t n :
       {size_t{0}, size_t{1}, kLaneChunkBytes - 1, kLaneChunkBytes, kLaneChunkBytes + 1, 3 * kLaneChunkBytes + 17}) {
    SCOPED_TRACE(n);
    const std::string body = Body(n);
    const std::vector<std::string> packets = EncodeLaneMessage(5, body);
    EXPECT_EQ(packets.size(), n == 0 ? 1 : (n + kLaneChunkBytes - 1) / kLaneChunkBytes);
    LaneAssembler a(n);
    for (const std::string& p : packets) {
      EXPECT_LE(p.size(), kLanePacketBytes);
      ASSERT_FALSE(a.done());
      ASSERT_TRUE(a.Add(p).ok());
    }
    ASSERT_TRUE(a.done());
    const LaneMessage m = a.Take();
    EXPECT_EQ(m.tag, 5);
    EXPECT_EQ(m.body, body);
  }
}

TEST(ControlLaneCodecTest, TheAssemblerRefusesWhatCannotBelong) {
  const std::string two = Body(kLaneChunkBytes + 10);
  const std::vector<std::string> ok = EncodeLaneMessage(3, two);
  ASSERT_EQ(ok.size(), 2u);
  auto refused = [](size_t max, const std::vector<std::string>& packets) {
    LaneAssembler a(max);
    for (const std::string& p : packets) {
      if (!a.Add(p).ok()) return true;
    }
    return false;
  };
  EXPECT_TRUE(refused(100, {"short"}));
  EXPECT_TRUE(refused(100, {Header(2, 1, 0)}));                                       // a reserved flag
  EXPECT_TRUE(refused(100, {std::string("\0\1\1\0\0\0\0\0", 8)}));                    // a reserved byte
  EXPECT_TRUE(refused(two.size() - 1, ok));                                           // above the bound
  EXPECT_TRUE(refused(two.size(), {ok[0], Header(0, 4, two.size()) + "x"}));          // another tag
  EXPECT_TRUE(refused(two.size() + 1, {ok[0], Header(0, 3, two.size() + 1) + "x"}));  // another total
  EXPECT_TRUE(refused(100, {Header(0, 1, 3) + "abcd"}));                              // more than the total
  EXPECT_TRUE(refused(100, {Header(0, 1, 3) + "ab"}));                                // short of it
  EXPECT_TRUE(refused(100, {Header(1, 1, 3), Header(0, 1, 3) + "abc"}));              // empty, "more"
  EXPECT_TRUE(refused(100, {Header(0, 1, 1) + "a", Header(0, 1, 1) + "a"}));          // after the last
  EXPECT_FALSE(refused(two.size(), ok));
}

TEST(ControlLaneCodecTest, MessagesCrossASocketAndDescriptorsAreRefused) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  // A large message: written by a thread, since it does not fit the socket's buffer at once.
  const std::string big = Body(1u << 20);
  std::thread writer([&] { EXPECT_TRUE(SendLaneMessage(a.get(), 9, big).ok()); });
  auto got = RecvLaneMessage(b.get(), 1u << 20);
  writer.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->tag, 9);
  EXPECT_EQ(got->body, big);
  // The bound is the receiver's: one byte over is refused.
  std::thread writer2([&] { (void)SendLaneMessage(a.get(), 9, big); });
  EXPECT_EQ(RecvLaneMessage(b.get(), big.size() - 1).status().code(), absl::StatusCode::kInvalidArgument);
  ::shutdown(b.get(), SHUT_RDWR);  // the writer's remaining packets go nowhere
  writer2.join();
  // A packet carrying a descriptor is refused, and the descriptor does not leak into the receiver.
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd c(sv[0]), d(sv[1]);
  ASSERT_TRUE(SendPacket(c.get(), EncodeLaneMessage(1, "x")[0], c.get()).ok());
  EXPECT_EQ(RecvLaneMessage(d.get(), 100).status().code(), absl::StatusCode::kInvalidArgument);
  // A closed peer reads as Unavailable.
  c.Reset();
  EXPECT_EQ(RecvLaneMessage(d.get(), 100).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace hisparse
