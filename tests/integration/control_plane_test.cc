// The control plane against a real hisparsed: sessions, admission, release, stats, errors,
// health and reflection.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <thread>

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "gtest/gtest.h"
#include "test_support.h"

namespace hisparse::testing {
namespace control_plane_test {

class ControlPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = StartDaemon();
    ASSERT_NE(daemon_, nullptr);
    address_ = daemon_->address();
  }
  Session Open(hs_session_options o) {
    Session s;
    Error e = Session::Open(o, &s);
    EXPECT_TRUE(e.ok()) << e.message;
    return s;
  }
  std::unique_ptr<DaemonProcess> daemon_;
  std::string address_;
};

TEST_F(ControlPlaneTest, AdmitWriteReadReleaseAndStatsMatch) {
  Session s = Open(SmallGeometry(address_));
  hs_request_info info = HS_REQUEST_INFO_INIT;
  ASSERT_TRUE(s.Admit(7, 100, 1000, &info).ok());
  EXPECT_EQ(info.capacity_tokens, 1000u);
  // Write every record of every layer through the mapping, then read them all back.
  for (uint32_t l = 0; l < 4; ++l) {
    for (uint32_t p = 0; p < 1000; ++p) {
      void* rec = nullptr;
      ASSERT_TRUE(s.RecordPtr(7, l, p, &rec).ok());
      std::memset(rec, static_cast<int>((l * 31 + p) & 0xff), 64);
    }
  }
  for (uint32_t l = 0; l < 4; ++l) {
    for (uint32_t p = 0; p < 1000; ++p) {
      void* rec = nullptr;
      ASSERT_TRUE(s.RecordPtr(7, l, p, &rec).ok());
      const uint8_t want = static_cast<uint8_t>((l * 31 + p) & 0xff);
      for (int i = 0; i < 64; ++i) ASSERT_EQ(static_cast<uint8_t*>(rec)[i], want);
    }
  }
  v1::StatsResponse st = Stats(address_);
  EXPECT_EQ(st.sessions(), 1u);
  EXPECT_EQ(st.requests(), 1u);
  EXPECT_EQ(st.host_pool().used_bytes(), 4u * 16 * 4096);  // 64000 B a layer, in 16 pages of 4 KiB
  EXPECT_EQ(st.host_pool().capacity_bytes(), 64u << 20);
  EXPECT_EQ(st.host_pool().used_bytes() + st.host_pool().free_bytes(), st.host_pool().capacity_bytes());
  ASSERT_TRUE(s.Release(7).ok());
  st = Stats(address_);
  EXPECT_EQ(st.requests(), 0u);
  EXPECT_EQ(st.host_pool().used_bytes(), 0u);
}

TEST_F(ControlPlaneTest, SessionInfoReportsTheArenaKindAndServesOlderStructs) {
  Session s = Open(SmallGeometry(address_));
  hs_session_info info = HS_SESSION_INFO_INIT;
  ASSERT_EQ(hs_session_get_info(s.get(), &info), HS_OK) << hs_last_error();
  EXPECT_EQ(info.arena_kind, HS_ARENA_HOST);
  EXPECT_EQ(info.struct_size, sizeof(hs_session_info));
  v1::StatsResponse st = Stats(address_);
  ASSERT_EQ(st.session_stats_size(), 1);
  EXPECT_EQ(st.session_stats(0).arena_kind(), "host");
  // A caller built before arena_kind existed passes the older size: it gets what it knows of, and
  // nothing past its struct is written.
  hs_session_info old;
  std::memset(&old, 0xab, sizeof(old));
  old.struct_size = offsetof(hs_session_info, arena_kind);
  ASSERT_EQ(hs_session_get_info(s.get(), &old), HS_OK) << hs_last_error();
  EXPECT_EQ(old.session_id, info.session_id);
  EXPECT_EQ(old.arena_bytes, info.arena_bytes);
  uint32_t untouched = 0;  // read as bytes: 0xabababab is no hs_arena_kind value
  std::memcpy(&untouched, reinterpret_cast<const unsigned char*>(&old) + offsetof(hs_session_info, arena_kind),
              sizeof(untouched));
  EXPECT_EQ(untouched, 0xababababu);
  hs_session_info tiny = HS_SESSION_INFO_INIT;
  tiny.struct_size = 8;
  EXPECT_EQ(hs_session_get_info(s.get(), &tiny), HS_ERR_INVALID_ARGUMENT);
}

TEST_F(ControlPlaneTest, RecordsOfOneLayerAreContiguous) {
  Session s = Open(SmallGeometry(address_));
  ASSERT_TRUE(s.Admit(1, 10, 500).ok());
  void* first = nullptr;
  void* last = nullptr;
  ASSERT_TRUE(s.RecordPtr(1, 2, 0, &first).ok());
  ASSERT_TRUE(s.RecordPtr(1, 2, 499, &last).ok());
  EXPECT_EQ(static_cast<uint8_t*>(last) - static_cast<uint8_t*>(first), 499 * 64);
}

