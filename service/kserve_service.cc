#include "service/kserve_service.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/status_macros.h"
#include "service/grpc_status.h"
#include "service/image_decode.h"
#include "service/request_deadline.h"

#ifndef TOST_SERVE_VERSION
#error "TOST_SERVE_VERSION must be defined by the build (service/CMakeLists.txt)"
#endif

namespace tost::service {
namespace {

// raw_input_contents / raw_output_contents are little-endian; so is every host we build for.
static_assert(std::endian::native == std::endian::little,
              "raw tensor contents are copied as host floats");

constexpr char kServerName[] = "tost-serve";
constexpr char kLoadErrorTrailer[] = "tost-load-error";
constexpr char kClassificationParameter[] = "classification";

const model::LoadedModel* FindModel(const ModelRegistry& registry, const std::string& name) {
  for (const auto& m : registry.models()) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

absl::Status NotServed(const ModelRegistry& registry, const std::string& name) {
  std::vector<std::string> names;
  for (const auto& m : registry.models()) names.push_back(m.name);
  return absl::NotFoundError(absl::StrCat("model \"", name, "\" is not served; models: [",
                                          absl::StrJoin(names, ", "), "]"));
}

// An empty version means "the server's choice"; each model serves exactly one version.
absl::Status CheckVersion(const model::LoadedModel& m, const std::string& version,
                          const char* field) {
  if (version.empty() || version == m.config.version) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat(field, ": model \"", m.name, "\" serves version \"",
                                          m.config.version, "\" only, not \"", version, "\""));
}

absl::StatusOr<const model::LoadedModel*> Lookup(const ModelRegistry& registry,
                                                 const std::string& name,
                                                 const std::string& version,
                                                 const char* version_field) {
  const model::LoadedModel* m = FindModel(registry, name);
  if (m == nullptr) return NotServed(registry, name);
  TOST_RETURN_IF_ERROR(CheckVersion(*m, version, version_field));
  return m;
}

// Printable ASCII only: gRPC metadata values without a -bin suffix must be.
std::string MetadataSafe(absl::string_view text) {
  std::string out;
  for (char c : text.substr(0, 1024)) out.push_back(c >= 0x20 && c <= 0x7e ? c : '?');
  return out;
}

bool HasContents(const inference::InferTensorContents& c) {
  return c.bool_contents_size() > 0 || c.int_contents_size() > 0 || c.int64_contents_size() > 0 ||
         c.uint_contents_size() > 0 || c.uint64_contents_size() > 0 || c.fp32_contents_size() > 0 ||
         c.fp64_contents_size() > 0 || c.bytes_contents_size() > 0;
}

std::string ShapeString(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

// Splits a raw BYTES tensor: each element is a 4-byte little-endian length, then that many bytes.
absl::StatusOr<std::vector<std::string_view>> SplitBytesTensor(const std::string& raw,
                                                               int64_t expected,
                                                               const std::string& field) {
  std::vector<std::string_view> out;
  size_t at = 0;
  while (at < raw.size()) {
    if (static_cast<int64_t>(out.size()) == expected) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " holds more than the ", expected, " elements the shape declares (",
                       raw.size() - at, " bytes left after element ", expected - 1, ")"));
    }
    if (raw.size() - at < 4) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": element ", out.size(),
                                                     " needs a 4-byte length prefix, only ",
                                                     raw.size() - at, " bytes left"));
    }
    uint32_t len = 0;
    std::memcpy(&len, raw.data() + at, 4);
    at += 4;
    if (len > raw.size() - at) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": element ", out.size(), " declares ",
                                                     len, " bytes, only ", raw.size() - at,
                                                     " left"));
    }
    out.emplace_back(raw.data() + at, len);
    at += len;
  }
  if (static_cast<int64_t>(out.size()) != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " holds ", out.size(), " BYTES elements, the shape declares ", expected));
  }
  return out;
}

struct Pixels {
  std::vector<float> data;  // [batch, C, H, W] at the model's resolution
  int64_t batch = 0;
};

absl::Status CheckBatch(int64_t batch, const std::string& where, const ServiceLimits& limits) {
  if (batch < 1)
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".shape[0] (batch) must be >= 1, got ", batch));
  if (batch > limits.max_batch_size) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": batch of ", batch,
                                                   " images exceeds the per-request limit of ",
                                                   limits.max_batch_size));
  }
  return absl::OkStatus();
}

