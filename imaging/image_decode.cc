#include "imaging/image_decode.h"

#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace tost::service {
namespace {

constexpr unsigned char kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

bool IsPng(std::string_view b) {
  return b.size() >= 8 && std::memcmp(b.data(), kPngSignature, 8) == 0;
}
// SOI marker followed by the start of another marker.
bool IsJpeg(std::string_view b) {
  return b.size() >= 3 && static_cast<uint8_t>(b[0]) == 0xFF &&
         static_cast<uint8_t>(b[1]) == 0xD8 && static_cast<uint8_t>(b[2]) == 0xFF;
}

absl::Status Invalid(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// libpng's simplified API keeps its state behind image.opaque; this frees it on every path.
struct PngImage {
  png_image image;
  PngImage() {
    std::memset(&image, 0, sizeof(image));
    image.version = PNG_IMAGE_VERSION;
  }
  ~PngImage() { png_image_free(&image); }
  PngImage(const PngImage&) = delete;
  PngImage& operator=(const PngImage&) = delete;
};

absl::Status BeginPng(std::string_view encoded, PngImage& png, const std::string& field) {
  if (png_image_begin_read_from_memory(&png.image, encoded.data(), encoded.size()) == 0) {
    return Invalid(field, absl::StrCat("damaged PNG header (libpng: ", png.image.message, ")"));
  }
  return absl::OkStatus();
}

struct TjHandle {
  tjhandle h = tjInitDecompress();
  ~TjHandle() {
    if (h != nullptr) tjDestroy(h);
  }
  TjHandle() = default;
  TjHandle(const TjHandle&) = delete;
  TjHandle& operator=(const TjHandle&) = delete;
};

struct JpegInfo {
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
};

absl::StatusOr<JpegInfo> JpegHeader(tjhandle h, std::string_view encoded,
                                    const std::string& field) {
  JpegInfo info;
  if (tjDecompressHeader3(h, reinterpret_cast<const unsigned char*>(encoded.data()),
                          static_cast<unsigned long>(encoded.size()), &info.width, &info.height,
                          &info.subsamp, &info.colorspace) != 0) {
    return Invalid(field,
                   absl::StrCat("damaged JPEG header (libjpeg-turbo: ", tjGetErrorStr2(h), ")"));
  }
  return info;
}

absl::Status CheckPixels(const ImageHeader& header, const ImageLimits& limits,
                         const std::string& field) {
  if (header.width <= 0 || header.height <= 0) {
    return Invalid(
        field, absl::StrCat(ImageFormatName(header.format), " header declares ", header.width, "x",
                            header.height, " pixels; both dimensions must be > 0"));
  }
  // Both are < 2^32, so the product fits in int64.
  const int64_t pixels = header.width * header.height;
  if (pixels > limits.max_decoded_pixels) {
    return Invalid(
        field, absl::StrCat(ImageFormatName(header.format), " header declares ", header.width, "x",
                            header.height, " = ", pixels, " pixels, more than max_decoded_pixels ",
                            limits.max_decoded_pixels, "; refused before decoding"));
  }
  // libpng's and TurboJPEG's row strides are 32-bit.
  if (header.width * 4 > std::numeric_limits<int32_t>::max()) {
    return Invalid(field,
                   absl::StrCat("image width ", header.width, " exceeds the decoders' limit of ",
                                std::numeric_limits<int32_t>::max() / 4, " pixels"));
  }
  return absl::OkStatus();
}

// ITU-R BT.601 luma in 16-bit fixed point with rounding: the same arithmetic as libjpeg's RGB→gray
// conversion and PIL's convert("L"), so PNG and JPEG inputs agree with those tools bit for bit.
uint8_t Luma601(uint8_t r, uint8_t g, uint8_t b) {
  return static_cast<uint8_t>((19595u * r + 38470u * g + 7471u * b + 32768u) >> 16);
}

absl::StatusOr<DecodedImage> DecodePng(std::string_view encoded, int64_t channels,
                                       const ImageLimits& limits, const std::string& field) {
  PngImage png;
  TOST_RETURN_IF_ERROR(BeginPng(encoded, png, field));
  const bool colour = (png.image.format & PNG_FORMAT_FLAG_COLOR) != 0;
  TOST_RETURN_IF_ERROR(CheckPixels(
      {ImageFormat::kPng, png.image.width, png.image.height, colour ? 3 : 1}, limits, field));
  // Read with alpha and drop it ourselves: asking libpng for an alpha-less format would composite
  // onto a background instead.
  const int64_t file_channels = colour ? 3 : 1;
  png.image.format = colour ? PNG_FORMAT_RGBA : PNG_FORMAT_GA;
  const int64_t stride = static_cast<int64_t>(png.image.width) * (file_channels + 1);
  std::vector<uint8_t> raw(static_cast<size_t>(stride) * png.image.height);
  if (png_image_finish_read(&png.image, nullptr, raw.data(), static_cast<png_int_32>(stride),
                            nullptr) == 0) {
    return Invalid(field,
                   absl::StrCat("damaged or truncated PNG (libpng: ", png.image.message, ")"));
  }
  DecodedImage out;
  out.width = png.image.width;
  out.height = png.image.height;
  out.channels = channels;
  const int64_t n = out.width * out.height;
  out.pixels.resize(static_cast<size_t>(n * channels));
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* p = raw.data() + i * (file_channels + 1);
    uint8_t* q = out.pixels.data() + i * channels;
    if (file_channels == 1) {
      for (int64_t c = 0; c < channels; ++c) q[c] = p[0];
    } else if (channels == 1) {
      q[0] = Luma601(p[0], p[1], p[2]);
    } else {
      q[0] = p[0], q[1] = p[1], q[2] = p[2];
    }
  }
  return out;
}

absl::StatusOr<DecodedImage> DecodeJpeg(std::string_view encoded, int64_t channels,
                                        const ImageLimits& limits, const std::string& field) {
  TjHandle tj;
  if (tj.h == nullptr)
    return absl::InternalError(absl::StrCat(field, ": could not create a TurboJPEG decompressor"));
  TOST_ASSIGN_OR_RETURN(JpegInfo info, JpegHeader(tj.h, encoded, field));
  TOST_RETURN_IF_ERROR(
      CheckPixels({ImageFormat::kJpeg, info.width, info.height, 3}, limits, field));
  if (info.colorspace == TJCS_CMYK || info.colorspace == TJCS_YCCK) {
    return Invalid(field, "CMYK/YCCK JPEG images are not supported; send RGB or grayscale");
  }
  DecodedImage out;
  out.width = info.width;
  out.height = info.height;
  out.channels = channels;
  out.pixels.resize(static_cast<size_t>(out.width * out.height * channels));
  // A colour JPEG decoded to TJPF_GRAY is its Y plane: BT.601 luma. Warnings (truncated data,
  // corrupt segments) stop decoding: a partly grey picture must not be classified.
  const int flags = TJFLAG_ACCURATEDCT | TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS;
  if (tjDecompress2(tj.h, reinterpret_cast<const unsigned char*>(encoded.data()),
                    static_cast<unsigned long>(encoded.size()), out.pixels.data(), info.width, 0,
                    info.height, channels == 1 ? TJPF_GRAY : TJPF_RGB, flags) != 0) {
    return Invalid(
        field,
        absl::StrCat("damaged or truncated JPEG (libjpeg-turbo: ", tjGetErrorStr2(tj.h), ")"));
  }
  return out;
}

struct Taps {
  int64_t first = 0;
  std::vector<float> weights;
};

// PIL's resampling coefficients for the triangle (bilinear) filter: support 1 pixel, widened by the
// downscale factor so every input pixel contributes (the antialiasing).
std::vector<Taps> BilinearTaps(int64_t in, int64_t out) {
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale;
  std::vector<Taps> taps(static_cast<size_t>(out));
  for (int64_t i = 0; i < out; ++i) {
    const double center = (static_cast<double>(i) + 0.5) * scale;
    const int64_t lo = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t hi = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in);
    Taps& t = taps[static_cast<size_t>(i)];
    t.first = lo;
    double total = 0;
    std::vector<double> w;
    for (int64_t x = lo; x < hi; ++x) {
      const double d = std::abs((static_cast<double>(x) - center + 0.5) / filter_scale);
      w.push_back(d < 1.0 ? 1.0 - d : 0.0);
      total += w.back();
    }
    for (double v : w) t.weights.push_back(static_cast<float>(total > 0 ? v / total : 0.0));
  }
  return taps;
}

}  // namespace

