#include "model/nets/vision_model.h"

#include <cmath>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/conv2d.h>
#include <ATen/ops/floor_divide.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/stack.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/StreamGuard.h>

#include <optional>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/tssa_ops.h"
#include "model/config/tensor_list.h"
#include "model/nets/linear_layer.h"
#include "model/nets/model_stream.h"
#include "model/nets/torch_boundary.h"
#include "model/nets/torch_device.h"
#include "model/nets/weights.h"

namespace tost::model {
namespace {

constexpr double kBatchNormEps = 1e-5;
constexpr double kLayerNormEps = 1e-6;
constexpr int64_t kFourierHidden = 32;  // per axis; 64 channels into token_projection
constexpr double kFourierTemperature = 10000.0;

struct LayerNorm {
  at::Tensor weight, bias;
  at::Tensor operator()(const at::Tensor& x) const {
    return at::layer_norm(x, {weight.size(0)}, weight, bias, kLayerNormEps);
  }
};

struct Mlp {
  Linear fc1, fc2;
  at::Tensor operator()(const at::Tensor& x) const { return fc2(at::gelu(fc1(x))); }
};

struct TssaBlock {
  at::Tensor gamma1, gamma2, temp;
  LayerNorm norm1, norm2;
  Linear qkv, to_out;
  Mlp mlp;
};

struct ClassAttentionBlock {
  at::Tensor gamma1, gamma2;
  LayerNorm norm1, norm2;
  Linear qkv, proj;
  Mlp mlp;
};

struct StemStage {
  at::Tensor weight, bias;  // BatchNorm folded in
};

}  // namespace

struct VisionModel::Impl {
  ModelConfig config;
  at::Device device = at::kCPU;
  std::optional<c10::Stream> stream;  // CUDA: the model's own (model_stream.h)
  // Activations (and weights on CUDA; device.h); TSSA statistics are float32.
  at::ScalarType dtype = at::kFloat;
  std::vector<StemStage> stem;
  at::Tensor pos_encoding;  // [1, N, D] for the served resolution, projection applied
  at::Tensor cls_token;
  std::vector<TssaBlock> blocks;
  std::vector<ClassAttentionBlock> cls_blocks;
  LayerNorm norm;
  Linear head;
  int64_t weight_bytes = 0;  // every parameter as placed

  at::Tensor Stem(at::Tensor x) const {
    for (size_t i = 0; i < stem.size(); ++i) {
      x = at::conv2d(x, stem[i].weight, stem[i].bias, /*stride=*/2, /*padding=*/1);
      if (i + 1 < stem.size()) x = at::gelu(x);
    }
    return x;
  }

  at::Tensor Tssa(const TssaBlock& b, const at::Tensor& x,
                  std::vector<at::Tensor>* membership) const {
    const at::Tensor w = b.qkv(x);
    if (membership != nullptr) membership->push_back(Membership(b, w));
    return b.to_out(kernels::tssa(w, b.temp));
  }

  // Π of docs/model-semantics.md §1.1 steps 2-4 (what the fused op computes internally): [B, K, N].
  at::Tensor Membership(const TssaBlock& b, const at::Tensor& w_in) const {
    const int64_t batch = w_in.size(0), n = w_in.size(1), k = config.vision.num_heads;
    const at::Tensor w = w_in.to(at::kFloat).reshape({batch, n, k, -1});
    const at::Tensor nu = w.pow(2).sum(1, /*keepdim=*/true).sqrt().clamp_min(1e-12);
    const at::Tensor s = (w / nu).pow(2).sum(-1) * b.temp.view({1, 1, k});
    return at::softmax(s, 2).permute({0, 2, 1}).contiguous();
  }

