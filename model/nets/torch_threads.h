// Sets LibTorch's intra-op thread count for callers that include no LibTorch headers (service/).
#pragma once

namespace tost::model {

// 0 = one thread per available core.
void SetTorchThreads(int intra_op_threads);

}  // namespace tost::model
