// Calls jobs' listeners on a thread of its own, for the scheduler's token events.
//
// A stream's listener serialises the token's message and starts its gRPC write, which may send it
// on the calling thread: some 15-25 µs a token. Called on the scheduler's thread, 64 streams'
// listeners took a quarter to a third of an int8 or bf16 step of 64 rows on the CPU, time the next
// step waited for. Here the step only queues the job; this thread wakes its listener while the
// next step computes. A job queued again before its listener ran is woken once: the listener
// takes every event waiting.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tost::service {

class GenerationJob;

class ListenerDelivery {
 public:
  // `thread_name`: the delivery thread's (base/thread_name.h).
  explicit ListenerDelivery(std::string thread_name);
  // Wakes what is still queued, then joins the thread.
  ~ListenerDelivery();
  ListenerDelivery(const ListenerDelivery&) = delete;
  ListenerDelivery& operator=(const ListenerDelivery&) = delete;

  // Wakes `job`'s listener on the delivery thread, unless a wake of it is already queued.
  void Queue(const std::shared_ptr<GenerationJob>& job);

 private:
  void Run();

  absl::Mutex mu_;
  std::vector<std::shared_ptr<GenerationJob>> queued_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tost::service
