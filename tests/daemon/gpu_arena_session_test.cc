// SessionManager with GPU slot arenas, through a fake GpuArenaAllocator (no GPU needed): per-GPU
// accounting, budget refusal, the fd and size handed out for "arena", counters read for Stats,
// release of the allocation the moment the session closes, the choice and reporting of the
// sharing kind (cuda-vmm or the cuda-ipc fallback), and the fd channel's typed replies.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hisparse/common/unix_socket.h"
#include "hisparse/daemon/access.h"
#include "hisparse/daemon/fd_server.h"
#include "hisparse/daemon/gpu_arena.h"
#include "hisparse/daemon/session_manager.h"
#include "hisparse/kernels/arena_layout.h"
#include "hisparse/v1/arena_kind.h"

namespace hisparse {
namespace gpu_arena_session_test {

constexpr uint64_t kGranularity = 2ull << 20;

// What the fake allocator has handed out and not yet had back, per GPU: the test's cudaMemGetInfo.
struct FakeGpus {
  std::map<int, uint64_t> live_bytes;
  int live_arenas = 0;
  int allocations = 0;
  bool fail_next = false;
};

// GPU memory stood in for by a memfd (so Export has a real fd), rounded like the VMM allocator.
// As kind "cuda-ipc" it has no fd to give, only a 64-byte handle (the memfd still backs Read).
class FakeArena final : public GpuArena {
 public:
  FakeArena(FakeGpus* gpus, int gpu, uint64_t bytes, std::string kind = kArenaKindVmm)
      : gpus_(gpus), gpu_(gpu), bytes_(bytes), kind_(std::move(kind)) {
    fd_ = UniqueFd(::memfd_create("fake-gpu-arena", MFD_CLOEXEC));
    (void)::ftruncate(fd_.get(), static_cast<off_t>(bytes_));
    gpus_->live_bytes[gpu_] += bytes_;
    ++gpus_->live_arenas;
  }
  ~FakeArena() override {
    gpus_->live_bytes[gpu_] -= bytes_;
    --gpus_->live_arenas;
  }
  int gpu() const override { return gpu_; }
  uint64_t bytes() const override { return bytes_; }
  std::string kind() const override { return kind_; }
  absl::StatusOr<UniqueFd> Export() const override {
    if (kind_ == kArenaKindIpc) return absl::FailedPreconditionError("fake: a cuda-ipc arena has no fd");
    return UniqueFd(::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0));
  }
  absl::StatusOr<std::string> IpcHandle() const override {
    if (kind_ != kArenaKindIpc) return GpuArena::IpcHandle();
    std::string h(64, '\0');
    for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<char>(gpu_ * 64 + i);
    return h;
  }
  absl::Status Read(uint64_t offset, void* dst, size_t n) const override {
    if (::pread(fd_.get(), dst, n, static_cast<off_t>(offset)) != static_cast<ssize_t>(n)) {
      return absl::InternalError("pread");
    }
    return absl::OkStatus();
  }
  int fd() const { return fd_.get(); }

