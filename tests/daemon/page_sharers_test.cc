// PageSharers alone: who holds each shared page, who pays for it, and the charge passing on to
// the next holder when the payer lets go.
#include "hisparse/daemon/page_sharers.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hisparse {
namespace page_sharers_test {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using Page = PagePool::Page;

TEST(PageSharersTest, TheFirstHolderPaysAndPassesItOn) {
  PageSharers sharers;
  const Page a{1, 0}, b{1, 1}, own{1, 2};
  sharers.Share(a, /*parent=*/10, /*child=*/11);
  sharers.Share(b, 10, 11);
  sharers.Share(a, 10, 12);  // a third holder of page a
  EXPECT_TRUE(sharers.IsShared(a));
  EXPECT_FALSE(sharers.IsShared(own));
  EXPECT_THAT(sharers.all().at(a), ElementsAre(10, 11, 12));
  EXPECT_EQ(sharers.SharedOf({{a, b, own}}), 2u);
  // The parent lets go: 11 pays for both pages now; page b has one holder left, so is not shared.
  EXPECT_THAT(sharers.Unshare(10, {{a, b}}), ElementsAre(11, 11));
  EXPECT_THAT(sharers.all().at(a), ElementsAre(11, 12));
  EXPECT_FALSE(sharers.IsShared(b));
  // A holder that is not the payer passes nothing on.
  EXPECT_THAT(sharers.Unshare(12, {{a}}), IsEmpty());
  EXPECT_TRUE(sharers.empty());
}

TEST(PageSharersTest, MergeMovesAnotherSessionsPagesIn) {
  PageSharers mine, adopted;
  mine.Share(Page{1, 0}, 10, 11);
  adopted.Share(Page{2, 0}, 20, 21);
  mine.Merge(adopted);
  EXPECT_TRUE(adopted.empty());
  EXPECT_TRUE(mine.IsShared(Page{2, 0}));
  EXPECT_EQ(mine.all().size(), 2u);
}

}  // namespace page_sharers_test
}  // namespace hisparse
