// The client's install steps undone on failure, on every path that gives a request a row the
// daemon just handed out: Admit, Resume and the commit of an import. A real hisparsed on a
// temporary socket; the host backend, wrapped (ClientSession::BackendWrap) so that ResetRow or the
// registration of a slab fails, or the registration blocks, when the test says.
//
// What a failed install must leave: the row unpublished (its table cleared), no slab of the
// request registered for nothing, for Admit nothing in the daemon either (released again, as a
// batch releases), and for Resume the request parked on both sides, so that a later Resume
// succeeds. And slabs are mapped and registered outside the session's lock: a registration that
// blocks holds up no RESOLVE of another thread, and two threads mapping one slab publish it once.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client_session.h"
#include "device_backend.h"
#include "gtest/gtest.h"
#include "hisparse/common/daemon_process.h"
#include "hisparse/v1/hisparse.grpc.pb.h"

namespace hisparse {
namespace client_install_test {

// What the wrapped backend saw, shared with the test after the session owns the backend.
struct Probe {
  std::atomic<bool> fail_reset{false};
  std::atomic<int> fail_nth{0};  // > 0: the fail_nth ResetRow from now fails (once)
  std::atomic<int> resets{0};
  std::atomic<int> registered{0};          // host segments registered now
  std::atomic<int> register_calls{0};      // RegisterHostSegment calls, ever
  std::atomic<bool> fail_register{false};  // RegisterHostSegment fails
  // Set: the next RegisterHostSegment notifies `entered` and waits for `release` before it
  // registers (a cudaHostRegister of a large slab, slowed down to forever).
  std::atomic<bool> block_next_register{false};
  absl::Notification entered, release;
  // The last SetHostMapRow capacity per row (0: cleared). The session's watcher thread writes it
  // too (an ended session's rows), so it is read as a copy under the lock.
  absl::Mutex rows_mu;
  std::map<int32_t, int32_t> row_capacity ABSL_GUARDED_BY(rows_mu);
  void SetRow(int32_t row, int32_t capacity) {
    absl::MutexLock lock(&rows_mu);
    row_capacity[row] = capacity;
  }
  std::map<int32_t, int32_t> Rows() {
    absl::MutexLock lock(&rows_mu);
    return row_capacity;
  }
  void ClearRows() {
    absl::MutexLock lock(&rows_mu);
    row_capacity.clear();
  }
};

class ProbeBackend : public DeviceBackend {
 public:
  ProbeBackend(std::unique_ptr<DeviceBackend> inner, std::shared_ptr<Probe> probe)
      : inner_(std::move(inner)), probe_(std::move(probe)) {}
  hs_backend kind() const override { return inner_->kind(); }
  absl::StatusOr<uint8_t*> RegisterHostSegment(uint8_t* host, size_t bytes) override {
    ++probe_->register_calls;
    if (probe_->fail_register) return absl::InternalError("injected RegisterHostSegment failure");
    if (probe_->block_next_register.exchange(false)) {
      probe_->entered.Notify();
      probe_->release.WaitForNotification();
    }
    auto r = inner_->RegisterHostSegment(host, bytes);
    if (r.ok()) ++probe_->registered;
    return r;
  }
  void UnregisterHostSegment(uint8_t* host) override {
    --probe_->registered;
    inner_->UnregisterHostSegment(host);
  }
  absl::StatusOr<ArenaView> Attach(const AttachedArena& arena, const ArenaGeometry& g) override {
    return inner_->Attach(arena, g);
  }
  HostRecordMap host_map() const override { return inner_->host_map(); }
  absl::Status SetHostMapRow(int32_t row, const uint8_t* const* pages, uint32_t pages_given,
                             int32_t capacity) override {
    absl::Status s = inner_->SetHostMapRow(row, pages, pages_given, capacity);
    if (s.ok()) probe_->SetRow(row, capacity);
    return s;
  }
  absl::Status ResetRow(const ArenaView& arena, int32_t row, void* stream) override {
    if (probe_->fail_reset) return absl::InternalError("injected ResetRow failure");
    if (probe_->fail_nth > 0 && ++probe_->resets == probe_->fail_nth) {
      return absl::InternalError("injected ResetRow failure");
    }
    return inner_->ResetRow(arena, row, stream);
  }
  absl::Status Resolve(const ResolveDesc& d, const ResolvePlacement& placement, void* stream) override {
    return inner_->Resolve(d, placement, stream);
  }
  absl::Status Store(const StoreDesc& d, void* stream) override { return inner_->Store(d, stream); }
  absl::Status StoreIndexed(const IndexedStoreDesc& d, void* stream) override {
    return inner_->StoreIndexed(d, stream);
  }
  absl::Status Append(const AppendDesc& d, void* stream) override { return inner_->Append(d, stream); }
  absl::StatusOr<MissPlan> AllocMissPlan() override { return inner_->AllocMissPlan(); }
  absl::Status Replay(const ReplayDesc& d, void* stream) override { return inner_->Replay(d, stream); }
  absl::Status Prewarm(const PrewarmDesc& d, void* stream) override { return inner_->Prewarm(d, stream); }
  absl::Status CheckErrors() override { return inner_->CheckErrors(); }
  uint32_t* error_flags() override { return inner_->error_flags(); }
  absl::StatusOr<ArenaCounters> ReadCounters() override { return inner_->ReadCounters(); }