 private:
  FakeGpus* gpus_;
  int gpu_;
  uint64_t bytes_;
  std::string kind_;
  UniqueFd fd_;
};

class GpuArenaSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PagePool::Options pool;
    pool.budget_bytes = 16ull << 20;
    pool.page_bytes = 64ull << 10;
    pool.slab_bytes = 1ull << 20;
    pool.reserve_slabs = 0;
    pool.hugepages = PagePool::Hugepages::kOff;
    pool.pretouch_threads = 1;
    auto created = PagePool::Create(pool);
    ASSERT_TRUE(created.ok()) << created.status();
    SessionManager::Options options;
    options.fd_socket_path = "/nonexistent/test.sock.fd";
    options.arena_budget_bytes = 3 * kGranularity;  // three rounded arenas per GPU
    options.device = DeviceKind::kCuda;
    options.gpu_uuids = {Uuid(0), Uuid(1)};  // the daemon's GPUs 0 and 1
    options.gpu_arena_allocator = [this](int gpu, uint64_t bytes) -> absl::StatusOr<std::unique_ptr<GpuArena>> {
      ++gpus_.allocations;
      if (gpus_.fail_next) {
        gpus_.fail_next = false;
        return absl::ResourceExhaustedError("fake cuMemCreate: out of memory");
      }
      // The kind is chosen as the CUDA allocator chooses it, from gpu.arena_export and the GPU's
      // (here: pretended) VMM fd-export support.
      absl::StatusOr<std::string> kind = ChooseArenaKind(export_mode_, !no_vmm_fd_.count(gpu), gpu);
      if (!kind.ok()) return kind.status();
      return std::unique_ptr<GpuArena>(
          new FakeArena(&gpus_, gpu, (bytes + kGranularity - 1) / kGranularity * kGranularity, *kind));
    };
    manager_ = std::make_unique<SessionManager>(options, std::move(*created));
  }

  // A fake GPU UUID: 16 bytes, all `n` but the first.
  static std::string Uuid(int n) {
    std::string u(16, static_cast<char>(n));
    u[0] = '\x5a';
    return u;
  }

  static v1::OpenSession Open(int gpu) {
    v1::OpenSession open;
    v1::Geometry* g = open.mutable_geometry();
    g->set_gpu(gpu);
    g->set_num_layers(2);
    g->set_record_bytes(64);
    g->set_k(4);
    g->set_slots(8);
    g->set_max_requests(4);
    open.set_engine_name("test");
    return open;
  }
  PeerCredentials Me() const { return PeerCredentials{::getpid(), ::getuid(), ::getgid()}; }

  FakeGpus gpus_;
  ArenaExport export_mode_ = ArenaExport::kAuto;
  std::set<int> no_vmm_fd_;  // GPUs that pretend to lack VMM POSIX-fd export
  std::unique_ptr<SessionManager> manager_;
};

TEST_F(GpuArenaSessionTest, GpuSessionsGetGpuArenasAccountedPerGpu) {
  auto a = manager_->OpenSession(Open(0), Me());
  auto b = manager_->OpenSession(Open(1), Me());
  auto host = manager_->OpenSession(Open(-1), Me());
  ASSERT_TRUE(a.ok() && b.ok() && host.ok());
  EXPECT_EQ(a->arena().kind(), "cuda-vmm");
  EXPECT_EQ(a->arena().kind_enum(), v1::ARENA_KIND_CUDA_VMM);
  EXPECT_EQ(host->arena().kind_enum(), v1::ARENA_KIND_HOST);
  EXPECT_EQ(a->arena().bytes(), kGranularity);  // the allocation's rounded size
  EXPECT_EQ(host->arena().kind(), "host");
  EXPECT_EQ(gpus_.live_bytes[0], kGranularity);
  EXPECT_EQ(gpus_.live_bytes[1], kGranularity);
  EXPECT_EQ(gpus_.allocations, 2);  // gpu = -1 never asks the GPU allocator

  const v1::StatsResponse st = manager_->Stats();
  EXPECT_EQ(st.arena_bytes_by_device().at(0), kGranularity);
  EXPECT_EQ(st.arena_bytes_by_device().at(1), kGranularity);
  EXPECT_LT(st.arena_bytes_by_device().at(-1), kGranularity);

  // The fd channel hands out the GPU arena's fd with the allocation's size.
  uint64_t bytes = 0;
  auto fd = manager_->DupFdFor(a->session_id(), a->token(), "arena", Me(), &bytes);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(bytes, kGranularity);
  EXPECT_TRUE(fd->valid());
  auto host_fd = manager_->DupFdFor(host->session_id(), host->token(), "arena", Me(), &bytes);
  ASSERT_TRUE(host_fd.ok());
  // A memfd's size, as fstat tells it (the arena says it, as a GPU arena does).
  auto host_size = FileSize(host_fd->get());
  ASSERT_TRUE(host_size.ok());
  EXPECT_EQ(bytes, *host_size);
  EXPECT_EQ(bytes, host->arena().bytes());
}

TEST_F(GpuArenaSessionTest, BudgetIsPerGpuAndRefusalAllocatesNothing) {
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(manager_->OpenSession(Open(0), Me()).ok()) << i;
  const int before = gpus_.allocations;
  auto refused = manager_->OpenSession(Open(0), Me());
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_EQ(gpus_.allocations, before);
  EXPECT_TRUE(manager_->OpenSession(Open(1), Me()).ok());  // GPU 1 has its own budget
  EXPECT_EQ(gpus_.live_bytes[0], 3 * kGranularity);
}

TEST_F(GpuArenaSessionTest, FailedAllocationReturnsTheReservation) {
  gpus_.fail_next = true;
  auto failed = manager_->OpenSession(Open(0), Me());
  EXPECT_TRUE(absl::IsResourceExhausted(failed.status())) << failed.status();
  EXPECT_EQ(manager_->Stats().arena_bytes_by_device().at(0), 0u);
  EXPECT_EQ(manager_->Stats().sessions(), 0u);
}

