// SessionManager with GPU slot arenas, through a fake GpuArenaAllocator (no GPU needed): per-GPU
// accounting, budget refusal, the fd and size handed out for "arena", counters read for Stats,
// and release of the allocation the moment the session closes.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hisparse/daemon/gpu_arena.h"
#include "hisparse/daemon/session_manager.h"
#include "hisparse/kernels/arena_layout.h"

namespace hisparse {
namespace {

constexpr uint64_t kGranularity = 2ull << 20;

// What the fake allocator has handed out and not yet had back, per GPU: the test's cudaMemGetInfo.
struct FakeGpus {
  std::map<int, uint64_t> live_bytes;
  int live_arenas = 0;
  int allocations = 0;
  bool fail_next = false;
};

// GPU memory stood in for by a memfd (so Export has a real fd), rounded like the VMM allocator.
class FakeArena final : public GpuArena {
 public:
  FakeArena(FakeGpus* gpus, int gpu, uint64_t bytes) : gpus_(gpus), gpu_(gpu), bytes_(bytes) {
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
  std::string kind() const override { return "cuda-vmm"; }
  absl::StatusOr<UniqueFd> Export() const override { return UniqueFd(::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0)); }
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
  UniqueFd fd_;
};

class GpuArenaSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HostPool::Options pool;
    pool.size_bytes = 16ull << 20;
    pool.segment_bytes = 1ull << 20;
    pool.hugepages = HostPool::Hugepages::kOff;
    pool.pretouch_threads = 1;
    auto created = HostPool::Create(pool);
    ASSERT_TRUE(created.ok()) << created.status();
    SessionManager::Options options;
    options.fd_socket_path = "/nonexistent/test.sock.fd";
    options.arena_budget_bytes = 3 * kGranularity;  // three rounded arenas per GPU
    options.device = "cuda";
    options.gpu_arena_allocator = [this](int gpu, uint64_t bytes) -> absl::StatusOr<std::unique_ptr<GpuArena>> {
      ++gpus_.allocations;
      if (gpus_.fail_next) {
        gpus_.fail_next = false;
        return absl::ResourceExhaustedError("fake cuMemCreate: out of memory");
      }
      return std::unique_ptr<GpuArena>(
          new FakeArena(&gpus_, gpu, (bytes + kGranularity - 1) / kGranularity * kGranularity));
    };
    manager_ = std::make_unique<SessionManager>(options, std::move(*created));
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
  std::unique_ptr<SessionManager> manager_;
};

TEST_F(GpuArenaSessionTest, GpuSessionsGetGpuArenasAccountedPerGpu) {
  auto a = manager_->OpenSession(Open(0), 1);
  auto b = manager_->OpenSession(Open(1), 1);
  auto host = manager_->OpenSession(Open(-1), 1);
  ASSERT_TRUE(a.ok() && b.ok() && host.ok());
  EXPECT_EQ(a->arena().kind(), "cuda-vmm");
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
  EXPECT_EQ(bytes, 0u);  // a memfd: fstat tells its size
}

TEST_F(GpuArenaSessionTest, BudgetIsPerGpuAndRefusalAllocatesNothing) {
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(manager_->OpenSession(Open(0), 1).ok()) << i;
  const int before = gpus_.allocations;
  auto refused = manager_->OpenSession(Open(0), 1);
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_EQ(gpus_.allocations, before);
  EXPECT_TRUE(manager_->OpenSession(Open(1), 1).ok());  // GPU 1 has its own budget
  EXPECT_EQ(gpus_.live_bytes[0], 3 * kGranularity);
}

TEST_F(GpuArenaSessionTest, FailedAllocationReturnsTheReservation) {
  gpus_.fail_next = true;
  auto failed = manager_->OpenSession(Open(0), 1);
  EXPECT_TRUE(absl::IsResourceExhausted(failed.status())) << failed.status();
  EXPECT_EQ(manager_->Stats().arena_bytes_by_device().at(0), 0u);
  EXPECT_EQ(manager_->Stats().sessions(), 0u);
}

TEST_F(GpuArenaSessionTest, CloseReleasesTheGpuArenaAtOnce) {
  for (int round = 0; round < 20; ++round) {
    auto s = manager_->OpenSession(Open(0), 1);
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
  auto s = manager_->OpenSession(Open(0), 1);
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

}  // namespace
}  // namespace hisparse
