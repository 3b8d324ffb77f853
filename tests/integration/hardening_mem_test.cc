// Memory and process-level hardening of a real hisparsed process (issue 14): sealed memfds against
// a hostile engine, the daemon's address space and host-arena budget, gRPC's thread bound, one
// daemon per socket path, and a pool larger than the machine refused at start. Issue 39: retired
// slabs whose descriptors an engine kept pin no memory, and ListAdoptable's pages reach the caller.
#include <errno.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hisparse/common/unix_socket.h"
#include "hisparse/v1/hisparse.grpc.pb.h"
#include "test_support.h"

namespace hisparse::testing {
namespace hardening_mem_test {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

// A "Key:   N kB" (or plain N) field of /proc/PID/status or /proc/meminfo; 0 when absent.
uint64_t ProcField(const std::string& file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    return std::stoull(line.substr(key.size() + 1));
  }
  return 0;
}
uint64_t StatusField(pid_t pid, const std::string& key) {
  return ProcField(absl::StrCat("/proc/", pid, "/status"), key);
}

v1::Geometry HostGeometry(uint32_t rows, uint32_t layers, uint32_t slots, uint32_t record_bytes) {
  v1::Geometry g;
  g.set_gpu(-1);
  g.set_num_layers(layers);
  g.set_record_bytes(record_bytes);
  g.set_k(8);
  g.set_slots(slots);
  g.set_max_requests(rows);
  return g;
}
// About 100 GiB of slot arena: 100 rows x 64 layers x 1024 slots x 16 KiB records (+ tables).
v1::Geometry Arena100GiB() { return HostGeometry(100, 64, 1023, 16384); }

// One session over a raw Session stream: open while this object lives.
struct RawSession {
  std::unique_ptr<grpc::ClientContext> ctx = std::make_unique<grpc::ClientContext>();
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionEvent>> stream;
  v1::SessionOpened opened;
  grpc::Status status;  // why it did not open
  bool ok() const { return opened.session_id() != 0; }
  v1::SessionRef ref() const {
    v1::SessionRef r;
    r.set_session_id(opened.session_id());
    r.set_token(opened.token());
    return r;
  }
};
std::unique_ptr<RawSession> OpenRaw(v1::HiSparse::Stub* stub, const v1::Geometry& geometry) {
  auto s = std::make_unique<RawSession>();
  s->stream = stub->Session(s->ctx.get());
  v1::SessionRequest open;
  *open.mutable_open()->mutable_geometry() = geometry;
  open.mutable_open()->set_engine_name("hardening-test");
  v1::SessionEvent event;
  if (s->stream->Write(open) && s->stream->Read(&event) && event.has_opened()) {
    s->opened = event.opened();
    return s;
  }
  s->stream->WritesDone();
  s->status = s->stream->Finish();
  return s;
}

// A fake engine's fd fetch over the fd channel (protocol version 2).
UniqueFd FetchFd(const std::string& fd_socket, const RawSession& s, const std::string& object) {
  auto conn = ConnectUnixSeqpacket(fd_socket);
  EXPECT_TRUE(conn.ok()) << conn.status();
  if (!conn.ok()) return UniqueFd();
  EXPECT_TRUE(
      SendPacket(conn->get(), absl::StrCat("HSFD2 ", s.opened.session_id(), " ", s.opened.token(), " ", object), -1)
          .ok());
  auto reply = RecvPacket(conn->get(), 1024);
  EXPECT_TRUE(reply.ok()) << reply.status();
  if (!reply.ok()) return UniqueFd();
  EXPECT_THAT(reply->payload, ::testing::StartsWith("OK fd ")) << object;
  return std::move(reply->fd);
}

uint64_t FreeHugePages() { return ProcField("/proc/meminfo", "HugePages_Free"); }

// Threads of `pid` whose name (comm, 15 characters at most) is `name`.
int ThreadsNamed(pid_t pid, const std::string& name) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"))) {
    std::ifstream comm(e.path() / "comm");
    std::string got;
    std::getline(comm, got);
    n += got == name;
  }
  return n;
}

// ---- 1. a hostile engine resizes every descriptor it holds; the daemon goes on ----
// (The segmented pool copied a run that could not grow in place, so a hole punched in a hugetlb
// segment had to fail that copy and not the daemon. Extend now appends pages and the daemon never
// reads or writes a slab it has handed out: that attack has nothing left to hit.)

