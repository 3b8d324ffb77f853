// The control lane (hisparse/common/control_lane.h; daemon/control_lanes.*): a session's lifecycle
// calls on a connection of its own to the fd socket, against a real hisparsed. Raw sockets here
// play both a well-behaved client and a hostile one; the client library's own use of the lane is
// checked through hs_session_info.control_lane and its answers against gRPC's.
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "hisparse/common/control_lane.h"
#include "hisparse/common/fd_channel_codec.h"
#include "hisparse/common/unix_socket.h"
#include "test_support.h"

namespace hisparse::testing {
namespace {

// A session opened over a raw gRPC stream: its id, token and fd socket, for as long as it lives.
struct RawSession {
  explicit RawSession(const std::string& address) : stub(RawStub(address)) {
    stream = stub->Session(&ctx);
    v1::SessionRequest open;
    v1::Geometry* g = open.mutable_open()->mutable_geometry();
    g->set_gpu(-1);
    g->set_num_layers(2);
    g->set_record_bytes(64);
    g->set_k(1);
    g->set_slots(1);
    g->set_max_requests(64);
    open.mutable_open()->set_engine_name("lane-test");
    EXPECT_TRUE(stream->Write(open));
    v1::SessionEvent opened;
    EXPECT_TRUE(stream->Read(&opened));
    EXPECT_TRUE(opened.has_opened());
    ref.set_session_id(opened.opened().session_id());
    ref.set_token(opened.opened().token());
    fd_socket = opened.opened().fd_socket();
  }
  ~RawSession() { End(); }
  void End() {
    if (ended) return;
    ended = true;
    stream->WritesDone();
    ctx.TryCancel();
    (void)stream->Finish();
  }
  std::unique_ptr<v1::HiSparse::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionEvent>> stream;
  v1::SessionRef ref;
  std::string fd_socket;
  bool ended = false;
};

// A connection to the fd socket that has sent `hello`: the daemon's answer in `answer`.
UniqueFd Hello(const std::string& fd_socket, const std::string& hello, absl::Status* answer) {
  auto conn = ConnectUnixSeqpacket(fd_socket, 10000);
  EXPECT_TRUE(conn.ok()) << conn.status();
  if (!conn.ok()) return UniqueFd();
  EXPECT_TRUE(SendPacket(conn->get(), hello, -1).ok());
  auto reply = RecvPacket(conn->get(), 1024);
  *answer = reply.ok() ? DecodeLaneHelloReply(reply->payload) : reply.status();
  return std::move(*conn);
}

UniqueFd OpenLane(const RawSession& s) {
  absl::Status answer;
  UniqueFd lane = Hello(s.fd_socket, EncodeLaneHello({s.ref.session_id(), s.ref.token()}), &answer);
  EXPECT_TRUE(answer.ok()) << answer;
  return lane;
}

// One exchange on a lane: the reply's status, and its response parsed into `resp` when OK.
template <typename Req, typename Resp>
absl::Status Exchange(int lane, LaneVerb verb, const Req& req, Resp* resp) {
  if (absl::Status st = SendLaneMessage(lane, static_cast<uint8_t>(verb), req.SerializeAsString()); !st.ok()) return st;
  absl::StatusOr<LaneMessage> reply = RecvLaneMessage(lane, kLaneMaxReplyBytes);
  if (!reply.ok()) return reply.status();
  if (reply->tag != 0) return absl::Status(static_cast<absl::StatusCode>(reply->tag), reply->body);
  return resp->ParseFromString(reply->body) ? absl::OkStatus() : absl::InternalError("reply does not parse");
}

v1::AdmitRequest AdmitOf(const v1::SessionRef& ref, uint64_t id, uint32_t tokens) {
  v1::AdmitRequest req;
  *req.mutable_session() = ref;
  req.set_request_id(id);
  req.set_context_tokens(tokens);
  req.set_token_budget(tokens);
  return req;
}

// Whether the lane's peer (the daemon) has closed it: a read that ends rather than waits.
bool ClosedByDaemon(int lane) {
  char b;
  const ssize_t n = ::recv(lane, &b, 1, 0);  // SO_RCVTIMEO bounds the wait
  return n == 0;
}

TEST(ControlLaneTest, AdmitsExtendsAndReleasesAsGrpcDoes) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  RawSession s(daemon->address());
  UniqueFd lane = OpenLane(s);
  ASSERT_TRUE(lane.valid());

