// Per-model dynamic batcher for classification.
//
// Requests (each one or more images of one resolution) queue up; a worker thread groups requests of
// equal resolution into batches of at most `max_batch_images` images and calls the run function
// once per batch, then hands each request its own rows of the result. A batch closes when it is
// full (or the next request of its resolution would overflow it) or when its oldest request has
// waited `max_queue_delay_us`; a closed batch never reopens. The decision is
// BatchPolicy::NextAction (service/engine/batch_policy.h), a pure function of (now, queue); this
// class adds the queue, the lock, the thread, admission control, deadlines, result routing and
// observability.
//
// Contract:
//  - Submit() never blocks on batching or compute: it validates, checks room and queues. It returns
//    OK iff it took the request, and then `done` is called exactly once (on the worker thread, or
//    on the thread calling Shutdown). On error `done` is never called: the status is the answer.
//    INVALID_ARGUMENT  batch outside 1..max_batch_images, bad resolution, no `done`
//    RESOURCE_EXHAUSTED  max_queue_size requests already waiting; the message has a retry hint
//    DEADLINE_EXCEEDED  the request's deadline has already passed
//    UNAVAILABLE  Shutdown() has begun
//  - Reserve() decides admission before the caller does any work (decoding images): it holds one
//    queue place until the reservation is submitted or dropped.
//  - A request still queued at its deadline completes with DEADLINE_EXCEEDED and is not run. A
//    request that has started running is not interrupted.
//  - The run function gets the requests of one batch (one resolution, arrival order) and returns
//    their results concatenated row-wise: [total images, row_size]. The batcher splits the rows
//    back per request; a run-function error goes to every request of the batch.
//
// Example (Engine wires it to ClassifierModel::Classify):
//   auto batcher = DynamicBatcher::Create(
//       options,
//       [model](const BatchInput& in) {
//         return model->Classify(in.ConcatenatedInput(), in.num_images(), in.resolution().height,
//                               in.resolution().width);
//       },
//       RealClock::Get());
//   BatchRequest request{.resolution = {224, 224}, .batch = 1, .input = std::move(pixels),
//                        .done = [](absl::StatusOr<std::vector<float>> logits) { ... }};
//   absl::Status accepted = (*batcher)->Submit(std::move(request));
//
// Thread-safety: every public method may be called from any thread. The run function, observer
// callbacks and `done` are called without the batcher's lock held, so they may call back into it
// (Submit, stats), though not Shutdown() or the destructor, which wait for them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "service/engine/batch_policy.h"
#include "service/engine/clock.h"

namespace tost::service {

// What a request's `done` receives: its own rows, [batch, row_size] row-major (e.g. logits).
using BatchRowsCallback = absl::AnyInvocable<void(absl::StatusOr<std::vector<float>>) &&>;

struct BatchRequest {
  ImageResolution resolution;  // height × width; only equal resolutions share a batch
  int64_t batch = 1;           // images in this request; never split across batches
  // [batch, ...] row-major (e.g. preprocessed float32 [batch, C, H, W]). The batcher never reads
  // it; the run function does.
  std::vector<float> input;
  // InfiniteFuture: DynamicBatcherOptions::timeout_us after acceptance (or none if that is 0).
  absl::Time deadline = absl::InfiniteFuture();
  BatchRowsCallback done;  // called exactly once iff Submit() returned OK
};

// One closed batch, as the run function sees it. Valid only during the call.
class BatchInput {
 public:
  BatchInput(ImageResolution resolution, std::vector<const BatchRequest*> requests);

  ImageResolution resolution() const { return resolution_; }
  int64_t num_images() const { return num_images_; }
  // Arrival order; the run function's rows must follow it.
  const std::vector<const BatchRequest*>& requests() const { return requests_; }
  // The requests' inputs concatenated in order: the [num_images, ...] tensor a model takes.
  std::vector<float> ConcatenatedInput() const;

