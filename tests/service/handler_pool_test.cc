// HandlerPool: every unary call gets a thread at once (a blocked handler never holds up another),
// up to the cap, past which calls wait in order, up to a bound past which they are refused; idle
// threads exit; destruction runs what was scheduled.
#include "service/api/handler_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace tost::service {
namespace {

TEST(HandlerPool, ABlockedTaskNeverHoldsUpTheNextOne) {
  HandlerPool pool("test-pool", 8, 64);
  absl::Notification release, second_ran;
  EXPECT_TRUE(pool.Schedule([&] { release.WaitForNotification(); }));
  EXPECT_TRUE(pool.Schedule([&] { second_ran.Notify(); }));
  EXPECT_TRUE(second_ran.WaitForNotificationWithTimeout(absl::Seconds(30)))
      << "the second task waited for the first";
  EXPECT_EQ(pool.threads(), 2);
  release.Notify();
}

TEST(HandlerPool, IdleThreadsAreReusedAndTheCapIsKept) {
  HandlerPool pool("test-pool", 3, 64);
  for (int i = 0; i < 20; ++i) {
    absl::Notification done;
    EXPECT_TRUE(pool.Schedule([&] { done.Notify(); }));
    done.WaitForNotification();
    absl::SleepFor(absl::Milliseconds(10));  // the thread goes back to waiting
  }
  EXPECT_LE(pool.threads(), 2) << "sequential calls should reuse an idle thread";

  absl::Notification release;
  std::atomic<int> started{0};
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(pool.Schedule([&] {
      ++started;
      release.WaitForNotification();
    }));
  }
  for (int i = 0; i < 3000 && started.load() < 3; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(started.load(), 3) << "three threads at most";
  EXPECT_EQ(pool.threads(), 3);
  release.Notify();
}

TEST(HandlerPool, DestructionRunsEveryScheduledTask) {
  std::atomic<int> ran{0};
  {
    HandlerPool pool("test-pool", 1, 64);
    for (int i = 0; i < 50; ++i) EXPECT_TRUE(pool.Schedule([&] { ++ran; }));
  }
  EXPECT_EQ(ran.load(), 50);
}

TEST(HandlerPool, RefusesTasksPastTheQueueBoundOnceEveryThreadRuns) {
  HandlerPool pool("test-pool", 2, 3);
  absl::Notification release;
  std::atomic<int> started{0}, ran{0};
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(pool.Schedule([&] {
      ++started;
      release.WaitForNotification();
    }));
  }
  for (int i = 0; i < 3000 && started.load() < 2; ++i) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_EQ(started.load(), 2);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(pool.Schedule([&] { ++ran; })) << i;
  EXPECT_FALSE(pool.Schedule([&] { ++ran; })) << "a fourth waiting task is refused";
  release.Notify();
  for (int i = 0; i < 3000 && ran.load() < 3; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(ran.load(), 3);
  EXPECT_TRUE(pool.Schedule([&] { ++ran; })) << "the queue drained: room again";
}

TEST(HandlerPool, IdleThreadsExitAndComeBackWhenNeeded) {
  HandlerPool pool("test-pool", 8, 64, absl::Milliseconds(50));
  absl::Notification release;
  std::atomic<int> started{0};
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(pool.Schedule([&] {
      ++started;
      release.WaitForNotification();
    }));
  }
  for (int i = 0; i < 3000 && started.load() < 4; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(pool.threads(), 4);
  release.Notify();
  for (int i = 0; i < 3000 && pool.threads() > 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(pool.threads(), 0) << "a burst's threads stay after it";
  absl::Notification done;
  EXPECT_TRUE(pool.Schedule([&] { done.Notify(); }));
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
}

}  // namespace
}  // namespace tost::service