void TruncateAttackThenExtend(const std::string& hugepages) {
  auto d = StartDaemon({"--host-pool-size", "32MiB", "--host-pool-page-size", "2MiB", "--host-pool-slab-size", "4MiB",
                        "--hugepages", hugepages});
  ASSERT_NE(d, nullptr);
  auto stub = RawStub(d->address());
  auto s = OpenRaw(stub.get(), HostGeometry(4, 1, 16, 64));
  ASSERT_TRUE(s->ok()) << s->status.error_message();
  const std::string fd_socket = s->opened.fd_socket();
  const uint32_t tokens = 1 * kMiB / 64;  // one 2 MiB page a layer
  v1::AdmitResponse first, second;
  for (auto [id, resp] : {std::pair<uint64_t, v1::AdmitResponse*>{1, &first}, {2, &second}}) {
    grpc::ClientContext ctx;
    v1::AdmitRequest req;
    *req.mutable_session() = s->ref();
    req.set_request_id(id);
    req.set_token_budget(tokens);
    ASSERT_TRUE(stub->Admit(&ctx, req, resp).ok());
  }
  const v1::PageRef from = first.layers(0).pages(0);

  // The engine writes its records, then tries to resize every descriptor it was given.
  UniqueFd slab = FetchFd(fd_socket, *s, absl::StrCat("slab ", from.slab()));
  UniqueFd arena = FetchFd(fd_socket, *s, "arena");
  ASSERT_TRUE(slab.valid() && arena.valid());
  const size_t slab_bytes = static_cast<size_t>(::lseek(slab.get(), 0, SEEK_END));
  auto* map = static_cast<uint8_t*>(::mmap(nullptr, slab_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, slab.get(), 0));
  ASSERT_NE(map, MAP_FAILED);
  const uint64_t bytes = uint64_t{tokens} * 64;
  for (uint64_t i = 0; i < bytes; ++i) map[from.offset() + i] = static_cast<uint8_t>(i * 13 + 1);
  for (int fd : {slab.get(), arena.get()}) {
    // Growing first, then shrinking to nothing: what is left is a file with no pages at all.
    const off_t size = ::lseek(fd, 0, SEEK_END);
    errno = 0;
    EXPECT_EQ(::ftruncate(fd, size + static_cast<off_t>(64 * kMiB)), -1);
    EXPECT_EQ(errno, EPERM);
    errno = 0;
    EXPECT_EQ(::ftruncate(fd, 0), -1);
    EXPECT_EQ(errno, EPERM);
    EXPECT_EQ(::lseek(fd, 0, SEEK_END), size);
  }

  // Extend appends a page to every layer; the first page, and its records, stay where they were.
  grpc::ClientContext ctx;
  v1::ExtendRequest ext;
  *ext.mutable_session() = s->ref();
  ext.set_request_id(1);
  ext.set_token_budget(3 * tokens);
  v1::ExtendResponse grown;
  const grpc::Status st = stub->Extend(&ctx, ext, &grown);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_FALSE(grown.moved());
  ASSERT_EQ(grown.layers(0).pages_size(), 2);
  EXPECT_EQ(grown.layers(0).pages(0).slab(), from.slab());
  EXPECT_EQ(grown.layers(0).pages(0).offset(), from.offset());
  for (uint64_t i = 0; i < bytes; ++i) ASSERT_EQ(map[from.offset() + i], static_cast<uint8_t>(i * 13 + 1)) << i;
  UniqueFd to_slab = FetchFd(fd_socket, *s, absl::StrCat("slab ", grown.layers(0).pages(1).slab()));
  ASSERT_TRUE(to_slab.valid());
  errno = 0;
  EXPECT_EQ(::ftruncate(to_slab.get(), 0), -1);
  EXPECT_EQ(errno, EPERM);
  ::munmap(map, slab_bytes);
  // Still serving.
  EXPECT_EQ(Stats(d->address()).sessions(), 1u);
}

TEST(SealTest, EngineCannotResizeItsFdsAndExtendStillAppends) { TruncateAttackThenExtend("off"); }

