// libFuzzer target: classification requests of both protocols, as the server receives them: the
// input bytes are a serialised tost.v1.ClassifyRequest or inference.ModelInferRequest, whose
// tensor or encoded images go through the protocol-free input layer (service/api/request_input.h:
// ImagesInTensorShape, CheckImageCount, FloatTensorToPixels, EncodedImagesToPixels) against a
// small fixed model, then its output half (SoftmaxRows, TopK) on logits made from the pixels.
//
// The first input byte chooses: bit 0 the protocol (0 tost.v1, 1 KServe v2), bit 1 the model
// (0 RGB 3×4×4, 1 gray 1×3×5); the rest is the message. The glue between the message and the input
// layer mirrors the front ends (service/api/tost_service.cc, kserve_service.cc) without gRPC; the
// KServe BYTES splitting is a copy of kserve_service.cc's SplitBytesTensor (file-local there).
#include <google/protobuf/stubs/logging.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "kserve/v2/grpc_service.pb.h"
#include "model/config/config.h"
#include "service/api/classify_tensor_view.h"
#include "service/api/request_input.h"
#include "tests/fuzz/fuzz_util.h"
#include "tost/v1/tost.pb.h"

namespace {

using tost::model::ModelConfig;
using tost::service::FloatTensorView;
using tost::service::ServiceLimits;

ModelConfig Model(bool gray) {
  ModelConfig m;
  m.name = gray ? "fuzz-gray" : "fuzz-rgb";
  m.architecture = tost::model::Architecture::kVision;
  auto& v = m.vision;
  v.in_chans = gray ? 1 : 3;
  v.image_height = gray ? 3 : 4;
  v.image_width = gray ? 5 : 4;
  v.num_classes = gray ? 3 : 5;
  for (int64_t i = 0; i < v.num_classes; ++i) v.labels.push_back(std::to_string(i));
  v.mean.assign(static_cast<size_t>(v.in_chans), 0.5f);
  v.std.assign(static_cast<size_t>(v.in_chans), 0.25f);
  return m;
}

ServiceLimits Limits() {
  ServiceLimits l;
  l.max_images_per_request = 4;
  l.max_tensor_elements = 3 * 48;  // 3 RGB images: a fourth is refused by the element limit
  l.image.max_encoded_bytes = 64 << 10;
  l.image.max_decoded_pixels = 1 << 16;
  return l;
}

// kserve_service.cc's SplitBytesTensor: 4-byte little-endian length, then that many bytes.
bool SplitBytesTensor(const std::string& raw, int64_t expected,
                      std::vector<std::string_view>* out) {
  size_t at = 0;
  while (at < raw.size()) {
    if (static_cast<int64_t>(out->size()) == expected || raw.size() - at < 4) return false;
    uint32_t len = 0;
    std::memcpy(&len, raw.data() + at, 4);
    at += 4;
    if (len > raw.size() - at) return false;
    out->emplace_back(raw.data() + at, len);
    at += len;
  }
  return static_cast<int64_t>(out->size()) == expected;
}

// What the server does with pixels the input layer accepted, minus the model: their bounds, then
// logits (here: the first num_classes pixels of each image) to probabilities and the top k.
void CheckPixels(const absl::StatusOr<std::vector<float>>& pixels, int64_t images,
                 const ModelConfig& m, int64_t k) {
  if (!pixels.ok()) return;
  const auto& v = m.vision;
  const int64_t per_image = v.in_chans * v.image_height * v.image_width;
  TOST_FUZZ_CHECK(static_cast<int64_t>(pixels->size()) == images * per_image);
  for (const float x : *pixels) {
    TOST_FUZZ_CHECK(std::isfinite(x) && std::abs(x) <= tost::service::kMaxPixelMagnitude);
  }
  std::vector<float> logits;
  for (int64_t b = 0; b < images; ++b) {
    const float* p = pixels->data() + b * per_image;
    logits.insert(logits.end(), p, p + v.num_classes);
  }
  const auto probs = tost::service::SoftmaxRows(logits, images, m);
  TOST_FUZZ_CHECK(probs.ok());
  for (int64_t b = 0; b < images; ++b) {
    const auto row = absl::MakeConstSpan(*probs).subspan(static_cast<size_t>(b * v.num_classes),
                                                         static_cast<size_t>(v.num_classes));
    double total = 0;
    for (const float p : row) {
      TOST_FUZZ_CHECK(p >= 0.f && p <= 1.f);
      total += p;
    }
    TOST_FUZZ_CHECK(std::abs(total - 1.0) < 1e-4);
    const std::vector<int64_t> top = tost::service::TopK(row, k);
    TOST_FUZZ_CHECK(static_cast<int64_t>(top.size()) == std::clamp<int64_t>(k, 0, v.num_classes));
    for (size_t i = 1; i < top.size(); ++i) {
      TOST_FUZZ_CHECK(row[static_cast<size_t>(top[i - 1])] >= row[static_cast<size_t>(top[i])]);
    }
  }
}

// tost_service.cc's Classify, up to the batcher.
void Classify(const tost::v1::ClassifyRequest& request, const ModelConfig& m,
              const ServiceLimits& limits) {
  if (request.top_k() < 0) return;
  const int64_t k =
      std::min<int64_t>(request.top_k() == 0 ? 5 : request.top_k(), m.vision.num_classes);
  const bool encoded = request.images_size() > 0;
  if (encoded == request.has_tensor()) return;
  int64_t images = request.images_size();
  if (!encoded) {
    const auto n = tost::service::ImagesInTensorShape(request.tensor().shape(),
                                                      /*allow_unbatched=*/true, m, "tensor.shape");
    if (!n.ok()) return;
    images = *n;
  }
  if (!tost::service::CheckImageCount(images, m, limits, "images").ok()) return;
  if (encoded) {
    const std::vector<std::string_view> bytes(request.images().begin(), request.images().end());
    CheckPixels(tost::service::EncodedImagesToPixels(bytes, m, limits, "images"), images, m, k);
    return;
  }
  CheckPixels(tost::service::FloatTensorToPixels(
                  tost::service::ClassifyTensorView(request.tensor()), images, m, limits),
              images, m, k);
}

// kserve_service.cc's ModelInfer, up to the batcher.
void ModelInfer(const inference::ModelInferRequest& req, const ModelConfig& m,
                const ServiceLimits& limits) {
  if (req.inputs_size() != 1) return;
  const auto& in = req.inputs(0);
  const bool fp32 = in.name() == "image";
  if (!fp32 && in.name() != "image_bytes") return;
  if (req.raw_input_contents_size() != 0 && req.raw_input_contents_size() != 1) return;
  const auto& c = in.contents();
  int64_t images = 0;
  if (fp32) {
    if (in.datatype() != "FP32") return;
    const auto n =
        tost::service::ImagesInTensorShape(in.shape(), /*allow_unbatched=*/false, m, "shape");
    if (!n.ok()) return;
    images = *n;
  } else {
    if (in.datatype() != "BYTES") return;
    const auto& shape = in.shape();
    if (shape.empty() || shape.size() > 2 || (shape.size() == 2 && shape[1] != 1)) return;
    images = shape[0];
  }
  if (!tost::service::CheckImageCount(images, m, limits, "inputs[0].shape[0]").ok()) return;
  const int64_t k = std::max<int64_t>(1, req.outputs_size());
  if (fp32) {
    FloatTensorView view;
    view.shape = in.shape();
    view.shape_field = "shape";
    view.raw_field = "raw_input_contents[0]";
    view.values_field = "fp32_contents";
    if (req.raw_input_contents_size() > 0) {
      view.raw = req.raw_input_contents(0);
    } else {
      view.values = absl::MakeConstSpan(c.fp32_contents().data(),
                                        static_cast<size_t>(c.fp32_contents_size()));
    }
    CheckPixels(tost::service::FloatTensorToPixels(view, images, m, limits), images, m, k);
    return;
  }
  std::vector<std::string_view> encoded;
  if (req.raw_input_contents_size() > 0) {
    if (!SplitBytesTensor(req.raw_input_contents(0), images, &encoded)) return;
  } else {
    if (c.bytes_contents_size() != images) return;
    encoded.assign(c.bytes_contents().begin(), c.bytes_contents().end());
  }
  CheckPixels(tost::service::EncodedImagesToPixels(encoded, m, limits, "image_bytes"), images, m,
              k);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Invalid UTF-8 in a string field is a parse failure, which protobuf also logs: keep quiet.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const ModelConfig rgb = Model(false), gray = Model(true);
  static const ServiceLimits limits = Limits();
  const ModelConfig& m = (data[0] & 2) != 0 ? gray : rgb;
  const std::string_view message = tost::fuzz::Bytes(data + 1, size - 1);
  if ((data[0] & 1) == 0) {
    tost::v1::ClassifyRequest request;
    if (request.ParseFromArray(message.data(), static_cast<int>(message.size())))
      Classify(request, m, limits);
  } else {
    inference::ModelInferRequest request;
    if (request.ParseFromArray(message.data(), static_cast<int>(message.size())))
      ModelInfer(request, m, limits);
  }
  return 0;
}
