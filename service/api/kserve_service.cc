#include "service/api/kserve_service.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "kserve/v2/grpc_service.grpc.pb.h"
#include "service/api/grpc_status.h"
#include "service/api/request_deadline.h"
#include "service/api/request_input.h"
#include "service/engine/client_text.h"

#ifndef TOST_SERVE_VERSION
#error "TOST_SERVE_VERSION must be defined by the build (service/CMakeLists.txt)"
#endif

namespace tost::service {
namespace {

// raw_input_contents / raw_output_contents and BYTES length prefixes are little-endian; so is every
// host we build for.
static_assert(std::endian::native == std::endian::little,
              "raw tensor contents are copied as host values");

constexpr char kServerName[] = "tost-serve";
constexpr char kLoadErrorTrailer[] = "tost-load-error";
constexpr char kClassificationParameter[] = "classification";

// An empty version means "the server's choice"; each model serves exactly one version.
absl::Status CheckVersion(const ModelEntry& m, const std::string& version, const char* field) {
  if (version.empty() || version == m.config.version) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat(field, ": model \"", m.name, "\" serves version \"",
                                          m.config.version, "\" only, not ",
                                          QuoteClientText(version)));
}

// The one lookup of a request: NOT_FOUND for a model the repository does not hold (listing those
// it does) or a version the model does not serve.
absl::StatusOr<const ModelEntry*> Lookup(const Engine& engine, const std::string& name,
                                         const std::string& version, const char* version_field) {
  TOST_ASSIGN_OR_RETURN(const ModelEntry* m, engine.Find(name));
  TOST_RETURN_IF_ERROR(CheckVersion(*m, version, version_field));
  return m;
}

absl::Status LoadFailed(const ModelEntry& m) {
  return absl::FailedPreconditionError(
      absl::StrCat("model \"", m.name, "\" failed to load: ", m.load_status.message()));
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

constexpr char kImageField[] = "inputs[0] (\"image\")";
constexpr char kImageBytesField[] = "inputs[0] (\"image_bytes\")";

// The typed contents other than the one a datatype uses: a request that sends any of them has
// mistaken the datatype, and is told so rather than having them ignored.
int OtherContents(const inference::InferTensorContents& c, bool fp32) {
  return (fp32 ? c.bytes_contents_size() : c.fp32_contents_size()) + c.bool_contents_size() +
         c.int_contents_size() + c.int64_contents_size() + c.uint_contents_size() +
         c.uint64_contents_size() + c.fp64_contents_size();
}

// The image count an input declares, its shape checked: "image" FP32 [batch, C, H, W],
// "image_bytes" BYTES [batch] or [batch, 1].
absl::StatusOr<int64_t> DeclaredImages(const inference::ModelInferRequest::InferInputTensor& in,
                                       const model::ModelConfig& cfg) {
  if (in.name() == kKServeImageInput) {
    if (in.datatype() != "FP32") {
      return absl::InvalidArgumentError(absl::StrCat(kImageField, ".datatype: expected FP32, got ",
                                                     QuoteClientText(in.datatype()), " (model ",
                                                     cfg.name, ")"));
    }
    return ImagesInTensorShape(in.shape(), /*allow_unbatched=*/false, cfg,
                               absl::StrCat(kImageField, ".shape"));
  }
  if (in.datatype() != "BYTES") {
    return absl::InvalidArgumentError(
        absl::StrCat(kImageBytesField, ".datatype: expected BYTES, got ",
                     QuoteClientText(in.datatype()), " (model ", cfg.name, ")"));
  }
  const auto& shape = in.shape();
  if (shape.empty() || shape.size() > 2 || (shape.size() == 2 && shape[1] != 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kImageBytesField, ".shape: expected [batch] or [batch,1] for model ", cfg.name,
                     " (one encoded image per element), got ", ShapeString(shape)));
  }
  return shape[0];
}

absl::StatusOr<std::vector<float>> FloatInput(const inference::ModelInferRequest& req,
                                              int64_t images, const model::ModelConfig& cfg,
                                              const ServiceLimits& limits) {
  const auto& in = req.inputs(0);
  const auto& c = in.contents();
  FloatTensorView view;
  view.shape = in.shape();
  view.shape_field = absl::StrCat(kImageField, ".shape");
  view.raw_field = "raw_input_contents[0]";
  view.values_field = absl::StrCat(kImageField, ".contents.fp32_contents");
  if (req.raw_input_contents_size() > 0) {
    view.raw = req.raw_input_contents(0);
  } else {
    if (OtherContents(c, /*fp32=*/true) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(kImageField, ".contents: model ", cfg.name,
                       " takes FP32 values in fp32_contents (or raw_input_contents), got other "
                       "typed contents"));
    }
    view.values = c.fp32_contents();
  }
  return FloatTensorToPixels(view, images, cfg, limits);
}