absl::StatusOr<Pixels> FloatInput(const inference::ModelInferRequest& req,
                                  const model::ModelConfig& cfg, const ServiceLimits& limits) {
  const auto& in = req.inputs(0);
  const std::string where = absl::StrCat("inputs[0] (\"", kKServeImageInput, "\")");
  const model::VisionConfig& v = cfg.vision;
  if (in.datatype() != "FP32") {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".datatype: expected FP32, got \"", in.datatype(), "\""));
  }
  const auto& shape = in.shape();
  if (shape.size() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".shape: expected [batch,", v.in_chans,
                                                   ",", v.image_height, ",", v.image_width,
                                                   "], got ", ShapeString(shape)));
  }
  TOST_RETURN_IF_ERROR(CheckBatch(shape[0], where, limits));
  if (shape[1] != v.in_chans || shape[2] != v.image_height || shape[3] != v.image_width) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".shape: model ", cfg.name, " takes [batch,", v.in_chans, ",",
                     v.image_height, ",", v.image_width, "], got ", ShapeString(shape)));
  }
  const int64_t elements = shape[0] * v.in_chans * v.image_height * v.image_width;
  if (elements > limits.max_tensor_elements) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", elements, " elements exceed the limit of ", limits.max_tensor_elements));
  }
  Pixels out;
  out.batch = shape[0];
  if (req.raw_input_contents_size() > 0) {
    const std::string& raw = req.raw_input_contents(0);
    if (static_cast<int64_t>(raw.size()) != elements * 4) {
      return absl::InvalidArgumentError(absl::StrCat("raw_input_contents[0] holds ", raw.size(),
                                                     " bytes; FP32 shape ", ShapeString(shape),
                                                     " needs ", elements * 4));
    }
    out.data.resize(static_cast<size_t>(elements));
    std::memcpy(out.data.data(), raw.data(), raw.size());
  } else {
    const auto& c = in.contents();
    if (c.fp32_contents_size() != elements ||
        c.bytes_contents_size() + c.bool_contents_size() + c.int_contents_size() +
                c.int64_contents_size() + c.uint_contents_size() + c.uint64_contents_size() +
                c.fp64_contents_size() >
            0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".contents: FP32 shape ", ShapeString(shape), " needs ", elements,
                       " values in fp32_contents (and no other contents), got ",
                       c.fp32_contents_size(), " (or send raw_input_contents)"));
    }
    out.data.assign(c.fp32_contents().begin(), c.fp32_contents().end());
  }
  for (float x : out.data) {
    if (!std::isfinite(x))
      return absl::InvalidArgumentError(absl::StrCat(where, ": holds NaN or infinite values"));
  }
  return out;
}

absl::StatusOr<Pixels> EncodedInput(const inference::ModelInferRequest& req,
                                    const model::ModelConfig& cfg, const ServiceLimits& limits) {
  const auto& in = req.inputs(0);
  const std::string where = absl::StrCat("inputs[0] (\"", kKServeImageBytesInput, "\")");
  if (in.datatype() != "BYTES") {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".datatype: expected BYTES, got \"", in.datatype(), "\""));
  }
  const auto& shape = in.shape();
  if (shape.empty() || shape.size() > 2 || (shape.size() == 2 && shape[1] != 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ".shape: expected [batch] or [batch,1] (one encoded image per element), got ",
        ShapeString(shape)));
  }
  TOST_RETURN_IF_ERROR(CheckBatch(shape[0], where, limits));
  const int64_t batch = shape[0];
  std::vector<std::string_view> images;
  if (req.raw_input_contents_size() > 0) {
    TOST_ASSIGN_OR_RETURN(
        images, SplitBytesTensor(req.raw_input_contents(0), batch, "raw_input_contents[0]"));
  } else {
    const auto& c = in.contents();
    if (c.bytes_contents_size() != batch ||
        c.fp32_contents_size() + c.bool_contents_size() + c.int_contents_size() +
                c.int64_contents_size() + c.uint_contents_size() + c.uint64_contents_size() +
                c.fp64_contents_size() >
            0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".contents: BYTES shape ", ShapeString(shape), " needs ", batch,
                       " images in bytes_contents (and no other contents), got ",
                       c.bytes_contents_size(), " (or send raw_input_contents)"));
    }
    for (const std::string& b : c.bytes_contents()) images.emplace_back(b);
  }
  const model::VisionConfig& v = cfg.vision;
  const int64_t per_image = v.in_chans * v.image_height * v.image_width;
  if (batch * per_image > limits.max_tensor_elements) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", batch, " images of ", per_image,
                                                   " preprocessed values exceed the limit of ",
                                                   limits.max_tensor_elements, " elements"));
  }
  Pixels out;
  out.batch = batch;
  out.data.reserve(static_cast<size_t>(batch * per_image));
  for (int64_t i = 0; i < batch; ++i) {
    TOST_ASSIGN_OR_RETURN(std::vector<float> one,
                          DecodeAndPreprocess(images[static_cast<size_t>(i)], v, limits.image,
                                              absl::StrCat(where, " element ", i)));
    out.data.insert(out.data.end(), one.begin(), one.end());
  }
  return out;
}

