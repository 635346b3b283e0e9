#include "model/nets/torch_threads.h"

#include <thread>

#include <ATen/Parallel.h>

namespace tost::model {

void SetTorchThreads(int intra_op_threads) {
  const unsigned cores = std::thread::hardware_concurrency();
  at::set_num_threads(intra_op_threads > 0 ? intra_op_threads
                                           : static_cast<int>(cores == 0 ? 1 : cores));
}

}  // namespace tost::model
