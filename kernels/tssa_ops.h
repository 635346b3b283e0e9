// The three TSSA operators, called through the LibTorch dispatcher (`tost::` namespace).
//
// These functions are what model code calls. They dispatch on the device of `w`: the CPU and CUDA
// kernels registered in register_ops.cc / cuda/ answer under the same names, so model code never
// changes when a faster kernel lands. The ATen reference (reference.h) is the test oracle.
//
// Shapes (B batch, N or T tokens, D = K·p channels, K heads, p head width):
//   tssa        w [B,N,D], temp [K]                                   -> y [B,N,D]
//   tssa_causal w [B,T,D], temp [K], denom_bias [K,Tmax],
//               state [B,2D+K] (optional), positions [B] int64 (optional: zeros)
//                                                                     -> (y [B,T,D], state_out
//                                                                     [B,2D+K])
//   tssa_step   w [B,D], temp [K], denom_bias [K,Tmax], positions [B] int64,
//               state [B,2D+K] updated in place                        -> y [B,D]
//               or, with row_ids [B] int64 (distinct), state is a pool [P,2D+K] and the row at
//               row_ids[b] is sequence b's, read and updated in place; other rows are untouched
//
// The state row of one sequence is float32 [S1 (D) | S2 (D) | S3 (K)]:
//   S1 = Σ w², S2 = Σ Π·w², S3 = Σ Π over the tokens seen so far, channel c of head k at k·p + c.
// `positions[b]` is the absolute position of sequence b's first token in this call; it indexes
// denom_bias, so positions[b] + T must not exceed Tmax.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace tost::kernels {

// Number of float32 entries in one sequence's per-layer state row.
inline int64_t StateWidth(int64_t channels, int64_t heads) { return 2 * channels + heads; }

at::Tensor tssa(const at::Tensor& w, const at::Tensor& temp);

std::tuple<at::Tensor, at::Tensor> tssa_causal(const at::Tensor& w, const at::Tensor& temp,
                                               const at::Tensor& denom_bias,
                                               const std::optional<at::Tensor>& state,
                                               const std::optional<at::Tensor>& positions);

at::Tensor tssa_step(const at::Tensor& w, const at::Tensor& temp, const at::Tensor& denom_bias,
                     const at::Tensor& positions, at::Tensor& state,
                     const std::optional<at::Tensor>& row_ids = std::nullopt);

}  // namespace tost::kernels