 private:
  ImageResolution resolution_;
  std::vector<const BatchRequest*> requests_;
  int64_t num_images_ = 0;
};

// Returns [num_images, row_size] floats for the whole batch, or an error for all of its requests.
// Called on the batcher's worker thread, one batch at a time.
using RunBatchFn = absl::AnyInvocable<absl::StatusOr<std::vector<float>>(const BatchInput&)>;

// Observability record of one batch (the metrics issue exports these).
struct BatchRecord {
  std::string_view model_name;
  ImageResolution resolution;
  int64_t images = 0;    // batch size in images
  int64_t requests = 0;  // requests in the batch
  BatchCloseReason close_reason = BatchCloseReason::kNone;
  absl::Duration queue_delay;   // the oldest request's wait, from acceptance to the batch starting
  absl::Duration compute_time;  // the run function's duration
  absl::StatusCode code = absl::StatusCode::kOk;  // of the run (or of splitting its result)
};

enum class BatchDropReason {
  kQueueFull,         // refused at Submit/Reserve with RESOURCE_EXHAUSTED
  kDeadlineExceeded,  // expired before it could run (or already expired at Submit)
  kShutdown,          // refused after Shutdown began, or failed by Shutdown(kFailQueued)
};

// Called from the worker thread and from submitting threads: implementations must be thread-safe.
class BatchObserver {
 public:
  virtual ~BatchObserver() = default;
  virtual void OnBatch(const BatchRecord& record) = 0;
  // A request (of `images` images) that was refused or will not run.
  virtual void OnDropped(std::string_view model_name, BatchDropReason reason, int64_t images) {}
};

struct DynamicBatcherOptions {
  // Names the model in every error message and BatchRecord. Required.
  std::string model_name;
  // Images per batch (the model's forward batch). A request with more images is refused.
  int64_t max_batch_images = 8;
  // How long the oldest queued request may wait for its batch to fill, in microseconds. 0 runs
  // every request at once (batching then happens only while a batch is running).
  int64_t max_queue_delay_us = 2'000;
  // Requests (not images) waiting in the queue, reservations included; more are refused with
  // RESOURCE_EXHAUSTED. Running batches do not count.
  int64_t max_queue_size = 64;
  // Default deadline of a request without its own, measured from acceptance, in microseconds;
  // 0 = no default deadline.
  int64_t timeout_us = 10'000'000;
  // false: no worker thread; the owner calls ProcessReady() (tests with FakeClock, or an embedding
  // event loop).
  bool start_worker_thread = true;
  // Not owned; must outlive the batcher. May be null.
  BatchObserver* observer = nullptr;
};

// A snapshot for ServerStatus and tests.
struct DynamicBatcherStats {
  int64_t queued_requests = 0;  // waiting, not yet in a batch
  int64_t queued_images = 0;
  int64_t reserved_requests = 0;  // Reserve()d but not yet submitted
  int64_t batches_run = 0;
  int64_t images_run = 0;
  int64_t rejected_queue_full = 0;
  int64_t expired = 0;          // DEADLINE_EXCEEDED after acceptance
  int64_t failed_shutdown = 0;  // queued requests failed by Shutdown(kFailQueued)
  bool shutting_down = false;
};

enum class ShutdownMode {
  kFinishQueued,  // run what is queued now, without waiting for delays (drain)
  kFailQueued,    // complete queued requests with UNAVAILABLE
};

class DynamicBatcher {
 public:
  // A queue place held by Reserve() for one request. Move-only; dropping it unused gives the place
  // back. Must not outlive its batcher.
  class Reservation {
   public:
    Reservation(Reservation&& other) noexcept : batcher_(std::exchange(other.batcher_, nullptr)) {}
    Reservation& operator=(Reservation&& other) noexcept;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation();

   private:
    friend class DynamicBatcher;
    explicit Reservation(DynamicBatcher* batcher) : batcher_(batcher) {}
    DynamicBatcher* batcher_;
  };

  // INVALID_ARGUMENT for an empty model name, max_batch_images < 1, max_queue_delay_us < 0,
  // max_queue_size < 1, timeout_us < 0, an empty run function. A null clock means RealClock::Get().
  // `clock` is not owned and must outlive the batcher.
  static absl::StatusOr<std::unique_ptr<DynamicBatcher>> Create(
      const DynamicBatcherOptions& options, RunBatchFn run_batch_fn, Clock* clock);

