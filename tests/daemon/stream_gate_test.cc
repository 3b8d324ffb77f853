// SessionStreamGate (issue 39, item 2): Session streams are bounded from their start, per uid while
// they have not sent `open`, and cancelled when `open` does not come in time.
#include "hisparse/daemon/stream_gate.h"

#include <atomic>
#include <optional>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace hisparse {
namespace stream_gate_test {

using Limits = SessionStreamGate::Limits;
constexpr absl::Duration kNever = absl::Hours(1);

TEST(SessionStreamGateTest, BoundsOpeningStreamsPerUidAndAllStreamsTogether) {
  SessionStreamGate gate(Limits{4, 2, kNever});
  std::vector<SessionStreamGate::Ticket> held;
  for (int i = 0; i < 2; ++i) {
    auto t = gate.Enter(1000, false, [] {});
    ASSERT_TRUE(t.ok()) << t.status();
    held.push_back(*std::move(t));
  }
  auto third = gate.Enter(1000, false, [] {});
  ASSERT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("limits.max_opening_sessions_per_peer"), std::string::npos) << third.status();
  EXPECT_EQ(gate.opening(1000), 2);
  // Another uid has its own count; an admin has no opening cap.
  auto other = gate.Enter(2000, false, [] {});
  ASSERT_TRUE(other.ok()) << other.status();
  // An opened stream is no longer opening: its uid may open another. It still holds its place.
  EXPECT_TRUE(held[0].Opened());
  EXPECT_EQ(gate.opening(1000), 1);
  auto again = gate.Enter(1000, false, [] {});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(gate.streams(), 4);
  // Four streams, opening or open: the fifth is refused whoever asks, admins included.
  auto admin = gate.Enter(0, true, [] {});
  ASSERT_EQ(admin.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(admin.status().message().find("limits.max_sessions"), std::string::npos) << admin.status();
  // A handler that returns gives its place back.
  held.clear();
  EXPECT_EQ(gate.streams(), 2);
  EXPECT_EQ(gate.opening(1000), 1);
  std::vector<SessionStreamGate::Ticket> admins;
  for (int i = 0; i < 2; ++i) {
    auto t = gate.Enter(0, true, [] {});
    ASSERT_TRUE(t.ok()) << i << ": " << t.status();
    admins.push_back(*std::move(t));
  }
  EXPECT_EQ(gate.opening(0), 2);
  other = absl::CancelledError("its handler returned");
  again = absl::CancelledError("its handler returned");
  admins.clear();
  EXPECT_EQ(gate.streams(), 0);
  EXPECT_EQ(gate.opening(1000), 0);
  EXPECT_EQ(gate.timed_out(), 0u);
}

TEST(SessionStreamGateTest, CancelsAStreamWhoseOpenDoesNotComeInTime) {
  SessionStreamGate gate(Limits{8, 8, absl::Milliseconds(20)});
  absl::Notification cancelled;
  auto late = gate.Enter(1000, false, [&cancelled] { cancelled.Notify(); });
  ASSERT_TRUE(late.ok()) << late.status();
  ASSERT_TRUE(cancelled.WaitForNotificationWithTimeout(absl::Seconds(30))) << "the deadline never fired";
  EXPECT_FALSE(late->Opened()) << "a stream cancelled at its deadline was taken as opened in time";
  EXPECT_EQ(gate.timed_out(), 1u);
  EXPECT_EQ(gate.opening(1000), 0);  // no longer opening, though its handler still holds its place
  EXPECT_EQ(gate.streams(), 1);
}

TEST(SessionStreamGateTest, AStreamOpenedInTimeIsNeverCancelled) {
  std::atomic<int> cancels{0};
  {
    SessionStreamGate gate(Limits{8, 8, absl::Milliseconds(200)});
    auto t = gate.Enter(1000, false, [&cancels] { ++cancels; });
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(t->Opened());
    EXPECT_TRUE(t->Opened());  // asking again changes nothing
    // A later, earlier-expiring stream wakes the watchdog; the opened one stays uncancelled.
    absl::Notification fired;
    gate.SetLimits(Limits{8, 8, absl::Milliseconds(1)});
    auto quick = gate.Enter(1000, false, [&fired] { fired.Notify(); });
    ASSERT_TRUE(quick.ok()) << quick.status();
    ASSERT_TRUE(fired.WaitForNotificationWithTimeout(absl::Seconds(30)));
    EXPECT_EQ(gate.timed_out(), 1u);
  }  // the tickets go first, then the gate and its watchdog
  EXPECT_EQ(cancels.load(), 0);
}

TEST(SessionStreamGateTest, NewLimitsApplyToStreamsThatStartAfter) {
  SessionStreamGate gate(Limits{8, 1, kNever});
  auto first = gate.Enter(1000, false, [] {});
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(gate.Enter(1000, false, [] {}).ok());
  gate.SetLimits(Limits{8, 3, kNever});
  EXPECT_EQ(gate.limits().max_opening_per_uid, 3);
  auto second = gate.Enter(1000, false, [] {});
  EXPECT_TRUE(second.ok()) << second.status();
  gate.SetLimits(Limits{1, 3, kNever});
  EXPECT_EQ(gate.Enter(2000, false, [] {}).status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace stream_gate_test
}  // namespace hisparse
