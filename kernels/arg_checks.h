// Argument validation shared by every implementation of the `tost::` operators (reference, fused
// CPU, CUDA), so each op refuses the same inputs with the same message naming the argument, its
// expected shape and what it received. Failures throw c10::Error (TORCH_CHECK); the model layer
// turns them into absl::Status at its one exception boundary.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace tost::kernels {

struct TssaDims {
  int64_t batch = 0;
  int64_t tokens = 0;    // N (vision) or T (causal); 1 for tssa_step
  int64_t channels = 0;  // D
  int64_t heads = 0;     // K
  int64_t head_dim = 0;  // p = D / K
};

TssaDims CheckTssaArgs(const at::Tensor& w, const at::Tensor& temp);

TssaDims CheckCausalArgs(const at::Tensor& w, const at::Tensor& temp, const at::Tensor& denom_bias,
                         const std::optional<at::Tensor>& state,
                         const std::optional<at::Tensor>& positions);

// With `row_ids`, `state` is a pool [P, 2D+K] and row_ids [B] int64 names each sequence's row: on
// the host they are checked to be in [0, P) and distinct; on w's device they are not (a host read
// would synchronise): the device kernels guard the range, and distinctness is the caller's.
TssaDims CheckStepArgs(const at::Tensor& w, const at::Tensor& temp, const at::Tensor& denom_bias,
                       const at::Tensor& positions, const at::Tensor& state,
                       const std::optional<at::Tensor>& row_ids = std::nullopt);

// apply_token_bitmask_ (token_bitmask_ops.h).
struct TokenBitmaskDims {
  int64_t rows = 0;         // R: rows of logits
  int64_t vocab = 0;        // V: logits per row
  int64_t masked_rows = 0;  // M: rows of bitmask (and of rows, when given)
  int64_t words = 0;        // W: words per bitmask row, at least TokenBitmaskWords(V)
};

// 32-bit words that cover `vocab` token ids.
inline int64_t TokenBitmaskWords(int64_t vocab) { return (vocab + 31) / 32; }

// logits [R, V] float32 contiguous; bitmask [M, W >= ceil(V/32)] int32 on logits' device; rows [M]
// int32 or int64 on the host or on logits' device, or absent (then M = R). Host rows are checked
// to be in [0, R) and distinct; rows on a (non-CPU) device are not (a host read would
// synchronise): the device kernel skips a row outside [0, R), and distinctness is the caller's.
TokenBitmaskDims CheckTokenBitmaskArgs(const at::Tensor& logits, const at::Tensor& bitmask,
                                       const std::optional<at::Tensor>& rows);

}  // namespace tost::kernels
