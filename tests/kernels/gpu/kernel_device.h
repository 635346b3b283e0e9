// The device the CUDA kernel test cases (tssa_cuda_test.cc, token_bitmask_cuda_test.cc) run on. Two
// implementations: a real GPU through the `tost::` operators (cuda_device.cc, binary
// tost_gpu_tests) and the SIMT emulator through its CPU test operators
// (tests/kernels/emulator/emulated_device.cc, binary tost_emulated_kernel_tests), so every case
// runs in every CI build, not only where a GPU is.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>

namespace tost::kernels::testing {

// False where the device is missing: the cases skip (visibly).
bool DeviceAvailable();
std::string DeviceName();
// A copy of t on the device (its own storage: the operators may update state in place).
at::Tensor ToDevice(const at::Tensor& t);
bool OnDevice(const at::Tensor& t);

at::Tensor Tssa(const at::Tensor& w, const at::Tensor& temp);
std::tuple<at::Tensor, at::Tensor> TssaCausal(const at::Tensor& w, const at::Tensor& temp,
                                              const at::Tensor& denom_bias,
                                              const std::optional<at::Tensor>& state,
                                              const std::optional<at::Tensor>& positions);
at::Tensor TssaStep(const at::Tensor& w, const at::Tensor& temp, const at::Tensor& denom_bias,
                    const at::Tensor& positions, at::Tensor& state,
                    const std::optional<at::Tensor>& row_ids = std::nullopt);
at::Tensor& ApplyTokenBitmask(at::Tensor& logits, const at::Tensor& bitmask,
                              const std::optional<at::Tensor>& rows = std::nullopt);

}  // namespace tost::kernels::testing
