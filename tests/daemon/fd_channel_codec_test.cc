// The fd channel's codec (hisparse/common/fd_channel_codec.h): the exact bytes of today's HSFD1 and
// HSFD2 requests and replies, round trips of every form, and every malformed form refused with
// InvalidArgument.
#include "hisparse/common/fd_channel_codec.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace hisparse {
namespace fd_channel_codec_test {

std::string Handle() {
  std::string h(kCudaIpcHandleBytes, '\0');
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<char>(i * 7 + 3);
  return h;
}

TEST(FdChannelCodecTest, RequestsAreTodaysBytes) {
  EXPECT_EQ(EncodeFdRequest({FdVersion::kV2, 42, "ab12", FdArena{}}), "HSFD2 42 ab12 arena");
  EXPECT_EQ(EncodeFdRequest({FdVersion::kV1, 7, "t", FdSlab{3}}), "HSFD1 7 t slab 3");
  EXPECT_EQ(EncodeFdRequest({FdVersion::kV2, 18446744073709551615ull, "x", FdSlab{18446744073709551615ull}}),
            "HSFD2 18446744073709551615 x slab 18446744073709551615");
}

TEST(FdChannelCodecTest, RequestsDecode) {
  auto r = DecodeFdRequest("HSFD1 9 tok slab 12");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (FdRequest{FdVersion::kV1, 9, "tok", FdSlab{12}}));
  r = DecodeFdRequest("HSFD2 1 tok arena");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (FdRequest{FdVersion::kV2, 1, "tok", FdArena{}}));
  // An empty token is a request (its session lookup fails), as it always was.
  r = DecodeFdRequest("HSFD2 1  arena");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->token, "");
}

TEST(FdChannelCodecTest, RequestsRoundTrip) {
  const std::vector<FdRequest> all = {{FdVersion::kV1, 0, "", FdArena{}},
                                      {FdVersion::kV2, 5, "deadbeef", FdSlab{0}},
                                      {FdVersion::kV1, 123456789012345ull, "t-_/", FdSlab{99}},
                                      {FdVersion::kV2, 18446744073709551615ull, "z", FdArena{}}};
  for (const FdRequest& r : all) {
    auto back = DecodeFdRequest(EncodeFdRequest(r));
    ASSERT_TRUE(back.ok()) << EncodeFdRequest(r) << ": " << back.status();
    EXPECT_EQ(*back, r) << EncodeFdRequest(r);
  }
}

TEST(FdChannelCodecTest, MalformedRequestsAreInvalidArgument) {
  const char* const bad[] = {
      "",
      "hello",
      "HSFD3 1 t arena",
      "hsfd2 1 t arena",
      "HSFD2",
      "HSFD2 1 t",
      "HSFD2 1",
      "HSFD2  1 t arena",  // empty id
      "HSFD2 -1 t arena",
      "HSFD2 +1 t arena",
      "HSFD2 1x t arena",
      "HSFD2 18446744073709551616 t arena",  // one past uint64
      "HSFD2 1 t arenas",
      "HSFD2 1 t Arena",
      "HSFD2 1 t arena ",
      "HSFD2 1 t slab",
      "HSFD2 1 t slab ",
      "HSFD2 1 t slab -1",
      "HSFD2 1 t slab 18446744073709551616",  // one past uint64
      "HSFD2 1 t segment 1",                  // the segmented pool's object is gone
      "HSFD2 1 t slab 1 2",
      "HSFD2 1 t slab  1",
      "HSFD2 1 t slab 0x1",
  };
  for (const char* packet : bad) {
    auto r = DecodeFdRequest(packet);
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << "\"" << packet << "\": " << r.status();
    EXPECT_FALSE(r.status().message().empty()) << packet;
  }
  // A NUL inside the object is not "arena".
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeFdRequest(std::string("HSFD2 1 t arena\0", 16)).status()));
  EXPECT_EQ(DecodeFdRequest("HSFD9 1 t arena").status().message(),
            "malformed request: want \"HSFD2 <session_id> <token> <object>\"");
  EXPECT_EQ(DecodeFdRequest("HSFD2 1 t disk").status().message(),
            "unknown fd object \"disk\" (want \"arena\" or \"slab N\")");
  EXPECT_EQ(DecodeFdRequest("HSFD2 1 t slab x").status().message(), "bad slab number in \"slab x\"");
}

