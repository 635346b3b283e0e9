// Schemas of the `tost::` operators, without the namespace: register_ops.cc defines them as
// `tost::`, and the emulated CUDA build (tests/kernels/emulator) defines the same schemas under its
// own test namespace, so both are called with the same arguments.
#pragma once

namespace tost::kernels::schemas {

inline constexpr const char* kTssa = "tssa(Tensor w, Tensor temp) -> Tensor";
inline constexpr const char* kTssaCausal =
    "tssa_causal(Tensor w, Tensor temp, Tensor denom_bias, Tensor? state=None, Tensor? "
    "positions=None) -> (Tensor, Tensor)";
inline constexpr const char* kTssaStep =
    "tssa_step(Tensor w, Tensor temp, Tensor denom_bias, Tensor positions, Tensor(a!) state, "
    "Tensor? row_ids=None) -> Tensor";
// Constrained sampling: logits updated in place (kernels/token_bitmask_ops.h).
inline constexpr const char* kApplyTokenBitmask =
    "apply_token_bitmask_(Tensor(a!) logits, Tensor bitmask, Tensor? rows=None) -> Tensor(a!)";

}  // namespace tost::kernels::schemas
