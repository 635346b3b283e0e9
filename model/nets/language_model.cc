#include "model/nets/language_model.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <optional>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/StreamGuard.h>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cpu/isa.h"
#include "kernels/tssa_ops.h"
#include "model/config/decode_buckets.h"
#include "model/config/tensor_list.h"
#include "model/device/decode_graphs.h"
#include "model/device/device_sampler.h"
#include "model/nets/lean_decoder.h"
#include "model/nets/lean_row_limits.h"
#include "model/nets/linear_layer.h"
#include "model/nets/model_stream.h"
#include "model/nets/torch_boundary.h"
#include "model/nets/torch_device.h"
#include "model/nets/weights.h"

namespace tost::model {
namespace {

constexpr double kLayerNormEps = 1e-5;

struct LayerNorm {
  at::Tensor weight, bias;
  at::Tensor operator()(const at::Tensor& x) const {
    return at::layer_norm(x, {weight.size(0)}, weight, bias, kLayerNormEps);
  }
};

struct Block {
  at::Tensor gamma1, gamma2;
  LayerNorm ln1, ln2;
  Linear c_attn, c_proj, c_fc, mlp_proj;  // without bias when the config has bias=false
  at::Tensor temp;                        // [K]
  at::Tensor denom_bias;                  // [K, context_length]
};

}  // namespace

struct LanguageModel::Impl {
  ModelConfig config;
  at::Device device = at::kCPU;
  std::optional<c10::Stream> stream;  // CUDA: the model's own (model_stream.h)
  bool decode_graphs = false;         // CUDA: replay decode steps from CUDA graphs (Placement)
  bool pad_decode_steps = false;      // decode at bucket sizes (always on CUDA; Placement)
  bool draw_on_device = false;        // StepAndDraw draws where the logits are (CUDA; Placement)
  at::ScalarType dtype = at::kFloat;  // activations (and weights on CUDA); statistics float32
  // The dense weights' and embeddings' dtype: `dtype` on CUDA; on the CPU the Placement's dtype
  // with activations float32 (device.h).
  at::ScalarType weight_dtype = at::kFloat;
  std::unique_ptr<Tokenizer> tokenizer;
  at::Tensor wte, wpe;
  // CPU in reduced precision: the tied output projection as a Linear sharing wte's storage (its
  // product path, below); undefined otherwise (Logits multiplies by wte itself).
  std::optional<Linear> lm_head;
  std::vector<Block> blocks;
  LayerNorm ln_f;
  // CPU: the lean decode step (lean_decoder.h), for steps of at most lean_max_rows sequences (and
  // every batch-invariant one) and prefill chunks of at most as many tokens; null when Placement
  // turns it off.
  std::unique_ptr<LeanDecoder> lean;
  int64_t lean_max_rows = 0;
  // As placed: the weights a decode step reads whole, and the tables it reads one row of per
  // sequence (the position embedding, the TSSA denominators).
  int64_t streamed_weight_bytes = 0;
  int64_t per_position_bytes = 0;

  at::Tensor Mlp(const Block& b, const at::Tensor& x) const {
    return b.mlp_proj(at::gelu(b.c_fc(x)));
  }

  // x: [B,T,C] starting at `positions` [B]; `states` [L][B,W] are read and replaced (may be empty:
  // fresh sequences, states not kept). Returns the final hidden states after ln_f.
  at::Tensor Sequence(at::Tensor x, const at::Tensor& positions,
                      std::vector<at::Tensor>* states) const {
    for (size_t l = 0; l < blocks.size(); ++l) {
      const Block& b = blocks[l];
      const at::Tensor w = b.c_attn(b.ln1(x));
      std::optional<at::Tensor> state_in;
      if (states != nullptr) state_in = (*states)[l];
      auto [y, state_out] = kernels::tssa_causal(w, b.temp, b.denom_bias, state_in, positions);
      if (states != nullptr) (*states)[l] = state_out;
      x = x + b.gamma1 * b.c_proj(y);
      x = x + b.gamma2 * Mlp(b, b.ln2(x));
    }
    return ln_f(x);
  }

  // x: [B,C] at `positions` [B]; states[l] [B,W] updated in place, or with `rows` [B], states[l]
  // is a pool [P,W] whose rows[b] is sequence b's (updated in place, the other rows untouched).
  at::Tensor StepHidden(at::Tensor x, const at::Tensor& positions, std::vector<at::Tensor>& states,
                        const std::optional<at::Tensor>& rows = std::nullopt) const {
    for (size_t l = 0; l < blocks.size(); ++l) {
      const Block& b = blocks[l];
      const at::Tensor w = b.c_attn(b.ln1(x));
      const at::Tensor y = kernels::tssa_step(w, b.temp, b.denom_bias, positions, states[l], rows);
      x = x + b.gamma1 * b.c_proj(y);
      x = x + b.gamma2 * Mlp(b, b.ln2(x));
    }
    return ln_f(x);
  }

  at::Tensor Embed(const at::Tensor& tokens, const at::Tensor& pos) const {
    // The rows in the tables' dtype, then the activations' (a no-op unless the CPU stores the
    // tables in reduced precision).
    return wte.index_select(0, tokens.reshape({-1}))
               .view({tokens.size(0), tokens.size(1), -1})
               .to(dtype) +
           wpe.index_select(0, pos.reshape({-1})).view({pos.size(0), pos.size(1), -1}).to(dtype);
  }

  at::Tensor Logits(const at::Tensor& hidden) const {
    if (lm_head.has_value()) return (*lm_head)(hidden);
    return at::matmul(hidden, wte.t());
  }

  // Host tensor → the model's device (states: small, once per call).
  at::Tensor ToDevice(const at::Tensor& host) const { return host.to(device); }

