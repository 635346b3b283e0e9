// Launchers of the CUDA TSSA kernels: plain C++ (no LibTorch types), so the .cu translation units
// need nothing but the CUDA toolkit. cuda_ops.cc adapts them to the `tost::` operators.
//
// Every tensor argument is a raw pointer to contiguous row-major device memory:
//   w, y          [B, N, D] (tssa, tssa_causal) or [B, D] (tssa_step), element type `dtype`
//   temp          [K] float32
//   denom_bias    [K, tmax] float32
//   state         [B, 2D+K] float32 = [S1 | S2 | S3], channel c of head k at k·p + c
//   positions     [B] int64 (absolute position of each sequence's first token in this call), on
//                 the device and not checked by the host (that would synchronise): a sequence
//                 whose tokens fall outside denom_bias gets NaN outputs and state, never an
//                 out-of-range read
// Statistics, Π and every accumulation are float32 whatever the input precision; y is written in
// w's dtype. All work is enqueued on `stream`; a launcher returns the first launch error
// (cudaGetLastError after each kernel) and never synchronises.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/backend_namespace.h"

namespace tost::kernels::gpu {
TOST_GPU_BACKEND_NAMESPACE_BEGIN

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

struct Dims {
  int64_t batch = 0;     // B
  int64_t tokens = 0;    // N or T (1 for tssa_step)
  int64_t channels = 0;  // D = K·p
  int64_t heads = 0;     // K
};

// Limits of the kernels (shared-memory tiles and per-thread register arrays are sized from them).
inline constexpr int64_t kMaxChannels = 8192;
inline constexpr int64_t kMaxHeads = 1024;

// nullptr when the kernels accept `d`, otherwise why not. B, N, D may be 0 only where the caller
// returns early; the launchers require B ≥ 1, tokens ≥ 1 and D ≥ 1.
const char* UnsupportedReason(const Dims& d);

// How the token axis is cut into chunks (one thread block per (chunk, sequence)) and the device
// workspace the launch needs. The chunking depends on the sequence length alone (never on the
// batch or the device), so a sequence's result is the same in any batch; pass the same plan to the
// launcher.
struct Plan {
  int64_t chunk_tokens = 0;
  int64_t chunks = 0;
  size_t workspace_bytes = 0;
};

Plan PlanTssa(const Dims& d);
Plan PlanTssaCausal(const Dims& d);

// Vision TSSA (global statistics over the N tokens): y = −w·Π/(1 + dots).
cudaError_t LaunchTssa(const Dims& d, const Plan& plan, DType dtype, const void* w,
                       const float* temp, void* y, void* workspace, cudaStream_t stream);

// Causal TSSA prefill: y and state_out (S1 unclamped, S2, S3 after the last token). `state_in` and
// `positions` may be null (zeros). state_out must not alias state_in.
cudaError_t LaunchTssaCausal(const Dims& d, const Plan& plan, DType dtype, const void* w,
                             const float* temp, const float* denom_bias, int64_t tmax,
                             const float* state_in, const int64_t* positions, void* y,
                             float* state_out, void* workspace, cudaStream_t stream);

// Causal TSSA decode step (d.tokens must be 1): one token per sequence, updated in place. Without
// `row_ids` (null), `state` is [B, 2D+K] and row b is sequence b's; with them, `state` is a pool of
// `pool_rows` rows and the row at row_ids[b] is sequence b's (distinct; a row id outside [0,
// pool_rows) gets NaN outputs and leaves the pool untouched, never an out-of-range access).
cudaError_t LaunchTssaStep(const Dims& d, DType dtype, const void* w, const float* temp,
                           const float* denom_bias, int64_t tmax, const int64_t* positions,
                           float* state, const int64_t* row_ids, int64_t pool_rows, void* y,
                           cudaStream_t stream);

TOST_GPU_BACKEND_NAMESPACE_END
}  // namespace tost::kernels::gpu
