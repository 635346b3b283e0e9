// The token-bitmask operator of constrained sampling, called through the LibTorch dispatcher
// (`tost::apply_token_bitmask_`): the CPU kernel (kernels/cpu/token_bitmask_cpu.cc) or the CUDA
// kernel (kernels/cuda/token_bitmask_kernels.cu) answers, by the device of `logits`. The ATen
// reference (reference.h) is the test oracle.
//
//   logits   [R, V] float32, contiguous; updated in place and returned
//   bitmask  [M, W] int32, W >= ceil(V/32): bit i of word i/32 of bitmask row m set = token i
//            allowed in the logits row bitmask row m applies to; bits and words past V ignored
//   rows     [M] int32 or int64 (optional): the logits row of each bitmask row, distinct, so rows
//            without a constraint need no words; absent, bitmask row m applies to logits row m
//            (M = R)
//
// Every token whose bit is clear becomes -infinity; every other logit, and every row no bitmask
// row names, is left as it was (never read). Rows on the host are checked (in range, distinct);
// rows already on the logits' device are not (a host read would synchronise): the device kernel
// skips a bitmask row whose row is outside [0, R), touching nothing.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace tost::kernels {

at::Tensor& apply_token_bitmask_(at::Tensor& logits, const at::Tensor& bitmask,
                                 const std::optional<at::Tensor>& rows = std::nullopt);

}  // namespace tost::kernels