TEST(FdChannelCodecTest, RepliesAreTodaysBytes) {
  EXPECT_EQ(EncodeFdReply(FdOk{4096, FdForm::kFd, ""}, FdVersion::kV2), "OK fd 4096");
  EXPECT_EQ(EncodeFdReply(FdOk{4096, FdForm::kFd, ""}, FdVersion::kV1), "OK 4096");
  EXPECT_EQ(EncodeFdReply(FdOk{2097152, FdForm::kCudaIpc, Handle()}, FdVersion::kV2),
            "OK cuda-ipc 2097152 "
            "030a11181f262d343b424950575e656c737a81888f969da4abb2b9c0c7ced5dc"
            "e3eaf1f8ff060d141b222930373e454c535a61686f767d848b9299a0a7aeb5bc");
  EXPECT_EQ(EncodeFdReply(FdErr{absl::StatusCode::kResourceExhausted, "uid 5 holds 2"}, FdVersion::kV2),
            "ERR RESOURCE_EXHAUSTED uid 5 holds 2");
  EXPECT_EQ(EncodeFdReply(FdErr{absl::StatusCode::kNotFound, ""}, FdVersion::kV1), "ERR NOT_FOUND ");
  // A cudaIpc grant cannot be said in version 1.
  EXPECT_EQ(EncodeFdReply(FdOk{1, FdForm::kCudaIpc, Handle()}, FdVersion::kV1).rfind("ERR FAILED_PRECONDITION ", 0),
            0u);
}

TEST(FdChannelCodecTest, RepliesRoundTrip) {
  const std::vector<FdReply> all = {FdOk{0, FdForm::kFd, ""},
                                    FdOk{18446744073709551615ull, FdForm::kFd, ""},
                                    FdOk{2097152, FdForm::kCudaIpc, Handle()},
                                    FdOk{1, FdForm::kCudaIpc, std::string(kCudaIpcHandleBytes, '\0')},
                                    FdErr{absl::StatusCode::kPermissionDenied, "session 3 belongs to uid 1, not 2"},
                                    FdErr{absl::StatusCode::kUnauthenticated, ""},
                                    FdErr{absl::StatusCode::kCancelled, "  spaced  "}};
  for (const FdReply& r : all) {
    for (FdVersion v : {FdVersion::kV1, FdVersion::kV2}) {
      const auto* ok = std::get_if<FdOk>(&r);
      if (ok != nullptr && ok->form == FdForm::kCudaIpc && v == FdVersion::kV1) continue;
      const std::string bytes = EncodeFdReply(r, v);
      auto back = DecodeFdReply(bytes, ok != nullptr && ok->form == FdForm::kFd);
      ASSERT_TRUE(back.ok()) << bytes << ": " << back.status();
      EXPECT_EQ(*back, r) << bytes;
    }
  }
}

TEST(FdChannelCodecTest, ErrorRepliesKeepTheDaemonsCode) {
  auto r = DecodeFdReply("ERR RESOURCE_EXHAUSTED over the cap", false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(absl::IsResourceExhausted(FdReplyStatus(*r)));
  EXPECT_EQ(FdReplyStatus(*r).message(), "over the cap");
  r = DecodeFdReply("ERR NOT_FOUND", false);  // no message at all
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(absl::IsNotFound(FdReplyStatus(*r)));
  EXPECT_TRUE(FdReplyStatus(FdOk{}).ok());
}

TEST(FdChannelCodecTest, MalformedRepliesAreInvalidArgument) {
  const std::string hex(128, 'a');
  struct Case {
    std::string packet;
    bool has_fd;
  };
  const std::vector<Case> bad = {
      {"", false},
      {"OK", true},
      {"OK ", true},
      {"OK fd", true},
      {"OK fd ", true},
      {"OK fd 12", false},  // an fd grant without the fd
      {"OK 12", false},
      {"OK fd -1", true},
      {"OK fd 12 ", true},
      {"OK fd 18446744073709551616", true},
      {"OK fd x", true},
      {"ok fd 1", true},
      {"OK cuda-ipc 12 " + hex, true},  // a cudaIpc grant with a descriptor
      {"OK cuda-ipc 12", false},
      {"OK cuda-ipc 12 " + hex.substr(1), false},
      {"OK cuda-ipc 12 " + hex + "a", false},
      {"OK cuda-ipc 12 " + std::string(128, 'A'), false},  // upper case, as no daemon sends
      {"OK cuda-ipc 12 " + std::string(127, 'a') + "g", false},
      {"OK cuda-ipc x " + hex, false},
      {"OK cuda-ipc 12 " + hex + " ", false},
      {"OK cuda-ipc 12  " + hex, false},
      {"ERR", false},
      {"ERR ", false},
      {"ERR OK fine", false},
      {"ERR NOPE message", false},
      {"ERR not_found message", false},
      {"ERR NOT_FOUND gone", true},  // an error with a descriptor
      {"HELLO", false},
  };
  for (const Case& c : bad) {
    auto r = DecodeFdReply(c.packet, c.has_fd);
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << "\"" << c.packet << "\" fd=" << c.has_fd << ": " << r.status();
    EXPECT_FALSE(r.status().message().empty()) << c.packet;
  }
}

}  // namespace fd_channel_codec_test
}  // namespace hisparse