 private:
  std::unique_ptr<DeviceBackend> inner_;
  std::shared_ptr<Probe> probe_;
};

class ClientInstallTest : public ::testing::Test {
 protected:
  void Start(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--host-pool-size",      "64MiB", "--host-pool-page-size", "64KiB",
                                     "--host-pool-slab-size", "4MiB",  "--log-level",           "warning"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto d = DaemonProcess::Start(args);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
    auto s = ClientSession::Open(Options("client-install-test"), [this](std::unique_ptr<DeviceBackend> b) {
      return std::make_unique<ProbeBackend>(std::move(b), probe_);
    });
    ASSERT_TRUE(s.ok()) << s.status();
    session_ = std::move(*s);
  }

  // The test's geometry on the host backend, for the daemon Start started.
  hs_session_options Options(const char* engine_name) const {
    hs_session_options o = HS_SESSION_OPTIONS_INIT;
    o.daemon_address = daemon_->address().c_str();
    o.engine_name = engine_name;
    o.num_layers = 2;
    o.record_bytes = 64;
    o.k = 4;
    o.slots = 8;
    o.max_requests = 4;
    o.backend = HS_BACKEND_HOST;
    return o;
  }

  std::shared_ptr<Probe> probe_ = std::make_shared<Probe>();
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<ClientSession> session_;
};

TEST_F(ClientInstallTest, AFailedResumeLeavesTheRequestParkedOnBothSides) {
  Start();
  auto admitted = session_->Admit(1, 100, 200);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  ASSERT_TRUE(session_->Park(1).ok());
  const int slabs = probe_->registered;
  probe_->fail_reset = true;
  auto failed = session_->Resume(1);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal) << failed.status();
  // Not published with slots it never emptied, and its slabs still mapped once (it keeps its pages).
  for (const auto& [row, capacity] : probe_->Rows()) EXPECT_EQ(capacity, 0) << "row " << row;
  EXPECT_EQ(probe_->registered, slabs);
  // Parked here: a store is refused as for any parked request.
  std::vector<uint8_t> rec(2 * 64, 1);
  EXPECT_EQ(session_->Store(1, 0, 1, 1, rec.data(), 64, 64, nullptr).code(), absl::StatusCode::kFailedPrecondition);
  // And in the daemon: a second Resume is one of a parked request, and works.
  probe_->fail_reset = false;
  auto resumed = session_->Resume(1);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(probe_->Rows()[static_cast<int32_t>(resumed->row)], 200);
  EXPECT_TRUE(session_->Store(1, 0, 1, 1, rec.data(), 64, 64, nullptr).ok());
  EXPECT_TRUE(session_->Release(1).ok());
}

// A ResumeBatch whose second item cannot be installed here: all or nothing, the daemon resumed
// all three, so every item goes back to parked on both sides (no row published, one ParkBatch);
// per item, the others keep their rows and the failed one stays parked. A later resume works.
TEST_F(ClientInstallTest, ABatchResumeThatFailsToInstallAnItemLeavesItParkedOnBothSides) {
  Start();
  const std::vector<uint64_t> ids = {1, 2, 3};
  for (uint64_t id : ids) ASSERT_TRUE(session_->Admit(id, 10, 20).ok());
  std::vector<uint8_t> rec(2 * 64, 1);
  for (const bool all_or_nothing : {true, false}) {
    SCOPED_TRACE(all_or_nothing ? "all or nothing" : "per item");
    auto parked = session_->ParkBatch(ids, /*all_or_nothing=*/true);
    ASSERT_TRUE(parked.ok()) << parked.status();
    probe_->ClearRows();
    probe_->resets = 0;
    probe_->fail_nth = 2;
    auto resumed = session_->ResumeBatch(ids, all_or_nothing);
    probe_->fail_nth = 0;
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    ASSERT_EQ(resumed->items.size(), 3u);
    EXPECT_EQ(resumed->items[1].status().code(), absl::StatusCode::kInternal) << resumed->items[1].status();
    EXPECT_EQ(session_->Store(2, 0, 1, 1, rec.data(), 64, 64, nullptr).code(), absl::StatusCode::kFailedPrecondition);
    if (all_or_nothing) {
      EXPECT_EQ(resumed->failed_item, 1);
      for (size_t i : {size_t{0}, size_t{2}}) {
        EXPECT_EQ(resumed->items[i].status().code(), absl::StatusCode::kAborted) << resumed->items[i].status();
        EXPECT_EQ(session_->Store(ids[i], 0, 1, 1, rec.data(), 64, 64, nullptr).code(),
                  absl::StatusCode::kFailedPrecondition);
      }
      for (const auto& [row, capacity] : probe_->Rows()) EXPECT_EQ(capacity, 0) << "row " << row;
    } else {
      EXPECT_EQ(resumed->failed_item, -1);
      for (size_t i : {size_t{0}, size_t{2}}) {
        ASSERT_TRUE(resumed->items[i].ok()) << resumed->items[i].status();
        EXPECT_TRUE(session_->Store(ids[i], 0, 1, 1, rec.data(), 64, 64, nullptr).ok());
      }
    }
    // Parked in the daemon too: resuming them again works, and they store.
    const std::vector<uint64_t> again = all_or_nothing ? ids : std::vector<uint64_t>{2};
    auto retried = session_->ResumeBatch(again, /*all_or_nothing=*/true);
    ASSERT_TRUE(retried.ok()) << retried.status();
    for (size_t i = 0; i < again.size(); ++i) {
      ASSERT_TRUE(retried->items[i].ok()) << retried->items[i].status();
      EXPECT_TRUE(session_->Store(again[i], 0, 1, 1, rec.data(), 64, 64, nullptr).ok());
    }
  }
  for (uint64_t id : ids) EXPECT_TRUE(session_->Release(id).ok());
}

// How many requests the daemon holds (of this tenant: the test's one session).
uint32_t DaemonRequests(ClientSession& s) {
  auto stats = s.NodeStats();
  EXPECT_TRUE(stats.ok()) << stats.status();
  return stats.ok() ? stats->requests() : ~0u;
}

// How many slabs the daemon keeps for `s` (live or idle). A slab this process keeps mapped must be
// one of them: an idle one stays mapped until the daemon retires it (SlabRetired).
uint32_t DaemonSlabs(ClientSession& s) {
  auto stats = s.NodeStats();
  EXPECT_TRUE(stats.ok()) << stats.status();
  if (!stats.ok()) return 0;
  auto it = stats->host_pool().slabs_by_session().find(s.session_id());
  return it == stats->host_pool().slabs_by_session().end() ? 0 : it->second;
}

// A watchdog for a step that must finish: generous, so only a hang fails it (no timing is tested).
constexpr absl::Duration kHang = absl::Seconds(60);

// Issue 41, item 3: a single Admit whose install in this process fails is released in the daemon,
// as a batch's is. Before, the daemon kept the request (Stats counted it, its id stayed taken)
// until the session ended. Two failure points: the slab's registration with the device (nothing
// mapped for the request), and the row's reset (its slabs mapped, its table published).
TEST_F(ClientInstallTest, ASingleAdmitWhoseInstallFailsIsReleasedInTheDaemon) {
  Start();
  for (const bool at_register : {true, false}) {
    SCOPED_TRACE(at_register ? "registration fails" : "row reset fails");
    (at_register ? probe_->fail_register : probe_->fail_reset) = true;
    auto failed = session_->Admit(1, 100, 200);
    (at_register ? probe_->fail_register : probe_->fail_reset) = false;
    EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal) << failed.status();
    EXPECT_NE(failed.status().message().find("injected"), absl::string_view::npos) << failed.status();
    EXPECT_EQ(DaemonRequests(*session_), 0u) << "the daemon still holds the request this process could not install";
    EXPECT_LE(probe_->registered, static_cast<int>(DaemonSlabs(*session_)))
        << "a slab stays registered that the daemon no longer keeps for this session";
    for (const auto& [row, capacity] : probe_->Rows()) EXPECT_EQ(capacity, 0) << "row " << row;
    EXPECT_EQ(session_->RecordPtr(1, 0, 0).status().code(), absl::StatusCode::kNotFound);
    // The id is free in the daemon again: the same admission now works (ALREADY_EXISTS before).
    auto again = session_->Admit(1, 100, 200);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(DaemonRequests(*session_), 1u);
    ASSERT_TRUE(session_->Release(1).ok());
    EXPECT_LE(probe_->registered, static_cast<int>(DaemonSlabs(*session_)));
  }
}

