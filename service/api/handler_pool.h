// Threads for unary handlers served on gRPC's callback API. A handler may block (Classify waits for
// its batch, ModelInfer likewise), so it must not run on gRPC's few callback threads, where one
// waiting call would hold up every stream. Like gRPC's synchronous server, the pool gives every
// call a thread at once: it starts one more whenever none is idle (up to `max_threads`; past that,
// calls wait in order), and keeps the threads it started. Unlike the synchronous server (Debian's
// gRPC 1.51), it does not stall: that server held unary calls ~100 ms every 1.1 s, whatever the
// load (README, Performance).
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tost::service {

class HandlerPool {
 public:
  explicit HandlerPool(int max_threads);
  // Runs every task already scheduled, then joins the threads.
  ~HandlerPool();
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;

  void Schedule(std::function<void()> task);

  int threads() const;

 private:
  void Work();

  const int max_threads_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tost::service