// Extend appends pages and never moves a record; the grown layers span several 4 KiB pages, which
// the data path reads through the request's page tables.
TEST_F(ControlPlaneTest, ExtendGrowsAndKeepsRecords) {
  Session s = Open(SmallGeometry(address_));
  ASSERT_TRUE(s.Admit(1, 10, 100).ok());
  ASSERT_TRUE(s.Admit(2, 10, 100).ok());
  for (uint32_t l = 0; l < 4; ++l) {
    void* rec = nullptr;
    ASSERT_TRUE(s.RecordPtr(1, l, 99, &rec).ok());
    std::memset(rec, 0x5A + l, 64);
  }
  hs_request_info info = HS_REQUEST_INFO_INIT;
  ASSERT_TRUE(s.Extend(1, 5000, &info).ok());
  EXPECT_EQ(info.capacity_tokens, 5000u);
  for (uint32_t l = 0; l < 4; ++l) {
    void* rec = nullptr;
    ASSERT_TRUE(s.RecordPtr(1, l, 99, &rec).ok());
    EXPECT_EQ(static_cast<uint8_t*>(rec)[0], 0x5A + l) << "layer " << l << " lost its records when extended";
    ASSERT_TRUE(s.RecordPtr(1, l, 4999, &rec).ok());
  }
  EXPECT_EQ(s.Extend(1, 10).code, HS_ERR_INVALID_ARGUMENT);  // not larger
  EXPECT_EQ(s.Extend(99, 6000).code, HS_ERR_NOT_FOUND);
  ASSERT_TRUE(s.Release(1).ok());
  ASSERT_TRUE(s.Release(2).ok());
  EXPECT_EQ(Stats(address_).host_pool().used_bytes(), 0u);
}

TEST_F(ControlPlaneTest, FullPoolAnswersResourceExhaustedAndStaysConsistent) {
  hs_session_options o = SmallGeometry(address_);
  o.max_requests = 64;
  Session s = Open(o);
  // Each request: 4 layers x 16000 x 64 B = 4 layers x 250 pages of 4 KiB.
  int admitted = 0;
  Error last;
  for (uint64_t id = 1; id <= 64; ++id) {
    last = s.Admit(id, 10, 16000);
    if (!last.ok()) break;
    ++admitted;
  }
  EXPECT_EQ(last.code, HS_ERR_RESOURCE_EXHAUSTED) << last.message;
  EXPECT_GT(admitted, 0);
  v1::StatsResponse st = Stats(address_);
  EXPECT_EQ(st.requests(), static_cast<uint32_t>(admitted));
  EXPECT_EQ(st.host_pool().used_bytes(), uint64_t(admitted) * 4 * 16000 * 64);
  EXPECT_GE(st.rejections(), 1u);
  // Releasing one makes room for exactly that again.
  ASSERT_TRUE(s.Release(1).ok());
  EXPECT_TRUE(s.Admit(1000, 10, 16000).ok());
}

