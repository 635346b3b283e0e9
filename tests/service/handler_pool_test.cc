// HandlerPool: every unary call gets a thread at once (a blocked handler never holds up another),
// up to the cap, past which calls wait in order; destruction runs what was scheduled.
#include "service/api/handler_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace tost::service {
namespace {

TEST(HandlerPool, ABlockedTaskNeverHoldsUpTheNextOne) {
  HandlerPool pool(8);
  absl::Notification release, second_ran;
  pool.Schedule([&] { release.WaitForNotification(); });
  pool.Schedule([&] { second_ran.Notify(); });
  EXPECT_TRUE(second_ran.WaitForNotificationWithTimeout(absl::Seconds(30)))
      << "the second task waited for the first";
  EXPECT_EQ(pool.threads(), 2);
  release.Notify();
}

TEST(HandlerPool, IdleThreadsAreReusedAndTheCapIsKept) {
  HandlerPool pool(3);
  for (int i = 0; i < 20; ++i) {
    absl::Notification done;
    pool.Schedule([&] { done.Notify(); });
    done.WaitForNotification();
    absl::SleepFor(absl::Milliseconds(10));  // the thread goes back to waiting
  }
  EXPECT_LE(pool.threads(), 2) << "sequential calls should reuse an idle thread";

  absl::Notification release;
  std::atomic<int> started{0};
  for (int i = 0; i < 6; ++i) {
    pool.Schedule([&] {
      ++started;
      release.WaitForNotification();
    });
  }
  for (int i = 0; i < 3000 && started.load() < 3; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(started.load(), 3) << "three threads at most";
  EXPECT_EQ(pool.threads(), 3);
  release.Notify();
}

TEST(HandlerPool, DestructionRunsEveryScheduledTask) {
  std::atomic<int> ran{0};
  {
    HandlerPool pool(1);
    for (int i = 0; i < 50; ++i) pool.Schedule([&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 50);
}

}  // namespace
}  // namespace tost::service
