// Batched admission against the real daemon, through the C ABI (hs_admit_batch, hs_release_batch):
// 64 requests admitted in one call are mapped and published exactly as hs_admit's (records stored,
// read back and RESOLVEd from the daemon's memory), one call releases them and the daemon's stats
// return to zero; an all-or-nothing batch that fails leaves nothing admitted on either side; a
// per-item batch reports each item's code.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "test_support.h"

namespace hisparse::testing {
namespace batch_admission_test {

constexpr uint32_t kLayers = 4, kRecord = 64, kSlots = 16, kK = 8;
// What out_results hold before a call, to see which entries it wrote: an hs_result no batch item
// ever gets (and a valid one: a value outside the enum's range is undefined behaviour, which
// UBSan reports).
constexpr hs_result kUntouched = HS_ERR_UNIMPLEMENTED;

uint8_t Pattern(uint64_t req, uint32_t layer, uint32_t pos, uint32_t i) {
  return static_cast<uint8_t>(req * 11 + layer * 13 + pos * 29 + i);
}

struct Batch {
  std::vector<uint64_t> ids;
  std::vector<uint32_t> contexts, budgets;
  std::vector<hs_result> results;
  std::vector<uint32_t> rows, capacities;
  void Add(uint64_t id, uint32_t context, uint32_t budget) {
    ids.push_back(id);
    contexts.push_back(context);
    budgets.push_back(budget);
  }
  hs_result Admit(const Session& s, hs_batch_mode mode) {
    results.assign(ids.size(), kUntouched);
    rows.assign(ids.size(), UINT32_MAX);
    capacities.assign(ids.size(), 0);
    return hs_admit_batch(s.get(), ids.size(), ids.data(), contexts.data(), budgets.data(), mode, results.data(),
                          rows.data(), capacities.data());
  }
};

TEST(BatchAdmissionTest, SixtyFourInOneCallAreMappedLikeSingleAdmits) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const std::string address = daemon->address();
  hs_session_options o = SmallGeometry(address);  // 4 layers, 64 B records, k 8, B 16
  o.max_requests = 64;
  Session s;
  ASSERT_TRUE(Session::Open(o, &s).ok()) << hs_last_error();
  hs_session_info info;
  ASSERT_TRUE(s.Info(&info).ok());

  constexpr int kReq = 64;
  constexpr uint32_t kCtx = 40;
  Batch b;
  for (int r = 0; r < kReq; ++r) b.Add(r + 1, kCtx, kCtx + 300 * (r % 3));  // one to several pages
  ASSERT_EQ(b.Admit(s, HS_BATCH_ALL_OR_NOTHING), HS_OK) << hs_last_error();
  std::vector<uint32_t> sorted_rows = b.rows;
  std::sort(sorted_rows.begin(), sorted_rows.end());
  for (int r = 0; r < kReq; ++r) {
    EXPECT_EQ(b.results[r], HS_OK);
    EXPECT_EQ(b.capacities[r], b.budgets[r]);
    EXPECT_EQ(sorted_rows[r], static_cast<uint32_t>(r)) << "every row handed out once";
  }
  v1::StatsResponse st = Stats(address);
  EXPECT_EQ(st.requests(), 64u);
  EXPECT_EQ(st.admissions(), 64u);

