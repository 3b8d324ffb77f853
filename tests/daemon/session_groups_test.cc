// SessionManager's TP groups (group_requests.cc): joining and every refusal's code, one set of
// pages for every rank, admission all or nothing across the group (a full pool, one rank's full
// arena, a missing rank), attaching, releasing share by share, a member's death, the fd channel's
// group slabs, and stats counting the pages once. CheckInvariants runs after every step.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "hisparse/daemon/metrics.h"
#include "hisparse/daemon/session_manager.h"
#include "session_test_util.h"

namespace hisparse {
namespace session_groups_test {

using session_test::AdmitOf;
using session_test::kMiB;
using session_test::kPage;
using session_test::Owner;
using session_test::PagesUsed;
using session_test::Release;

constexpr uint32_t kLayers = 2;

std::unique_ptr<SessionManager> MakeManager(uint64_t pool_bytes, const SessionManager::QuotaOptions& quotas = {}) {
  SessionManager::Options o;
  o.quotas = quotas;
  o.max_sessions = 32;
  return session_test::MakeManager(pool_bytes, o);
}

struct Member {
  std::string group;
  uint32_t rank = 0, size = 0;
  uint32_t uid = 1000, layers = kLayers, record_bytes = 16, rows = 4;
};

absl::StatusOr<v1::SessionRef> Open(SessionManager& sm, const Member& m) {
  v1::OpenSession open = session_test::OpenMessage({"session-groups-test", m.layers, m.record_bytes, m.rows});
  if (!m.group.empty() || m.size != 0) {
    open.mutable_group()->set_name(m.group);
    open.mutable_group()->set_rank(m.rank);
    open.mutable_group()->set_size(m.size);
  }
  return session_test::OpenRef(sm, open, m.uid);
}

// The ranks 0..size-1 of group `name`, each of `rows` rows.
std::vector<v1::SessionRef> OpenGroup(SessionManager& sm, const std::string& name, uint32_t size, uint32_t rows = 4) {
  std::vector<v1::SessionRef> refs;
  for (uint32_t rank = 0; rank < size; ++rank) {
    Member m{name, rank, size};
    m.rows = rows;
    auto ref = Open(sm, m);
    EXPECT_TRUE(ref.ok()) << ref.status();
    refs.push_back(ref.ok() ? *ref : v1::SessionRef());
  }
  return refs;
}

absl::StatusOr<v1::AdmitResponse> Admit(SessionManager& sm, const v1::SessionRef& ref, uint64_t id, uint32_t tokens,
                                        bool group = true) {
  v1::AdmitRequest req = AdmitOf(ref, id, tokens);
  req.set_group(group);
  return sm.Admit(req);
}

TEST(SessionGroups, JoinRefusalsNameWhatIsWrong) {
  auto sm = MakeManager(16 * kMiB);
  auto code = [&](const Member& m) { return Open(*sm, m).status().code(); };
  EXPECT_EQ(code({"", 0, 2}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({"g", 0, 0}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({"g", 0, 65}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({"g", 2, 2}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({std::string(129, 'x'), 0, 2}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({std::string("\xff"), 0, 2}), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(Open(*sm, {"g", 0, 2}).ok());
  const absl::Status twice = Open(*sm, {"g", 0, 2}).status();
  EXPECT_EQ(twice.code(), absl::StatusCode::kAlreadyExists) << twice;
  EXPECT_NE(twice.message().find("rank 0"), std::string::npos) << twice;
  // Another uid's "g" is another group (names are their tenant's): it opens, and takes nothing.
  Member other{"g", 1, 2};
  other.uid = 2000;
  auto theirs = Open(*sm, other);
  EXPECT_TRUE(theirs.ok()) << theirs.status();
  sm->CloseSession(theirs->session_id());
  EXPECT_EQ(code({"g", 1, 4}), absl::StatusCode::kFailedPrecondition);  // another size
  Member layers{"g", 1, 2};
  layers.layers = 3;
  const absl::Status geometry = Open(*sm, layers).status();
  EXPECT_EQ(geometry.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(geometry.message().find("num_layers"), std::string::npos) << geometry;
  Member record{"g", 1, 2};
  record.record_bytes = 32;
  EXPECT_EQ(code(record), absl::StatusCode::kFailedPrecondition);
  // max_requests may differ: every rank has its own rows.
  Member rows{"g", 1, 2};
  rows.rows = 7;
  EXPECT_TRUE(Open(*sm, rows).ok());
  EXPECT_EQ(sm->Stats().sessions(), 2u);  // the refused opened nothing
  EXPECT_INVARIANTS(*sm);
}

TEST(SessionGroups, OneSetOfPagesForEveryRank) {
  auto sm = MakeManager(16 * kMiB);
  const auto refs = OpenGroup(*sm, "tp4", 4);
  const uint32_t tokens = 1000;  // 4 pages a layer
  auto first = Admit(*sm, refs[1], 7, tokens);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_INVARIANTS(*sm);
  const uint64_t one_copy = 4 * kLayers;
  EXPECT_EQ(PagesUsed(*sm), one_copy);  // not 4x
  for (size_t rank = 0; rank < refs.size(); ++rank) {
    if (rank == 1) continue;
    auto attached = Admit(*sm, refs[rank], 7, tokens);
    ASSERT_TRUE(attached.ok()) << attached.status();
    ASSERT_EQ(attached->layers_size(), first->layers_size());
    for (int l = 0; l < first->layers_size(); ++l) {
      ASSERT_EQ(attached->layers(l).pages_size(), first->layers(l).pages_size());
      for (int i = 0; i < first->layers(l).pages_size(); ++i) {
        EXPECT_EQ(attached->layers(l).pages(i).slab(), first->layers(l).pages(i).slab());
        EXPECT_EQ(attached->layers(l).pages(i).offset(), first->layers(l).pages(i).offset());
        EXPECT_FALSE(attached->layers(l).pages(i).read_only());  // every rank writes the same bytes
      }
    }
    EXPECT_INVARIANTS(*sm);
  }
  EXPECT_EQ(PagesUsed(*sm), one_copy);
  // A record written through one rank is the one every rank reads.
  auto w = sm->RecordForTest(refs[1].session_id(), 7, 1, 999);
  ASSERT_TRUE(w.ok()) << w.status();
  std::memset(*w, 0x5a, 16);
  for (const auto& ref : refs) {
    auto r = sm->RecordForTest(ref.session_id(), 7, 1, 999);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(*r, *w);
  }
  // Attaching twice, or with another budget, is refused.
  EXPECT_EQ(Admit(*sm, refs[0], 7, tokens).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Admit(*sm, refs[1], 7, tokens).status().code(), absl::StatusCode::kAlreadyExists);
  auto ungrouped = Admit(*sm, refs[0], 7, tokens, /*group=*/false);
  EXPECT_EQ(ungrouped.status().code(), absl::StatusCode::kAlreadyExists);
  // Stats: 1x for the node, the group and the sessions together.
  const v1::StatsResponse st = sm->Stats();
  EXPECT_EQ(st.host_pool().used_bytes(), one_copy * kPage);
  EXPECT_EQ(st.host_pool().group_bytes(), one_copy * kPage);
  EXPECT_EQ(st.host_pool().pages_shared(), one_copy);
  uint64_t session_bytes = 0;
  for (const auto& ss : st.session_stats()) {
    session_bytes += ss.host_bytes();
    EXPECT_EQ(ss.group().name(), "tp4");
    EXPECT_EQ(ss.group().size(), 4u);
  }
  EXPECT_EQ(session_bytes, one_copy * kPage);
  ASSERT_EQ(st.groups_size(), 1);
  EXPECT_EQ(st.groups(0).name(), "tp4");
  EXPECT_EQ(st.groups(0).requests(), 1u);
  EXPECT_EQ(st.groups(0).shares(), 4u);
  EXPECT_EQ(st.groups(0).host_bytes(), one_copy * kPage);
  EXPECT_EQ(st.groups(0).rank_sessions_size(), 4);
  EXPECT_GE(st.groups(0).slabs(), 1u);
  EXPECT_TRUE(st.host_pool().slabs_by_session().empty());  // the group's slabs are no session's
  auto listed = sm->ListRequests({});
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->requests_size(), 4);
  for (const auto& info : listed->requests()) {
    EXPECT_EQ(info.group(), "tp4");
    EXPECT_EQ(info.group_holders(), 4u);
    EXPECT_EQ(info.host_bytes(), one_copy * kPage);
    EXPECT_EQ(info.shared_bytes(), one_copy * kPage);
  }
}

TEST(SessionGroups, AdmissionNeedsEveryRank) {
  auto sm = MakeManager(16 * kMiB);
  auto r0 = Open(*sm, {"g", 0, 3});
  auto r2 = Open(*sm, {"g", 2, 3});
  ASSERT_TRUE(r0.ok() && r2.ok());
  const absl::Status early = Admit(*sm, *r0, 1, 100).status();
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition) << early;
  EXPECT_NE(early.message().find("rank(s) 1 of 3"), std::string::npos) << early;
  EXPECT_EQ(PagesUsed(*sm), 0u);
  EXPECT_INVARIANTS(*sm);
  // A session in no group cannot ask for a group admission.
  auto alone = Open(*sm, {});
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ(Admit(*sm, *alone, 1, 100).status().code(), absl::StatusCode::kFailedPrecondition);
  auto r1 = Open(*sm, {"g", 1, 3});
  ASSERT_TRUE(r1.ok());
  ASSERT_TRUE(Admit(*sm, *r0, 1, 100).ok());
  // Groups take no shared prefix and no import.
  v1::AdmitRequest child;
  *child.mutable_session() = *r0;
  child.set_request_id(2);
  child.set_token_budget(100);
  child.set_group(true);
  child.set_parent_request_id(1);
  child.set_prefix_tokens(10);
  EXPECT_EQ(sm->Admit(child).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Admit(*sm, *r1, 1, 200).status().code(), absl::StatusCode::kInvalidArgument);  // another budget
  EXPECT_INVARIANTS(*sm);
}

// A group request is never durable: its pages are the group's, which no adopter could take over.
// A lease at admission is INVALID_ARGUMENT and reserves nothing; SetLease on a share is
// FAILED_PRECONDITION and leaves it as it was.
TEST(SessionGroups, AGroupRequestIsNeverDurable) {
  auto sm = MakeManager(16 * kMiB);
  const std::vector<v1::SessionRef> refs = OpenGroup(*sm, "g", 2);
  v1::AdmitRequest req;
  *req.mutable_session() = refs[0];
  req.set_request_id(1);
  req.set_token_budget(100);
  req.set_group(true);
  req.set_lease_seconds(60);
  const absl::Status leased = sm->Admit(req).status();
  EXPECT_EQ(leased.code(), absl::StatusCode::kInvalidArgument) << leased;
  EXPECT_EQ(PagesUsed(*sm), 0u);
  EXPECT_INVARIANTS(*sm);
  ASSERT_TRUE(Admit(*sm, refs[0], 1, 100).ok());
  v1::SetLeaseRequest lease;
  *lease.mutable_session() = refs[0];
  lease.set_request_id(1);
  lease.set_lease_seconds(60);
  const absl::Status set = sm->SetLease(lease).status();
  EXPECT_EQ(set.code(), absl::StatusCode::kFailedPrecondition) << set;
  sm->CloseSession(refs[0].session_id());  // its share goes with it: nothing becomes an orphan
  EXPECT_EQ(sm->Stats().orphaned_requests(), 0u);
  EXPECT_GT(PagesUsed(*sm), 0u);  // rank 1's share (reserved for it) still holds the pages
  EXPECT_INVARIANTS(*sm);
}

// Found by the session-manager fuzzer: a reservation gives every rank a request of that id, so a
// rank whose session already holds the id (admitted without group) is ALREADY_EXISTS, and nothing
// is reserved for any rank: its own request stays as it was.
TEST(SessionGroups, AnIdAnotherRankHoldsReservesNothing) {
  auto sm = MakeManager(16 * kMiB);
  const std::vector<v1::SessionRef> refs = OpenGroup(*sm, "g", 2);
  ASSERT_TRUE(Admit(*sm, refs[1], 5, 100, /*group=*/false).ok());
  const uint64_t pages = PagesUsed(*sm);
  const absl::Status taken = Admit(*sm, refs[0], 5, 100).status();
  EXPECT_EQ(taken.code(), absl::StatusCode::kAlreadyExists) << taken;
  EXPECT_NE(taken.message().find("rank 1"), std::string::npos) << taken;
  EXPECT_EQ(PagesUsed(*sm), pages);
  EXPECT_EQ(sm->Stats().requests(), 1u);
  EXPECT_INVARIANTS(*sm);
  ASSERT_TRUE(Release(*sm, refs[1], 5).ok());  // rank 1's own request, released as any other
  EXPECT_EQ(PagesUsed(*sm), 0u);
  ASSERT_TRUE(Admit(*sm, refs[0], 5, 100).ok());  // the id is free now: reserved for both
  EXPECT_EQ(sm->Stats().requests(), 2u);
  EXPECT_INVARIANTS(*sm);
}

// Found by the session-manager fuzzer: a group share's pages are the group's (owned in the pool by
// the group), so a request of the session cannot share a prefix of them: FAILED_PRECONDITION,
// nothing taken.
TEST(SessionGroups, AGroupShareIsNoParentOfASharedPrefix) {
  auto sm = MakeManager(16 * kMiB);
  const std::vector<v1::SessionRef> refs = OpenGroup(*sm, "g", 1);
  ASSERT_TRUE(Admit(*sm, refs[0], 3, 512).ok());
  const uint64_t pages = PagesUsed(*sm);
  for (uint32_t prefix : {256u, 300u}) {  // whole pages only, and a partial page to copy
    v1::AdmitRequest child;
    *child.mutable_session() = refs[0];
    child.set_request_id(6);
    child.set_token_budget(1024);
    child.set_parent_request_id(3);
    child.set_prefix_tokens(prefix);
    const absl::Status shared = sm->Admit(child).status();
    EXPECT_EQ(shared.code(), absl::StatusCode::kFailedPrecondition) << shared;
    EXPECT_EQ(PagesUsed(*sm), pages);
    EXPECT_EQ(sm->Stats().requests(), 1u);
    EXPECT_INVARIANTS(*sm);
  }
}

TEST(SessionGroups, FullPoolReservesNothingForAnyRank) {
  auto sm = MakeManager(16 * kPage);  // 16 pages in all
  const auto refs = OpenGroup(*sm, "g", 2);
  ASSERT_TRUE(Admit(*sm, refs[0], 1, 256 * 4).ok());  // 8 pages
  EXPECT_INVARIANTS(*sm);
  const absl::Status full = Admit(*sm, refs[1], 2, 256 * 5).status();  // 10 more: no room
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_EQ(PagesUsed(*sm), 8u);
  EXPECT_INVARIANTS(*sm);
  // No rank holds a row or a share of request 2: each may admit it as its own.
  for (const auto& ref : refs) {
    auto own = Admit(*sm, ref, 2, 256, /*group=*/false);
    ASSERT_TRUE(own.ok()) << own.status();
    EXPECT_EQ(own->row(), 1u);  // row 0 is request 1's
  }
  EXPECT_INVARIANTS(*sm);
}

TEST(SessionGroups, OneRanksFullArenaReservesNothing) {
  auto sm = MakeManager(16 * kMiB);
  auto r0 = Open(*sm, {"g", 0, 2});
  Member one_row{"g", 1, 2};
  one_row.rows = 1;
  auto r1 = Open(*sm, one_row);
  ASSERT_TRUE(r0.ok() && r1.ok());
  ASSERT_TRUE(Admit(*sm, *r1, 50, 100, /*group=*/false).ok());  // rank 1's only row
  const uint64_t before = PagesUsed(*sm);
  const absl::Status no_row = Admit(*sm, *r0, 1, 100).status();
  EXPECT_EQ(no_row.code(), absl::StatusCode::kResourceExhausted) << no_row;
  EXPECT_NE(no_row.message().find("rank 1"), std::string::npos) << no_row;
  EXPECT_EQ(PagesUsed(*sm), before);
  EXPECT_INVARIANTS(*sm);
  auto own = Admit(*sm, *r0, 1, 100, /*group=*/false);  // rank 0's row 0 is still free
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(own->row(), 0u);
  ASSERT_TRUE(Release(*sm, *r0, 1).ok());
  ASSERT_TRUE(Release(*sm, *r1, 50).ok());
  ASSERT_TRUE(Admit(*sm, *r0, 1, 100).ok());  // room on every rank now
  EXPECT_INVARIANTS(*sm);
}

TEST(SessionGroups, TheTenantIsChargedOnce) {
  SessionManager::QuotaOptions quotas;
  quotas.pages = 4 * kLayers;  // exactly one request of 1024 tokens
  auto sm = MakeManager(16 * kMiB, quotas);
  const auto refs = OpenGroup(*sm, "g", 4);
  ASSERT_TRUE(Admit(*sm, refs[0], 1, 1024).ok());  // 8 pages, charged once (4x would be refused)
  for (size_t rank = 1; rank < refs.size(); ++rank) {
    auto attached = Admit(*sm, refs[rank], 1, 1024);
    EXPECT_TRUE(attached.ok()) << attached.status();
  }
  EXPECT_EQ(sm->Stats().host_pool().pages_used(), 4 * kLayers);
  EXPECT_EQ(Admit(*sm, refs[0], 2, 256).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_INVARIANTS(*sm);
}

TEST(SessionGroups, SharesReleaseOneByOneThePagesGoWithTheLast) {
  auto sm = MakeManager(16 * kMiB);
  const auto refs = OpenGroup(*sm, "g", 3);
  ASSERT_TRUE(Admit(*sm, refs[0], 9, 512).ok());  // 2 pages a layer
  ASSERT_TRUE(Admit(*sm, refs[2], 9, 512).ok());
  auto rec = sm->RecordForTest(refs[1].session_id(), 9, 0, 300);
  ASSERT_TRUE(rec.ok());
  std::memset(*rec, 0x33, 16);
  // The payer (rank 0, which admitted) goes first: the charge passes on, the pages stay.
  ASSERT_TRUE(Release(*sm, refs[0], 9).ok());
  EXPECT_INVARIANTS(*sm);
  EXPECT_EQ(PagesUsed(*sm), 4u);
  EXPECT_EQ(Release(*sm, refs[0], 9).code(), absl::StatusCode::kNotFound);
  // Rank 0 released its share: it cannot take one again for the same request.
  EXPECT_EQ(Admit(*sm, refs[0], 9, 512).status().code(), absl::StatusCode::kFailedPrecondition);
  auto still = sm->RecordForTest(refs[2].session_id(), 9, 0, 300);
  ASSERT_TRUE(still.ok());
  EXPECT_EQ((*still)[15], 0x33);
  // Rank 1 never attached: its reserved share is released all the same.
  ASSERT_TRUE(Release(*sm, refs[1], 9).ok());
  EXPECT_INVARIANTS(*sm);
  EXPECT_EQ(PagesUsed(*sm), 4u);
  // An operator's eviction of the last share frees the pages.
  v1::EvictRequest ev;
  ev.set_session_id(refs[2].session_id());
  ev.set_request_id(9);
  auto evicted = sm->Evict(ev);
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_EQ(evicted->freed_bytes(), 4 * kPage);
  EXPECT_EQ(PagesUsed(*sm), 0u);
  EXPECT_INVARIANTS(*sm);
  // The id is free for the group again.
  ASSERT_TRUE(Admit(*sm, refs[1], 9, 512).ok());
  EXPECT_INVARIANTS(*sm);
}

TEST(SessionGroups, EvictingOneShareFreesNothingWhileOthersHold) {
  auto sm = MakeManager(16 * kMiB);
  const auto refs = OpenGroup(*sm, "g", 2);
  ASSERT_TRUE(Admit(*sm, refs[0], 1, 256).ok());
  v1::EvictRequest ev;
  ev.set_session_id(refs[0].session_id());
  ev.set_request_id(1);
  auto evicted = sm->Evict(ev);
  ASSERT_TRUE(evicted.ok());
  EXPECT_EQ(evicted->freed_bytes(), 0u);
  EXPECT_EQ(PagesUsed(*sm), kLayers);
  EXPECT_INVARIANTS(*sm);
}

TEST(SessionGroups, AMemberDiesItsSharesGoTheGroupGoesWithTheLast) {
  auto sm = MakeManager(16 * kMiB);
  auto refs = OpenGroup(*sm, "g", 2);
  ASSERT_TRUE(Admit(*sm, refs[0], 1, 256).ok());
  ASSERT_TRUE(Admit(*sm, refs[1], 1, 256).ok());
  ASSERT_TRUE(Admit(*sm, refs[0], 2, 256).ok());  // rank 1 never attaches this one
  EXPECT_EQ(PagesUsed(*sm), 2 * kLayers);
  sm->CloseSession(refs[0].session_id());  // the payer of both dies
  EXPECT_INVARIANTS(*sm);
  EXPECT_EQ(PagesUsed(*sm), 2 * kLayers);  // rank 1 still holds a share of each
  v1::StatsResponse st = sm->Stats();
  ASSERT_EQ(st.groups_size(), 1);
  EXPECT_EQ(st.groups(0).rank_sessions(0), 0u);
  EXPECT_EQ(st.groups(0).shares(), 2u);
  // The group lacks rank 0: no new group admission until a session takes it again.
  EXPECT_EQ(Admit(*sm, refs[1], 3, 256).status().code(), absl::StatusCode::kFailedPrecondition);
  auto again = Open(*sm, {"g", 0, 2});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(Admit(*sm, *again, 1, 256).status().code(), absl::StatusCode::kFailedPrecondition);  // before it joined
  ASSERT_TRUE(Admit(*sm, *again, 3, 256).ok());
  EXPECT_INVARIANTS(*sm);
  sm->CloseSession(again->session_id());
  sm->CloseSession(refs[1].session_id());
  EXPECT_INVARIANTS(*sm);
  sm->WaitPoolIdle();
  st = sm->Stats();
  EXPECT_EQ(st.groups_size(), 0);
  EXPECT_EQ(st.host_pool().pages_used(), 0u);
  EXPECT_EQ(st.host_pool().slabs(), 0u);  // the group's slabs left with it
  // The name is free: another tenant may make a group of it now.
  Member other{"g", 0, 1};
  other.uid = 2000;
  EXPECT_TRUE(Open(*sm, other).ok());
}

TEST(SessionGroups, FdChannelHandsGroupSlabsToMembersAlone) {
  auto sm = MakeManager(16 * kMiB);
  const auto refs = OpenGroup(*sm, "g", 2);
  auto other_group = Open(*sm, {"h", 0, 1});
  auto alone = Open(*sm, {});
  ASSERT_TRUE(other_group.ok() && alone.ok());
  auto admitted = Admit(*sm, refs[0], 1, 256);
  ASSERT_TRUE(admitted.ok());
  const uint64_t slab = admitted->layers(0).pages(0).slab();
  for (const auto& ref : refs) {
    auto fd = sm->DupFdFor(ref.session_id(), ref.token(), FdObject{FdSlab{slab}}, Owner(1000));
    EXPECT_TRUE(fd.ok()) << fd.status();
  }
  for (const auto& ref : {*other_group, *alone}) {
    auto fd = sm->DupFdFor(ref.session_id(), ref.token(), FdObject{FdSlab{slab}}, Owner(1000));
    EXPECT_EQ(fd.status().code(), absl::StatusCode::kPermissionDenied);
  }
  auto wrong_uid = sm->DupFdFor(refs[1].session_id(), refs[1].token(), FdObject{FdSlab{slab}}, Owner(2000));
  EXPECT_EQ(wrong_uid.status().code(), absl::StatusCode::kPermissionDenied);
}

absl::StatusOr<v1::ExtendResponse> Extend(SessionManager& sm, const v1::SessionRef& ref, uint64_t id, uint32_t tokens) {
  v1::ExtendRequest req;
  *req.mutable_session() = ref;
  req.set_request_id(id);
  req.set_token_budget(tokens);
  return sm.Extend(req);
}

TEST(SessionGroups, ExtendGrowsEveryRanksShareOnce) {
  auto sm = MakeManager(16 * kPage);  // 16 pages
  const auto refs = OpenGroup(*sm, "g", 3);
  ASSERT_TRUE(Admit(*sm, refs[0], 1, 256).ok());  // 1 page a layer
  ASSERT_TRUE(Admit(*sm, refs[1], 1, 256).ok());
  auto grown = Extend(*sm, refs[1], 1, 768);  // 3 pages a layer, for every rank
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_EQ(grown->capacity_tokens(), 768u);
  EXPECT_EQ(PagesUsed(*sm), 3 * kLayers);
  EXPECT_INVARIANTS(*sm);
  // The other ranks' half: an Extend to the capacity it has now answers the same pages.
  for (size_t rank : {0, 2}) {
    auto mine = Extend(*sm, refs[rank], 1, 768);
    ASSERT_TRUE(mine.ok()) << mine.status();
    ASSERT_EQ(mine->layers_size(), grown->layers_size());
    for (int l = 0; l < mine->layers_size(); ++l) {
      ASSERT_EQ(mine->layers(l).pages_size(), 3);
      for (int i = 0; i < 3; ++i) EXPECT_EQ(mine->layers(l).pages(i).slab(), grown->layers(l).pages(i).slab());
    }
  }
  EXPECT_EQ(PagesUsed(*sm), 3 * kLayers);
  EXPECT_EQ(Extend(*sm, refs[2], 1, 512).status().code(), absl::StatusCode::kInvalidArgument);  // below it
  // A full pool leaves every share as it was.
  EXPECT_EQ(Extend(*sm, refs[0], 1, 256 * 9).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(PagesUsed(*sm), 3 * kLayers);
  EXPECT_INVARIANTS(*sm);
  // The payer leaves: the next holder carries the grown charge; the last share frees it all.
  for (const auto& ref : refs) {
    ASSERT_TRUE(Release(*sm, ref, 1).ok());
    EXPECT_INVARIANTS(*sm);
  }
  EXPECT_EQ(PagesUsed(*sm), 0u);
}

// The metrics count a TP-4 group's request once: its bytes, one request, four shares.
TEST(SessionGroups, MetricsCountTheGroupsPagesOnce) {
  auto sm = MakeManager(16 * kMiB);
  const auto refs = OpenGroup(*sm, "g", 4);
  for (const auto& ref : refs) ASSERT_TRUE(Admit(*sm, ref, 1, 256).ok());
  Metrics metrics(sm.get());
  auto value = [&](const std::string& name) {
    for (const prometheus::MetricFamily& f : metrics.Collect()) {
      if (f.name == name && f.metric.size() == 1) return f.metric[0].gauge.value;
    }
    return -1.0;
  };
  EXPECT_EQ(value("hisparse_tp_groups"), 1);
  EXPECT_EQ(value("hisparse_host_pool_group_bytes"), kLayers * kPage);
  EXPECT_EQ(value("hisparse_tp_group_requests"), 1);
  EXPECT_EQ(value("hisparse_tp_group_shares"), 4);
}

}  // namespace session_groups_test
}  // namespace hisparse
