#include "service/engine/dynamic_batcher.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/thread_name.h"

namespace tost::service {

namespace {

// Weight of the newest batch in the compute-time average behind the retry hint.
constexpr double kComputeAverageWeight = 0.2;

std::string ModelPrefix(const std::string& model_name) {
  return absl::StrCat("model '", model_name, "': ");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// BatchInput

BatchInput::BatchInput(ImageResolution resolution, std::vector<const BatchRequest*> requests)
    : resolution_(resolution), requests_(std::move(requests)) {
  for (const BatchRequest* request : requests_) num_images_ += request->batch;
}

std::vector<float> BatchInput::ConcatenatedInput() const {
  size_t total = 0;
  for (const BatchRequest* request : requests_) total += request->input.size();
  std::vector<float> out;
  out.reserve(total);
  for (const BatchRequest* request : requests_)
    out.insert(out.end(), request->input.begin(), request->input.end());
  return out;
}

// ---------------------------------------------------------------------------------------------
// Reservation

DynamicBatcher::Reservation& DynamicBatcher::Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    if (batcher_ != nullptr) batcher_->ReleaseReservation();
    batcher_ = std::exchange(other.batcher_, nullptr);
  }
  return *this;
}

DynamicBatcher::Reservation::~Reservation() {
  if (batcher_ != nullptr) batcher_->ReleaseReservation();
}

// ---------------------------------------------------------------------------------------------
// Construction and shutdown

absl::StatusOr<std::unique_ptr<DynamicBatcher>> DynamicBatcher::Create(
    const DynamicBatcherOptions& options, RunBatchFn run_batch_fn, Clock* clock) {
  if (options.model_name.empty()) {
    return absl::InvalidArgumentError("dynamic batcher: model_name must name the model; was empty");
  }
  const std::string prefix = ModelPrefix(options.model_name);
  if (options.max_batch_images < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "max_batch_images must be at least 1 image; was ", options.max_batch_images));
  }
  if (options.max_queue_delay_us < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "max_queue_delay_us must be >= 0; was ", options.max_queue_delay_us));
  }
  if (options.max_queue_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "max_queue_size must be at least 1 request; was ", options.max_queue_size));
  }
  if (options.timeout_us < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "timeout_us must be >= 0 (0 = no default deadline); was ", options.timeout_us));
  }
  if (!run_batch_fn) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "the batch run function must be set; was empty"));
  }
  if (clock == nullptr) clock = RealClock::Get();

  std::unique_ptr<DynamicBatcher> batcher(
      new DynamicBatcher(options, std::move(run_batch_fn), clock));
  if (options.start_worker_thread) {
    DynamicBatcher* raw = batcher.get();
    batcher->worker_ = std::thread([raw] { raw->WorkerLoop(); });
  }
  return batcher;
}

DynamicBatcher::DynamicBatcher(const DynamicBatcherOptions& options, RunBatchFn run_batch_fn,
                               Clock* clock)
    : options_(options),
      policy_(options.max_batch_images, absl::Microseconds(options.max_queue_delay_us)),
      timeout_(options.timeout_us > 0 ? absl::Microseconds(options.timeout_us)
                                      : absl::InfiniteDuration()),
      clock_(clock),
      run_batch_fn_(std::move(run_batch_fn)) {}

DynamicBatcher::~DynamicBatcher() { Shutdown(ShutdownMode::kFailQueued); }

void DynamicBatcher::Shutdown(ShutdownMode mode) {
  absl::MutexLock shutdown_lock(&shutdown_mu_);
  if (shut_down_) return;

  std::vector<BatchRequest> failed;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (mode == ShutdownMode::kFailQueued) {
      failed = std::move(queue_);
      queue_.clear();
      queue_info_.clear();
      queued_images_ = 0;
      counters_.failed_shutdown += static_cast<int64_t>(failed.size());
    }
  }
  // Wakes the worker so it flushes (kFinishQueued) or finds the queue empty and exits.
  work_changed_.SignalAll();

  for (BatchRequest& request : failed) {
    NotifyDropped(BatchDropReason::kShutdown, request.batch);
    std::move(request.done)(absl::UnavailableError(absl::StrCat(
        ModelPrefix(options_.model_name), "the server is shutting down; the queued request of ",
        request.batch, " image(s) at ", request.resolution.ToString(),
        " was not run; retry on another replica")));
  }

  if (worker_.joinable()) {
    worker_.join();
  } else if (mode == ShutdownMode::kFinishQueued) {
    DrainReadyOnCallingThread();
  }
  shut_down_ = true;
}

