// DynamicBatcher: timing behaviour with a FakeClock and no worker thread (the test drives
// ProcessReady() and advances time by hand, so nothing sleeps), plus real-thread tests with
// RealClock that check row routing under concurrent submitters and the drain on shutdown.
#include "service/engine/dynamic_batcher.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace tost::service {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr ImageResolution k224{224, 224};
constexpr ImageResolution k160{160, 160};

// Each image's input is {tag, image index}; the fake model answers each image with the row
// {tag, image index, height}, so a request can tell whether it got its own rows back.
std::vector<float> TaggedInput(float tag, int64_t images) {
  std::vector<float> input;
  for (int64_t i = 0; i < images; ++i) {
    input.push_back(tag);
    input.push_back(static_cast<float>(i));
  }
  return input;
}

std::vector<float> ExpectedRows(float tag, int64_t images, ImageResolution resolution) {
  std::vector<float> rows;
  for (int64_t i = 0; i < images; ++i) {
    rows.push_back(tag);
    rows.push_back(static_cast<float>(i));
    rows.push_back(static_cast<float>(resolution.height));
  }
  return rows;
}

absl::StatusOr<std::vector<float>> FakeModel(const BatchInput& input) {
  const std::vector<float> pixels = input.ConcatenatedInput();
  std::vector<float> rows;
  for (size_t i = 0; i + 1 < pixels.size(); i += 2) {
    rows.push_back(pixels[i]);
    rows.push_back(pixels[i + 1]);
    rows.push_back(static_cast<float>(input.resolution().height));
  }
  return rows;
}

// What one request's `done` received.
struct Outcome {
  int calls = 0;
  absl::StatusOr<std::vector<float>> rows = absl::UnknownError("done not called");
};

struct RunCall {
  ImageResolution resolution;
  int64_t images = 0;
  std::vector<float> tags;  // one per request, in batch order
};

class RecordingObserver : public BatchObserver {
 public:
  void OnBatch(const BatchRecord& record) override {
    absl::MutexLock lock(&mu_);
    batches_.push_back(record);
    batches_.back().model_name = {};  // the view dies with the batcher
  }
  void OnDropped(std::string_view, BatchDropReason reason, int64_t images) override {
    absl::MutexLock lock(&mu_);
    drops_.push_back({reason, images});
  }
  std::vector<BatchRecord> batches() const {
    absl::MutexLock lock(&mu_);
    return batches_;
  }
  std::vector<std::pair<BatchDropReason, int64_t>> drops() const {
    absl::MutexLock lock(&mu_);
    return drops_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<BatchRecord> batches_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<BatchDropReason, int64_t>> drops_ ABSL_GUARDED_BY(mu_);
};

class DynamicBatcherTest : public ::testing::Test {
 protected:
  static DynamicBatcherOptions ManualOptions() {
    DynamicBatcherOptions options;
    options.model_name = "tost-tiny";
    options.max_batch_images = 4;
    options.max_queue_delay_us = 2'000;
    options.max_queue_size = 8;
    options.timeout_us = 0;
    options.start_worker_thread = false;
    return options;
  }

  std::unique_ptr<DynamicBatcher> Make(DynamicBatcherOptions options) {
    options.observer = &observer_;
    auto batcher = DynamicBatcher::Create(
        options,
        [this](const BatchInput& input) -> absl::StatusOr<std::vector<float>> {
          RunCall call{input.resolution(), input.num_images(), {}};
          for (const BatchRequest* request : input.requests())
            call.tags.push_back(request->input.at(0));
          runs_.push_back(call);
          clock_.Advance(compute_time_);
          if (!run_status_.ok()) return run_status_;
          if (return_short_result_)
            return std::vector<float>(static_cast<size_t>(input.num_images() * 2 + 1));
          return FakeModel(input);
        },
        &clock_);
    EXPECT_TRUE(batcher.ok()) << batcher.status();
    return std::move(batcher).value();
  }