  // Host integers → one int64 tensor [columns.size(), n] on the device: staged through pinned
  // memory and copied without blocking the host (the caching host allocator keeps the staging
  // buffer alive until the copy has run), so a decode step uploads its token ids, positions and
  // rows in one copy and never waits for the device before its kernels are queued.
  at::Tensor UploadIndices(std::initializer_list<absl::Span<const int64_t>> columns) const {
    const int64_t n = static_cast<int64_t>(columns.begin()->size());
    at::Tensor host = at::empty({static_cast<int64_t>(columns.size()), n},
                                at::TensorOptions(at::kLong).pinned_memory(device.is_cuda()));
    int64_t* out = host.data_ptr<int64_t>();
    for (absl::Span<const int64_t> c : columns) out = std::copy(c.begin(), c.end(), out);
    return host.to(device, /*non_blocking=*/true);
  }
  // Device result → float32 host values.
  static std::vector<float> ToHost(const at::Tensor& t) {
    const at::Tensor h = t.to(at::kCPU).to(at::kFloat).contiguous();
    return std::vector<float>(h.data_ptr<float>(), h.data_ptr<float>() + h.numel());
  }

  // Every parameter to the device: on CUDA in `dtype`; on the CPU the dense weights and the
  // embeddings in the Placement's dtype, the rest float32; the TSSA parameters float32 always.
  void Place(const Placement& placement) {
    device = TorchDevice(placement);
    decode_graphs = placement.decode_graphs;
    pad_decode_steps = placement.cuda || placement.pad_decode_steps;
    draw_on_device = placement.cuda || placement.draw_on_device;
    weight_dtype = ComputeScalarType(placement.dtype);
    dtype = placement.cuda ? weight_dtype : at::kFloat;
    const CpuProducts products = placement.CpuProductsUsed();
    // The lean step packs the dense weights from their loaded form, which placing replaces.
    std::optional<LeanDecoder::Source> lean_source;
    if (!placement.cuda && placement.cpu_lean_decode_max_rows != 0) {
      lean_source.emplace();
      for (const Block& b : blocks) {
        LeanDecoder::Layer& l = lean_source->layers.emplace_back();
        l.c_attn_weight = b.c_attn.loaded_weight(), l.c_attn_bias = b.c_attn.loaded_bias();
        l.c_proj_weight = b.c_proj.loaded_weight(), l.c_proj_bias = b.c_proj.loaded_bias();
        l.c_fc_weight = b.c_fc.loaded_weight(), l.c_fc_bias = b.c_fc.loaded_bias();
        l.mlp_proj_weight = b.mlp_proj.loaded_weight(), l.mlp_proj_bias = b.mlp_proj.loaded_bias();
      }
    }
    stream = ModelStreamFor(device);
    const c10::OptionalStreamGuard on_stream(stream);  // the copies ordered before its kernels
    const auto move = [&](at::Tensor& t) {
      if (!t.defined()) return;
      t = t.to(device, dtype).contiguous();
      streamed_weight_bytes += t.nbytes();
    };
    move(ln_f.weight), move(ln_f.bias);
    // At int8 the tied table (embedding and output projection) stays bf16 with the bf16 path's
    // float32-output product: both int8 products write bf16 before the per-channel scale, which
    // is what flipped greedy choices at bf16 (below), and the table is read at the fed tokens
    // too, where one bf16 row is as cheap as an int8 one.
    const at::ScalarType table_dtype =
        weight_dtype == at::kChar ? at::ScalarType(at::kBFloat16) : weight_dtype;
    if (!placement.cuda && weight_dtype != at::kFloat) {
      // A step reads the output projection whole, and wte's rows only at the fed tokens: both
      // are the one reduced-precision table. Its bf16 product widens the weight to fp32
      // rather than going through oneDNN, whose bf16 products write bf16: logits of magnitude ~10
      // rounded to bf16's 8 bits flipped 1.7% of tost-austen's greedy choices against fp32, and
      // 0.4% with fp32 logits (tools/bench/precision_quality.py). fp16 results keep 11 bits.
      wte = wte.to(device, table_dtype).contiguous();
      lm_head.emplace(wte, at::Tensor());
      lm_head->Place(device, table_dtype,
                     products == CpuProducts::kOneDnnBf16 || products == CpuProducts::kInt8
                         ? CpuProducts::kWiden
                         : products);
      streamed_weight_bytes += lm_head->nbytes();
    } else {
      move(wte);
    }
    wpe = wpe.to(device, table_dtype).contiguous();
    per_position_bytes = wpe.nbytes() / wpe.size(0);
    for (Block& b : blocks) {
      for (at::Tensor* t :
           {&b.gamma1, &b.gamma2, &b.ln1.weight, &b.ln1.bias, &b.ln2.weight, &b.ln2.bias}) {
        move(*t);
      }
      for (Linear* l : {&b.c_attn, &b.c_proj, &b.c_fc, &b.mlp_proj}) {
        l->Place(device, weight_dtype, products);
        streamed_weight_bytes += l->nbytes();
      }
      b.temp = b.temp.to(device, at::kFloat).contiguous();
      streamed_weight_bytes += b.temp.nbytes();
      b.denom_bias = b.denom_bias.to(device, at::kFloat).contiguous();
      per_position_bytes += b.denom_bias.nbytes() / b.denom_bias.size(1);  // [K, context]
    }
    if (lean_source.has_value()) {
      for (size_t i = 0; i < blocks.size(); ++i) {
        const Block& b = blocks[i];
        LeanDecoder::Layer& l = lean_source->layers[i];
        l.ln1_weight = b.ln1.weight, l.ln1_bias = b.ln1.bias;
        l.ln2_weight = b.ln2.weight, l.ln2_bias = b.ln2.bias;
        l.gamma1 = b.gamma1, l.gamma2 = b.gamma2, l.temp = b.temp, l.denom_bias = b.denom_bias;
      }
      lean_source->ln_f_weight = ln_f.weight, lean_source->ln_f_bias = ln_f.bias;
      lean_source->wte = wte, lean_source->wpe = wpe;
      lean = LeanDecoder::Build(config.language, *lean_source, placement.dtype);
      lean_max_rows = placement.cpu_lean_decode_max_rows < 0
                          ? LeanMaxRows(placement.dtype, {.dot_products = lean->dot_products(),
                                                          .avx2 = kernels::cpu::ActiveCpuIsa() ==
                                                                  kernels::cpu::CpuIsa::kAvx2,
                                                          .amx_bf16 = CpuHasAmxBf16()})
                          : placement.cpu_lean_decode_max_rows;
    }
  }