// ---------------------------------------------------------------------------------------------
// Admission

absl::Status DynamicBatcher::ValidateBatch(int64_t batch) const {
  if (batch < 1 || batch > options_.max_batch_images) {
    return absl::InvalidArgumentError(
        absl::StrCat(ModelPrefix(options_.model_name), "request batch must be 1..",
                     options_.max_batch_images, " images (max_batch_images); was ", batch,
                     batch > options_.max_batch_images ? "; split the request" : ""));
  }
  return absl::OkStatus();
}

absl::Status DynamicBatcher::ShuttingDownStatus() const {
  return absl::UnavailableError(
      absl::StrCat(ModelPrefix(options_.model_name),
                   "the server is shutting down and accepts no new classification "
                   "requests; retry on another replica"));
}

absl::Status DynamicBatcher::QueueFullLocked() {
  ++counters_.rejected_queue_full;
  // The queue empties in about one batch delay plus one compute time per max_batch_images images
  // ahead; before any batch has run only the delay is known.
  const int64_t batches_ahead = std::max<int64_t>(
      1, (queued_images_ + options_.max_batch_images - 1) / options_.max_batch_images);
  const absl::Duration hint =
      std::max(absl::Milliseconds(1),
               policy_.max_queue_delay() + average_compute_ * static_cast<double>(batches_ahead));
  const int64_t waiting = static_cast<int64_t>(queue_.size()) + reserved_requests_;
  return absl::ResourceExhaustedError(absl::StrCat(
      ModelPrefix(options_.model_name), "classification queue is full: ", waiting,
      " requests waiting (max_queue_size ", options_.max_queue_size, "); retry after about ",
      absl::ToInt64Milliseconds(absl::Ceil(hint, absl::Milliseconds(1))), " ms"));
}

absl::StatusOr<DynamicBatcher::Reservation> DynamicBatcher::Reserve(int64_t batch) {
  if (absl::Status status = ValidateBatch(batch); !status.ok()) return status;
  absl::Status refusal;
  BatchDropReason reason = BatchDropReason::kQueueFull;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      refusal = ShuttingDownStatus();
      reason = BatchDropReason::kShutdown;
    } else if (static_cast<int64_t>(queue_.size()) + reserved_requests_ >=
               options_.max_queue_size) {
      refusal = QueueFullLocked();
    } else {
      ++reserved_requests_;
      return Reservation(this);
    }
  }
  NotifyDropped(reason, batch);
  return refusal;
}

void DynamicBatcher::ReleaseReservation() {
  absl::MutexLock lock(&mu_);
  --reserved_requests_;
}

absl::Status DynamicBatcher::Submit(BatchRequest request) {
  return Enqueue(std::move(request), nullptr);
}

absl::Status DynamicBatcher::Submit(Reservation reservation, BatchRequest request) {
  if (reservation.batcher_ != this) {
    return absl::InvalidArgumentError(
        absl::StrCat(ModelPrefix(options_.model_name),
                     "Submit expected a reservation reserved from this model's batcher; got an "
                     "empty or foreign reservation"));
  }
  // On any error `reservation` gives its place back when it goes out of scope.
  return Enqueue(std::move(request), &reservation);
}

