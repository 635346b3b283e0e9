#include "kernels/cpu/parallel.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <memory>

namespace tost::kernels::cpu {

void ParallelTasks(int64_t tasks, bool reverse, const std::function<void(int64_t)>& task) {
  if (tasks <= 0) return;
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), tasks);
  if (threads <= 1 || at::in_parallel_region()) {
    for (int64_t i = 0; i < tasks; ++i) task(reverse ? tasks - 1 - i : i);
    return;
  }
  const auto claimed = std::make_unique<std::atomic<bool>[]>(static_cast<size_t>(tasks));
  const auto run = [&](int64_t t) {
    if (!claimed[t].exchange(true, std::memory_order_relaxed)) task(t);
  };
  const auto first = [&](int64_t share) { return share * tasks / threads; };
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t n = first(i + 1) - first(i);
      for (int64_t k = 0; k < n; ++k) run(reverse ? first(i + 1) - 1 - k : first(i) + k);
    }
    for (int64_t j = 1; j < threads; ++j) {
      const int64_t v = (end - 1 + j) % threads;  // the other shares, from their far end
      const int64_t n = first(v + 1) - first(v);
      for (int64_t k = 0; k < n; ++k) run(reverse ? first(v) + k : first(v + 1) - 1 - k);
    }
  });
}

}  // namespace tost::kernels::cpu
