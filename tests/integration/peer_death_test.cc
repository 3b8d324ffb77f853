// A client killed with SIGKILL while it holds requests has all its memory reclaimed: the daemon
// notices the dead peer from its socket at once, not from a timeout.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "test_support.h"

namespace hisparse::testing {
namespace peer_death_test {

// The harness leaves nothing behind either: a DaemonProcess removes its private folder whole,
// with files that neither it nor the daemon made (a test's socket moved aside, say).
TEST(PeerDeathTest, DaemonProcessRemovesItsWholeFolder) {
  std::string dir;
  {
    auto daemon = StartDaemon();
    ASSERT_NE(daemon, nullptr);
    const std::string& sock = daemon->socket_path();
    dir = sock.substr(0, sock.rfind('/'));
    ASSERT_EQ(::rename((sock + ".fd").c_str(), (sock + ".fd.moved").c_str()), 0) << std::strerror(errno);
    ASSERT_TRUE(std::filesystem::create_directory(dir + "/made-by-a-test"));
    std::ofstream(dir + "/made-by-a-test/file") << "x";
    ASSERT_TRUE(std::filesystem::exists(dir + "/made-by-a-test/file"));
  }
  EXPECT_FALSE(std::filesystem::exists(dir)) << dir;
}

// A test client that exits before its READY line (here: an unknown mode) gives no handle, and the
// failure says why; the child is reaped, not left to the test's process.
TEST(PeerDeathTest, AClientThatNeverSaysReadyGivesNoHandle) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  std::unique_ptr<TestClient> client;
  EXPECT_NONFATAL_FAILURE(client = TestClient::Start({daemon->address(), "no-such-mode"}), "did not print READY");
  EXPECT_EQ(client, nullptr);
}

TEST(PeerDeathTest, KilledClientsMemoryIsReclaimed) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  for (int round = 0; round < 5; ++round) {
    const auto client = TestClient::Start({daemon->address(), "hold", "10"});
    ASSERT_NE(client, nullptr);
    v1::StatsResponse st = Stats(daemon->address());
    ASSERT_EQ(st.sessions(), 1u);
    ASSERT_EQ(st.requests(), 10u);
    ASSERT_GT(st.host_pool().used_bytes(), 0u);
    const auto t0 = std::chrono::steady_clock::now();
    client->Kill();
    // Liveness bound only (not a timing assertion): the reclaim time is printed.
    WaitUntil([&] {
      st = Stats(daemon->address());
      return st.sessions() == 0;
    });
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("round %d: reclaimed in %.1f ms\n", round, ms);
    EXPECT_EQ(st.sessions(), 0u);
    EXPECT_EQ(st.requests(), 0u);
    EXPECT_EQ(st.host_pool().used_bytes(), 0u);
    EXPECT_EQ(st.host_pool().pages_used(), 0u);
    EXPECT_EQ(st.host_pool().slabs(), 0u);
  }
}

TEST(PeerDeathTest, ChurningClientsKilledAtRandomPointsLeaveNothing) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  std::mt19937 rng(11);
  for (int round = 0; round < 10; ++round) {
    const auto client = TestClient::Start({daemon->address(), "churn"});
    ASSERT_NE(client, nullptr);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 20000));
    client->Kill();
  }
  v1::StatsResponse st;
  WaitUntil([&] {
    st = Stats(daemon->address());
    return st.sessions() == 0;
  });
  EXPECT_EQ(st.sessions(), 0u);
  EXPECT_EQ(st.requests(), 0u);
  EXPECT_EQ(st.host_pool().used_bytes(), 0u);
}

}  // namespace peer_death_test
}  // namespace hisparse::testing
