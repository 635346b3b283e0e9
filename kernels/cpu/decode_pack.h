// Packing weights into the layout of the lean decode step's product (decode_kernels.h), and the
// int8 quantisation every int8 product of the model shares.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "kernels/cpu/decode_kernels.h"

namespace tost::kernels::cpu {

// Symmetric per-output-channel int8 of W [out, in]: scale[o] = max_i |W[o, i]| / 127 (at least
// 1e-30, so an all-zero row keeps a finite scale) and values round(W / scale) within ±127: the
// form of CTranslate2's int8 and llama.cpp's q8_0 with one block per row.
struct Int8Rows {
  at::Tensor values;  // int8 [out, in]
  at::Tensor scale;   // float32 [out]
};
Int8Rows QuantiseInt8PerRow(const at::Tensor& weight);

// A packed weight with the tensors its pointers point into.
struct PackedWeights {
  PackedMatrix matrix;
  at::Tensor data;                          // the stored values, padding included
  at::Tensor scale, bias, zero_point_sums;  // as PackedMatrix says; undefined when null
};

// W [out, in] (any floating dtype) and its bias (may be undefined) packed in `type` with input
// groups of `group` (1, or 2 for bfloat16, or 4 for int8: DecodeKernels::input_group). int8
// quantises with QuantiseInt8PerRow.
PackedWeights PackWeights(const at::Tensor& weight, const at::Tensor& bias, PackedType type,
                          int64_t group);

}  // namespace tost::kernels::cpu
