// A dense layer y = x·Wᵀ + b, as both ToST models use it, placed on its device once.
//
// On the CPU the weight is kept transposed, [in, out] and contiguous, and multiplied as x·(Wᵀ):
// LibTorch's CPU BLAS (MKL) repacks a transposed right operand on every call, so the [out, in]
// layout at::linear uses costs 1.1-1.8x more at the row counts of decode steps and small batches
// (measured at C 384: 36 → 21 µs for one row of a 384 → 1152 layer, 657 → 462 µs for 64 rows of
// 1536 → 384), and the same from 32 rows up, where both layouts give bit-identical products. On a
// GPU cuBLAS reads either layout at the same speed, and at::linear is used as loaded.
#pragma once

#include <cstdint>
#include <utility>

#include <ATen/core/Tensor.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>

namespace tost::model {

class Linear {
 public:
  Linear() = default;
  // weight [out, in]; bias [out] or undefined (a layer without bias).
  Linear(at::Tensor weight, at::Tensor bias) : weight_(std::move(weight)), bias_(std::move(bias)) {}

  // Moves the layer to `device` in `dtype`, transposed there when that is the CPU.
  void Place(const at::Device& device, at::ScalarType dtype) {
    weight_ = weight_.to(device, dtype);
    transposed_ = device.is_cpu();
    weight_ = transposed_ ? weight_.t().contiguous() : weight_.contiguous();
    if (bias_.defined()) bias_ = bias_.to(device, dtype).contiguous();
  }

  at::Tensor operator()(const at::Tensor& x) const {
    if (!transposed_) return at::linear(x, weight_, bias_);
    at::Tensor y = at::matmul(x, weight_);
    return bias_.defined() ? y.add_(bias_) : y;
  }

  int64_t nbytes() const {
    return static_cast<int64_t>(weight_.nbytes() + (bias_.defined() ? bias_.nbytes() : 0));
  }

 private:
  at::Tensor weight_;  // [out, in], or [in, out] when transposed_
  at::Tensor bias_;
  bool transposed_ = false;
};

}  // namespace tost::model
