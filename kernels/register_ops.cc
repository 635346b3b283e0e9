// Schemas of the `tost::` operators and their CPU implementations (the kernels of kernels/cpu/;
// the ATen reference in reference.cc is the test oracle and is not registered).
//
// One schema per op (op_schemas.h), defined here; every backend registers under the same name (CUDA
// in cuda/cuda_ops.cc), so the dispatcher picks the kernel by the device of the inputs.
#include <torch/library.h>

#include "kernels/cpu/token_bitmask_cpu.h"
#include "kernels/cpu/tssa_cpu.h"
#include "kernels/op_schemas.h"

TORCH_LIBRARY(tost, m) {
  m.def(tost::kernels::schemas::kTssa);
  m.def(tost::kernels::schemas::kTssaCausal);
  m.def(tost::kernels::schemas::kTssaStep);
  m.def(tost::kernels::schemas::kApplyTokenBitmask);
}

TORCH_LIBRARY_IMPL(tost, CPU, m) {
  m.impl("tssa", &tost::kernels::cpu::tssa);
  m.impl("tssa_causal", &tost::kernels::cpu::tssa_causal);
  m.impl("tssa_step", &tost::kernels::cpu::tssa_step);
  m.impl("apply_token_bitmask_", &tost::kernels::cpu::apply_token_bitmask_);
}