  absl::Status CheckTokens(absl::Span<const int32_t> tokens) const {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] < 0 || tokens[i] >= config.language.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("model ", config.name, ": token id ", tokens[i], " at index ", i,
                         " is outside the vocabulary [0, ", config.language.vocab_size, ")"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status CheckState(const SequenceState& s, int64_t new_tokens) const {
    const LanguageConfig& c = config.language;
    const size_t want = static_cast<size_t>(c.n_layer * c.state_floats_per_layer());
    if (s.stats.size() != want || s.position < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model ", config.name, ": sequence state holds ", s.stats.size(),
                       " floats at position ", s.position, ", expected ", want));
    }
    return CheckPosition(s.position, new_tokens);
  }

  // `new_tokens` fed from `position` stay within the context (positions index denom_bias).
  absl::Status CheckPosition(int64_t position, int64_t new_tokens) const {
    const int64_t context = config.language.context_length;
    if (position < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model ", config.name, ": position ", position, " is negative"));
    }
    if (position + new_tokens > context) {
      return absl::OutOfRangeError(
          absl::StrCat("model ", config.name, ": position ", position, " + ", new_tokens,
                       " token(s) exceeds the context length of ", context, " tokens"));
    }
    return absl::OkStatus();
  }
  // The lean step takes every batch-invariant step (it computes each row alone, so it is
  // invariant at any size, where LibTorch's invariant form is one product per row) and the others
  // of at most lean_max_rows rows.
  bool TakesLeanStep(int64_t batch, bool batch_invariant) const {
    return lean != nullptr && (batch_invariant || batch <= lean_max_rows);
  }
  // One step through it on host memory: states[l] [B,W], or pools [P,W] indexed by `rows`.
  at::Tensor LeanStep(absl::Span<const int32_t> tokens, absl::Span<const int64_t> positions,
                      absl::Span<const int64_t> rows, std::vector<at::Tensor>& states) const {
    const int64_t batch = static_cast<int64_t>(tokens.size());
    const int64_t width = config.language.state_floats_per_layer();
    std::vector<float*> state_rows;
    state_rows.reserve(states.size() * tokens.size());
    for (const at::Tensor& layer : states) {
      float* base = layer.data_ptr<float>();
      for (int64_t b = 0; b < batch; ++b) {
        state_rows.push_back(base + (rows.empty() ? b : rows[b]) * width);
      }
    }
    at::Tensor logits = at::empty({batch, config.language.vocab_size}, at::kFloat);
    lean->Step(tokens, positions, state_rows, logits.data_ptr<float>());
    return logits;
  }
  at::Tensor PrefillChunks(absl::Span<const int32_t> tokens, int64_t position, int64_t chunk_tokens,
                           std::vector<at::Tensor>& states) const;
  at::Tensor StepLogits(absl::Span<const int32_t> tokens, absl::Span<const int64_t> positions,
                        absl::Span<const int64_t> rows, std::vector<at::Tensor>& states,
                        bool batch_invariant) const;
  at::Tensor StepOnDevice(const at::Tensor& ids, const at::Tensor& pos,
                          const std::optional<at::Tensor>& row_ids, std::vector<at::Tensor>& states,
                          bool batch_invariant) const;

  // SequenceStates → per-layer [B,W] tensors.
  std::vector<at::Tensor> Gather(absl::Span<SequenceState* const> seqs) const {
    const int64_t layers = config.language.n_layer,
                  width = config.language.state_floats_per_layer();
    const int64_t batch = static_cast<int64_t>(seqs.size());
    at::Tensor packed = at::empty({batch, layers, width}, at::kFloat);
    for (int64_t b = 0; b < batch; ++b) {
      std::memcpy(packed[b].data_ptr<float>(), seqs[b]->stats.data(),
                  layers * width * sizeof(float));
    }
    packed = ToDevice(packed);
    std::vector<at::Tensor> out;
    for (int64_t l = 0; l < layers; ++l) out.push_back(packed.select(1, l).contiguous());
    return out;
  }

  void Scatter(const std::vector<at::Tensor>& states, absl::Span<SequenceState* const> seqs) const {
    const at::Tensor packed = at::stack(states, 1).to(at::kCPU).contiguous();  // [B, L, W]
    const int64_t per_seq = packed.size(1) * packed.size(2);
    for (size_t b = 0; b < seqs.size(); ++b) {
      std::memcpy(seqs[b]->stats.data(), packed.data_ptr<float>() + b * per_seq,
                  per_seq * sizeof(float));
    }
  }
};

LanguageModel::LanguageModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LanguageModel::~LanguageModel() = default;
const ModelConfig& LanguageModel::config() const { return impl_->config; }
const Tokenizer& LanguageModel::tokenizer() const { return *impl_->tokenizer; }

SequenceState LanguageModel::NewSequence() const {
  const LanguageConfig& c = impl_->config.language;
  SequenceState s;
  s.stats.assign(static_cast<size_t>(c.n_layer * c.state_floats_per_layer()), 0.f);
  return s;
}

