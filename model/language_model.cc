#include "model/language_model.h"

#include <algorithm>
#include <cstring>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "absl/strings/str_cat.h"
#include "kernels/tssa_ops.h"
#include "model/status_macros.h"
#include "model/tensor_list.h"
#include "model/torch_boundary.h"
#include "model/torch_device.h"
#include "model/weights.h"

namespace tost::model {
namespace {

constexpr double kLayerNormEps = 1e-5;

struct Linear {
  at::Tensor weight, bias;  // bias undefined when the config has bias=false
  at::Tensor operator()(const at::Tensor& x) const { return at::linear(x, weight, bias); }
};

struct LayerNorm {
  at::Tensor weight, bias;
  at::Tensor operator()(const at::Tensor& x) const {
    return at::layer_norm(x, {weight.size(0)}, weight, bias, kLayerNormEps);
  }
};

struct Block {
  at::Tensor gamma1, gamma2;
  LayerNorm ln1, ln2;
  Linear c_attn, c_proj, c_fc, mlp_proj;
  at::Tensor temp;        // [K]
  at::Tensor denom_bias;  // [K, context_length]
};

}  // namespace

struct LanguageModel::Impl {
  ModelConfig config;
  at::Device device = at::kCPU;
  at::ScalarType dtype = at::kFloat;  // weights and activations; statistics are float32
  std::unique_ptr<Tokenizer> tokenizer;
  at::Tensor wte, wpe;
  std::vector<Block> blocks;
  LayerNorm ln_f;

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

  // x: [B,C] at `positions` [B]; states[l] [B,W] updated in place.
  at::Tensor StepHidden(at::Tensor x, const at::Tensor& positions,
                        std::vector<at::Tensor>& states) const {
    for (size_t l = 0; l < blocks.size(); ++l) {
      const Block& b = blocks[l];
      const at::Tensor w = b.c_attn(b.ln1(x));
      const at::Tensor y = kernels::tssa_step(w, b.temp, b.denom_bias, positions, states[l]);
      x = x + b.gamma1 * b.c_proj(y);
      x = x + b.gamma2 * Mlp(b, b.ln2(x));
    }
    return ln_f(x);
  }

  at::Tensor Embed(const at::Tensor& tokens, const at::Tensor& pos) const {
    return wte.index_select(0, tokens.reshape({-1})).view({tokens.size(0), tokens.size(1), -1}) +
           wpe.index_select(0, pos.reshape({-1})).view({pos.size(0), pos.size(1), -1});
  }

  at::Tensor Logits(const at::Tensor& hidden) const { return at::matmul(hidden, wte.t()); }

  // Host tensor → the model's device (ids, positions, states: small, once per call).
  at::Tensor ToDevice(const at::Tensor& host) const { return host.to(device); }
  // Device result → float32 host values.
  static std::vector<float> ToHost(const at::Tensor& t) {
    const at::Tensor h = t.to(at::kCPU).to(at::kFloat).contiguous();
    return std::vector<float>(h.data_ptr<float>(), h.data_ptr<float>() + h.numel());
  }