absl::Status DynamicBatcher::Enqueue(BatchRequest request, Reservation* reservation) {
  const std::string prefix = ModelPrefix(options_.model_name);
  if (absl::Status status = ValidateBatch(request.batch); !status.ok()) return status;
  if (request.resolution.height < 1 || request.resolution.width < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "request resolution must be positive height x width; was ",
                     request.resolution.ToString()));
  }
  if (!request.done) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "request needs a completion callback (done); was empty"));
  }

  const int64_t images = request.batch;  // `request` is moved into the queue on success
  absl::Status refusal;
  BatchDropReason reason = BatchDropReason::kQueueFull;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    const absl::Time deadline =
        request.deadline != absl::InfiniteFuture() ? request.deadline : now + timeout_;
    if (stopping_) {
      refusal = ShuttingDownStatus();
      reason = BatchDropReason::kShutdown;
    } else if (deadline <= now) {
      refusal = absl::DeadlineExceededError(absl::StrCat(prefix, "the request's deadline passed ",
                                                         absl::FormatDuration(now - deadline),
                                                         " before it reached the batch queue"));
      reason = BatchDropReason::kDeadlineExceeded;
    } else if (reservation == nullptr && static_cast<int64_t>(queue_.size()) + reserved_requests_ >=
                                             options_.max_queue_size) {
      refusal = QueueFullLocked();
    } else {
      if (reservation != nullptr) {
        // The reserved place becomes the queued request's place.
        reservation->batcher_ = nullptr;
        --reserved_requests_;
      }
      queue_info_.push_back(QueuedRequestInfo{request.batch, request.resolution, now, deadline});
      queued_images_ += request.batch;
      queue_.push_back(std::move(request));
    }
  }
  if (!refusal.ok()) {
    NotifyDropped(reason, images);
    return refusal;
  }
  // Signalled outside the lock so the woken worker does not immediately block on it. Every new
  // request may change the decision (fill a batch, open one, bring a deadline forward).
  work_changed_.Signal();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> DynamicBatcher::SubmitAndWait(BatchRequest request) {
  if (!options_.start_worker_thread) {
    return absl::FailedPreconditionError(
        absl::StrCat(ModelPrefix(options_.model_name),
                     "SubmitAndWait needs the worker thread; the batcher has none"));
  }
  absl::Notification finished;
  absl::StatusOr<std::vector<float>> result;
  request.done = [&finished, &result](absl::StatusOr<std::vector<float>> rows) {
    result = std::move(rows);
    finished.Notify();
  };
  if (absl::Status status = Submit(std::move(request)); !status.ok()) return status;
  finished.WaitForNotification();
  return result;
}

void DynamicBatcher::NotifyDropped(BatchDropReason reason, int64_t images) const {
  if (options_.observer != nullptr)
    options_.observer->OnDropped(options_.model_name, reason, images);
}

// ---------------------------------------------------------------------------------------------
// Taking and executing work

DynamicBatcher::Work DynamicBatcher::TakeWorkLocked(absl::Time now) {
  const BatchAction action = policy_.NextAction(now, queue_info_, /*flush=*/stopping_);
  Work work;
  work.wake_at = action.wake_at;
  work.close_reason = action.close_reason;
  if (action.expired.empty() && action.batch.empty()) return work;

  std::vector<bool> taken(queue_.size(), false);
  for (size_t i : action.expired) {
    taken[i] = true;
    queued_images_ -= queue_[i].batch;
    work.expired_enqueued.push_back(queue_info_[i].enqueued);
    work.expired.push_back(std::move(queue_[i]));
  }
  if (!action.batch.empty()) work.oldest_enqueued = queue_info_[action.batch.front()].enqueued;
  for (size_t i : action.batch) {
    taken[i] = true;
    queued_images_ -= queue_[i].batch;
    work.batch.push_back(std::move(queue_[i]));
  }
  // Compacts the queue, keeping arrival order.
  size_t kept = 0;
  for (size_t i = 0; i < queue_.size(); ++i) {
    if (taken[i]) continue;
    if (kept != i) {
      queue_[kept] = std::move(queue_[i]);
      queue_info_[kept] = queue_info_[i];
    }
    ++kept;
  }
  queue_.resize(kept);
  queue_info_.resize(kept);
  counters_.expired += static_cast<int64_t>(work.expired.size());
  return work;
}