  // Shutdown(kFailQueued) if Shutdown has not been called.
  ~DynamicBatcher();

  DynamicBatcher(const DynamicBatcher&) = delete;
  DynamicBatcher& operator=(const DynamicBatcher&) = delete;

  // Admission only: validates `batch` and takes a queue place, so a caller can refuse before
  // decoding. Errors as Submit's.
  absl::StatusOr<Reservation> Reserve(int64_t batch);

  // Queues `request` (see the contract above). The second form uses a place taken by Reserve().
  absl::Status Submit(BatchRequest request);
  absl::Status Submit(Reservation reservation, BatchRequest request);

  // Submit and block until the result. Not for use without the worker thread (it would never run).
  absl::StatusOr<std::vector<float>> SubmitAndWait(BatchRequest request);

  // Without a worker thread only (FAILED_PRECONDITION otherwise): expires and runs everything ready
  // at the clock's current time, on the calling thread. Returns the number of batches run.
  absl::StatusOr<int> ProcessReady();

  // When the next decision falls due with no new request (InfiniteFuture: queue empty). For tests
  // and for an embedding event loop.
  absl::Time NextWakeTime() const;

  // Stops accepting (UNAVAILABLE), finishes or fails queued requests, then joins the worker thread.
  // Idempotent; later calls wait for the first to finish. With kFinishQueued and no worker thread,
  // the queued batches run on the calling thread.
  void Shutdown(ShutdownMode mode = ShutdownMode::kFinishQueued);

  DynamicBatcherStats stats() const;
  const DynamicBatcherOptions& options() const { return options_; }

 private:
  // Work taken out of the queue under the lock, executed without it.
  struct Work {
    std::vector<BatchRequest> expired;
    std::vector<absl::Time> expired_enqueued;
    std::vector<BatchRequest> batch;
    absl::Time oldest_enqueued;
    BatchCloseReason close_reason = BatchCloseReason::kNone;
    absl::Time wake_at = absl::InfiniteFuture();
    bool empty() const { return expired.empty() && batch.empty(); }
  };

  DynamicBatcher(const DynamicBatcherOptions& options, RunBatchFn run_batch_fn, Clock* clock);

  absl::Status ValidateBatch(int64_t batch) const;
  // The status Submit/Reserve return when the queue has no room (counts the refusal).
  absl::Status QueueFullLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ShuttingDownStatus() const;
  // `reservation`: the place Reserve() took for this request, or null to take one now.
  absl::Status Enqueue(BatchRequest request, Reservation* reservation);
  void ReleaseReservation();
  void NotifyDropped(BatchDropReason reason, int64_t images) const;

  Work TakeWorkLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes expired requests, runs the batch and routes its rows. Without the lock.
  void Execute(Work work) ABSL_LOCKS_EXCLUDED(mu_);
  int DrainReadyOnCallingThread() ABSL_LOCKS_EXCLUDED(mu_);
  void WorkerLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const DynamicBatcherOptions options_;
  const BatchPolicy policy_;
  const absl::Duration timeout_;
  Clock* const clock_;
  RunBatchFn run_batch_fn_;  // only the worker (or the ProcessReady caller) calls it

  mutable absl::Mutex mu_;
  absl::CondVar work_changed_;  // a request arrived, or shutdown began
  // The queue in arrival order, as two parallel vectors so the policy gets a contiguous span.
  std::vector<QueuedRequestInfo> queue_info_ ABSL_GUARDED_BY(mu_);
  std::vector<BatchRequest> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_images_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reserved_requests_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Exponential moving average of the run function's duration, for the retry hint.
  absl::Duration average_compute_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  DynamicBatcherStats counters_ ABSL_GUARDED_BY(mu_);

  // Serialises Shutdown() callers so the thread is joined exactly once.
  absl::Mutex shutdown_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;

  // Declared last: destroyed (after being joined) before the members it reads.
  std::thread worker_;
};

}  // namespace tost::service
