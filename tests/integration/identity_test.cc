// Identity: every RPC acts as the uid the kernel reports for its connection. A session belongs to
// the uid that opened it (quotas count from its first admission, fd channel or not), its token is
// worth nothing to another uid, and only admins see and act on every tenant's sessions.
//
// Another uid is played by uid 65534 (nobody) through setpriv, against a daemon whose sockets
// belong to group 65534. The stolen-token calls run in this same binary, re-executed as nobody
// (IdentityChild.DISABLED_StolenToken), so that they speak raw gRPC as the client library never
// would.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "test_support.h"

namespace hisparse::testing {
namespace identity_test {

constexpr char kStolenEnv[] = "HISPARSE_STOLEN_SESSION";  // "ADDRESS SESSION_ID TOKEN"

// A session opened over raw gRPC: the Session stream only, no fd-channel fetch ever.
class RawSession {
 public:
  bool Open(const std::string& address) {
    stub_ = RawStub(address);
    stream_ = stub_->Session(&ctx_);
    v1::SessionRequest open;
    v1::Geometry* g = open.mutable_open()->mutable_geometry();
    g->set_gpu(-1);
    g->set_num_layers(4);
    g->set_record_bytes(64);
    g->set_k(8);
    g->set_slots(16);
    g->set_max_requests(8);
    open.mutable_open()->set_engine_name("raw-session");
    v1::SessionEvent opened;
    if (!stream_->Write(open) || !stream_->Read(&opened) || !opened.has_opened()) return false;
    ref_.set_session_id(opened.opened().session_id());
    ref_.set_token(opened.opened().token());
    return true;
  }
  // Admits `request_id` with a budget of `tokens` (4 layers x 64 B each: 256 B a token).
  grpc::Status Admit(uint64_t request_id, uint32_t tokens) {
    grpc::ClientContext ctx;
    v1::AdmitRequest req;
    *req.mutable_session() = ref_;
    req.set_request_id(request_id);
    req.set_token_budget(tokens);
    v1::AdmitResponse resp;
    return stub_->Admit(&ctx, req, &resp);
  }
  grpc::Status Release(uint64_t request_id) {
    grpc::ClientContext ctx;
    v1::ReleaseRequest req;
    *req.mutable_session() = ref_;
    req.set_request_id(request_id);
    v1::ReleaseResponse resp;
    return stub_->Release(&ctx, req, &resp);
  }
  const v1::SessionRef& ref() const { return ref_; }

