// The client's one install step (ClientSession::PublishFreshRowLocked) undone on failure, on every
// path that gives a request a row the daemon just handed out: Resume and the commit of an import
// (Admit's own is the same helper). A real hisparsed on a temporary socket; the host backend,
// wrapped (ClientSession::BackendWrap) so that ResetRow fails when the test says.
//
// What a failed install must leave: the row unpublished (its table cleared), no slab of the
// request registered for nothing, and for Resume the request parked on both sides, so that a
// later Resume succeeds.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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
  std::atomic<int> registered{0};           // host segments registered now
  std::map<int32_t, int32_t> row_capacity;  // the last SetHostMapRow capacity per row (0: cleared)
};

class ProbeBackend : public DeviceBackend {
 public:
  ProbeBackend(std::unique_ptr<DeviceBackend> inner, std::shared_ptr<Probe> probe)
      : inner_(std::move(inner)), probe_(std::move(probe)) {}
  hs_backend kind() const override { return inner_->kind(); }
  absl::StatusOr<uint8_t*> RegisterHostSegment(uint8_t* host, size_t bytes) override {
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
    if (s.ok()) probe_->row_capacity[row] = capacity;
    return s;
  }
  absl::Status ResetRow(const ArenaView& arena, int32_t row, void* stream) override {
    if (probe_->fail_reset) return absl::InternalError("injected ResetRow failure");
    if (probe_->fail_nth > 0 && ++probe_->resets == probe_->fail_nth) {
      return absl::InternalError("injected ResetRow failure");
    }
    return inner_->ResetRow(arena, row, stream);
  }
  absl::Status Resolve(const ResolveDesc& d, StreamOrder order, void* stream) override {
    return inner_->Resolve(d, order, stream);
  }
  absl::Status Store(const StoreDesc& d, void* stream) override { return inner_->Store(d, stream); }
  absl::Status StoreIndexed(const IndexedStoreDesc& d, void* stream) override {
    return inner_->StoreIndexed(d, stream);
  }
  absl::Status Append(const AppendDesc& d, void* stream) override { return inner_->Append(d, stream); }
  absl::StatusOr<MissPlan> AllocMissPlan() override { return inner_->AllocMissPlan(); }
  absl::Status Replay(const ReplayDesc& d, void* stream) override { return inner_->Replay(d, stream); }
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
    hs_session_options o = HS_SESSION_OPTIONS_INIT;
    o.daemon_address = daemon_->address().c_str();
    o.engine_name = "client-install-test";
    o.num_layers = 2;
    o.record_bytes = 64;
    o.k = 4;
    o.slots = 8;
    o.max_requests = 4;
    o.backend = HS_BACKEND_HOST;
    auto s = ClientSession::Open(
        o, [this](std::unique_ptr<DeviceBackend> b) { return std::make_unique<ProbeBackend>(std::move(b), probe_); });
    ASSERT_TRUE(s.ok()) << s.status();
    session_ = std::move(*s);
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
  for (const auto& [row, capacity] : probe_->row_capacity) EXPECT_EQ(capacity, 0) << "row " << row;
  EXPECT_EQ(probe_->registered, slabs);
  // Parked here: a store is refused as for any parked request.
  std::vector<uint8_t> rec(2 * 64, 1);
  EXPECT_EQ(session_->Store(1, 0, 1, 1, rec.data(), 64, 64, nullptr).code(), absl::StatusCode::kFailedPrecondition);
  // And in the daemon: a second Resume is one of a parked request, and works.
  probe_->fail_reset = false;
  auto resumed = session_->Resume(1);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(probe_->row_capacity[static_cast<int32_t>(resumed->row)], 200);
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
    probe_->row_capacity.clear();
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
      for (const auto& [row, capacity] : probe_->row_capacity) EXPECT_EQ(capacity, 0) << "row " << row;
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

TEST_F(ClientInstallTest, AFailedInstallOfACommittedImportLeavesNothingHere) {
#ifndef HISPARSE_HAVE_UCX
  GTEST_SKIP() << "built without UCX (libucx-dev): imports are compiled out";
#endif
  Start({"--set", "import.enabled=true"});
  ASSERT_TRUE(session_->AdmitImport(7, 100, 100).ok());
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
  for (const auto& [row, capacity] : probe_->row_capacity) EXPECT_EQ(capacity, 0) << "row " << row;
  EXPECT_EQ(probe_->registered, slabs) << "the request's slabs stay registered for a request this client dropped";
  auto rec = session_->RecordPtr(7, 0, 0);
  EXPECT_EQ(rec.status().code(), absl::StatusCode::kNotFound) << rec.status();
}

}  // namespace client_install_test
}  // namespace hisparse
