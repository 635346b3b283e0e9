#include "service/engine/constraint_masker.h"

#include <sched.h>

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "base/thread_name.h"

namespace tost::service {

namespace {

// The CPUs this process may run on (its affinity), at least 1.
int AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

}  // namespace

ConstraintMasker::ConstraintMasker(int threads, int cpus)
    : threads_(std::clamp(threads, 0, (cpus < 0 ? AllowedCpus() : std::max(cpus, 1)) - 1)) {}

ConstraintMasker::~ConstraintMasker() {
  Finish();
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& worker : workers_) worker.join();
}

void ConstraintMasker::Start(std::vector<Task> tasks) {
  Finish();
  last_compute_ = absl::ZeroDuration();
  last_wait_ = absl::ZeroDuration();
  if (tasks.empty()) return;
  if (workers_.empty()) {
    for (int i = 0; i < threads_; ++i) workers_.emplace_back([this] { Work(); });
  }
  absl::MutexLock lock(&mu_);
  tasks_ = std::move(tasks);
  next_ = 0;
  done_ = 0;
  compute_ = absl::ZeroDuration();
}

bool ConstraintMasker::RunOne() {
  Task task;
  {
    absl::MutexLock lock(&mu_);
    if (next_ >= tasks_.size()) return false;
    task = tasks_[next_++];
  }
  // Wall time of this row's mask (absl::Now: a metric of real work, not of the scheduler's
  // injected clock).
  const absl::Time start = absl::Now();
  task.constraint->FillAllowed(task.words);
  const absl::Duration took = absl::Now() - start;
  absl::MutexLock lock(&mu_);
  compute_ += took;
  ++done_;
  return true;
}

void ConstraintMasker::Work() {
  NameThisThread("constraint-mask");
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ConstraintMasker* m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(m->mu_) {
            return m->stop_ || m->next_ < m->tasks_.size();
          },
          this));
      if (stop_) return;
    }
    while (RunOne()) {
    }
  }
}

void ConstraintMasker::Finish() {
  {
    absl::MutexLock lock(&mu_);
    if (tasks_.empty()) return;
  }
  const absl::Time start = absl::Now();
  while (RunOne()) {
  }
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](ConstraintMasker* m)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(m->mu_) { return m->done_ == m->tasks_.size(); },
      this));
  last_wait_ = absl::Now() - start;
  last_compute_ = compute_;
  tasks_.clear();
  next_ = 0;
  done_ = 0;
}

}  // namespace tost::service
