// The keeper's pure pieces: what a notify message asks for, and the store's bookkeeping.
#include "hisparse/keeper/notify_protocol.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hisparse {
namespace notify_protocol_test {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

UniqueFd Memfd() { return UniqueFd(::memfd_create("stored-fds-test", MFD_CLOEXEC)); }

bool IsOpen(int fd) { return ::fcntl(fd, F_GETFD) >= 0; }

TEST(ParseNotifyMessageTest, WhatFdStorePutSends) {
  const NotifyMessage m = ParseNotifyMessage("FDSTORE=1\nFDNAME=slab-1\nFDPOLL=0\n");
  EXPECT_TRUE(m.fdstore);
  EXPECT_FALSE(m.fdstore_remove);
  EXPECT_FALSE(m.barrier);
  EXPECT_EQ(m.fdname, "slab-1");
}

TEST(ParseNotifyMessageTest, RemoveAndBarrier) {
  const NotifyMessage remove = ParseNotifyMessage("FDSTOREREMOVE=1\nFDNAME=journal");  // no final newline
  EXPECT_TRUE(remove.fdstore_remove);
  EXPECT_FALSE(remove.fdstore);
  EXPECT_EQ(remove.fdname, "journal");
  const NotifyMessage barrier = ParseNotifyMessage("BARRIER=1\n");
  EXPECT_TRUE(barrier.barrier);
  EXPECT_FALSE(barrier.fdstore);
  EXPECT_EQ(barrier.fdname, "");
}

TEST(ParseNotifyMessageTest, OnlyTheValueOneCountsAndTheLastValueWins) {
  EXPECT_FALSE(ParseNotifyMessage("FDSTORE=0\n").fdstore);
  EXPECT_FALSE(ParseNotifyMessage("FDSTORE=yes\n").fdstore);
  EXPECT_FALSE(ParseNotifyMessage("FDSTORE=1\nFDSTORE=0\n").fdstore);
  EXPECT_TRUE(ParseNotifyMessage("FDSTORE=0\nFDSTORE=1\n").fdstore);
  EXPECT_EQ(ParseNotifyMessage("FDNAME=a\nFDNAME=b\n").fdname, "b");
}

TEST(ParseNotifyMessageTest, OtherKeysAndLinesAreIgnored) {
  const NotifyMessage m = ParseNotifyMessage("READY=1\nSTATUS=serving=yes\ngarbage\n\n=\nMAINPID=7\n");
  EXPECT_FALSE(m.fdstore);
  EXPECT_FALSE(m.fdstore_remove);
  EXPECT_FALSE(m.barrier);
  EXPECT_EQ(m.fdname, "");
  EXPECT_EQ(ParseNotifyMessage("FDNAME=a=b\n").fdname, "a=b");  // the value runs to the line's end
  EXPECT_FALSE(ParseNotifyMessage("").fdstore);
}

TEST(StoredFdsTest, KeepsOrderAndDuplicateNames) {
  StoredFds store(10);
  UniqueFd a = Memfd(), b = Memfd(), c = Memfd();
  const std::vector<int> numbers = {a.get(), b.get(), c.get()};
  ASSERT_TRUE(store.Add("slab-1", std::move(a)).ok());
  ASSERT_TRUE(store.Add("journal", std::move(b)).ok());
  ASSERT_TRUE(store.Add("slab-1", std::move(c)).ok());
  EXPECT_EQ(store.count(), 3u);
  EXPECT_EQ(store.count("slab-1"), 2u);
  EXPECT_EQ(store.count("journal"), 1u);
  EXPECT_EQ(store.count("other"), 0u);
  EXPECT_THAT(store.names(), ElementsAre("slab-1", "journal", "slab-1"));
  EXPECT_EQ(store.fds(), numbers);
}

TEST(StoredFdsTest, RemoveClosesEveryFdOfTheName) {
  StoredFds store(10);
  UniqueFd a = Memfd(), b = Memfd(), c = Memfd();
  const int fa = a.get(), fb = b.get(), fc = c.get();
  ASSERT_TRUE(store.Add("slab-1", std::move(a)).ok());
  ASSERT_TRUE(store.Add("journal", std::move(b)).ok());
  ASSERT_TRUE(store.Add("slab-1", std::move(c)).ok());
  EXPECT_EQ(store.Remove("slab-1"), 2u);
  EXPECT_FALSE(IsOpen(fa));
  EXPECT_FALSE(IsOpen(fc));
  EXPECT_TRUE(IsOpen(fb));
  EXPECT_THAT(store.names(), ElementsAre("journal"));
  EXPECT_EQ(store.Remove("slab-1"), 0u);
  store.Clear();
  EXPECT_FALSE(IsOpen(fb));
  EXPECT_THAT(store.names(), IsEmpty());
}

TEST(StoredFdsTest, AFullStoreRefusesAndClosesTheFd) {
  StoredFds store(2);
  ASSERT_TRUE(store.Add("a", Memfd()).ok());
  ASSERT_TRUE(store.Add("b", Memfd()).ok());
  UniqueFd extra = Memfd();
  const int number = extra.get();
  const absl::Status st = store.Add("c", std::move(extra));
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_FALSE(IsOpen(number));
  EXPECT_EQ(store.count(), 2u);
  store.Remove("a");
  EXPECT_TRUE(store.Add("c", Memfd()).ok());  // room again
}

}  // namespace notify_protocol_test
}  // namespace hisparse
