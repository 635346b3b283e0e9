// A dense layer y = x·Wᵀ + b, as both ToST models use it, placed on its device once.
//
// On the CPU at float32 the weight is kept transposed, [in, out] and contiguous, and multiplied as
// x·(Wᵀ): LibTorch's CPU BLAS (MKL) repacks a transposed right operand on every call, so the
// [out, in] layout at::linear uses costs 1.1-1.8x more at the row counts of decode steps and small
// batches (measured at C 384: 36 → 21 µs for one row of a 384 → 1152 layer, 657 → 462 µs for 64
// rows of 1536 → 384), and the same from 32 rows up, where both layouts give bit-identical
// products. On a GPU cuBLAS reads either layout at the same speed, and at::linear is used as
// loaded.
//
// On the CPU in reduced precision (device.h CpuProducts) the weight is stored in bf16 or fp16 and
// the activations stay float32: x is cast to the weight's dtype for the product only, and the
// result (rounded to the weight's dtype where the product writes that dtype) comes back as
// float32 with the float32 bias added. bf16 weights are held in oneDNN's packed layout, packed
// once here: at::linear on plain bf16 weights reorders them on every call, which made one row of
// a 384 → 1152 layer 52 µs against 31-40 µs packed (fp32: 34-43 µs) and 64 rows 294 µs against
// 270-296 µs (fp32: 609-714 µs). fp16 products have no oneDNN kernel without avx512_fp16, and
// LibTorch's fp16 matrix product is 5x slower than fp32 from 8 rows up (3258 µs for 64 rows of
// 384 → 1152): one or two rows use its fp16 matrix-vector kernel, more rows widen the weight to
// float32 for the product.
//
// At int8 (CpuProducts::kInt8) the weight is quantised here from float32: symmetric, one float32
// scale per output channel (absmax/127, the form of CTranslate2's int8 and llama.cpp's q8_0 with
// a whole row as the block). Measured for one row / 64 rows of a 384 → 1152 layer on one core
// (AMD EPYC, avx512_bf16 + VNNI): fp32 45 / 644 µs, bf16 packed 45 / 291 µs;
// at::_weight_int8pack_mm 27 / 861 µs with bf16 activations but 373 / 26 371 µs with float32
// ones (no vectorised kernel), so activations go in as bf16; dequantising to float32 per call
// 121 / 2129 µs. _weight_int8pack_mm reads the int8 weight as stored and wins up to 8 rows
// (111 µs against 158 widened); from 16 rows up widening the int8 weight to bf16 for a oneDNN
// product wins (192 against 212 at 16 rows, 435-584 against 861 at 64). Both products write
// bf16 (like the bf16 path's); the scale is applied after, in float32, with the bias: a bf16
// scale inside the product rounds each channel's scale by up to 0.2 %, which raised the
// product's error against the dequantised weight from 0.25 % to 0.42 % of the largest output.
// fbgemm's dynamic int8 linear was faster still (21 / 171 µs) but quantises the activations too;
// this path keeps them at bf16's precision. Where the kernels run below AVX-512 (an AVX2 CPU, or
// ATEN_CPU_CAPABILITY=avx2), LibTorch has no fast bf16 product (oneDNN's needs AVX-512), and the
// many-row int8 products widen the weight to float32 for MKL instead, with the activations as
// they are (float32); bench LM on one core, one 128-token prefill chunk, forced AVX2 on a
// Sapphire Rapids Xeon with oneDNN and MKL capped to AVX2 too: docs/kernels.md has the figures.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_weight_int8pack_mm.h>
#include <ATen/ops/add.h>
#include <ATen/ops/addcmul.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>

#include "kernels/cpu/decode_pack.h"
#include "kernels/cpu/isa.h"
#include "model/config/device.h"

namespace tost::model {

namespace onednn {

// LibTorch's registered oneDNN ops (the ones its CPU inductor uses for frozen bf16 linears).
inline at::Tensor PackLinearWeight(const at::Tensor& weight) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mkldnn::_reorder_linear_weight", "")
                             .typed<at::Tensor(const at::Tensor&, std::optional<int64_t>)>();
  return op.call(weight, std::nullopt);
}

inline at::Tensor PackedLinear(const at::Tensor& x, const at::Tensor& packed) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            c10::string_view, c10::List<std::optional<at::Scalar>>,
                            std::optional<c10::string_view>)>();
  return op.call(x, packed, std::nullopt, "none", c10::List<std::optional<at::Scalar>>(),
                 std::nullopt);
}

}  // namespace onednn

class Linear {
 public:
  Linear() = default;
  // weight [out, in]; bias [out] or undefined (a layer without bias).
  Linear(at::Tensor weight, at::Tensor bias) : weight_(std::move(weight)), bias_(std::move(bias)) {}

