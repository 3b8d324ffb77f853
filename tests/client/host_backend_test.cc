// The host-emulated backend over paged host tables (device_backend.h): SetHostMapRow checks what
// it publishes (bad input is InvalidArgument and changes nothing), host_map() hands kernels the
// tables in the backend's page geometry, and a store or append into a read-only (shared) page is
// InvalidArgument naming it, with nothing of that request written.
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "device_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hisparse {
namespace host_backend_test {

using ::testing::HasSubstr;

class HostBackendPagesTest : public ::testing::Test {
 protected:
  // 2 rows, 2 layers, 32-byte records, pages of 4 records, up to 5 pages per (row, layer).
  HostBackendPagesTest()
      : g_{2, 2, 8, 4, 32},
        backend_(MakeHostBackend(g_, HostPageGeometry{4, 5})),
        pool_(64 * 4 * 32 + 16, 0),
        arena_(ComputeArenaOffsets(g_).total_bytes / 8 + 1, 0) {
    base_ = pool_.data() + (16 - reinterpret_cast<uintptr_t>(pool_.data()) % 16) % 16;
    AttachedArena a;
    a.mapped = reinterpret_cast<uint8_t*>(arena_.data());
    a.bytes = arena_.size() * 8;
    auto v = backend_->Attach(a, g_);
    EXPECT_TRUE(v.ok()) << v.status();
    view_ = *v;
  }
  const uint8_t* Page(int i) const { return base_ + static_cast<size_t>(i) * 4 * 32; }
  const uint8_t* ReadOnly(int i) const { return HostRecordMap::ReadOnlyEntry(Page(i)); }

  ArenaGeometry g_;
  std::unique_ptr<DeviceBackend> backend_;
  std::vector<uint8_t> pool_;
  std::vector<uint64_t> arena_;
  uint8_t* base_ = nullptr;
  ArenaView view_{};
};

TEST_F(HostBackendPagesTest, PublishesTablesInItsPageGeometry) {
  // Row 1: layer 0 on pages 7, 2, 9; layer 1 on pages 3, 8, 1 (capacity 10: three pages of 4).
  const uint8_t* pages[] = {Page(7), Page(2), Page(9), Page(3), Page(8), Page(1)};
  ASSERT_TRUE(backend_->SetHostMapRow(1, pages, 3, 10).ok());
  const HostRecordMap h = backend_->host_map();
  EXPECT_EQ(h.records_per_page, 4u);
  EXPECT_EQ(h.pages_per_entry, 5u);
  EXPECT_EQ(h.capacity[1], 10);
  EXPECT_EQ(h.Record(g_, 1, 0, 0), Page(7));
  EXPECT_EQ(h.Record(g_, 1, 0, 5), Page(2) + 32);
  EXPECT_EQ(h.Record(g_, 1, 1, 9), Page(1) + 32);
  EXPECT_EQ(h.Table(g_, 1, 1)[3], nullptr);  // past the given pages
  // Clearing the row nulls its tables and capacity.
  ASSERT_TRUE(backend_->SetHostMapRow(1, nullptr, 0, 0).ok());
  EXPECT_EQ(h.capacity[1], 0);
  EXPECT_EQ(h.Table(g_, 1, 0)[0], nullptr);
}

TEST_F(HostBackendPagesTest, RefusesBadTablesAndChangesNothing) {
  const uint8_t* good[] = {Page(0), Page(1), Page(2), Page(3)};
  ASSERT_TRUE(backend_->SetHostMapRow(0, good, 2, 8).ok());
  const uint8_t* misaligned[] = {Page(0) + 8, Page(1), Page(2), Page(3)};
  const uint8_t* holes[] = {Page(0), nullptr, Page(2), Page(3)};
  const uint8_t* six[12] = {};
  struct Case {
    int32_t row;
    const uint8_t* const* pages;
    uint32_t given;
    int32_t capacity;
    const char* why;
  } cases[] = {
      {2, good, 2, 8, "row 2 outside"},
      {0, good, 2, -1, "capacity -1"},
      {0, good, 2, 9, "needs 3 pages"},
      {0, six, 6, 8, "given 6 pages"},
      {0, nullptr, 2, 8, "given 2 pages"},
      {0, holes, 2, 8, "page 1 is null"},
      {0, misaligned, 2, 8, "not 16-byte aligned"},
  };
  for (const Case& c : cases) {
    absl::Status st = backend_->SetHostMapRow(c.row, c.pages, c.given, c.capacity);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.why;
    EXPECT_THAT(st.message(), HasSubstr(c.why));
  }
  const HostRecordMap h = backend_->host_map();
  EXPECT_EQ(h.capacity[0], 8);
  EXPECT_EQ(h.Record(g_, 0, 1, 7), Page(3) + 3 * 32);
}

TEST_F(HostBackendPagesTest, WritesIntoReadOnlyPagesAreRefused) {
  // Row 0 owns pages 0..3; row 1 maps row 0's first page of each layer read-only, then its own.
  const uint8_t* own[] = {Page(0), Page(1), Page(2), Page(3)};
  const uint8_t* shared[] = {ReadOnly(0), Page(4), ReadOnly(2), Page(5)};
  ASSERT_TRUE(backend_->SetHostMapRow(0, own, 2, 8).ok());
  ASSERT_TRUE(backend_->SetHostMapRow(1, shared, 2, 8).ok());
  std::vector<uint8_t> src(2 * 8 * 32, 0x5c);
  const std::vector<uint8_t> before(pool_);
  StoreDesc s{view_, backend_->host_map(), 1, 2, 4, 8, src.data(), 8 * 32, 32};  // positions 2..5: page 0 shared
  absl::Status st = backend_->Store(s, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("read-only (shared) host page"));
  EXPECT_EQ(pool_, before) << "a refused store wrote the pool";
  s.start_pos = 4;  // positions 4..7: row 1's own page
  ASSERT_TRUE(backend_->Store(s, nullptr).ok());
  EXPECT_EQ(backend_->host_map().Record(g_, 1, 1, 4)[0], 0x5c);
  // Append: row 1 at position 3 (shared) is refused, row 0 proceeds; the row 0 record it wrote is
  // what row 1 reads at position 1 through its read-only page.
  const int32_t rows[] = {0, 1}, seqs[] = {2, 4}, n = 2;
  AppendDesc a{view_, backend_->host_map(), 0, n, &n, rows, seqs, src.data(), 32, nullptr};
  st = backend_->Append(a, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("read-only"));
  EXPECT_EQ(backend_->host_map().Record(g_, 0, 0, 1)[0], 0x5c);
  EXPECT_EQ(backend_->host_map().Record(g_, 1, 0, 1), backend_->host_map().Record(g_, 0, 0, 1));
}

}  // namespace host_backend_test
}  // namespace hisparse