TEST(SealTest, EngineCannotResizeItsHugetlbFdsAndExtendStillAppends) {
  // 32 MiB of pool on 2 MiB pages, and room for nothing else to take them meanwhile.
  if (FreeHugePages() < 16) GTEST_SKIP() << "fewer than 16 free huge pages (vm.nr_hugepages) on this host";
  TruncateAttackThenExtend("on");
}

// ---- 2. address space and the host-arena budget ----

TEST(AddressSpaceTest, AHostArenaCostsTheDaemonAPageNotItsSize) {
  // As large an arena as the default budget (the memory left after the pool) allows, up to 100
  // GiB: rows of 64 layers x 1024 slots x 16 KiB records, 1 GiB each.
  const uint64_t available = ProcField("/proc/meminfo", "MemAvailable") * 1024;
  const uint32_t rows = static_cast<uint32_t>(std::clamp<uint64_t>(available / 2 / kGiB, 1, 100));
  auto d = StartDaemon({"--host-pool-size", "64MiB", "--host-pool-page-size", "16KiB"});  // 16 KiB records
  ASSERT_NE(d, nullptr);
  auto stub = RawStub(d->address());
  const uint64_t before_kb = StatusField(d->pid(), "VmSize");
  auto s = OpenRaw(stub.get(), HostGeometry(rows, 64, 1023, 16384));
  ASSERT_TRUE(s->ok()) << s->status.error_message();
  const uint64_t arena_bytes = s->opened.arena().bytes();
  ASSERT_GE(arena_bytes, rows * kGiB);
  const uint64_t after_kb = StatusField(d->pid(), "VmSize");
  std::printf("[ figure   ] daemon VmSize %lu kB -> %lu kB for a %lu-byte host arena\n",
              static_cast<unsigned long>(before_kb), static_cast<unsigned long>(after_kb),
              static_cast<unsigned long>(arena_bytes));
  // A thread stack or a malloc arena may come and go; the arena's size must not.
  EXPECT_LT(after_kb * 1024, before_kb * 1024 + arena_bytes / 4)
      << "VmSize " << before_kb << " kB -> " << after_kb << " kB with a " << arena_bytes << "-byte arena";

  // The counters the daemon does map are the ones RESOLVE writes: Stats reads the engine's.
  UniqueFd arena = FetchFd(s->opened.fd_socket(), *s, "arena");
  ASSERT_TRUE(arena.valid());
  auto* counters = static_cast<uint64_t*>(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, arena.get(), 0));
  ASSERT_NE(counters, MAP_FAILED);
  counters[0] = 42;  // ArenaCounters::hits
  counters[1] = 7;   // misses
  const v1::StatsResponse stats = Stats(d->address());
  ASSERT_EQ(stats.session_stats_size(), 1);
  EXPECT_EQ(stats.session_stats(0).hits(), 42u);
  EXPECT_EQ(stats.session_stats(0).misses(), 7u);
  ::munmap(counters, 4096);
}