struct OutputRequest {
  int64_t class_count = 0;  // 0: the probabilities tensor; N: the classification extension's top-N
};

absl::StatusOr<OutputRequest> ParseOutputs(const inference::ModelInferRequest& req,
                                           const model::ModelConfig& cfg) {
  OutputRequest out;
  if (req.outputs_size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("outputs: model ", cfg.name, " has one output, \"", kKServeProbabilitiesOutput,
                     "\"; ", req.outputs_size(), " requested"));
  }
  if (req.outputs_size() == 0) return out;
  const auto& o = req.outputs(0);
  if (o.name() != kKServeProbabilitiesOutput) {
    return absl::InvalidArgumentError(
        absl::StrCat("outputs[0].name: model ", cfg.name, " has no output \"", o.name(),
                     "\"; its output is \"", kKServeProbabilitiesOutput, "\""));
  }
  for (const auto& [key, value] : o.parameters()) {
    if (key != kClassificationParameter) {
      return absl::InvalidArgumentError(
          absl::StrCat("outputs[0].parameters[\"", key,
                       "\"] is not supported (only \"classification\"; no shared memory)"));
    }
    if (value.parameter_choice_case() == inference::InferParameter::kInt64Param) {
      out.class_count = value.int64_param();
    } else if (value.parameter_choice_case() == inference::InferParameter::kUint64Param) {
      out.class_count = static_cast<int64_t>(std::min<uint64_t>(value.uint64_param(), INT64_MAX));
    } else {
      return absl::InvalidArgumentError(
          "outputs[0].parameters[\"classification\"] must be an int64 class count");
    }
    if (out.class_count < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "outputs[0].parameters[\"classification\"] must be >= 1, got ", out.class_count));
    }
  }
  return out;
}

absl::Status CheckRequestParameters(const inference::ModelInferRequest& req,
                                    const std::string& model) {
  for (const auto& [key, p] : req.parameters()) {
    const bool sequence = (key == "sequence_id" && (p.int64_param() != 0 || p.uint64_param() != 0 ||
                                                    !p.string_param().empty())) ||
                          ((key == "sequence_start" || key == "sequence_end") && p.bool_param());
    if (sequence) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameters[\"", key, "\"]: model ", model,
                       " is stateless; sequence parameters are not accepted"));
    }
  }
  // priority, timeout and custom parameters are accepted and have no effect.
  return absl::OkStatus();
}

void AppendLengthPrefixed(std::string& out, const std::string& element) {
  const uint32_t len = static_cast<uint32_t>(element.size());
  char prefix[4];
  std::memcpy(prefix, &len, 4);
  out.append(prefix, 4);
  out.append(element);
}

}  // namespace

absl::Status KServeService::Authenticate(const grpc::ServerContext& context) const {
  if (auth_ == nullptr) return absl::OkStatus();
  return auth_->Identify(context).status();
}

grpc::Status KServeService::ServerLive(grpc::ServerContext*, const inference::ServerLiveRequest*,
                                       inference::ServerLiveResponse* response) {
  response->set_live(true);
  return grpc::Status::OK;
}

