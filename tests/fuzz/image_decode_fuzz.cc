// libFuzzer target: PNG and JPEG decoding and preprocessing (imaging/image_decode.h) on
// arbitrary bytes, as a Classify request's `images` or a KServe BYTES input carries them: the
// header read, the decode to RGB (checked against the header), preprocessing to a downscaled
// RGB model input, and DecodeAndPreprocess to a non-square gray one (tiny seed images are
// upscaled by it). Preprocessed pixels are a convex combination of x/255 normalised by the
// config's mean and std, so they must lie in [(0-mean)/std, (1-mean)/std].
//
// The limits are smaller than the server's defaults (16 MiB, 40 million pixels) so that an input
// declaring a large image costs milliseconds, not seconds; the checks are the same code.
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "imaging/image_decode.h"
#include "model/config/config.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using tost::model::VisionConfig;
using tost::service::ImageLimits;

VisionConfig Config(int64_t channels, int64_t height, int64_t width, float mean, float std) {
  VisionConfig c;
  c.in_chans = channels;
  c.image_height = height;
  c.image_width = width;
  c.mean.assign(static_cast<size_t>(channels), mean);
  c.std.assign(static_cast<size_t>(channels), std);
  return c;
}

void CheckPixels(const std::vector<float>& pixels, const VisionConfig& c) {
  TOST_FUZZ_CHECK(static_cast<int64_t>(pixels.size()) ==
                  c.in_chans * c.image_height * c.image_width);
  const float lo = (0.f - c.mean[0]) / c.std[0], hi = (1.f - c.mean[0]) / c.std[0];
  const float slack = 1e-3f * (hi - lo);
  for (const float v : pixels)
    TOST_FUZZ_CHECK(std::isfinite(v) && v >= lo - slack && v <= hi + slack);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const VisionConfig rgb = Config(3, 8, 8, 0.5f, 0.25f);
  static const VisionConfig gray = Config(1, 5, 7, 0.1f, 0.3f);
  ImageLimits limits;
  limits.max_encoded_bytes = 1 << 20;
  limits.max_decoded_pixels = 1 << 20;
  const std::string_view encoded = tost::fuzz::Bytes(data, size);

  const auto header = tost::service::ReadImageHeader(encoded, "images[0]");
  const auto image = tost::service::DecodeImage(encoded, 3, limits, "images[0]");
  if (image.ok()) {
    TOST_FUZZ_CHECK(header.ok());
    TOST_FUZZ_CHECK(image->width == header->width && image->height == header->height);
    TOST_FUZZ_CHECK(image->channels == 3);
    TOST_FUZZ_CHECK(static_cast<int64_t>(image->pixels.size()) == image->width * image->height * 3);
    const auto pixels = tost::service::PreprocessImage(*image, rgb, "images[0]");
    TOST_FUZZ_CHECK(pixels.ok());
    CheckPixels(*pixels, rgb);
  }
  // Decoded again (to gray) only when the header read: most mutated inputs stop before that.
  if (header.ok()) {
    const auto pixels = tost::service::DecodeAndPreprocess(encoded, gray, limits, "images[0]");
    if (pixels.ok()) CheckPixels(*pixels, gray);
  }
  return 0;
}
