// tost.v1.Tost: Classify and the model and server RPCs (Generate and the session RPCs live in
// generate_reactor.cc and session_handlers.cc).
#include "service/api/tost_service.h"

#include <utility>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "service/api/classify_tensor_view.h"
#include "service/api/grpc_status.h"
#include "service/api/request_deadline.h"
#include "service/api/request_input.h"
#include "tost/v1/tost.grpc.pb.h"

namespace tost::service {

TostService::TostService(Engine& engine, const Authenticator& auth, ServiceLimits limits,
                         AdmissionPools admission, DeviceMemoryProbe device_memory)
    : RawService(tost::v1::Tost::service_full_name(), limits.max_request_bytes),
      engine_(engine),
      auth_(auth),
      limits_(limits),
      admission_(admission),
      device_memory_(std::move(device_memory)) {
  AddUnary("Classify", &TostService::Classify);
  AddServerStreaming<tost::v1::GenerateRequest, tost::v1::GenerateResponse>("Generate",
                                                                            &TostService::Generate);
  AddUnary("ListModels", &TostService::ListModels);
  AddUnary("ModelInfo", &TostService::ModelInfo);
  AddUnary("ServerStatus", &TostService::ServerStatus);
  // Each reads or writes the session store: beside the calls that wait on it, so that a store
  // that stops answering holds none of this service's own threads.
  AddUnary("CreateSession", &TostService::CreateSession, &admission.store);
  AddUnary("ForkSession", &TostService::ForkSession, &admission.store);
  AddUnary("ExportSession", &TostService::ExportSession, &admission.store);
  AddUnary("ImportSession", &TostService::ImportSession, &admission.store);
  AddUnary("CloseSession", &TostService::CloseSession, &admission.store);
}

namespace {

// The membership maps of image `b`, one per TSSA layer: [heads, grid_h, grid_w] each.
void AddMembership(const ClassifierModel::Explained& explained, const model::VisionConfig& v,
                   int64_t b, tost::v1::Classification* result) {
  const int64_t tokens = explained.grid_h * explained.grid_w;
  for (int64_t l = 0; l < v.depth; ++l) {
    auto* map = result->add_membership();
    map->set_layer(static_cast<int32_t>(l));
    map->set_heads(static_cast<int32_t>(v.num_heads));
    map->set_grid_height(static_cast<int32_t>(explained.grid_h));
    map->set_grid_width(static_cast<int32_t>(explained.grid_w));
    const float* first = explained.membership.data() + (b * v.depth + l) * v.num_heads * tokens;
    map->mutable_values()->Add(first, first + v.num_heads * tokens);
  }
}

}  // namespace

grpc::Status TostService::Classify(grpc::ServerContextBase* context,
                                   const tost::v1::ClassifyRequest* request,
                                   tost::v1::ClassifyResponse* response) {
  auto run = [&]() -> absl::Status {
    TOST_RETURN_IF_ERROR(auth_.Identify(*context).status());
    // The one lookup of the model: the handle carries its batcher for the rest of the request.
    TOST_ASSIGN_OR_RETURN(const ServedClassifier classifier, engine_.Classifier(request->model()));
    const model::ModelConfig& cfg = classifier.config();
    const model::VisionConfig& v = cfg.vision;
    if (request->top_k() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0 (0: the default of ",
                                                     limits_.default_top_k_labels, ") for model ",
                                                     cfg.name, ", got ", request->top_k()));
    }
    const int64_t k = std::min<int64_t>(
        request->top_k() == 0 ? limits_.default_top_k_labels : request->top_k(), v.num_classes);
    const bool encoded = request->images_size() > 0;
    if (encoded && request->has_tensor()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor and images are both set; model ",
                                                     cfg.name,
                                                     " takes either tensor or images, not both"));
    }
    if (!encoded && !request->has_tensor()) {
      return absl::InvalidArgumentError(
          absl::StrCat("neither tensor nor images is set; model ", cfg.name,
                       " takes float32 pixels [batch,", v.in_chans, ",", v.image_height, ",",
                       v.image_width, "] in tensor or encoded PNG/JPEG images in images"));
    }

    // How many images, and whether that many may come, before the batcher is asked for a place;
    // the place before any payload is touched, so a full queue costs the server nothing.
    int64_t images = request->images_size();
    if (!encoded) {
      TOST_ASSIGN_OR_RETURN(
          images, ImagesInTensorShape(request->tensor().shape(), /*allow_unbatched=*/true, cfg,
                                      "tensor.shape"));
    }
    TOST_RETURN_IF_ERROR(CheckImageCount(images, cfg, limits_,
                                         encoded                               ? "images"
                                         : request->tensor().shape_size() == 4 ? "tensor.shape[0]"
                                                                               : "tensor.shape"));
    // Membership requests hold the place while they run, though they run outside the batcher, so
    // that they too are refused when the queue is full or the server drains.
    TOST_ASSIGN_OR_RETURN(DynamicBatcher::Reservation reservation, classifier.Reserve(images));

    std::vector<float> pixels;
    if (encoded) {
      const std::vector<std::string_view> bytes(request->images().begin(), request->images().end());
      TOST_ASSIGN_OR_RETURN(pixels, EncodedImagesToPixels(bytes, cfg, limits_, "images"));
    } else {
      TOST_ASSIGN_OR_RETURN(
          pixels, FloatTensorToPixels(ClassifyTensorView(request->tensor()), images, cfg, limits_));
    }

    std::vector<float> logits;
    ClassifierModel::Explained explained;
    if (request->return_membership()) {
      // The batcher carries logits rows only, so diagnostic requests run on their own; like a
      // batched request, one whose deadline has passed (while its images decoded) does not run.
      if (absl::Now() >= RequestDeadline(*context)) {
        return absl::DeadlineExceededError(absl::StrCat(
            "model ", cfg.name, ": the request's deadline passed before its membership maps ran"));
      }
      TOST_ASSIGN_OR_RETURN(explained, classifier.model().ClassifyWithMembership(
                                           pixels, images, v.image_height, v.image_width));
      const int64_t expected = images * v.depth * v.num_heads * explained.grid_h * explained.grid_w;
      if (static_cast<int64_t>(explained.membership.size()) != expected) {
        return absl::InternalError(
            absl::StrCat("model ", cfg.name, " returned ", explained.membership.size(),
                         " membership values for ", images, " images, expected ", expected));
      }
      logits = std::move(explained.logits);
    } else {
      TOST_ASSIGN_OR_RETURN(logits, classifier.Classify(std::move(reservation), std::move(pixels),
                                                        images, RequestDeadline(*context)));
    }
    TOST_ASSIGN_OR_RETURN(const std::vector<float> probabilities, SoftmaxRows(logits, images, cfg));

    response->set_model(cfg.name);
    const int64_t n = v.num_classes;
    for (int64_t b = 0; b < images; ++b) {
      tost::v1::Classification* result = response->add_results();
      const absl::Span<const float> row =
          absl::MakeConstSpan(probabilities)
              .subspan(static_cast<size_t>(b * n), static_cast<size_t>(n));
      for (int64_t index : TopK(row, k)) {
        tost::v1::Label* label = result->add_labels();
        label->set_index(static_cast<int32_t>(index));
        label->set_label(v.labels[static_cast<size_t>(index)]);
        label->set_probability(row[static_cast<size_t>(index)]);
      }
      if (request->return_membership()) AddMembership(explained, v, b, result);
    }
    return absl::OkStatus();
  };
  return ToGrpcStatus(run());
}

