#include "service/heap_trim.h"

#include <malloc.h>

#include <algorithm>

#include "absl/time/clock.h"
#include "base/thread_name.h"
#include "service/observability/logging.h"
#include "service/observability/process_memory.h"

namespace tost::service {

HeapTrimmer::HeapTrimmer(absl::Duration interval, int64_t min_free_bytes)
    : min_free_bytes_(min_free_bytes) {
  if (interval <= absl::ZeroDuration()) return;
  thread_ = std::thread([this, interval] {
    NameThisThread("heap-trim");
    while (!stop_.WaitForNotificationWithTimeout(interval)) Check();
  });
}

HeapTrimmer::~HeapTrimmer() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void HeapTrimmer::Check() {
  if (skip_ > 0) {
    --skip_;
    return;
  }
  // fordblks: bytes in free chunks of every arena (mmapped blocks go back when freed anyway).
  // Whether their pages are still resident it does not say (a trim drops the pages and leaves the
  // chunks free; reuse makes them resident again), so a check over the threshold trims, and only
  // a trim that gave back at least the threshold is logged.
  const int64_t free_bytes = static_cast<int64_t>(mallinfo2().fordblks);
  if (free_bytes > min_free_bytes_) {
    const int64_t before = ResidentMemoryBytes();
    const absl::Time start = absl::Now();
    malloc_trim(0);
    const int64_t returned = before - ResidentMemoryBytes();
    if (returned >= min_free_bytes_) {
      Log(LogLevel::kInfo, "returned freed heap memory to the system",
          {{"returned_bytes", returned},
           {"free_heap_bytes", free_bytes},
           {"duration_ms", absl::ToDoubleMilliseconds(absl::Now() - start)}});
      backoff_ = 1;
    } else {
      backoff_ = std::min(2 * backoff_, 16);
      skip_ = backoff_ - 1;
    }
  }
}

}  // namespace tost::service