// Issue 41, item 4: a slab is mapped and registered outside the session's lock. While one thread's
// Admit blocks in the registration of a new slab, a RESOLVE on another thread (host backend) of a
// request already installed finishes; then the Admit finishes too and its request is usable.
TEST_F(ClientInstallTest, AResolveFinishesWhileAnotherThreadsRegistrationBlocks) {
  Start();
  auto first = session_->Admit(1, 0, 200);  // one 64 KiB page a layer, in the session's first slab
  ASSERT_TRUE(first.ok()) << first.status();
  std::vector<uint8_t> rec(2 * 2 * 64, 7);  // [layer][token] records of 64 bytes
  ASSERT_TRUE(session_->Store(1, 0, 2, 2, rec.data(), 128, 64, nullptr).ok());
  const int calls_before = probe_->register_calls;

  // 65 * 1024 tokens: 65 pages of 64 KiB (1024 records) a layer, 130 in all, more than a 4 MiB
  // slab's 64: the Admit maps new slabs, and the first registration blocks.
  probe_->block_next_register = true;
  absl::StatusOr<hs_request_info> second = absl::UnknownError("not run");
  std::thread admitter([&] { second = session_->Admit(2, 0, 65 * 1024); });
  ASSERT_TRUE(probe_->entered.WaitForNotificationWithTimeout(kHang)) << "the Admit never registered a new slab";

  int32_t row = static_cast<int32_t>(first->row), seq_len = 2, positions[4] = {0, -1, -1, -1}, out[4] = {};
  hs_resolve_args args = HS_RESOLVE_ARGS_INIT;
  args.layer = 0;
  args.max_batch = 1;
  args.rows = &row;
  args.seq_lens = &seq_len;
  args.positions = positions;
  args.out_slots = out;
  absl::Notification resolved;
  absl::Status resolve_status;
  std::thread resolver([&] {
    resolve_status = session_->Resolve(args);
    resolved.Notify();
  });
  const bool finished = resolved.WaitForNotificationWithTimeout(kHang);
  probe_->release.Notify();  // whatever happened: let the Admit (and a blocked RESOLVE) go on
  resolver.join();
  admitter.join();
  EXPECT_TRUE(finished) << "RESOLVE waited for another thread's slab registration (the lock is held across it)";
  EXPECT_TRUE(resolve_status.ok()) << resolve_status;
  EXPECT_GE(out[0], 0);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_GT(probe_->register_calls, calls_before + 1) << "the second request should need new slabs";
  EXPECT_TRUE(session_->Store(2, 65 * 1024 - 2, 2, 65 * 1024, rec.data(), 128, 64, nullptr).ok());
  ASSERT_TRUE(session_->Release(2).ok());
  ASSERT_TRUE(session_->Release(1).ok());
  EXPECT_LE(probe_->registered, static_cast<int>(DaemonSlabs(*session_)));
}