  // CaiT/XCiT class attention: only the cls row queries; patch rows pass LN1's output through.
  at::Tensor ClassAttention(const ClassAttentionBlock& b, const at::Tensor& a) const {
    const int64_t batch = a.size(0), n = a.size(1), d = a.size(2), k = config.vision.num_heads,
                  p = d / k;
    const at::Tensor qkv = b.qkv(a).reshape({batch, n, 3, k, p}).permute({2, 0, 3, 1, 4});
    const at::Tensor q = qkv[0], key = qkv[1], v = qkv[2];  // [B,K,N,p]
    const at::Tensor qc = q.slice(2, 0, 1);
    const at::Tensor attn =
        at::softmax((qc * key).sum(-1) * (1.0 / std::sqrt(static_cast<double>(p))), -1);
    const at::Tensor cls = at::matmul(attn.unsqueeze(2), v).transpose(1, 2).reshape({batch, 1, d});
    return at::cat({b.proj(cls), a.slice(1, 1)}, 1);
  }

  // Every parameter to the device (dtypes as `dtype` says); the TSSA temperatures float32.
  void Place(const Placement& placement) {
    device = TorchDevice(placement);
    // On the CPU only the dense layers' weights take the reduced dtype (device.h); the stem's
    // convolutions, embeddings and norms are small and stay float32 with the activations.
    const at::ScalarType weight_dtype = ComputeScalarType(placement.dtype);
    dtype = placement.cuda ? weight_dtype : at::kFloat;
    const CpuProducts products = placement.CpuProductsUsed();
    stream = ModelStreamFor(device);
    const c10::OptionalStreamGuard on_stream(stream);  // the copies ordered before its kernels
    const auto move = [&](at::Tensor& t) {
      if (!t.defined()) return;
      t = t.to(device, dtype).contiguous();
      weight_bytes += t.nbytes();
    };
    const auto move_linear = [&](Linear& l) {
      l.Place(device, weight_dtype, products);
      weight_bytes += l.nbytes();
    };
    const auto move_norm = [&](LayerNorm& n) { move(n.weight), move(n.bias); };
    for (StemStage& s : stem) move(s.weight), move(s.bias);
    move(pos_encoding), move(cls_token);
    for (TssaBlock& b : blocks) {
      move(b.gamma1), move(b.gamma2);
      b.temp = b.temp.to(device, at::kFloat).contiguous();
      weight_bytes += b.temp.nbytes();
      move_norm(b.norm1), move_norm(b.norm2), move_linear(b.qkv), move_linear(b.to_out);
      move_linear(b.mlp.fc1), move_linear(b.mlp.fc2);
    }
    for (ClassAttentionBlock& b : cls_blocks) {
      move(b.gamma1), move(b.gamma2);
      move_norm(b.norm1), move_norm(b.norm2), move_linear(b.qkv), move_linear(b.proj);
      move_linear(b.mlp.fc1), move_linear(b.mlp.fc2);
    }
    move_norm(norm), move_linear(head);
  }

  // Host float32 pixels → the device, in the model's dtype. On a GPU the batch is staged through
  // pinned memory (one host copy, from the caching host allocator) and sent without blocking: the
  // forward's kernels queue behind the copy, and the host waits once, for the logits.
  at::Tensor Images(absl::Span<const float> pixels, int64_t batch, int64_t height,
                    int64_t width) const {
    const at::Tensor host = at::from_blob(const_cast<float*>(pixels.data()),
                                          {batch, config.vision.in_chans, height, width},
                                          at::TensorOptions().dtype(at::kFloat));
    if (!device.is_cuda()) return host.to(dtype);
    return host.pin_memory().to(device, /*non_blocking=*/true).to(dtype);
  }

  static std::vector<float> ToHost(const at::Tensor& t) {
    const at::Tensor h = t.to(at::kCPU).to(at::kFloat).contiguous();
    return std::vector<float>(h.data_ptr<float>(), h.data_ptr<float>() + h.numel());
  }

