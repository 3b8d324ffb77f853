// Issue 39, items 2, 3 and 6: one tenant holding connections must not deny the daemon to others.
// Each test starts a real hisparsed and plays the hostile tenant as uid 65534 (nobody), beside
// another tenant (uid 65533, the test client), root (an admin) and a grpc.health.v1 probe:
//   2. Session streams that never send `open`: bounded per uid, cancelled at their deadline, and
//      never holding the threads health, admin and other tenants' calls need;
//   3. descriptors requested over the fd channel and never read: bounded per connection and per
//      uid, below the kernel's count of descriptors in flight (the daemon runs without
//      CAP_SYS_RESOURCE / CAP_SYS_ADMIN and with a small RLIMIT_NOFILE, so the kernel's bound is
//      real, as it is for the deployed daemon);
//   6. idle control-socket connections: capped per uid.
// The hostile tenant runs in a child process: this binary re-executed as nobody (the ConnAttack.
// DISABLED_* tests, which need gRPC) or a forked child making raw connections. Needs root and
// setpriv; skips otherwise.
//
// HISPARSE_CONN_ATTACK_SCALE (default 1) multiplies each attack's streams, connections and
// requests (bench/RESULTS.md has larger runs).
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "hisparse/common/unix_socket.h"
#include "test_support.h"

extern char** environ;