namespace {

void FillModelStatus(const ModelEntry& m, tost::v1::ModelStatus* s) {
  s->set_name(m.name);
  s->set_version(m.config.version);
  s->set_ready(m.load_status.ok());
  s->set_error(std::string(m.load_status.message()));
  s->set_trained(m.config.trained);
  s->set_provenance_json(m.config.provenance_json);
  if (!m.load_status.ok() && m.config.name.empty()) return;  // config itself unreadable
  s->set_architecture(model::ArchitectureName(m.config.architecture));
  if (m.load_status.ok()) {
    s->set_device(m.placement.DeviceString());
    s->set_dtype(model::ComputeDtypeName(m.placement.dtype));
  }
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

grpc::Status TostService::ListModels(grpc::ServerContextBase* context,
                                     const tost::v1::ListModelsRequest*,
                                     tost::v1::ListModelsResponse* response) {
  if (auto who = auth_.Identify(*context); !who.ok()) return ToGrpcStatus(who.status());
  for (const ModelEntry& m : engine_.models()) FillModelStatus(m, response->add_models());
  return grpc::Status::OK;
}

grpc::Status TostService::ModelInfo(grpc::ServerContextBase* context,
                                    const tost::v1::ModelInfoRequest* request,
                                    tost::v1::ModelStatus* response) {
  if (auto who = auth_.Identify(*context); !who.ok()) return ToGrpcStatus(who.status());
  absl::StatusOr<const ModelEntry*> m = engine_.Find(request->model());
  if (!m.ok()) return ToGrpcStatus(m.status());
  FillModelStatus(**m, response);
  return grpc::Status::OK;
}

grpc::Status TostService::ServerStatus(grpc::ServerContextBase* context,
                                       const tost::v1::ServerStatusRequest*,
                                       tost::v1::ServerStatusResponse* response) {
  if (auto who = auth_.Identify(*context); !who.ok()) return ToGrpcStatus(who.status());
  const EngineStats stats = engine_.Stats();
  response->set_draining(stats.draining);
  for (const GeneratorStats& g : stats.generators) {
    auto* out = response->add_generators();
    out->set_model(g.model);
    out->set_active(g.scheduler.active);
    out->set_queued(g.scheduler.queued);
    out->set_max_active(g.max_active);
    // Still filled for clients written before max_active existed.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    out->set_free_slots(std::max(0, g.max_active - g.scheduler.active));
#pragma GCC diagnostic pop
    out->set_state_bytes_per_session(g.state_bytes_per_session);
    out->set_decode_steps(g.scheduler.decode_steps);
    out->set_decoded_tokens(g.scheduler.decoded_tokens);
    out->set_max_decode_batch(g.scheduler.max_decode_batch);
    out->set_paused(g.scheduler.paused);
    out->set_stalled_streams(g.scheduler.stalled_jobs);
    out->set_state_pool_bytes(g.scheduler.state_pool_bytes);
    out->set_decode_mode(g.scheduler.decode_mode);
    out->set_prefill_tokens(g.scheduler.prefill_tokens);
    out->set_prefix_cache_lookups(g.prefix_cache.lookups);
    out->set_prefix_cache_hits(g.prefix_cache.hits);
    out->set_prefix_cache_hit_tokens(g.prefix_cache.hit_tokens);
    out->set_prefix_cache_entries(g.prefix_cache.entries);
    out->set_prefix_cache_bytes(g.prefix_cache.bytes);
  }
  if (device_memory_) {
    for (const model::DeviceMemoryStats& d : device_memory_()) {
      auto* out = response->add_device_memory();
      out->set_device(d.device);
      out->set_allocated_bytes(d.allocated_bytes);
      out->set_reserved_bytes(d.reserved_bytes);
    }
  }
  const SessionStoreOptions& budget = engine_.sessions().options();
  response->set_sessions(stats.sessions.sessions);
  response->set_session_state_bytes(stats.sessions.state_bytes);
  response->set_session_budget_bytes(budget.max_state_bytes);
  response->set_session_budget_headroom_bytes(budget.max_state_bytes - stats.sessions.state_bytes);
  response->set_max_sessions(budget.max_sessions);
  return grpc::Status::OK;
}

}  // namespace tost::service