  // `membership`, when given, receives Π [B, K, N] of every TSSA layer.
  at::Tensor Forward(const at::Tensor& images,
                     std::vector<at::Tensor>* membership = nullptr) const {
    at::Tensor x = Stem(images);
    x = x.flatten(2).transpose(1, 2) + pos_encoding;  // [B, N, D]
    for (const auto& b : blocks) {
      x = x + b.gamma1 * Tssa(b, b.norm1(x), membership);
      x = x + b.gamma2 * b.mlp(b.norm2(x));
    }
    x = at::cat({cls_token.expand({x.size(0), -1, -1}), x}, 1);
    for (const auto& b : cls_blocks) {
      x = x + b.gamma1 * ClassAttention(b, b.norm1(x));
      x = b.norm2(x);  // tokens_norm=True: all tokens
      const at::Tensor cls = b.gamma2 * b.mlp(x.slice(1, 0, 1));
      x = x + at::cat({cls, x.slice(1, 1)}, 1);  // patch rows become 2·LN2(x)
    }
    return head(norm(x).select(1, 0));
  }
};

namespace {

// XCiT's PositionalEncodingFourier for an hp×wp grid, before the 1×1 projection: [64, hp, wp].
at::Tensor FourierFeatures(int64_t hp, int64_t wp) {
  constexpr double kEps = 1e-6, kScale = 2 * M_PI;
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor y =
      at::arange(1, hp + 1, f32).div(hp + kEps).mul(kScale).view({hp, 1}).expand({hp, wp});
  const at::Tensor x =
      at::arange(1, wp + 1, f32).div(wp + kEps).mul(kScale).view({1, wp}).expand({hp, wp});
  const at::Tensor i = at::arange(kFourierHidden, f32);
  const at::Tensor dim_t =
      at::pow(kFourierTemperature, at::floor_divide(i, 2).mul(2.0 / kFourierHidden));
  auto encode = [&](const at::Tensor& pos) {
    const at::Tensor a = pos.unsqueeze(-1) / dim_t;  // [hp, wp, 32]
    // interleave: sin at even channels, cos at odd channels
    return at::stack(
               {a.slice(-1, 0, kFourierHidden, 2).sin(), a.slice(-1, 1, kFourierHidden, 2).cos()},
               -1)
        .flatten(-2);
  };
  return at::cat({encode(y), encode(x)}, -1).permute({2, 0, 1}).contiguous();
}

}  // namespace

int64_t VisionModel::ForwardMinBytes(int64_t images) const {
  const Impl& m = *impl_;
  const VisionConfig& v = m.config.vision;
  const int64_t pixels = images * v.in_chans * v.image_height * v.image_width;
  return m.weight_bytes + static_cast<int64_t>(sizeof(float)) * (pixels + images * v.num_classes);
}

VisionModel::VisionModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
VisionModel::~VisionModel() = default;
const ModelConfig& VisionModel::config() const { return impl_->config; }

absl::StatusOr<std::unique_ptr<VisionModel>> VisionModel::Load(const std::string& model_dir,
                                                               const ModelConfig& config,
                                                               const Placement& placement) {
  if (config.architecture != Architecture::kVision) {
    return absl::InvalidArgumentError(absl::StrCat("model ", config.name, ": architecture is ",
                                                   ArchitectureName(config.architecture),
                                                   ", expected tost_vision"));
  }
  TOST_ASSIGN_OR_RETURN(SafetensorsFile file,
                        SafetensorsFile::Open(model_dir + "/model.safetensors"));
  const VisionConfig& c = config.vision;
  TOST_ASSIGN_OR_RETURN(Weights w, Weights::FromFile(file, VisionTensorList(c), config.dtype));
  return GuardTorch(config.name, "load", [&]() -> std::unique_ptr<VisionModel> {
    c10::InferenceMode inference;
    auto impl = std::make_unique<Impl>();
    impl->config = config;
    for (int64_t i = 0; i < c.stem_stages(); ++i) {
      const std::string p = absl::StrCat("patch_embed.proj.", 2 * i, ".");
      const at::Tensor scale =
          w.at(p + "1.weight") / at::sqrt(w.at(p + "1.running_var") + kBatchNormEps);
      impl->stem.push_back({w.at(p + "0.weight") * scale.view({-1, 1, 1, 1}),
                            w.at(p + "1.bias") - w.at(p + "1.running_mean") * scale});
    }
    int64_t hp = c.image_height, wp = c.image_width;
    for (int64_t i = 0; i < c.stem_stages(); ++i) hp = (hp + 1) / 2, wp = (wp + 1) / 2;
    impl->pos_encoding = at::conv2d(FourierFeatures(hp, wp).unsqueeze(0),
                                    w.at("pos_embeder.token_projection.weight"),
                                    w.at("pos_embeder.token_projection.bias"))
                             .flatten(2)
                             .transpose(1, 2)
                             .contiguous();
    impl->cls_token = w.at("cls_token");
    auto linear = [&](const std::string& p) {
      return Linear(w.at(p + ".weight"), w.at(p + ".bias"));
    };
    auto layer_norm = [&](const std::string& p) {
      return LayerNorm{w.at(p + ".weight"), w.at(p + ".bias")};
    };
    for (int64_t l = 0; l < c.depth; ++l) {
      const std::string p = absl::StrCat("blocks.", l, ".");
      impl->blocks.push_back(
          {w.at(p + "gamma1"), w.at(p + "gamma2"), w.at(p + "attn.temp").view({-1}),
           layer_norm(p + "norm1"), layer_norm(p + "norm2"), linear(p + "attn.qkv"),
           linear(p + "attn.to_out.0"), Mlp{linear(p + "mlp.fc1"), linear(p + "mlp.fc2")}});
    }
    for (int64_t l = 0; l < c.cls_attn_layers; ++l) {
      const std::string p = absl::StrCat("cls_attn_blocks.", l, ".");
      impl->cls_blocks.push_back({w.at(p + "gamma1"), w.at(p + "gamma2"), layer_norm(p + "norm1"),
                                  layer_norm(p + "norm2"), linear(p + "attn.qkv"),
                                  linear(p + "attn.proj"),
                                  Mlp{linear(p + "mlp.fc1"), linear(p + "mlp.fc2")}});
    }
    impl->norm = layer_norm("norm");
    impl->head = linear("head");
    impl->Place(placement);
    return std::unique_ptr<VisionModel>(new VisionModel(std::move(impl)));
  });
}

absl::StatusOr<std::vector<float>> VisionModel::Forward(absl::Span<const float> pixels,
                                                        int64_t batch, int64_t height,
                                                        int64_t width) const {
  TOST_RETURN_IF_ERROR(CheckInput(pixels, batch, height, width));
  return GuardTorch(impl_->config.name, "forward", [&]() {
    c10::InferenceMode inference;
    const c10::OptionalStreamGuard on_stream(impl_->stream);
    return Impl::ToHost(impl_->Forward(impl_->Images(pixels, batch, height, width)));
  });
}

absl::StatusOr<VisionModel::Explained> VisionModel::ForwardWithMembership(
    absl::Span<const float> pixels, int64_t batch, int64_t height, int64_t width) const {
  TOST_RETURN_IF_ERROR(CheckInput(pixels, batch, height, width));
  return GuardTorch(impl_->config.name, "forward", [&]() {
    c10::InferenceMode inference;
    const c10::OptionalStreamGuard on_stream(impl_->stream);
    const VisionConfig& c = impl_->config.vision;
    std::vector<at::Tensor> layers;
    const at::Tensor logits = impl_->Forward(impl_->Images(pixels, batch, height, width), &layers);
    Explained out;
    out.logits = Impl::ToHost(logits);
    out.membership = Impl::ToHost(at::stack(layers, 1));  // [B, depth, K, N]
    out.grid_h = height, out.grid_w = width;
    for (int64_t i = 0; i < c.stem_stages(); ++i)
      out.grid_h = (out.grid_h + 1) / 2, out.grid_w = (out.grid_w + 1) / 2;
    return out;
  });
}

absl::Status VisionModel::CheckInput(absl::Span<const float> pixels, int64_t batch, int64_t height,
                                     int64_t width) const {
  const VisionConfig& c = impl_->config.vision;
  if (batch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", impl_->config.name, ": batch must be >= 1, got ", batch));
  }
  if (height != c.image_height || width != c.image_width) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", impl_->config.name, ": expected images of ", c.image_height, "x",
                     c.image_width, " (HxW), got ", height, "x", width));
  }
  const int64_t expected = batch * c.in_chans * height * width;
  if (static_cast<int64_t>(pixels.size()) != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", impl_->config.name, ": expected ", expected, " floats for [", batch,
                     ",", c.in_chans, ",", height, ",", width, "], got ", pixels.size()));
  }
  return absl::OkStatus();
}

}  // namespace tost::model
