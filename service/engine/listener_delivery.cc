#include "service/engine/listener_delivery.h"

#include <utility>

#include "base/thread_name.h"
#include "service/engine/generation_job.h"

namespace tost::service {

ListenerDelivery::ListenerDelivery(std::string thread_name) {
  thread_ = std::thread([this, thread_name = std::move(thread_name)] {
    NameThisThread(thread_name);
    Run();
  });
}

ListenerDelivery::~ListenerDelivery() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void ListenerDelivery::Queue(const std::shared_ptr<GenerationJob>& job) {
  if (job->wake_queued_.exchange(true, std::memory_order_acq_rel)) return;
  absl::MutexLock lock(&mu_);
  queued_.push_back(job);
}

void ListenerDelivery::Run() {
  std::vector<std::shared_ptr<GenerationJob>> batch;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !queued_.empty() || stopping_; };
      mu_.Await(absl::Condition(&ready));
      if (queued_.empty()) return;  // stopping, and nothing left to wake
      batch.swap(queued_);
    }
    for (const std::shared_ptr<GenerationJob>& job : batch) {
      // Cleared first: an event published while the listener runs queues the job again.
      job->wake_queued_.store(false, std::memory_order_release);
      job->WakeListener();
    }
    batch.clear();
  }
}

}  // namespace tost::service