absl::StatusOr<std::unique_ptr<LanguageModel>> LanguageModel::Load(const std::string& model_dir,
                                                                   const ModelConfig& config,
                                                                   const Placement& placement) {
  if (config.architecture != Architecture::kLanguage) {
    return absl::InvalidArgumentError(absl::StrCat("model ", config.name, ": architecture is ",
                                                   ArchitectureName(config.architecture),
                                                   ", expected tost_lm"));
  }
  TOST_ASSIGN_OR_RETURN(SafetensorsFile file,
                        SafetensorsFile::Open(model_dir + "/model.safetensors"));
  const LanguageConfig& c = config.language;
  TOST_ASSIGN_OR_RETURN(Weights w, Weights::FromFile(file, LanguageTensorList(c), config.dtype));
  TOST_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizer(model_dir, c));
  return GuardTorch(config.name, "load", [&]() -> absl::StatusOr<std::unique_ptr<LanguageModel>> {
    c10::InferenceMode inference;
    auto impl = std::make_unique<Impl>();
    impl->config = config;
    impl->tokenizer = std::move(tokenizer);
    impl->wte = w.at("transformer.wte.weight");
    impl->wpe = w.at("transformer.wpe.weight");
    if (w.has("lm_head.weight") && !at::equal(w.at("lm_head.weight"), impl->wte)) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.source(), ": tensor \"lm_head.weight\" differs from ",
                       "\"transformer.wte.weight\"; the two are tied in this model"));
    }
    auto opt = [&](const std::string& name) { return w.has(name) ? w.at(name) : at::Tensor(); };
    auto linear = [&](const std::string& p) {
      return Linear(w.at(p + ".weight"), opt(p + ".bias"));
    };
    auto layer_norm = [&](const std::string& p) {
      return LayerNorm{w.at(p + ".weight"), opt(p + ".bias")};
    };
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string p = absl::StrCat("transformer.h.", l, ".");
      impl->blocks.push_back({w.at(p + "gamma1"), w.at(p + "gamma2"), layer_norm(p + "ln_1"),
                              layer_norm(p + "ln_2"), linear(p + "attn.c_attn"),
                              linear(p + "attn.c_proj"), linear(p + "mlp.c_fc"),
                              linear(p + "mlp.c_proj"), w.at(p + "attn.temp").view({-1}),
                              w.at(p + "attn.denom_bias").view({c.n_head, c.context_length})});
    }
    impl->ln_f = layer_norm("transformer.ln_f");
    impl->Place(placement);
    return std::unique_ptr<LanguageModel>(new LanguageModel(std::move(impl)));
  });
}

namespace {

// Checks shared by both forms of Prefill and Step.
absl::Status CheckPrefill(const ModelConfig& config, absl::Span<const int32_t> tokens) {
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", config.name, ": prefill needs at least one token"));
  }
  return absl::OkStatus();
}

absl::Status CheckStepBatch(const ModelConfig& config, size_t tokens, size_t sequences) {
  if (tokens == 0 || tokens != sequences) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", config.name, ": step needs one token per sequence, got ", tokens,
                     " tokens for ", sequences, " sequences"));
  }
  return absl::OkStatus();
}

std::vector<int64_t> Widen(absl::Span<const int32_t> v) { return {v.begin(), v.end()}; }

}  // namespace

// The pool of one LanguageModel: float32 [n_layer, rows, W] on the model's device, so layer l's
// rows are one contiguous [rows, W] tensor that tssa_step indexes in place.
//
// On a CUDA device every step runs at a bucket's batch size (decode_buckets.h), padded with the
// pool's scratch rows (`rows` more past the usable ones, so that any padding has distinct rows),
// through DecodeGraphs.
class LanguageModel::DevicePool final : public StatePool {
 public:
  DevicePool(const LanguageModel* owner, at::Tensor pool, int64_t rows,
             std::optional<c10::Stream> stream)
      : owner_(owner), pool_(std::move(pool)), rows_(rows), stream_(stream) {}

  int64_t rows() const override { return rows_; }
  int64_t floats_per_row() const override { return pool_.size(0) * pool_.size(2); }

  absl::Status Store(int64_t row, absl::Span<const float> stats) override {
    TOST_RETURN_IF_ERROR(CheckRow(row, stats.size()));
    return GuardTorch(owner_->config().name, "store sequence state",
                      [&] {
                        const c10::OptionalStreamGuard on_stream(stream_);
                        const at::Tensor host =
                            at::from_blob(const_cast<float*>(stats.data()),
                                          {pool_.size(0), pool_.size(2)}, at::kFloat);
                        pool_.select(1, row).copy_(host);
                        return true;
                      })
        .status();
  }

  absl::Status Load(int64_t row, absl::Span<float> stats) const override {
    TOST_RETURN_IF_ERROR(CheckRow(row, stats.size()));
    return GuardTorch(owner_->config().name, "load sequence state",
                      [&] {
                        const c10::OptionalStreamGuard on_stream(stream_);
                        at::from_blob(stats.data(), {pool_.size(0), pool_.size(2)}, at::kFloat)
                            .copy_(pool_.select(1, row));
                        return true;
                      })
        .status();
  }

  std::string decode_mode() const override {
    return graphs_ != nullptr ? graphs_->mode() : "eager";
  }

  const LanguageModel* owner() const { return owner_; }
  at::Tensor layer(int64_t l) const { return pool_.select(0, l); }
  // Padded steps (CUDA): the buckets and their graphs; null on the CPU.
  DecodeGraphs* graphs() const { return graphs_.get(); }
  const std::vector<int64_t>& buckets() const { return buckets_; }
  void UsePaddedSteps(bool capture_graphs) {
    buckets_ = DecodeBuckets(rows_);
    graphs_ = std::make_unique<DecodeGraphs>(pool_.device(), rows_, capture_graphs);
  }
  // Stages inputs of `bucket` rows that touch only scratch rows, and zeroes those rows: what graph
  // captures and their checks run on.
  void StageScratch(int64_t bucket) const {
    const at::Tensor staged = graphs_->staged().narrow(1, 0, bucket);
    staged[0].zero_();
    staged[1].zero_();
    staged[2].copy_(at::arange(rows_, rows_ + bucket, staged.options()));
    pool_.narrow(1, rows_, bucket).zero_();
  }

