// Launcher of the CUDA token-bitmask kernel (tost::apply_token_bitmask_, contract in
// kernels/token_bitmask_ops.h): plain C++ (no LibTorch types), so the .cu translation unit needs
// nothing but the CUDA toolkit. device_ops.h adapts it to the operator.
//
// Raw pointers to contiguous row-major device memory:
//   logits   [rows, vocab] float32, updated in place
//   bitmask  [masked_rows, words] int32 (words >= ceil(vocab/32); bits and words past vocab unread)
//   row_ids  [masked_rows] int32 or int64 (`row_type`), or null: bitmask row m applies to logits
//            row m. On the device and not checked by the host (that would synchronise): a row id
//            outside [0, rows) is skipped, never an out-of-range access. Distinct ids are the
//            caller's promise (two bitmask rows on one logits row would race, though both write
//            only -infinity).
// Enqueued on `stream`; returns the launch error (cudaGetLastError), never synchronises.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/backend_namespace.h"

namespace tost::kernels::gpu {
TOST_GPU_BACKEND_NAMESPACE_BEGIN

enum class RowIdType : int { kNone = 0, kInt32 = 1, kInt64 = 2 };

struct TokenBitmaskShape {
  int64_t rows = 0;         // of logits
  int64_t vocab = 0;        // logits per row
  int64_t masked_rows = 0;  // of bitmask
  int64_t words = 0;        // per bitmask row
};

// nullptr when the kernel accepts `s`, otherwise why not. masked_rows and vocab may be 0 only where
// the caller returns early: the launcher requires both ≥ 1.
const char* TokenBitmaskUnsupportedReason(const TokenBitmaskShape& s);

cudaError_t LaunchApplyTokenBitmask(const TokenBitmaskShape& s, float* logits,
                                    const int32_t* bitmask, const void* row_ids, RowIdType row_type,
                                    cudaStream_t stream);

TOST_GPU_BACKEND_NAMESPACE_END
}  // namespace tost::kernels::gpu
