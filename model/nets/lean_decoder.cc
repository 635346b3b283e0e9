#include "model/nets/lean_decoder.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <ATen/ops/from_blob.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include "kernels/cpu/decode_pack.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/tssa_cpu.h"

namespace tost::model {
namespace {

using kernels::cpu::kPanelWidth;
using kernels::cpu::PackedMatrix;
using kernels::cpu::PackedType;

constexpr float kLayerNormEps = 1e-5f;
// Multiply-adds below which a product stays on the calling thread: handing a smaller share to
// another thread costs more in its wake-up than it saves.
constexpr int64_t kMinMacsPerTask = int64_t{1} << 18;

PackedType DenseType(ComputeDtype dtype) {
  switch (dtype) {
    case ComputeDtype::kFloat32:
      return PackedType::kFloat32;
    case ComputeDtype::kBFloat16:
      return PackedType::kBFloat16;
    case ComputeDtype::kFloat16:
      return PackedType::kFloat16;
    case ComputeDtype::kInt8:
      return PackedType::kInt8;
  }
  return PackedType::kFloat32;
}

PackedType TableType(at::ScalarType table) {
  switch (table) {
    case at::kBFloat16:
      return PackedType::kBFloat16;
    case at::kHalf:
      return PackedType::kFloat16;
    case at::kFloat:
      return PackedType::kFloat32;
    default:
      TORCH_CHECK(false, "lean decode: embedding tables in ", table,
                  " (expected float32, bfloat16 or float16)");
  }
}

// out = wte[token] + wpe[position], widened to float32.
template <typename T>
void EmbedRow(const at::Tensor& wte, const at::Tensor& wpe, int64_t token, int64_t position,
              int64_t channels, float* out) {
  const T* a = wte.const_data_ptr<T>() + token * channels;
  const T* b = wpe.const_data_ptr<T>() + position * channels;
  for (int64_t c = 0; c < channels; ++c)
    out[c] = static_cast<float>(a[c]) + static_cast<float>(b[c]);
}

}  // namespace

std::unique_ptr<LeanDecoder> LeanDecoder::Build(const LanguageConfig& config, const Source& source,
                                                ComputeDtype dtype) {
  std::unique_ptr<LeanDecoder> d(new LeanDecoder());
  d->config_ = config;
  const kernels::cpu::CpuIsa isa = kernels::cpu::ActiveCpuIsa();
  d->kernels_ = &kernels::cpu::DecodeKernelsFor(isa);
  d->tssa_kernels_ = &kernels::cpu::KernelsFor<float>(isa);
  const PackedType dense = DenseType(dtype);
  d->dot_products_ = d->kernels_->input_group[static_cast<int>(dense)] > 1;
  for (const Layer& l : source.layers) {
    PackedLayer p{};
    p.c_attn = d->Pack(l.c_attn_weight, l.c_attn_bias, dense);
    p.c_proj = d->Pack(l.c_proj_weight, l.c_proj_bias, dense);
    p.c_fc = d->Pack(l.c_fc_weight, l.c_fc_bias, dense);
    p.mlp_proj = d->Pack(l.mlp_proj_weight, l.mlp_proj_bias, dense);
    p.ln1_weight = d->Keep(l.ln1_weight);
    p.ln1_bias = d->Keep(l.ln1_bias);
    p.ln2_weight = d->Keep(l.ln2_weight);
    p.ln2_bias = d->Keep(l.ln2_bias);
    p.gamma1 = d->Keep(l.gamma1);
    p.gamma2 = d->Keep(l.gamma2);
    p.temp = d->Keep(l.temp);
    p.denom_bias = d->Keep(l.denom_bias);
    d->layers_.push_back(p);
  }
  d->ln_f_weight_ = d->Keep(source.ln_f_weight);
  d->ln_f_bias_ = d->Keep(source.ln_f_bias);
  d->wte_ = source.wte.contiguous();
  d->wpe_ = source.wpe.contiguous();
  TORCH_CHECK(d->wte_.scalar_type() == d->wpe_.scalar_type(),
              "lean decode: wte and wpe differ in dtype");
  d->lm_head_ = d->Pack(d->wte_, at::Tensor(), TableType(d->wte_.scalar_type()));
  d->MoveToHugePages();
  return d;
}

// A step streams every packed weight from memory once: in 4 KiB pages that is one TLB miss per
// page. One arena of transparent huge pages (asked for with madvise, as the kernel's default
// "madvise" mode wants) holds them all instead.
void LeanDecoder::MoveToHugePages() {
  constexpr size_t kHugePage = size_t{2} << 20;
  constexpr size_t kAlign = 64;
  std::vector<PackedMatrix*> matrices;
  for (PackedLayer& l : layers_) {
    for (PackedMatrix* m : {&l.c_attn, &l.c_proj, &l.c_fc, &l.mlp_proj}) matrices.push_back(m);
  }
  matrices.push_back(&lm_head_);
  const auto stored_bytes = [](const PackedMatrix& m) {
    return static_cast<size_t>(m.stored_values() * PackedTypeBytes(m.type));
  };
  size_t total = 0, stored = 0;
  for (const PackedMatrix* m : matrices) {
    total += (stored_bytes(*m) + kAlign - 1) / kAlign * kAlign;
    stored += stored_bytes(*m);
  }
  const size_t size = (total + kHugePage - 1) / kHugePage * kHugePage;
  void* arena = std::aligned_alloc(kHugePage, size);
  if (arena == nullptr) return;  // the packed tensors stay where they are
#if defined(MADV_HUGEPAGE)
  madvise(arena, size, MADV_HUGEPAGE);  // advice: 4 KiB pages where it is not taken
#endif
  size_t offset = 0;
  for (PackedMatrix* m : matrices) {
    auto* dst = static_cast<uint8_t*>(arena) + offset;
    std::memcpy(dst, m->data, stored_bytes(*m));
    m->data = dst;
    offset += (stored_bytes(*m) + kAlign - 1) / kAlign * kAlign;
  }
  pending_.clear();                               // the tensors they were packed into
  bytes_ += static_cast<int64_t>(size - stored);  // the arena's padding (whole huge pages)
  storage_.push_back(at::from_blob(
      arena, {static_cast<int64_t>(size)}, [](void* p) { std::free(p); }, at::kByte));
}

PackedMatrix LeanDecoder::Pack(const at::Tensor& weight, const at::Tensor& bias, PackedType type) {
  kernels::cpu::PackedWeights p =
      kernels::cpu::PackWeights(weight, bias, type, kernels_->input_group[static_cast<int>(type)]);
  for (const at::Tensor* t : {&p.scale, &p.bias, &p.zero_point_sums}) {
    if (!t->defined()) continue;
    bytes_ += static_cast<int64_t>(t->nbytes());
    storage_.push_back(*t);
  }
  bytes_ += static_cast<int64_t>(p.data.nbytes());
  pending_.push_back(p.data);
  return p.matrix;
}

const float* LeanDecoder::Keep(const at::Tensor& t) {
  if (!t.defined()) return nullptr;
  const at::Tensor kept = t.to(at::kFloat).contiguous().view({-1});
  // Placed float32 parameters are shared, not copied: only a conversion costs memory.
  if (kept.const_data_ptr() != t.const_data_ptr()) bytes_ += static_cast<int64_t>(kept.nbytes());
  storage_.push_back(kept);
  return kept.const_data_ptr<float>();
}

void LeanDecoder::Product(const PackedMatrix& w, const float* x, int64_t rows, float* y,
                          int64_t ldy) const {
  const int64_t panels = w.panels();
  const int64_t grain = std::max<int64_t>(1, kMinMacsPerTask / (w.in * kPanelWidth * rows));
  // The rows as the dot products read them, converted once for every panel, into a buffer the
  // calling thread keeps.
  thread_local std::vector<uint32_t> prepared;
  const size_t words = static_cast<size_t>(kernels::cpu::PreparedRowsBytes(w, rows) / 4);
  if (prepared.size() < words) prepared.resize(words);
  kernels_->prepare(w, x, rows, w.in, prepared.data());
  const void* rows_prepared = prepared.data();
  if (panels <= grain) {
    kernels_->matmul(w, x, rows, w.in, rows_prepared, 0, panels, y, ldy);
    return;
  }
  // Panels are independent and each is computed the same way on any thread.
  kernels::cpu::ParallelTasks((panels + grain - 1) / grain, /*reverse=*/false, [&](int64_t t) {
    kernels_->matmul(w, x, rows, w.in, rows_prepared, t * grain, std::min(panels, (t + 1) * grain),
                     y, ldy);
  });
}

void LeanDecoder::Step(absl::Span<const int32_t> tokens, absl::Span<const int64_t> positions,
                       absl::Span<float* const> state_rows, float* logits,
                       bool last_row_logits_only) const {
  const int64_t batch = static_cast<int64_t>(tokens.size());
  const int64_t layers = static_cast<int64_t>(layers_.size());
  TORCH_CHECK(static_cast<int64_t>(positions.size()) == batch &&
                  static_cast<int64_t>(state_rows.size()) == layers * batch,
              "lean decode: ", batch, " tokens, ", positions.size(), " positions and ",
              state_rows.size(), " state rows for ", layers, " layers");
  const int64_t C = config_.n_embd, K = config_.n_head;
  const int64_t D = layers_.front().c_attn.out, hidden = layers_.front().c_fc.out;
  const kernels::cpu::HeadShape shape{D, K, D / K};
  const int64_t tssa_scratch = kernels::cpu::TssaStepRowScratch(shape);

  // A thread's buffers stay with it from one step to the next: no allocation once warm.
  thread_local std::vector<float> work;
  const size_t need = static_cast<size_t>(batch * (3 * C + 2 * D + hidden) + tssa_scratch);
  if (work.size() < need) work.resize(need);
  float* x = work.data();    // [B, C] the residual stream
  float* h = x + batch * C;  // [B, C] a normed copy
  float* p = h + batch * C;  // [B, C] a projection's output
  float* w = p + batch * C;  // [B, D] TSSA's input
  float* y = w + batch * D;  // [B, D] TSSA's output
  float* f = y + batch * D;  // [B, hidden] the MLP's hidden layer
  float* scratch = f + batch * hidden;

  for (int64_t b = 0; b < batch; ++b) {
    switch (wte_.scalar_type()) {
      case at::kBFloat16:
        EmbedRow<c10::BFloat16>(wte_, wpe_, tokens[b], positions[b], C, x + b * C);
        break;
      case at::kHalf:
        EmbedRow<c10::Half>(wte_, wpe_, tokens[b], positions[b], C, x + b * C);
        break;
      default:
        EmbedRow<float>(wte_, wpe_, tokens[b], positions[b], C, x + b * C);
        break;
    }
  }
  const kernels::cpu::DecodeKernels& k = *kernels_;
  for (int64_t l = 0; l < layers; ++l) {
    const PackedLayer& L = layers_[l];
    for (int64_t b = 0; b < batch; ++b) {
      k.layer_norm(x + b * C, C, L.ln1_weight, L.ln1_bias, kLayerNormEps, h + b * C);
    }
    Product(L.c_attn, h, batch, w, D);
    for (int64_t b = 0; b < batch; ++b) {
      kernels::cpu::TssaStepRow(*tssa_kernels_, shape, w + b * D, L.temp, L.denom_bias,
                                config_.context_length, positions[b], state_rows[l * batch + b],
                                y + b * D, scratch);
    }
    Product(L.c_proj, y, batch, p, C);
    for (int64_t b = 0; b < batch; ++b) k.add_scaled(x + b * C, L.gamma1, p + b * C, C);
    for (int64_t b = 0; b < batch; ++b) {
      k.layer_norm(x + b * C, C, L.ln2_weight, L.ln2_bias, kLayerNormEps, h + b * C);
    }
    Product(L.c_fc, h, batch, f, hidden);
    k.gelu(f, batch * hidden);
    Product(L.mlp_proj, f, batch, p, C);
    for (int64_t b = 0; b < batch; ++b) k.add_scaled(x + b * C, L.gamma2, p + b * C, C);
  }
  const int64_t first = last_row_logits_only ? batch - 1 : 0;
  for (int64_t b = first; b < batch; ++b) {
    k.layer_norm(x + b * C, C, ln_f_weight_, ln_f_bias_, kLayerNormEps, h + b * C);
  }
  Product(lm_head_, h + first * C, batch - first, logits, lm_head_.out);
}

}  // namespace tost::model