 private:
  const LanguageModel* owner_;
  at::Tensor pool_;  // [L, rows (+ rows of scratch on CUDA), W]
  int64_t rows_;
  std::optional<c10::Stream> stream_;  // the model's: copies in order with its steps
  std::vector<int64_t> buckets_;
  std::unique_ptr<DecodeGraphs> graphs_;
};

// Feeds `tokens` from `position` in chunks; states[l] [1,W] is replaced by each chunk's result.
// Returns the last token's logits [vocab] (on the device).
at::Tensor LanguageModel::Impl::PrefillChunks(absl::Span<const int32_t> tokens, int64_t position,
                                              int64_t chunk_tokens,
                                              std::vector<at::Tensor>& states) const {
  const int64_t total = static_cast<int64_t>(tokens.size());
  at::Tensor last_hidden, last_logits;
  for (int64_t start = 0; start < total; start += chunk_tokens) {
    const int64_t n = std::min(chunk_tokens, total - start);
    if (lean != nullptr && n <= lean_max_rows) {
      // A short chunk through the lean step: its n tokens are n rows of one step whose state rows
      // are all the sequence's, taken in order, which is the causal scan one token at a time. The
      // path depends only on the chunk's length, so a prompt cut on the same grid gets the same
      // statistics whatever came before (the prefix cache's exactness rests on that).
      const int64_t layers = static_cast<int64_t>(states.size());
      std::vector<float*> rows(static_cast<size_t>(layers * n));
      for (int64_t l = 0; l < layers; ++l) {
        states[l] = states[l].to(at::kFloat).contiguous().clone();  // updated in place below
        std::fill_n(rows.begin() + l * n, n, states[l].data_ptr<float>());
      }
      std::vector<int64_t> positions(static_cast<size_t>(n));
      std::iota(positions.begin(), positions.end(), position);
      last_logits = at::empty({config.language.vocab_size}, at::kFloat);
      lean->Step(tokens.subspan(start, n), positions, rows, last_logits.data_ptr<float>(),
                 /*last_row_logits_only=*/true);
      last_hidden = at::Tensor();
      position += n;
      continue;
    }
    last_logits = at::Tensor();
    const std::vector<int64_t> ids_host = Widen(tokens.subspan(start, n));
    const at::Tensor ids = UploadIndices({ids_host}).view({1, n});
    const at::Tensor pos =
        at::arange(position, position + n, at::TensorOptions(at::kLong).device(device))
            .view({1, n});
    const at::Tensor hidden = Sequence(Embed(ids, pos), pos.select(1, 0), &states);
    last_hidden = hidden.select(1, n - 1);
    position += n;
  }
  return last_logits.defined() ? last_logits : Logits(last_hidden).reshape({-1});
}

// One decode step over per-layer states (pools when `rows` is given). Returns logits [B, vocab]
// on the device.
at::Tensor LanguageModel::Impl::StepLogits(absl::Span<const int32_t> tokens,
                                           absl::Span<const int64_t> positions,
                                           absl::Span<const int64_t> rows,
                                           std::vector<at::Tensor>& states,
                                           bool batch_invariant) const {
  const int64_t batch = static_cast<int64_t>(tokens.size());
  if (TakesLeanStep(batch, batch_invariant)) return LeanStep(tokens, positions, rows, states);
  const std::vector<int64_t> ids_host = Widen(tokens);
  // Positions were range-checked on the host: uploaded once with the ids (and rows), used by
  // every layer.
  const at::Tensor staged = rows.empty() ? UploadIndices({ids_host, positions})
                                         : UploadIndices({ids_host, positions, rows});
  std::optional<at::Tensor> row_ids;
  if (!rows.empty()) row_ids = staged[2];
  return StepOnDevice(staged[0].view({batch, 1}), staged[1], row_ids, states, batch_invariant);
}

// The step on inputs already on the device: ids [B,1], positions [B], rows [B] (pools) or none.
// Launches kernels only (no host synchronisation, no host data): what a CUDA graph captures.
at::Tensor LanguageModel::Impl::StepOnDevice(const at::Tensor& ids, const at::Tensor& pos,
                                             const std::optional<at::Tensor>& row_ids,
                                             std::vector<at::Tensor>& states,
                                             bool batch_invariant) const {
  const int64_t batch = ids.size(0);
  if (TakesLeanStep(batch, batch_invariant)) {
    // The CPU's padded steps (tests of the padding): the same lean step as unpadded ones.
    const at::Tensor ids_host = ids.reshape({-1}).to(at::kInt).contiguous();
    const at::Tensor pos_host = pos.contiguous();
    std::optional<at::Tensor> rows_host;
    if (row_ids.has_value()) rows_host = row_ids->contiguous();
    return LeanStep(absl::MakeConstSpan(ids_host.const_data_ptr<int32_t>(), batch),
                    absl::MakeConstSpan(pos_host.const_data_ptr<int64_t>(), batch),
                    rows_host.has_value()
                        ? absl::MakeConstSpan(rows_host->const_data_ptr<int64_t>(), batch)
                        : absl::Span<const int64_t>(),
                    states);
  }
  const at::Tensor x = Embed(ids, pos.view({batch, 1})).squeeze(1);
  if (!batch_invariant || batch == 1) return Logits(StepHidden(x, pos, states, row_ids));
  std::vector<at::Tensor> out;
  for (int64_t b = 0; b < batch; ++b) {
    // Every row alone, with the same shapes whatever the batch: bit-identical under any load.
    std::vector<at::Tensor> row_states;
    std::optional<at::Tensor> row_id;
    if (row_ids.has_value()) {
      row_states = states;  // the pools themselves, indexed by the row's id
      row_id = row_ids->slice(0, b, b + 1);
    } else {
      for (const auto& s : states) row_states.push_back(s.slice(0, b, b + 1));  // in-place views
    }
    out.push_back(
        Logits(StepHidden(x.slice(0, b, b + 1), pos.slice(0, b, b + 1), row_states, row_id)));
  }
  return at::cat(out, 0);
}