  // Every request's records are writable and readable through the client, as after hs_admit.
  std::vector<uint8_t> prompt(kLayers * kCtx * kRecord);
  for (int r = 0; r < kReq; ++r) {
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint32_t p = 0; p < kCtx; ++p)
        for (uint32_t i = 0; i < kRecord; ++i) prompt[(l * kCtx + p) * kRecord + i] = Pattern(r + 1, l, p, i);
    ASSERT_EQ(hs_store(s.get(), r + 1, 0, kCtx, kCtx, prompt.data(), kCtx * kRecord, kRecord, nullptr), HS_OK)
        << hs_last_error();
    void* rec = nullptr;
    ASSERT_TRUE(s.RecordPtr(r + 1, kLayers - 1, kCtx - 1, &rec).ok());
    EXPECT_EQ(static_cast<uint8_t*>(rec)[5], Pattern(r + 1, kLayers - 1, kCtx - 1, 5));
  }
  // ... and RESOLVE reads them from the daemon's pages through every row's published page table.
  std::vector<int32_t> rows(b.rows.begin(), b.rows.end()), seq(kReq, kCtx), pos(kReq * kK), out(kReq * kK);
  for (uint32_t l = 0; l < kLayers; ++l) {
    // Per row: the newest token and six distinct older positions, then padding.
    for (int r = 0; r < kReq; ++r) {
      std::vector<int32_t> sel = {static_cast<int32_t>(kCtx - 1)};
      for (uint32_t j = 1; sel.size() < kK - 1; ++j) {
        const int32_t p = static_cast<int32_t>((r * 7 + j * 5) % (kCtx - 1));
        if (std::find(sel.begin(), sel.end(), p) == sel.end()) sel.push_back(p);
      }
      sel.push_back(-1);
      std::copy(sel.begin(), sel.end(), pos.begin() + r * kK);
    }
    hs_resolve_args a = ResolveArgs(l, kReq, rows.data(), seq.data(), pos.data(), out.data());
    ASSERT_TRUE(s.Resolve(a).ok()) << hs_last_error();
    for (int r = 0; r < kReq; ++r) {
      for (uint32_t j = 0; j < kK; ++j) {
        const int32_t p = pos[r * kK + j], slot = out[r * kK + j];
        if (p < 0) continue;
        ASSERT_GE(slot, 0);
        const uint8_t* rec = static_cast<const uint8_t*>(info.slot_base) +
                             ((static_cast<size_t>(rows[r]) * kLayers + l) * (kSlots + 1) + slot) * info.record_stride;
        for (uint32_t i = 0; i < kRecord; ++i) ASSERT_EQ(rec[i], Pattern(r + 1, l, p, i)) << "request " << r + 1;
      }
    }
  }

  // One call releases them all; an unknown id is reported and does not stop the others.
  std::vector<uint64_t> ids = b.ids;
  ids.push_back(999);
  std::vector<hs_result> released(ids.size(), kUntouched);
  ASSERT_EQ(hs_release_batch(s.get(), ids.size(), ids.data(), released.data()), HS_OK) << hs_last_error();
  for (int r = 0; r < kReq; ++r) EXPECT_EQ(released[r], HS_OK);
  EXPECT_EQ(released.back(), HS_ERR_NOT_FOUND);
  void* rec = nullptr;
  EXPECT_EQ(s.RecordPtr(1, 0, 0, &rec).code, HS_ERR_NOT_FOUND) << "forgotten by the client too";
  st = Stats(address);
  EXPECT_EQ(st.requests(), 0u);
  EXPECT_EQ(st.host_pool().used_bytes(), 0u);
  EXPECT_EQ(st.host_pool().pages_used(), 0u);
}

