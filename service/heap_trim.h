// Gives the heap memory the process has freed back to the kernel. glibc's malloc keeps what it
// freed inside its arenas (only the very top of an arena shrinks by itself), so a burst of
// short-lived allocations spread over gRPC's threads, such as an HTTP/2 rapid-reset flood (every
// reset stream still costs gRPC a call until it is finished), left the resident size at its peak
// long after the burst. Every `interval`, when more than `min_free_bytes` sit free in the arenas,
// malloc_trim returns the pages of the free chunks: a walk over them that holds each arena's lock
// in turn (12-58 ms for 110-360 MiB returned after a flood on two cores; the log line of such a
// trim says how long it took). A trim that returns less than `min_free_bytes` (the free chunks'
// pages were gone already) doubles the wait before the next one, up to 16 intervals.
#pragma once

#include <cstdint>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace tost::service {

class HeapTrimmer {
 public:
  // `interval` <= 0: never (no thread).
  HeapTrimmer(absl::Duration interval, int64_t min_free_bytes = int64_t{64} << 20);
  ~HeapTrimmer();
  HeapTrimmer(const HeapTrimmer&) = delete;
  HeapTrimmer& operator=(const HeapTrimmer&) = delete;

  // One check, and a trim when due.
  void Check();

 private:
  const int64_t min_free_bytes_;
  int backoff_ = 1;  // intervals between trims: 1, doubled after each trim that returned little
  int skip_ = 0;     // checks left to skip
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace tost::service