absl::StatusOr<std::vector<float>> LanguageModel::Prefill(absl::Span<const int32_t> tokens,
                                                          SequenceState& state,
                                                          int64_t chunk_tokens) const {
  const Impl& m = *impl_;
  TOST_RETURN_IF_ERROR(CheckPrefill(m.config, tokens));
  TOST_RETURN_IF_ERROR(m.CheckTokens(tokens));
  TOST_RETURN_IF_ERROR(m.CheckState(state, static_cast<int64_t>(tokens.size())));
  chunk_tokens = std::max<int64_t>(1, chunk_tokens);
  return GuardTorch(m.config.name, "prefill", [&]() {
    c10::InferenceMode inference;
    const c10::OptionalStreamGuard on_stream(m.stream);
    SequenceState* seqs[] = {&state};
    std::vector<at::Tensor> states = m.Gather(seqs);
    std::vector<float> logits =
        Impl::ToHost(m.PrefillChunks(tokens, state.position, chunk_tokens, states));
    m.Scatter(states, seqs);  // commit only after every chunk succeeded
    state.position += static_cast<int64_t>(tokens.size());
    return logits;
  });
}

absl::StatusOr<std::vector<float>> LanguageModel::Step(absl::Span<const int32_t> tokens,
                                                       absl::Span<SequenceState* const> states,
                                                       bool batch_invariant) const {
  const Impl& m = *impl_;
  TOST_RETURN_IF_ERROR(CheckStepBatch(m.config, tokens.size(), states.size()));
  TOST_RETURN_IF_ERROR(m.CheckTokens(tokens));
  for (SequenceState* s : states) TOST_RETURN_IF_ERROR(m.CheckState(*s, 1));
  return GuardTorch(m.config.name, "step", [&]() {
    c10::InferenceMode inference;
    const c10::OptionalStreamGuard on_stream(m.stream);
    std::vector<at::Tensor> layer_states = m.Gather(states);
    std::vector<int64_t> positions;
    for (SequenceState* s : states) positions.push_back(s->position);
    std::vector<float> out =
        Impl::ToHost(m.StepLogits(tokens, positions, {}, layer_states, batch_invariant));
    m.Scatter(layer_states, states);
    for (SequenceState* s : states) ++s->position;
    return out;
  });
}

absl::StatusOr<std::unique_ptr<StatePool>> LanguageModel::NewStatePool(int64_t rows) const {
  const Impl& m = *impl_;
  if (rows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", m.config.name, ": a state pool needs at least one row, got ", rows));
  }
  const LanguageConfig& c = m.config.language;
  return GuardTorch(m.config.name, "allocate the state pool", [&]() -> std::unique_ptr<StatePool> {
    const c10::OptionalStreamGuard on_stream(m.stream);
    const bool padded = m.pad_decode_steps;
    auto pool = std::make_unique<DevicePool>(
        this,
        at::zeros({c.n_layer, padded ? 2 * rows : rows, c.state_floats_per_layer()},
                  at::TensorOptions(at::kFloat).device(m.device)),
        rows, m.stream);
    if (padded) pool->UsePaddedSteps(m.decode_graphs);
    return pool;
  });
}

absl::Status LanguageModel::PrepareDecode(StatePool& pool, bool batch_invariant) const {
  const Impl& m = *impl_;
  TOST_ASSIGN_OR_RETURN(const DevicePool* own, OwnPool(pool));
  DecodeGraphs* graphs = own->graphs();
  if (graphs == nullptr) return absl::OkStatus();  // unpadded steps: nothing to capture
  return GuardTorch(m.config.name, "capture the decode graphs",
                    [&] {
                      c10::InferenceMode inference;
                      const c10::OptionalStreamGuard on_stream(m.stream);
                      std::vector<at::Tensor> pools;
                      for (int64_t l = 0; l < m.config.language.n_layer; ++l)
                        pools.push_back(own->layer(l));
                      for (int64_t bucket : own->buckets()) {
                        const bool ready = graphs->Prepare(
                            bucket, batch_invariant,
                            [&](const at::Tensor& d_ids, const at::Tensor& d_pos,
                                const at::Tensor& d_rows, bool invariant) {
                              return m.StepOnDevice(d_ids, d_pos, d_rows, pools, invariant);
                            },
                            [&](int64_t b) { own->StageScratch(b); });
                        if (!ready) break;  // graphs off (or never on): decode_mode() says why
                      }
                      return true;
                    })
      .status();
}

absl::StatusOr<const LanguageModel::DevicePool*> LanguageModel::OwnPool(
    const StatePool& pool) const {
  const auto* own = dynamic_cast<const DevicePool*>(&pool);
  if (own == nullptr || own->owner() != this) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", impl_->config.name,
                     ": the state pool was not made by this model's NewStatePool"));
  }
  return own;
}

absl::StatusOr<std::vector<float>> LanguageModel::Prefill(absl::Span<const int32_t> tokens,
                                                          StatePool& pool, int64_t row,
                                                          int64_t position,
                                                          int64_t chunk_tokens) const {
  const Impl& m = *impl_;
  TOST_ASSIGN_OR_RETURN(const DevicePool* own, OwnPool(pool));
  TOST_RETURN_IF_ERROR(CheckPrefill(m.config, tokens));
  TOST_RETURN_IF_ERROR(m.CheckTokens(tokens));
  TOST_RETURN_IF_ERROR(m.CheckPosition(position, static_cast<int64_t>(tokens.size())));
  if (row < 0 || row >= pool.rows()) {
    return absl::OutOfRangeError(absl::StrCat("model ", m.config.name, ": state pool row ", row,
                                              " is outside [0, ", pool.rows(), ")"));
  }
  chunk_tokens = std::max<int64_t>(1, chunk_tokens);
  return GuardTorch(m.config.name, "prefill", [&]() {
    c10::InferenceMode inference;
    const c10::OptionalStreamGuard on_stream(m.stream);
    std::vector<at::Tensor> states;
    for (int64_t l = 0; l < m.config.language.n_layer; ++l)
      states.push_back(own->layer(l).narrow(0, row, 1));
    std::vector<float> logits =
        Impl::ToHost(m.PrefillChunks(tokens, position, chunk_tokens, states));
    // The row changes only once every chunk has succeeded.
    for (int64_t l = 0; l < m.config.language.n_layer; ++l)
      own->layer(l).narrow(0, row, 1).copy_(states[l]);
    return logits;
  });
}

