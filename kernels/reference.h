// ATen reference of the `tost::` operators: plain tensor ops, written to mirror their definition
// line by line (the TSSA operators: docs/model-semantics.md §1.1 and §2.1, autograd-capable; the
// token bitmask: token_bitmask_ops.h). It is the oracle that every fused CPU and CUDA kernel is
// tested against; production code calls tssa_ops.h and token_bitmask_ops.h instead.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace tost::kernels::reference {

// Numerical constants of the official code.
inline constexpr double kNormEps =
    1e-12;  // F.normalize eps (vision: clamps the norm; causal: the squared sum)
inline constexpr double kCountEps = 1e-8;  // added to Σ Π before dividing

at::Tensor tssa(const at::Tensor& w, const at::Tensor& temp);

std::tuple<at::Tensor, at::Tensor> tssa_causal(const at::Tensor& w, const at::Tensor& temp,
                                               const at::Tensor& denom_bias,
                                               const std::optional<at::Tensor>& state,
                                               const std::optional<at::Tensor>& positions);

at::Tensor tssa_step(const at::Tensor& w, const at::Tensor& temp, const at::Tensor& denom_bias,
                     const at::Tensor& positions, at::Tensor& state,
                     const std::optional<at::Tensor>& row_ids = std::nullopt);

// Expands the bitmask to one bit per token ([M, V] of 0/1, as the device sampler once did) and
// fills the clear ones with -infinity, row by row through index_select / index_copy_.
at::Tensor& apply_token_bitmask_(at::Tensor& logits, const at::Tensor& bitmask,
                                 const std::optional<at::Tensor>& rows = std::nullopt);

}  // namespace tost::kernels::reference
