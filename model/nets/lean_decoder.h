// The lean CPU decode step of the causal ToST language model: one token for each of a few
// sequences, run as straight-line kernels over float32 rows (kernels/cpu/decode_kernels.h) with
// no LibTorch operator, dispatcher call or temporary tensor inside the step.
//
// Why: a decode step of a small batch reads every weight once and does little arithmetic with it.
// Through LibTorch operators it also pays ~5-10 µs per operator (about 12 per layer), which is most
// of the step of a model as small as tost-austen, and its reduced-precision products cast the
// activations and widen the result around every product. Here each product reads the weights
// packed in their stored precision (float32, bfloat16, float16 or int8 with per-output-channel
// scales) and accumulates in float32 (with AVX-512 BF16/VNNI, bfloat16 and int8 products round
// or quantise each row first, as oneDNN's and CTranslate2's do), and the norms, GELU and
// residuals run in place on buffers that a thread keeps from one step to the next.
//
// Semantics are LanguageModel::Step's (docs/model-semantics.md §2); the TSSA statistics are
// updated by tssa_step's own row kernels, bit for bit. Each row is computed alone by the same
// operations whatever the batch, so a sequence's logits do not depend on what shares its step.
// Results differ from the LibTorch step only by the rounding of the products and norms.
//
// LanguageModel also prefills short chunks through it (a chunk's tokens as rows sharing one state
// row). The packed weights are a second copy beside the ones LibTorch's prefill uses (bytes()
// says how many).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/types/span.h"
#include "kernels/cpu/decode_kernels.h"
#include "kernels/cpu/row_kernels.h"
#include "model/config/config.h"
#include "model/config/device.h"

namespace tost::model {

class LeanDecoder {
 public:
  // One block's parameters: dense weights [out, in] as loaded (any floating dtype; biases may be
  // undefined), the rest as placed on the CPU (float32).
  struct Layer {
    at::Tensor ln1_weight, ln1_bias, ln2_weight, ln2_bias, gamma1, gamma2;
    at::Tensor c_attn_weight, c_attn_bias, c_proj_weight, c_proj_bias;
    at::Tensor c_fc_weight, c_fc_bias, mlp_proj_weight, mlp_proj_bias;
    at::Tensor temp;        // [K]
    at::Tensor denom_bias;  // [K, context_length]
  };
  struct Source {
    std::vector<Layer> layers;
    at::Tensor ln_f_weight, ln_f_bias;
    // The tables as placed (float32, bfloat16 or float16), read in place: wte [vocab, C] gives the
    // fed tokens' rows and, packed, the tied output projection; wpe [context, C].
    at::Tensor wte, wpe;
  };

  // Packs the dense weights in `dtype` (int8: per-output-channel absmax/127 scales) and the output
  // projection in the table's own dtype (bfloat16 at int8, as LanguageModel keeps it).
  static std::unique_ptr<LeanDecoder> Build(const LanguageConfig& config, const Source& source,
                                            ComputeDtype dtype);

  // One step: token b at positions[b] for sequence b, whose layer-l state row (float32 [2C+K]) is
  // state_rows[l·B + b], updated in place, rows in order b = 0, 1, ... (so rows that share a state
  // row are consecutive tokens of one sequence: a prefill). Writes logits [B, vocab] (row-major),
  // or only the last row's [vocab] with `last_row_logits_only`. Callers check the tokens,
  // positions and rows first.
  void Step(absl::Span<const int32_t> tokens, absl::Span<const int64_t> positions,
            absl::Span<float* const> state_rows, float* logits,
            bool last_row_logits_only = false) const;

  // Whether the dense products run on the CPU's dot-product instructions (bfloat16 pairs or int8
  // quads, decode_kernels.h), which round or quantise the rows they multiply.
  bool dot_products() const { return dot_products_; }

  // The bytes of the packed weights this decoder holds beyond the model's own.
  int64_t bytes() const { return bytes_; }

 private:
  struct PackedLayer {
    kernels::cpu::PackedMatrix c_attn, c_proj, c_fc, mlp_proj;
    const float *ln1_weight, *ln1_bias, *ln2_weight, *ln2_bias, *gamma1, *gamma2;
    const float *temp, *denom_bias;
  };
  LeanDecoder() = default;
  kernels::cpu::PackedMatrix Pack(const at::Tensor& weight, const at::Tensor& bias,
                                  kernels::cpu::PackedType type);
  const float* Keep(const at::Tensor& t);  // float32 contiguous, held here; null if undefined
  void MoveToHugePages();
  // y = x·Wᵀ for `rows` rows, the panels shared among the intra-op threads when worth it.
  void Product(const kernels::cpu::PackedMatrix& w, const float* x, int64_t rows, float* y,
               int64_t ldy) const;

  LanguageConfig config_;
  const kernels::cpu::DecodeKernels* kernels_ = nullptr;
  const kernels::cpu::RowKernels<float>* tssa_kernels_ = nullptr;
  std::vector<PackedLayer> layers_;
  const float *ln_f_weight_ = nullptr, *ln_f_bias_ = nullptr;
  kernels::cpu::PackedMatrix lm_head_;
  at::Tensor wte_, wpe_;
  std::vector<at::Tensor> storage_;  // everything the pointers above point into
  std::vector<at::Tensor> pending_;  // packed weights until MoveToHugePages copies them
  int64_t bytes_ = 0;
  bool dot_products_ = false;
};

}  // namespace tost::model
