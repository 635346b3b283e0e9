#include "service/api/handler_pool.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/thread_name.h"

namespace tost::service {

HandlerPool::HandlerPool(std::string thread_name, int max_threads, int max_queued,
                         absl::Duration idle_timeout)
    : thread_name_(std::move(thread_name)),
      max_threads_(std::max(1, max_threads)),
      max_queued_(std::max(0, max_queued)),
      idle_timeout_(idle_timeout) {}

HandlerPool::~HandlerPool() {
  std::list<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    mu_.Await(absl::Condition(
        +[](int* running) { return *running == 0; }, &running_));
    threads.swap(exited_);
  }
  for (std::thread& t : threads) t.join();
}

bool HandlerPool::Schedule(std::function<void()> task) {
  JoinExited();
  absl::MutexLock lock(&mu_);
  // A task taken by an idle thread lowers idle_ only when that thread wakes, so count the tasks
  // still queued against the idle threads: every queued task beyond them gets a new thread, or,
  // with every thread started, waits if fewer than max_queued_ already do.
  const int waiting = static_cast<int>(tasks_.size()) - idle_;
  if (running_ >= max_threads_ && waiting >= max_queued_) return false;
  tasks_.push_back(std::move(task));
  if (static_cast<int>(tasks_.size()) > idle_ && running_ < max_threads_) {
    ++running_;
    threads_.emplace_back();
    auto self = std::prev(threads_.end());
    *self = std::thread([this, self] { Work(self); });
  }
  return true;
}

absl::Status HandlerPool::Refusal(std::string_view what) const {
  return absl::ResourceExhaustedError(absl::StrCat(
      absl::string_view(what.data(), what.size()), ": ", max_threads_, " calls are running and ",
      max_queued_, " more are waiting for a thread; retry after 1000 ms"));
}

HandlerPool::Load HandlerPool::load() const {
  absl::MutexLock lock(&mu_);
  // A task an idle thread is about to take still counts as queued until that thread wakes.
  const int queued = static_cast<int>(tasks_.size());
  return {running_ - idle_, queued};
}

int HandlerPool::threads() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

void HandlerPool::JoinExited() {
  std::list<std::thread> exited;
  {
    absl::MutexLock lock(&mu_);
    exited.swap(exited_);
  }
  for (std::thread& t : exited) t.join();  // each has left Work: this returns at once
}

void HandlerPool::Work(std::list<std::thread>::iterator self) {
  NameThisThread(thread_name_);
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      ++idle_;
      const bool woken =
          mu_.AwaitWithTimeout(absl::Condition(
                                   +[](HandlerPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
                                     return !p->tasks_.empty() || p->stopping_;
                                   },
                                   this),
                               idle_timeout_);
      --idle_;
      // Stopping with nothing left to run, or idle for idle_timeout_: the thread exits (its
      // std::thread is joined by the next Schedule or the destructor).
      if (tasks_.empty() && (stopping_ || !woken)) {
        --running_;
        exited_.splice(exited_.end(), threads_, self);
        return;
      }
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace tost::service
