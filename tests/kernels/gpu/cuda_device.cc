// kernel_device.h on a real GPU: the `tost::` operators on CUDA tensors (the dispatcher picks the
// CUDA kernels of kernels/cuda/).
#include <ATen/ATen.h>

#include "kernels/token_bitmask_ops.h"
#include "kernels/tssa_ops.h"
#include "tests/kernels/gpu/kernel_device.h"

namespace tost::kernels::testing {

bool DeviceAvailable() { return at::hasCUDA(); }
std::string DeviceName() { return "CUDA"; }
at::Tensor ToDevice(const at::Tensor& t) { return t.to(at::kCUDA); }
bool OnDevice(const at::Tensor& t) { return t.is_cuda(); }

at::Tensor Tssa(const at::Tensor& w, const at::Tensor& temp) { return tssa(w, temp); }
std::tuple<at::Tensor, at::Tensor> TssaCausal(const at::Tensor& w, const at::Tensor& temp,
                                              const at::Tensor& denom_bias,
                                              const std::optional<at::Tensor>& state,
                                              const std::optional<at::Tensor>& positions) {
  return tssa_causal(w, temp, denom_bias, state, positions);
}
at::Tensor TssaStep(const at::Tensor& w, const at::Tensor& temp, const at::Tensor& denom_bias,
                    const at::Tensor& positions, at::Tensor& state,
                    const std::optional<at::Tensor>& row_ids) {
  return tssa_step(w, temp, denom_bias, positions, state, row_ids);
}
at::Tensor& ApplyTokenBitmask(at::Tensor& logits, const at::Tensor& bitmask,
                              const std::optional<at::Tensor>& rows) {
  return apply_token_bitmask_(logits, bitmask, rows);
}

}  // namespace tost::kernels::testing