TEST_F(ControlPlaneTest, MalformedRequestsGetClearErrorsAndTheDaemonKeepsServing) {
  Session s = Open(SmallGeometry(address_));
  EXPECT_EQ(s.Release(12345).code, HS_ERR_NOT_FOUND);
  Error e = s.Admit(1, 0, 0);
  EXPECT_EQ(e.code, HS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(e.message.find("token_budget"), std::string::npos) << e.message;
  EXPECT_EQ(s.Admit(1, 10, 2000000000).code, HS_ERR_INVALID_ARGUMENT);  // absurd size
  EXPECT_EQ(s.Admit(1, 200, 100).code, HS_ERR_INVALID_ARGUMENT);        // context > budget
  EXPECT_EQ(s.Admit(0, 1, 10).code, HS_ERR_INVALID_ARGUMENT);           // id 0
  ASSERT_TRUE(s.Admit(1, 1, 10).ok());
  EXPECT_EQ(s.Admit(1, 1, 10).code, HS_ERR_ALREADY_EXISTS);
  void* rec = nullptr;
  EXPECT_EQ(s.RecordPtr(1, 4, 0, &rec).code, HS_ERR_INVALID_ARGUMENT);   // layer out of range
  EXPECT_EQ(s.RecordPtr(1, 0, 10, &rec).code, HS_ERR_INVALID_ARGUMENT);  // beyond capacity

  // Bad geometry is refused at open, naming the field.
  for (auto mutate : std::vector<void (*)(hs_session_options&)>{[](hs_session_options& o) { o.num_layers = 0; },
                                                                [](hs_session_options& o) { o.record_bytes = 17; },
                                                                [](hs_session_options& o) { o.k = 32; },  // k > B
                                                                [](hs_session_options& o) { o.max_requests = 0; }}) {
    hs_session_options o = SmallGeometry(address_);
    mutate(o);
    Session bad;
    Error err = Session::Open(o, &bad);
    EXPECT_EQ(err.code, HS_ERR_INVALID_ARGUMENT) << err.message;
    EXPECT_NE(err.message.find("geometry."), std::string::npos) << err.message;
  }

  // Another session cannot release (or even see) this session's request.
  Session other = Open(SmallGeometry(address_));
  EXPECT_EQ(other.Release(1).code, HS_ERR_NOT_FOUND);
  // A forged token is refused.
  auto stub = RawStub(address_);
  grpc::ClientContext ctx;
  v1::ReleaseRequest req;
  hs_session_info info;
  s.Info(&info);
  req.mutable_session()->set_session_id(info.session_id);
  req.mutable_session()->set_token("0000");
  req.set_request_id(1);
  v1::ReleaseResponse resp;
  EXPECT_EQ(stub->Release(&ctx, req, &resp).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // Still serving, and nothing was lost.
  v1::StatsResponse st = Stats(address_);
  EXPECT_EQ(st.sessions(), 2u);
  EXPECT_EQ(st.requests(), 1u);
}

TEST_F(ControlPlaneTest, SessionStreamMustOpenFirst) {
  auto stub = RawStub(address_);
  grpc::ClientContext ctx;
  auto stream = stub->Session(&ctx);
  v1::SessionRequest close;
  close.mutable_close();
  ASSERT_TRUE(stream->Write(close));
  stream->WritesDone();
  v1::SessionEvent ev;
  EXPECT_FALSE(stream->Read(&ev));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// Shared indexers are declared with the geometry; the daemon validates them itself (a client that
// skips the library's check gets the same answer) and names the entry at fault.
TEST_F(ControlPlaneTest, DaemonValidatesLayerAnchors) {
  auto open_with = [&](const std::vector<int32_t>& anchors, grpc::Status* status) {
    auto stub = RawStub(address_);
    grpc::ClientContext ctx;
    auto stream = stub->Session(&ctx);
    v1::SessionRequest open;
    v1::Geometry* g = open.mutable_open()->mutable_geometry();
    g->set_gpu(-1);
    g->set_num_layers(4);
    g->set_record_bytes(64);
    g->set_k(4);
    g->set_slots(8);
    g->set_max_requests(2);
    for (int32_t a : anchors) g->add_layer_anchor(a);
    EXPECT_TRUE(stream->Write(open));
    v1::SessionEvent ev;
    const bool opened = stream->Read(&ev) && ev.kind_case() == v1::SessionEvent::kOpened;
    stream->WritesDone();
    if (opened) ctx.TryCancel();
    *status = stream->Finish();
    return opened;
  };
  grpc::Status st;
  EXPECT_TRUE(open_with({0, 0, 2, 2}, &st));
  EXPECT_TRUE(open_with({}, &st));
  struct Bad {
    std::vector<int32_t> anchors;
    const char* says;
  };
  for (const Bad& b : {Bad{{0, 0, 1, 1}, "is not its own anchor"}, Bad{{0, 2, 2, 2}, "layer_anchor[1] must be in 0..1"},
                       Bad{{0, 0, 0}, "one entry per layer"}, Bad{{-1, 0, 0, 0}, "layer_anchor[0]"}}) {
    EXPECT_FALSE(open_with(b.anchors, &st));
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_NE(st.error_message().find(b.says), std::string::npos) << st.error_message();
  }
  // The two sessions that opened ended with their streams (asynchronously), the refused never began.
  WaitUntil([&] { return Stats(address_).sessions() == 0; });
  EXPECT_EQ(Stats(address_).sessions(), 0u);
}

TEST_F(ControlPlaneTest, ClosingASessionReleasesEverything) {
  {
    Session s = Open(SmallGeometry(address_));
    ASSERT_TRUE(s.Admit(1, 1, 1000).ok());
    ASSERT_TRUE(s.Admit(2, 1, 1000).ok());
    EXPECT_EQ(Stats(address_).requests(), 2u);
  }
  // The close is a stream end the daemon processes asynchronously: wait for it (bounded).
  v1::StatsResponse st;
  WaitUntil([&] {
    st = Stats(address_);
    return st.sessions() == 0;
  });
  EXPECT_EQ(st.sessions(), 0u);
  EXPECT_EQ(st.host_pool().used_bytes(), 0u);
}

TEST_F(ControlPlaneTest, HealthServesOverTheSocket) {
  auto health = grpc::health::v1::Health::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  for (const char* service : {"", "hisparse.v1.HiSparse"}) {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    ASSERT_TRUE(health->Check(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING) << service;
  }
}

TEST_F(ControlPlaneTest, ReflectionListsTheService) {
  auto refl = grpc::reflection::v1alpha::ServerReflection::NewStub(
      grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto stream = refl->ServerReflectionInfo(&ctx);
  grpc::reflection::v1alpha::ServerReflectionRequest req;
  req.set_list_services("");
  ASSERT_TRUE(stream->Write(req));
  grpc::reflection::v1alpha::ServerReflectionResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  stream->WritesDone();
  std::vector<std::string> names;
  for (const auto& s : resp.list_services_response().service()) names.push_back(s.name());
  EXPECT_NE(std::find(names.begin(), names.end(), "hisparse.v1.HiSparse"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "grpc.health.v1.Health"), names.end());
  (void)stream->Finish();
}

}  // namespace control_plane_test
}  // namespace hisparse::testing