// An engine pod given the node's second GPU calls it 0 (the device plugin's view), while the daemon,
// seeing every GPU, calls it 1: the UUID the engine sends decides, so the arena is made on the
// GPU the engine runs on and counts against that GPU's budget.
TEST_F(GpuArenaSessionTest, AnEnginesGpuUuidPicksTheDaemonsGpu) {
  v1::OpenSession open = Open(0);
  open.mutable_geometry()->set_gpu_uuid(Uuid(1));
  auto s = manager_->OpenSession(open, Me());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(gpus_.live_bytes[1], kGranularity);
  EXPECT_EQ(gpus_.live_bytes[0], 0u);
  EXPECT_EQ(manager_->Stats().arena_bytes_by_device().at(1), kGranularity);
  manager_->CloseSession(s->session_id());
  EXPECT_EQ(gpus_.live_bytes[1], 0u);
  EXPECT_EQ(manager_->Stats().arena_bytes_by_device().at(1), 0u);

  // A GPU this daemon does not see: refused, naming it, and nothing allocated.
  const int before = gpus_.allocations;
  open.mutable_geometry()->set_gpu_uuid(std::string(16, '\x7f'));
  auto unknown = manager_->OpenSession(open, Me());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kFailedPrecondition) << unknown.status();
  EXPECT_NE(unknown.status().message().find("GPU-7f7f7f7f-7f7f-7f7f-7f7f-7f7f7f7f7f7f"), std::string::npos)
      << unknown.status();
  EXPECT_EQ(gpus_.allocations, before);
  // Not a UUID at all.
  open.mutable_geometry()->set_gpu_uuid("short");
  EXPECT_EQ(manager_->OpenSession(open, Me()).status().code(), absl::StatusCode::kInvalidArgument);
  // A host session's UUID means nothing: it gets a host arena as before.
  v1::OpenSession host = Open(-1);
  host.mutable_geometry()->set_gpu_uuid(Uuid(1));
  auto h = manager_->OpenSession(host, Me());
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->arena().kind_enum(), v1::ARENA_KIND_HOST);
  EXPECT_EQ(gpus_.allocations, before);
}

TEST_F(GpuArenaSessionTest, CloseReleasesTheGpuArenaAtOnce) {
  for (int round = 0; round < 20; ++round) {
    auto s = manager_->OpenSession(Open(0), Me());
    ASSERT_TRUE(s.ok()) << s.status();
    auto fd = manager_->DupFdFor(s->session_id(), s->token(), "arena", Me());
    ASSERT_TRUE(fd.ok());
    EXPECT_EQ(gpus_.live_arenas, 1);
    manager_->CloseSession(s->session_id());
    EXPECT_EQ(gpus_.live_arenas, 0) << "round " << round;
    EXPECT_EQ(gpus_.live_bytes[0], 0u);
    EXPECT_EQ(manager_->Stats().arena_bytes_by_device().at(0), 0u);
  }
}

TEST_F(GpuArenaSessionTest, StatsReadCountersFromTheGpuArena) {
  auto s = manager_->OpenSession(Open(0), Me());
  ASSERT_TRUE(s.ok());
  auto fd = manager_->DupFdFor(s->session_id(), s->token(), "arena", Me());
  ASSERT_TRUE(fd.ok());
  // What RESOLVE's atomics would leave at the arena's counters.
  ArenaCounters c{};
  c.hits = 11;
  c.misses = 7;
  c.bytes_fetched = 7 * 64;
  ASSERT_EQ(::pwrite(fd->get(), &c, sizeof(c), 0), static_cast<ssize_t>(sizeof(c)));
  const v1::StatsResponse st = manager_->Stats();
  ASSERT_EQ(st.session_stats_size(), 1);
  EXPECT_EQ(st.session_stats(0).hits(), 11u);
  EXPECT_EQ(st.session_stats(0).misses(), 7u);
  EXPECT_EQ(st.session_stats(0).bytes_fetched(), 7u * 64);
  EXPECT_EQ(st.session_stats(0).arena_bytes(), kGranularity);
}

