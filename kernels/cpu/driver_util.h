// Small helpers shared by the CPU TSSA drivers (tssa_vision_cpu.cc, tssa_causal_cpu.cc).
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <memory>
#include <type_traits>

#include "kernels/cpu/row_kernels.h"

namespace tost::kernels::cpu::detail {

// The ATen dtype of AccType<T>.
template <typename T>
constexpr at::ScalarType kAccScalarType = std::is_same_v<T, double> ? at::kDouble : at::kFloat;

// The row kernels read channel c of a row at row + c: views with a unit channel stride (slices,
// transposed batch/token axes) are read in place, anything else is copied once.
inline at::Tensor WithUnitChannelStride(const at::Tensor& w) {
  return (w.size(-1) <= 1 || w.stride(-1) == 1) ? w : w.contiguous();
}

// Scratch whose every element is written before it is read: no zero-fill pass.
template <typename Acc>
std::unique_ptr<Acc[]> Scratch(int64_t n) {
  return std::make_unique_for_overwrite<Acc[]>(static_cast<size_t>(std::max<int64_t>(n, 1)));
}

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace tost::kernels::cpu::detail