TEST(BatchAdmissionTest, FailedAllOrNothingLeavesNothingAndPerItemReportsEachItem) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const std::string address = daemon->address();
  Session s;
  ASSERT_TRUE(Session::Open(SmallGeometry(address), &s).ok()) << hs_last_error();  // 8 rows

  Batch nine;
  for (int r = 0; r < 9; ++r) nine.Add(r + 1, 0, 100);
  EXPECT_EQ(nine.Admit(s, HS_BATCH_ALL_OR_NOTHING), HS_ERR_RESOURCE_EXHAUSTED);
  EXPECT_NE(std::string(hs_last_error()).find("items[8]"), std::string::npos) << hs_last_error();
  for (int r = 0; r < 8; ++r) EXPECT_EQ(nine.results[r], HS_ERR_ABORTED) << r;
  EXPECT_EQ(nine.results[8], HS_ERR_RESOURCE_EXHAUSTED);
  v1::StatsResponse st = Stats(address);
  EXPECT_EQ(st.requests(), 0u);
  EXPECT_EQ(st.admissions(), 0u);
  EXPECT_EQ(st.host_pool().pages_used(), 0u);
  void* rec = nullptr;
  EXPECT_EQ(s.RecordPtr(1, 0, 0, &rec).code, HS_ERR_NOT_FOUND);

  Batch mixed;
  mixed.Add(1, 0, 100);
  mixed.Add(1, 0, 100);    // named twice
  mixed.Add(2, 200, 100);  // context above the budget
  mixed.Add(3, 0, 100);
  ASSERT_EQ(mixed.Admit(s, HS_BATCH_PER_ITEM), HS_OK) << hs_last_error();
  EXPECT_EQ(mixed.results, (std::vector<hs_result>{HS_OK, HS_ERR_INVALID_ARGUMENT, HS_ERR_INVALID_ARGUMENT, HS_OK}));
  EXPECT_EQ(mixed.rows[1], UINT32_MAX) << "a refused item's outputs are not written";
  EXPECT_TRUE(s.RecordPtr(3, 0, 99, &rec).ok());
  EXPECT_EQ(Stats(address).requests(), 2u);
  // Single and batched calls mix: the batch's requests release one by one as well.
  EXPECT_TRUE(s.Release(1).ok());
  EXPECT_TRUE(s.Release(3).ok());
  EXPECT_EQ(Stats(address).requests(), 0u);

  // Bad calls: nothing sent, nothing written.
  std::vector<hs_result> results(2, kUntouched);
  uint64_t ids[2] = {1, 2};
  uint32_t budgets[2] = {10, 10};
  EXPECT_EQ(hs_admit_batch(s.get(), 0, ids, nullptr, budgets, HS_BATCH_PER_ITEM, results.data(), nullptr, nullptr),
            HS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(hs_admit_batch(s.get(), HS_BATCH_MAX_ITEMS + 1, ids, nullptr, budgets, HS_BATCH_PER_ITEM, results.data(),
                           nullptr, nullptr),
            HS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(hs_admit_batch(s.get(), 2, ids, nullptr, budgets, static_cast<hs_batch_mode>(7), results.data(), nullptr,
                           nullptr),
            HS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(hs_release_batch(s.get(), 2, ids, nullptr), HS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(results[0], kUntouched);
  EXPECT_EQ(Stats(address).requests(), 0u);
}

// All or nothing on the client's side: the daemon admits the batch, then this process cannot map
// a slab (no descriptor number is left for the fd channel's reply). The client must release what
// the daemon admitted, report the item, and keep nothing; with descriptors back, the batch admits.
TEST(BatchAdmissionTest, MappingFailureAfterTheDaemonAdmittedReleasesTheBatch) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const std::string address = daemon->address();
  Session s;
  ASSERT_TRUE(Session::Open(SmallGeometry(address), &s).ok()) << hs_last_error();  // no slab mapped yet
  Batch b;
  for (int r = 0; r < 4; ++r) b.Add(r + 1, 0, 100);

  struct rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  const int lowest_free = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(lowest_free, 0);
  ::close(lowest_free);
  struct rlimit tight = saved;
  tight.rlim_cur = static_cast<rlim_t>(lowest_free);  // every number below it is taken: no new fd
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  const hs_result r = b.Admit(s, HS_BATCH_ALL_OR_NOTHING);
  const std::string message = hs_last_error();
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);

  EXPECT_NE(r, HS_OK);
  EXPECT_NE(message.find("items[0]"), std::string::npos) << message;
  EXPECT_EQ(b.results[0], r);
  for (int i = 1; i < 4; ++i) EXPECT_EQ(b.results[i], HS_ERR_ABORTED) << i;
  void* rec = nullptr;
  EXPECT_EQ(s.RecordPtr(1, 0, 0, &rec).code, HS_ERR_NOT_FOUND) << "nothing kept here";
  v1::StatsResponse st = Stats(address);
  EXPECT_EQ(st.requests(), 0u) << "the daemon released what it had admitted";
  EXPECT_EQ(st.host_pool().pages_used(), 0u);

  ASSERT_EQ(b.Admit(s, HS_BATCH_ALL_OR_NOTHING), HS_OK) << hs_last_error();
  EXPECT_TRUE(s.RecordPtr(4, 3, 99, &rec).ok());
  EXPECT_EQ(Stats(address).requests(), 4u);
}

}  // namespace batch_admission_test
}  // namespace hisparse::testing
