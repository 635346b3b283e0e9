// The dynamic batcher's decision, as a pure function of (now, queue): which queued requests have
// expired, which requests (if any) form the batch to run now, and otherwise until when nothing can
// change without a new request. No clock, no thread, no lock: the batcher's worker calls it with
// the current time under its lock, and tests call it with any time they like.
//
// Rules:
//  - Only requests of one resolution batch together; they are never padded, because TSSA's
//    statistics are sums over all tokens of an image and padding would change them.
//  - A request is never split across batches.
//  - Per resolution, the open batch is the longest arrival-order prefix of that resolution's
//    requests whose images fit in max_batch_images. It closes on size when it is exactly full or
//    the next request of its resolution would not fit (that request starts the next batch), and on
//    delay when its oldest request has waited max_queue_delay. Once closed it is removed from the
//    queue by the caller and so never reopens.
//  - Several ready batches: the one whose oldest request arrived first runs first.
//  - A request whose deadline is at or before `now` is reported as expired and never batched.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "absl/types/span.h"

namespace tost::service {

// The batching key: height × width in pixels. Channels and layout are fixed per model.
struct ImageResolution {
  int64_t height = 0;
  int64_t width = 0;

  friend bool operator==(const ImageResolution& a, const ImageResolution& b) = default;
  std::string ToString() const;  // "224x224"
};

// What the policy needs to know about one queued request.
struct QueuedRequestInfo {
  int64_t images = 1;  // the request's batch count, 1 <= images <= max_batch_images
  ImageResolution resolution;
  absl::Time enqueued;                           // when the batcher accepted it
  absl::Time deadline = absl::InfiniteFuture();  // expires at or after this instant
};

enum class BatchCloseReason {
  kNone,   // no batch this step
  kSize,   // full, or the next same-resolution request would not fit
  kDelay,  // the oldest request waited max_queue_delay
  kFlush,  // the caller asked to close every open batch now (shutdown drain)
};

struct BatchAction {
  // Indices into the queue, ascending. Expired requests are to be completed with DEADLINE_EXCEEDED.
  std::vector<size_t> expired;
  // Indices into the queue, ascending (= arrival order), all of one resolution; empty if none
  // ready.
  std::vector<size_t> batch;
  BatchCloseReason close_reason = BatchCloseReason::kNone;
  // If `batch` is empty: the earliest instant at which, with no new request, the decision changes
  // (a delay running out or a deadline passing); InfiniteFuture for an empty queue. If `batch` is
  // non-empty: `now` (ask again once the batch has been taken out).
  absl::Time wake_at = absl::InfiniteFuture();
};

class BatchPolicy {
 public:
  // max_batch_images >= 1 images, max_queue_delay >= 0 (the batcher's factory validates both).
  BatchPolicy(int64_t max_batch_images, absl::Duration max_queue_delay)
      : max_batch_images_(max_batch_images), max_queue_delay_(max_queue_delay) {}

  // `queue` is in arrival order. `flush` closes every open batch regardless of size and delay.
  // Deterministic: equal inputs give equal outputs.
  BatchAction NextAction(absl::Time now, absl::Span<const QueuedRequestInfo> queue,
                         bool flush = false) const;

  int64_t max_batch_images() const { return max_batch_images_; }
  absl::Duration max_queue_delay() const { return max_queue_delay_; }

 private:
  int64_t max_batch_images_;
  absl::Duration max_queue_delay_;
};

}  // namespace tost::service