const char* ImageFormatName(ImageFormat f) { return f == ImageFormat::kPng ? "PNG" : "JPEG"; }

absl::StatusOr<ImageHeader> ReadImageHeader(std::string_view encoded, const std::string& field) {
  if (encoded.empty()) return Invalid(field, "image is empty; expected PNG or JPEG bytes");
  if (IsPng(encoded)) {
    PngImage png;
    TOST_RETURN_IF_ERROR(BeginPng(encoded, png, field));
    return ImageHeader{ImageFormat::kPng, png.image.width, png.image.height,
                       (png.image.format & PNG_FORMAT_FLAG_COLOR) != 0 ? 3 : 1};
  }
  if (IsJpeg(encoded)) {
    TjHandle tj;
    if (tj.h == nullptr)
      return absl::InternalError(
          absl::StrCat(field, ": could not create a TurboJPEG decompressor"));
    TOST_ASSIGN_OR_RETURN(JpegInfo info, JpegHeader(tj.h, encoded, field));
    const int64_t c = info.colorspace == TJCS_GRAY
                          ? 1
                          : (info.colorspace == TJCS_CMYK || info.colorspace == TJCS_YCCK ? 4 : 3);
    return ImageHeader{ImageFormat::kJpeg, info.width, info.height, c};
  }
  return Invalid(field, absl::StrCat("not a PNG or JPEG image (", encoded.size(),
                                     " bytes without a PNG signature or JPEG SOI marker)"));
}