  // Every parameter to the device; weights in `dtype`, the TSSA parameters float32.
  void Place(const Placement& placement) {
    device = TorchDevice(placement);
    dtype = ComputeScalarType(placement.dtype);
    const auto move = [&](at::Tensor& t) {
      if (t.defined()) t = t.to(device, dtype).contiguous();
    };
    move(wte), move(wpe), move(ln_f.weight), move(ln_f.bias);
    for (Block& b : blocks) {
      for (at::Tensor* t :
           {&b.gamma1, &b.gamma2, &b.ln1.weight, &b.ln1.bias, &b.ln2.weight, &b.ln2.bias,
            &b.c_attn.weight, &b.c_attn.bias, &b.c_proj.weight, &b.c_proj.bias, &b.c_fc.weight,
            &b.c_fc.bias, &b.mlp_proj.weight, &b.mlp_proj.bias}) {
        move(*t);
      }
      b.temp = b.temp.to(device, at::kFloat).contiguous();
      b.denom_bias = b.denom_bias.to(device, at::kFloat).contiguous();
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
    if (s.position + new_tokens > c.context_length) {
      return absl::OutOfRangeError(
          absl::StrCat("model ", config.name, ": position ", s.position, " + ", new_tokens,
                       " token(s) exceeds the context length of ", c.context_length, " tokens"));
    }
    return absl::OkStatus();
  }

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
      return Linear{w.at(p + ".weight"), opt(p + ".bias")};
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

absl::StatusOr<std::vector<float>> LanguageModel::Prefill(absl::Span<const int32_t> tokens,
                                                          SequenceState& state,
                                                          int64_t chunk_tokens) const {
  const Impl& m = *impl_;
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", m.config.name, ": prefill needs at least one token"));
  }
  TOST_RETURN_IF_ERROR(m.CheckTokens(tokens));
  TOST_RETURN_IF_ERROR(m.CheckState(state, static_cast<int64_t>(tokens.size())));
  chunk_tokens = std::max<int64_t>(1, chunk_tokens);
  return GuardTorch(m.config.name, "prefill", [&]() {
    c10::InferenceMode inference;
    SequenceState* seqs[] = {&state};
    std::vector<at::Tensor> states = m.Gather(seqs);
    const int64_t total = static_cast<int64_t>(tokens.size());
    int64_t position = state.position;
    at::Tensor last_hidden;
    for (int64_t start = 0; start < total; start += chunk_tokens) {
      const int64_t n = std::min(chunk_tokens, total - start);
      const at::Tensor ids = m.ToDevice(
          at::tensor(std::vector<int64_t>(tokens.begin() + start, tokens.begin() + start + n))
              .view({1, n}));
      const at::Tensor pos =
          at::arange(position, position + n, at::TensorOptions(at::kLong).device(m.device))
              .view({1, n});
      const at::Tensor hidden = m.Sequence(m.Embed(ids, pos), pos.select(1, 0), &states);
      last_hidden = hidden.select(1, n - 1);
      position += n;
    }
    std::vector<float> logits = Impl::ToHost(m.Logits(last_hidden).reshape({-1}));
    m.Scatter(states, seqs);  // commit only after every chunk succeeded
    state.position = position;
    return logits;
  });
}

absl::StatusOr<std::vector<float>> LanguageModel::Step(absl::Span<const int32_t> tokens,
                                                       absl::Span<SequenceState* const> states,
                                                       bool batch_invariant) const {
  const Impl& m = *impl_;
  if (tokens.empty() || tokens.size() != states.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", m.config.name, ": step needs one token per sequence, got ",
                     tokens.size(), " tokens for ", states.size(), " sequences"));
  }
  TOST_RETURN_IF_ERROR(m.CheckTokens(tokens));
  for (SequenceState* s : states) TOST_RETURN_IF_ERROR(m.CheckState(*s, 1));
  return GuardTorch(m.config.name, "step", [&]() {
    c10::InferenceMode inference;
    const int64_t batch = static_cast<int64_t>(tokens.size());
    std::vector<at::Tensor> layer_states = m.Gather(states);
    std::vector<int64_t> pos_host;
    for (SequenceState* s : states) pos_host.push_back(s->position);
    const at::Tensor ids =
        m.ToDevice(at::tensor(std::vector<int64_t>(tokens.begin(), tokens.end())).view({batch, 1}));
    // Positions were range-checked on the host (CheckState): uploaded once, used by every layer.
    const at::Tensor pos = m.ToDevice(at::tensor(pos_host).view({batch, 1}));
    const at::Tensor x = m.Embed(ids, pos).squeeze(1);
    at::Tensor logits;
    if (batch_invariant && batch > 1) {
      std::vector<at::Tensor> rows;
      for (int64_t b = 0; b < batch; ++b) {
        std::vector<at::Tensor> row_states;
        for (const auto& s : layer_states)
          row_states.push_back(s.slice(0, b, b + 1));  // views: updated in place
        rows.push_back(m.Logits(
            m.StepHidden(x.slice(0, b, b + 1), pos.view({batch}).slice(0, b, b + 1), row_states)));
      }
      logits = at::cat(rows, 0);
    } else {
      logits = m.Logits(m.StepHidden(x, pos.view({batch}), layer_states));
    }
    std::vector<float> out = Impl::ToHost(logits);
    m.Scatter(layer_states, states);
    for (SequenceState* s : states) ++s->position;
    return out;
  });
}

absl::StatusOr<std::vector<float>> LanguageModel::ForwardAll(absl::Span<const int32_t> tokens,
                                                             int64_t batch, int64_t length) const {
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
  TOST_RETURN_IF_ERROR(m.CheckTokens(tokens));
  return GuardTorch(m.config.name, "forward", [&]() {
    c10::InferenceMode inference;
    const auto on_device = at::TensorOptions(at::kLong).device(m.device);
    const at::Tensor ids = m.ToDevice(
        at::tensor(std::vector<int64_t>(tokens.begin(), tokens.end())).view({batch, length}));
    const at::Tensor pos = at::arange(length, on_device).view({1, length}).expand({batch, length});
    return Impl::ToHost(
        m.Logits(m.Sequence(m.Embed(ids, pos), at::zeros({batch}, on_device), nullptr)));
  });
}

}  // namespace tost::model
