// The daemon dies under an engine: the next control call fails clearly (no hang), memory already
// mapped stays readable for in-flight steps, and the engine can attach to a restarted daemon.
#include <signal.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "gtest/gtest.h"
#include "test_support.h"

namespace hisparse::testing {
namespace restart_test {

TEST(DaemonRestartTest, EnginesGetAClearErrorKeepTheirMappingAndReconnect) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const std::string first_address = daemon->address();
  Session s;
  ASSERT_TRUE(Session::Open(SmallGeometry(first_address), &s).ok());
  ASSERT_TRUE(s.Admit(1, 10, 100).ok());
  void* rec = nullptr;
  ASSERT_TRUE(s.RecordPtr(1, 0, 5, &rec).ok());
  std::memset(rec, 0x7E, 64);

  daemon->Signal(SIGKILL);
  // The stream's end marks the session dead; give the client's watcher a moment to see it.
  Error e;
  const auto t0 = std::chrono::steady_clock::now();
  WaitUntil([&] {
    e = s.Admit(2, 10, 100);
    return e.code == HS_ERR_UNAVAILABLE;
  });
  EXPECT_EQ(e.code, HS_ERR_UNAVAILABLE) << e.message;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15)) << "a control call hung";
  // The pages stay mapped in this process: an in-flight step can still read its records.
  EXPECT_EQ(static_cast<uint8_t*>(rec)[63], 0x7E);

  auto restarted = StartDaemon();
  ASSERT_NE(restarted, nullptr);
  Session again;
  ASSERT_TRUE(Session::Open(SmallGeometry(restarted->address()), &again).ok());
  EXPECT_TRUE(again.Admit(1, 10, 100).ok());  // re-admit (and re-prefill) on the new daemon
}

}  // namespace restart_test
}  // namespace hisparse::testing