TEST(HostArenaBudgetTest, SessionsPastTheBudgetAreRefusedAndTheDaemonServes) {
  auto d = StartDaemon({"--host-pool-size", "64MiB", "--host-pool-page-size", "16KiB", "--host-pool-slab-size", "4MiB",
                        "--set", "limits.host_arena_bytes=250GiB"});
  ASSERT_NE(d, nullptr);
  auto stub = RawStub(d->address());
  std::vector<std::unique_ptr<RawSession>> held;
  for (int i = 0; i < 2; ++i) {
    held.push_back(OpenRaw(stub.get(), Arena100GiB()));
    ASSERT_TRUE(held.back()->ok()) << held.back()->status.error_message();
  }
  for (int i = 0; i < 20; ++i) {  // a tenant that keeps asking
    auto refused = OpenRaw(stub.get(), Arena100GiB());
    ASSERT_FALSE(refused->ok());
    EXPECT_EQ(refused->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(refused->status.error_message(), HasSubstr("limits.host_arena_bytes"));
    EXPECT_THAT(refused->status.error_message(), HasSubstr(absl::StrCat(" of ", 250 * kGiB, " bytes")));
  }
  v1::StatsResponse stats = Stats(d->address());
  EXPECT_EQ(stats.sessions(), 2u);
  // A closed session gives its bytes back.
  held.pop_back();
  ASSERT_TRUE(WaitUntil([&] { return Stats(d->address()).sessions() == 1u; })) << "the closed session did not end";
  auto again = OpenRaw(stub.get(), Arena100GiB());
  EXPECT_TRUE(again->ok()) << again->status.error_message();
}

TEST(HostArenaBudgetTest, TheBudgetChangesOnReload) {
  char tmpl[] = "/tmp/hisparse-budget-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/hisparsed.yaml";
  std::ofstream(path)
      << "host_pool:\n  size: 64MiB\n  page_size: 16KiB\n  slab_size: 4MiB\nlimits:\n  host_arena_bytes: 150GiB\n";
  auto d = StartDaemon({"--config", path});
  ASSERT_NE(d, nullptr);
  auto stub = RawStub(d->address());
  auto first = OpenRaw(stub.get(), Arena100GiB());
  ASSERT_TRUE(first->ok()) << first->status.error_message();
  auto refused = OpenRaw(stub.get(), Arena100GiB());
  ASSERT_EQ(refused->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  std::ofstream(path)
      << "host_pool:\n  size: 64MiB\n  page_size: 16KiB\n  slab_size: 4MiB\nlimits:\n  host_arena_bytes: 250GiB\n";
  ::kill(d->pid(), SIGHUP);
  std::unique_ptr<RawSession> second;
  // The reload lands a moment after the signal; until then the budget refuses.
  const bool applied = WaitUntil([&] {
    second = OpenRaw(stub.get(), Arena100GiB());
    return second->ok() || second->status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED;
  });
  ASSERT_TRUE(second->ok()) << (applied ? "" : "the raised budget never applied: ") << second->status.error_message();
  ::unlink(path.c_str());
  ::rmdir(tmpl);
}

// The attack on the default config: sessions of legal ~0.9 TiB host arenas used to be
// accepted until the daemon's 128 TiB of address space ran out (138 of them) and it aborted. The
// default budget is the memory the machine has left after the pool, so each is refused at once.
TEST(HostArenaBudgetTest, DefaultBudgetRefusesArenasLargerThanTheMachine) {
  auto d = StartDaemon({"--host-pool-size", "64MiB", "--host-pool-page-size", "16KiB"});  // 16 KiB records
  ASSERT_NE(d, nullptr);
  const uint64_t available = ProcField("/proc/meminfo", "MemAvailable") * 1024;
  auto stub = RawStub(d->address());
  const v1::Geometry huge = HostGeometry(922, 64, 1023, 16384);  // 0.9 TiB
  std::vector<std::unique_ptr<RawSession>> held;                 // what was wrongly accepted, open till the end
  for (int i = 0; i < 150; ++i) {
    auto s = OpenRaw(stub.get(), huge);
    if (s->ok()) {
      held.push_back(std::move(s));
      continue;
    }
    ASSERT_EQ(s->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s->status.error_message();
    EXPECT_THAT(s->status.error_message(), HasSubstr("limits.host_arena_bytes"));
  }
  EXPECT_TRUE(held.empty()) << held.size() << " host arenas of " << huge.max_requests()
                            << " GiB accepted on a machine with " << available << " bytes available";
  EXPECT_EQ(Stats(d->address()).sessions(), held.size());
  // Arenas that fit are served as before.
  auto small = OpenRaw(stub.get(), HostGeometry(8, 4, 16, 64));
  EXPECT_TRUE(small->ok()) << small->status.error_message();
}

// ---- 2c. gRPC's threads: idle Session streams beyond the bound are refused, not threaded ----

TEST(GrpcThreadsTest, IdleStreamsPastTheThreadBoundAreRefused) {
  auto d = StartDaemon({"--host-pool-size", "64MiB", "--host-pool-page-size", "16KiB", "--host-pool-slab-size", "4MiB",
                        "--max-sessions", "2"});
  ASSERT_NE(d, nullptr);
  // The bound for 2 sessions (daemon.cc): 2 x 2 + 16.
  constexpr int kBound = 20;
  constexpr int kGrpcCoreThreads = 16;  // gRPC core's threads, which no ResourceQuota bounds
  constexpr int kStreams = 120;
  const uint64_t threads_before = StatusField(d->pid(), "Threads");
  auto stub = RawStub(d->address());
  grpc::CompletionQueue cq;
  struct Call {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientAsyncReaderWriter<v1::SessionRequest, v1::SessionEvent>> rw;
    grpc::Status status;
    bool finished = false;
  };
  std::vector<std::unique_ptr<Call>> calls;
  // Completion tags: slot 2i is call i's start, 2i + 1 its finish.
  std::vector<char> tags(2 * kStreams);
  auto tag = [&tags](size_t i, int kind) { return static_cast<void*>(&tags[i * 2 + kind]); };
  auto slot = [&tags](void* t) { return static_cast<size_t>(static_cast<char*>(t) - tags.data()); };
  for (size_t i = 0; i < kStreams; ++i) {
    calls.push_back(std::make_unique<Call>());
    calls[i]->rw = stub->AsyncSession(&calls[i]->ctx, &cq, tag(i, 0));
  }
  int outstanding = kStreams, exhausted = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (exhausted < kStreams - kBound && Clock::now() < deadline) {
    void* t = nullptr;
    bool ok = false;
    if (cq.AsyncNext(&t, &ok, std::chrono::system_clock::now() + std::chrono::milliseconds(100)) !=
        grpc::CompletionQueue::GOT_EVENT) {
      continue;
    }
    const size_t i = slot(t) / 2;
    if (slot(t) % 2 == 0) {
      calls[i]->rw->Finish(&calls[i]->status, tag(i, 1));
      continue;
    }
    calls[i]->finished = true;
    --outstanding;
    if (calls[i]->status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++exhausted;
  }
  EXPECT_GE(exhausted, kStreams - kBound);
  // gRPC's sync-server threads are the ones a stream holds; gRPC core's own few (executor,
  // timers, pollers of the event engine) start with the first connection and stay bounded.
  const int sync_threads = ThreadsNamed(d->pid(), "grpcpp_sync_ser");
  EXPECT_LE(sync_threads, kBound) << "gRPC server threads with " << kStreams << " idle streams";
  const uint64_t threads_held = StatusField(d->pid(), "Threads");
  std::printf(
      "[ figure   ] %d idle streams: %d refused RESOURCE_EXHAUSTED, %d gRPC server threads, threads %lu -> %lu\n",
      kStreams, exhausted, sync_threads, static_cast<unsigned long>(threads_before),
      static_cast<unsigned long>(threads_held));
  EXPECT_LE(threads_held, threads_before + kBound + kGrpcCoreThreads)
      << "threads " << threads_before << " -> " << threads_held;
  // Let the held streams go, and the daemon serves again.
  for (auto& c : calls) {
    if (!c->finished) c->ctx.TryCancel();
  }
  while (outstanding > 0) {
    void* t = nullptr;
    bool ok = false;
    ASSERT_TRUE(cq.Next(&t, &ok));
    const size_t i = slot(t) / 2;
    if (slot(t) % 2 == 0) {
      calls[i]->rw->Finish(&calls[i]->status, tag(i, 1));
    } else {
      calls[i]->finished = true;
      --outstanding;
    }
  }
  cq.Shutdown();
  void* t = nullptr;
  bool ok = false;
  while (cq.Next(&t, &ok)) {
  }
  std::string last_error;
  EXPECT_TRUE(WaitUntil([&] {  // the cancelled handlers return a moment later
    auto s = OpenRaw(stub.get(), HostGeometry(8, 4, 16, 64));
    last_error = s->status.error_message();
    return s->ok();
  })) << last_error;
}

// ---- 2d. retired slabs an engine kept (issue 39, item 1) ----
// The attack: open, admit the tenant's whole quota, fetch and write every slab, close, keeping
// every descriptor. Before the fix each cycle pinned a quota's worth of memory in the kept
// memfds, charged to the daemon's cgroup and counted nowhere (8 cycles: 256 MiB with a 32 MiB
// quota). Now each retired slab is punched out of its memfd: the kept descriptors hold nothing.
// HISPARSE_RETIRED_CYCLES sets the cycles (default 8).

uint64_t AllocatedBytes(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

void KeptDescriptorsPinNothing(const std::string& hugepages) {
  const char* env = std::getenv("HISPARSE_RETIRED_CYCLES");
  const int cycles = env != nullptr ? std::max(1, std::atoi(env)) : 8;
  constexpr uint64_t kQuota = 32 * kMiB;
  auto d = StartDaemon({"--host-pool-size", "64MiB", "--host-pool-page-size", "2MiB", "--host-pool-slab-size", "16MiB",
                        "--hugepages", hugepages, "--set", "quotas.host_bytes=32MiB"});
  ASSERT_NE(d, nullptr);
  auto stub = RawStub(d->address());
  const uint64_t shmem_before_kb = ProcField("/proc/meminfo", "Shmem");
  std::vector<UniqueFd> kept;
  for (int cycle = 0; cycle < cycles; ++cycle) {
    auto s = OpenRaw(stub.get(), HostGeometry(4, 1, 16, 64));
    ASSERT_TRUE(s->ok()) << s->status.error_message();
    grpc::ClientContext ctx;
    v1::AdmitRequest req;
    *req.mutable_session() = s->ref();
    req.set_request_id(1);
    req.set_token_budget(static_cast<uint32_t>(kQuota / 64));  // the whole quota, 64-byte records
    v1::AdmitResponse admitted;
    const grpc::Status st = stub->Admit(&ctx, req, &admitted);
    ASSERT_TRUE(st.ok()) << "cycle " << cycle << ": " << st.error_message();
    std::vector<uint64_t> slabs;
    for (const auto& p : admitted.layers(0).pages()) {
      if (std::find(slabs.begin(), slabs.end(), p.slab()) == slabs.end()) slabs.push_back(p.slab());
    }
    for (uint64_t slab : slabs) {
      kept.push_back(FetchFd(s->opened.fd_socket(), *s, absl::StrCat("slab ", slab)));
      ASSERT_TRUE(kept.back().valid());
      const size_t bytes = static_cast<size_t>(::lseek(kept.back().get(), 0, SEEK_END));
      void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, kept.back().get(), 0);
      ASSERT_NE(map, MAP_FAILED);
      std::memset(map, 0x5a, bytes);  // the engine's records
      ::munmap(map, bytes);
    }
    s.reset();  // the session ends; the descriptors stay with the "engine"
    // Until its punch a retired slab counts against the tenant: the next cycle waits it out.
    ASSERT_TRUE(WaitUntil([&] {
      const v1::StatsResponse stats = Stats(d->address());
      return stats.sessions() == 0 && stats.host_pool().retired_bytes() == 0;
    })) << "cycle "
        << cycle << ": the session did not end or its slabs were not freed";
  }
  uint64_t pinned = 0;
  for (const UniqueFd& fd : kept) pinned += AllocatedBytes(fd.get());
  const uint64_t shmem_after_kb = ProcField("/proc/meminfo", "Shmem");
  std::printf("[ figure   ] %d cycles, %zu kept slab descriptors: %lu bytes pinned; Shmem %lu kB -> %lu kB\n", cycles,
              kept.size(), static_cast<unsigned long>(pinned), static_cast<unsigned long>(shmem_before_kb),
              static_cast<unsigned long>(shmem_after_kb));
  EXPECT_EQ(pinned, 0u) << kept.size() << " kept descriptors pin " << pinned << " bytes (quota " << kQuota << ")";
  const v1::StatsResponse stats = Stats(d->address());
  EXPECT_EQ(stats.host_pool().used_bytes(), 0u);
  EXPECT_EQ(stats.host_pool().retired_slabs(), 0u);
  // Still serving, the quota whole again.
  auto s = OpenRaw(stub.get(), HostGeometry(4, 1, 16, 64));
  ASSERT_TRUE(s->ok()) << s->status.error_message();
}

TEST(RetiredSlabTest, KeptDescriptorsOfRetiredSlabsPinNothing) { KeptDescriptorsPinNothing("off"); }

TEST(RetiredSlabTest, KeptDescriptorsOfRetiredHugetlbSlabsPinNothing) {
  // 64 MiB of pool on 2 MiB pages, with room for the start-up probe.
  if (FreeHugePages() < 48) GTEST_SKIP() << "fewer than 48 free huge pages (vm.nr_hugepages) on this host";
  KeptDescriptorsPinNothing("on");
}

// ---- 2e. more adoptable requests than one page of ListAdoptable (issue 39, item 8) ----
// The daemon answers ListAdoptable a page at a time (at most 10000); the client library follows
// the pages, so hs_list_adoptable still returns every orphaned request, in order, exactly once.

TEST(ListAdoptablePagesTest, TheClientLibraryReturnsEveryPage) {
  constexpr uint32_t kSessions = 3, kPerSession = 3400;  // 10200: two of the daemon's pages
  auto d = StartDaemon({"--host-pool-size", "64MiB", "--host-pool-page-size", "4KiB", "--host-pool-slab-size", "4MiB"});
  ASSERT_NE(d, nullptr);
  auto stub = RawStub(d->address());
  for (uint32_t i = 0; i < kSessions; ++i) {
    auto s = OpenRaw(stub.get(), HostGeometry(4096, 1, 16, 64));
    ASSERT_TRUE(s->ok()) << s->status.error_message();
    for (uint32_t first = 1; first <= kPerSession; first += 1024) {
      v1::AdmitBatchRequest req;
      *req.mutable_session() = s->ref();
      req.set_mode(v1::BATCH_MODE_ALL_OR_NOTHING);
      for (uint32_t id = first; id < first + 1024 && id <= kPerSession; ++id) {
        v1::AdmitItem* item = req.add_items();
        item->set_request_id(id);
        item->set_token_budget(1);
        item->set_lease_seconds(600);
      }
      grpc::ClientContext ctx;
      v1::AdmitBatchResponse resp;
      const grpc::Status st = stub->AdmitBatch(&ctx, req, &resp);
      ASSERT_TRUE(st.ok()) << st.error_message();
      ASSERT_EQ(resp.admitted(), static_cast<uint32_t>(req.items_size()));
    }
    s.reset();  // ends: its durable requests become an orphan
  }
  ASSERT_TRUE(WaitUntil([&] { return Stats(d->address()).orphaned_requests() == kSessions * kPerSession; }));
  hs_session_options o = HS_SESSION_OPTIONS_INIT;
  o.daemon_address = d->address().c_str();
  o.engine_name = "hardening-test";  // OpenRaw's: the orphans' engine
  o.num_layers = 1;
  o.record_bytes = 64;
  o.k = 8;
  o.slots = 16;
  o.max_requests = 4;
  o.backend = HS_BACKEND_HOST;
  Session next;
  ASSERT_TRUE(Session::Open(o, &next).ok());
  std::vector<uint64_t> dead(kSessions * kPerSession + 1), ids(dead.size());
  size_t count = 0;
  ASSERT_EQ(hs_list_adoptable(next.get(), dead.data(), ids.data(), nullptr, dead.size(), &count), HS_OK)
      << hs_last_error();
  ASSERT_EQ(count, size_t{kSessions} * kPerSession);
  for (size_t i = 1; i < count; ++i) {
    ASSERT_TRUE(dead[i - 1] < dead[i] || (dead[i - 1] == dead[i] && ids[i - 1] < ids[i])) << "entry " << i;
  }
}

// ---- 3 and 4: processes that must not start ----

// hisparsed with `args`, its stderr in a file; waits (bounded) for it to exit or to serve.
struct Child {
  pid_t pid = -1;
  std::string err_path;
  std::optional<int> status;  // set once it exited
  long max_rss_kb = 0;

  static Child Spawn(const std::vector<std::string>& args, const std::string& err_path) {
    Child c;
    c.err_path = err_path;
    auto binary = FindDaemonBinary();
    EXPECT_TRUE(binary.ok()) << binary.status();
    std::vector<std::string> full = {binary.value_or("hisparsed"), "--metrics-listen", "", "--log-level", "info"};
    full.insert(full.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : full) argv.push_back(a.data());
    argv.push_back(nullptr);
    c.pid = ::fork();
    if (c.pid == 0) {
      const int fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, STDERR_FILENO);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    return c;
  }
  // True once exited within `seconds` (0: has it exited?).
  bool WaitExit(int seconds) {
    int st = 0;
    rusage ru{};
    if (pid <= 0) return status.has_value();  // reaped already
    if (!WaitForChildExit(pid, seconds * 1000, &st, &ru)) return false;
    status = st;
    max_rss_kb = ru.ru_maxrss;
    pid = -1;
    return true;
  }
  void Kill(int sig) {
    if (pid <= 0) return;
    ::kill(pid, sig);
    int st = 0;
    ::waitpid(pid, &st, 0);
    status = st;
    pid = -1;
  }
  std::string Stderr() const {
    std::ifstream in(err_path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  ~Child() { Kill(SIGKILL); }
};

bool Serves(const std::string& address) {
  auto stub = RawStub(address);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::StatsResponse r;
  return stub->Stats(&ctx, v1::StatsRequest(), &r).ok();
}

TEST(SocketLockTest, ASecondDaemonOnTheSamePathRefusesAndTheFirstServes) {
  auto first = StartDaemon();
  ASSERT_NE(first, nullptr);
  const std::string dir = first->socket_path().substr(0, first->socket_path().rfind('/'));
  const std::vector<std::string> args = {"--listen",
                                         first->address(),
                                         "--host-pool-size",
                                         "64MiB",
                                         "--host-pool-page-size",
                                         "16KiB",
                                         "--host-pool-slab-size",
                                         "4MiB"};
  Child second = Child::Spawn(args, dir + "/second.err");
  ASSERT_TRUE(second.WaitExit(30)) << "a second daemon on " << first->address() << " kept running: " << second.Stderr();
  ASSERT_TRUE(WIFEXITED(*second.status));
  EXPECT_NE(WEXITSTATUS(*second.status), 0);
  EXPECT_THAT(second.Stderr(), HasSubstr(absl::StrCat("another hisparsed (pid ", first->pid(), ")")));
  EXPECT_TRUE(Serves(first->address()));
  // The first one's sockets are its own still: a session opens and fetches its arena.
  auto stub = RawStub(first->address());
  auto s = OpenRaw(stub.get(), HostGeometry(8, 4, 16, 64));
  ASSERT_TRUE(s->ok()) << s->status.error_message();
  EXPECT_TRUE(FetchFd(s->opened.fd_socket(), *s, "arena").valid());
  s.reset();

  // kill -9 leaves the lock file behind; the next daemon starts regardless.
  const std::string address = first->address();
  first->Signal(SIGKILL);
  EXPECT_EQ(::access((dir + "/hisparsed.sock.lock").c_str(), F_OK), 0);
  Child third = Child::Spawn(args, dir + "/third.err");
  bool serving = false;
  WaitUntil([&] { return (serving = Serves(address)) || third.WaitExit(0); });
  EXPECT_TRUE(serving) << third.Stderr();
  third.Kill(SIGTERM);
  ASSERT_TRUE(third.status.has_value());
  EXPECT_TRUE(WIFEXITED(*third.status) && WEXITSTATUS(*third.status) == 0) << third.Stderr();
  EXPECT_NE(::access((dir + "/hisparsed.sock.lock").c_str(), F_OK), 0) << "a clean stop removes its lock file";
  ::unlink((dir + "/second.err").c_str());
  ::unlink((dir + "/third.err").c_str());
}

TEST(StartMemoryTest, APoolOfFourTimesMemAvailableIsRefusedAtOnce) {
  char tmpl[] = "/tmp/hisparse-mem-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const uint64_t available = ProcField("/proc/meminfo", "MemAvailable") * 1024;
  ASSERT_GT(available, 0u);
  const uint64_t pool = (4 * available + kGiB - 1) / kGiB * kGiB;
  Child d = Child::Spawn({"--listen", "unix:" + dir + "/hisparsed.sock", "--host-pool-size", absl::StrCat(pool),
                          "--host-pool-segment-size", "1GiB", "--hugepages", "off"},
                         dir + "/err");
  ASSERT_TRUE(d.WaitExit(120)) << "still starting after 120 s: " << d.Stderr();
  ASSERT_TRUE(WIFEXITED(*d.status)) << "ended by signal " << WTERMSIG(*d.status) << ": " << d.Stderr();
  EXPECT_NE(WEXITSTATUS(*d.status), 0);
  const std::string err = d.Stderr();
  EXPECT_THAT(err, HasSubstr(absl::StrCat("the host pool (host_pool.size, ", pool, " bytes) with the daemon's own ")));
  EXPECT_THAT(err, HasSubstr("MemAvailable"));
  // It never touched the pool: its peak resident memory is a daemon's, not a pool's.
  EXPECT_LT(static_cast<uint64_t>(d.max_rss_kb) * 1024, available / 4) << "peak RSS " << d.max_rss_kb << " kB";
  ::unlink((dir + "/err").c_str());
  ::unlink((dir + "/hisparsed.sock.lock").c_str());
  ::rmdir(dir.c_str());
}

}  // namespace hardening_mem_test
}  // namespace hisparse::testing
