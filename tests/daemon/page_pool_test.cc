// PagePool: budget, owner-private slabs sized to the need, the reserve, reference counts, the scrub
// outside the lock, and a property test against a shadow model.
#include "hisparse/daemon/page_pool.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <atomic>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hisparse {
namespace page_pool_test {

using ::testing::HasSubstr;
using Page = PagePool::Page;

constexpr uint64_t kPage = 64 << 10;  // small pages keep the tests' memory small

// The bytes a memfd has allocated (st_blocks).
uint64_t AllocatedBytes(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

PagePool::Options SmallOptions(uint64_t budget_pages, uint32_t slab_pages, uint32_t reserve = 0) {
  PagePool::Options o;
  o.budget_bytes = budget_pages * kPage;
  o.page_bytes = kPage;
  o.slab_bytes = slab_pages * kPage;
  o.reserve_slabs = reserve;
  o.hugepages = PagePool::Hugepages::kOff;
  o.pretouch_threads = 1;
  return o;
}

std::unique_ptr<PagePool> MustCreate(const PagePool::Options& o) {
  absl::StatusOr<std::unique_ptr<PagePool>> pool = PagePool::Create(o);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? *std::move(pool) : nullptr;
}

std::vector<Page> MustAllocate(PagePool& pool, uint64_t owner, uint32_t count, const Page* after = nullptr) {
  absl::StatusOr<std::vector<Page>> pages = pool.Allocate(owner, count, after);
  EXPECT_TRUE(pages.ok()) << pages.status();
  EXPECT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
  if (pages.ok()) {
    EXPECT_EQ(pages->size(), count);
  }
  return pages.value_or(std::vector<Page>{});
}

TEST(PagePoolTest, CreateValidatesSizes) {
  PagePool::Options o = SmallOptions(16, 4);
  o.page_bytes = 1000;
  EXPECT_EQ(PagePool::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = SmallOptions(16, 4);
  o.slab_bytes = kPage * 3 / 2;
  EXPECT_EQ(PagePool::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = SmallOptions(16, 4);
  o.budget_bytes = kPage - 1;
  EXPECT_EQ(PagePool::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = SmallOptions(16, 4);
  o.hugepages = PagePool::Hugepages::kOn;  // 64 KiB pages cannot be huge pages
  EXPECT_EQ(PagePool::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PagePoolTest, BadCallsChangeNothing) {
  auto pool = MustCreate(SmallOptions(16, 4));
  EXPECT_EQ(pool->Allocate(PagePool::kNoOwner, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->Allocate(7, 0).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<Page> mine = MustAllocate(*pool, 7, 2);
  const Page theirs{mine[0].slab, mine[0].index};
  EXPECT_EQ(pool->Allocate(8, 1, &theirs).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->Release(8, mine[0]).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool->AddRef(8, mine[0]).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool->Release(7, Page{mine[0].slab, 1000}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool->Release(7, Page{999, 0}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool->DupSlabFd(8, mine[0].slab).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(pool->DupSlabFd(7, 999).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool->RefCount(mine[0]), 1u);
  EXPECT_EQ(pool->PagesOf(7), 2u);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

// 256 tenants sharing a budget of 512 pages, two pages each: every one fits, in slabs of two
// pages, and the budget is exactly used up.
TEST(PagePoolTest, ManySmallTenantsShareTheBudgetExactly) {
  auto pool = MustCreate(SmallOptions(512, 32, /*reserve=*/2));
  pool->WaitIdle();
  for (uint64_t owner = 1; owner <= 256; ++owner) {
    std::vector<Page> pages = MustAllocate(*pool, owner, 2);
    ASSERT_EQ(pages.size(), 2u) << "owner " << owner;
    EXPECT_EQ(pool->SlabsOf(owner), 1u);
    EXPECT_EQ(pages[0].slab, pages[1].slab);
  }
  const PagePool::Stats st = pool->GetStats();
  EXPECT_EQ(st.pages_used, 512u);
  EXPECT_EQ(st.pages_free, 0u);
  EXPECT_EQ(st.owned_bytes, 512 * kPage);
  EXPECT_EQ(st.unallocated_bytes, 0u);
  EXPECT_EQ(st.ready_slabs, 0u);  // the reserve gave its budget back to the small slabs
  EXPECT_EQ(st.owners, 256u);
  absl::StatusOr<std::vector<Page>> more = pool->Allocate(1, 1);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(more.status().message()), HasSubstr("host_pool.size"));
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

TEST(PagePoolTest, AGrowingOwnerDoublesItsSlabsUpToFullSize) {
  auto pool = MustCreate(SmallOptions(1024, 32));
  for (int i = 0; i < 200; ++i) MustAllocate(*pool, 5, 1);
  // 1 + 1 + 2 + 4 + 8 + 16 = 32 pages in six slabs, then full slabs of 32.
  EXPECT_EQ(pool->SlabsOf(5), 6u + (200 - 32 + 31) / 32);
  EXPECT_EQ(pool->PagesOf(5), 200u);
  const PagePool::Stats st = pool->GetStats();
  EXPECT_LT(st.pages_free, 32u);
}

// A fragmented owner's next allocation fills the slab with the most free pages first, so its
// pages land in the fewest slabs (the GPU's fetch cares about slabs, not pages).
TEST(PagePoolTest, AllocationsFillTheFewestSlabs) {
  auto pool = MustCreate(SmallOptions(64, 8));
  std::vector<Page> a = MustAllocate(*pool, 7, 8);  // slab A, full
  std::vector<Page> b = MustAllocate(*pool, 7, 8);  // slab B, full
  ASSERT_NE(a[0].slab, b[0].slab);
  // Free 2 pages of A and 6 of B: the next 5 pages fit in B alone.
  ASSERT_TRUE(pool->Release(7, a[1]).ok());
  ASSERT_TRUE(pool->Release(7, a[5]).ok());
  for (int i : {0, 2, 3, 4, 6, 7}) ASSERT_TRUE(pool->Release(7, b[i]).ok());
  std::vector<Page> c = MustAllocate(*pool, 7, 5);
  for (const Page& p : c) EXPECT_EQ(p.slab, b[0].slab);
  // 3 more: A's two free pages (now the most), then B's last.
  std::vector<Page> d = MustAllocate(*pool, 7, 3);
  EXPECT_EQ(d[0].slab, a[0].slab);
  EXPECT_EQ(d[1].slab, a[0].slab);
  EXPECT_EQ(d[2].slab, b[0].slab);
}

TEST(PagePoolTest, OneTenantMayUseTheWholeBudget) {
  auto pool = MustCreate(SmallOptions(100, 16, /*reserve=*/2));
  pool->WaitIdle();
  std::vector<Page> all = MustAllocate(*pool, 3, 100);
  EXPECT_EQ(pool->GetStats().unallocated_bytes, 0u);
  EXPECT_EQ(pool->Allocate(4, 1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(pool->ReleaseAll(3, all).ok());
  EXPECT_EQ(pool->GetStats().idle_slabs, pool->SlabsOf(3));  // kept for owner 3, reclaimable
  MustAllocate(*pool, 4, 100);                               // takes their budget
  EXPECT_EQ(pool->SlabsOf(3), 0u);
}

// An owner's empty slabs stay its own, so its next request reuses backed memory; its end, or
// another owner short of budget, retires them.
TEST(PagePoolTest, IdleSlabsAreReusedByTheirOwnerAndReclaimedByOthers) {
  auto pool = MustCreate(SmallOptions(8, 8));
  std::vector<Page> a = MustAllocate(*pool, 1, 4);
  ASSERT_TRUE(pool->ReleaseAll(1, a).ok());
  EXPECT_EQ(pool->SlabsOf(1), 1u);
  EXPECT_EQ(pool->GetStats().idle_slabs, 1u);
  std::vector<Page> again = MustAllocate(*pool, 1, 4);
  EXPECT_EQ(again, a);  // the same pages: no new slab
  EXPECT_EQ(pool->GetStats().idle_slabs, 0u);
  ASSERT_TRUE(pool->ReleaseAll(1, again).ok());
  EXPECT_EQ(pool->ReclaimablePagesFor(2), 4u);
  EXPECT_EQ(pool->ReclaimablePagesFor(1), 0u);
  std::vector<Page> b = MustAllocate(*pool, 2, 8);  // the whole budget: owner 1's idle slab goes
  EXPECT_EQ(pool->SlabsOf(1), 0u);
  ASSERT_TRUE(pool->ReleaseAll(2, b).ok());
  pool->RetireIdleOf(2);
  EXPECT_EQ(pool->SlabsOf(2), 0u);
  EXPECT_EQ(pool->DupSlabFd(2, b[0].slab).status().code(), absl::StatusCode::kNotFound);
  pool->WaitIdle();
  EXPECT_EQ(pool->GetStats().unallocated_bytes, pool->GetStats().budget_bytes);
}

// A slab handed to an engine (DupSlabFd with a tenant) that leaves its owner is a departure, for
// the daemon to tell the engine (SlabRetired), which may keep it mapped while idle; one never
// handed out is not (no engine maps it).
TEST(PagePoolTest, SlabsHandedToAnEngineThatLeaveTheirOwnerAreDepartures) {
  auto pool = MustCreate(SmallOptions(8, 4));
  std::vector<Page> a = MustAllocate(*pool, 1, 4);  // one slab, handed to owner 1's engine
  std::vector<Page> b = MustAllocate(*pool, 3, 2);  // one slab, never handed out
  ASSERT_TRUE(pool->DupSlabFd(1, a[0].slab, nullptr, /*tenant=*/1000).ok());
  EXPECT_FALSE(pool->HasDepartures());
  ASSERT_TRUE(pool->ReleaseAll(1, a).ok());
  ASSERT_TRUE(pool->ReleaseAll(3, b).ok());
  EXPECT_FALSE(pool->HasDepartures()) << "idle slabs stay their owners'";
  std::vector<Page> c = MustAllocate(*pool, 2, 8);  // the whole budget: both idle slabs go
  EXPECT_EQ(pool->SlabsOf(1), 0u);
  EXPECT_EQ(pool->SlabsOf(3), 0u);
  ASSERT_TRUE(pool->HasDepartures());
  std::vector<PagePool::Departure> left = pool->TakeDepartures();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].owner, 1u);
  EXPECT_EQ(left[0].slab, a[0].slab);
  EXPECT_FALSE(pool->HasDepartures());
  EXPECT_TRUE(pool->TakeDepartures().empty());
  // RetireIdleOf (a session's end) is one too.
  ASSERT_TRUE(pool->DupSlabFd(2, c[0].slab, nullptr, /*tenant=*/1000).ok());
  ASSERT_TRUE(pool->ReleaseAll(2, c).ok());
  pool->RetireIdleOf(2);
  left = pool->TakeDepartures();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].owner, 2u);
  EXPECT_EQ(left[0].slab, c[0].slab);
  pool->WaitIdle();
}

TEST(PagePoolTest, AFullSlabComesFromTheReserveWhichRefills) {
  auto pool = MustCreate(SmallOptions(64, 16, /*reserve=*/2));
  pool->WaitIdle();
  PagePool::Stats st = pool->GetStats();
  EXPECT_EQ(st.ready_slabs, 2u);
  EXPECT_EQ(st.pages_reserved, 32u);
  EXPECT_EQ(st.slabs_made, 2u);
  const std::vector<Page> pages = MustAllocate(*pool, 9, 16);
  // Taken, not made: the pages are in one of the two reserve slabs (ids 1 and 2, the first made).
  // The stats cannot say so: the worker may have refilled the reserve already (made 3, ready 2,
  // as a slab made on the spot would leave them), which made this test racy.
  ASSERT_FALSE(pages.empty());
  for (const Page& p : pages) EXPECT_LE(p.slab, 2u);
  pool->WaitIdle();
  st = pool->GetStats();
  EXPECT_EQ(st.ready_slabs, 2u);
  EXPECT_EQ(st.slabs_made, 3u);
  EXPECT_EQ(st.owned_bytes + st.ready_bytes + st.unallocated_bytes, st.budget_bytes);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

// Prepare makes what an Allocate of the same count would, and takes nothing: the Allocate after
// it finds the pages free, in the same one slab, and makes none itself.
TEST(PagePoolTest, PrepareMakesTheSlabsAnAllocationThenTakesWithoutMakingAny) {
  auto pool = MustCreate(SmallOptions(64, 16));
  ASSERT_TRUE(pool->Prepare(3, 6).ok());
  EXPECT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants();
  PagePool::Stats st = pool->GetStats();
  EXPECT_EQ(st.pages_used, 0u);
  EXPECT_EQ(pool->FreePagesOf(3), 6u);
  EXPECT_EQ(st.idle_slabs, 1u) << "prepared pages are free: their slab is idle, the owner's";
  EXPECT_EQ(st.slabs_made, 1u);
  EXPECT_TRUE(pool->Prepare(3, 6).ok());  // there already
  EXPECT_TRUE(pool->Prepare(3, 0).ok());
  EXPECT_EQ(pool->GetStats().slabs_made, 1u);
  const std::vector<Page> pages = MustAllocate(*pool, 3, 6);
  for (const Page& p : pages) EXPECT_EQ(p.slab, pages[0].slab);
  st = pool->GetStats();
  EXPECT_EQ(st.slabs_made, 1u);
  EXPECT_EQ(st.slabs_made_inline, 0u);
  EXPECT_EQ(st.pages_used, 6u);
  // Past the budget: refused, nothing changed.
  EXPECT_EQ(pool->Prepare(4, 64).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->Prepare(PagePool::kNoOwner, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->GetStats().slabs, 1u);
  EXPECT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants();
}

// Under SlabsOutsideLocks an allocation that needs a slab made changes nothing and says what it
// wanted; made outside (MakeWant), the same allocation then takes it. Ready slabs are taken as
// before, and a lifted scope makes slabs inline.
TEST(PagePoolTest, UnderSlabsOutsideLocksNoSlabIsMadeInline) {
  auto pool = MustCreate(SmallOptions(64, 16, /*reserve=*/1));
  pool->WaitIdle();
  const PagePool::Stats before = pool->GetStats();
  ASSERT_EQ(before.ready_slabs, 1u);
  PagePool::SlabsOutsideLocks outside;
  absl::StatusOr<std::vector<Page>> wanted = pool->Allocate(5, 3);
  EXPECT_EQ(wanted.status().code(), absl::StatusCode::kUnavailable) << wanted.status();
  PagePool::Stats st = pool->GetStats();
  EXPECT_EQ(st.slabs, before.slabs);
  EXPECT_EQ(st.slabs_made, before.slabs_made);
  EXPECT_EQ(st.ready_slabs, 1u);
  EXPECT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants();
  ASSERT_TRUE(outside.HasWant());
  ASSERT_TRUE(outside.MakeWanted(*pool));
  EXPECT_EQ(outside.made_for(), 5u);
  EXPECT_FALSE(outside.HasWant());
  EXPECT_FALSE(outside.MakeWanted(*pool));
  EXPECT_EQ(pool->FreePagesOf(5), 3u);
  std::vector<Page> three = MustAllocate(*pool, 5, 3);
  EXPECT_FALSE(outside.HasWant());
  // A full slab comes from the reserve: no syscall, so the scope lets it be taken.
  std::vector<Page> full = MustAllocate(*pool, 6, 16);
  EXPECT_FALSE(outside.HasWant());
  EXPECT_EQ(pool->GetStats().slabs_made_inline, 0u);
  // Prepare obeys the scope too; lifted, the scope lets an allocation make its slab.
  EXPECT_EQ(pool->Prepare(7, 2).code(), absl::StatusCode::kUnavailable);
  // A larger want is made in its stead, unless the budget cannot hold it.
  outside.WantedLarger({7, 5});
  ASSERT_TRUE(outside.MakeWanted(*pool));
  EXPECT_EQ(pool->FreePagesOf(7), 5u);
  EXPECT_EQ(pool->Allocate(8, 1).status().code(), absl::StatusCode::kUnavailable);
  outside.WantedLarger({8, 1000});
  ASSERT_TRUE(outside.MakeWanted(*pool));
  EXPECT_EQ(pool->FreePagesOf(8), 1u);
  EXPECT_EQ(pool->Prepare(9, 2).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(outside.HasWant());
  outside.Lift();
  std::vector<Page> two = MustAllocate(*pool, 9, 2);
  EXPECT_EQ(pool->GetStats().slabs_made_inline, 1u);
  EXPECT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants();
}

TEST(PagePoolTest, AfterContinuesALayerInPlace) {
  auto pool = MustCreate(SmallOptions(64, 16));
  std::vector<Page> a = MustAllocate(*pool, 2, 8);
  std::vector<Page> b = MustAllocate(*pool, 2, 4);  // pages 8..11 of a doubled slab, or a new one
  ASSERT_TRUE(pool->ReleaseAll(2, std::vector<Page>(a.begin() + 4, a.end())).ok());
  const Page last = a[3];
  std::vector<Page> more = MustAllocate(*pool, 2, 3, &last);
  for (uint32_t i = 0; i < 3; ++i) EXPECT_EQ(more[i], (Page{last.slab, last.index + 1 + i}));
  (void)b;
}

TEST(PagePoolTest, SharedPagesCountReferencesAndTheSlabRetiresAtTheLast) {
  auto pool = MustCreate(SmallOptions(64, 16));
  std::vector<Page> pages = MustAllocate(*pool, 4, 2);
  ASSERT_TRUE(pool->AddRef(4, pages[0]).ok());
  ASSERT_TRUE(pool->AddRef(4, pages[0]).ok());
  EXPECT_EQ(pool->RefCount(pages[0]), 3u);
  EXPECT_EQ(pool->GetStats().pages_shared, 1u);
  ASSERT_TRUE(pool->ReleaseAll(4, pages).ok());
  EXPECT_EQ(pool->RefCount(pages[0]), 2u);
  EXPECT_EQ(pool->RefCount(pages[1]), 0u);
  EXPECT_EQ(pool->SlabsOf(4), 1u);
  ASSERT_TRUE(pool->Release(4, pages[0]).ok());
  EXPECT_EQ(pool->GetStats().pages_shared, 0u);
  ASSERT_TRUE(pool->Release(4, pages[0]).ok());
  EXPECT_EQ(pool->Release(4, pages[0]).code(), absl::StatusCode::kNotFound);  // a double free
  EXPECT_EQ(pool->SlabsOf(4), 1u);                                            // idle, still owner 4's
  pool->RetireIdleOf(4);
  EXPECT_EQ(pool->SlabsOf(4), 0u);
  EXPECT_EQ(pool->DupSlabFd(4, pages[0].slab).status().code(), absl::StatusCode::kNotFound);
  pool->WaitIdle();
  const PagePool::Stats st = pool->GetStats();
  EXPECT_EQ(st.scrub_queue, 0u);
  EXPECT_EQ(st.slabs_scrubbed, 1u);
  EXPECT_EQ(st.owned_bytes, 0u);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

// A released slab's memory never reaches the next owner: it is punched out of its memfd (an
// engine that kept it mapped reads zeros, its old bytes freed), and the next owner gets a
// different, zeroed memfd whose writes the old mapping never sees.
TEST(PagePoolTest, MemoryPassingToAnotherOwnerIsScrubbed) {
  auto pool = MustCreate(SmallOptions(2, 2));
  std::vector<Page> a = MustAllocate(*pool, 1, 2);
  uint64_t bytes = 0;
  absl::StatusOr<UniqueFd> fd = pool->DupSlabFd(1, a[0].slab, &bytes);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(bytes, 2 * kPage);
  void* engine = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd->get(), 0);
  ASSERT_NE(engine, MAP_FAILED);
  std::memset(engine, 0xab, bytes);
  ASSERT_TRUE(pool->ReleaseAll(1, a).ok());
  pool->WaitIdle();
  std::vector<Page> b = MustAllocate(*pool, 2, 2);  // the whole budget again
  EXPECT_NE(b[0].slab, a[0].slab);                  // slab ids are never reused
  for (const Page& p : b) {
    const uint8_t* data = pool->PageDataForTest(p);
    ASSERT_NE(data, nullptr);
    for (uint64_t i = 0; i < kPage; i += 4096) ASSERT_EQ(data[i], 0) << "page " << p.index << " byte " << i;
  }
  // The allocation retired the old slab; the worker punches it after Allocate returns (outside
  // every lock), so wait for it. Without the wait this test failed whenever it looked first.
  pool->WaitIdle();
  EXPECT_EQ(AllocatedBytes(fd->get()), 0u);  // freed, though the engine holds and maps it
  std::memset(pool->PageDataForTest(b[0]), 0x11, kPage);
  EXPECT_EQ(static_cast<uint8_t*>(engine)[0], 0);  // the old mapping: its bytes punched, none of b's
  ::munmap(engine, bytes);
}

// A slab handed to a tenant's engine (DupSlabFd with the tenant) counts against that tenant once
// it retires, whole, until the worker's punch frees it; one handed to no tenant is never charged.
TEST(PagePoolTest, ARetiredSlabHandedToATenantIsChargedUntilItsPunch) {
  auto pool = MustCreate(SmallOptions(4, 2));
  std::vector<Page> a = MustAllocate(*pool, 1, 2);
  std::vector<Page> b = MustAllocate(*pool, 2, 2);
  absl::StatusOr<UniqueFd> kept = pool->DupSlabFd(1, a[0].slab, nullptr, 1000);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_TRUE(pool->DupSlabFd(2, b[0].slab).ok());  // the daemon's own use: no tenant
  pool->PauseWorkerForTest(true);
  ASSERT_TRUE(pool->ReleaseAll(1, a).ok());
  ASSERT_TRUE(pool->ReleaseAll(2, b).ok());
  pool->RetireIdleOf(1);
  pool->RetireIdleOf(2);
  EXPECT_EQ(pool->RetiredOf(1000).bytes, 2 * kPage);
  EXPECT_EQ(pool->RetiredOf(1000).slabs, 1u);
  PagePool::Stats st = pool->GetStats();
  EXPECT_EQ(st.retired_bytes, 2 * kPage);
  EXPECT_EQ(st.retired_slabs, 1u);
  EXPECT_EQ(st.scrub_queue, 2u);
  EXPECT_EQ(st.owned_bytes, 0u);  // out of the budget at once, as before
  pool->PauseWorkerForTest(false);
  pool->WaitIdle();
  EXPECT_EQ(AllocatedBytes(kept->get()), 0u);
  EXPECT_EQ(pool->RetiredOf(1000).bytes, 0u);
  st = pool->GetStats();
  EXPECT_EQ(st.retired_bytes, 0u);
  EXPECT_EQ(st.retired_slabs, 0u);
  EXPECT_EQ(pool->SweepRetired(), 0u);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

// Random allocations, shares and releases over many owners against a shadow model: after every
// step the pool's invariants hold, every page is its owner's, references match, a refused
// allocation changes nothing, and the budget adds up exactly.
TEST(PagePoolTest, PropertyRandomOperationsMatchAShadowModel) {
  std::mt19937_64 rng(17);
  for (int round = 0; round < 4; ++round) {
    const uint32_t slab_pages = 1u << (round + 2);
    auto pool = MustCreate(SmallOptions(96 + round * 13, slab_pages, /*reserve=*/round % 3));
    std::map<uint64_t, std::map<Page, uint32_t>> shadow;  // owner -> page -> references
    uint64_t referenced = 0;
    for (int step = 0; step < 1500; ++step) {
      const uint64_t owner = 1 + rng() % 9;
      std::map<Page, uint32_t>& mine = shadow[owner];
      const int op = static_cast<int>(rng() % 10);
      if (op < 4 || mine.empty()) {
        const uint32_t count = 1 + static_cast<uint32_t>(rng() % (2 * slab_pages));
        const Page* after = nullptr;
        Page hint;
        if (!mine.empty() && rng() % 2 == 0) {
          hint = std::next(mine.begin(), static_cast<long>(rng() % mine.size()))->first;
          after = &hint;
        }
        const PagePool::Stats before = pool->GetStats();
        absl::StatusOr<std::vector<Page>> got = pool->Allocate(owner, count, after);
        if (!got.ok()) {
          ASSERT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted) << got.status();
          const PagePool::Stats now = pool->GetStats();
          ASSERT_EQ(now.pages_used, before.pages_used);
          ASSERT_EQ(now.owned_bytes, before.owned_bytes);
        } else {
          ASSERT_EQ(got->size(), count);
          for (const Page& p : *got) {
            ASSERT_EQ(mine.count(p), 0u) << "a page handed out twice";
            for (const auto& [other, theirs] : shadow) {
              if (other == owner) continue;
              for (const auto& [q, refs] : theirs) ASSERT_NE(q.slab, p.slab) << "a slab holds two owners' pages";
            }
            mine[p] = 1;
            ++referenced;
          }
        }
      } else if (op < 6) {
        auto it = std::next(mine.begin(), static_cast<long>(rng() % mine.size()));
        ASSERT_TRUE(pool->AddRef(owner, it->first).ok());
        ++it->second;
      } else {
        auto it = std::next(mine.begin(), static_cast<long>(rng() % mine.size()));
        ASSERT_TRUE(pool->Release(owner, it->first).ok());
        if (--it->second == 0) {
          mine.erase(it);
          --referenced;
        }
      }
      ASSERT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants() << " at step " << step;
      const PagePool::Stats st = pool->GetStats();
      ASSERT_EQ(st.pages_used, referenced);
      ASSERT_EQ(st.owned_bytes + st.ready_bytes + st.making_bytes + st.unallocated_bytes, st.budget_bytes);
      if (step % 97 == 0) {
        for (const auto& [o, pages] : shadow) {
          for (const auto& [p, refs] : pages) ASSERT_EQ(pool->RefCount(p), refs);
        }
      }
    }
    for (auto& [owner, pages] : shadow) {
      for (auto& [p, refs] : pages) {
        for (uint32_t i = 0; i < refs; ++i) ASSERT_TRUE(pool->Release(owner, p).ok());
      }
      pool->RetireIdleOf(owner);
    }
    pool->WaitIdle();
    const PagePool::Stats st = pool->GetStats();
    EXPECT_EQ(st.pages_used, 0u);
    EXPECT_EQ(st.slabs, 0u);
    EXPECT_EQ(st.scrub_queue, 0u);
    EXPECT_EQ(st.ready_bytes + st.unallocated_bytes, st.budget_bytes);
  }
}

// Owners on different threads: the bookkeeping stays exact (run under TSan by the lead's CI).
TEST(PagePoolTest, OwnersOnDifferentThreads) {
  auto pool = MustCreate(SmallOptions(256, 8, /*reserve=*/1));
  std::vector<std::thread> threads;
  for (uint64_t owner = 1; owner <= 4; ++owner) {
    threads.emplace_back([&pool, owner] {
      std::mt19937 rng(static_cast<uint32_t>(owner));
      std::vector<Page> held;
      for (int i = 0; i < 300; ++i) {
        if (held.size() < 40 && rng() % 2 == 0) {
          absl::StatusOr<std::vector<Page>> got = pool->Allocate(owner, 1 + rng() % 6);
          if (got.ok()) held.insert(held.end(), got->begin(), got->end());
        } else if (!held.empty()) {
          EXPECT_TRUE(pool->Release(owner, held.back()).ok());
          held.pop_back();
        }
      }
      EXPECT_TRUE(pool->ReleaseAll(owner, held).ok());
      pool->RetireIdleOf(owner);
    });
  }
  for (auto& t : threads) t.join();
  pool->WaitIdle();
  EXPECT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants();
  EXPECT_EQ(pool->GetStats().pages_used, 0u);
  EXPECT_EQ(pool->GetStats().slabs, 0u);
}

// Owners on different threads with the budget all in slabs: an allocation that needs a new slab
// plans under the lock and makes the slab outside it, where another owner's allocation may reclaim
// this owner's idle slab meanwhile. The overtaken plan is made again: no allocation fails but for
// want of room, and no slab is left free and not idle (issue 41: hot admissions allocate at once).
TEST(PagePoolTest, AllocationsOvertakenByAnotherOwnersReclaimAreMadeAgain) {
  auto pool = MustCreate(SmallOptions(/*budget_pages=*/64, /*slab_pages=*/8));
  std::atomic<int> other_errors{0};
  absl::Mutex first_mu;
  absl::Status first_other;  // the first error that is not the pool being full, for the failure message
  std::vector<std::thread> threads;
  for (uint64_t owner = 1; owner <= 8; ++owner) {
    threads.emplace_back([&pool, &other_errors, &first_mu, &first_other, owner] {
      std::mt19937 rng(static_cast<uint32_t>(owner));
      std::vector<Page> held;
      for (int i = 0; i < 3000; ++i) {
        if (held.size() < 12 && rng() % 3 != 0) {
          absl::StatusOr<std::vector<Page>> got = pool->Allocate(owner, 1 + rng() % 10);
          if (got.ok()) {
            held.insert(held.end(), got->begin(), got->end());
          } else if (!absl::IsResourceExhausted(got.status())) {
            if (other_errors.fetch_add(1) == 0) {
              absl::MutexLock lock(&first_mu);
              first_other = got.status();
            }
          }
        } else {
          EXPECT_TRUE(pool->ReleaseAll(owner, held).ok());  // its slabs idle: another's to reclaim
          held.clear();
        }
      }
      EXPECT_TRUE(pool->ReleaseAll(owner, held).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(other_errors.load(), 0) << first_other;
  EXPECT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants();
  for (uint64_t owner = 1; owner <= 8; ++owner) pool->RetireIdleOf(owner);
  pool->WaitIdle();
  EXPECT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants();
  EXPECT_EQ(pool->GetStats().pages_used, 0u);
  EXPECT_EQ(pool->GetStats().slabs, 0u);
}

// Owners' page calls hold the pool's lock shared and their shard's lock (page_pool.h): owners of
// one shard (1 and 17) and of others take free pages, share, read and release them, and name each
// other's pages (refused, never touched), while allocations make and reclaim slabs and another
// thread reads Stats and checks the invariants. Exact at the end; CI runs it under TSan.
TEST(PagePoolTest, OwnersPageCallsRunBesideEachOtherAndThePoolsOwnCalls) {
  auto pool = MustCreate(SmallOptions(/*budget_pages=*/96, /*slab_pages=*/8, /*reserve=*/1));
  const std::vector<uint64_t> owners = {1, 17, 2, 3};
  std::atomic<bool> done{false};
  std::atomic<int> errors{0};
  std::thread watcher([&] {
    while (!done.load()) {
      if (!pool->CheckInvariants().ok()) errors.fetch_add(1);
      const PagePool::Stats st = pool->GetStats();
      if (st.pages_used > 96) errors.fetch_add(1);
      (void)pool->ReclaimablePagesFor(2);
      (void)pool->SlabsByOwner();
    }
  });
  std::vector<std::vector<Page>> last(owners.size());  // each owner's pages a moment ago
  absl::Mutex last_mu;
  std::vector<std::thread> threads;
  for (size_t k = 0; k < owners.size(); ++k) {
    threads.emplace_back([&, k] {
      const uint64_t owner = owners[k];
      std::mt19937 rng(static_cast<uint32_t>(owner));
      std::vector<Page> held;
      for (int i = 0; i < 2000; ++i) {
        const uint32_t op = rng() % 8;
        if (held.size() < 16 && op < 3) {
          absl::StatusOr<std::vector<Page>> got = pool->Allocate(owner, 1 + rng() % 5);
          if (got.ok()) {
            held.insert(held.end(), got->begin(), got->end());
          } else if (!absl::IsResourceExhausted(got.status())) {
            errors.fetch_add(1);
          }
        } else if (op == 3 && !held.empty()) {
          const Page p = held[rng() % held.size()];
          if (!pool->AddRef(owner, p).ok() || !pool->PageData(owner, p).ok()) errors.fetch_add(1);
          if (!pool->Release(owner, p).ok()) errors.fetch_add(1);
        } else if (op == 4) {
          // Another owner's pages (maybe released, maybe another's again by now): never ours.
          std::vector<Page> theirs;
          {
            absl::MutexLock lock(&last_mu);
            theirs = last[(k + 1) % owners.size()];
          }
          for (const Page& p : theirs) {
            if (pool->Release(owner, p).ok() || pool->AddRef(owner, p).ok() || pool->PageData(owner, p).ok()) {
              errors.fetch_add(1);
            }
          }
        } else if (op == 5) {
          if (pool->FreePagesOf(owner) > 96 || pool->PagesOf(owner) != held.size()) errors.fetch_add(1);
        } else if (!held.empty()) {
          if (!pool->ReleaseAll(owner, held).ok()) errors.fetch_add(1);
          held.clear();
        }
        absl::MutexLock lock(&last_mu);
        last[k] = held;
      }
      if (!pool->ReleaseAll(owner, held).ok()) errors.fetch_add(1);
      pool->RetireIdleOf(owner);
    });
  }
  for (auto& t : threads) t.join();
  done.store(true);
  watcher.join();
  EXPECT_EQ(errors.load(), 0);
  pool->WaitIdle();
  EXPECT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants();
  EXPECT_EQ(pool->GetStats().pages_used, 0u);
  EXPECT_EQ(pool->GetStats().slabs, 0u);
}

// Durable requests: the slabs of a session that ended move to the session that adopts its
// requests, pages, references and free pages as they were; the old owner holds nothing after.
TEST(PagePoolTest, HandOverSlabsMovesEveryPageAsItIs) {
  std::unique_ptr<PagePool> pool = MustCreate(SmallOptions(32, 4));
  const std::vector<Page> dead = MustAllocate(*pool, 1, 6);  // two slabs of owner 1
  const std::vector<Page> adopter = MustAllocate(*pool, 2, 1);
  ASSERT_TRUE(pool->AddRef(1, dead[0]).ok());
  ASSERT_TRUE(pool->Release(1, dead[5]).ok());  // a free page of owner 1's stays free
  const uint32_t slabs = pool->SlabsOf(1);
  EXPECT_EQ(pool->HandOverSlabs(1, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->HandOverSlabs(0, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->HandOverSlabs(1, 0).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<uint32_t> moved = pool->HandOverSlabs(1, 2);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(*moved, slabs);
  EXPECT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants();
  EXPECT_EQ(pool->SlabsOf(1), 0u);
  EXPECT_EQ(pool->PagesOf(1), 0u);
  EXPECT_EQ(pool->SlabsOf(2), slabs + 1);
  EXPECT_EQ(pool->PagesOf(2), 6u);
  EXPECT_EQ(pool->RefCount(dead[0]), 2u);
  // The new owner reads, maps and releases them; the old one no longer can.
  EXPECT_TRUE(pool->PageData(2, dead[1]).ok());
  EXPECT_EQ(pool->PageData(1, dead[1]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(pool->DupSlabFd(2, dead[1].slab).ok());
  EXPECT_EQ(pool->DupSlabFd(1, dead[1].slab).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(pool->Release(1, dead[1]).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool->HandOverSlabs(1, 3).value_or(99), 0u);  // nothing left to hand
  ASSERT_TRUE(pool->Release(2, dead[0]).ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(pool->Release(2, dead[i]).ok());
  ASSERT_TRUE(pool->Release(2, adopter[0]).ok());
  pool->RetireIdleOf(2);
  EXPECT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants();
  EXPECT_EQ(pool->GetStats().slabs, 0u);
  EXPECT_EQ(pool->GetStats().pages_used, 0u);
}

}  // namespace page_pool_test
}  // namespace hisparse
