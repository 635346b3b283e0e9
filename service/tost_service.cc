#include "service/tost_service.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/sampler.h"
#include "model/status_macros.h"
#include "model/tokenizer.h"
#include "service/grpc_status.h"
#include "service/request_deadline.h"

namespace tost::service {
namespace {

struct ImageBatch {
  std::vector<float> pixels;
  int64_t batch = 0, height = 0, width = 0;
};

// Validates the tensor's shape against the model and the limits before touching its values.
absl::StatusOr<ImageBatch> DecodeImageTensor(const tost::v1::FloatTensor& t,
                                             const model::ModelConfig& cfg,
                                             const ServiceLimits& limits) {
  const model::VisionConfig& v = cfg.vision;
  const auto& shape = t.shape();
  if (shape.size() != 3 && shape.size() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", cfg.name, ": tensor.shape must be [C,H,W] or [B,C,H,W], got [",
                     absl::StrJoin(shape, ","), "]"));
  }
  ImageBatch out;
  out.batch = shape.size() == 4 ? shape[0] : 1;
  const int64_t c = shape[shape.size() - 3];
  out.height = shape[shape.size() - 2];
  out.width = shape[shape.size() - 1];
  for (int64_t d : shape) {
    if (d <= 0)
      return absl::InvalidArgumentError(absl::StrCat("model ", cfg.name,
                                                     ": tensor.shape dimensions must be > 0, got [",
                                                     absl::StrJoin(shape, ","), "]"));
  }
  if (out.batch > limits.max_batch_size) {
    return absl::InvalidArgumentError(absl::StrCat("model ", cfg.name, ": batch of ", out.batch,
                                                   " images exceeds the per-request limit of ",
                                                   limits.max_batch_size));
  }
  if (c != v.in_chans || out.height != v.image_height || out.width != v.image_width) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", cfg.name, ": expected images of shape [C=", v.in_chans, ",H=", v.image_height,
        ",W=", v.image_width, "], got [C=", c, ",H=", out.height, ",W=", out.width, "]"));
  }
  const int64_t elements = out.batch * c * out.height * out.width;
  if (elements > limits.max_tensor_elements) {
    return absl::InvalidArgumentError(absl::StrCat("model ", cfg.name, ": tensor of ", elements,
                                                   " elements exceeds the limit of ",
                                                   limits.max_tensor_elements));
  }
  if (!t.raw().empty() && t.data_size() > 0) {
    return absl::InvalidArgumentError("tensor: set either data or raw, not both");
  }
  if (!t.raw().empty()) {
    if (static_cast<int64_t>(t.raw().size()) != elements * 4) {
      return absl::InvalidArgumentError(absl::StrCat("model ", cfg.name, ": tensor.raw holds ",
                                                     t.raw().size(), " bytes, shape needs ",
                                                     elements * 4, " (float32)"));
    }
    out.pixels.resize(elements);
    std::memcpy(out.pixels.data(), t.raw().data(), t.raw().size());
  } else {
    if (t.data_size() != elements) {
      return absl::InvalidArgumentError(absl::StrCat("model ", cfg.name, ": tensor.data holds ",
                                                     t.data_size(), " values, shape needs ",
                                                     elements));
    }
    out.pixels.assign(t.data().begin(), t.data().end());
  }
  for (float x : out.pixels) {
    if (!std::isfinite(x))
      return absl::InvalidArgumentError(
          absl::StrCat("model ", cfg.name, ": tensor holds NaN or infinite values"));
  }
  return out;
}