namespace hisparse::testing {
namespace hardening_conn_test {

using Clock = std::chrono::steady_clock;
using grpc::health::v1::HealthCheckResponse;

constexpr uint32_t kAttacker = 65534;   // nobody
constexpr uint32_t kTenant = 65533;     // another tenant
constexpr uint32_t kSocketGid = 65534;  // both are in the sockets' group
constexpr char kAttackEnv[] = "HISPARSE_CONN_ATTACK";

int Scale() {
  const char* v = std::getenv("HISPARSE_CONN_ATTACK_SCALE");
  int n = 1;
  return v != nullptr && absl::SimpleAtoi(v, &n) && n > 0 ? n : 1;
}

std::string SelfPath() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  self[n > 0 ? n : 0] = 0;
  return self;
}

int OpenFds(pid_t pid) {
  DIR* d = ::opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

// A process run as `uid` (primary gid kSocketGid, no other groups) through setpriv, with its
// stdin and stdout piped to this one; killed when this object goes.
class AsUid {
 public:
  AsUid(uint32_t uid, const std::vector<std::string>& argv, const std::string& env = "") {
    std::vector<std::string> full = {"/usr/bin/setpriv", absl::StrCat("--reuid=", uid),
                                     absl::StrCat("--regid=", kSocketGid), "--clear-groups"};
    full.insert(full.end(), argv.begin(), argv.end());
    std::vector<char*> args;
    for (std::string& a : full) args.push_back(a.data());
    args.push_back(nullptr);
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
    if (!env.empty()) env_strings.push_back(env);
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    int out[2], in[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(in, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {  // only async-signal-safe calls until exec
      ::dup2(out[1], 1);
      ::dup2(in[0], 0);
      ::execve(args[0], args.data(), envp.data());
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(in[0]);
    out_ = out[0];
    in_ = in[1];
  }
  ~AsUid() {
    if (in_ >= 0) ::close(in_);
    if (out_ >= 0) ::close(out_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  // The next line of its stdout that starts with `prefix` (others are skipped: gtest's own), or ""
  // once it ends or `timeout` passes.
  std::string ReadLine(const std::string& prefix, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      for (size_t nl; (nl = buffer_.find('\n')) != std::string::npos;) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        if (absl::StartsWith(line, prefix)) return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      pollfd p{out_, POLLIN, 0};
      if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) return "";
      char chunk[4096];
      const ssize_t n = ::read(out_, chunk, sizeof(chunk));
      if (n <= 0) return "";
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }
  void WriteLine(const std::string& line) { (void)!::write(in_, (line + "\n").data(), line.size() + 1); }
  bool started() const { return pid_ > 0; }

 private:
  pid_t pid_ = -1;
  int out_ = -1, in_ = -1;
  std::string buffer_;
};

// This binary, as `uid`, running ConnAttack.DISABLED_<test> with kAttackEnv=`args`.
std::unique_ptr<AsUid> Attack(uint32_t uid, const std::string& test, const std::string& args) {
  return std::make_unique<AsUid>(uid,
                                 std::vector<std::string>{SelfPath(), "--gtest_also_run_disabled_tests",
                                                          "--gtest_filter=ConnAttack.DISABLED_" + test},
                                 absl::StrCat(kAttackEnv, "=", args));
}

// A session of uid kTenant, through the client library (hisparse-test-client hold 1): opened,
// a request admitted and written. True once it says READY.
bool TenantSessionWorks(const std::string& address) {
  AsUid tenant(kTenant, {BinDir() + "/hisparse-test-client", address, "hold", "1"});
  return absl::StartsWith(tenant.ReadLine("READY", std::chrono::seconds(30)), "READY");
}

HealthCheckResponse::ServingStatus Health(const std::string& address, std::string* error) {
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::health::v1::HealthCheckRequest req;
  HealthCheckResponse resp;
  const grpc::Status s = stub->Check(&ctx, req, &resp);
  *error = s.ok() ? "" : absl::StrCat(s.error_code(), " ", s.error_message());
  return s.ok() ? resp.status() : HealthCheckResponse::UNKNOWN;
}

// Root's Stats (an admin sees every tenant): "" when it succeeds, else the status.
std::string RootStats(const std::string& address, uint32_t* sessions = nullptr) {
  auto stub = RawStub(address);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::StatsResponse r;
  const grpc::Status s = stub->Stats(&ctx, v1::StatsRequest(), &r);
  if (sessions != nullptr) *sessions = r.sessions();
  return s.ok() ? "" : absl::StrCat(s.error_code(), " ", s.error_message());
}

// A Session stream opened over raw gRPC (the client library always sends `open` at once).
struct RawSession {
  std::unique_ptr<v1::HiSparse::Stub> stub;
  std::unique_ptr<grpc::ClientContext> ctx = std::make_unique<grpc::ClientContext>();
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionEvent>> stream;
  v1::SessionOpened opened;
  bool Open(const std::string& address) {
    stub = RawStub(address);
    stream = stub->Session(ctx.get());
    v1::SessionRequest open;
    v1::Geometry* g = open.mutable_open()->mutable_geometry();
    g->set_gpu(-1);
    g->set_num_layers(2);
    g->set_record_bytes(64);
    g->set_k(8);
    g->set_slots(16);
    g->set_max_requests(4);
    open.mutable_open()->set_engine_name("hardening-conn");
    v1::SessionEvent event;
    if (!stream->Write(open) || !stream->Read(&event) || !event.has_opened()) return false;
    opened = event.opened();
    return true;
  }
  std::string FdRequest() const { return absl::StrCat("HSFD2 ", opened.session_id(), " ", opened.token(), " arena"); }
};

// One fetch of `s`'s arena over a new fd-channel connection: the reply's text ("OK fd ..." with
// a descriptor), or the error that ended the exchange.
std::string FetchArena(const std::string& fd_socket, const RawSession& s, bool* got_fd) {
  *got_fd = false;
  auto conn = ConnectUnixSeqpacket(fd_socket, 10000);
  if (!conn.ok()) return conn.status().ToString();
  if (absl::Status sent = SendPacket(conn->get(), s.FdRequest(), -1); !sent.ok()) return sent.ToString();
  auto reply = RecvPacket(conn->get(), 1024);
  if (!reply.ok()) return reply.status().ToString();
  *got_fd = reply->fd.valid();
  return reply->payload;
}

class ConnHardeningTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::getuid() != 0 || ::access("/usr/bin/setpriv", X_OK) != 0) {
      GTEST_SKIP() << "needs root and setpriv to act as other users";
    }
    AsUid probe(kAttacker, {SelfPath(), "--gtest_list_tests"});
    if (probe.ReadLine("ConnHardeningTest", std::chrono::seconds(30)).empty()) {
      GTEST_SKIP() << "uid " << kAttacker << " cannot run " << SelfPath() << " (a parent folder is not traversable)";
    }
  }
  // A daemon whose sockets the sockets' group (kSocketGid) may open, plus `extra` settings.
  std::unique_ptr<DaemonProcess> Start(std::vector<std::string> extra,
                                       const DaemonProcess::Launch& launch = DaemonProcess::Launch()) {
    std::vector<std::string> args = {"--host-pool-size",
                                     "64MiB",
                                     "--host-pool-page-size",
                                     "4KiB",
                                     "--host-pool-slab-size",
                                     "4MiB",
                                     "--set",
                                     absl::StrCat("access.socket_group=", kSocketGid),
                                     "--log-level",
                                     "warning"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto d = DaemonProcess::Start(args, 20000, launch);
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    const std::string dir = (*d)->socket_path().substr(0, (*d)->socket_path().rfind('/'));
    ::chmod(dir.c_str(), 0755);
    return std::move(*d);
  }
};

// ---- 2. Session streams that never send `open` ----

// As the attacker: N Session streams on one connection, none ever sending a message. Prints
// "READY <held> <refused> <first refusal>" once at least MIN_REFUSED have been refused and no
// more for 300 ms (or after 60 s), then holds the rest until killed.
TEST(ConnAttack, DISABLED_HalfOpenStreams) {
  const char* env = std::getenv(kAttackEnv);
  ASSERT_NE(env, nullptr);
  std::vector<std::string> a = absl::StrSplit(env, ' ');
  ASSERT_EQ(a.size(), 3u);
  const int n = std::stoi(a[1]), min_refused = std::stoi(a[2]);
  auto stub = RawStub(a[0]);
  grpc::CompletionQueue cq;
  struct Call {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientAsyncReaderWriter<v1::SessionRequest, v1::SessionEvent>> rw;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Call>> calls;
  std::vector<char> tags(2 * static_cast<size_t>(n));  // slot 2i: call i started; 2i + 1: it finished
  for (int i = 0; i < n; ++i) {
    calls.push_back(std::make_unique<Call>());
    calls[i]->rw = stub->AsyncSession(&calls[i]->ctx, &cq, &tags[2 * i]);
  }
  int refused = 0, ended = 0;
  std::string first_refusal;
  auto last_event = Clock::now();
  const auto give_up = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < give_up &&
         !(refused >= min_refused && Clock::now() - last_event > std::chrono::milliseconds(300))) {
    void* t = nullptr;
    bool ok = false;
    if (cq.AsyncNext(&t, &ok, std::chrono::system_clock::now() + std::chrono::milliseconds(50)) !=
        grpc::CompletionQueue::GOT_EVENT) {
      continue;
    }
    last_event = Clock::now();
    const size_t slot = static_cast<size_t>(static_cast<char*>(t) - tags.data());
    Call& c = *calls[slot / 2];
    if (slot % 2 == 0) {
      c.rw->Finish(&c.status, &tags[slot + 1]);
      continue;
    }
    ++ended;
    if (c.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      if (refused++ == 0) first_refusal = c.status.error_message();
    }
  }
  std::printf("READY %d %d %s\n", n - ended, refused, first_refusal.c_str());
  std::fflush(stdout);
  for (;;) ::pause();
}

TEST_F(ConnHardeningTest, HalfOpenSessionStreamsLeaveTheServerToOthers) {
  // gRPC's threads for 4 sessions: 2 x 4 + 16 (daemon.cc). The attacker's streams would hold every
  // one of them; the deadline is far off, so they are held while the others call.
  constexpr int kMaxSessions = 4, kThreads = 2 * kMaxSessions + 16, kOpeningCap = 2;
  const int streams = 80 * Scale();
  auto d = Start({"--max-sessions", std::to_string(kMaxSessions), "--set",
                  absl::StrCat("limits.max_opening_sessions_per_peer=", kOpeningCap), "--set",
                  "limits.session_open_timeout_ms=600000"});
  ASSERT_NE(d, nullptr);
  auto attacker =
      Attack(kAttacker, "HalfOpenStreams", absl::StrCat(d->address(), " ", streams, " ", streams - kThreads));
  const std::string ready = attacker->ReadLine("READY");
  ASSERT_FALSE(ready.empty()) << "the attacker never settled";
  std::printf("[ figure   ] %d half-open streams of uid %u: %s\n", streams, kAttacker, ready.c_str());

  std::string error;
  EXPECT_EQ(Health(d->address(), &error), HealthCheckResponse::SERVING) << "health: " << error;
  EXPECT_EQ(RootStats(d->address()), "") << "root's Stats";
  EXPECT_TRUE(TenantSessionWorks(d->address())) << "uid " << kTenant << " could not open a session and admit";

  // The attacker held its cap and no more; the rest were refused at once, naming the limit.
  std::vector<std::string> f = absl::StrSplit(ready, absl::MaxSplits(' ', 3));
  ASSERT_EQ(f.size(), 4u) << ready;
  EXPECT_EQ(std::stoi(f[1]), kOpeningCap) << ready;
  EXPECT_EQ(std::stoi(f[2]), streams - kOpeningCap) << ready;
  EXPECT_NE(f[3].find("limits.max_opening_sessions_per_peer"), std::string::npos) << ready;
}

TEST_F(ConnHardeningTest, ASessionStreamWithoutOpenIsCancelledAtItsDeadline) {
  // Root's own streams (no opening cap for an admin) fill both sessions' places until cancelled.
  auto d = Start({"--max-sessions", "2", "--set", "limits.session_open_timeout_ms=300"});
  ASSERT_NE(d, nullptr);
  auto stub = RawStub(d->address());
  grpc::CompletionQueue cq;
  struct Call {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientAsyncReaderWriter<v1::SessionRequest, v1::SessionEvent>> rw;
    grpc::Status status;
  };
  constexpr int kStreams = 2;
  Call calls[kStreams];
  char tags[2 * kStreams];
  const auto t0 = Clock::now();
  for (int i = 0; i < kStreams; ++i) calls[i].rw = stub->AsyncSession(&calls[i].ctx, &cq, &tags[2 * i]);
  int ended = 0;
  const auto give_up = Clock::now() + std::chrono::seconds(30);
  while (ended < kStreams && Clock::now() < give_up) {
    void* t = nullptr;
    bool ok = false;
    if (cq.AsyncNext(&t, &ok, std::chrono::system_clock::now() + std::chrono::milliseconds(100)) !=
        grpc::CompletionQueue::GOT_EVENT) {
      continue;
    }
    const int slot = static_cast<int>(static_cast<char*>(t) - tags);
    if (slot % 2 == 0) {
      calls[slot / 2].rw->Finish(&calls[slot / 2].status, &tags[slot + 1]);
    } else {
      ++ended;
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("[ figure   ] %d streams without `open` ended after %.2f s (deadline 0.3 s)\n", ended, seconds);
  for (Call& c : calls) {
    if (ended < kStreams) c.ctx.TryCancel();
  }
  ASSERT_EQ(ended, kStreams) << "streams that never sent `open` were held past their deadline";
  for (const Call& c : calls) {
    EXPECT_TRUE(c.status.error_code() == grpc::StatusCode::CANCELLED ||
                c.status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
        << c.status.error_code() << " " << c.status.error_message();
  }
  cq.Shutdown();
  void* t = nullptr;
  bool ok = false;
  while (cq.Next(&t, &ok)) {
  }
  // Their places are free again: two sessions open. The client sees a stream end before the
  // daemon's handler has given its place back (the handler returns after the cancellation is
  // delivered), so each open may wait for one place; under TSan that takes a while.
  RawSession a, b;
  EXPECT_TRUE(WaitUntil([&] { return a.Open(d->address()) || (a = RawSession(), false); })) << "first session";
  EXPECT_TRUE(WaitUntil([&] { return b.Open(d->address()) || (b = RawSession(), false); })) << "second session";
}

// ---- 6. Idle control-socket connections ----

// As `uid`, in a forked child: `n` connections to the control socket, each sending a gRPC
// client's preface (HTTP/2's, and an empty SETTINGS frame) and nothing more. Reports through the
// returned pipe "<connected> <closed by the daemon>" once no more than `expect_held` are open (or
// after 10 s), then holds them until killed.
struct IdleConnections {
  pid_t pid = -1;
  int report = -1;
  ~IdleConnections() {
    if (report >= 0) ::close(report);
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};
std::unique_ptr<IdleConnections> HoldIdleConnections(uint32_t uid, const std::string& path, int n, int expect_held) {
  auto held = std::make_unique<IdleConnections>();
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return held;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  static const char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";
  const size_t preface_bytes = sizeof(kPreface) - 1;
  std::vector<int> fds(static_cast<size_t>(n), -1);  // allocated before fork: the child only writes it
  held->pid = ::fork();
  if (held->pid == 0) {  // only async-signal-safe calls: the parent has threads
    if (::setgroups(0, nullptr) != 0 || ::setresgid(kSocketGid, kSocketGid, kSocketGid) != 0 ||
        ::setresuid(uid, uid, uid) != 0) {
      ::_exit(120);
    }
    int connected = 0;
    for (int i = 0; i < n; ++i) {
      const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) break;
      if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
        ::close(fd);
        continue;
      }
      (void)!::send(fd, kPreface, preface_bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
      fds[static_cast<size_t>(i)] = fd;
      ++connected;
    }
    int closed = 0;
    for (int look = 0; look < 200; ++look) {  // every 50 ms, 10 s at most
      const timespec pause_50ms{0, 50 * 1000 * 1000};
      ::nanosleep(&pause_50ms, nullptr);
      closed = 0;
      for (int fd : fds) {
        if (fd < 0) continue;
        pollfd pf{fd, POLLRDHUP, 0};
        if (::poll(&pf, 1, 0) == 1 && (pf.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) ++closed;
      }
      if (connected - closed <= expect_held) break;
    }
    char line[64];
    int len = 0;
    // "<connected> <closed>\n" without snprintf (not async-signal-safe).
    auto put = [&line, &len](int v) {
      char digits[12];
      int d = 0;
      do {
        digits[d++] = static_cast<char>('0' + v % 10);
        v /= 10;
      } while (v > 0);
      while (d > 0) line[len++] = digits[--d];
    };
    put(connected);
    line[len++] = ' ';
    put(closed);
    line[len++] = '\n';
    (void)!::write(p[1], line, static_cast<size_t>(len));
    for (;;) ::pause();
  }
  ::close(p[1]);
  held->report = p[0];
  return held;
}

TEST_F(ConnHardeningTest, IdleControlConnectionsOfOneUidLeaveOthersServed) {
  constexpr int kCap = 8;
  const int connections = 300 * Scale();
  auto d = Start({"--set", absl::StrCat("limits.max_control_connections_per_peer=", kCap)});
  ASSERT_NE(d, nullptr);
  // Descriptors as a busy node has them: a few dozen to spare (the limit is lowered once the daemon
  // serves, as the fd channel's fault test does).
  const int baseline = OpenFds(d->pid());
  const rlimit low{static_cast<rlim_t>(baseline + 64), static_cast<rlim_t>(baseline + 64)};
  ASSERT_EQ(::prlimit(d->pid(), RLIMIT_NOFILE, &low, nullptr), 0) << std::strerror(errno);

  auto idle = HoldIdleConnections(kAttacker, d->socket_path(), connections, kCap);
  ASSERT_GT(idle->pid, 0);
  char report[64] = {};
  pollfd pf{idle->report, POLLIN, 0};
  ASSERT_EQ(::poll(&pf, 1, 60000), 1) << "the attacker never reported";
  ASSERT_GT(::read(idle->report, report, sizeof(report) - 1), 0);
  int connected = 0, closed = 0;
  ASSERT_EQ(std::sscanf(report, "%d %d", &connected, &closed), 2) << report;
  std::printf(
      "[ figure   ] uid %u: %d idle control connections made, %d closed by the daemon, %d held; daemon fds %d -> %d\n",
      kAttacker, connected, closed, connected - closed, baseline, OpenFds(d->pid()));

  std::string error;
  EXPECT_EQ(Health(d->address(), &error), HealthCheckResponse::SERVING) << "health: " << error;
  EXPECT_EQ(RootStats(d->address()), "") << "root's Stats";
  EXPECT_TRUE(TenantSessionWorks(d->address())) << "uid " << kTenant << " could not open a session and admit";
  EXPECT_EQ(connected - closed, kCap) << "the attacker holds connections past limits.max_control_connections_per_peer";

  // The attacker's own next call is refused, saying why. (While its refused connections fill the
  // acceptor's few places for refusals, more are closed without a word: wait for one.)
  std::string refused;
  EXPECT_TRUE(WaitUntil([&] {
    refused = Attack(kAttacker, "Stats", d->address())->ReadLine("STATS");
    return refused.find("limits.max_control_connections_per_peer") != std::string::npos;
  })) << refused;
  std::printf("[ figure   ] uid %u's next call: %s\n", kAttacker, refused.c_str());
  EXPECT_TRUE(absl::StartsWith(refused, "STATS 8 ")) << refused;  // RESOURCE_EXHAUSTED

  // Once the attacker is gone, its place is free again.
  idle.reset();
  std::string again;
  EXPECT_TRUE(WaitUntil([&] {
    again = Attack(kAttacker, "Stats", d->address())->ReadLine("STATS");
    return again == "STATS 0 ";
  })) << "uid "
      << kAttacker << " stayed refused after its connections closed: " << again;
}

// As the attacker: one Stats call on a new channel: "STATS <code> <message>".
TEST(ConnAttack, DISABLED_Stats) {
  const char* env = std::getenv(kAttackEnv);
  ASSERT_NE(env, nullptr);
  auto stub = RawStub(env);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::StatsResponse r;
  const grpc::Status s = stub->Stats(&ctx, v1::StatsRequest(), &r);
  std::printf("STATS %d %s\n", static_cast<int>(s.error_code()), s.error_message().c_str());
  std::fflush(stdout);
}

// ---- 3. Descriptors a peer never reads ----

// As the attacker: opens a session, then CONNS fd-channel connections, each sending REQUESTS
// arena fetches and reading no reply. Then one more connection asks once and reads the answer:
// "LAST <reply or error>". Prints "READY", waits for a line on stdin, reads its first
// connection's replies and prints "CONN0 <with a descriptor> <refused> <first refusal>".
TEST(ConnAttack, DISABLED_UnreadDescriptors) {
  const char* env = std::getenv(kAttackEnv);
  ASSERT_NE(env, nullptr);
  std::vector<std::string> a = absl::StrSplit(env, ' ');
  ASSERT_EQ(a.size(), 4u);
  const std::string fd_socket = a[1];
  const int conns = std::stoi(a[2]), requests = std::stoi(a[3]);
  RawSession s;
  ASSERT_TRUE(s.Open(a[0]));
  std::vector<UniqueFd> held;
  int sent = 0;
  for (int c = 0; c < conns; ++c) {
    auto conn = ConnectUnixSeqpacket(fd_socket, 2000);  // sends wait at most 2 s too
    if (!conn.ok()) break;
    for (int r = 0; r < requests && SendPacket(conn->get(), s.FdRequest(), -1).ok(); ++r) ++sent;
    held.push_back(std::move(*conn));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the daemon answers what it read
  bool got_fd = false;
  const std::string last = FetchArena(fd_socket, s, &got_fd);
  std::printf("LAST %s%s\n", last.c_str(), got_fd ? " (with a descriptor)" : "");
  std::printf("READY %d requests on %zu connections\n", sent, held.size());
  std::fflush(stdout);
  char go[16];
  if (held.empty() || std::fgets(go, sizeof(go), stdin) == nullptr) {
    for (;;) ::pause();
  }
  int with_fd = 0, refusals = 0;
  std::string first_refusal;
  ::fcntl(held[0].get(), F_SETFL, O_NONBLOCK);
  for (;;) {
    auto reply = RecvPacket(held[0].get(), 1024);
    if (!reply.ok()) break;
    if (reply->fd.valid()) ++with_fd;
    if (absl::StartsWith(reply->payload, "ERR")) {
      if (refusals++ == 0) first_refusal = reply->payload;
    }
  }
  std::printf("CONN0 %d %d %s\n", with_fd, refusals, first_refusal.c_str());
  std::fflush(stdout);
  for (;;) ::pause();
}

TEST_F(ConnHardeningTest, DescriptorsAPeerNeverReadsStopAtItsBoundNotTheKernels) {
  // As deployed: no CAP_SYS_RESOURCE or CAP_SYS_ADMIN (either exempts a process from the kernel's
  // count of descriptors in flight), and an open-file limit, here small: the kernel refuses to pass
  // descriptors once more than 1024 of the daemon's user (root, with every test running beside
  // this one) are in flight. Unbounded, the attack below puts about 2,800 in flight.
  DaemonProcess::Launch launch;
  launch.max_open_files = 1024;
  launch.drop_capabilities = {CAP_SYS_RESOURCE, CAP_SYS_ADMIN};
  constexpr int kPerConnection = 4, kPerPeer = 32;
  auto d = Start(
      {"--set", absl::StrCat("limits.max_fds_in_flight_per_connection=", kPerConnection), "--set",
       absl::StrCat("limits.max_fds_in_flight_per_peer=", kPerPeer), "--set", "limits.max_fd_connections_per_peer=64"},
      launch);
  ASSERT_NE(d, nullptr);
  const std::string fd_socket = d->socket_path() + ".fd";
  RawSession mine;  // root's: another uid's fd passing must keep working
  ASSERT_TRUE(mine.Open(d->address()));
  const int baseline_fds = OpenFds(d->pid());

  // More connections than the bounds let have descriptors (8 x 4 = 32), and more requests on each
  // than its send queue holds replies (about 280): unbounded, the kernel's 1024 are passed at once.
  const int conns = 10 * Scale(), requests = 300;
  auto attacker =
      Attack(kAttacker, "UnreadDescriptors", absl::StrCat(d->address(), " ", fd_socket, " ", conns, " ", requests));
  const std::string last = attacker->ReadLine("LAST");
  const std::string ready = attacker->ReadLine("READY");
  ASSERT_FALSE(ready.empty()) << "the attacker never finished: " << last;
  std::printf("[ figure   ] uid %u %s; its next fetch: %s\n", kAttacker, ready.c_str(), last.c_str());

  // Root's fetches, each on a connection of its own, while the attacker's descriptors are unread.
  int fetched = 0;
  std::string failure;
  for (int i = 0; i < 20; ++i) {
    bool got_fd = false;
    const std::string reply = FetchArena(fd_socket, mine, &got_fd);
    if (got_fd && absl::StartsWith(reply, "OK fd")) {
      ++fetched;
    } else if (failure.empty()) {
      failure = reply;
    }
  }
  std::printf("[ figure   ] root fetched %d of 20 arenas beside it%s%s\n", fetched, failure.empty() ? "" : ": ",
              failure.c_str());
  EXPECT_EQ(fetched, 20) << failure;
  EXPECT_TRUE(absl::StartsWith(last, "LAST ERR RESOURCE_EXHAUSTED")) << last;
  EXPECT_NE(last.find("limits.max_fds_in_flight_per_peer"), std::string::npos) << last;

  attacker->WriteLine("go");
  const std::string conn0 = attacker->ReadLine("CONN0");
  std::printf("[ figure   ] the attacker's first connection: %s\n", conn0.c_str());
  std::vector<std::string> f = absl::StrSplit(conn0, absl::MaxSplits(' ', 3));
  ASSERT_EQ(f.size(), 4u) << conn0;
  EXPECT_EQ(std::stoi(f[1]), kPerConnection) << conn0;
  EXPECT_GT(std::stoi(f[2]), 0) << conn0;
  EXPECT_NE(f[3].find("limits.max_fds_in_flight_per_connection"), std::string::npos) << conn0;

  // Once the attacker is gone, nothing of it stays: its connections close, and its descriptors
  // in flight go with them.
  attacker.reset();
  int fds_now = 0;
  EXPECT_TRUE(WaitUntil([&] { return (fds_now = OpenFds(d->pid())) <= baseline_fds + 2; }))
      << "daemon descriptors " << baseline_fds << " -> " << fds_now;
  bool got_fd = false;
  EXPECT_TRUE(absl::StartsWith(FetchArena(fd_socket, mine, &got_fd), "OK fd") && got_fd);
}

}  // namespace hardening_conn_test
}  // namespace hisparse::testing