// Two threads map one new slab at once: the first to publish wins, the other's mapping is
// released (one registration more than slabs, one unregistration), and both requests use the
// winner's. Request 99 fills the session's first slab (4 pages: the daemon sizes a session's first
// slab to its need) and stays; the next slab is sized to what the session holds (4 pages again),
// so the 2 pages of request 1 and the 2 of request 2 both lie in it. Request 1's registration of
// it blocks; request 2 maps and publishes it meanwhile.
TEST_F(ClientInstallTest, TwoThreadsMappingOneSlabPublishItOnce) {
  Start();
  ASSERT_TRUE(session_->Admit(99, 0, 2048).ok());  // 2 pages of 1024 records a layer
  ASSERT_EQ(probe_->registered, 1);
  probe_->register_calls = 0;
  probe_->block_next_register = true;
  absl::StatusOr<hs_request_info> first = absl::UnknownError("not run");
  std::thread admitter([&] { first = session_->Admit(1, 0, 200); });
  ASSERT_TRUE(probe_->entered.WaitForNotificationWithTimeout(kHang)) << "the Admit never registered its slab";
  // Not blocked: maps the same slab and publishes it (on a thread, so that a lock held across the
  // other's registration fails the test instead of hanging it).
  absl::StatusOr<hs_request_info> second = absl::UnknownError("not run");
  absl::Notification second_done;
  std::thread racer([&] {
    second = session_->Admit(2, 0, 200);
    second_done.Notify();
  });
  const bool finished = second_done.WaitForNotificationWithTimeout(kHang);
  probe_->release.Notify();
  racer.join();
  admitter.join();
  EXPECT_TRUE(finished) << "the second Admit waited for the first's slab registration (the lock is held across it)";
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(probe_->register_calls, 2) << "each thread registers its own mapping of the one slab";
  EXPECT_EQ(probe_->registered, 2) << "the mapping that lost the race is released (and nothing else)";
  // Both requests' records are the one slab's: what one stores, the host pool holds.
  std::vector<uint8_t> a(2 * 64, 1), b(2 * 64, 2);
  ASSERT_TRUE(session_->Store(1, 0, 1, 1, a.data(), 64, 64, nullptr).ok());
  ASSERT_TRUE(session_->Store(2, 0, 1, 1, b.data(), 64, 64, nullptr).ok());
  auto r1 = session_->RecordPtr(1, 1, 0);
  auto r2 = session_->RecordPtr(2, 1, 0);
  ASSERT_TRUE(r1.ok() && r2.ok());
  EXPECT_EQ(std::memcmp(*r1, a.data() + 64, 64), 0);
  EXPECT_EQ(std::memcmp(*r2, b.data() + 64, 64), 0);
  ASSERT_TRUE(session_->Release(1).ok());
  EXPECT_EQ(probe_->registered, 2) << "request 2 still has pages in the slab";
  ASSERT_TRUE(session_->Release(2).ok());
  ASSERT_TRUE(session_->Release(99).ok());
  EXPECT_LE(probe_->registered, static_cast<int>(DaemonSlabs(*session_)));
}

