// PlanRecovery (request_journal.h) on journals and slabs written here: what a restarted daemon
// takes back, and what it refuses or drops, each saying why.
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "hisparse/common/unique_fd.h"
#include "hisparse/daemon/request_journal.h"

namespace hisparse {
namespace plan_recovery_test {

constexpr uint64_t kPage = 4096;
const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

UniqueFd SealedSlab(uint32_t pages) {
  auto fd = CreateMemfd("test-slab", pages * kPage, false, nullptr);
  EXPECT_TRUE(fd.ok()) << fd.status();
  return fd.ok() ? *std::move(fd) : UniqueFd();
}

UniqueFd UnsealedSlab(uint32_t pages) {
  UniqueFd fd(::memfd_create("plain", MFD_CLOEXEC));
  EXPECT_EQ(::ftruncate(fd.get(), pages * kPage), 0);
  return fd;
}

journal::Record HeaderRecord(uint64_t generation, uint64_t page_bytes = kPage) {
  journal::Record r;
  journal::Header* h = r.mutable_header();
  h->set_format(RequestJournal::kFormat);
  h->set_generation(generation);
  h->set_epoch(3);
  h->set_page_bytes(page_bytes);
  return r;
}

// A Put of request `id` of session `session` (tenant 7, 2 layers of 16-byte records), each layer
// `pages` pages of slab `slab` from `first`, leased until kNow + `lease`.
journal::Record PutRecord(uint64_t seq, uint64_t session, uint64_t id, uint64_t slab, uint32_t first, uint32_t pages,
                          absl::Duration lease = absl::Minutes(5)) {
  journal::Record r;
  r.set_seq(seq);
  journal::Put* p = r.mutable_put();
  journal::Session* s = p->mutable_session();
  s->set_id(session);
  s->set_tenant_uid(7);
  s->set_engine_name("e");
  s->mutable_geometry()->set_num_layers(2);
  s->mutable_geometry()->set_record_bytes(16);
  s->set_records_per_page(kPage / 16);
  s->set_pages_per_entry(64);
  p->set_request_id(id);
  p->set_capacity_tokens(pages * (kPage / 16));
  p->set_lease_end_unix_nanos(absl::ToUnixNanos(kNow + lease));
  p->set_order(seq);
  for (uint32_t layer = 0; layer < 2; ++layer) {
    journal::Layer* l = p->add_layers();
    for (uint32_t i = 0; i < pages; ++i) {
      l->add_slab(slab);
      l->add_index(first + layer * pages + i);
    }
  }
  return r;
}

journal::Record ForgetRecord(uint64_t seq, uint64_t session, uint64_t id) {
  journal::Record r;
  r.set_seq(seq);
  r.mutable_forget()->set_session_id(session);
  r.mutable_forget()->set_request_id(id);
  return r;
}

std::string Bytes(const std::vector<journal::Record>& records) {
  std::string out;
  for (const journal::Record& r : records) out += RequestJournal::Frame(r);
  return out;
}

ListenFd JournalFd(uint64_t generation, const std::string& bytes) {
  UniqueFd fd(::memfd_create("journal", MFD_CLOEXEC));
  EXPECT_EQ(::write(fd.get(), bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  return ListenFd{absl::StrCat("journal-", generation), std::move(fd)};
}

std::vector<uint64_t> SlabIds(const RecoveryPlan& plan) {
  std::vector<uint64_t> ids;
  for (const PagePool::RecoveredSlab& s : plan.slabs) ids.push_back(s.id);
  return ids;
}

std::string Dropped(const RecoveryPlan& plan) { return absl::StrJoin(plan.dropped, "\n"); }

TEST(PlanRecoveryTest, NothingPassedIsAFirstLife) {
  const RecoveryPlan plan = PlanRecovery({}, kPage, 1 << 20, kNow);
  EXPECT_FALSE(plan.found);
  EXPECT_EQ(plan.next_epoch(), 0u);
  EXPECT_TRUE(plan.puts.empty());
}

TEST(PlanRecoveryTest, TakesTheNewestPutOfEachRequestWithItsSlabsReferences) {
  std::vector<ListenFd> fds;
  fds.push_back(JournalFd(4, Bytes({HeaderRecord(4), PutRecord(1, 10, 1, 5, 0, 1), PutRecord(2, 10, 2, 5, 2, 1),
                                    PutRecord(3, 10, 1, 5, 0, 2), ForgetRecord(4, 10, 2)})));
  fds.push_back(JournalFd(3, Bytes({HeaderRecord(3)})));  // an older generation: stale
  fds.push_back(ListenFd{"s5", SealedSlab(8)});
  fds.push_back(ListenFd{"s6", SealedSlab(2)});  // nothing references it
  fds.push_back(ListenFd{"mystery", SealedSlab(1)});
  const RecoveryPlan plan = PlanRecovery(std::move(fds), kPage, 1 << 20, kNow);
  ASSERT_TRUE(plan.found);
  EXPECT_TRUE(plan.refused.empty()) << plan.refused;
  EXPECT_EQ(plan.header.generation(), 4u);
  EXPECT_EQ(plan.next_epoch(), 4u);
  ASSERT_EQ(plan.puts.size(), 1u);
  EXPECT_EQ(plan.puts[0].request_id(), 1u);
  EXPECT_EQ(plan.puts[0].layers(0).slab_size(), 2);  // the extended one
  ASSERT_EQ(SlabIds(plan), std::vector<uint64_t>{5});
  EXPECT_EQ(plan.slabs[0].owner, 10u);
  EXPECT_EQ(plan.slabs[0].refs, (std::vector<uint32_t>{1, 1, 1, 1, 0, 0, 0, 0}));
  ASSERT_EQ(plan.unused.size(), 1u);
  EXPECT_EQ(plan.unused[0].first, "s6");
  EXPECT_EQ(absl::StrJoin(plan.stale_names, ","), "mystery,journal-4,journal-3");
}

TEST(PlanRecoveryTest, PagesSharedWithinASessionCountEveryHolder) {
  std::vector<ListenFd> fds;
  // Request 2 holds request 1's first page of each layer (a shared prefix) and one of its own.
  journal::Record child = PutRecord(2, 10, 2, 26, 0, 1);
  child.mutable_put()->mutable_layers(0)->set_index(0, 0);
  child.mutable_put()->mutable_layers(1)->set_index(0, 1);
  for (int layer = 0; layer < 2; ++layer) child.mutable_put()->mutable_layers(layer)->set_slab(0, 26);
  journal::Record parent = PutRecord(1, 10, 1, 26, 0, 1);
  fds.push_back(JournalFd(1, Bytes({HeaderRecord(1), parent, child})));
  fds.push_back(ListenFd{"s1a", SealedSlab(4)});  // slab 26: names are hex
  const RecoveryPlan plan = PlanRecovery(std::move(fds), kPage, 1 << 20, kNow);
  ASSERT_EQ(plan.puts.size(), 2u) << plan.refused << Dropped(plan);
  ASSERT_EQ(plan.slabs.size(), 1u);
  EXPECT_EQ(plan.slabs[0].refs, (std::vector<uint32_t>{2, 2, 0, 0}));
}

TEST(PlanRecoveryTest, DropsWhatCannotBeTrustedSayingWhy) {
  std::vector<ListenFd> fds;
  fds.push_back(JournalFd(1, Bytes({HeaderRecord(1), PutRecord(1, 10, 1, 5, 0, 1),    // fine
                                    PutRecord(2, 11, 2, 6, 0, 1),                     // its slab is missing
                                    PutRecord(3, 12, 3, 7, 0, 1),                     // its slab lacks the seals
                                    PutRecord(4, 13, 4, 8, 0, 1, -absl::Seconds(1)),  // its lease ended
                                    PutRecord(5, 14, 5, 9, 3, 1)})));                 // a page beyond its slab
  fds.push_back(ListenFd{"s5", SealedSlab(2)});
  fds.push_back(ListenFd{"s7", UnsealedSlab(2)});
  fds.push_back(ListenFd{"s8", SealedSlab(2)});
  fds.push_back(ListenFd{"s9", SealedSlab(4)});
  const RecoveryPlan plan = PlanRecovery(std::move(fds), kPage, 1 << 20, kNow);
  EXPECT_TRUE(plan.refused.empty()) << plan.refused;
  ASSERT_EQ(plan.puts.size(), 1u) << Dropped(plan);
  EXPECT_EQ(plan.puts[0].request_id(), 1u);
  EXPECT_EQ(plan.expired, 1u);
  const std::string why = Dropped(plan);
  EXPECT_NE(why.find("slab 6 is missing"), std::string::npos) << why;
  EXPECT_NE(why.find("slab 7 is unusable"), std::string::npos) << why;
  EXPECT_NE(why.find("its lease ended"), std::string::npos) << why;
  EXPECT_NE(why.find("lies outside slab 9"), std::string::npos) << why;
  EXPECT_EQ(plan.unused.size(), 3u);  // 7, 8 and 9: scrubbed
}

TEST(PlanRecoveryTest, ATornLastCommitIsIgnoredAndAnythingElseRefusesTheJournal) {
  const std::string good = Bytes({HeaderRecord(1), PutRecord(1, 10, 1, 5, 0, 1)});
  const std::string last = RequestJournal::Frame(PutRecord(2, 10, 2, 5, 2, 1));
  {  // The last frame cut short: the commit no reply announced.
    std::vector<ListenFd> fds;
    fds.push_back(JournalFd(1, good + last.substr(0, last.size() / 2)));
    fds.push_back(ListenFd{"s5", SealedSlab(4)});
    const RecoveryPlan plan = PlanRecovery(std::move(fds), kPage, 1 << 20, kNow);
    EXPECT_TRUE(plan.refused.empty()) << plan.refused;
    EXPECT_EQ(plan.puts.size(), 1u);
    EXPECT_NE(Dropped(plan).find("cut short"), std::string::npos);
  }
  {  // A damaged record with records after it: refused whole, every slab scrubbed.
    std::string damaged = good + last;
    damaged[good.size() - 3] ^= 0x40;
    std::vector<ListenFd> fds;
    fds.push_back(JournalFd(1, damaged));
    fds.push_back(ListenFd{"s5", SealedSlab(4)});
    const RecoveryPlan plan = PlanRecovery(std::move(fds), kPage, 1 << 20, kNow);
    EXPECT_NE(plan.refused.find("fails its checksum"), std::string::npos) << plan.refused;
    EXPECT_TRUE(plan.puts.empty());
    EXPECT_TRUE(plan.slabs.empty());
    EXPECT_EQ(plan.unused.size(), 1u);
    EXPECT_EQ(plan.next_epoch(), 1u);  // a refused journal's ids are still never reused
  }
  {  // Records going back in sequence.
    std::vector<ListenFd> fds;
    fds.push_back(JournalFd(1, Bytes({HeaderRecord(1), PutRecord(5, 10, 1, 5, 0, 1), PutRecord(4, 10, 2, 5, 2, 1)})));
    const RecoveryPlan plan = PlanRecovery(std::move(fds), kPage, 1 << 20, kNow);
    EXPECT_NE(plan.refused.find("goes back"), std::string::npos) << plan.refused;
  }
  {  // Another page size.
    std::vector<ListenFd> fds;
    fds.push_back(JournalFd(1, Bytes({HeaderRecord(1, 2 * kPage), PutRecord(1, 10, 1, 5, 0, 1)})));
    const RecoveryPlan plan = PlanRecovery(std::move(fds), kPage, 1 << 20, kNow);
    EXPECT_NE(plan.refused.find("pages of 8192 bytes"), std::string::npos) << plan.refused;
  }
  {  // One slab named by two sessions: a slab has one owner, so the journal lies.
    std::vector<ListenFd> fds;
    fds.push_back(JournalFd(1, Bytes({HeaderRecord(1), PutRecord(1, 10, 1, 5, 0, 1), PutRecord(2, 11, 2, 5, 2, 1)})));
    fds.push_back(ListenFd{"s5", SealedSlab(4)});
    const RecoveryPlan plan = PlanRecovery(std::move(fds), kPage, 1 << 20, kNow);
    EXPECT_NE(plan.refused.find("holds pages of sessions 10 and 11"), std::string::npos) << plan.refused;
    EXPECT_TRUE(plan.slabs.empty());
  }
  {  // No header.
    std::vector<ListenFd> fds;
    fds.push_back(JournalFd(1, Bytes({PutRecord(1, 10, 1, 5, 0, 1)})));
    const RecoveryPlan plan = PlanRecovery(std::move(fds), kPage, 1 << 20, kNow);
    EXPECT_NE(plan.refused.find("header"), std::string::npos) << plan.refused;
  }
}

TEST(PlanRecoveryTest, WholeSessionsOldestFirstWhileTheBudgetHolds) {
  std::vector<ListenFd> fds;
  fds.push_back(JournalFd(1, Bytes({HeaderRecord(1), PutRecord(1, 20, 1, 6, 0, 1), PutRecord(2, 10, 2, 5, 0, 1)})));
  fds.push_back(ListenFd{"s5", SealedSlab(4)});
  fds.push_back(ListenFd{"s6", SealedSlab(4)});
  const RecoveryPlan plan = PlanRecovery(std::move(fds), kPage, 6 * kPage, kNow);
  ASSERT_EQ(plan.puts.size(), 1u);
  EXPECT_EQ(plan.puts[0].session().id(), 10u);
  EXPECT_NE(Dropped(plan).find("session 20's 1 requests"), std::string::npos) << Dropped(plan);
  ASSERT_EQ(plan.unused.size(), 1u);
  EXPECT_EQ(plan.unused[0].first, "s6");
}

// What a start does to a slab nothing restored needs: its memory freed at once, its size kept.
TEST(PlanRecoveryTest, AnUnusedSlabIsPunchedOut) {
  UniqueFd slab = SealedSlab(4);
  const std::string bytes(4 * kPage, 'x');
  ASSERT_EQ(::pwrite(slab.get(), bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  absl::StatusOr<uint64_t> left = PagePool::PunchOut(slab.get());
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_EQ(*left, 0u);
  std::string back(4 * kPage, 'y');
  ASSERT_EQ(::pread(slab.get(), back.data(), back.size(), 0), static_cast<ssize_t>(back.size()));
  EXPECT_EQ(back, std::string(4 * kPage, '\0'));
}

TEST(PlanRecoveryTest, Crc32cIsCastagnoli) {
  const std::string check = "123456789";
  EXPECT_EQ(RequestJournal::Crc32c(reinterpret_cast<const uint8_t*>(check.data()), check.size()), 0xE3069283u);
}

}  // namespace plan_recovery_test
}  // namespace hisparse