grpc::Status KServeService::ServerReady(grpc::ServerContext*, const inference::ServerReadyRequest*,
                                        inference::ServerReadyResponse* response) {
  // Models load and warm up before the server is built, so only a drain makes it unready.
  response->set_ready(!draining());
  return grpc::Status::OK;
}

grpc::Status KServeService::ModelReady(grpc::ServerContext* context,
                                       const inference::ModelReadyRequest* request,
                                       inference::ModelReadyResponse* response) {
  if (absl::Status s = Authenticate(*context); !s.ok()) return ToGrpcStatus(s);
  auto m = Lookup(registry_, request->name(), request->version(), "version");
  if (!m.ok()) return ToGrpcStatus(m.status());
  if (!(*m)->status.ok()) {
    context->AddTrailingMetadata(kLoadErrorTrailer, MetadataSafe((*m)->status.message()));
    response->set_ready(false);
    return grpc::Status::OK;
  }
  response->set_ready(!draining());
  return grpc::Status::OK;
}

grpc::Status KServeService::ServerMetadata(grpc::ServerContext*,
                                           const inference::ServerMetadataRequest*,
                                           inference::ServerMetadataResponse* response) {
  response->set_name(kServerName);
  response->set_version(TOST_SERVE_VERSION);
  response->add_extensions("classification");
  return grpc::Status::OK;
}

grpc::Status KServeService::ModelMetadata(grpc::ServerContext* context,
                                          const inference::ModelMetadataRequest* request,
                                          inference::ModelMetadataResponse* response) {
  if (absl::Status s = Authenticate(*context); !s.ok()) return ToGrpcStatus(s);
  auto m = Lookup(registry_, request->name(), request->version(), "version");
  if (!m.ok()) return ToGrpcStatus(m.status());
  const model::LoadedModel& lm = **m;
  if (!lm.status.ok()) {
    return ToGrpcStatus(absl::FailedPreconditionError(
        absl::StrCat("model \"", lm.name, "\" failed to load: ", lm.status.message())));
  }
  response->set_name(lm.name);
  response->add_versions(lm.config.version);
  response->set_platform(model::ArchitectureName(lm.config.architecture));
  if (lm.config.architecture != model::Architecture::kVision)
    return grpc::Status::OK;  // Generate only
  const model::VisionConfig& v = lm.config.vision;
  auto* pixels = response->add_inputs();
  pixels->set_name(kKServeImageInput);
  pixels->set_datatype("FP32");
  for (int64_t d : {int64_t{-1}, v.in_chans, v.image_height, v.image_width}) pixels->add_shape(d);
  auto* encoded = response->add_inputs();
  encoded->set_name(kKServeImageBytesInput);
  encoded->set_datatype("BYTES");
  encoded->add_shape(-1);
  auto* probs = response->add_outputs();
  probs->set_name(kKServeProbabilitiesOutput);
  probs->set_datatype("FP32");
  probs->add_shape(-1);
  probs->add_shape(v.num_classes);
  return grpc::Status::OK;
}

