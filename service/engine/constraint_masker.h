// Computes the token masks of a decode step's constrained rows on worker threads, started before
// the step and finished where its draw needs them (GenerativeModel::Step's before_draw): on a GPU
// the masks are computed while the forward runs; with many constrained rows they are computed in
// parallel (each row's TokenConstraint is its own), whatever the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "service/engine/constraints.h"

namespace tost::service {

class ConstraintMasker {
 public:
  struct Task {
    TokenConstraint* constraint = nullptr;
    absl::Span<uint32_t> words;  // constraint->bitmask_words() of them
  };

  // `threads` workers (0: Finish computes every mask on the caller's thread), started on the
  // first Start with tasks, so a server that never sees a constraint runs none. At most `cpus` - 1
  // of them (`cpus` < 0: the CPUs this process may run on): a worker only helps on a core the
  // step's thread is not using. On one core it would take the core from the forward and add two
  // thread switches per step, so there every mask is computed on the caller's thread: at one
  // int8 stream of the bench LM on one core, 0.50 ms per constrained token instead of 0.52.
  explicit ConstraintMasker(int threads, int cpus = -1);
  // Joins the workers (a Start without its Finish is finished first).
  ~ConstraintMasker();
  ConstraintMasker(const ConstraintMasker&) = delete;
  ConstraintMasker& operator=(const ConstraintMasker&) = delete;

  // Hands `tasks` to the workers. Until Finish returns, the caller must not touch their
  // constraints or words. One batch at a time: a Start after a Start without Finish finishes the
  // first batch.
  void Start(std::vector<Task> tasks);
  // Computes the tasks no worker took yet on this thread, and returns once every task is done.
  // Idempotent (nothing after the first call of a batch).
  void Finish();

  // Of the last finished batch: the time its masks took, summed over tasks, and how long Finish
  // waited for them (the part the step did not hide).
  absl::Duration compute_time() const { return last_compute_; }
  absl::Duration wait_time() const { return last_wait_; }

 private:
  void Work();
  // Takes the next task (false: none left); runs it without the lock.
  bool RunOne() ABSL_LOCKS_EXCLUDED(mu_);

  const int threads_;
  std::vector<std::thread> workers_;  // started by the first Start with tasks
  absl::Duration last_compute_;
  absl::Duration last_wait_;

  absl::Mutex mu_;
  std::vector<Task> tasks_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;  // the first task not taken
  size_t done_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration compute_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tost::service
