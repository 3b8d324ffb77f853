// PREWARM's CPU reference (prewarm.h) by hand: which addresses it reads of pages placed at known
// offsets from a granule's boundary, what it leaves in the digest, and rule 1's errors. The GPU test
// (tests/gpu/prewarm_gpu_test.cu) holds the kernel to this reference's digest.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "hisparse/kernels/prewarm.h"
#include "hisparse/kernels/resolve.h"

namespace hisparse {
namespace {

// Two rows, two layers, 48-byte records, 4 records a page, granules of 64 bytes: a page of four
// records spans 192 bytes, so where it starts decides how many granules it touches. Row 0's layer 1
// uses pages at pool offsets 16 and 1072 (and a read-only entry for a third page at 2048); every
// other table entry points at a page of its own.
class PrewarmByHand : public ::testing::Test {
 protected:
  static constexpr uint32_t kGranule = 64;
  PrewarmByHand() : pool_(8192 + 64), base_(Aligned(pool_.data())) {
    for (size_t i = 0; i < 8192; i += 8) {
      const uint64_t v = 0x9E3779B97F4A7C15ull * (i + 1);
      std::memcpy(base_ + i, &v, 8);
    }
    g_ = ArenaGeometry{2, 2, 8, 4, 48, 0};
    table_.assign(2 * 2 * 3, nullptr);
    for (int e = 0; e < 4; ++e) {
      for (int p = 0; p < 3; ++p) table_[e * 3 + p] = base_ + 4096 + (e * 3 + p) * 256;
    }
    uint8_t** t = &table_[(0 * 2 + 1) * 3];  // row 0, layer 1
    t[0] = base_ + 16;
    t[1] = base_ + 1072;
    t[2] = HostRecordMap::ReadOnlyEntry(base_ + 2048);
    capacity_ = {12, 12};
    d_.geometry = g_;
    d_.host = HostRecordMap{table_.data(), capacity_.data(), 4, 3};
    d_.layer = 1;
    d_.max_positions = 12;
    d_.granule_bytes = kGranule;
    d_.batch_size = &batch_;
    d_.digest = digest_;
    d_.error_flags = &flags_;
  }
  static uint8_t* Aligned(uint8_t* p) { return p + (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64; }
  // The digest of 16-byte reads at these pool offsets.
  uint64_t Folded(const std::vector<size_t>& offsets) const {
    uint64_t f = 0;
    for (size_t o : offsets) {
      uint64_t h[2];
      std::memcpy(h, base_ + o, 16);
      f ^= h[0] ^ h[1];
    }
    return f;
  }
  void Run(std::vector<int32_t> rows, std::vector<int32_t> seq_lens, int32_t batch) {
    rows_ = std::move(rows);
    seq_lens_ = std::move(seq_lens);
    d_.max_batch = static_cast<int32_t>(rows_.size());
    d_.rows = rows_.data();
    d_.seq_lens = seq_lens_.data();
    batch_ = batch;
    digest_[0] = digest_[1] = 0;
    flags_ = 0;
    ASSERT_EQ(CheckPrewarmDesc(d_), nullptr);
    bits_ = PrewarmReference(d_);
  }

  std::vector<uint8_t> pool_;
  uint8_t* base_;
  ArenaGeometry g_{};
  std::vector<uint8_t*> table_;
  std::vector<int32_t> capacity_, rows_, seq_lens_;
  int32_t batch_ = 0;
  uint64_t digest_[2] = {0, 0};
  uint32_t flags_ = 0, bits_ = 0;
  PrewarmDesc d_{};
};

TEST_F(PrewarmByHand, ReadsOnceInEveryGranuleTheRecordsTouch) {
  // Page 0 [16, 208): at 16, 64, 128, 192. Page 1 holds one record, [1072, 1120): at 1072, 1088.
  Run({0}, {5}, 1);
  EXPECT_EQ(bits_, 0u);
  EXPECT_EQ(digest_[0], 6u);
  EXPECT_EQ(digest_[1], Folded({16, 64, 128, 192, 1072, 1088}));
  // Page 1 full, [1072, 1264): at 1072, 1088, 1152, 1216; three records of page 2 (read-only),
  // [2048, 2192): at 2048, 2112, 2176.
  Run({0}, {11}, 1);
  EXPECT_EQ(digest_[0], 11u);
  EXPECT_EQ(digest_[1], Folded({16, 64, 128, 192, 1072, 1088, 1152, 1216, 2048, 2112, 2176}));
}

TEST_F(PrewarmByHand, AStrideReadsOneGranuleInSoMany) {
  // seq 11 reads at 16, 64, 128, 192, 1072, 1088, 1152, 1216, 2048, 2112, 2176: granules (address /
  // 64) g0 + 0, 1, 2, 3, 16, 17, 18, 19, 32, 33, 34, where g0 is the pool's 64-aligned base's own
  // (the stride counts granules of the address space, so the phase is taken relative to g0 here).
  const uint32_t g0 = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(base_) / kGranule % 3);
  d_.granule_stride = 3;
  d_.granule_phase = (g0 + 1) % 3;  // g0 + 1, 16, 19, 34
  Run({0}, {11}, 1);
  EXPECT_EQ(digest_[0], 4u);
  EXPECT_EQ(digest_[1], Folded({64, 1072, 1216, 2176}));
  d_.granule_phase = g0;  // g0 + 0, 3, 18, 33
  Run({0}, {11}, 1);
  EXPECT_EQ(digest_[0], 4u);
  EXPECT_EQ(digest_[1], Folded({16, 192, 1152, 2112}));
  d_.granule_phase = 3;
  EXPECT_NE(CheckPrewarmDesc(d_), nullptr);
  d_.granule_stride = 0;
  d_.granule_phase = 0;
  EXPECT_NE(CheckPrewarmDesc(d_), nullptr);
}

TEST_F(PrewarmByHand, PaddingAndEntriesPastTheBatchReadNothing) {
  Run({kPadding, 0, 0}, {0, 1, 12}, 2);  // the third entry is past the batch
  EXPECT_EQ(bits_, 0u);
  EXPECT_EQ(digest_[0], 1u);
  EXPECT_EQ(digest_[1], Folded({16}));
  Run({0}, {12}, -3);  // a negative batch is an empty one
  EXPECT_EQ(digest_[0], 0u);
}

TEST_F(PrewarmByHand, BadEntriesAreFlaggedAndReadNothingOthersProceed) {
  capacity_[1] = 0;  // row 1 not admitted
  Run({2, -2, 1, 0, 0, 0}, {1, 1, 1, 0, 13, 1}, 6);
  EXPECT_EQ(bits_, static_cast<uint32_t>(kResolveBadRow | kResolveBadSeqLen));
  EXPECT_EQ(flags_, bits_);
  EXPECT_EQ(digest_[0], 1u);  // only the last entry
  capacity_[1] = 12;
  d_.max_positions = 4;  // a row within its capacity but past max_positions
  Run({0}, {5}, 1);
  EXPECT_EQ(bits_, static_cast<uint32_t>(kResolveBadSeqLen));
  EXPECT_EQ(digest_[0], 0u);
}

TEST_F(PrewarmByHand, OneContiguousRunIsOnePage) {
  table_.assign(2 * 2, nullptr);
  for (int e = 0; e < 4; ++e) table_[e] = base_ + 16 + e * 1024;
  d_.host = HostRecordMap{table_.data(), capacity_.data(), kContiguousRecordsPerPage, 1};
  // Row 1, layer 1: entry 3 at 3088, 12 records [3088, 3664): at 3088, then 3136 .. 3648 (9 more).
  Run({1}, {12}, 1);
  std::vector<size_t> at = {3088};
  for (size_t m = 3136; m < 3664; m += 64) at.push_back(m);
  EXPECT_EQ(digest_[0], at.size());
  EXPECT_EQ(digest_[1], Folded(at));
  EXPECT_EQ(PrewarmMaxPages(d_), 1u);
  EXPECT_EQ(PrewarmMaxReadsOfPage(d_), 1u + (12 * 48 + 63) / 64);
}

TEST_F(PrewarmByHand, TheIndexSpaceCoversEveryPage) {
  EXPECT_EQ(PrewarmMaxPages(d_), 3u);
  EXPECT_EQ(PrewarmMaxReadsOfPage(d_), 1u + 3u);  // 192 bytes: 3 granules, one more when unaligned
  for (uintptr_t start = 0; start < 256; start += 16) {
    EXPECT_LE(PrewarmReadsOfPage(start, 192, kGranule), PrewarmMaxReadsOfPage(d_)) << start;
  }
}

TEST_F(PrewarmByHand, TheChecksNameWhatIsWrong) {
  Run({0}, {1}, 1);
  PrewarmDesc bad = d_;
  bad.granule_bytes = 48;
  EXPECT_NE(CheckPrewarmDesc(bad), nullptr);
  bad = d_;
  bad.layer = 2;
  EXPECT_NE(CheckPrewarmDesc(bad), nullptr);
  bad = d_;
  bad.batch_size = nullptr;
  EXPECT_NE(CheckPrewarmDesc(bad), nullptr);
  bad = d_;
  bad.max_positions = 0;
  EXPECT_NE(CheckPrewarmDesc(bad), nullptr);
  bad = d_;
  bad.max_blocks = -1;
  EXPECT_NE(CheckPrewarmDesc(bad), nullptr);
  bad = d_;
  bad.rows = nullptr;
  EXPECT_NE(CheckPrewarmDesc(bad), nullptr);
}

}  // namespace
}  // namespace hisparse