  // A request of `images` images tagged `tag`; its outcome is recorded in outcomes_[tag].
  BatchRequest Req(int tag, int64_t images = 1, ImageResolution resolution = k224,
                   absl::Time deadline = absl::InfiniteFuture()) {
    outcomes_.resize(std::max<size_t>(outcomes_.size(), static_cast<size_t>(tag) + 1));
    Outcome* outcome = &outcomes_[static_cast<size_t>(tag)];
    BatchRequest request;
    request.resolution = resolution;
    request.batch = images;
    request.input = TaggedInput(static_cast<float>(tag), images);
    request.deadline = deadline;
    request.done = [outcome](absl::StatusOr<std::vector<float>> rows) {
      ++outcome->calls;
      outcome->rows = std::move(rows);
    };
    return request;
  }

  const Outcome& outcome(int tag) { return outcomes_.at(static_cast<size_t>(tag)); }

  int Process(DynamicBatcher& batcher) {
    absl::StatusOr<int> batches = batcher.ProcessReady();
    EXPECT_TRUE(batches.ok()) << batches.status();
    return batches.value_or(-1);
  }

  // Declared before any batcher a test makes, so they outlive it (its destructor completes
  // requests).
  FakeClock clock_;
  RecordingObserver observer_;
  std::deque<Outcome> outcomes_;  // a deque: growing it keeps earlier elements in place
  std::vector<RunCall> runs_;
  absl::Status run_status_;
  bool return_short_result_ = false;
  absl::Duration compute_time_ = absl::ZeroDuration();
};

TEST_F(DynamicBatcherTest, CreateRejectsInvalidOptions) {
  const auto expect_invalid = [](DynamicBatcherOptions options, const std::string& field) {
    auto batcher = DynamicBatcher::Create(options, FakeModel, nullptr);
    ASSERT_FALSE(batcher.ok()) << field;
    EXPECT_EQ(batcher.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(batcher.status().message(), HasSubstr(field));
  };
  DynamicBatcherOptions options = ManualOptions();
  options.model_name = "";
  expect_invalid(options, "model_name");
  options = ManualOptions();
  options.max_batch_images = 0;
  expect_invalid(options, "max_batch_images");
  options = ManualOptions();
  options.max_queue_delay_us = -1;
  expect_invalid(options, "max_queue_delay_us");
  options = ManualOptions();
  options.max_queue_size = 0;
  expect_invalid(options, "max_queue_size");
  options = ManualOptions();
  options.timeout_us = -5;
  expect_invalid(options, "timeout_us");

  auto no_fn = DynamicBatcher::Create(ManualOptions(), RunBatchFn(), nullptr);
  ASSERT_FALSE(no_fn.ok());
  EXPECT_EQ(no_fn.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_fn.status().message(), HasSubstr("tost-tiny"));
}

TEST_F(DynamicBatcherTest, ClosesOnSizeExactlyWithoutWaitingForTheDelay) {
  auto batcher = Make(ManualOptions());
  ASSERT_TRUE(batcher->Submit(Req(0, 1)).ok());
  ASSERT_TRUE(batcher->Submit(Req(1, 2)).ok());
  EXPECT_EQ(Process(*batcher), 0) << "3 of 4 images";
  ASSERT_TRUE(batcher->Submit(Req(2, 1)).ok());
  EXPECT_EQ(Process(*batcher), 1) << "4 of 4 images: closes at once, time has not moved";

  ASSERT_EQ(runs_.size(), 1u);
  EXPECT_EQ(runs_[0].images, 4);
  EXPECT_THAT(runs_[0].tags, ElementsAre(0, 1, 2));
  for (int tag = 0; tag < 3; ++tag) {
    ASSERT_TRUE(outcome(tag).rows.ok()) << outcome(tag).rows.status();
    EXPECT_EQ(outcome(tag).calls, 1);
  }
  EXPECT_EQ(*outcome(1).rows, ExpectedRows(1, 2, k224));
  const std::vector<BatchRecord> batches = observer_.batches();
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0].close_reason, BatchCloseReason::kSize);
  EXPECT_EQ(batches[0].images, 4);
  EXPECT_EQ(batches[0].requests, 3);
  EXPECT_EQ(batches[0].queue_delay, absl::ZeroDuration());
}