template <typename Result, typename Finish>
absl::StatusOr<Result> LanguageModel::StepOnPool(absl::Span<const int32_t> tokens, StatePool& pool,
                                                 absl::Span<const int64_t> rows,
                                                 absl::Span<const int64_t> positions,
                                                 bool batch_invariant, const Finish& finish) const {
  const Impl& m = *impl_;
  TOST_ASSIGN_OR_RETURN(const DevicePool* own, OwnPool(pool));
  TOST_RETURN_IF_ERROR(CheckStepBatch(m.config, tokens.size(), rows.size()));
  TOST_RETURN_IF_ERROR(CheckStepBatch(m.config, tokens.size(), positions.size()));
  TOST_RETURN_IF_ERROR(m.CheckTokens(tokens));
  for (int64_t p : positions) TOST_RETURN_IF_ERROR(m.CheckPosition(p, 1));
  // Rows checked on the host, where they are produced, so the device never has to be asked.
  std::vector<int64_t> sorted(rows.begin(), rows.end());
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= pool.rows() || (i > 0 && sorted[i] == sorted[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model ", m.config.name, ": step rows must be distinct rows of [0, ", pool.rows(),
          "), got ", sorted[i], i > 0 && sorted[i] == sorted[i - 1] ? " twice" : ""));
    }
  }
  return GuardTorch(m.config.name, "step", [&]() -> Result {
    c10::InferenceMode inference;
    const c10::OptionalStreamGuard on_stream(m.stream);
    std::vector<at::Tensor> pools;
    for (int64_t l = 0; l < m.config.language.n_layer; ++l) pools.push_back(own->layer(l));
    DecodeGraphs* graphs = own->graphs();
    if (graphs == nullptr)
      return finish(m.StepLogits(tokens, positions, rows, pools, batch_invariant));
    // Padded to the bucket: the rest are scratch rows at position 0 fed token 0.
    const int64_t batch = static_cast<int64_t>(tokens.size());
    const int64_t bucket = DecodeBucketFor(own->buckets(), batch);
    TORCH_CHECK(bucket >= batch, "a step of ", batch, " sequences exceeds the pool's ", pool.rows(),
                " rows");
    std::vector<int64_t> ids(bucket, 0), pos(bucket, 0), row_ids(bucket);
    std::copy(tokens.begin(), tokens.end(), ids.begin());
    std::copy(positions.begin(), positions.end(), pos.begin());
    std::copy(rows.begin(), rows.end(), row_ids.begin());
    for (int64_t b = batch; b < bucket; ++b) row_ids[b] = pool.rows() + (b - batch);
    graphs->staged().narrow(1, 0, bucket).copy_(m.UploadIndices({ids, pos, row_ids}));
    const at::Tensor logits = graphs->Run(
        bucket, batch_invariant,
        [&](const at::Tensor& d_ids, const at::Tensor& d_pos, const at::Tensor& d_rows,
            bool invariant) { return m.StepOnDevice(d_ids, d_pos, d_rows, pools, invariant); },
        [&](int64_t b) { own->StageScratch(b); });
    return finish(logits.narrow(0, 0, batch));
  });
}

absl::StatusOr<std::vector<float>> LanguageModel::Step(absl::Span<const int32_t> tokens,
                                                       StatePool& pool,
                                                       absl::Span<const int64_t> rows,
                                                       absl::Span<const int64_t> positions,
                                                       bool batch_invariant) const {
  return StepOnPool<std::vector<float>>(tokens, pool, rows, positions, batch_invariant,
                                        &Impl::ToHost);
}

absl::StatusOr<std::vector<DrawnToken>> LanguageModel::StepAndDraw(
    absl::Span<const int32_t> tokens, StatePool& pool, absl::Span<const int64_t> rows,
    absl::Span<const int64_t> positions, absl::Span<const TokenDraw> draws, bool batch_invariant,
    const std::function<void()>& before_draw) const {
  const Impl& m = *impl_;
  if (draws.size() != tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("model ", m.config.name,
                                                   ": step needs one draw per sequence, got ",
                                                   draws.size(), " draws for ", tokens.size()));
  }
  const int64_t defined = m.tokenizer->vocab_size();
  return StepOnPool<std::vector<DrawnToken>>(
      tokens, pool, rows, positions, batch_invariant, [&](const at::Tensor& logits) {
        if (before_draw) before_draw();  // the forward is issued; on a GPU it may still run
        if (m.draw_on_device) return DrawTokensOnDevice(logits, defined, draws);
        return DrawTokens(Impl::ToHost(logits), defined, draws);
      });
}

int64_t LanguageModel::DecodeStepBytes(int64_t rows) const {
  const Impl& m = *impl_;
  const LanguageConfig& c = m.config.language;
  const int64_t state_bytes = c.n_layer * c.state_floats_per_layer() * 4;
  const int64_t logits_bytes = c.vocab_size * at::elementSize(m.dtype);
  return m.streamed_weight_bytes + rows * (m.per_position_bytes + 2 * state_bytes + logits_bytes);
}

int64_t LanguageModel::LeanDecodeMaxRows() const {
  return impl_->lean != nullptr ? impl_->lean_max_rows : 0;
}

int64_t LanguageModel::LeanDecodeBytes() const {
  return impl_->lean != nullptr ? impl_->lean->bytes() : 0;
}

