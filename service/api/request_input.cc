#include "service/api/request_input.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace tost::service {
namespace {

// Raw tensor bytes are little-endian float32 in both protocols; they are copied as host floats.
static_assert(std::endian::native == std::endian::little,
              "raw tensor contents are copied as host floats");

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

int64_t ValuesPerImage(const model::VisionConfig& v) {
  return v.in_chans * v.image_height * v.image_width;
}

// Both input kinds become images × C × H × W floats, so one limit covers both; it is checked
// before a float is copied or an image decoded.
absl::Status CheckElementLimit(int64_t images, const model::ModelConfig& model,
                               const ServiceLimits& limits, const std::string& field) {
  const model::VisionConfig& v = model.vision;
  const int64_t elements = images * ValuesPerImage(v);
  if (elements <= limits.max_tensor_elements) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", images, " image(s) of ", v.in_chans, "x", v.image_height, "x",
                   v.image_width, " values for model ", model.name, " make ", elements,
                   " elements, more than the per-request limit of ", limits.max_tensor_elements));
}

}  // namespace

absl::StatusOr<int64_t> ImagesInTensorShape(absl::Span<const int64_t> shape, bool allow_unbatched,
                                            const model::ModelConfig& model,
                                            const std::string& field) {
  const model::VisionConfig& v = model.vision;
  const bool batched = shape.size() == 4;
  const bool unbatched = allow_unbatched && shape.size() == 3;
  if ((batched || unbatched) && shape[shape.size() - 3] == v.in_chans &&
      shape[shape.size() - 2] == v.image_height && shape[shape.size() - 1] == v.image_width) {
    return batched ? shape[0] : 1;
  }
  const std::string image =
      absl::StrCat("C=", v.in_chans, ",H=", v.image_height, ",W=", v.image_width);
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected images of shape [batch,", image, "]",
                   allow_unbatched ? absl::StrCat(" or [", image, "]") : "", " for model ",
                   model.name, ", got ", ShapeString(shape)));
}

absl::Status CheckImageCount(int64_t images, const model::ModelConfig& model,
                             const ServiceLimits& limits, const std::string& field) {
  if (images >= 1 && images <= limits.max_images_per_request) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": model ", model.name, " takes 1 to ", limits.max_images_per_request,
                   " images per request (--max_images_per_request), got ", images));
}

absl::StatusOr<std::vector<float>> FloatTensorToPixels(const FloatTensorView& tensor,
                                                       int64_t images,
                                                       const model::ModelConfig& model,
                                                       const ServiceLimits& limits) {
  TOST_RETURN_IF_ERROR(CheckElementLimit(images, model, limits, tensor.shape_field));
  const int64_t elements = images * ValuesPerImage(model.vision);
  std::vector<float> pixels;
  const std::string* source = nullptr;
  if (tensor.raw.has_value()) {
    if (!tensor.values.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(tensor.raw_field, " and ", tensor.values_field,
                                                     " are both set for model ", model.name,
                                                     "; send the values in one of them"));
    }
    const std::string_view raw = *tensor.raw;
    if (static_cast<int64_t>(raw.size()) != elements * 4) {
      return absl::InvalidArgumentError(absl::StrCat(
          tensor.raw_field, " holds ", raw.size(), " bytes, shape ", ShapeString(tensor.shape),
          " needs ", elements * 4, " (float32) for model ", model.name));
    }
    pixels.resize(static_cast<size_t>(elements));
    std::memcpy(pixels.data(), raw.data(), raw.size());
    source = &tensor.raw_field;
  } else {
    if (static_cast<int64_t>(tensor.values.size()) != elements) {
      return absl::InvalidArgumentError(
          absl::StrCat(tensor.values_field, " holds ", tensor.values.size(), " values, shape ",
                       ShapeString(tensor.shape), " needs ", elements, " for model ", model.name));
    }
    pixels.assign(tensor.values.begin(), tensor.values.end());
    source = &tensor.values_field;
  }
  // A NaN, an infinity or a huge finite value would not fail the model: the squared statistics
  // of its attention overflow, and it would come back as NaN probabilities with nothing to say
  // which input caused them. Preprocessed pixels are a few units; kMaxPixelMagnitude leaves
  // every statistic far inside float range.
  const auto bad = std::find_if(pixels.begin(), pixels.end(), [](float x) {
    return !std::isfinite(x) || std::abs(x) > kMaxPixelMagnitude;
  });
  if (bad != pixels.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        *source, " holds ", *bad, " at element ", bad - pixels.begin(), "; model ", model.name,
        " takes finite preprocessed pixels (no NaN or infinite values) of magnitude at most ",
        kMaxPixelMagnitude));
  }
  return pixels;
}

