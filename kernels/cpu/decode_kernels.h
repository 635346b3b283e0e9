// Vectorised kernels of the lean CPU decode step (model/nets/lean_decoder.h), one table per
// instruction set, built like the TSSA row kernels (row_kernels.h): decode_kernels.cc is compiled
// once per ISA and DecodeKernelsFor (isa.h) picks the table at run time.
//
// A decode step multiplies a few rows of activations by every weight of the model, so it is bound
// by reading the weights. The product here reads each weight once, in the precision it is stored
// in (float32, bfloat16, float16 or int8 with one float32 scale per output channel) and
// accumulates in float32 (int32 for int8 quads): fewer bytes than float32 weights, and no product
// output rounded to the weight's precision. Everywhere it widens the weights to float32 in
// registers (int8 ones of many-row calls a tile at a time into float32 on the stack, which the
// rows then share), except on CPUs with AVX-512 BF16 and VNNI, where bfloat16 and int8 weights go
// through the dot-product instructions (rows rounded to bfloat16, or quantised to 8 bits per row)
// at two and four times the multiply-adds per instruction, which many-row steps need. The small
// operators around the products (layer norm, GELU, the scaled residual) are plain loops over
// float32 rows, with no dispatcher, allocation or temporary tensor between them.
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

// A weight W [out, in] packed as panels of kPanelWidth output channels, each panel one contiguous
// stream read once per call. Within a panel the input channels go in groups of `group` (1, 2 or
// 4; `in` is padded with zeros to whole groups), and for each group the panel's kPanelWidth
// channels follow one another, each with its `group` adjacent input values: value (o, i) is
// element ((o / kPanelWidth·groups() + i / group)·kPanelWidth + o % kPanelWidth)·group + i % group
// of `data`. group 1 is the plain layout the widening product reads; 2 (bfloat16) and 4 (int8)
// are the pairs and quads that AVX-512's dot-product instructions (vdpbf16ps, vpdpbusd) multiply
// in one 32-bit lane. The last panel is padded with zeros to its full width.
struct PackedMatrix {
  const void* data = nullptr;
  PackedType type = PackedType::kFloat32;
  int64_t in = 0, out = 0;
  int64_t group = 1;
  // All padded to panels()·kPanelWidth: int8's one scale per output channel (null otherwise), the
  // bias (null for a layer without one), and with int8 quads 128·Σᵢ W[o, i] in int32 (the product
  // of the activations' zero point with the row; null otherwise).
  const float* scale = nullptr;
  const float* bias = nullptr;
  const int32_t* zero_point_sums = nullptr;

  int64_t panels() const { return (out + kPanelWidth - 1) / kPanelWidth; }
  int64_t groups() const { return (in + group - 1) / group; }
  // Values stored, padding included.
  int64_t stored_values() const { return panels() * kPanelWidth * groups() * group; }
};

// Bytes `prepare` writes for `rows` rows of `w` (the rows converted for the dot products, one
// 32-bit word per input group, and a float32 scale per row); 0 when `w` has groups of 1.
inline int64_t PreparedRowsBytes(const PackedMatrix& w, int64_t rows) {
  return w.group == 1 ? 0 : rows * (w.groups() + 1) * 4;
}

struct DecodeKernels {
  // The input group (PackedMatrix::group) `matmul` reads for weights of each PackedType, indexed by
  // the type's value: 1 everywhere but on CPUs with AVX-512 BF16 and VNNI, where bfloat16 weights
  // are read as pairs and int8 as quads.
  int8_t input_group[4];

  // Converts rows of x (float32 [rows, w.in], rows `ldx` apart) into what `matmul` multiplies
  // `w` by, in `prepared` (PreparedRowsBytes(w, rows) bytes): with pairs each row rounded to
  // bfloat16 (to nearest even); with quads each row quantised to 8 bits (scale absmax/127, zero
  // point 128), as CTranslate2's and llama.cpp's int8 products do. Nothing for groups of 1.
  void (*prepare)(const PackedMatrix& w, const float* x, int64_t rows, int64_t ldx, void* prepared);

  // y[r, o] = Σ_i x[r, i]·W[o, i] (·scale[o] at int8) (+ bias[o]) for r < rows and the output
  // channels of panels [panel_begin, panel_end); y float32 with rows `ldy` apart (only channels
  // < w.out are written). Weights packed with groups of 1 are widened to float32 and multiplied
  // by x itself (float32 [rows, w.in], rows `ldx` apart); pairs and quads multiply the rows
  // `prepare` wrote to `prepared` (one preparation serves every panel range), pairs'
  // products accumulating in float32, quads' exactly in int32.
  void (*matmul)(const PackedMatrix& w, const float* x, int64_t rows, int64_t ldx,
                 const void* prepared, int64_t panel_begin, int64_t panel_end, float* y,
                 int64_t ldy);

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
// AVX-512 with the BF16 and VNNI dot products (pairs and quads); only where the CPU has both.
const DecodeKernels& DecodeKernelsAvx512Dot();
// The same tables with the widening product at every row count: at AVX2 and AVX-512 the tables
// above take int8 weights of calls of 4 rows or more through float32 tiles instead (the same
// values bit for bit, faster at many rows). For tests and benchmarks.
const DecodeKernels& DecodeKernelsDefaultWidening();
const DecodeKernels& DecodeKernelsAvx2Widening();
const DecodeKernels& DecodeKernelsAvx512Widening();

}  // namespace tost::kernels::cpu