  v1::AdmitResponse admitted;
  ASSERT_TRUE(Exchange(lane.get(), LaneVerb::kAdmit, AdmitOf(s.ref, 7, 100), &admitted).ok());
  EXPECT_GE(admitted.capacity_tokens(), 100u);
  EXPECT_EQ(admitted.layers_size(), 2);
  EXPECT_EQ(Stats(daemon->address()).requests(), 1u);
  // The daemon's refusals come back with their codes, as over gRPC.
  v1::AdmitResponse again;
  EXPECT_EQ(Exchange(lane.get(), LaneVerb::kAdmit, AdmitOf(s.ref, 7, 100), &again).code(),
            absl::StatusCode::kAlreadyExists);
  v1::ExtendRequest extend;
  *extend.mutable_session() = s.ref;
  extend.set_request_id(7);
  extend.set_token_budget(5000);
  v1::ExtendResponse extended;
  ASSERT_TRUE(Exchange(lane.get(), LaneVerb::kExtend, extend, &extended).ok());
  EXPECT_GE(extended.capacity_tokens(), 5000u);
  v1::ReleaseRequest release;
  *release.mutable_session() = s.ref;
  release.set_request_id(7);
  v1::ReleaseResponse released;
  ASSERT_TRUE(Exchange(lane.get(), LaneVerb::kRelease, release, &released).ok());
  EXPECT_EQ(Exchange(lane.get(), LaneVerb::kRelease, release, &released).code(), absl::StatusCode::kNotFound);
  const v1::StatsResponse after = Stats(daemon->address());
  EXPECT_EQ(after.requests(), 0u);
  EXPECT_EQ(after.host_pool().used_bytes(), 0u);
}

TEST(ControlLaneTest, ARepliesLargerThanAPacketArriveWhole) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  RawSession s(daemon->address());
  UniqueFd lane = OpenLane(s);
  ASSERT_TRUE(lane.valid());
  // 16 requests of 2 layers x 256 pages of 4 KiB (16384 records of 64 B): 8192 pages listed, a
  // reply several packets long.
  v1::AdmitBatchRequest batch;
  *batch.mutable_session() = s.ref;
  batch.set_mode(v1::BATCH_MODE_ALL_OR_NOTHING);
  for (uint64_t id = 1; id <= 16; ++id) {
    v1::AdmitItem* item = batch.add_items();
    item->set_request_id(id);
    item->set_context_tokens(16384);
    item->set_token_budget(16384);
  }
  v1::AdmitBatchResponse resp;
  const absl::Status st = Exchange(lane.get(), LaneVerb::kAdmitBatch, batch, &resp);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_GT(resp.ByteSizeLong(), 2 * kLaneChunkBytes);
  ASSERT_EQ(resp.results_size(), 16);
  for (const auto& r : resp.results()) EXPECT_TRUE(r.has_admitted()) << r.error().message();
  EXPECT_EQ(resp.admitted(), 16u);
  EXPECT_EQ(Stats(daemon->address()).requests(), 16u);
}

