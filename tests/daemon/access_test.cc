// AccessPolicy (who is admitted, who is an admin) and PeerRegistry (who is at the other end of
// the connection gRPC calls "fd:N", and never a later socket that reuses N).
#include "hisparse/daemon/access.h"

#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace hisparse {
namespace access_test {

PeerCredentials Peer(uint32_t uid, uint32_t gid) { return PeerCredentials{1234, uid, gid}; }

TEST(AccessPolicyTest, AdminsAreRootTheDaemonsUidAndTheListedOnes) {
  const AccessPolicy none;
  EXPECT_TRUE(none.IsAdmin(Peer(0, 0)));
  EXPECT_TRUE(none.IsAdmin(Peer(::getuid(), 99)));
  EXPECT_FALSE(none.IsAdmin(Peer(12345, 12345)));
  EXPECT_TRUE(none.Allows(Peer(12345, 12345)));  // empty allowed lists admit anyone

  const AccessPolicy listed({2000}, {}, {3000}, {4000});
  EXPECT_TRUE(listed.IsAdmin(Peer(3000, 1)));
  EXPECT_TRUE(listed.IsAdmin(Peer(1, 4000)));
  EXPECT_FALSE(listed.IsAdmin(Peer(2000, 2000)));  // admitted, not an admin
  EXPECT_TRUE(listed.Allows(Peer(2000, 2000)));
  EXPECT_TRUE(listed.Allows(Peer(3000, 1)));  // admins are always admitted
  EXPECT_FALSE(listed.Allows(Peer(5000, 5000)));
}

TEST(PeerRegistryTest, LooksUpTheRecordedSocketByGrpcsName) {
  int a[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, a), 0);
  PeerRegistry registry;
  ASSERT_TRUE(registry.Record(a[0], Peer(12345, 54321)).ok());
  auto found = registry.Lookup("fd:" + std::to_string(a[0]));
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->uid, 12345u);
  EXPECT_EQ(found->gid, 54321u);
  EXPECT_EQ(found->pid, 1234);
  EXPECT_EQ(registry.Lookup("fd:" + std::to_string(a[1])).status().code(), absl::StatusCode::kUnauthenticated);
  for (const char* bad : {"", "unix:/tmp/x", "fd:", "fd:-1", "fd:abc", "ipv4:127.0.0.1:1"}) {
    EXPECT_EQ(registry.Lookup(bad).status().code(), absl::StatusCode::kUnauthenticated) << bad;
  }
  ::close(a[0]);
  ::close(a[1]);
}

TEST(PeerRegistryTest, AClosedConnectionsNumberNamesNoLaterSocket) {
  int a[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, a), 0);
  PeerRegistry registry;
  const int n = a[0];
  ASSERT_TRUE(registry.Record(n, Peer(0, 0)).ok());  // root's connection
  ::close(a[0]);
  ::close(a[1]);
  const std::string name = "fd:" + std::to_string(n);
  EXPECT_EQ(registry.Lookup(name).status().code(), absl::StatusCode::kUnauthenticated);  // closed
  // The lowest free number: the next socket is very likely to get n. Whatever it gets, a socket
  // at n that was not recorded must not pass for root.
  int b[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, b), 0);
  EXPECT_EQ(b[0], n) << "the kernel gave the next socket another number; the reuse case is untested";
  EXPECT_EQ(registry.Lookup(name).status().code(), absl::StatusCode::kUnauthenticated);
  // Recorded, it is the new peer's.
  ASSERT_TRUE(registry.Record(b[0], Peer(777, 777)).ok());
  auto found = registry.Lookup(name);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->uid, 777u);
  EXPECT_EQ(registry.Record(-1, Peer(1, 1)).code(), absl::StatusCode::kInternal);
  ::close(b[0]);
  ::close(b[1]);
}

// Issue 39, item 6: a uid's control connections are counted, those gRPC has closed are not held
// against it, and a replaced descriptor number counts for its new owner only.
TEST(PeerRegistryTest, CountsEachUidsLiveConnectionsAgainstItsCap) {
  PeerRegistry registry;
  std::vector<std::array<int, 2>> pairs(4);
  for (auto& p : pairs) ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, p.data()), 0);
  ASSERT_TRUE(registry.Record(pairs[0][0], Peer(5000, 5000), 2).ok());
  ASSERT_TRUE(registry.Record(pairs[1][0], Peer(5000, 5000), 2).ok());
  const absl::Status over = registry.Record(pairs[2][0], Peer(5000, 5000), 2);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.message().find("limits.max_control_connections_per_peer"), std::string::npos) << over;
  EXPECT_EQ(registry.Lookup("fd:" + std::to_string(pairs[2][0])).status().code(), absl::StatusCode::kUnauthenticated)
      << "a refused connection was recorded";
  // Another uid has a count of its own, and no cap means none.
  EXPECT_TRUE(registry.Record(pairs[2][0], Peer(6000, 6000), 2).ok());
  EXPECT_TRUE(registry.Record(pairs[3][0], Peer(5000, 5000), 0).ok());
  EXPECT_EQ(registry.Connections(5000), 3);
  EXPECT_EQ(registry.Connections(6000), 1);
  // gRPC closes two of 5000's connections: they no longer count, and 5000 may connect again.
  ::close(pairs[0][0]);
  ::close(pairs[1][0]);
  int fresh[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fresh), 0);
  EXPECT_TRUE(registry.Record(fresh[0], Peer(5000, 5000), 2).ok());
  EXPECT_EQ(registry.Connections(5000), 2);
  // A number taken over by another uid's connection moves to that uid.
  ::close(pairs[3][0]);
  int taken[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, taken), 0);
  ASSERT_TRUE(registry.Record(taken[0], Peer(6000, 6000), 2).ok());
  EXPECT_EQ(registry.Connections(5000), 1);
  EXPECT_EQ(registry.Connections(6000), 2);
  for (int fd :
       {pairs[0][1], pairs[1][1], pairs[2][0], pairs[2][1], pairs[3][1], fresh[0], fresh[1], taken[0], taken[1]}) {
    ::close(fd);
  }
  EXPECT_EQ(registry.Connections(5000), 0);
  EXPECT_EQ(registry.Connections(6000), 0);
}

}  // namespace access_test
}  // namespace hisparse