absl::StatusOr<DecodedImage> DecodeImage(std::string_view encoded, int64_t channels,
                                         const ImageLimits& limits, const std::string& field) {
  if (channels != 1 && channels != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": images decode to 1 (gray) or 3 (RGB) channels, not ", channels));
  }
  if (static_cast<int64_t>(encoded.size()) > limits.max_encoded_bytes) {
    return Invalid(field,
                   absl::StrCat("encoded image of ", encoded.size(),
                                " bytes exceeds max_encoded_bytes ", limits.max_encoded_bytes));
  }
  if (encoded.empty()) return Invalid(field, "image is empty; expected PNG or JPEG bytes");
  if (IsPng(encoded)) return DecodePng(encoded, channels, limits, field);
  if (IsJpeg(encoded)) return DecodeJpeg(encoded, channels, limits, field);
  return Invalid(field, absl::StrCat("not a PNG or JPEG image (", encoded.size(),
                                     " bytes without a PNG signature or JPEG SOI marker)"));
}

std::vector<float> ResizeBilinearAntialias(const std::vector<float>& planar, int64_t channels,
                                           int64_t in_h, int64_t in_w, int64_t out_h,
                                           int64_t out_w) {
  if (in_h == out_h && in_w == out_w) return planar;
  const std::vector<Taps> tx = BilinearTaps(in_w, out_w);
  const std::vector<Taps> ty = BilinearTaps(in_h, out_h);
  std::vector<float> rows(static_cast<size_t>(channels * in_h * out_w));
  std::vector<float> out(static_cast<size_t>(channels * out_h * out_w));
  for (int64_t c = 0; c < channels; ++c) {
    // Horizontal pass: [in_h, in_w] → [in_h, out_w].
    for (int64_t y = 0; y < in_h; ++y) {
      const float* src = planar.data() + (c * in_h + y) * in_w;
      float* dst = rows.data() + (c * in_h + y) * out_w;
      for (int64_t x = 0; x < out_w; ++x) {
        const Taps& t = tx[static_cast<size_t>(x)];
        float acc = 0.f;
        for (size_t k = 0; k < t.weights.size(); ++k)
          acc += t.weights[k] * src[t.first + static_cast<int64_t>(k)];
        dst[x] = acc;
      }
    }
    // Vertical pass: [in_h, out_w] → [out_h, out_w].
    for (int64_t y = 0; y < out_h; ++y) {
      const Taps& t = ty[static_cast<size_t>(y)];
      float* dst = out.data() + (c * out_h + y) * out_w;
      for (int64_t x = 0; x < out_w; ++x) dst[x] = 0.f;
      for (size_t k = 0; k < t.weights.size(); ++k) {
        const float* src = rows.data() + (c * in_h + t.first + static_cast<int64_t>(k)) * out_w;
        for (int64_t x = 0; x < out_w; ++x) dst[x] += t.weights[k] * src[x];
      }
    }
  }
  return out;
}

absl::StatusOr<std::vector<float>> PreprocessImage(const DecodedImage& image,
                                                   const model::VisionConfig& config,
                                                   const std::string& field) {
  if (image.channels != config.in_chans) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": decoded image has ", image.channels,
                                                   " channels, the model takes in_chans ",
                                                   config.in_chans));
  }
  if (static_cast<int64_t>(config.mean.size()) != config.in_chans ||
      static_cast<int64_t>(config.std.size()) != config.in_chans) {
    return absl::FailedPreconditionError(
        absl::StrCat("model config preprocess has ", config.mean.size(), " means and ",
                     config.std.size(), " stds for in_chans ", config.in_chans));
  }
  const int64_t c = image.channels, h = image.height, w = image.width;
  std::vector<float> planar(static_cast<size_t>(c * h * w));
  for (int64_t y = 0; y < h; ++y) {
    for (int64_t x = 0; x < w; ++x) {
      for (int64_t k = 0; k < c; ++k) {
        planar[static_cast<size_t>((k * h + y) * w + x)] =
            static_cast<float>(image.pixels[static_cast<size_t>((y * w + x) * c + k)]) / 255.f;
      }
    }
  }
  std::vector<float> out =
      ResizeBilinearAntialias(planar, c, h, w, config.image_height, config.image_width);
  const int64_t plane = config.image_height * config.image_width;
  for (int64_t k = 0; k < c; ++k) {
    const float mean = config.mean[static_cast<size_t>(k)],
                std = config.std[static_cast<size_t>(k)];
    for (int64_t i = 0; i < plane; ++i) {
      float& v = out[static_cast<size_t>(k * plane + i)];
      v = (v - mean) / std;
    }
  }
  return out;
}

absl::StatusOr<std::vector<float>> DecodeAndPreprocess(std::string_view encoded,
                                                       const model::VisionConfig& config,
                                                       const ImageLimits& limits,
                                                       const std::string& field) {
  if (config.in_chans != 1 && config.in_chans != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": the model takes in_chans ", config.in_chans,
                     "; encoded images serve only 1 (gray) or 3 (RGB) channel models"));
  }
  TOST_ASSIGN_OR_RETURN(DecodedImage image, DecodeImage(encoded, config.in_chans, limits, field));
  return PreprocessImage(image, config, field);
}

}  // namespace tost::service