TEST(ChooseArenaKindTest, AutoPrefersVmmAndFallsBackToCudaIpc) {
  EXPECT_EQ(*ChooseArenaKind(ArenaExport::kAuto, true, 0), "cuda-vmm");
  EXPECT_EQ(*ChooseArenaKind(ArenaExport::kAuto, false, 0), "cuda-ipc");
  EXPECT_EQ(*ChooseArenaKind(ArenaExport::kCudaIpc, true, 0), "cuda-ipc");
  EXPECT_EQ(*ChooseArenaKind(ArenaExport::kCudaIpc, false, 0), "cuda-ipc");
  EXPECT_EQ(*ChooseArenaKind(ArenaExport::kVmm, true, 0), "cuda-vmm");
  const absl::StatusOr<std::string> refused = ChooseArenaKind(ArenaExport::kVmm, false, 3);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("GPU 3"));
}

TEST_F(GpuArenaSessionTest, AutoFallsBackToCudaIpcAndReportsIt) {
  no_vmm_fd_ = {1};
  auto vmm = manager_->OpenSession(Open(0), Me());
  auto ipc = manager_->OpenSession(Open(1), Me());
  ASSERT_TRUE(vmm.ok() && ipc.ok());
  EXPECT_EQ(vmm->arena().kind(), "cuda-vmm");
  EXPECT_EQ(ipc->arena().kind(), "cuda-ipc");
  EXPECT_EQ(ipc->arena().kind_enum(), v1::ARENA_KIND_CUDA_IPC);
  EXPECT_EQ(ipc->arena().bytes(), kGranularity);
  EXPECT_GE(ipc->arena().create_seconds(), 0.0);

  // The handle, not an fd; the request form without room for a handle is refused.
  uint64_t bytes = 0;
  std::string handle;
  auto none = manager_->DupFdFor(ipc->session_id(), ipc->token(), "arena", Me(), &bytes, &handle);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->valid());
  EXPECT_EQ(handle.size(), 64u);
  EXPECT_EQ(bytes, kGranularity);
  auto v1 = manager_->DupFdFor(ipc->session_id(), ipc->token(), "arena", Me(), &bytes);
  EXPECT_TRUE(absl::IsFailedPrecondition(v1.status())) << v1.status();
  // A VMM arena still comes as an fd, with no handle, through the same call.
  auto fd = manager_->DupFdFor(vmm->session_id(), vmm->token(), "arena", Me(), &bytes, &handle);
  ASSERT_TRUE(fd.ok());
  EXPECT_TRUE(fd->valid());
  EXPECT_TRUE(handle.empty());
  // Another session's token names nothing here.
  auto cross = manager_->DupFdFor(ipc->session_id(), vmm->token(), "arena", Me(), &bytes, &handle);
  EXPECT_FALSE(cross.ok());

  // Reported per session in Stats (hisparse-ctl sessions prints it).
  const v1::StatsResponse st = manager_->Stats();
  ASSERT_EQ(st.session_stats_size(), 2);
  for (const v1::SessionStats& ss : st.session_stats()) {
    EXPECT_EQ(ss.arena_kind(), ss.session_id() == ipc->session_id() ? "cuda-ipc" : "cuda-vmm");
    EXPECT_EQ(ss.arena_kind_enum(),
              ss.session_id() == ipc->session_id() ? v1::ARENA_KIND_CUDA_IPC : v1::ARENA_KIND_CUDA_VMM);
  }
  // Released on close like any GPU arena.
  manager_->CloseSession(ipc->session_id());
  EXPECT_EQ(gpus_.live_bytes[1], 0u);
  EXPECT_EQ(manager_->Stats().arena_bytes_by_device().at(1), 0u);
}

TEST_F(GpuArenaSessionTest, ForcedModes) {
  export_mode_ = ArenaExport::kCudaIpc;
  auto ipc = manager_->OpenSession(Open(0), Me());
  ASSERT_TRUE(ipc.ok());
  EXPECT_EQ(ipc->arena().kind(), "cuda-ipc");  // forced, though GPU 0 supports VMM fds

  export_mode_ = ArenaExport::kVmm;
  no_vmm_fd_ = {1};
  auto refused = manager_->OpenSession(Open(1), Me());
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_EQ(manager_->Stats().arena_bytes_by_device().at(1), 0u);  // the reservation is returned
  auto host = manager_->OpenSession(Open(-1), Me());               // host arenas are not affected
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(host->arena().kind(), "host");
  EXPECT_EQ(manager_->Stats().session_stats(0).arena_kind().empty(), false);
}

