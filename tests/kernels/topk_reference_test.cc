// TopkReference (topk.h) against each rule of its contract, on hand-made rows and, as properties,
// on every kind of row the GPU test also runs (topk_cases.h).
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hisparse/kernels/topk.h"
#include "topk_cases.h"

namespace hisparse {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<int32_t> One(const std::vector<float>& row, int32_t k) {
  std::vector<int32_t> out(k, 12345);
  TopkDesc d;
  d.scores = row.data();
  d.ld = d.cols = static_cast<int32_t>(row.size());
  d.rows = 1;
  d.k = k;
  d.positions = out.data();
  EXPECT_EQ(CheckTopkDesc(d), "");
  TopkReference(d);
  return out;
}

uint32_t KeyOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return TopkKey(b);
}

TEST(TopkReference, AscendingPositionsOfTheLargest) {
  EXPECT_THAT(One({5, 1, 4, 0}, 2), ElementsAre(0, 2));
  EXPECT_THAT(One({0, 9, 1, 8, 2, 7}, 3), ElementsAre(1, 3, 5));
}

TEST(TopkReference, TiesGoToTheLowerPositions) {
  EXPECT_THAT(One({1, 2, 2, 2, 0}, 2), ElementsAre(1, 2));
  EXPECT_THAT(One({2, 3, 2, 2}, 3), ElementsAre(0, 1, 2));
}

TEST(TopkReference, NeverMinusInfOrNaNAndPaddedWithMinusOne) {
  EXPECT_THAT(One({-kInf, kNaN, 1, -kNaN}, 3), ElementsAre(2, -1, -1));
  EXPECT_THAT(One({-kInf, -kInf}, 2), ElementsAre(-1, -1));
}

TEST(TopkReference, TotalOrderOfBits) {
  EXPECT_THAT(One({-0.0f, 0.0f}, 1), ElementsAre(1));            // -0 below +0
  EXPECT_THAT(One({3, kInf, -5, 1e30f}, 2), ElementsAre(1, 3));  // +inf is selectable
  EXPECT_THAT(One({-1, -3, -2}, 2), ElementsAre(0, 2));
}

TEST(TopkReference, BatchSizeAndSeqLensBoundWhatIsRead) {
  // Three rows of 4 (ld 5: the fifth column is never read), batch of 2; row 1 cut to 2 scores.
  const std::vector<float> s = {1, 2, 3, 4, 99, 4, 3, 2, 1, 99, 7, 7, 7, 7, 99};
  const int32_t batch = 2, lens[3] = {9, 2, 4};
  std::vector<int32_t> out(3 * 3, 12345);
  TopkDesc d;
  d.scores = s.data();
  d.ld = 5;
  d.cols = 4;
  d.rows = 3;
  d.k = 3;
  d.batch_size = &batch;
  d.seq_lens = lens;
  d.positions = out.data();
  ASSERT_EQ(CheckTopkDesc(d), "");
  TopkReference(d);
  EXPECT_THAT(out, ElementsAre(1, 2, 3, 0, 1, -1, -1, -1, -1));
  const int32_t negative[3] = {-4, 0, 4};
  d.seq_lens = negative;
  TopkReference(d);
  EXPECT_THAT(out, ElementsAre(-1, -1, -1, -1, -1, -1, -1, -1, -1));
}

TEST(TopkReference, RefusesWhatItCannotRun) {
  std::vector<float> s(8);
  std::vector<int32_t> out(8);
  TopkDesc d;
  d.scores = s.data();
  d.positions = out.data();
  d.ld = d.cols = 8;
  d.rows = 1;
  d.k = 0;
  EXPECT_THAT(CheckTopkDesc(d), HasSubstr("k must"));
  d.k = 2;
  d.ld = 4;
  EXPECT_THAT(CheckTopkDesc(d), HasSubstr("ld"));
  d.ld = 8;
  d.cols = kTopkMaxCols + 1;
  d.ld = d.cols;
  EXPECT_THAT(CheckTopkDesc(d), HasSubstr("2^30"));
  d.cols = 8;
  d.ld = std::numeric_limits<int64_t>::max() / 2;
  d.rows = 3;
  EXPECT_THAT(CheckTopkDesc(d), HasSubstr("overflows"));
  d.ld = 8;
  d.positions = nullptr;
  EXPECT_THAT(CheckTopkDesc(d), HasSubstr("null"));
}

// Every kind of row, as properties: the list is ascending, holds min(k, selectable) positions of
// selectable scores, none of them below a score left out, and a score left out that equals one
// taken sits at a higher position.
TEST(TopkReference, PropertiesOnEveryKindOfRow) {
  for (const auto& kind : testing::TopkKinds()) {
    for (int k : {1, 7, 300, 5000}) {
      const std::vector<float> row = testing::TopkRow(kind, 4099, 17 + k);
      const std::vector<int32_t> out = One(row, k);
      std::vector<bool> taken(row.size(), false);
      int selectable = 0;
      for (float f : row) selectable += TopkSelectable(KeyOf(f));
      const int want = std::min(k, selectable);
      for (int j = 0; j < k; ++j) {
        if (j >= want) {
          ASSERT_EQ(out[j], -1) << kind << " k " << k << " col " << j;
          continue;
        }
        ASSERT_GE(out[j], 0);
        if (j > 0) {
          ASSERT_LT(out[j - 1], out[j]) << kind;
        }
        ASSERT_TRUE(TopkSelectable(KeyOf(row[out[j]]))) << kind;
        taken[out[j]] = true;
      }
      uint32_t least = std::numeric_limits<uint32_t>::max();
      int32_t last_at_least = -1;
      for (int j = 0; j < want; ++j) {
        const uint32_t key = KeyOf(row[out[j]]);
        if (key < least) least = key;
      }
      for (int j = 0; j < want; ++j) {
        if (KeyOf(row[out[j]]) == least) last_at_least = out[j];
      }
      for (size_t p = 0; p < row.size(); ++p) {
        const uint32_t key = KeyOf(row[p]);
        if (taken[p] || !TopkSelectable(key)) continue;
        ASSERT_LE(key, least) << kind << " k " << k << " position " << p;
        if (key == least) {
          ASSERT_GT(static_cast<int32_t>(p), last_at_least) << kind << " k " << k;
        }
      }
    }
  }
}

}  // namespace
}  // namespace hisparse