TEST(ControlLaneTest, AHelloIsCheckedAndALaneServesItsSessionAlone) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  RawSession a(daemon->address());
  RawSession b(daemon->address());
  absl::Status answer;
  // A wrong token, a session that does not exist, a hello that does not parse.
  (void)Hello(a.fd_socket, EncodeLaneHello({a.ref.session_id(), "0123abcd"}), &answer);
  EXPECT_EQ(answer.code(), absl::StatusCode::kPermissionDenied) << answer;
  (void)Hello(a.fd_socket, EncodeLaneHello({999999, a.ref.token()}), &answer);
  EXPECT_EQ(answer.code(), absl::StatusCode::kPermissionDenied) << answer;
  (void)Hello(a.fd_socket, "HSLANE1 x y z", &answer);
  EXPECT_EQ(answer.code(), absl::StatusCode::kInvalidArgument) << answer;
  // a's lane cannot act for b, even with b's token.
  UniqueFd lane = OpenLane(a);
  ASSERT_TRUE(lane.valid());
  v1::AdmitResponse resp;
  EXPECT_EQ(Exchange(lane.get(), LaneVerb::kAdmit, AdmitOf(b.ref, 1, 10), &resp).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Stats(daemon->address()).requests(), 0u);
  // An unknown verb is answered, and the lane goes on.
  ASSERT_TRUE(SendLaneMessage(lane.get(), 200, "").ok());
  absl::StatusOr<LaneMessage> unknown = RecvLaneMessage(lane.get(), kLaneMaxReplyBytes);
  ASSERT_TRUE(unknown.ok()) << unknown.status();
  EXPECT_EQ(unknown->tag, static_cast<uint8_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(Exchange(lane.get(), LaneVerb::kAdmit, AdmitOf(a.ref, 1, 10), &resp).ok());
}

TEST(ControlLaneTest, GarbageDropsTheLaneAndNothingElse) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  RawSession s(daemon->address());
  UniqueFd lane = OpenLane(s);
  ASSERT_TRUE(lane.valid());
  v1::AdmitResponse resp;
  ASSERT_TRUE(Exchange(lane.get(), LaneVerb::kAdmit, AdmitOf(s.ref, 1, 10), &resp).ok());
  // A packet with reserved bits set: the daemon drops the lane.
  const std::string garbage = "\xff\x01\x00\x00\x00\x00\x00\x00";
  ASSERT_TRUE(SendPacket(lane.get(), garbage, -1).ok());
  EXPECT_TRUE(ClosedByDaemon(lane.get()));
  // The session and its request are untouched, and a new lane serves it.
  EXPECT_EQ(Stats(daemon->address()).requests(), 1u);
  UniqueFd again = OpenLane(s);
  ASSERT_TRUE(again.valid());
  EXPECT_TRUE(Exchange(again.get(), LaneVerb::kAdmit, AdmitOf(s.ref, 2, 10), &resp).ok());
  // A message that claims more than a request may hold is refused before anything is allocated.
  std::string huge(kLaneHeaderBytes, '\0');
  huge[0] = 1;  // more follow
  huge[1] = static_cast<char>(LaneVerb::kAdmit);
  const uint32_t total = kLaneMaxRequestBytes + 1;
  for (int i = 0; i < 4; ++i) huge[4 + i] = static_cast<char>((total >> (8 * i)) & 0xff);
  ASSERT_TRUE(SendPacket(again.get(), huge + "x", -1).ok());
  EXPECT_TRUE(ClosedByDaemon(again.get()));
  EXPECT_EQ(Stats(daemon->address()).requests(), 2u);
}

TEST(ControlLaneTest, TheLaneEndsWithItsSessionAndASecondReplacesTheFirst) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  RawSession s(daemon->address());
  UniqueFd first = OpenLane(s);
  UniqueFd second = OpenLane(s);
  ASSERT_TRUE(first.valid() && second.valid());
  EXPECT_TRUE(ClosedByDaemon(first.get()));
  v1::AdmitResponse resp;
  ASSERT_TRUE(Exchange(second.get(), LaneVerb::kAdmit, AdmitOf(s.ref, 1, 10), &resp).ok());
  s.End();
  EXPECT_TRUE(ClosedByDaemon(second.get()));
  EXPECT_TRUE(WaitUntil([&] { return Stats(daemon->address()).sessions() == 0; }));
  // A hello for the ended session is refused.
  absl::Status answer;
  (void)Hello(s.fd_socket, EncodeLaneHello({s.ref.session_id(), s.ref.token()}), &answer);
  EXPECT_EQ(answer.code(), absl::StatusCode::kPermissionDenied) << answer;
}

