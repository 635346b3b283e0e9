// The input layer both front ends (tost.v1 and KServe v2) share: the limits on what one request
// may carry, and the checks and conversions of classification inputs (float tensors and encoded
// images) and outputs (softmax, top-k), so that each check is written once and both protocols
// refuse the same input with the same words.
//
// It knows no protocol: a front end hands it views of its request and the names of the request's
// fields, which every message repeats together with the model's name, what was expected and what
// was received. Every error is INVALID_ARGUMENT unless said otherwise.
//
// A classification request goes through it in this order, so that a full queue refuses a request
// before any work on its payload:
//   1. ImagesInTensorShape (float tensors) or the number of encoded images: how many images;
//   2. CheckImageCount: the per-request image limit;
//   3. (the front end reserves a place in the model's batcher);
//   4. FloatTensorToPixels or EncodedImagesToPixels: the element limit, the values themselves;
//   5. (classification) SoftmaxRows, then TopK per image.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "imaging/image_decode.h"
#include "model/config/config.h"

namespace tost::service {

struct ServiceLimits {
  // Images per classification request (--max_images_per_request); never more than the dynamic
  // batcher's images per batch (--max_batch_images), since a request is never split.
  int64_t max_images_per_request = 8;
  int64_t max_tensor_elements = 64LL << 20;  // floats per classification request
  int64_t max_prompt_bytes = 1 << 20;        // bytes (or token ids) per Generate prompt
  int32_t max_new_tokens = 4096;             // ceiling on GenerateRequest.max_new_tokens
  int32_t default_max_new_tokens = 64;       // when the request leaves it at 0
  int32_t default_top_k_labels = 5;          // when ClassifyRequest.top_k is 0
  ImageLimits image;                         // encoded images: Classify.images, KServe BYTES
  // Bytes of one request message once inflated, when the client compressed it (gRPC checks the
  // bytes as sent against --max_message_bytes; this is the same flag, applied after inflating).
  int64_t max_request_bytes = 64 << 20;
};

// The number of images a float32 image tensor's shape declares: N for [N,C,H,W], or 1 for
// [C,H,W] when `allow_unbatched`, where C, H and W must be the model's in_chans, image_height and
// image_width. N itself is not checked here: CheckImageCount does, before anything multiplies it.
// `field` names the shape (e.g. "tensor.shape").
absl::StatusOr<int64_t> ImagesInTensorShape(absl::Span<const int64_t> shape, bool allow_unbatched,
                                            const model::ModelConfig& model,
                                            const std::string& field);

// The per-request image limit, 1 to limits.max_images_per_request, checked once per request by
// the front end before it reserves a place in the batcher (the batcher checks its own batch limit).
// `field` names where the count came from (e.g. "images", "inputs[0].shape[0]").
absl::Status CheckImageCount(int64_t images, const model::ModelConfig& model,
                             const ServiceLimits& limits, const std::string& field);

// The largest pixel magnitude a float tensor may carry (preprocessed pixels are a few units).
inline constexpr float kMaxPixelMagnitude = 1e6f;
// An encoded image may decode to at most this many times the model's input pixels (and at most
// ImageLimits::max_decoded_pixels): 1 MPixel for a 32×32 model, 51 MPixel for 224×224.
inline constexpr int64_t kMaxDecodedPixelsPerModelPixel = 1024;

// A float32 image tensor as a request carries it: views into the request, valid during the call.
struct FloatTensorView {
  absl::Span<const int64_t> shape;      // as ImagesInTensorShape accepted it
  std::optional<std::string_view> raw;  // little-endian float32 bytes, when the request sent them
  absl::Span<const float> values;       // else the values one by one
  std::string shape_field;              // e.g. "tensor.shape"
  std::string raw_field;                // e.g. "tensor.raw"
  std::string values_field;             // e.g. "tensor.data"
};

// The tensor's values as preprocessed pixels [images, C, H, W], where `images` is what
// ImagesInTensorShape returned and CheckImageCount accepted: the element limit, raw bytes xor
// values, their number against the shape, and finite values of magnitude <= kMaxPixelMagnitude.
absl::StatusOr<std::vector<float>> FloatTensorToPixels(const FloatTensorView& tensor,
                                                       int64_t images,
                                                       const model::ModelConfig& model,
                                                       const ServiceLimits& limits);

// Encoded PNG/JPEG images, as many as CheckImageCount accepted, decoded and preprocessed to the
// model's resolution (DecodeAndPreprocess) so that they batch together: pixels [images, C, H, W].
// The element limit is checked before any image is decoded, and each image's declared size against
// min(limits.image.max_decoded_pixels, kMaxDecodedPixelsPerModelPixel × the model's pixels).
// `field` names the images; image i is called "<field>[i]" (e.g. "images[2]").
absl::StatusOr<std::vector<float>> EncodedImagesToPixels(absl::Span<const std::string_view> images,
                                                         const model::ModelConfig& model,
                                                         const ServiceLimits& limits,
                                                         const std::string& field);

// Softmax of one row of logits, accumulated in double after subtracting the row's largest logit,
// so that large logits cannot overflow and small probabilities keep their precision. Empty in,
// empty out.
std::vector<float> Softmax(absl::Span<const float> logits);

// Softmax of every row of logits [images, num_classes] as the model returned them. INTERNAL when
// their number is not images × num_classes or one is not finite: the model failed, not the
// client, and a NaN probability is never an answer.
absl::StatusOr<std::vector<float>> SoftmaxRows(absl::Span<const float> logits, int64_t images,
                                               const model::ModelConfig& model);

// The indices of the min(k, values.size()) largest values, largest first; equal values in index
// order, so that the answer does not depend on the sort.
std::vector<int64_t> TopK(absl::Span<const float> values, int64_t k);

}  // namespace tost::service