// A slab none of whose pages the session's requests hold stays mapped (and registered) while the
// daemon keeps it for the session: its next request's pages are there again, and it maps nothing.
// Before, every release that emptied a slab unmapped it, and the next admission fetched, mapped
// and registered it again (a cudaHostRegister of the slab on CUDA).
TEST_F(ClientInstallTest, AnIdleSlabStaysMappedForTheSessionsNextRequest) {
  Start();
  ASSERT_TRUE(session_->Admit(1, 0, 200).ok());
  ASSERT_TRUE(session_->Release(1).ok());
  EXPECT_EQ(probe_->registered, 1);
  EXPECT_EQ(DaemonSlabs(*session_), 1u) << "the daemon keeps the idle slab for the session";
  const int calls = probe_->register_calls;
  ASSERT_TRUE(session_->Admit(2, 0, 200).ok());
  EXPECT_EQ(probe_->register_calls, calls) << "the next request's pages are in the slab mapped already";
  std::vector<uint8_t> rec(2 * 64, 3);
  ASSERT_TRUE(session_->Store(2, 0, 1, 1, rec.data(), 64, 64, nullptr).ok());
  ASSERT_TRUE(session_->Release(2).ok());
  session_.reset();
  EXPECT_EQ(probe_->registered, 0) << "the session's end releases the idle mapping too";
}