  // Moves the layer to `device` with its weight in `dtype`. On a CUDA device the bias is in
  // `dtype` too and `products` is not read; on the CPU the bias stays float32 and `products` says
  // how a reduced-precision weight is stored and multiplied.
  void Place(const at::Device& device, at::ScalarType dtype,
             CpuProducts products = CpuProducts::kFloat32) {
    out_features_ = weight_.size(0);
    in_features_ = weight_.size(1);
    dtype_ = dtype;
    if (device.is_cpu() && dtype == at::kFloat) products = CpuProducts::kFloat32;
    mode_ = device.is_cpu() ? products : CpuProducts::kFloat32;
    cuda_ = !device.is_cpu();
    if (mode_ == CpuProducts::kInt8) {
      // The lean decode step packs the same int8 values, so both paths multiply by them.
      kernels::cpu::Int8Rows q = kernels::cpu::QuantiseInt8PerRow(weight_.to(device));
      scale_ = std::move(q.scale);
      weight_ = std::move(q.values);
      ones_ = at::ones({out_features_}, at::TensorOptions(at::kBFloat16));
      int8_widen_to_fp32_ = kernels::cpu::ActiveCpuIsa() != kernels::cpu::CpuIsa::kAvx512;
      if (bias_.defined()) bias_ = bias_.to(device, at::kFloat).contiguous();
      return;
    }
    weight_ = weight_.to(device, dtype);
    if (cuda_) {
      weight_ = weight_.contiguous();
    } else if (mode_ == CpuProducts::kFloat32) {
      weight_ = weight_.t().contiguous();
    } else if (mode_ == CpuProducts::kOneDnnBf16) {
      weight_ = onednn::PackLinearWeight(weight_.contiguous());
    } else {
      weight_ = weight_.contiguous();
    }
    if (bias_.defined()) bias_ = bias_.to(device, cuda_ ? dtype : at::kFloat).contiguous();
  }

  at::Tensor operator()(const at::Tensor& x) const {
    if (cuda_) return at::linear(x, weight_, bias_);
    switch (mode_) {
      case CpuProducts::kFloat32: {
        at::Tensor y = at::matmul(x, weight_);
        return bias_.defined() ? y.add_(bias_) : y;
      }
      case CpuProducts::kOneDnnBf16: {
        at::Tensor y = onednn::PackedLinear(x.to(dtype_).reshape({-1, in_features_}), weight_);
        return Finish(y).view(OutShape(x));
      }
      case CpuProducts::kHalfGemv:
        if (x.numel() / in_features_ <= kHalfGemvRows) {
          return Finish(at::linear(x.to(dtype_), weight_));
        }
        [[fallthrough]];
      case CpuProducts::kWiden:
        return at::linear(x, weight_.to(at::kFloat), bias_);
      case CpuProducts::kInt8: {
        const int64_t rows = x.numel() / in_features_;
        at::Tensor y;
        if (int8_widen_to_fp32_ && rows > kInt8PackRows) {
          y = at::linear(x.reshape({-1, in_features_}), weight_.to(at::kFloat));
        } else {
          const at::Tensor xb = x.to(at::kBFloat16).reshape({-1, in_features_});
          y = rows <= kInt8PackRows ? at::_weight_int8pack_mm(xb, weight_, ones_)
                                    : at::linear(xb, weight_.to(at::kBFloat16));
        }
        // y·scale (+ bias) in float32: one fused promoting op.
        return (bias_.defined() ? at::addcmul(bias_, y, scale_) : y.to(at::kFloat).mul_(scale_))
            .view(OutShape(x));
      }
    }
    return at::Tensor();
  }

  // The bytes of the weight (with its scales at int8) and bias as stored.
  int64_t nbytes() const {
    return static_cast<int64_t>(weight_.nbytes() + (scale_.defined() ? scale_.nbytes() : 0) +
                                (bias_.defined() ? bias_.nbytes() : 0));
  }
  // The weight's dtype as stored.
  at::ScalarType weight_dtype() const { return weight_.scalar_type(); }
  // The weight [out, in] and bias (maybe undefined) as constructed: valid until Place, which
  // replaces them by their placed forms.
  const at::Tensor& loaded_weight() const { return weight_; }
  const at::Tensor& loaded_bias() const { return bias_; }

 private:
  static constexpr int64_t kHalfGemvRows = 2;
  static constexpr int64_t kInt8PackRows = 8;

  // A reduced-precision product → float32, with the float32 bias (one promoting add).
  at::Tensor Finish(const at::Tensor& y) const {
    return bias_.defined() ? at::add(y, bias_) : y.to(at::kFloat);
  }
  c10::DimVector OutShape(const at::Tensor& x) const {
    c10::DimVector shape(x.sizes().begin(), x.sizes().end());
    shape.back() = out_features_;
    return shape;
  }

  // [out, in]; [in, out] at CPU fp32; oneDNN-packed at CPU bf16; int8 [out, in] at CPU int8.
  at::Tensor weight_;
  at::Tensor bias_;
  at::Tensor scale_;  // int8: float32 [out], one per output channel
  at::Tensor ones_;   // int8: the unit bf16 scales _weight_int8pack_mm takes (scale_ applies after)
  at::ScalarType dtype_ = at::kFloat;
  CpuProducts mode_ = CpuProducts::kFloat32;
  bool cuda_ = false;
  // int8 on a CPU whose kernels run below AVX-512: many rows widen the weight to float32.
  bool int8_widen_to_fp32_ = false;
  int64_t out_features_ = 0, in_features_ = 0;
};

}  // namespace tost::model