// The fd channel's typed replies (protocol version 2) against a real FdServer on a temporary socket.
TEST_F(GpuArenaSessionTest, FdChannelCarriesFdsAndCudaIpcHandles) {
  no_vmm_fd_ = {1};
  char dir_template[] = "/tmp/hs-fdchan-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string path = std::string(dir_template) + "/fd.sock";
  auto server = FdServer::Start(path, 0600, static_cast<gid_t>(-1), AccessPolicy(), manager_.get());
  ASSERT_TRUE(server.ok()) << server.status();
  auto vmm = manager_->OpenSession(Open(0), Me());
  auto ipc = manager_->OpenSession(Open(1), Me());
  ASSERT_TRUE(vmm.ok() && ipc.ok());
  auto conn = ConnectUnixSeqpacket(path);
  ASSERT_TRUE(conn.ok()) << conn.status();
  auto ask = [&](const std::string& request) {
    EXPECT_TRUE(SendPacket(conn->get(), request, -1).ok());
    auto reply = RecvPacket(conn->get(), 1024);
    EXPECT_TRUE(reply.ok());
    return reply.ok() ? std::move(*reply) : Packet{};
  };
  const std::string ipc_ref = absl::StrCat(ipc->session_id(), " ", ipc->token(), " arena");
  const std::string vmm_ref = absl::StrCat(vmm->session_id(), " ", vmm->token(), " arena");

  Packet r = ask("HSFD2 " + ipc_ref);
  std::string hex;
  for (int i = 0; i < 64; ++i) hex += absl::StrFormat("%02x", 64 + i);  // the fake's handle on GPU 1
  EXPECT_EQ(r.payload, absl::StrCat("OK cuda-ipc ", kGranularity, " ", hex));
  EXPECT_FALSE(r.fd.valid());
  r = ask("HSFD1 " + ipc_ref);
  EXPECT_THAT(r.payload, ::testing::StartsWith("ERR FAILED_PRECONDITION"));
  EXPECT_FALSE(r.fd.valid());
  r = ask("HSFD2 " + vmm_ref);
  EXPECT_EQ(r.payload, absl::StrCat("OK fd ", kGranularity));
  EXPECT_TRUE(r.fd.valid());
  r = ask("HSFD1 " + vmm_ref);
  EXPECT_EQ(r.payload, absl::StrCat("OK ", kGranularity));
  EXPECT_TRUE(r.fd.valid());
  // One session's token opens nothing of another's.
  r = ask(absl::StrCat("HSFD2 ", ipc->session_id(), " ", vmm->token(), " arena"));
  EXPECT_THAT(r.payload, ::testing::StartsWith("ERR "));
  EXPECT_FALSE(r.fd.valid());
  conn->Reset();
  (*server)->Stop();
  ::unlink(path.c_str());
  ::rmdir(dir_template);
}

// The kind's one mapping (hisparse/v1/arena_kind.h): both fields filled for old and new peers,
// and a client reading a daemon older than the enum falls back to the string.
TEST(ArenaKindTest, EnumAndOldStringAgree) {
  for (v1::ArenaKind k : {v1::ARENA_KIND_HOST, v1::ARENA_KIND_CUDA_VMM, v1::ARENA_KIND_CUDA_IPC}) {
    v1::ArenaInfo info;
    v1::SetArenaKind(k, &info);
    EXPECT_EQ(info.kind_enum(), k);
    EXPECT_EQ(v1::ArenaKindFromName(info.kind()), k) << info.kind();
    v1::ArenaInfo old_daemon;
    old_daemon.set_kind(info.kind());  // no kind_enum: a daemon older than the field
    EXPECT_EQ(v1::ArenaKindOf(old_daemon), k);
  }
  v1::ArenaInfo unknown;
  unknown.set_kind("cuda-fabric");
  EXPECT_EQ(v1::ArenaKindOf(unknown), v1::ARENA_KIND_UNSPECIFIED);
  EXPECT_STREQ(v1::ArenaKindName(v1::ARENA_KIND_UNSPECIFIED), "");
  v1::ArenaInfo both;
  both.set_kind("host");
  both.set_kind_enum(v1::ARENA_KIND_CUDA_VMM);
  EXPECT_EQ(v1::ArenaKindOf(both), v1::ARENA_KIND_CUDA_VMM);  // new code reads the enum
}

}  // namespace gpu_arena_session_test
}  // namespace hisparse
