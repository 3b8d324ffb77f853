// ImportGrants (import_grants.h): a grant's life (open busy, published, busy again, spent or
// forgotten), the refusal each kind of misuse gets, the bounded memory of spent grants, and the
// sweeps' views (due, still open, a session's busy ones).
#include "hisparse/daemon/import_grants.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hisparse {
namespace {

using ::testing::UnorderedElementsAre;
using End = ImportGrants::End;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

ImportGrants::Grant G(uint64_t session, uint64_t request, absl::Time expires = kT0 + absl::Seconds(30)) {
  return ImportGrants::Grant{session, request, /*tenant_uid=*/500, expires};
}

TEST(ImportGrantsTest, AGrantIsUsableOnlyOncePublishedAndOnlyByItsRequestAndTenant) {
  ImportGrants grants;
  grants.Open("g1", G(1, 7));
  EXPECT_EQ(grants.Check("g1", 1, 7, 500).code(), absl::StatusCode::kFailedPrecondition) << "busy until published";
  grants.Publish("g1");
  EXPECT_TRUE(grants.Check("g1", 1, 7, 500).ok());
  EXPECT_TRUE(grants.Check("g1", 1, 7, std::nullopt).ok()) << "the daemon itself";
  EXPECT_EQ(grants.Check("g1", 1, 8, 500).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(grants.Check("g1", 2, 7, 500).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(grants.Check("g1", 1, 7, 501).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(grants.Check("", 1, 7, 500).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(grants.Check("nope", 1, 7, 500).code(), absl::StatusCode::kNotFound);
  grants.MarkBusy("g1");
  EXPECT_EQ(grants.Check("g1", 1, 7, 500).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(grants.AnyBusyOf(1));
  EXPECT_FALSE(grants.AnyBusyOf(2));
}

TEST(ImportGrantsTest, ASpentGrantIsRefusedForHowItEnded) {
  ImportGrants grants;
  for (const char* id : {"c", "a", "e", "f"}) {
    grants.Open(id, G(1, 7));
    grants.Publish(id);
  }
  EXPECT_EQ(grants.Finish("c", End::kCommitted).request_id, 7u);
  grants.Finish("a", End::kAborted);
  grants.Finish("e", End::kExpired);
  grants.Forget("f");  // never usable: not remembered
  const absl::Status committed = grants.Check("c", 1, 7, 500);
  EXPECT_EQ(committed.code(), absl::StatusCode::kAlreadyExists) << committed;
  EXPECT_THAT(std::string(committed.message()), ::testing::HasSubstr("committed already"));
  EXPECT_THAT(std::string(grants.Check("a", 1, 7, 500).message()), ::testing::HasSubstr("aborted"));
  EXPECT_THAT(std::string(grants.Check("e", 1, 7, 500).message()), ::testing::HasSubstr("expired"));
  EXPECT_EQ(grants.Check("f", 1, 7, 500).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(grants.ended(End::kCommitted), 1u);
  EXPECT_EQ(grants.ended(End::kAborted), 1u);
  EXPECT_EQ(grants.ended(End::kExpired), 1u);
  EXPECT_TRUE(grants.empty());
  // Never the grant id itself in a message: six characters of it.
  EXPECT_EQ(ShortGrantId("0123456789abcdef"), "012345...");
}

TEST(ImportGrantsTest, SpentGrantsAreRememberedUpToABound) {
  ImportGrants grants;
  const size_t n = ImportGrants::kSpent + 10;
  for (size_t i = 0; i < n; ++i) {
    const std::string id = absl::StrCat("g", i);
    grants.Open(id, G(1, i));
    grants.Finish(id, End::kAborted);
  }
  EXPECT_EQ(grants.Check("g0", 1, 0, 500).code(), absl::StatusCode::kNotFound) << "the oldest are forgotten";
  EXPECT_EQ(grants.Check("g9", 1, 9, 500).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(grants.Check("g10", 1, 10, 500).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(grants.ended(End::kAborted), n);
}

TEST(ImportGrantsTest, SweepsSeeDueStillOpenAndASessionsGrants) {
  ImportGrants grants;
  grants.Open("early", G(1, 1, kT0 + absl::Seconds(5)));
  grants.Open("late", G(1, 2, kT0 + absl::Seconds(50)));
  grants.Open("busy", G(2, 3, kT0 + absl::Seconds(5)));  // never published: registering
  grants.Publish("early");
  grants.Publish("late");
  std::vector<std::string> due;
  for (const ImportGrants::Ref& r : grants.Due(kT0 + absl::Seconds(10))) due.push_back(r.id);
  EXPECT_THAT(due, UnorderedElementsAre("early")) << "a busy grant is not due: its registration owns it";
  std::vector<std::string> open;
  for (const ImportGrants::Ref& r : grants.StillOpen({"late", "gone", "busy"})) open.push_back(r.id);
  EXPECT_THAT(open, UnorderedElementsAre("late", "busy"));
  EXPECT_THAT(grants.FinishAllOf(1, End::kAborted), UnorderedElementsAre("early", "late"));
  EXPECT_EQ(grants.open_count(), 1u);
  EXPECT_EQ(grants.Check("late", 1, 2, 500).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace hisparse