absl::StatusOr<std::vector<float>> EncodedImagesToPixels(absl::Span<const std::string_view> images,
                                                         const model::ModelConfig& model,
                                                         const ServiceLimits& limits,
                                                         const std::string& field) {
  const int64_t count = static_cast<int64_t>(images.size());
  TOST_RETURN_IF_ERROR(CheckElementLimit(count, model, limits, field));
  // Every image is resized to the model's input, so a decode far larger than that input only
  // costs memory: the decoded size is bounded relative to the model as well as by the server.
  ImageLimits image_limits = limits.image;
  image_limits.max_decoded_pixels = std::min(
      image_limits.max_decoded_pixels,
      kMaxDecodedPixelsPerModelPixel * model.vision.image_height * model.vision.image_width);
  std::vector<float> pixels;
  pixels.reserve(static_cast<size_t>(count * ValuesPerImage(model.vision)));
  for (int64_t i = 0; i < count; ++i) {
    TOST_ASSIGN_OR_RETURN(
        std::vector<float> one,
        DecodeAndPreprocess(images[static_cast<size_t>(i)], model.vision, image_limits,
                            absl::StrCat(field, "[", i, "] for model ", model.name)));
    pixels.insert(pixels.end(), one.begin(), one.end());
  }
  return pixels;
}

std::vector<float> Softmax(absl::Span<const float> logits) {
  if (logits.empty()) return {};
  const double max_logit = *std::max_element(logits.begin(), logits.end());
  std::vector<double> e(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    total += e[i] = std::exp(static_cast<double>(logits[i]) - max_logit);
  }
  std::vector<float> probabilities(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) probabilities[i] = static_cast<float>(e[i] / total);
  return probabilities;
}

absl::StatusOr<std::vector<float>> SoftmaxRows(absl::Span<const float> logits, int64_t images,
                                               const model::ModelConfig& model) {
  const int64_t classes = model.vision.num_classes;
  if (classes < 1 || images < 0 || static_cast<int64_t>(logits.size()) != images * classes) {
    return absl::InternalError(absl::StrCat("model ", model.name, " returned ", logits.size(),
                                            " logits for ", images, " images of ", classes,
                                            " classes; expected ", images * classes));
  }
  // Inputs are bounded so that this cannot happen; if the model still overflowed, say so rather
  // than answer NaN probabilities with OK.
  const auto bad =
      std::find_if(logits.begin(), logits.end(), [](float x) { return !std::isfinite(x); });
  if (bad != logits.end()) {
    return absl::InternalError(absl::StrCat("model ", model.name, " produced a non-finite logit (",
                                            *bad, " at element ", bad - logits.begin(), ")"));
  }
  std::vector<float> probabilities;
  probabilities.reserve(logits.size());
  for (int64_t b = 0; b < images; ++b) {
    const std::vector<float> row =
        Softmax(logits.subspan(static_cast<size_t>(b * classes), static_cast<size_t>(classes)));
    probabilities.insert(probabilities.end(), row.begin(), row.end());
  }
  return probabilities;
}

std::vector<int64_t> TopK(absl::Span<const float> values, int64_t k) {
  const int64_t n = static_cast<int64_t>(values.size());
  k = std::clamp<int64_t>(k, 0, n);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
    const float va = values[static_cast<size_t>(a)], vb = values[static_cast<size_t>(b)];
    return va > vb || (va == vb && a < b);
  });
  order.resize(static_cast<size_t>(k));
  return order;
}

}  // namespace tost::service