TEST_F(DynamicBatcherTest, ClosesOnDelayExactlyAtMaxQueueDelayAndNotBefore) {
  auto batcher = Make(ManualOptions());
  const absl::Time t0 = clock_.Now();
  ASSERT_TRUE(batcher->Submit(Req(0, 1)).ok());
  EXPECT_EQ(batcher->NextWakeTime(), t0 + absl::Microseconds(2'000));

  clock_.Advance(absl::Microseconds(1'000));
  ASSERT_TRUE(batcher->Submit(Req(1, 1)).ok());
  clock_.Advance(absl::Microseconds(999));
  EXPECT_EQ(Process(*batcher), 0) << "1 us before the oldest request's delay ends";
  EXPECT_THAT(runs_, IsEmpty());

  clock_.Advance(absl::Microseconds(1));
  EXPECT_EQ(Process(*batcher), 1);
  ASSERT_EQ(runs_.size(), 1u);
  EXPECT_THAT(runs_[0].tags, ElementsAre(0, 1));
  const std::vector<BatchRecord> batches = observer_.batches();
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0].close_reason, BatchCloseReason::kDelay);
  EXPECT_EQ(batches[0].queue_delay, absl::Microseconds(2'000));
  EXPECT_EQ(batcher->NextWakeTime(), absl::InfiniteFuture());
}

TEST_F(DynamicBatcherTest, NeverMixesResolutions) {
  auto batcher = Make(ManualOptions());
  ASSERT_TRUE(batcher->Submit(Req(0, 1, k224)).ok());
  clock_.Advance(absl::Microseconds(500));
  ASSERT_TRUE(batcher->Submit(Req(1, 2, k160)).ok());
  ASSERT_TRUE(batcher->Submit(Req(2, 1, k224)).ok());

  clock_.Advance(absl::Microseconds(1'500));
  EXPECT_EQ(Process(*batcher), 1) << "only the 224x224 batch is due";
  ASSERT_EQ(runs_.size(), 1u);
  EXPECT_EQ(runs_[0].resolution, k224);
  EXPECT_THAT(runs_[0].tags, ElementsAre(0, 2));
  EXPECT_EQ(outcome(1).calls, 0) << "the 160x160 request waits for its own batch";

  clock_.Advance(absl::Microseconds(500));
  EXPECT_EQ(Process(*batcher), 1);
  ASSERT_EQ(runs_.size(), 2u);
  EXPECT_EQ(runs_[1].resolution, k160);
  EXPECT_THAT(runs_[1].tags, ElementsAre(1));
  EXPECT_EQ(*outcome(1).rows, ExpectedRows(1, 2, k160));
  EXPECT_EQ(*outcome(2).rows, ExpectedRows(2, 1, k224));
}

TEST_F(DynamicBatcherTest, RequestBiggerThanTheRemainingRoomStartsTheNextBatch) {
  auto batcher = Make(ManualOptions());
  ASSERT_TRUE(batcher->Submit(Req(0, 3)).ok());
  ASSERT_TRUE(batcher->Submit(Req(1, 2)).ok());
  EXPECT_EQ(Process(*batcher), 1) << "3 + 2 > 4: the first batch closes on size at once";
  ASSERT_EQ(runs_.size(), 1u);
  EXPECT_THAT(runs_[0].tags, ElementsAre(0));
  EXPECT_EQ(outcome(1).calls, 0);

  ASSERT_TRUE(batcher->Submit(Req(2, 2)).ok());
  EXPECT_EQ(Process(*batcher), 1) << "2 + 2 fills the second batch";
  ASSERT_EQ(runs_.size(), 2u);
  EXPECT_THAT(runs_[1].tags, ElementsAre(1, 2));
  EXPECT_EQ(*outcome(2).rows, ExpectedRows(2, 2, k224));
}

TEST_F(DynamicBatcherTest, RefusesARequestLargerThanMaxBatchSizeBeforeQueueing) {
  auto batcher = Make(ManualOptions());
  const absl::Status status = batcher->Submit(Req(0, 5));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("tost-tiny"));
  EXPECT_THAT(status.message(), HasSubstr("max_batch_images"));
  EXPECT_THAT(status.message(), HasSubstr("was 5"));
  EXPECT_EQ(batcher->stats().queued_requests, 0);
  EXPECT_EQ(batcher->Reserve(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(batcher->Submit(Req(1, 1, ImageResolution{0, 224})).code(),
            absl::StatusCode::kInvalidArgument);
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(Process(*batcher), 0);
  EXPECT_EQ(outcome(0).calls, 0) << "a refused request's done is never called";
}

TEST_F(DynamicBatcherTest, FullQueueIsResourceExhaustedWithARetryHint) {
  DynamicBatcherOptions options = ManualOptions();
  options.max_queue_size = 2;
  auto batcher = Make(options);
  ASSERT_TRUE(batcher->Submit(Req(0)).ok());
  ASSERT_TRUE(batcher->Submit(Req(1)).ok());
  const absl::Status status = batcher->Submit(Req(2));
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("tost-tiny"));
  EXPECT_THAT(status.message(), HasSubstr("2 requests waiting (max_queue_size 2)"));
  EXPECT_THAT(status.message(), HasSubstr("retry after about 2 ms"))
      << "the queue delay, before any compute is known";
  EXPECT_EQ(batcher->stats().rejected_queue_full, 1);
  EXPECT_THAT(observer_.drops(), ElementsAre(std::make_pair(BatchDropReason::kQueueFull, 1)));

  // Once a batch has run, the hint adds its measured compute time per batch ahead.
  compute_time_ = absl::Milliseconds(5);
  clock_.Advance(absl::Milliseconds(2));
  EXPECT_EQ(Process(*batcher), 1);
  ASSERT_TRUE(batcher->Submit(Req(3)).ok()) << "room again";
  ASSERT_TRUE(batcher->Submit(Req(4)).ok());
  EXPECT_THAT(batcher->Submit(Req(5)).message(), HasSubstr("retry after about 7 ms"));
  EXPECT_EQ(outcome(2).calls, 0);
}

TEST_F(DynamicBatcherTest, ReservationsCountAgainstTheQueueBeforeAnyWork) {
  DynamicBatcherOptions options = ManualOptions();
  options.max_queue_size = 2;
  auto batcher = Make(options);
  absl::StatusOr<DynamicBatcher::Reservation> first = batcher->Reserve(1);
  ASSERT_TRUE(first.ok()) << first.status();
  {
    absl::StatusOr<DynamicBatcher::Reservation> second = batcher->Reserve(2);
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_EQ(batcher->stats().reserved_requests, 2);
    EXPECT_EQ(batcher->Reserve(1).status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(batcher->Submit(Req(0)).code(), absl::StatusCode::kResourceExhausted);
  }  // `second` is dropped unused: its place comes back.
  EXPECT_EQ(batcher->stats().reserved_requests, 1);
  ASSERT_TRUE(batcher->Submit(std::move(first).value(), Req(1)).ok());
  ASSERT_TRUE(batcher->Submit(Req(2)).ok());
  const DynamicBatcherStats stats = batcher->stats();
  EXPECT_EQ(stats.reserved_requests, 0);
  EXPECT_EQ(stats.queued_requests, 2);

  clock_.Advance(absl::Milliseconds(2));
  EXPECT_EQ(Process(*batcher), 1);
  EXPECT_EQ(*outcome(1).rows, ExpectedRows(1, 1, k224));
}

TEST_F(DynamicBatcherTest, ExpiredRequestIsDeadlineExceededAndNotRun) {
  DynamicBatcherOptions options = ManualOptions();
  options.max_queue_delay_us = 10'000;
  options.timeout_us = 5'000;
  auto batcher = Make(options);
  const absl::Time t0 = clock_.Now();
  ASSERT_TRUE(batcher->Submit(Req(0, 1)).ok());  // default: t0 + 5 ms
  ASSERT_TRUE(
      batcher->Submit(Req(1, 1, k224, t0 + absl::Milliseconds(8))).ok());  // its own deadline
  EXPECT_EQ(batcher->NextWakeTime(), t0 + absl::Milliseconds(5));

  clock_.Advance(absl::Microseconds(4'999));
  EXPECT_EQ(Process(*batcher), 0);
  EXPECT_EQ(outcome(0).calls, 0);

  clock_.Advance(absl::Microseconds(1));
  EXPECT_EQ(Process(*batcher), 0) << "expiry completes the request without running a batch";
  EXPECT_THAT(runs_, IsEmpty());
  ASSERT_EQ(outcome(0).calls, 1);
  EXPECT_EQ(outcome(0).rows.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(outcome(0).rows.status().message(), HasSubstr("tost-tiny"));
  EXPECT_THAT(outcome(0).rows.status().message(), HasSubstr("waited 5ms"));
  EXPECT_EQ(outcome(1).calls, 0);

  clock_.Advance(absl::Milliseconds(3));
  EXPECT_EQ(Process(*batcher), 0);
  EXPECT_EQ(outcome(1).rows.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(runs_, IsEmpty());
  EXPECT_EQ(batcher->stats().expired, 2);
  EXPECT_THAT(observer_.drops(),
              ElementsAre(std::make_pair(BatchDropReason::kDeadlineExceeded, 1),
                          std::make_pair(BatchDropReason::kDeadlineExceeded, 1)));
}

TEST_F(DynamicBatcherTest, PastDeadlineIsRefusedAtSubmit) {
  auto batcher = Make(ManualOptions());
  const absl::Status status = batcher->Submit(Req(0, 1, k224, clock_.Now()));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(batcher->stats().queued_requests, 0);
}

TEST_F(DynamicBatcherTest, ShutdownFailsPendingRequestsWithUnavailable) {
  auto batcher = Make(ManualOptions());
  ASSERT_TRUE(batcher->Submit(Req(0, 1)).ok());
  ASSERT_TRUE(batcher->Submit(Req(1, 2, k160)).ok());
  batcher->Shutdown(ShutdownMode::kFailQueued);

  EXPECT_THAT(runs_, IsEmpty());
  for (int tag = 0; tag < 2; ++tag) {
    ASSERT_EQ(outcome(tag).calls, 1);
    EXPECT_EQ(outcome(tag).rows.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(outcome(tag).rows.status().message(), HasSubstr("tost-tiny"));
  }
  const absl::Status late = batcher->Submit(Req(2));
  EXPECT_EQ(late.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(late.message(), HasSubstr("shutting down"));
  EXPECT_EQ(batcher->Reserve(1).status().code(), absl::StatusCode::kUnavailable);
  const DynamicBatcherStats stats = batcher->stats();
  EXPECT_EQ(stats.failed_shutdown, 2);
  EXPECT_TRUE(stats.shutting_down);
  batcher->Shutdown();  // idempotent
  EXPECT_EQ(outcome(0).calls, 1);
}

TEST_F(DynamicBatcherTest, ShutdownFinishQueuedRunsQueuedBatchesWithoutWaiting) {
  auto batcher = Make(ManualOptions());
  ASSERT_TRUE(batcher->Submit(Req(0, 1)).ok());
  ASSERT_TRUE(batcher->Submit(Req(1, 1, k160)).ok());
  ASSERT_TRUE(batcher->Submit(Req(2, 2)).ok());
  batcher->Shutdown(ShutdownMode::kFinishQueued);

  ASSERT_EQ(runs_.size(), 2u) << "one batch per resolution, at the same fake instant";
  EXPECT_THAT(runs_[0].tags, ElementsAre(0, 2));
  EXPECT_THAT(runs_[1].tags, ElementsAre(1));
  EXPECT_EQ(*outcome(2).rows, ExpectedRows(2, 2, k224));
  EXPECT_EQ(*outcome(1).rows, ExpectedRows(1, 1, k160));
  const std::vector<BatchRecord> batches = observer_.batches();
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0].close_reason, BatchCloseReason::kFlush);
}

TEST_F(DynamicBatcherTest, RunErrorGoesToEveryRequestOfTheBatch) {
  auto batcher = Make(ManualOptions());
  run_status_ = absl::InternalError("model 'tost-tiny': forward failed: out of memory");
  ASSERT_TRUE(batcher->Submit(Req(0, 1)).ok());
  ASSERT_TRUE(batcher->Submit(Req(1, 3)).ok());
  EXPECT_EQ(Process(*batcher), 1);
  for (int tag = 0; tag < 2; ++tag) {
    ASSERT_EQ(outcome(tag).calls, 1);
    EXPECT_EQ(outcome(tag).rows.status(), run_status_);
  }
  const std::vector<BatchRecord> batches = observer_.batches();
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0].code, absl::StatusCode::kInternal);

  // The batcher keeps serving after a failed batch.
  run_status_ = absl::OkStatus();
  ASSERT_TRUE(batcher->Submit(Req(2, 4)).ok());
  EXPECT_EQ(Process(*batcher), 1);
  EXPECT_EQ(*outcome(2).rows, ExpectedRows(2, 4, k224));
}

TEST_F(DynamicBatcherTest, ResultWithoutOneRowPerImageIsInternalForEveryRequest) {
  auto batcher = Make(ManualOptions());
  return_short_result_ = true;
  ASSERT_TRUE(batcher->Submit(Req(0, 2)).ok());
  ASSERT_TRUE(batcher->Submit(Req(1, 2)).ok());
  EXPECT_EQ(Process(*batcher), 1);
  for (int tag = 0; tag < 2; ++tag) {
    EXPECT_EQ(outcome(tag).rows.status().code(), absl::StatusCode::kInternal);
    EXPECT_THAT(outcome(tag).rows.status().message(),
                HasSubstr("returned 9 floats for a batch of 4 images"));
  }
}

TEST_F(DynamicBatcherTest, ObserverRecordsBatchSizeQueueDelayAndComputeTime) {
  auto batcher = Make(ManualOptions());
  compute_time_ = absl::Milliseconds(7);
  ASSERT_TRUE(batcher->Submit(Req(0, 2, k160)).ok());
  clock_.Advance(absl::Milliseconds(3));
  EXPECT_EQ(Process(*batcher), 1);
  const std::vector<BatchRecord> batches = observer_.batches();
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0].resolution, k160);
  EXPECT_EQ(batches[0].images, 2);
  EXPECT_EQ(batches[0].requests, 1);
  EXPECT_EQ(batches[0].queue_delay, absl::Milliseconds(3));
  EXPECT_EQ(batches[0].compute_time, absl::Milliseconds(7));
  EXPECT_EQ(batches[0].code, absl::StatusCode::kOk);
  const DynamicBatcherStats stats = batcher->stats();
  EXPECT_EQ(stats.batches_run, 1);
  EXPECT_EQ(stats.images_run, 2);
}

TEST_F(DynamicBatcherTest, ProcessReadyIsRefusedWhenAWorkerThreadRuns) {
  DynamicBatcherOptions options = ManualOptions();
  options.start_worker_thread = true;
  auto batcher = Make(options);
  EXPECT_EQ(batcher->ProcessReady().status().code(), absl::StatusCode::kFailedPrecondition);
  batcher->Shutdown();
}

// Real thread, real clock: many submitters at once, each must get exactly its own rows back.
TEST(DynamicBatcherThreadTest, ConcurrentSubmittersEachGetTheirOwnRows) {
  constexpr int kThreads = 8;
  constexpr int kRequestsPerThread = 40;
  DynamicBatcherOptions options;
  options.model_name = "tost-tiny";
  options.max_batch_images = 8;
  options.max_queue_delay_us = 500;
  options.max_queue_size = kThreads * kRequestsPerThread;
  options.timeout_us = 0;
  RecordingObserver observer;
  options.observer = &observer;
  auto created = DynamicBatcher::Create(options, FakeModel, RealClock::Get());
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<DynamicBatcher> batcher = std::move(created).value();

  std::atomic<int> wrong{0};
  std::atomic<int64_t> images_sent{0};
  const absl::Time start = absl::Now();
  std::vector<std::thread> submitters;
  for (int t = 0; t < kThreads; ++t) {
    submitters.emplace_back([&, t] {
      for (int i = 0; i < kRequestsPerThread; ++i) {
        const float tag = static_cast<float>(t * 1000 + i);
        const int64_t images = 1 + (t + i) % 3;
        const ImageResolution resolution = (i % 2 == 0) ? k224 : k160;
        BatchRequest request;
        request.resolution = resolution;
        request.batch = images;
        request.input = TaggedInput(tag, images);
        absl::StatusOr<std::vector<float>> rows = batcher->SubmitAndWait(std::move(request));
        images_sent += images;
        if (!rows.ok() || *rows != ExpectedRows(tag, images, resolution)) ++wrong;
      }
    });
  }
  for (std::thread& thread : submitters) thread.join();
  const absl::Duration elapsed = absl::Now() - start;
  batcher->Shutdown();

  EXPECT_EQ(wrong.load(), 0);
  const DynamicBatcherStats stats = batcher->stats();
  EXPECT_EQ(stats.images_run, images_sent.load());
  EXPECT_LE(stats.batches_run, kThreads * kRequestsPerThread);
  int64_t recorded_images = 0;
  for (const BatchRecord& record : observer.batches()) {
    EXPECT_LE(record.images, options.max_batch_images);
    recorded_images += record.images;
  }
  EXPECT_EQ(recorded_images, images_sent.load());
  // Each request waits at most one delay plus the batches ahead of it; 320 requests finish well
  // within this bound even on 2 busy cores.
  EXPECT_LT(elapsed, absl::Seconds(20));
}

// Real thread: a drain runs what is queued at once instead of waiting out a long delay.
TEST(DynamicBatcherThreadTest, ShutdownDrainsTheQueueWithoutWaitingForTheDelay) {
  DynamicBatcherOptions options;
  options.model_name = "tost-tiny";
  options.max_batch_images = 8;
  options.max_queue_delay_us = 60'000'000;  // a minute: the test would time out if drain waited
  auto created = DynamicBatcher::Create(options, FakeModel, nullptr);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<DynamicBatcher> batcher = std::move(created).value();

  std::vector<Outcome> outcomes(3);
  for (int tag = 0; tag < 3; ++tag) {
    BatchRequest request;
    request.resolution = k224;
    request.input = TaggedInput(static_cast<float>(tag), 1);
    request.done = [&outcomes, tag](absl::StatusOr<std::vector<float>> rows) {
      ++outcomes[static_cast<size_t>(tag)].calls;
      outcomes[static_cast<size_t>(tag)].rows = std::move(rows);
    };
    ASSERT_TRUE(batcher->Submit(std::move(request)).ok());
  }
  const absl::Time start = absl::Now();
  batcher->Shutdown(ShutdownMode::kFinishQueued);  // joins the worker: outcomes are final here
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  for (int tag = 0; tag < 3; ++tag) {
    EXPECT_EQ(outcomes[static_cast<size_t>(tag)].calls, 1);
    ASSERT_TRUE(outcomes[static_cast<size_t>(tag)].rows.ok());
    EXPECT_EQ(*outcomes[static_cast<size_t>(tag)].rows,
              ExpectedRows(static_cast<float>(tag), 1, k224));
  }
  EXPECT_EQ(batcher->stats().batches_run, 1);
}

}  // namespace
}  // namespace tost::service