 private:
  std::unique_ptr<v1::HiSparse::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionEvent>> stream_;
  v1::SessionRef ref_;
};

std::string SelfPath() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  self[n > 0 ? n : 0] = 0;
  return self;
}

// `cmd` run as uid/gid 65534 with no supplementary groups; stdout and stderr are captured.
CommandResult AsNobody(const std::string& cmd, const std::string& env = "") {
  return RunCommand(env + " setpriv --reuid=65534 --regid=65534 --clear-groups sh -c '" + cmd + " 2>&1'");
}

std::string CtlCmd(const std::string& address, const std::string& args) {
  return BinDir() + "/hisparse-ctl --timeout-ms 5000 --daemon " + address + " " + args;
}

// An engine stand-in running as nobody: it holds `n` requests until destroyed (killed).
class NobodyEngine {
 public:
  bool Start(const std::string& address, int n) {
    const std::string client = BinDir() + "/hisparse-test-client";
    const std::string count = std::to_string(n);
    int out[2];
    if (::pipe(out) != 0) return false;
    pid_ = ::fork();
    if (pid_ == 0) {  // only async-signal-safe calls until exec
      ::dup2(out[1], 1);
      ::close(out[0]);
      ::execl("/usr/bin/setpriv", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", client.c_str(),
              address.c_str(), "hold", count.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(out[1]);
    FILE* f = ::fdopen(out[0], "r");
    if (pid_ < 0 || f == nullptr) return false;
    char line[128] = {};
    unsigned long sid = 0;
    const bool ready = std::fgets(line, sizeof(line), f) != nullptr && std::sscanf(line, "READY %lu", &sid) == 1;
    std::fclose(f);
    session_id_ = sid;
    return ready;
  }
  ~NobodyEngine() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  uint64_t session_id() const { return session_id_; }

 private:
  pid_t pid_ = -1;
  uint64_t session_id_ = 0;
};

class IdentityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::getuid() != 0 || std::system("command -v setpriv >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "needs root and setpriv to act as another user";
    }
    if (AsNobody(BinDir() + "/hisparse-ctl --help").exit_code != 0) {
      GTEST_SKIP() << "user nobody cannot run the binaries in " << BinDir() << " (a parent folder is not traversable)";
    }
  }
  // A daemon whose sockets nobody (gid 65534) can open, plus `extra` settings.
  std::unique_ptr<DaemonProcess> Start(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {
        "--host-pool-size",         "64MiB", "--host-pool-page-size", "4KiB", "--host-pool-slab-size", "4MiB", "--set",
        "access.socket_group=65534"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto d = StartDaemon(args);
    if (d != nullptr) {
      const std::string dir = d->socket_path().substr(0, d->socket_path().rfind('/'));
      ::chmod(dir.c_str(), 0755);
    }
    return d;
  }
};

// Item 5 of issue 14: the tenant was bound at the first fd fetch, so a session that admitted
// before fetching anything was no tenant's and escaped its quotas.
TEST(SessionQuotaTest, ASessionThatAdmitsBeforeAnyFdFetchHitsTheQuotasExactly) {
  auto daemon = StartDaemon({"--host-pool-size", "64MiB", "--host-pool-page-size", "4KiB", "--host-pool-slab-size",
                             "4MiB", "--set", "quotas.requests=4", "--set", "quotas.host_bytes=1MiB"});
  ASSERT_NE(daemon, nullptr);
  const std::string a = daemon->address();
  // Host bytes are charged in whole 4 KiB pages: 1000 tokens of 64 B is 16 pages a layer.
  Session engine;  // the client library fetches its fds at open: bound on every version
  ASSERT_TRUE(Session::Open(SmallGeometry(a), &engine).ok());
  ASSERT_TRUE(engine.Admit(1, 10, 1000).ok());  // 4 layers x 16 pages = 262,144 B
  ASSERT_TRUE(engine.Admit(2, 10, 1000).ok());  // 524,288 B held
  RawSession raw;                               // same uid, never touches the fd channel
  ASSERT_TRUE(raw.Open(a));
  ASSERT_TRUE(raw.Admit(3, 1000).ok());  // 786,432 B, 3 requests
  // 1,048,576 - 786,432 = 262,144 B = 16 pages a layer = 1024 tokens: one more is over the quota.
  grpc::Status over = raw.Admit(4, 1025);
  EXPECT_EQ(over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << over.error_message();
  EXPECT_NE(over.error_message().find("quotas.host_bytes"), std::string::npos) << over.error_message();
  ASSERT_TRUE(raw.Admit(4, 1024).ok());  // exactly 1 MiB, 4 requests
  EXPECT_TRUE(engine.Release(2).ok());   // 786,432 B, 3 requests
  ASSERT_TRUE(raw.Admit(5, 4).ok());     // a page a layer, 4 requests again
  grpc::Status fifth = raw.Admit(6, 4);
  EXPECT_EQ(fifth.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << fifth.error_message();
  EXPECT_NE(fifth.error_message().find("quotas.requests"), std::string::npos) << fifth.error_message();
  const v1::StatsResponse st = Stats(a);
  EXPECT_EQ(st.requests(), 4u);
  uint64_t held = 0;
  for (const auto& ss : st.session_stats()) {
    held += ss.host_bytes();
    EXPECT_EQ(ss.peer_pid(), ::getpid()) << "the Session stream's peer is the session's pid";
  }
  EXPECT_EQ(held, 262144u + 262144u + 262144u + 16384u);  // requests 1, 3, 4 and 5
}

// Item 8: a token is bound to its owner's uid over unary gRPC too.
TEST_F(IdentityTest, ALeakedTokenIsWorthNothingToAnotherUid) {
  auto daemon = Start();
  ASSERT_NE(daemon, nullptr);
  const std::string a = daemon->address();
  RawSession owner;
  ASSERT_TRUE(owner.Open(a));
  ASSERT_TRUE(owner.Admit(1, 100).ok());
  const std::string stolen = a + " " + std::to_string(owner.ref().session_id()) + " " + owner.ref().token();
  CommandResult thief = AsNobody(SelfPath() + " --gtest_also_run_disabled_tests --gtest_filter=IdentityChild.*",
                                 std::string(kStolenEnv) + "='" + stolen + "'");
  EXPECT_EQ(thief.exit_code, 0) << thief.out;
  EXPECT_NE(thief.out.find("[  PASSED  ] 1 test"), std::string::npos) << thief.out;
  // Nothing the thief sent took effect; the owner's token still works for the owner.
  EXPECT_EQ(Stats(a).requests(), 1u);
  EXPECT_TRUE(owner.Release(1).ok());
  EXPECT_EQ(Stats(a).requests(), 0u);
}

// Runs only as the child of the test above (as nobody, with kStolenEnv set).
TEST(IdentityChild, DISABLED_StolenToken) {
  const char* env = std::getenv(kStolenEnv);
  ASSERT_NE(env, nullptr);
  char address[512];
  unsigned long long sid = 0;
  char token[128];
  ASSERT_EQ(std::sscanf(env, "%511s %llu %127s", address, &sid, token), 3);
  ASSERT_NE(::getuid(), 0u) << "must run as another user";
  auto stub = RawStub(address);
  v1::SessionRef ref;
  ref.set_session_id(sid);
  ref.set_token(token);
  {
    grpc::ClientContext ctx;
    v1::AdmitRequest req;
    *req.mutable_session() = ref;
    req.set_request_id(2);
    req.set_token_budget(100);
    v1::AdmitResponse resp;
    grpc::Status s = stub->Admit(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << "Admit: " << s.error_message();
  }
  {
    grpc::ClientContext ctx;
    v1::ExtendRequest req;
    *req.mutable_session() = ref;
    req.set_request_id(1);
    req.set_token_budget(200);
    v1::ExtendResponse resp;
    grpc::Status s = stub->Extend(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << "Extend: " << s.error_message();
  }
  {
    grpc::ClientContext ctx;
    v1::ReleaseRequest req;
    *req.mutable_session() = ref;
    req.set_request_id(1);
    v1::ReleaseResponse resp;
    grpc::Status s = stub->Release(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << "Release: " << s.error_message();
  }
  for (const v1::BatchMode mode : {v1::BATCH_MODE_PER_ITEM, v1::BATCH_MODE_ALL_OR_NOTHING}) {
    grpc::ClientContext ctx;
    v1::AdmitBatchRequest req;
    *req.mutable_session() = ref;
    req.set_mode(mode);
    req.add_items()->set_request_id(3);
    req.mutable_items(0)->set_token_budget(100);
    v1::AdmitBatchResponse resp;
    grpc::Status s = stub->AdmitBatch(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << "AdmitBatch: " << s.error_message();
  }
  {
    grpc::ClientContext ctx;
    v1::ReleaseBatchRequest req;
    *req.mutable_session() = ref;
    req.add_request_ids(1);
    v1::ReleaseBatchResponse resp;
    grpc::Status s = stub->ReleaseBatch(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << "ReleaseBatch: " << s.error_message();
  }
}

// Item 7: tenants see and act on their own sessions; admins on all; drain is an admin's.
TEST_F(IdentityTest, TenantsSeeAndActOnTheirOwnSessionsOnly) {
  auto daemon = Start();
  ASSERT_NE(daemon, nullptr);
  const std::string a = daemon->address();
  Session root_engine;
  ASSERT_TRUE(Session::Open(SmallGeometry(a), &root_engine).ok());
  ASSERT_TRUE(root_engine.Admit(11, 10, 1000).ok());
  hs_session_info info;
  root_engine.Info(&info);
  const std::string root_sid = std::to_string(info.session_id);
  NobodyEngine nobody_engine;
  ASSERT_TRUE(nobody_engine.Start(a, 2));
  const std::string own_sid = std::to_string(nobody_engine.session_id());

  // The tenant's view: its own session, counted alone; the node's pool figures stay.
  CommandResult r = AsNobody(CtlCmd(a, "--json stats"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"session_id\": " + own_sid), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\"session_id\": " + root_sid), std::string::npos) << "another tenant's session\n" << r.out;
  EXPECT_NE(r.out.find("\"sessions\": 1, \"requests\": 2,"), std::string::npos) << r.out;
  r = AsNobody(CtlCmd(a, "requests --json"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find("\"request_id\": 11"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"session_id\": " + own_sid), std::string::npos) << r.out;
  r = AsNobody(CtlCmd(a, "requests --session " + root_sid));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("permission denied"), std::string::npos) << r.out;

  // Acting on another tenant's request, or on the node, is refused and changes nothing.
  r = AsNobody(CtlCmd(a, "evict 11 --session " + root_sid));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("admin role"), std::string::npos) << r.out;
  r = AsNobody(CtlCmd(a, "drain --no-wait"));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("admin role"), std::string::npos) << r.out;
  v1::StatsResponse st = Stats(a);
  EXPECT_FALSE(st.draining());
  EXPECT_EQ(st.requests(), 3u);
  EXPECT_EQ(st.evictions(), 0u);
  // Its own request it may evict.
  r = AsNobody(CtlCmd(a, "evict 1 --session " + own_sid));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(Stats(a).evictions(), 1u);

  // Root (an admin) sees both tenants.
  st = Stats(a);
  EXPECT_EQ(st.sessions(), 2u);
  EXPECT_EQ(st.session_stats_size(), 2);
}

TEST_F(IdentityTest, AdminUidsSeeEveryTenantAndMayDrain) {
  auto daemon = Start({"--set", "access.admin_uids=65534"});
  ASSERT_NE(daemon, nullptr);
  const std::string a = daemon->address();
  Session root_engine;
  ASSERT_TRUE(Session::Open(SmallGeometry(a), &root_engine).ok());
  hs_session_info info;
  root_engine.Info(&info);
  CommandResult r = AsNobody(CtlCmd(a, "--json stats"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"session_id\": " + std::to_string(info.session_id)), std::string::npos) << r.out;
  r = AsNobody(CtlCmd(a, "drain --no-wait"));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(Stats(a).draining());
}

}  // namespace identity_test
}  // namespace hisparse::testing
