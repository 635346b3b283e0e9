#include "service/api/handler_pool.h"

#include <algorithm>
#include <utility>

namespace tost::service {

HandlerPool::HandlerPool(int max_threads) : max_threads_(std::max(1, max_threads)) {}

HandlerPool::~HandlerPool() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

void HandlerPool::Schedule(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
  // A task taken by an idle thread lowers idle_ only when that thread wakes, so count the tasks
  // still queued against the idle threads: every queued task beyond them gets a new thread.
  if (static_cast<int>(tasks_.size()) > idle_ && static_cast<int>(threads_.size()) < max_threads_) {
    threads_.emplace_back([this] { Work(); });
  }
}

int HandlerPool::threads() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(threads_.size());
}

void HandlerPool::Work() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      ++idle_;
      mu_.Await(absl::Condition(
          +[](HandlerPool* p)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return !p->tasks_.empty() || p->stopping_; },
          this));
      --idle_;
      if (tasks_.empty()) return;  // stopping, and nothing left to run
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace tost::service
