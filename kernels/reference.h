// ATen reference of the three TSSA operators: plain tensor ops, autograd-capable, written to
// mirror docs/model-semantics.md §1.1 and §2.1 line by line. It is the oracle that every fused
// CPU and CUDA kernel is tested against; production code calls tssa_ops.h instead.
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

}  // namespace tost::kernels::reference
