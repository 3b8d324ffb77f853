// IndexedStoreReference: the prefill store gathered by index from a paged KV pool, for a layer
// range. It must leave the arena and the host pool exactly as the plain store of the same records
// does, touch only its layers, and write nothing at all when any input is invalid.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "arena_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hisparse/kernels/resolve.h"

namespace hisparse {
namespace indexed_store_test {

using ::hisparse::testing::ArenaFixture;
using ::testing::ElementsAre;

constexpr uint32_t kRb = 32;
constexpr int32_t kCap = 40;
constexpr int32_t kPoolTokens = 96;  // slots of each layer's paged pool
const ArenaGeometry kG{/*max_rows=*/2, /*num_layers=*/3, /*slots=*/8, /*k=*/4, kRb};

// An engine's paged KV pool: [layers][kPoolTokens] records, token stride kRb + 16 (padded), and
// the slot each position of one request lives in (a random permutation: pages scattered).
struct PagedPool {
  static constexpr int64_t kStride = kRb + 16;
  PagedPool(const ArenaFixture& f, int32_t row, uint32_t gen, uint32_t seed)
      : bytes(static_cast<size_t>(kG.num_layers) * kPoolTokens * kStride, 0xab), slot(kPoolTokens) {
    std::iota(slot.begin(), slot.end(), 0);
    std::mt19937 rng(seed);
    std::shuffle(slot.begin(), slot.end(), rng);
    for (int32_t l = 0; l < kG.num_layers; ++l) {
      for (int32_t p = 0; p < kCap; ++p) f.Pattern(Record(l, slot[p]), row, l, p, gen);
    }
  }
  uint8_t* Record(int32_t layer, int32_t s) { return &bytes[(static_cast<size_t>(layer) * kPoolTokens + s) * kStride]; }
  int64_t LayerStride() const { return kPoolTokens * kStride; }
  std::vector<uint8_t> bytes;
  std::vector<int32_t> slot;  // position -> pool slot
};

// Plain engine buffer of positions [start, start + n), every layer.
std::vector<uint8_t> Contiguous(const ArenaFixture& f, int32_t row, int32_t start, int32_t n, uint32_t gen) {
  std::vector<uint8_t> src(static_cast<size_t>(kG.num_layers) * n * kRb);
  for (int32_t l = 0; l < kG.num_layers; ++l) {
    for (int32_t t = 0; t < n; ++t) f.Pattern(&src[(static_cast<size_t>(l) * n + t) * kRb], row, l, start + t, gen);
  }
  return src;
}

IndexedStoreDesc Indexed(ArenaFixture& f, PagedPool& pool, const std::vector<int32_t>& index, int32_t row,
                         int32_t first_layer, int32_t num_layers, int32_t start, int32_t n, int32_t after) {
  IndexedStoreDesc d{};
  d.arena = f.view();
  d.host = f.host();
  d.row = row;
  d.first_layer = first_layer;
  d.num_layers = num_layers;
  d.start_pos = start;
  d.num_tokens = n;
  d.seq_len_after = after;
  d.src_base = pool.Record(std::max(0, first_layer), 0);
  d.src_index = index.data();
  d.src_tokens = kPoolTokens;
  d.src_layer_stride = pool.LayerStride();
  d.src_token_stride = PagedPool::kStride;
  return d;
}

// The pool slots of positions [start, start + n).
std::vector<int32_t> Slots(const PagedPool& pool, int32_t start, int32_t n) {
  return std::vector<int32_t>(pool.slot.begin() + start, pool.slot.begin() + start + n);
}

std::vector<uint8_t> HostPool(ArenaFixture& f) {
  std::vector<uint8_t> all;
  for (int32_t r = 0; r < kG.max_rows; ++r) {
    for (int32_t l = 0; l < kG.num_layers; ++l) all.insert(all.end(), f.HostRecord(r, l, 0), f.HostRecord(r, l, kCap));
  }
  return all;
}

// Chunked prefill, within B and past it, with the chunk's layers split into two ranges: the
// indexed store leaves the arena (tables, LRU, every slot's bytes, slot B) and the host pool
// byte-identical to the plain store of the same records, then RESOLVE sees the same state.
TEST(IndexedStoreTest, EqualsThePlainStoreOfTheSameRecords) {
  ArenaFixture plain(kG, kCap), indexed(kG, kCap);
  PagedPool pool(indexed, 1, 5, 77);
  struct Chunk {
    int32_t start, n, after;
  };
  // Short row (resident), then growth past B; a re-store of stored positions (refresh).
  for (const Chunk& c : {Chunk{0, 3, 3}, Chunk{3, 4, 7}, Chunk{7, 9, 16}, Chunk{16, 1, 17}, Chunk{2, 3, 17}}) {
    const std::vector<uint8_t> src = Contiguous(plain, 1, c.start, c.n, 5);
    ASSERT_EQ(0u, StoreReference(StoreDesc{plain.view(), plain.host(), 1, c.start, c.n, c.after, src.data(),
                                           static_cast<int64_t>(c.n) * kRb, kRb}));
    const std::vector<int32_t> index = Slots(pool, c.start, c.n);
    ASSERT_EQ(0u, IndexedStoreReference(Indexed(indexed, pool, index, 1, 0, 1, c.start, c.n, c.after)));
    ASSERT_EQ(0u, IndexedStoreReference(Indexed(indexed, pool, index, 1, 1, 2, c.start, c.n, c.after)));
    ASSERT_EQ(plain.Snapshot(), indexed.Snapshot()) << "chunk at " << c.start;
    ASSERT_EQ(HostPool(plain), HostPool(indexed)) << "chunk at " << c.start;
    if (c.after == 7) {
      EXPECT_THAT(indexed.SlotPos(1, 2), ElementsAre(0, 1, 2, 3, 4, 5, 6, -1));
    }
  }
  std::vector<int32_t> out_p, out_i;
  ASSERT_EQ(0u, plain.Resolve(2, 1, {1}, {17}, {16, 3, 11, 0}, &out_p));
  ASSERT_EQ(0u, indexed.Resolve(2, 1, {1}, {17}, {16, 3, 11, 0}, &out_i));
  EXPECT_EQ(out_p, out_i);
  EXPECT_EQ(plain.Snapshot(), indexed.Snapshot());
}

// A layer range writes its layers only: the other layers' host records and tables stay.
TEST(IndexedStoreTest, TouchesOnlyItsLayers) {
  ArenaFixture f(kG, kCap);
  PagedPool pool(f, 0, 3, 8);
  const std::vector<int32_t> index = Slots(pool, 0, 5);
  ASSERT_EQ(0u, IndexedStoreReference(Indexed(f, pool, index, 0, 1, 1, 0, 5, 5)));
  EXPECT_THAT(f.SlotPos(0, 1), ElementsAre(0, 1, 2, 3, 4, -1, -1, -1));
  EXPECT_THAT(f.SlotPos(0, 0), ElementsAre(-1, -1, -1, -1, -1, -1, -1, -1));
  EXPECT_THAT(f.SlotPos(0, 2), ElementsAre(-1, -1, -1, -1, -1, -1, -1, -1));
  std::vector<uint8_t> want(kRb);
  for (int32_t p = 0; p < 5; ++p) {
    f.Pattern(want.data(), 0, 1, p, 3);
    EXPECT_EQ(0, std::memcmp(f.HostRecord(0, 1, p), want.data(), kRb));
    EXPECT_EQ(0, std::memcmp(f.view().Record(0, 1, p), want.data(), kRb));
    for (int32_t l : {0, 2}) {
      EXPECT_THAT(std::vector<uint8_t>(f.HostRecord(0, l, p), f.HostRecord(0, l, p) + kRb), ::testing::Each(0));
    }
  }
}

// Every invalid input is refused with its bit and writes nothing: a bad index anywhere in the
// chunk (the last token's included, after valid ones), a layer range outside the session's or
// empty, a token range outside [0, seq_len_after] or the row's capacity, a bad row.
TEST(IndexedStoreTest, InvalidInputWritesNothing) {
  ArenaFixture f(kG, kCap);
  f.set_capacity(1, 0);  // row 1 not admitted
  PagedPool pool(f, 0, 1, 9);
  std::vector<int32_t> index = Slots(pool, 0, 6);
  ASSERT_EQ(0u, IndexedStoreReference(Indexed(f, pool, index, 0, 0, 3, 0, 6, 6)));
  const auto before = f.Snapshot();
  const std::vector<uint8_t> host_before = HostPool(f);
  PagedPool other(f, 0, 2, 10);  // different bytes: any write would show
  auto expect = [&](uint32_t bits, const IndexedStoreDesc& d) {
    EXPECT_EQ(bits, IndexedStoreReference(d));
    EXPECT_EQ(before, f.Snapshot());
    EXPECT_EQ(host_before, HostPool(f));
  };
  std::vector<int32_t> bad = Slots(other, 0, 6);
  for (int32_t v : {-1, kPoolTokens, 1 << 30}) {
    bad.back() = v;
    expect(kResolveBadIndex, Indexed(f, other, bad, 0, 0, 3, 0, 6, 6));
    bad.front() = v;
    expect(kResolveBadIndex, Indexed(f, other, bad, 0, 0, 3, 0, 6, 6));
    bad = Slots(other, 0, 6);
  }
  const std::vector<int32_t> good = Slots(other, 0, 6);
  expect(kResolveBadRow, Indexed(f, other, good, 0, 0, 0, 0, 6, 6));   // no layers
  expect(kResolveBadRow, Indexed(f, other, good, 0, 2, 2, 0, 6, 6));   // layers [2, 4) of 3
  expect(kResolveBadRow, Indexed(f, other, good, 0, -1, 2, 0, 6, 6));  // first layer < 0
  expect(kResolveBadRow, Indexed(f, other, good, 2, 0, 3, 0, 6, 6));   // row outside
  expect(kResolveBadPosition, Indexed(f, other, good, 0, 0, 3, -1, 6, 6));
  expect(kResolveBadPosition, Indexed(f, other, good, 0, 0, 3, 0, -1, 6));
  expect(kResolveBadSeqLen, Indexed(f, other, good, 0, 0, 3, 0, 6, 5));                // tokens past seq_len_after
  expect(kResolveBadSeqLen, Indexed(f, other, good, 0, 0, 3, kCap - 2, 6, kCap + 4));  // past capacity
  expect(kResolveBadSeqLen, Indexed(f, other, good, 1, 0, 3, 0, 6, 6));                // row not admitted
}

}  // namespace indexed_store_test
}  // namespace hisparse