absl::StatusOr<std::vector<float>> EncodedInput(const inference::ModelInferRequest& req,
                                                int64_t images, const model::ModelConfig& cfg,
                                                const ServiceLimits& limits) {
  const auto& in = req.inputs(0);
  std::vector<std::string_view> encoded;
  std::string field;
  if (req.raw_input_contents_size() > 0) {
    field = "raw_input_contents[0]";
    TOST_ASSIGN_OR_RETURN(encoded, SplitBytesTensor(req.raw_input_contents(0), images, field));
  } else {
    field = absl::StrCat(kImageBytesField, ".contents.bytes_contents");
    const auto& c = in.contents();
    if (c.bytes_contents_size() != images || OtherContents(c, /*fp32=*/false) > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          kImageBytesField, ".contents: BYTES shape ", ShapeString(in.shape()), " needs ", images,
          " images in bytes_contents (and no other contents) for model ", cfg.name, ", got ",
          c.bytes_contents_size(), " (or send raw_input_contents)"));
    }
    encoded.assign(c.bytes_contents().begin(), c.bytes_contents().end());
  }
  return EncodedImagesToPixels(encoded, cfg, limits, field);
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
    return absl::InvalidArgumentError(absl::StrCat(
        "outputs[0].name: model ", cfg.name, " has no output ", QuoteClientText(o.name()),
        "; its output is \"", kKServeProbabilitiesOutput, "\""));
  }
  for (const auto& [key, value] : o.parameters()) {
    if (key != kClassificationParameter) {
      return absl::InvalidArgumentError(
          absl::StrCat("outputs[0].parameters[", QuoteClientText(key),
                       "] is not supported (only \"classification\"; no shared memory)"));
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
          absl::StrCat("parameters[", QuoteClientText(key), "]: model ", model,
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

KServeService::KServeService(const Engine& engine, const Authenticator* auth, ServiceLimits limits)
    : RawService(inference::GRPCInferenceService::service_full_name(), limits.max_request_bytes),
      engine_(engine),
      auth_(auth),
      limits_(limits) {
  AddUnary("ServerLive", &KServeService::ServerLive);
  AddUnary("ServerReady", &KServeService::ServerReady);
  AddUnary("ModelReady", &KServeService::ModelReady);
  AddUnary("ServerMetadata", &KServeService::ServerMetadata);
  AddUnary("ModelMetadata", &KServeService::ModelMetadata);
  AddUnary("ModelInfer", &KServeService::ModelInfer);
}

absl::Status KServeService::Authenticate(const grpc::ServerContextBase& context) const {
  if (auth_ == nullptr) return absl::OkStatus();
  return auth_->Identify(context).status();
}

grpc::Status KServeService::ServerLive(grpc::ServerContextBase* context,
                                       const inference::ServerLiveRequest*,
                                       inference::ServerLiveResponse* response) {
  if (absl::Status s = Authenticate(*context); !s.ok()) return ToGrpcStatus(s);
  response->set_live(true);
  return grpc::Status::OK;
}

grpc::Status KServeService::ServerReady(grpc::ServerContextBase* context,
                                        const inference::ServerReadyRequest*,
                                        inference::ServerReadyResponse* response) {
  if (absl::Status s = Authenticate(*context); !s.ok()) return ToGrpcStatus(s);
  // Models load and warm up before the server is built, so only a drain makes it unready.
  response->set_ready(!engine_.draining());
  return grpc::Status::OK;
}

grpc::Status KServeService::ModelReady(grpc::ServerContextBase* context,
                                       const inference::ModelReadyRequest* request,
                                       inference::ModelReadyResponse* response) {
  if (absl::Status s = Authenticate(*context); !s.ok()) return ToGrpcStatus(s);
  auto m = Lookup(engine_, request->name(), request->version(), "version");
  if (!m.ok()) return ToGrpcStatus(m.status());
  if (!(*m)->load_status.ok()) {
    context->AddTrailingMetadata(kLoadErrorTrailer, MetadataSafe((*m)->load_status.message()));
    response->set_ready(false);
    return grpc::Status::OK;
  }
  response->set_ready(!engine_.draining());
  return grpc::Status::OK;
}

grpc::Status KServeService::ServerMetadata(grpc::ServerContextBase* context,
                                           const inference::ServerMetadataRequest*,
                                           inference::ServerMetadataResponse* response) {
  if (absl::Status s = Authenticate(*context); !s.ok()) return ToGrpcStatus(s);
  response->set_name(kServerName);
  response->set_version(TOST_SERVE_VERSION);
  response->add_extensions("classification");
  return grpc::Status::OK;
}

grpc::Status KServeService::ModelMetadata(grpc::ServerContextBase* context,
                                          const inference::ModelMetadataRequest* request,
                                          inference::ModelMetadataResponse* response) {
  if (absl::Status s = Authenticate(*context); !s.ok()) return ToGrpcStatus(s);
  auto m = Lookup(engine_, request->name(), request->version(), "version");
  if (!m.ok()) return ToGrpcStatus(m.status());
  const ModelEntry& lm = **m;
  if (!lm.load_status.ok()) return ToGrpcStatus(LoadFailed(lm));
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

grpc::Status KServeService::ModelInfer(grpc::ServerContextBase* context,
                                       const inference::ModelInferRequest* request,
                                       inference::ModelInferResponse* response) {
  if (absl::Status s = Authenticate(*context); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(Infer(*request, RequestDeadline(*context), *response));
}

absl::Status KServeService::Infer(const inference::ModelInferRequest& req, absl::Time deadline,
                                  inference::ModelInferResponse& resp) const {
  TOST_ASSIGN_OR_RETURN(const ModelEntry* m,
                        Lookup(engine_, req.model_name(), req.model_version(), "model_version"));
  if (!m->load_status.ok()) return LoadFailed(*m);
  if (m->classifier == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "model \"", m->name, "\" is a ", model::ArchitectureName(m->config.architecture),
        " language model; KServe ModelInfer serves classification only: generate "
        "text with tost.v1.Tost/Generate"));
  }
  TOST_ASSIGN_OR_RETURN(const ServedClassifier classifier, engine_.Classifier(m->name));
  const model::ModelConfig& cfg = classifier.config();
  TOST_RETURN_IF_ERROR(CheckRequestParameters(req, cfg.name));

  if (req.inputs_size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inputs: model ", cfg.name, " takes exactly one input, \"", kKServeImageInput,
        "\" (FP32) or \"", kKServeImageBytesInput, "\" (BYTES); got ", req.inputs_size()));
  }
  const auto& in = req.inputs(0);
  if (in.name() != kKServeImageInput && in.name() != kKServeImageBytesInput) {
    return absl::InvalidArgumentError(
        absl::StrCat("inputs[0].name: model ", cfg.name, " has no input ",
                     QuoteClientText(in.name()), "; its inputs are \"", kKServeImageInput,
                     "\" (FP32) and \"", kKServeImageBytesInput, "\" (BYTES)"));
  }
  if (!in.parameters().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("inputs[0].parameters[", QuoteClientText(in.parameters().begin()->first),
                     "] is not supported (no input parameters; no shared memory)"));
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

  // How many images, and whether that many may come, before the batcher is asked for a place;
  // the place before any payload is touched, so a full queue costs the server nothing.
  TOST_ASSIGN_OR_RETURN(const int64_t images, DeclaredImages(in, cfg));
  TOST_RETURN_IF_ERROR(CheckImageCount(images, cfg, limits_, "inputs[0].shape[0]"));
  TOST_ASSIGN_OR_RETURN(DynamicBatcher::Reservation reservation, classifier.Reserve(images));
  TOST_ASSIGN_OR_RETURN(std::vector<float> pixels, in.name() == kKServeImageInput
                                                       ? FloatInput(req, images, cfg, limits_)
                                                       : EncodedInput(req, images, cfg, limits_));
  TOST_ASSIGN_OR_RETURN(
      const std::vector<float> logits,
      classifier.Classify(std::move(reservation), std::move(pixels), images, deadline));
  TOST_ASSIGN_OR_RETURN(const std::vector<float> probs, SoftmaxRows(logits, images, cfg));
  const int64_t n = cfg.vision.num_classes;

  resp.set_model_name(cfg.name);
  resp.set_model_version(cfg.version);
  resp.set_id(req.id());
  auto* out = resp.add_outputs();
  out->set_name(kKServeProbabilitiesOutput);
  out->add_shape(images);
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
  for (int64_t b = 0; b < images; ++b) {
    const absl::Span<const float> row =
        absl::MakeConstSpan(probs).subspan(static_cast<size_t>(b * n), static_cast<size_t>(n));
    for (int64_t index : TopK(row, k)) {
      AppendLengthPrefixed(
          *raw, absl::StrCat(std::to_string(row[static_cast<size_t>(index)]), ":", index, ":",
                             cfg.vision.labels[static_cast<size_t>(index)]));
    }
  }
  return absl::OkStatus();
}

}  // namespace tost::service
