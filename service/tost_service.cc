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

namespace tost::service {
namespace {

struct ImageBatch {
  std::vector<float> pixels;
  int64_t batch = 0, height = 0, width = 0;
};

// Validates the tensor's shape against the model and the limits before touching its values.
absl::StatusOr<ImageBatch> DecodeImageTensor(const tost::v1::FloatTensor& t, const model::ModelConfig& cfg,
                                             const ServiceLimits& limits) {
  const model::VisionConfig& v = cfg.vision;
  const auto& shape = t.shape();
  if (shape.size() != 3 && shape.size() != 4) {
    return absl::InvalidArgumentError(absl::StrCat("model ", cfg.name, ": tensor.shape must be [C,H,W] or [B,C,H,W], got [",
                                                   absl::StrJoin(shape, ","), "]"));
  }
  ImageBatch out;
  out.batch = shape.size() == 4 ? shape[0] : 1;
  const int64_t c = shape[shape.size() - 3];
  out.height = shape[shape.size() - 2];
  out.width = shape[shape.size() - 1];
  for (int64_t d : shape) {
    if (d <= 0) return absl::InvalidArgumentError(absl::StrCat("model ", cfg.name, ": tensor.shape dimensions must be > 0, got [", absl::StrJoin(shape, ","), "]"));
  }
  if (out.batch > limits.max_batch_size) {
    return absl::InvalidArgumentError(absl::StrCat("model ", cfg.name, ": batch of ", out.batch,
                                                   " images exceeds the per-request limit of ", limits.max_batch_size));
  }
  if (c != v.in_chans || out.height != v.image_height || out.width != v.image_width) {
    return absl::InvalidArgumentError(absl::StrCat("model ", cfg.name, ": expected images of shape [C=", v.in_chans,
                                                   ",H=", v.image_height, ",W=", v.image_width, "], got [C=", c,
                                                   ",H=", out.height, ",W=", out.width, "]"));
  }
  const int64_t elements = out.batch * c * out.height * out.width;
  if (elements > limits.max_tensor_elements) {
    return absl::InvalidArgumentError(absl::StrCat("model ", cfg.name, ": tensor of ", elements,
                                                   " elements exceeds the limit of ", limits.max_tensor_elements));
  }
  if (!t.raw().empty() && t.data_size() > 0) {
    return absl::InvalidArgumentError("tensor: set either data or raw, not both");
  }
  if (!t.raw().empty()) {
    if (static_cast<int64_t>(t.raw().size()) != elements * 4) {
      return absl::InvalidArgumentError(absl::StrCat("model ", cfg.name, ": tensor.raw holds ", t.raw().size(),
                                                     " bytes, shape needs ", elements * 4, " (float32)"));
    }
    out.pixels.resize(elements);
    std::memcpy(out.pixels.data(), t.raw().data(), t.raw().size());
  } else {
    if (t.data_size() != elements) {
      return absl::InvalidArgumentError(absl::StrCat("model ", cfg.name, ": tensor.data holds ", t.data_size(),
                                                     " values, shape needs ", elements));
    }
    out.pixels.assign(t.data().begin(), t.data().end());
  }
  for (float x : out.pixels) {
    if (!std::isfinite(x)) return absl::InvalidArgumentError(absl::StrCat("model ", cfg.name, ": tensor holds NaN or infinite values"));
  }
  return out;
}

void TopK(const float* logits, int64_t n, int32_t k, const std::vector<std::string>& labels,
          tost::v1::Classification* out) {
  const float max_logit = *std::max_element(logits, logits + n);
  std::vector<double> probs(n);
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += probs[i] = std::exp(static_cast<double>(logits[i]) - max_logit);
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); });
  for (int32_t i = 0; i < k; ++i) {
    auto* label = out->add_labels();
    label->set_index(order[i]);
    label->set_label(labels[order[i]]);
    label->set_probability(static_cast<float>(probs[order[i]] / total));
  }
}

absl::StatusOr<std::vector<int32_t>> PromptTokens(const tost::v1::GenerateRequest& req, const model::LanguageModel& lm,
                                                  const ServiceLimits& limits) {
  const model::LanguageConfig& c = lm.config().language;
  std::vector<int32_t> tokens;
  if (req.has_prompt_tokens()) {
    tokens.assign(req.prompt_tokens().ids().begin(), req.prompt_tokens().ids().end());
  } else {
    if (static_cast<int64_t>(req.prompt_bytes().size()) > limits.max_prompt_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("prompt_bytes holds ", req.prompt_bytes().size(),
                                                     " bytes, more than the limit of ", limits.max_prompt_bytes));
    }
    tokens = model::ByteTokenizer(c.vocab_size, c.eos_token_id).Encode(req.prompt_bytes());
  }
  if (tokens.empty()) return absl::InvalidArgumentError("prompt is empty: send prompt_bytes or prompt_tokens");
  if (static_cast<int64_t>(tokens.size()) > limits.max_prompt_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_tokens holds ", tokens.size(),
                                                   " ids, more than the limit of ", limits.max_prompt_bytes));
  }
  if (static_cast<int64_t>(tokens.size()) > c.context_length) {
    return absl::OutOfRangeError(absl::StrCat("model ", lm.config().name, ": prompt of ", tokens.size(),
                                              " tokens exceeds the context length of ", c.context_length, " tokens"));
  }
  return tokens;
}

}  // namespace

