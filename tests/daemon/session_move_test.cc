// Extend's move of a run, copied outside the manager's lock: while the records are copied the
// request is marked as moving (its Release and Extend are refused, other requests go on), and a
// CloseSession that comes meanwhile waits for the copy before it frees the runs.
#include <unistd.h>

#include <cstring>
#include <memory>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "hisparse/common/unix_socket.h"
#include "hisparse/daemon/host_pool.h"
#include "hisparse/daemon/session_manager.h"

namespace hisparse {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

std::unique_ptr<SessionManager> MakeManager(std::function<void()> during_move) {
  HostPool::Options po;
  po.size_bytes = 2 * kMiB;
  po.segment_bytes = kMiB;
  po.pretouch_threads = 1;
  auto pool = HostPool::Create(po);
  EXPECT_TRUE(pool.ok()) << pool.status();
  SessionManager::Options o;
  o.during_move_for_test = std::move(during_move);
  return std::make_unique<SessionManager>(o, std::move(*pool));
}

v1::SessionRef Open(SessionManager& sm) {
  v1::OpenSession open;
  open.set_engine_name("session-move-test");
  v1::Geometry* g = open.mutable_geometry();
  g->set_gpu(-1);
  g->set_num_layers(1);
  g->set_record_bytes(16);
  g->set_k(1);
  g->set_slots(1);
  g->set_max_requests(8);
  PeerCredentials owner;
  owner.uid = ::getuid();
  owner.pid = ::getpid();
  auto opened = sm.OpenSession(open, owner);
  EXPECT_TRUE(opened.ok()) << opened.status();
  v1::SessionRef ref;
  if (!opened.ok()) return ref;
  ref.set_session_id(opened->session_id());
  ref.set_token(opened->token());
  return ref;
}

absl::StatusOr<v1::AdmitResponse> Admit(SessionManager& sm, const v1::SessionRef& ref, uint64_t id, uint32_t tokens) {
  v1::AdmitRequest req;
  *req.mutable_session() = ref;
  req.set_request_id(id);
  req.set_token_budget(tokens);
  return sm.Admit(req);
}

v1::ExtendRequest ExtendOf(const v1::SessionRef& ref, uint64_t id, uint32_t tokens) {
  v1::ExtendRequest req;
  *req.mutable_session() = ref;
  req.set_request_id(id);
  req.set_token_budget(tokens);
  return req;
}

// Request 1 (1000 records of 16 bytes) is followed by request 2, so it cannot grow in place.
struct Layout {
  v1::SessionRef ref;
  v1::Extent first;
};
Layout Prepare(SessionManager& sm) {
  Layout l;
  l.ref = Open(sm);
  auto a = Admit(sm, l.ref, 1, 1000);
  EXPECT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(Admit(sm, l.ref, 2, 1).ok());
  if (!a.ok()) return l;
  l.first = a->extents(0);
  uint8_t* data = sm.SegmentDataForTest(l.first.segment()) + l.first.offset();
  for (uint64_t i = 0; i < 16000; ++i) data[i] = static_cast<uint8_t>(i * 7 + 3);
  return l;
}

TEST(SessionMoveTest, RecordsAreCopiedOutsideTheLockWithTheRequestMarkedMoving) {
  std::unique_ptr<SessionManager> sm;
  v1::SessionRef ref;
  int moves = 0;
  sm = MakeManager([&] {
    ++moves;
    // The lock is free: other requests are admitted, and the accounting is exact mid-move.
    EXPECT_TRUE(Admit(*sm, ref, 3, 1).ok());
    EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
    // The moving request itself is neither released nor extended again.
    v1::ReleaseRequest rel;
    *rel.mutable_session() = ref;
    rel.set_request_id(1);
    EXPECT_TRUE(absl::IsFailedPrecondition(sm->Release(rel))) << sm->Release(rel);
    EXPECT_TRUE(absl::IsFailedPrecondition(sm->Extend(ExtendOf(ref, 1, 50000)).status()));
  });
  const Layout l = Prepare(*sm);
  ref = l.ref;
  auto moved = sm->Extend(ExtendOf(ref, 1, 40000));
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moves, 1);
  EXPECT_TRUE(moved->moved());
  const v1::Extent& to = moved->extents(0);
  EXPECT_FALSE(to.segment() == l.first.segment() && to.offset() == l.first.offset());
  const uint8_t* data = sm->SegmentDataForTest(to.segment()) + to.offset();
  for (uint64_t i = 0; i < 16000; ++i) ASSERT_EQ(data[i], static_cast<uint8_t>(i * 7 + 3)) << "byte " << i;
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
  // Done moving: the request is released as any other.
  v1::ReleaseRequest rel;
  *rel.mutable_session() = ref;
  rel.set_request_id(1);
  EXPECT_TRUE(sm->Release(rel).ok());
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
}

TEST(SessionMoveTest, CloseSessionDuringAMoveWaitsThenFreesEverything) {
  std::unique_ptr<SessionManager> sm;
  v1::SessionRef ref;
  std::thread closer;
  bool saw_close_waiting = false;
  sm = MakeManager([&] {
    closer = std::thread([&] { sm->CloseSession(ref.session_id()); });
    // Once the closer waits for this move, the session refuses new moves (bounded poll).
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (!saw_close_waiting && absl::Now() < deadline) {
      absl::StatusOr<v1::ExtendResponse> other = sm->Extend(ExtendOf(ref, 2, 2));
      saw_close_waiting = absl::IsFailedPrecondition(other.status());
      if (!saw_close_waiting) std::this_thread::yield();
    }
  });
  ref = Prepare(*sm).ref;
  auto moved = sm->Extend(ExtendOf(ref, 1, 40000));
  ASSERT_TRUE(moved.ok()) << moved.status();
  ASSERT_TRUE(closer.joinable());
  closer.join();
  EXPECT_TRUE(saw_close_waiting);
  EXPECT_TRUE(sm->CheckInvariants().ok()) << sm->CheckInvariants();
  const v1::StatsResponse st = sm->Stats();
  EXPECT_EQ(st.sessions(), 0u);
  EXPECT_EQ(st.host_pool().used_bytes(), 0u);
}

}  // namespace
}  // namespace hisparse
