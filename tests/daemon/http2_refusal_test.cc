// Http2Refusal (issue 39, item 6): the bytes that answer a refused gRPC client's first call. The
// integration test (hardening_conn_test) shows a real gRPC client reading them.
#include "hisparse/daemon/http2_refusal.h"

#include <string>

#include "gtest/gtest.h"

namespace hisparse {
namespace http2_refusal_test {

std::string FrameHeader(uint32_t length, uint8_t type, uint8_t flags, uint32_t stream) {
  std::string h;
  h.push_back(static_cast<char>(length >> 16));
  h.push_back(static_cast<char>(length >> 8));
  h.push_back(static_cast<char>(length));
  h.push_back(static_cast<char>(type));
  h.push_back(static_cast<char>(flags));
  for (int shift = 24; shift >= 0; shift -= 8) h.push_back(static_cast<char>(stream >> shift));
  return h;
}

// What a gRPC client sends first: the preface, its SETTINGS, a WINDOW_UPDATE, then HEADERS of
// stream 1 (the header block is never decoded: any bytes do).
std::string ClientOpening() {
  std::string c("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24);
  c += FrameHeader(6, 0x4, 0, 0) + std::string("\0\x04\0\x40\0\0", 6);
  c += FrameHeader(4, 0x8, 0, 0) + std::string("\0\x3f\0\x01", 4);
  c += FrameHeader(5, 0x1, 0x4, 1) + "abcde";
  return c;
}

TEST(Http2RefusalTest, AnswersTheFirstCallResourceExhaustedThenGoesAway) {
  EXPECT_EQ(Http2Refusal::ServerPreface(), FrameHeader(0, 0x4, 0, 0));  // an empty SETTINGS frame
  Http2Refusal refusal("uid 7 holds 3 control connections");
  // Byte by byte: frames are answered only once whole.
  std::string out;
  const std::string in = ClientOpening();
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_FALSE(refusal.answered()) << i;
    out += refusal.Feed(in.substr(i, 1));
  }
  EXPECT_TRUE(refusal.answered());
  EXPECT_FALSE(refusal.failed());
  const std::string ack = FrameHeader(0, 0x4, 0x1, 0);
  const std::string headers = Http2Refusal::TrailersOnly(1, "uid 7 holds 3 control connections");
  const std::string goaway = Http2Refusal::Goaway(1, "uid 7 holds 3 control connections");
  EXPECT_EQ(out, ack + headers + goaway);
  EXPECT_EQ(refusal.Feed(FrameHeader(5, 0x1, 0x4, 3) + "abcde"), "") << "answered once only";

  // HEADERS of stream 1, END_STREAM | END_HEADERS: :status 200, then the gRPC trailers as literals.
  EXPECT_EQ(headers.substr(0, 9), FrameHeader(static_cast<uint32_t>(headers.size() - 9), 0x1, 0x5, 1));
  EXPECT_EQ(static_cast<unsigned char>(headers[9]), 0x88);
  EXPECT_NE(headers.find(std::string("\x0bgrpc-status\x01", 13) + "8"), std::string::npos);
  EXPECT_NE(headers.find(std::string("\x0cgrpc-message\x21", 14) + "uid 7 holds 3 control connections"),
            std::string::npos);
  // GOAWAY: last stream 1, ENHANCE_YOUR_CALM, the reason as debug data.
  EXPECT_EQ(goaway.substr(0, 9), FrameHeader(8 + 33, 0x7, 0, 0));
  EXPECT_EQ(goaway.substr(9, 8), std::string("\0\0\0\x01\0\0\0\x0b", 8));
  EXPECT_EQ(goaway.substr(17), "uid 7 holds 3 control connections");
}

TEST(Http2RefusalTest, EncodesLongAndUnprintableMessages) {
  // grpc-message is percent-encoded; a value of 128 bytes or more takes a multi-byte length.
  const std::string headers = Http2Refusal::TrailersOnly(5, "50% \n");
  EXPECT_NE(headers.find(std::string("\x0cgrpc-message\x09", 14) + "50%25 %0A"), std::string::npos);
  const std::string long_one = Http2Refusal::TrailersOnly(5, std::string(200, 'x'));
  EXPECT_NE(long_one.find(std::string("\x0cgrpc-message\x7f\x49", 15) + std::string(200, 'x')), std::string::npos);
  EXPECT_EQ(Http2Refusal::TrailersOnly(5, std::string(5000, 'x')).size(),
            Http2Refusal::TrailersOnly(5, std::string(1024, 'x')).size());  // cut at 1 KiB
}

TEST(Http2RefusalTest, GivesUpOnWhatIsNotHttp2) {
  Http2Refusal garbage("no");
  EXPECT_EQ(garbage.Feed("GET / HTTP/1.1\r\n\r\n"), "");
  EXPECT_TRUE(garbage.failed());
  Http2Refusal huge("no");
  EXPECT_EQ(huge.Feed(std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24) + FrameHeader(1 << 20, 0x0, 0, 1)), "");
  EXPECT_TRUE(huge.failed());
  EXPECT_FALSE(huge.answered());
}

}  // namespace http2_refusal_test
}  // namespace hisparse