// ClassifyRequest.images: encoded PNG/JPEG, each decoded and preprocessed to the model's resolution
// (service/image_decode.h), so they batch together. Counts are checked before any decoding.
absl::StatusOr<ImageBatch> DecodeEncodedImages(const tost::v1::ClassifyRequest& req,
                                               const model::ModelConfig& cfg,
                                               const ServiceLimits& limits) {
  if (req.has_tensor()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", cfg.name, ": set either tensor or images, not both"));
  }
  const model::VisionConfig& v = cfg.vision;
  ImageBatch out;
  out.batch = req.images_size();
  out.height = v.image_height;
  out.width = v.image_width;
  if (out.batch > limits.max_batch_size) {
    return absl::InvalidArgumentError(absl::StrCat("model ", cfg.name, ": images holds ", out.batch,
                                                   " images, more than the per-request limit of ",
                                                   limits.max_batch_size));
  }
  const int64_t per_image = v.in_chans * v.image_height * v.image_width;
  if (out.batch * per_image > limits.max_tensor_elements) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", cfg.name, ": ", out.batch, " images of ", per_image,
                     " values exceed the limit of ", limits.max_tensor_elements, " elements"));
  }
  out.pixels.reserve(static_cast<size_t>(out.batch * per_image));
  for (int i = 0; i < req.images_size(); ++i) {
    TOST_ASSIGN_OR_RETURN(
        std::vector<float> one,
        DecodeAndPreprocess(req.images(i), v, limits.image,
                            absl::StrCat("model ", cfg.name, ": images[", i, "]")));
    out.pixels.insert(out.pixels.end(), one.begin(), one.end());
  }
  return out;
}

void TopK(const float* logits, int64_t n, int32_t k, const std::vector<std::string>& labels,
          tost::v1::Classification* out) {
  const float max_logit = *std::max_element(logits, logits + n);
  std::vector<double> probs(n);
  double total = 0;
  for (int64_t i = 0; i < n; ++i)
    total += probs[i] = std::exp(static_cast<double>(logits[i]) - max_logit);
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
  });
  for (int32_t i = 0; i < k; ++i) {
    auto* label = out->add_labels();
    label->set_index(order[i]);
    label->set_label(labels[order[i]]);
    label->set_probability(static_cast<float>(probs[order[i]] / total));
  }
}

}  // namespace

grpc::Status TostService::Classify(grpc::ServerContext* context,
                                   const tost::v1::ClassifyRequest* request,
                                   tost::v1::ClassifyResponse* response) {
  auto run = [&]() -> absl::Status {
    TOST_RETURN_IF_ERROR(core_.auth.Identify(*context).status());
    TOST_ASSIGN_OR_RETURN(const model::VisionModel* vm, registry_.Vision(request->model()));
    const model::ModelConfig& cfg = vm->config();
    if (request->top_k() < 0)
      return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", request->top_k()));
    const int32_t k = static_cast<int32_t>(
        std::min<int64_t>(request->top_k() == 0 ? limits_.default_top_k_labels : request->top_k(),
                          cfg.vision.num_classes));
    // Admission before decoding: a full queue costs the server nothing.
    const int64_t requested = request->images_size() > 0            ? request->images_size()
                              : request->tensor().shape_size() == 4 ? request->tensor().shape(0)
                                                                    : 1;
    if (requested < 1 || requested > limits_.max_batch_size) {
      return absl::InvalidArgumentError(absl::StrCat("model ", cfg.name, ": a request holds 1 to ",
                                                     limits_.max_batch_size, " images, got ",
                                                     requested));
    }
    TOST_ASSIGN_OR_RETURN(DynamicBatcher::Slot slot,
                          core_.ReserveClassification(cfg.name, requested));
    TOST_ASSIGN_OR_RETURN(ImageBatch images,
                          request->images_size() > 0
                              ? DecodeEncodedImages(*request, cfg, limits_)
                              : DecodeImageTensor(request->tensor(), cfg, limits_));
    const absl::Time deadline = RequestDeadline(*context);
    std::vector<float> logits;
    model::VisionModel::Explained explained;
    if (request->return_membership()) {
      // Diagnostic requests run on their own (the batcher carries logits rows only).
      TOST_ASSIGN_OR_RETURN(explained, vm->ForwardWithMembership(images.pixels, images.batch,
                                                                 images.height, images.width));
      logits = std::move(explained.logits);
    } else {
      TOST_ASSIGN_OR_RETURN(
          logits, core_.Classify(cfg.name, std::move(slot), std::move(images.pixels), images.batch,
                                 deadline));
    }
    response->set_model(cfg.name);
    const int64_t n = cfg.vision.num_classes;
    const int64_t depth = cfg.vision.depth, heads = cfg.vision.num_heads;
    const int64_t tokens = explained.grid_h * explained.grid_w;
    for (int64_t b = 0; b < images.batch; ++b) {
      tost::v1::Classification* result = response->add_results();
      TopK(logits.data() + b * n, n, k, cfg.vision.labels, result);
      for (int64_t l = 0; l < depth && !explained.membership.empty(); ++l) {
        auto* map = result->add_membership();
        map->set_layer(static_cast<int32_t>(l));
        map->set_heads(static_cast<int32_t>(heads));
        map->set_grid_height(static_cast<int32_t>(explained.grid_h));
        map->set_grid_width(static_cast<int32_t>(explained.grid_w));
        const float* first = explained.membership.data() + (b * depth + l) * heads * tokens;
        map->mutable_values()->Add(first, first + heads * tokens);
      }
    }
    return absl::OkStatus();
  };
  return ToGrpcStatus(run());
}

