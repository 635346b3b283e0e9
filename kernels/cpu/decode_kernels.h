// Vectorised kernels of the lean CPU decode step (model/nets/lean_decoder.h), one table per
// instruction set, built like the TSSA row kernels (row_kernels.h): decode_kernels.cc is compiled
// once per ISA and DecodeKernelsFor (isa.h) picks the table at run time.
//
// A decode step multiplies a few rows of activations by every weight of the model, so it is bound
// by reading the weights. The product here reads each weight once, in the precision it is stored
// in (float32, bfloat16, float16 or int8 with one float32 scale per output channel), widens it to
// float32 in registers and accumulates in float32: fewer bytes than float32 weights, and no
// product output rounded to the weight's precision. The small operators around the products
// (layer norm, GELU, the scaled residual) are plain loops over float32 rows, with no dispatcher,
// allocation or temporary tensor between them.
//
// Every row's result is computed by the same operations in the same order whatever the number of
// rows in the call or the range of panels a thread takes, so a sequence's logits do not depend on
// what shares its step.
#pragma once

#include <cstdint>

namespace tost::kernels::cpu {

// How a packed weight stores its values.
enum class PackedType : uint8_t { kFloat32, kBFloat16, kFloat16, kInt8 };

// Bytes per stored weight value.
inline int64_t PackedTypeBytes(PackedType type) {
  switch (type) {
    case PackedType::kFloat32:
      return 4;
    case PackedType::kBFloat16:
    case PackedType::kFloat16:
      return 2;
    case PackedType::kInt8:
      return 1;
  }
  return 4;
}

// Output channels per panel: one 64-byte line of int8 values per input channel, four AVX-512
// float32 vectors of accumulators per row.
inline constexpr int64_t kPanelWidth = 64;

// A weight W [out, in] packed as panels of kPanelWidth output channels: value (o, i) is element
// ((o / kPanelWidth)·in + i)·kPanelWidth + o % kPanelWidth of `data`, so a panel is one contiguous
// stream read once per call. The last panel is padded with zeros to its full width.
struct PackedMatrix {
  const void* data = nullptr;
  PackedType type = PackedType::kFloat32;
  int64_t in = 0, out = 0;
  // Both padded to panels()·kPanelWidth: int8's one scale per output channel (null otherwise),
  // and the bias (null for a layer without one).
  const float* scale = nullptr;
  const float* bias = nullptr;

  int64_t panels() const { return (out + kPanelWidth - 1) / kPanelWidth; }
};

struct DecodeKernels {
  // y[r, o] = Σ_i x[r, i]·W[o, i] (·scale[o] at int8) (+ bias[o]) for r < rows and the output
  // channels of panels [panel_begin, panel_end); x is float32 [rows, w.in] with rows `ldx` apart,
  // y float32 with rows `ldy` apart (only channels < w.out are written).
  void (*matmul)(const PackedMatrix& w, const float* x, int64_t rows, int64_t ldx,
                 int64_t panel_begin, int64_t panel_end, float* y, int64_t ldy);

  // y = (x − mean(x)) / sqrt(var(x) + eps)·weight (+ bias) for one row of n channels (variance
  // biased, as torch.nn.LayerNorm); bias may be null. y may be x.
  void (*layer_norm)(const float* x, int64_t n, const float* weight, const float* bias, float eps,
                     float* y);

  // x = x·Φ(x) in place (the exact, erf form of GELU, as torch.nn.GELU()).
  void (*gelu)(float* x, int64_t n);

  // x += gamma ⊙ y (the layer-scaled residual), n channels.
  void (*add_scaled)(float* x, const float* gamma, const float* y, int64_t n);
};

// One table per compiled instruction set (defined in decode_kernels.cc, built once per ISA).
const DecodeKernels& DecodeKernelsDefault();
const DecodeKernels& DecodeKernelsAvx2();
const DecodeKernels& DecodeKernelsAvx512();

}  // namespace tost::kernels::cpu
