#include "model/config/tensor_list.h"

#include "absl/strings/str_cat.h"

namespace tost::model {
namespace {

constexpr int64_t kFourierHidden = 32;  // per axis; 64 channels into pos_embeder.token_projection

}  // namespace

std::vector<ExpectedTensor> VisionTensorList(const VisionConfig& c) {
  const int64_t d = c.embed_dim, k = c.num_heads, hidden = c.mlp_ratio * c.embed_dim;
  std::vector<ExpectedTensor> t;
  t.push_back({"cls_token", {1, 1, d}});
  const int64_t stages = c.stem_stages();
  int64_t in = c.in_chans;
  for (int64_t i = 0; i < stages; ++i) {
    const int64_t out = d >> (stages - 1 - i);
    const std::string p = absl::StrCat("patch_embed.proj.", 2 * i, ".");
    t.push_back({p + "0.weight", {out, in, 3, 3}});
    for (const char* bn : {"weight", "bias", "running_mean", "running_var"})
      t.push_back({p + "1." + bn, {out}});
    t.push_back({p + "1.num_batches_tracked", {}, /*optional=*/true, /*integer=*/true});
    in = out;
  }
  t.push_back({"pos_embeder.token_projection.weight", {d, 2 * kFourierHidden, 1, 1}});
  t.push_back({"pos_embeder.token_projection.bias", {d}});
  auto add_common = [&](const std::string& p) {
    for (const char* n :
         {"gamma1", "gamma2", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"}) {
      t.push_back({p + n, {d}});
    }
    t.push_back({p + "mlp.fc1.weight", {hidden, d}});
    t.push_back({p + "mlp.fc1.bias", {hidden}});
    t.push_back({p + "mlp.fc2.weight", {d, hidden}});
    t.push_back({p + "mlp.fc2.bias", {d}});
  };
  for (int64_t l = 0; l < c.depth; ++l) {
    const std::string p = absl::StrCat("blocks.", l, ".");
    add_common(p);
    t.push_back({p + "attn.temp", {k, 1}});
    t.push_back({p + "attn.qkv.weight", {d, d}});
    t.push_back({p + "attn.qkv.bias", {d}});
    t.push_back({p + "attn.to_out.0.weight", {d, d}});
    t.push_back({p + "attn.to_out.0.bias", {d}});
  }
  for (int64_t l = 0; l < c.cls_attn_layers; ++l) {
    const std::string p = absl::StrCat("cls_attn_blocks.", l, ".");
    add_common(p);
    t.push_back({p + "attn.qkv.weight", {3 * d, d}});
    t.push_back({p + "attn.qkv.bias", {3 * d}});
    t.push_back({p + "attn.proj.weight", {d, d}});
    t.push_back({p + "attn.proj.bias", {d}});
  }
  t.push_back({"norm.weight", {d}});
  t.push_back({"norm.bias", {d}});
  t.push_back({"head.weight", {c.num_classes, d}});
  t.push_back({"head.bias", {c.num_classes}});
  return t;
}

std::vector<ExpectedTensor> LanguageTensorList(const LanguageConfig& c) {
  const int64_t d = c.n_embd, k = c.n_head, hidden = c.mlp_ratio * c.n_embd, t = c.context_length;
  std::vector<ExpectedTensor> list;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    list.push_back({name, std::move(shape)});
  };
  auto add_bias = [&](const std::string& name, int64_t n) {
    if (c.bias) add(name, {n});
  };
  add("transformer.wte.weight", {c.vocab_size, d});
  add("transformer.wpe.weight", {t, d});
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = absl::StrCat("transformer.h.", l, ".");
    add(p + "gamma1", {d});
    add(p + "gamma2", {d});
    add(p + "ln_1.weight", {d});
    add_bias(p + "ln_1.bias", d);
    add(p + "ln_2.weight", {d});
    add_bias(p + "ln_2.bias", d);
    add(p + "attn.temp", {k, 1});
    add(p + "attn.denom_bias", {k, t, 1});
    add(p + "attn.c_attn.weight", {d, d});
    add_bias(p + "attn.c_attn.bias", d);
    add(p + "attn.c_proj.weight", {d, d});
    add_bias(p + "attn.c_proj.bias", d);
    add(p + "mlp.c_fc.weight", {hidden, d});
    add_bias(p + "mlp.c_fc.bias", hidden);
    add(p + "mlp.c_proj.weight", {d, hidden});
    add_bias(p + "mlp.c_proj.bias", d);
  }
  add("transformer.ln_f.weight", {d});
  add_bias("transformer.ln_f.bias", d);
  list.push_back({"lm_head.weight", {c.vocab_size, d}, /*optional=*/true});
  return list;
}

}  // namespace tost::model
