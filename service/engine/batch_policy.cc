#include "service/engine/batch_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tost::service {

std::string ImageResolution::ToString() const { return absl::StrCat(height, "x", width); }

namespace {

// The open batch of one resolution: the arrival-order prefix of its requests that fits.
struct OpenBatch {
  ImageResolution resolution;
  absl::Time oldest_enqueued;  // of its first request: the delay is measured from here
  int64_t images = 0;
  std::vector<size_t> members;
  bool full = false;  // exactly full, or a later request of this resolution did not fit
};

}  // namespace

BatchAction BatchPolicy::NextAction(absl::Time now, absl::Span<const QueuedRequestInfo> queue,
                                    bool flush) const {
  BatchAction action;
  // Few distinct resolutions are queued at once, so a linear search beats a map here.
  std::vector<OpenBatch> open;
  absl::Time earliest_deadline = absl::InfiniteFuture();

  for (size_t i = 0; i < queue.size(); ++i) {
    const QueuedRequestInfo& request = queue[i];
    if (request.deadline <= now) {
      action.expired.push_back(i);
      continue;
    }
    earliest_deadline = std::min(earliest_deadline, request.deadline);

    auto it = std::find_if(open.begin(), open.end(),
                           [&](const OpenBatch& b) { return b.resolution == request.resolution; });
    if (it == open.end()) {
      open.push_back(OpenBatch{request.resolution, request.enqueued, 0, {}, false});
      it = std::prev(open.end());
    }
    OpenBatch& batch = *it;
    if (batch.full) continue;  // waits for a later batch of its resolution
    if (batch.images + request.images > max_batch_images_) {
      // Never split a request and never skip ahead of it: it starts the next batch.
      batch.full = true;
      continue;
    }
    batch.images += request.images;
    batch.members.push_back(i);
    if (batch.images == max_batch_images_) batch.full = true;
  }

  // `open` is ordered by its oldest request's arrival, so the first ready batch is the oldest one.
  absl::Time wake_at = earliest_deadline;
  for (OpenBatch& batch : open) {
    const absl::Time delay_ends = batch.oldest_enqueued + max_queue_delay_;
    BatchCloseReason reason = BatchCloseReason::kNone;
    if (batch.full) {
      reason = BatchCloseReason::kSize;
    } else if (now >= delay_ends) {
      reason = BatchCloseReason::kDelay;
    } else if (flush) {
      reason = BatchCloseReason::kFlush;
    }
    if (reason != BatchCloseReason::kNone) {
      action.batch = std::move(batch.members);
      action.close_reason = reason;
      action.wake_at = now;
      return action;
    }
    wake_at = std::min(wake_at, delay_ends);
  }
  action.wake_at = wake_at;
  return action;
}

}  // namespace tost::service