void DynamicBatcher::Execute(Work work) {
  const std::string prefix = ModelPrefix(options_.model_name);
  const absl::Time now = clock_->Now();
  for (size_t i = 0; i < work.expired.size(); ++i) {
    BatchRequest& request = work.expired[i];
    NotifyDropped(BatchDropReason::kDeadlineExceeded, request.batch);
    std::move(request.done)(absl::DeadlineExceededError(absl::StrCat(
        prefix, "the request of ", request.batch, " image(s) at ", request.resolution.ToString(),
        " waited ", absl::FormatDuration(now - work.expired_enqueued[i]),
        " in the batch queue and reached its deadline before a batch could run it (without a "
        "client deadline "
        "the server's timeout_us ",
        options_.timeout_us, " applies)")));
  }
  if (work.batch.empty()) return;

  std::vector<const BatchRequest*> members;
  members.reserve(work.batch.size());
  for (const BatchRequest& request : work.batch) members.push_back(&request);
  const BatchInput input(work.batch.front().resolution, std::move(members));

  const absl::Time start = clock_->Now();
  absl::StatusOr<std::vector<float>> rows = run_batch_fn_(input);
  const absl::Time end = clock_->Now();

  // Validates the shape before anything is delivered, so no request gets another's rows.
  if (rows.ok() && (rows->empty() || rows->size() % static_cast<size_t>(input.num_images()) != 0)) {
    rows = absl::InternalError(absl::StrCat(
        prefix, "the batch run returned ", rows->size(), " floats for a batch of ",
        input.num_images(), " images at ", input.resolution().ToString(),
        "; expected a positive multiple of ", input.num_images(), " (one row per image)"));
  }

  BatchRecord record;
  record.model_name = options_.model_name;
  record.resolution = input.resolution();
  record.images = input.num_images();
  record.requests = static_cast<int64_t>(work.batch.size());
  record.close_reason = work.close_reason;
  record.queue_delay = start - work.oldest_enqueued;
  record.compute_time = end - start;
  record.code = rows.status().code();
  {
    absl::MutexLock lock(&mu_);
    ++counters_.batches_run;
    counters_.images_run += record.images;
    const absl::Duration compute = record.compute_time;
    average_compute_ =
        counters_.batches_run == 1
            ? compute
            : average_compute_ * (1.0 - kComputeAverageWeight) + compute * kComputeAverageWeight;
  }

  // The batch's record is observed before any of its requests completes: a client that reads the
  // metrics right after its answer must find its batch counted.
  if (options_.observer != nullptr) options_.observer->OnBatch(record);
  if (!rows.ok()) {
    for (BatchRequest& request : work.batch) std::move(request.done)(rows.status());
  } else {
    const size_t row_size = rows->size() / static_cast<size_t>(input.num_images());
    auto next = rows->cbegin();
    for (BatchRequest& request : work.batch) {
      const auto end_of_request =
          next + static_cast<std::ptrdiff_t>(row_size * static_cast<size_t>(request.batch));
      std::move(request.done)(std::vector<float>(next, end_of_request));
      next = end_of_request;
    }
  }
}

int DynamicBatcher::DrainReadyOnCallingThread() {
  int batches = 0;
  for (;;) {
    Work work;
    {
      absl::MutexLock lock(&mu_);
      work = TakeWorkLocked(clock_->Now());
    }
    if (work.empty()) return batches;
    if (!work.batch.empty()) ++batches;
    Execute(std::move(work));
  }
}

absl::StatusOr<int> DynamicBatcher::ProcessReady() {
  if (options_.start_worker_thread) {
    return absl::FailedPreconditionError(
        absl::StrCat(ModelPrefix(options_.model_name),
                     "ProcessReady is for batchers without a worker thread "
                     "(start_worker_thread = false); this one has one"));
  }
  return DrainReadyOnCallingThread();
}

absl::Time DynamicBatcher::NextWakeTime() const {
  absl::MutexLock lock(&mu_);
  return policy_.NextAction(clock_->Now(), queue_info_, /*flush=*/stopping_).wake_at;
}

void DynamicBatcher::WorkerLoop() {
  NameThisThread(absl::StrCat("batch:", options_.model_name));
  for (;;) {
    Work work;
    {
      absl::MutexLock lock(&mu_);
      for (;;) {
        const absl::Time now = clock_->Now();
        work = TakeWorkLocked(now);
        if (!work.empty()) break;
        // While stopping the policy flushes every open batch, so no work means an empty queue.
        if (stopping_) return;
        // Wakes for a new request or shutdown (signalled), or when a delay or deadline falls due.
        work_changed_.WaitWithTimeout(&mu_, work.wake_at - now);
      }
    }
    Execute(std::move(work));
  }
}

DynamicBatcherStats DynamicBatcher::stats() const {
  absl::MutexLock lock(&mu_);
  DynamicBatcherStats stats = counters_;
  stats.queued_requests = static_cast<int64_t>(queue_.size());
  stats.queued_images = queued_images_;
  stats.reserved_requests = reserved_requests_;
  stats.shutting_down = stopping_;
  return stats;
}

}  // namespace tost::service