absl::Status LanguageModel::CheckWholeSequences(absl::Span<const int32_t> tokens, int64_t batch,
                                                int64_t length) const {
  const Impl& m = *impl_;
  if (batch <= 0 || length <= 0 || static_cast<int64_t>(tokens.size()) != batch * length) {
    return absl::InvalidArgumentError(absl::StrCat("model ", m.config.name, ": expected ", batch,
                                                   "x", length, " tokens, got ", tokens.size()));
  }
  if (length > m.config.language.context_length) {
    return absl::OutOfRangeError(absl::StrCat("model ", m.config.name, ": ", length,
                                              " tokens exceed the context length of ",
                                              m.config.language.context_length));
  }
  return m.CheckTokens(tokens);
}

absl::StatusOr<std::vector<float>> LanguageModel::ForwardAll(absl::Span<const int32_t> tokens,
                                                             int64_t batch, int64_t length) const {
  const Impl& m = *impl_;
  TOST_RETURN_IF_ERROR(CheckWholeSequences(tokens, batch, length));
  return GuardTorch(m.config.name, "forward", [&]() {
    c10::InferenceMode inference;
    const c10::OptionalStreamGuard on_stream(m.stream);
    const auto on_device = at::TensorOptions(at::kLong).device(m.device);
    const at::Tensor ids = m.ToDevice(
        at::tensor(std::vector<int64_t>(tokens.begin(), tokens.end())).view({batch, length}));
    const at::Tensor pos = at::arange(length, on_device).view({1, length}).expand({batch, length});
    return Impl::ToHost(
        m.Logits(m.Sequence(m.Embed(ids, pos), at::zeros({batch}, on_device), nullptr)));
  });
}

absl::StatusOr<std::vector<DrawnToken>> LanguageModel::ScorePrompt(absl::Span<const int32_t> tokens,
                                                                   int32_t top_n,
                                                                   int64_t block_bytes) const {
  const Impl& m = *impl_;
  const auto length = static_cast<int64_t>(tokens.size());
  if (length < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", m.config.name, ": expected at least 2 tokens to score, got ", length));
  }
  TOST_RETURN_IF_ERROR(CheckWholeSequences(tokens, 1, length));
  const int64_t defined = std::min(tokenizer().vocab_size(), m.config.language.vocab_size);
  if (defined <= 0) return std::vector<DrawnToken>(length - 1);
  const int64_t k = std::clamp<int64_t>(top_n, 0, defined);
  return GuardTorch(m.config.name, "score the prompt", [&]() -> std::vector<DrawnToken> {
    c10::InferenceMode inference;
    const c10::OptionalStreamGuard on_stream(m.stream);
    const auto on_device = at::TensorOptions(at::kLong).device(m.device);
    const at::Tensor ids = m.ToDevice(
        at::tensor(std::vector<int64_t>(tokens.begin(), tokens.end())).view({1, length}));
    const at::Tensor pos = at::arange(length, on_device).view({1, length});
    // Row i of the hidden states scores token i + 1; the last position scores nothing.
    const at::Tensor hidden =
        m.Sequence(m.Embed(ids, pos), at::zeros({1}, on_device), nullptr)[0].narrow(0, 0,
                                                                                    length - 1);
    const at::Tensor next = ids[0].narrow(0, 1, length - 1);
    // The partition is summed in double, as ScoreTokens does: rows x vocab x 8 bytes a block.
    const int64_t block = std::max<int64_t>(1, block_bytes / (defined * 8));
    std::vector<DrawnToken> out(length - 1);
    for (int64_t start = 0; start < length - 1; start += block) {
      const int64_t n = std::min(block, length - 1 - start);
      const at::Tensor logits =
          m.Logits(hidden.narrow(0, start, n)).narrow(1, 0, defined).to(at::kFloat);
      const at::Tensor nonfinite = logits.isfinite().logical_not();
      const at::Tensor has_nonfinite = nonfinite.any(1);
      // argmax returns the first maximal index: the lowest non-finite id, as ScoreTokens reports.
      const at::Tensor first_nonfinite = nonfinite.to(at::kByte).argmax(1);
      const at::Tensor log_z = logits.to(at::kDouble).logsumexp({1});
      const at::Tensor chosen = logits.gather(1, next.narrow(0, start, n).view({n, 1})).view({n});
      std::vector<at::Tensor> parts = {has_nonfinite, first_nonfinite, log_z, chosen};
      if (k > 0) {
        auto [top_values, top_ids] = logits.topk(k, 1, /*largest=*/true, /*sorted=*/true);
        parts.push_back(top_values);
        parts.push_back(top_ids);
      }
      std::vector<at::Tensor> host;
      for (const at::Tensor& t : parts) host.push_back(t.to(at::kCPU).contiguous());
      const bool* bad = host[0].data_ptr<bool>();
      const int64_t* bad_id = host[1].data_ptr<int64_t>();
      const double* z = host[2].data_ptr<double>();
      const float* chosen_logit = host[3].data_ptr<float>();
      for (int64_t r = 0; r < n; ++r) {
        DrawnToken& d = out[start + r];
        d.id = tokens[start + r + 1];
        if (bad[r]) {
          d.nonfinite_id = bad_id[r];
          continue;
        }
        d.logprob = d.id < defined ? static_cast<float>(chosen_logit[r] - z[r])
                                   : -std::numeric_limits<float>::infinity();
        if (k == 0) continue;
        const float* values = host[4].data_ptr<float>() + r * k;
        const int64_t* top_ids = host[5].data_ptr<int64_t>() + r * k;
        for (int64_t j = 0; j < k; ++j) {
          d.top_logprobs.emplace_back(static_cast<int32_t>(top_ids[j]),
                                      static_cast<float>(values[j] - z[r]));
        }
        // Equal logits in the lower id first, as ScoreTokens orders them (topk's order among
        // equals is unspecified).
        std::stable_sort(
            d.top_logprobs.begin(), d.top_logprobs.end(), [](const auto& a, const auto& b) {
              return a.second > b.second || (a.second == b.second && a.first < b.first);
            });
      }
    }
    return out;
  });
}

}  // namespace tost::model
