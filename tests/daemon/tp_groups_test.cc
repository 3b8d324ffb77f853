// TpGroups alone: OpenSession.group's checks, joining and leaving ranks, a group's pool owner
// from the session counter, names that are each tenant's own, and a share's listing fields.
#include "hisparse/daemon/tp_groups.h"

#include <cstdint>
#include <optional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hisparse {
namespace tp_groups_test {

using ::testing::HasSubstr;

v1::TpGroup Rank(const std::string& name, uint32_t rank, uint32_t size) {
  v1::TpGroup g;
  g.set_name(name);
  g.set_rank(rank);
  g.set_size(size);
  return g;
}

SessionEntry Member(uint64_t id, uint32_t tenant, uint32_t layers = 4) {
  SessionEntry s;
  s.id = id;
  s.tenant_uid = tenant;
  s.geometry.set_num_layers(layers);
  s.geometry.set_record_bytes(256);
  return s;
}

TEST(TpGroupsTest, ValidateRefusesMalformedGroups) {
  EXPECT_TRUE(TpGroups::Validate(Rank("tp", 1, 2)).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(TpGroups::Validate(Rank("", 0, 2))));
  EXPECT_TRUE(absl::IsInvalidArgument(TpGroups::Validate(Rank(std::string(129, 'a'), 0, 2))));
  EXPECT_TRUE(absl::IsInvalidArgument(TpGroups::Validate(Rank("\xff", 0, 2))));
  EXPECT_TRUE(absl::IsInvalidArgument(TpGroups::Validate(Rank("tp", 0, 0))));
  EXPECT_TRUE(absl::IsInvalidArgument(TpGroups::Validate(Rank("tp", 0, 65))));
  EXPECT_THAT(TpGroups::Validate(Rank("tp", 2, 2)).message(), HasSubstr("group.rank must be below"));
}

TEST(TpGroupsTest, JoinAndLeaveRanksTheGroupEndsWithItsLastMember) {
  TpGroups groups;
  uint64_t next_id = 10;
  SessionEntry a = Member(1, 100), b = Member(2, 100);
  ASSERT_TRUE(groups.Join(a, Rank("tp", 0, 2), 4096, &next_id).ok());
  EXPECT_EQ(next_id, 11u);  // the group's owner took one id of the counter
  EXPECT_EQ(a.group, "tp");
  const TpGroup* g = groups.Find(a);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->owner, 10u);
  EXPECT_TRUE(groups.IsOwner(10));
  EXPECT_FALSE(groups.IsOwner(1));
  // The rank is held; the size, the layout and the context must match.
  SessionEntry twin = Member(3, 100);
  EXPECT_TRUE(absl::IsAlreadyExists(groups.CheckJoin(twin, Rank("tp", 0, 2), 4096)));
  EXPECT_TRUE(absl::IsFailedPrecondition(groups.CheckJoin(twin, Rank("tp", 1, 4), 4096)));
  SessionEntry wide = Member(4, 100, 8);
  EXPECT_THAT(groups.CheckJoin(wide, Rank("tp", 1, 2), 4096).message(), HasSubstr("geometry.num_layers"));
  EXPECT_TRUE(absl::IsFailedPrecondition(groups.CheckJoin(twin, Rank("tp", 1, 2), 8192)));
  ASSERT_TRUE(groups.Join(b, Rank("tp", 1, 2), 4096, &next_id).ok());
  EXPECT_EQ(next_id, 11u);  // joined, not created
  EXPECT_EQ(groups.Find(b), g);
  EXPECT_EQ(groups.Leave(a), std::nullopt);  // b is left
  EXPECT_EQ(g->ranks[0], 0u);
  EXPECT_EQ(groups.Leave(b), std::optional<uint64_t>(10));  // the last: its owner, to retire
  EXPECT_TRUE(groups.all().empty());
  EXPECT_EQ(groups.Leave(b), std::nullopt);
}

TEST(TpGroupsTest, NamesAreEachTenantsOwn) {
  TpGroups groups;
  uint64_t next_id = 10;
  SessionEntry mine = Member(1, 100), theirs = Member(2, 200);
  ASSERT_TRUE(groups.Join(mine, Rank("tp", 0, 2), 4096, &next_id).ok());
  // Another uid's "tp" rank 0 is another group, not a squat on this one.
  EXPECT_TRUE(groups.CheckJoin(theirs, Rank("tp", 0, 2), 4096).ok());
  ASSERT_TRUE(groups.Join(theirs, Rank("tp", 0, 2), 4096, &next_id).ok());
  EXPECT_EQ(groups.all().size(), 2u);
  EXPECT_NE(groups.Find(mine), groups.Find(theirs));
}

TEST(TpGroupsTest, FillInfoSaysTheHoldersOfAShare) {
  TpGroups groups;
  uint64_t next_id = 10;
  SessionEntry a = Member(1, 100), b = Member(2, 100);
  ASSERT_TRUE(groups.Join(a, Rank("tp", 0, 2), 4096, &next_id).ok());
  ASSERT_TRUE(groups.Join(b, Rank("tp", 1, 2), 4096, &next_id).ok());
  groups.Find(a)->requests[7].holders = {1, 2};
  RequestEntry r;
  r.id = 7;
  v1::RequestInfo info;
  info.set_host_bytes(4096);
  groups.FillInfo(a, r, &info);
  EXPECT_EQ(info.group(), "tp");
  EXPECT_EQ(info.group_holders(), 2u);
  EXPECT_EQ(info.shared_bytes(), 4096u);
}

}  // namespace tp_groups_test
}  // namespace hisparse
