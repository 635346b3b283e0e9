// How many rows (sequences in a CPU decode step, tokens in a prefill chunk) the lean CPU step
// (lean_decoder.h) takes before a step goes through LibTorch's matrix products instead, per
// precision and per class of CPU: each limit is where the measured lean / LibTorch time per step
// crosses (lean_row_limits.cc has the figures).
#pragma once

#include <cstdint>

#include "model/config/device.h"

namespace tost::model {

// What of the CPU decides the limits; LanguageModel fills it from CPUID (capped as
// ATEN_CPU_CAPABILITY caps the kernels).
struct LeanCpuClass {
  bool dot_products = false;  // the lean step's AVX-512 BF16/VNNI dot products are in use
  bool avx2 = false;          // the project's kernels run their AVX2 build (no AVX-512)
  bool amx_bf16 = false;      // AMX tiles with bf16, which oneDNN's bf16 products use
};

int64_t LeanMaxRows(ComputeDtype dtype, const LeanCpuClass& cpu);

}  // namespace tost::model
