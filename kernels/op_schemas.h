// Schemas of the TSSA operators, without the namespace: register_ops.cc defines them as `tost::`,
// and the emulated CUDA build (tests/kernels/emulator) defines the same schemas under its own
// test namespace, so both are called with the same arguments.
#pragma once

namespace tost::kernels::schemas {

inline constexpr const char* kTssa = "tssa(Tensor w, Tensor temp) -> Tensor";
inline constexpr const char* kTssaCausal =
    "tssa_causal(Tensor w, Tensor temp, Tensor denom_bias, Tensor? state=None, Tensor? "
    "positions=None) -> (Tensor, Tensor)";
inline constexpr const char* kTssaStep =
    "tssa_step(Tensor w, Tensor temp, Tensor denom_bias, Tensor positions, Tensor(a!) state, "
    "Tensor? row_ids=None) -> Tensor";

}  // namespace tost::kernels::schemas
