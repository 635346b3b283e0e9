// Encoded images (PNG via libpng, JPEG via libturbojpeg) to the float32 [C,H,W] tensor a vision
// model takes, preprocessed as its config says:
//   1. header only: format, declared width × height; refused against ImageLimits before any pixel
//      buffer exists (a few hundred bytes can declare 100000 × 100000 pixels: a decompression
//      bomb);
//   2. decode to 8 bits per channel, gray or RGB; an alpha channel is dropped (as PIL's convert()
//      does: transparent pixels keep their stored colour);
//   3. to the model's channels: RGB → gray is ITU-R BT.601 luma Y = 0.299 R + 0.587 G + 0.114 B
//      (JPEGs decode straight to their Y plane, which is that same luma); gray → RGB replicates;
//   4. scale to [0,1] (value / 255);
//   5. resize to image_height × image_width with antialiased bilinear resampling: a triangle
//      filter whose support widens with the downscale factor, half-pixel centres, taps outside the
//      image dropped and the rest renormalised. This is PIL's BILINEAR and torch's
//      interpolate(mode="bilinear", antialias=True, align_corners=False), computed in float with no
//      intermediate rounding; a same-size image is copied exactly;
//   6. normalise per channel: (x - mean[c]) / std[c].
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config/config.h"

namespace tost::service {

struct ImageLimits {
  int64_t max_encoded_bytes = 16LL << 20;   // bytes of one encoded image
  int64_t max_decoded_pixels = 40'000'000;  // width × height declared in the image header
};

enum class ImageFormat { kPng, kJpeg };
const char* ImageFormatName(ImageFormat f);

struct ImageHeader {
  ImageFormat format = ImageFormat::kPng;
  int64_t width = 0;
  int64_t height = 0;
  int64_t channels =
      0;  // colour channels stored in the file: 1 (gray) or 3 (colour); alpha not counted
};

// 8 bits per channel, interleaved, row-major: pixels[(y * width + x) * channels + c].
struct DecodedImage {
  int64_t width = 0;
  int64_t height = 0;
  int64_t channels = 0;  // 1 or 3
  std::vector<uint8_t> pixels;
};

// Reads only the signature and header. INVALID_ARGUMENT for neither PNG nor JPEG or a damaged
// header. `field` names the request field in every message (e.g. "images[2]").
absl::StatusOr<ImageHeader> ReadImageHeader(std::string_view encoded, const std::string& field);

// Checks the encoded size and the declared pixel count against `limits` (INVALID_ARGUMENT naming
// the field and the limit), then decodes to `channels` (1 or 3) channels. A truncated or damaged
// image is INVALID_ARGUMENT, never a partly decoded picture.
absl::StatusOr<DecodedImage> DecodeImage(std::string_view encoded, int64_t channels,
                                         const ImageLimits& limits, const std::string& field);

// Antialiased bilinear resize of planar float data [channels, in_h, in_w] → [channels, out_h,
// out_w].
std::vector<float> ResizeBilinearAntialias(const std::vector<float>& planar, int64_t channels,
                                           int64_t in_h, int64_t in_w, int64_t out_h,
                                           int64_t out_w);

// Steps 3–6 above for an already decoded image: float32 [in_chans, image_height, image_width].
absl::StatusOr<std::vector<float>> PreprocessImage(const DecodedImage& image,
                                                   const model::VisionConfig& config,
                                                   const std::string& field);

// DecodeImage + PreprocessImage for a model: float32 [in_chans, image_height, image_width].
absl::StatusOr<std::vector<float>> DecodeAndPreprocess(std::string_view encoded,
                                                       const model::VisionConfig& config,
                                                       const ImageLimits& limits,
                                                       const std::string& field);

}  // namespace tost::service