// The daemon takes an idle slab back for another session that needs its budget: it tells this
// session (SlabRetired), which drops its mapping. Without the notice the mapping (pinned by
// cudaHostRegister on CUDA) would hold memory the pool has given to someone else.
TEST_F(ClientInstallTest, ASlabTheDaemonTakesBackIsDroppedHere) {
  Start();
  ASSERT_TRUE(session_->Admit(1, 0, 200).ok());
  ASSERT_TRUE(session_->Release(1).ok());
  ASSERT_EQ(probe_->registered, 1);
  // Another session asks for the whole pool (64 MiB: 512 pages of 64 KiB a layer): the pool can
  // only give it that by retiring the first session's idle slab.
  auto other = ClientSession::Open(Options("client-install-test-other"));
  ASSERT_TRUE(other.ok()) << other.status();
  auto whole = (*other)->Admit(1, 0, 512 * 1024);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(DaemonSlabs(*session_), 0u) << "the pool should have taken the idle slab back";
  const absl::Time deadline = absl::Now() + kHang;
  while (probe_->registered != 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(probe_->registered, 0) << "the mapping of a slab the daemon took back was kept";
  ASSERT_TRUE((*other)->Release(1).ok());
  // The session goes on: its next request maps a new slab.
  ASSERT_TRUE(session_->Admit(2, 0, 200).ok());
  EXPECT_EQ(probe_->registered, 1);
  ASSERT_TRUE(session_->Release(2).ok());
}

// The session ends under a registration that blocks (here the daemon goes away): the mapping
// made outside the lock still has one owner, whatever the Admit's outcome, and the session's end
// releases every registration.
TEST_F(ClientInstallTest, ASessionEndingDuringARegistrationLeaksNoMapping) {
  Start();
  probe_->block_next_register = true;
  absl::StatusOr<hs_request_info> admitted = absl::UnknownError("not run");
  std::thread admitter([&] { admitted = session_->Admit(1, 0, 200); });
  ASSERT_TRUE(probe_->entered.WaitForNotificationWithTimeout(kHang)) << "the Admit never registered its slab";
  daemon_.reset();  // the daemon stops: the session ends on its side
  probe_->release.Notify();
  admitter.join();
  EXPECT_LE(probe_->registered, 1);
  session_.reset();
  EXPECT_EQ(probe_->registered, 0) << "a registration outlived the session (its mapping leaked)";
}

// Issue 42, part 2: once the daemon ends the session (here it goes away), every row the client had
// published is cleared, so that a RESOLVE of it (one a captured graph replays too) finds capacity 0
// and refuses it (resolve.h: kResolveBadSeqLen), and every data-path call is Unavailable. A recovery
// with no daemon to reach fails at its deadline and leaves the session as it was; one on a live
// session is refused.
TEST_F(ClientInstallTest, AnEndedSessionUnpublishesEveryRowAndRefusesTheDataPath) {
  Start();
  auto live = session_->Recover(absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsFailedPrecondition(live.status())) << live.status();
  auto a = session_->Admit(1, 0, 100);
  auto b = session_->Admit(2, 0, 100);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(session_->Park(2).ok());  // a parked request's row is not its own: left alone
  EXPECT_GT(probe_->Rows()[static_cast<int32_t>(a->row)], 0);
  daemon_.reset();
  const absl::Time deadline = absl::Now() + kHang;
  while (session_->alive() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_FALSE(session_->alive());
  EXPECT_EQ(probe_->Rows()[static_cast<int32_t>(a->row)], 0) << "the ended session's row is still published";
  const int32_t row = static_cast<int32_t>(a->row), seq = 10, pos = 0;
  int32_t slot = -1;
  hs_resolve_args r = HS_RESOLVE_ARGS_INIT;
  r.max_batch = 1;
  r.rows = &row;
  r.seq_lens = &seq;
  r.positions = &pos;
  r.out_slots = &slot;
  EXPECT_TRUE(absl::IsUnavailable(session_->Resolve(r)));
  EXPECT_TRUE(absl::IsUnavailable(session_->RecordPtr(1, 0, 0).status()));
  auto none = session_->Recover(absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(none.status()) || absl::IsUnavailable(none.status())) << none.status();
  EXPECT_FALSE(session_->alive());
}

TEST_F(ClientInstallTest, AFailedInstallOfACommittedImportLeavesNothingHere) {
#ifndef HISPARSE_HAVE_UCX
  GTEST_SKIP() << "built without UCX (libucx-dev): imports are compiled out";
#endif
  Start({"--set", "import.enabled=true"});
  hs_admit_args import = HS_ADMIT_ARGS_INIT;
  import.request_id = 7;
  import.context_tokens = 100;
  import.token_budget = 100;
  import.flags = HS_ADMIT_IMPORT;
  ASSERT_TRUE(session_->Admit(import).ok());
  auto grant_bytes = session_->ImportGrant(7);
  ASSERT_TRUE(grant_bytes.ok()) << grant_bytes.status();
  v1::ImportGrant grant;
  ASSERT_TRUE(grant.ParseFromString(*grant_bytes));
  // The agent's commit (nothing written: the records' bytes do not matter here).
  auto stub = v1::HiSparse::NewStub(grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::CommitImportRequest commit;
  commit.set_grant_id(grant.grant_id());
  commit.set_session_id(grant.session_id());
  commit.set_request_id(7);
  v1::CommitImportResponse committed;
  ASSERT_TRUE(stub->CommitImport(&ctx, commit, &committed).ok());
  const int slabs = probe_->registered;
  probe_->fail_reset = true;
  auto failed = session_->AwaitImport(7, 30000);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal) << failed.status();
  for (const auto& [row, capacity] : probe_->Rows()) EXPECT_EQ(capacity, 0) << "row " << row;
  EXPECT_LE(probe_->registered, std::max(slabs, static_cast<int>(DaemonSlabs(*session_))))
      << "a slab stays registered that the daemon no longer keeps for this session";
  auto rec = session_->RecordPtr(7, 0, 0);
  EXPECT_EQ(rec.status().code(), absl::StatusCode::kNotFound) << rec.status();
  EXPECT_EQ(DaemonRequests(*session_), 0u) << "the daemon still holds the import this process could not install";
}

}  // namespace client_install_test
}  // namespace hisparse