TEST(ControlLaneTest, AConnectionWithDescriptorsUnreadCannotBecomeALane) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  RawSession s(daemon->address());
  auto conn = ConnectUnixSeqpacket(s.fd_socket, 10000);
  ASSERT_TRUE(conn.ok());
  // The arena's descriptor is sent and left unread in the socket.
  ASSERT_TRUE(
      SendPacket(conn->get(), EncodeFdRequest({FdVersion::kV2, s.ref.session_id(), s.ref.token(), FdArena{}}), -1)
          .ok());
  // The bytes of every packet waiting in this end's receive queue (SIOCINQ sums them all on a
  // SOCK_SEQPACKET socket): a second packet shows as growth, where a peek would see only the first.
  auto queued = [&] {
    int bytes = 0;
    EXPECT_EQ(::ioctl(conn->get(), SIOCINQ, &bytes), 0);
    return bytes;
  };
  ASSERT_TRUE(WaitUntil([&] { return queued() > 0; }));
  const int one_reply = queued();
  // The hello comes while that reply is still unread, and its answer is awaited the same way.
  ASSERT_TRUE(SendPacket(conn->get(), EncodeLaneHello({s.ref.session_id(), s.ref.token()}), -1).ok());
  ASSERT_TRUE(WaitUntil([&] { return queued() > one_reply; }));
  auto fd_reply = RecvPacket(conn->get(), 1024);
  ASSERT_TRUE(fd_reply.ok());
  EXPECT_TRUE(fd_reply->fd.valid());
  auto hello_reply = RecvPacket(conn->get(), 1024);
  ASSERT_TRUE(hello_reply.ok());
  EXPECT_EQ(DecodeLaneHelloReply(hello_reply->payload).code(), absl::StatusCode::kFailedPrecondition)
      << hello_reply->payload;
}

// The client library: its sessions use a lane unless told not to, and answer the same either way.
TEST(ControlLaneTest, TheClientUsesTheLaneAndAnswersAsOverGrpc) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const std::string a = daemon->address();
  for (const bool lane : {true, false}) {
    SCOPED_TRACE(lane ? "lane" : "gRPC");
    if (!lane) ::setenv("HISPARSE_CONTROL_LANE", "0", 1);
    hs_session_options o = SmallGeometry(a);
    Session s;
    ASSERT_FALSE(Session::Open(o, &s));
    hs_session_info info;
    ASSERT_FALSE(s.Info(&info));
    EXPECT_EQ(info.control_lane, lane ? 1u : 0u);
    ASSERT_FALSE(s.Admit(1, 100, 200));
    EXPECT_EQ(s.Admit(1, 100, 200).code, HS_ERR_ALREADY_EXISTS);
    ASSERT_FALSE(s.Extend(1, 400));
    void* p = nullptr;
    ASSERT_FALSE(s.RecordPtr(1, 3, 399, &p));
    ASSERT_NE(p, nullptr);
    ASSERT_FALSE(s.Release(1));
    EXPECT_EQ(s.Release(1).code, HS_ERR_NOT_FOUND);
    s.Close();
    ::unsetenv("HISPARSE_CONTROL_LANE");
  }
  EXPECT_TRUE(WaitUntil([&] { return Stats(a).sessions() == 0; }));
  EXPECT_EQ(Stats(a).host_pool().used_bytes(), 0u);
}

// limits.control_lanes=false: hellos are refused, and the client keeps gRPC without a word to it.
TEST(ControlLaneTest, ADaemonWithLanesOffServesOverGrpc) {
  auto daemon = StartDaemon({"--host-pool-size", "64MiB", "--host-pool-page-size", "4KiB", "--host-pool-slab-size",
                             "4MiB", "--set", "limits.control_lanes=false"});
  ASSERT_NE(daemon, nullptr);
  RawSession raw(daemon->address());
  absl::Status answer;
  (void)Hello(raw.fd_socket, EncodeLaneHello({raw.ref.session_id(), raw.ref.token()}), &answer);
  EXPECT_EQ(answer.code(), absl::StatusCode::kFailedPrecondition) << answer;
  hs_session_options o = SmallGeometry(daemon->address());
  Session s;
  ASSERT_FALSE(Session::Open(o, &s));
  hs_session_info info;
  ASSERT_FALSE(s.Info(&info));
  EXPECT_EQ(info.control_lane, 0u);
  ASSERT_FALSE(s.Admit(1, 100, 200));
  ASSERT_FALSE(s.Release(1));
}

}  // namespace
}  // namespace hisparse::testing
