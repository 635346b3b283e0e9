// Work distribution of the CPU TSSA kernels over LibTorch's intra-op threads.
#pragma once

#include <cstdint>
#include <functional>

namespace tost::kernels::cpu {

// Runs task(t) for every t in [0, tasks), each exactly once, on at::get_num_threads() threads
// (inline when called from inside a parallel region or with one thread).
//
// Thread i first takes its own static share (i·tasks/P ... (i+1)·tasks/P), in order or in
// `reverse` order, so that successive passes over the same tasks give a thread the data it
// touched last time; a thread that finishes early then takes the others' unclaimed tasks from the
// far end of their shares. On a machine shared with other processes (or with the server's own
// threads) one thread may get a fraction of a core: a purely static split would make every pass
// wait for it. Tasks must not depend on which thread runs them.
void ParallelTasks(int64_t tasks, bool reverse, const std::function<void(int64_t)>& task);

}  // namespace tost::kernels::cpu