grpc::Status KServeService::ModelInfer(grpc::ServerContext* context,
                                       const inference::ModelInferRequest* request,
                                       inference::ModelInferResponse* response) {
  if (absl::Status s = Authenticate(*context); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(Infer(*request, RequestDeadline(*context), *response));
}

absl::Status KServeService::Infer(const inference::ModelInferRequest& req, absl::Time deadline,
                                  inference::ModelInferResponse& resp) const {
  TOST_ASSIGN_OR_RETURN(const model::LoadedModel* m,
                        Lookup(registry_, req.model_name(), req.model_version(), "model_version"));
  if (m->status.ok() && m->language != nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("model \"", m->name,
                     "\" is a tost_lm language model; KServe ModelInfer serves "
                     "classification only: generate text with tost.v1.Tost/Generate"));
  }
  TOST_ASSIGN_OR_RETURN(const model::VisionModel* vm, registry_.Vision(req.model_name()));
  const model::ModelConfig& cfg = vm->config();
  TOST_RETURN_IF_ERROR(CheckRequestParameters(req, cfg.name));

  if (req.inputs_size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inputs: model ", cfg.name, " takes exactly one input, \"", kKServeImageInput,
        "\" (FP32) or \"", kKServeImageBytesInput, "\" (BYTES); got ", req.inputs_size()));
  }
  const auto& in = req.inputs(0);
  if (in.name() != kKServeImageInput && in.name() != kKServeImageBytesInput) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inputs[0].name: model ", cfg.name, " has no input \"", in.name(), "\"; its inputs are \"",
        kKServeImageInput, "\" (FP32) and \"", kKServeImageBytesInput, "\" (BYTES)"));
  }
  if (!in.parameters().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("inputs[0].parameters[\"", in.parameters().begin()->first,
                     "\"] is not supported (no input parameters; no shared memory)"));
  }
  if (req.raw_input_contents_size() != 0 && req.raw_input_contents_size() != req.inputs_size()) {
    return absl::InvalidArgumentError(absl::StrCat("raw_input_contents holds ",
                                                   req.raw_input_contents_size(), " entries for ",
                                                   req.inputs_size(), " input(s)"));
  }
  if (req.raw_input_contents_size() > 0 && HasContents(in.contents())) {
    return absl::InvalidArgumentError(
        "inputs[0].contents must be empty when raw_input_contents is used");
  }
  TOST_ASSIGN_OR_RETURN(const OutputRequest output, ParseOutputs(req, cfg));
  // Admission before decoding: a full queue is refused before any work on the payload.
  const int64_t declared = in.shape_size() > 0 ? in.shape(0) : 0;
  if (declared < 1 || declared > limits_.max_batch_size) {
    return absl::InvalidArgumentError(absl::StrCat("inputs[0].shape[0]: model ", cfg.name,
                                                   " takes 1 to ", limits_.max_batch_size,
                                                   " images per request, got ", declared));
  }
  TOST_ASSIGN_OR_RETURN(DynamicBatcher::Slot slot, core_.ReserveClassification(cfg.name, declared));
  TOST_ASSIGN_OR_RETURN(Pixels pixels, in.name() == kKServeImageInput
                                           ? FloatInput(req, cfg, limits_)
                                           : EncodedInput(req, cfg, limits_));
  TOST_ASSIGN_OR_RETURN(
      const std::vector<float> logits,
      core_.Classify(cfg.name, std::move(slot), std::move(pixels.data), pixels.batch, deadline));

  const int64_t n = cfg.vision.num_classes;
  std::vector<float> probs(static_cast<size_t>(pixels.batch * n));
  for (int64_t b = 0; b < pixels.batch; ++b) {
    const float* row = logits.data() + b * n;
    const double max_logit = *std::max_element(row, row + n);
    double total = 0;
    std::vector<double> e(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      total += e[static_cast<size_t>(i)] = std::exp(static_cast<double>(row[i]) - max_logit);
    for (int64_t i = 0; i < n; ++i)
      probs[static_cast<size_t>(b * n + i)] = static_cast<float>(e[static_cast<size_t>(i)] / total);
  }

  resp.set_model_name(cfg.name);
  resp.set_model_version(cfg.version);
  resp.set_id(req.id());
  auto* out = resp.add_outputs();
  out->set_name(kKServeProbabilitiesOutput);
  out->add_shape(pixels.batch);
  std::string* raw = resp.add_raw_output_contents();
  if (output.class_count == 0) {
    out->set_datatype("FP32");
    out->add_shape(n);
    raw->assign(reinterpret_cast<const char*>(probs.data()), probs.size() * sizeof(float));
    return absl::OkStatus();
  }
  // The classification extension, as Triton computes it: top-N by value, "value:index:label".
  const int64_t k = std::min(output.class_count, n);
  out->set_datatype("BYTES");
  out->add_shape(k);
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t b = 0; b < pixels.batch; ++b) {
    const float* p = probs.data() + b * n;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int64_t x, int64_t y) { return p[x] > p[y] || (p[x] == p[y] && x < y); });
    for (int64_t i = 0; i < k; ++i) {
      const int64_t idx = order[static_cast<size_t>(i)];
      AppendLengthPrefixed(*raw, absl::StrCat(std::to_string(p[idx]), ":", idx, ":",
                                              cfg.vision.labels[static_cast<size_t>(idx)]));
    }
  }
  return absl::OkStatus();
}

}  // namespace tost::service
