#include "service/api/request_deadline.h"

#include <gtest/gtest.h>

namespace tost::service {
namespace {

gpr_timespec RealtimeIn(absl::Duration from_now) {
  const absl::Time t = absl::Now() + from_now;
  gpr_timespec ts;
  ts.clock_type = GPR_CLOCK_REALTIME;
  ts.tv_sec = absl::ToUnixSeconds(t);
  ts.tv_nsec = static_cast<int32_t>((t - absl::FromUnixSeconds(ts.tv_sec)) / absl::Nanoseconds(1));
  return ts;
}

TEST(RequestDeadline, NoDeadlineIsTheInfiniteFuture) {
  EXPECT_EQ(DeadlineFromTimespec(gpr_inf_future(GPR_CLOCK_REALTIME)), absl::InfiniteFuture());
  EXPECT_EQ(DeadlineFromTimespec(gpr_inf_future(GPR_CLOCK_MONOTONIC)), absl::InfiniteFuture());
}

TEST(RequestDeadline, AnOrdinaryDeadlineIsKeptToTheNanosecond) {
  const gpr_timespec ts = RealtimeIn(absl::Seconds(5));
  const absl::Time t = DeadlineFromTimespec(ts);
  EXPECT_EQ(absl::ToUnixSeconds(t), ts.tv_sec);
  EXPECT_EQ((t - absl::FromUnixSeconds(ts.tv_sec)) / absl::Nanoseconds(1), ts.tv_nsec);
}

// grpc-timeout allows 8 digits of hours: 2562047H is just past what system_clock's int64
// nanoseconds hold from now (the context's chrono deadline() wraps it into the past), 99999999H
// about 11,400 years. Each stays in the future.
TEST(RequestDeadline, DeadlinesFarAheadStayInTheFuture) {
  for (const int64_t hours : {int64_t{2562047}, int64_t{9999999}, int64_t{99999999}}) {
    const gpr_timespec ts = RealtimeIn(absl::Hours(hours));
    EXPECT_GT(DeadlineFromTimespec(ts), absl::Now() + absl::Hours(hours - 1)) << hours << "H";
  }
}

TEST(RequestDeadline, MonotonicDeadlinesAreConverted) {
  gpr_timespec mono =
      gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_seconds(10, GPR_TIMESPAN));
  const absl::Duration ahead = DeadlineFromTimespec(mono) - absl::Now();
  EXPECT_GT(ahead, absl::Seconds(9));
  EXPECT_LT(ahead, absl::Seconds(11));
}

}  // namespace
}  // namespace tost::service