namespace {

void FillModelStatus(const model::LoadedModel& m, tost::v1::ModelStatus* s) {
  s->set_name(m.name);
  s->set_version(m.config.version);
  s->set_ready(m.status.ok());
  s->set_error(std::string(m.status.message()));
  s->set_trained(m.config.trained);
  s->set_provenance_json(m.config.provenance_json);
  if (!m.status.ok() && m.config.name.empty()) return;  // config itself unreadable
  s->set_architecture(model::ArchitectureName(m.config.architecture));
  if (m.config.architecture == model::Architecture::kVision) {
    s->add_input_shape(m.config.vision.in_chans);
    s->add_input_shape(m.config.vision.image_height);
    s->add_input_shape(m.config.vision.image_width);
    s->set_num_classes(m.config.vision.num_classes);
  } else {
    s->set_context_length(m.config.language.context_length);
    s->set_vocab_size(m.config.language.vocab_size);
    s->set_tokenizer(m.config.language.tokenizer);
    s->set_eos_token_id(m.config.language.eos_token_id);
  }
}

}  // namespace

grpc::Status TostService::ListModels(grpc::ServerContext* context,
                                     const tost::v1::ListModelsRequest*,
                                     tost::v1::ListModelsResponse* response) {
  if (auto who = core_.auth.Identify(*context); !who.ok()) return ToGrpcStatus(who.status());
  for (const auto& m : registry_.models()) FillModelStatus(m, response->add_models());
  return grpc::Status::OK;
}

grpc::Status TostService::ModelInfo(grpc::ServerContext* context,
                                    const tost::v1::ModelInfoRequest* request,
                                    tost::v1::ModelStatus* response) {
  if (auto who = core_.auth.Identify(*context); !who.ok()) return ToGrpcStatus(who.status());
  for (const auto& m : registry_.models()) {
    if (m.name == request->model()) {
      FillModelStatus(m, response);
      return grpc::Status::OK;
    }
  }
  return ToGrpcStatus(absl::NotFoundError(
      absl::StrCat("model \"", request->model(), "\" is not in the repository")));
}

grpc::Status TostService::ServerStatus(grpc::ServerContext* context,
                                       const tost::v1::ServerStatusRequest*,
                                       tost::v1::ServerStatusResponse* response) {
  if (auto who = core_.auth.Identify(*context); !who.ok()) return ToGrpcStatus(who.status());
  response->set_draining(core_.draining.load());
  for (const auto& [name, scheduler] : core_.schedulers) {
    const GenerationSchedulerStats st = scheduler->stats();
    auto* g = response->add_generators();
    g->set_model(name);
    g->set_active(st.active);
    g->set_queued(st.queued);
    g->set_free_slots(std::max(0, scheduler->options().max_active_jobs - st.active));
    g->set_state_bytes_per_session(static_cast<int64_t>(scheduler->NewState({}).ByteSize()));
    g->set_decode_steps(st.decode_steps);
    g->set_decoded_tokens(st.decoded_tokens);
    g->set_max_decode_batch(st.max_decode_batch);
  }
  const SessionStoreStats ss = core_.sessions.stats();
  response->set_sessions(ss.sessions);
  response->set_session_state_bytes(ss.state_bytes);
  response->set_session_budget_bytes(core_.sessions.options().max_state_bytes);
  response->set_session_budget_headroom_bytes(core_.sessions.options().max_state_bytes -
                                              ss.state_bytes);
  response->set_max_sessions(core_.sessions.options().max_sessions);
  return grpc::Status::OK;
}

}  // namespace tost::service
