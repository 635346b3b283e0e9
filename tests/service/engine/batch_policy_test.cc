// BatchPolicy::NextAction is a pure function of (now, queue): these tests call it with chosen
// instants, no clock and no thread.
#include "service/engine/batch_policy.h"

#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tost::service {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr ImageResolution k224{224, 224};
constexpr ImageResolution k160{160, 160};

const absl::Time kT0 = absl::FromUnixSeconds(1'000);
const absl::Duration kDelay = absl::Milliseconds(2);

QueuedRequestInfo Request(int64_t images, ImageResolution resolution = k224,
                          absl::Time enqueued = kT0, absl::Time deadline = absl::InfiniteFuture()) {
  return QueuedRequestInfo{images, resolution, enqueued, deadline};
}

TEST(BatchPolicyTest, EmptyQueueWaitsForever) {
  const BatchPolicy policy(4, kDelay);
  const BatchAction action = policy.NextAction(kT0, {});
  EXPECT_THAT(action.batch, IsEmpty());
  EXPECT_THAT(action.expired, IsEmpty());
  EXPECT_EQ(action.wake_at, absl::InfiniteFuture());
}

TEST(BatchPolicyTest, ClosesOnSizeExactlyWhenFull) {
  const BatchPolicy policy(4, kDelay);
  std::vector<QueuedRequestInfo> queue = {Request(1), Request(1), Request(1)};
  BatchAction action = policy.NextAction(kT0, queue);
  EXPECT_THAT(action.batch, IsEmpty()) << "3 of 4 images: not full, delay not over";
  EXPECT_EQ(action.wake_at, kT0 + kDelay);

  queue.push_back(Request(1));
  action = policy.NextAction(kT0, queue);
  EXPECT_THAT(action.batch, ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(action.close_reason, BatchCloseReason::kSize);
  EXPECT_EQ(action.wake_at, kT0);
}

TEST(BatchPolicyTest, ClosesOnDelayExactlyAtMaxQueueDelayAndNotBefore) {
  const BatchPolicy policy(4, kDelay);
  const std::vector<QueuedRequestInfo> queue = {Request(1),
                                                Request(2, k224, kT0 + absl::Microseconds(500))};

  BatchAction action = policy.NextAction(kT0 + kDelay - absl::Microseconds(1), queue);
  EXPECT_THAT(action.batch, IsEmpty());
  EXPECT_EQ(action.wake_at, kT0 + kDelay) << "measured from the oldest request";

  action = policy.NextAction(kT0 + kDelay, queue);
  EXPECT_THAT(action.batch, ElementsAre(0, 1));
  EXPECT_EQ(action.close_reason, BatchCloseReason::kDelay);
}

TEST(BatchPolicyTest, ZeroDelayRunsAtOnce) {
  const BatchPolicy policy(4, absl::ZeroDuration());
  const BatchAction action = policy.NextAction(kT0, std::vector<QueuedRequestInfo>{Request(1)});
  EXPECT_THAT(action.batch, ElementsAre(0));
  EXPECT_EQ(action.close_reason, BatchCloseReason::kDelay);
}

TEST(BatchPolicyTest, NeverMixesResolutions) {
  const BatchPolicy policy(8, kDelay);
  const absl::Duration step = absl::Microseconds(10);
  std::vector<QueuedRequestInfo> queue = {Request(1, k224, kT0), Request(1, k160, kT0 + step),
                                          Request(1, k224, kT0 + 2 * step)};
  BatchAction action = policy.NextAction(kT0 + kDelay, queue);
  EXPECT_THAT(action.batch, ElementsAre(0, 2));
  EXPECT_EQ(action.close_reason, BatchCloseReason::kDelay);

  // The 160x160 request waits for its own batch, timed from its own arrival.
  queue = {queue[1]};
  action = policy.NextAction(kT0 + kDelay, queue);
  EXPECT_THAT(action.batch, IsEmpty());
  EXPECT_EQ(action.wake_at, kT0 + step + kDelay);
  action = policy.NextAction(kT0 + step + kDelay, queue);
  EXPECT_THAT(action.batch, ElementsAre(0));
}

TEST(BatchPolicyTest, RequestBiggerThanRemainingRoomStartsTheNextBatch) {
  const BatchPolicy policy(4, kDelay);
  // 3 + 2 > 4: the batch holding the 3 closes now, on size, and the 2 is not skipped past.
  std::vector<QueuedRequestInfo> queue = {Request(3), Request(2), Request(1)};
  BatchAction action = policy.NextAction(kT0, queue);
  EXPECT_THAT(action.batch, ElementsAre(0));
  EXPECT_EQ(action.close_reason, BatchCloseReason::kSize);

  queue = {queue[1], queue[2]};
  action = policy.NextAction(kT0, queue);
  EXPECT_THAT(action.batch, IsEmpty()) << "2 + 1 of 4: waits for size or delay";
  action = policy.NextAction(kT0 + kDelay, queue);
  EXPECT_THAT(action.batch, ElementsAre(0, 1));
}

TEST(BatchPolicyTest, FullYoungerBatchRunsBeforeAnOlderBatchIsDue) {
  const BatchPolicy policy(2, kDelay);
  const std::vector<QueuedRequestInfo> queue = {Request(1, k160, kT0),
                                                Request(2, k224, kT0 + absl::Microseconds(1))};
  const BatchAction action = policy.NextAction(kT0 + absl::Microseconds(1), queue);
  EXPECT_THAT(action.batch, ElementsAre(1));
  EXPECT_EQ(action.close_reason, BatchCloseReason::kSize);
}

TEST(BatchPolicyTest, OldestReadyBatchRunsFirst) {
  const BatchPolicy policy(8, kDelay);
  const std::vector<QueuedRequestInfo> queue = {Request(1, k160, kT0),
                                                Request(1, k224, kT0 + absl::Microseconds(1))};
  const BatchAction action = policy.NextAction(kT0 + absl::Seconds(1), queue);
  EXPECT_THAT(action.batch, ElementsAre(0));
}

TEST(BatchPolicyTest, ExpiredRequestsAreReportedAndNeverBatched) {
  const BatchPolicy policy(4, kDelay);
  const absl::Time deadline = kT0 + absl::Milliseconds(1);
  const std::vector<QueuedRequestInfo> queue = {Request(2, k224, kT0, deadline),
                                                Request(1, k224, kT0)};

  BatchAction action = policy.NextAction(deadline - absl::Microseconds(1), queue);
  EXPECT_THAT(action.expired, IsEmpty());
  EXPECT_THAT(action.batch, IsEmpty());
  EXPECT_EQ(action.wake_at, deadline) << "the deadline comes before the delay";

  action = policy.NextAction(deadline, queue);
  EXPECT_THAT(action.expired, ElementsAre(0));
  EXPECT_THAT(action.batch, IsEmpty());
  EXPECT_EQ(action.wake_at, kT0 + kDelay);

  // Expired requests take no room: at the delay only the live request is batched.
  action = policy.NextAction(kT0 + kDelay, queue);
  EXPECT_THAT(action.expired, ElementsAre(0));
  EXPECT_THAT(action.batch, ElementsAre(1));
}

TEST(BatchPolicyTest, FlushClosesOpenBatchesButStillExpires) {
  const BatchPolicy policy(8, absl::Seconds(10));
  const std::vector<QueuedRequestInfo> queue = {Request(1, k224, kT0, kT0), Request(1, k160),
                                                Request(1, k224)};
  const BatchAction action = policy.NextAction(kT0, queue, /*flush=*/true);
  EXPECT_THAT(action.expired, ElementsAre(0));
  EXPECT_THAT(action.batch, ElementsAre(1));
  EXPECT_EQ(action.close_reason, BatchCloseReason::kFlush);
}

TEST(BatchPolicyTest, IsDeterministic) {
  const BatchPolicy policy(3, kDelay);
  const std::vector<QueuedRequestInfo> queue = {Request(1, k160), Request(2), Request(2),
                                                Request(1, k160)};
  const BatchAction a = policy.NextAction(kT0, queue);
  const BatchAction b = policy.NextAction(kT0, queue);
  EXPECT_EQ(a.batch, b.batch);
  EXPECT_EQ(a.expired, b.expired);
  EXPECT_EQ(a.wake_at, b.wake_at);
  EXPECT_THAT(a.batch, ElementsAre(1))
      << "2 + 2 > 3 closes the 224x224 batch on size; 160x160 waits";
}

}  // namespace
}  // namespace tost::service
