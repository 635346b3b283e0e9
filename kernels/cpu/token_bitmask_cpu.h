// The CPU kernel of tost::apply_token_bitmask_ (contract: kernels/token_bitmask_ops.h; ground
// truth: kernels/reference.cc). register_ops.cc registers it; model code calls the dispatcher.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace tost::kernels::cpu {

at::Tensor& apply_token_bitmask_(at::Tensor& logits, const at::Tensor& bitmask,
                                 const std::optional<at::Tensor>& rows);

}  // namespace tost::kernels::cpu