grpc::Status TostService::Classify(grpc::ServerContext*, const tost::v1::ClassifyRequest* request,
                                   tost::v1::ClassifyResponse* response) {
  auto run = [&]() -> absl::Status {
    TOST_ASSIGN_OR_RETURN(const model::VisionModel* vm, registry_.Vision(request->model()));
    const model::ModelConfig& cfg = vm->config();
    if (request->top_k() < 0) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", request->top_k()));
    const int32_t k = static_cast<int32_t>(std::min<int64_t>(
        request->top_k() == 0 ? limits_.default_top_k_labels : request->top_k(), cfg.vision.num_classes));
    TOST_ASSIGN_OR_RETURN(ImageBatch images, DecodeImageTensor(request->tensor(), cfg, limits_));
    TOST_ASSIGN_OR_RETURN(std::vector<float> logits,
                          vm->Forward(images.pixels, images.batch, images.height, images.width));
    response->set_model(cfg.name);
    const int64_t n = cfg.vision.num_classes;
    for (int64_t b = 0; b < images.batch; ++b) TopK(logits.data() + b * n, n, k, cfg.vision.labels, response->add_results());
    return absl::OkStatus();
  };
  return ToGrpcStatus(run());
}

grpc::Status TostService::Generate(grpc::ServerContext* context, const tost::v1::GenerateRequest* request,
                                   grpc::ServerWriter<tost::v1::GenerateResponse>* writer) {
  auto run = [&]() -> absl::Status {
    TOST_ASSIGN_OR_RETURN(const model::LanguageModel* lm, registry_.Language(request->model()));
    const model::LanguageConfig& c = lm->config().language;
    const int32_t max_new = request->max_new_tokens() == 0 ? limits_.default_max_new_tokens : request->max_new_tokens();
    if (max_new < 0 || max_new > limits_.max_new_tokens) {
      return absl::InvalidArgumentError(absl::StrCat("max_new_tokens must be in [0, ", limits_.max_new_tokens,
                                                     "], got ", request->max_new_tokens()));
    }
    model::SamplingParams params;
    params.temperature = request->sampling().temperature();
    params.top_k = request->sampling().top_k();
    params.top_p = request->sampling().top_p() == 0.f ? 1.f : request->sampling().top_p();
    params.seed = request->sampling().seed();
    TOST_RETURN_IF_ERROR(model::ValidateSamplingParams(params));
    TOST_ASSIGN_OR_RETURN(std::vector<int32_t> prompt, PromptTokens(*request, *lm, limits_));

    model::SequenceState state = lm->NewSequence();
    TOST_ASSIGN_OR_RETURN(std::vector<float> logits, lm->Prefill(prompt, state));
    const model::ByteTokenizer tokenizer(c.vocab_size, c.eos_token_id);
    model::Utf8Assembler utf8;
    tost::v1::FinishReason finish = tost::v1::FINISH_REASON_LENGTH;
    int32_t generated = 0;
    while (generated < max_new) {
      if (context->IsCancelled()) return absl::CancelledError("client cancelled the Generate stream");
      const int32_t token = model::SampleToken(logits, params, static_cast<uint64_t>(state.position));
      ++generated;
      tost::v1::GenerateResponse msg;
      auto* t = msg.mutable_token();
      t->set_id(token);
      t->set_position(state.position);
      const std::string bytes = tokenizer.TokenBytes(token);
      t->set_bytes(bytes);
      t->set_text(utf8.Push(bytes));
      if (!writer->Write(msg)) return absl::CancelledError("client went away during Generate");
      if (token == c.eos_token_id) {
        finish = tost::v1::FINISH_REASON_EOS;
        break;
      }
      if (generated == max_new) break;
      if (state.position >= c.context_length) {
        finish = tost::v1::FINISH_REASON_CONTEXT;
        break;
      }
      model::SequenceState* seqs[] = {&state};
      TOST_ASSIGN_OR_RETURN(logits, lm->Step(absl::MakeConstSpan(&token, 1), seqs));
    }
    tost::v1::GenerateResponse final_msg;
    auto* f = final_msg.mutable_final();
    f->set_finish_reason(finish);
    f->set_prompt_tokens(static_cast<int32_t>(prompt.size()));
    f->set_generated_tokens(generated);
    f->set_text(utf8.Flush());
    writer->Write(final_msg);
    return absl::OkStatus();
  };
  return ToGrpcStatus(run());
}

grpc::Status TostService::ListModels(grpc::ServerContext*, const tost::v1::ListModelsRequest*,
                                     tost::v1::ListModelsResponse* response) {
  for (const auto& m : registry_.models()) {
    auto* s = response->add_models();
    s->set_name(m.name);
    s->set_version(m.config.version);
    s->set_ready(m.status.ok());
    s->set_error(std::string(m.status.message()));
    s->set_trained(m.config.trained);
    s->set_provenance_json(m.config.provenance_json);
    if (!m.status.ok() && m.config.name.empty()) continue;  // config itself unreadable
    s->set_architecture(model::ArchitectureName(m.config.architecture));
    if (m.config.architecture == model::Architecture::kVision) {
      s->add_input_shape(m.config.vision.in_chans);
      s->add_input_shape(m.config.vision.image_height);
      s->add_input_shape(m.config.vision.image_width);
      s->set_num_classes(m.config.vision.num_classes);
    } else {
      s->set_context_length(m.config.language.context_length);
      s->set_vocab_size(m.config.language.vocab_size);
    }
  }
  return grpc::Status::OK;
}

}  // namespace tost::service
