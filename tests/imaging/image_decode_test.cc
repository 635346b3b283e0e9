// Image decoding and preprocessing: PNG/JPEG round trips (encoded here with the same libraries),
// channel conversion, resampling against hand-computed coefficients, normalisation, damaged input
// and limits checked before decoding (decompression bombs).
#include "imaging/image_decode.h"

#include <png.h>
#include <turbojpeg.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tost::service {
namespace {

using ::testing::HasSubstr;

// Deterministic pixel values with structure (gradients + a pattern), interleaved HWC.
std::vector<uint8_t> TestPixels(int w, int h, int c) {
  std::vector<uint8_t> p(static_cast<size_t>(w * h * c));
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int k = 0; k < c; ++k) {
        p[static_cast<size_t>((y * w + x) * c + k)] =
            static_cast<uint8_t>((x * 37 + y * 11 + k * 85 + (x ^ y) * 3) % 256);
      }
    }
  }
  return p;
}

std::string EncodePng(const std::vector<uint8_t>& pixels, int w, int h, png_uint_32 format) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(w);
  image.height = static_cast<png_uint_32>(h);
  image.format = format;
  png_alloc_size_t size = 0;
  EXPECT_NE(png_image_write_to_memory(&image, nullptr, &size, 0, pixels.data(), 0, nullptr), 0)
      << image.message;
  std::string out(size, '\0');
  EXPECT_NE(png_image_write_to_memory(&image, out.data(), &size, 0, pixels.data(), 0, nullptr), 0)
      << image.message;
  out.resize(size);
  return out;
}

// pixel_format TJPF_RGB / TJPF_GRAY / TJPF_CMYK; subsampling TJSAMP_444 / TJSAMP_GRAY.
std::string EncodeJpeg(const std::vector<uint8_t>& pixels, int w, int h, int pixel_format,
                       int subsampling, int quality = 100) {
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(tj, pixels.data(), w, 0, h, pixel_format, &buf, &size, subsampling, quality,
                        TJFLAG_ACCURATEDCT),
            0)
      << tjGetErrorStr2(tj);
  std::string out(reinterpret_cast<char*>(buf), size);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

uint32_t Crc32(const uint8_t* data, size_t n) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= data[i];
    for (int b = 0; b < 8; ++b) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

void PutBe32(std::string& s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + i] = static_cast<char>((v >> (24 - 8 * i)) & 0xFF);
}

// Rewrites the IHDR dimensions (and its CRC, so libpng accepts the header as valid).
std::string PngWithDeclaredSize(std::string png, uint32_t w, uint32_t h) {
  // signature (8) | length (4) | "IHDR" (4) | width (4) | height (4) | 5 bytes | CRC (4)
  EXPECT_EQ(png.substr(12, 4), "IHDR");
  PutBe32(png, 16, w);
  PutBe32(png, 20, h);
  PutBe32(png, 29, Crc32(reinterpret_cast<const uint8_t*>(png.data()) + 12, 17));
  return png;
}

// Rewrites the SOF0 frame header's dimensions.
std::string JpegWithDeclaredSize(std::string jpeg, uint16_t w, uint16_t h) {
  for (size_t i = 2; i + 9 < jpeg.size(); ++i) {
    if (static_cast<uint8_t>(jpeg[i]) == 0xFF && static_cast<uint8_t>(jpeg[i + 1]) == 0xC0) {
      // FF C0 | length (2) | precision (1) | height (2) | width (2)
      jpeg[i + 5] = static_cast<char>(h >> 8), jpeg[i + 6] = static_cast<char>(h & 0xFF);
      jpeg[i + 7] = static_cast<char>(w >> 8), jpeg[i + 8] = static_cast<char>(w & 0xFF);
      return jpeg;
    }
  }
  ADD_FAILURE() << "no SOF0 marker";
  return jpeg;
}

model::VisionConfig Config(int64_t chans, int64_t h, int64_t w, std::vector<float> mean,
                           std::vector<float> std) {
  model::VisionConfig v;
  v.in_chans = chans;
  v.image_height = h;
  v.image_width = w;
  v.mean = std::move(mean);
  v.std = std::move(std);
  return v;
}

int MaxAbsDiff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  EXPECT_EQ(a.size(), b.size());
  int m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    m = std::max(m, std::abs(int(a[i]) - int(b[i])));
  return m;
}

TEST(ImageDecode, PngRgbRoundTripIsExact) {
  const auto pixels = TestPixels(7, 5, 3);
  const std::string png = EncodePng(pixels, 7, 5, PNG_FORMAT_RGB);
  auto header = ReadImageHeader(png, "img");
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->format, ImageFormat::kPng);
  EXPECT_EQ(header->width, 7);
  EXPECT_EQ(header->height, 5);
  EXPECT_EQ(header->channels, 3);
  auto image = DecodeImage(png, 3, ImageLimits{}, "img");
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(image->width, 7);
  EXPECT_EQ(image->height, 5);
  EXPECT_EQ(image->channels, 3);
  EXPECT_EQ(image->pixels, pixels);
}

TEST(ImageDecode, PngGrayRoundTripAndReplicationToRgb) {
  const auto gray = TestPixels(6, 4, 1);
  const std::string png = EncodePng(gray, 6, 4, PNG_FORMAT_GRAY);
  EXPECT_EQ(ReadImageHeader(png, "img")->channels, 1);
  auto one = DecodeImage(png, 1, ImageLimits{}, "img");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->pixels, gray);
  auto three = DecodeImage(png, 3, ImageLimits{}, "img");
  ASSERT_TRUE(three.ok()) << three.status();
  ASSERT_EQ(three->pixels.size(), gray.size() * 3);
  for (size_t i = 0; i < gray.size(); ++i) {
    for (int c = 0; c < 3; ++c) EXPECT_EQ(three->pixels[i * 3 + c], gray[i]);
  }
}

TEST(ImageDecode, RgbToGrayIsBt601Luma) {
  // Primaries: Y = 0.299 R + 0.587 G + 0.114 B, rounded.
  const std::vector<uint8_t> px = {255, 0,   0,   0, 255, 0, 0,  0,   255,
                                   255, 255, 255, 0, 0,   0, 10, 200, 90};
  const std::string png = EncodePng(px, 6, 1, PNG_FORMAT_RGB);
  auto g = DecodeImage(png, 1, ImageLimits{}, "img");
  ASSERT_TRUE(g.ok()) << g.status();
  // 76.245, 149.685, 29.07, 255, 0, and 2.99 + 117.4 + 10.26 = 130.65
  EXPECT_EQ(g->pixels, (std::vector<uint8_t>{76, 150, 29, 255, 0, 131}));
}

TEST(ImageDecode, RgbToGrayMatchesFloatingPointLumaWithinRounding) {
  const auto px = TestPixels(16, 16, 3);
  auto g = DecodeImage(EncodePng(px, 16, 16, PNG_FORMAT_RGB), 1, ImageLimits{}, "img");
  ASSERT_TRUE(g.ok()) << g.status();
  for (size_t i = 0; i < g->pixels.size(); ++i) {
    const double y = 0.299 * px[i * 3] + 0.587 * px[i * 3 + 1] + 0.114 * px[i * 3 + 2];
    EXPECT_LE(std::abs(g->pixels[i] - y), 0.5 + 1e-3) << "pixel " << i;
  }
}

TEST(ImageDecode, PngAlphaIsDroppedNotComposited) {
  // One opaque and one fully transparent pixel: both keep their stored colour.
  const std::vector<uint8_t> rgba = {10, 20, 30, 255, 200, 100, 50, 0};
  auto image = DecodeImage(EncodePng(rgba, 2, 1, PNG_FORMAT_RGBA), 3, ImageLimits{}, "img");
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(image->pixels, (std::vector<uint8_t>{10, 20, 30, 200, 100, 50}));
}

TEST(ImageDecode, JpegRgbRoundTripIsClose) {
  // A smooth image at quality 100 without chroma subsampling decodes within a few levels.
  std::vector<uint8_t> px(static_cast<size_t>(24 * 16 * 3));
  for (int y = 0; y < 16; ++y) {
    for (int x = 0; x < 24; ++x) {
      px[(y * 24 + x) * 3 + 0] = static_cast<uint8_t>(x * 10);
      px[(y * 24 + x) * 3 + 1] = static_cast<uint8_t>(y * 15);
      px[(y * 24 + x) * 3 + 2] = static_cast<uint8_t>(128);
    }
  }
  const std::string jpeg = EncodeJpeg(px, 24, 16, TJPF_RGB, TJSAMP_444);
  auto header = ReadImageHeader(jpeg, "img");
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->format, ImageFormat::kJpeg);
  EXPECT_EQ(header->width, 24);
  EXPECT_EQ(header->height, 16);
  EXPECT_EQ(header->channels, 3);
  auto rgb = DecodeImage(jpeg, 3, ImageLimits{}, "img");
  ASSERT_TRUE(rgb.ok()) << rgb.status();
  EXPECT_LE(MaxAbsDiff(rgb->pixels, px), 4);
  // Decoded to gray, a colour JPEG gives its BT.601 luma.
  auto gray = DecodeImage(jpeg, 1, ImageLimits{}, "img");
  ASSERT_TRUE(gray.ok()) << gray.status();
  ASSERT_EQ(gray->pixels.size(), px.size() / 3);
  for (size_t i = 0; i < gray->pixels.size(); ++i) {
    const double y = 0.299 * px[i * 3] + 0.587 * px[i * 3 + 1] + 0.114 * px[i * 3 + 2];
    EXPECT_LE(std::abs(gray->pixels[i] - y), 3.0) << "pixel " << i;
  }
}

TEST(ImageDecode, JpegGrayRoundTripIsClose) {
  std::vector<uint8_t> px(16 * 8);
  for (int i = 0; i < 16 * 8; ++i) px[i] = static_cast<uint8_t>((i % 16) * 16);
  const std::string jpeg = EncodeJpeg(px, 16, 8, TJPF_GRAY, TJSAMP_GRAY);
  EXPECT_EQ(ReadImageHeader(jpeg, "img")->channels, 1);
  auto gray = DecodeImage(jpeg, 1, ImageLimits{}, "img");
  ASSERT_TRUE(gray.ok()) << gray.status();
  EXPECT_LE(MaxAbsDiff(gray->pixels, px), 3);
  auto rgb = DecodeImage(jpeg, 3, ImageLimits{}, "img");
  ASSERT_TRUE(rgb.ok()) << rgb.status();
  for (size_t i = 0; i < gray->pixels.size(); ++i) {
    for (int c = 0; c < 3; ++c) EXPECT_EQ(rgb->pixels[i * 3 + c], gray->pixels[i]);
  }
}

TEST(ImageDecode, CmykJpegIsRefusedByName) {
  const auto px = TestPixels(8, 8, 4);
  const std::string jpeg = EncodeJpeg(px, 8, 8, TJPF_CMYK, TJSAMP_444);
  EXPECT_EQ(ReadImageHeader(jpeg, "img")->channels, 4);
  auto r = DecodeImage(jpeg, 3, ImageLimits{}, "images[3]");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("images[3]: CMYK"));
}

TEST(ImageDecode, TruncatedAndGarbageInputsAreInvalidArgument) {
  const auto px = TestPixels(32, 32, 3);
  const std::string png = EncodePng(px, 32, 32, PNG_FORMAT_RGB);
  const std::string jpeg = EncodeJpeg(px, 32, 32, TJPF_RGB, TJSAMP_420, 90);
  struct Case {
    std::string name, bytes, fragment;
  };
  const std::vector<Case> cases = {
      {"truncated png", png.substr(0, png.size() / 2), "damaged or truncated PNG"},
      {"png header only", png.substr(0, 40), "PNG"},
      {"png signature then garbage", png.substr(0, 8) + std::string(64, 'x'), "damaged PNG header"},
      {"corrupt png idat",
       [&] {
         std::string s = png;
         for (size_t i = 60; i < s.size() - 20; ++i) s[i] ^= 0x5A;
         return s;
       }(),
       "PNG"},
      {"truncated jpeg", jpeg.substr(0, jpeg.size() / 2), "damaged or truncated JPEG"},
      {"jpeg soi then garbage", jpeg.substr(0, 3) + std::string(64, '\x17'), "damaged JPEG header"},
      {"garbage", std::string("GIF89a this is not an image at all"), "not a PNG or JPEG image"},
      {"empty", std::string(), "image is empty"},
  };
  for (const Case& c : cases) {
    auto r = DecodeImage(c.bytes, 3, ImageLimits{}, "images[0]");
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << c.name << ": " << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("images[0]: ")) << c.name;
    EXPECT_THAT(r.status().message(), HasSubstr(c.fragment)) << c.name << ": " << r.status();
  }
}

TEST(ImageDecode, PngBombIsRefusedFromItsHeader) {
  // ~100 bytes declaring 100000 x 100000 pixels (40 GB as RGBA). The header is valid (libpng reads
  // it), so only our limit stands between it and the allocation.
  const std::string bomb =
      PngWithDeclaredSize(EncodePng(TestPixels(2, 2, 3), 2, 2, PNG_FORMAT_RGB), 100000, 100000);
  ASSERT_LT(bomb.size(), 200u);
  auto header = ReadImageHeader(bomb, "img");
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->width, 100000);
  EXPECT_EQ(header->height, 100000);
  auto r = DecodeImage(bomb, 3, ImageLimits{}, "images[1]");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("images[1]: PNG header declares 100000x100000 = 10000000000 pixels"));
  EXPECT_THAT(r.status().message(), HasSubstr("max_decoded_pixels 40000000"));
}

TEST(ImageDecode, JpegBombIsRefusedFromItsHeader) {
  const std::string bomb = JpegWithDeclaredSize(
      EncodeJpeg(TestPixels(8, 8, 3), 8, 8, TJPF_RGB, TJSAMP_444), 60000, 60000);
  auto header = ReadImageHeader(bomb, "img");
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->width, 60000);
  auto r = DecodeImage(bomb, 1, ImageLimits{}, "image");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("image: JPEG header declares 60000x60000 = 3600000000 pixels"));
  EXPECT_THAT(r.status().message(), HasSubstr("max_decoded_pixels"));
}

TEST(ImageDecode, PixelLimitIsInclusive) {
  const std::string png = EncodePng(TestPixels(64, 64, 3), 64, 64, PNG_FORMAT_RGB);
  ImageLimits limits;
  limits.max_decoded_pixels = 64 * 64;
  EXPECT_TRUE(DecodeImage(png, 3, limits, "img").ok());
  limits.max_decoded_pixels = 64 * 64 - 1;
  auto r = DecodeImage(png, 3, limits, "img");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(),
              HasSubstr("64x64 = 4096 pixels, more than max_decoded_pixels 4095"));
}

TEST(ImageDecode, EncodedByteLimitIsCheckedFirst) {
  const std::string png = EncodePng(TestPixels(16, 16, 3), 16, 16, PNG_FORMAT_RGB);
  ImageLimits limits;
  limits.max_encoded_bytes = static_cast<int64_t>(png.size());
  EXPECT_TRUE(DecodeImage(png, 3, limits, "img").ok());
  limits.max_encoded_bytes = static_cast<int64_t>(png.size()) - 1;
  auto r = DecodeImage(png, 3, limits, "images[0]");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("images[0]: encoded image of " + std::to_string(png.size()) +
                        " bytes exceeds max_encoded_bytes " + std::to_string(png.size() - 1)));
  // Oversized garbage is refused for its size, before anyone looks at it.
  auto g = DecodeImage(std::string(png.size(), 'z'), 3, limits, "img");
  EXPECT_THAT(g.status().message(), HasSubstr("max_encoded_bytes"));
}

TEST(ImageResize, SameSizeIsAnExactCopy) {
  std::vector<float> in(2 * 3 * 5);
  for (size_t i = 0; i < in.size(); ++i) in[i] = std::sin(static_cast<float>(i));
  EXPECT_EQ(ResizeBilinearAntialias(in, 2, 3, 5, 3, 5), in);
}

TEST(ImageResize, DownscaleUsesWidenedTriangleFilter) {
  // 1x4 → 1x2: scale 2, support 2. Output 0 (centre 1.0) has taps 0,1,2 with weights
  // 0.75, 0.75, 0.25 (normalised by 1.75); output 1 (centre 3.0) has taps 1,2,3 with 0.25, 0.75,
  // 0.75.
  const std::vector<float> out = ResizeBilinearAntialias({0, 1, 2, 3}, 1, 1, 4, 1, 2);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_NEAR(out[0], (0 * 0.75 + 1 * 0.75 + 2 * 0.25) / 1.75, 1e-6);
  EXPECT_NEAR(out[1], (1 * 0.25 + 2 * 0.75 + 3 * 0.75) / 1.75, 1e-6);
}

TEST(ImageResize, UpscaleIsHalfPixelBilinearWithClampedEdges) {
  const std::vector<float> out = ResizeBilinearAntialias({0, 1}, 1, 1, 2, 1, 4);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_NEAR(out[0], 0.0, 1e-6);
  EXPECT_NEAR(out[1], 0.25, 1e-6);
  EXPECT_NEAR(out[2], 0.75, 1e-6);
  EXPECT_NEAR(out[3], 1.0, 1e-6);
}

TEST(ImageResize, SeparableIn2DAndPreservesConstants) {
  // A constant stays constant at any size; a 2x2 block average is what 4x4 → 2x2 gives for a
  // pattern constant within each 2x2 block's neighbourhood rows/columns.
  std::vector<float> flat(3 * 9 * 13, 0.375f);
  for (float v : ResizeBilinearAntialias(flat, 3, 9, 13, 4, 7)) EXPECT_NEAR(v, 0.375f, 1e-6);
  for (float v : ResizeBilinearAntialias(flat, 3, 9, 13, 20, 31)) EXPECT_NEAR(v, 0.375f, 1e-6);
  // Rows vary only along y: the result must too, and equal the 1-D resize of the column.
  std::vector<float> rows(4 * 4);
  for (int y = 0; y < 4; ++y) {
    for (int x = 0; x < 4; ++x) rows[y * 4 + x] = static_cast<float>(y);
  }
  const std::vector<float> out = ResizeBilinearAntialias(rows, 1, 4, 4, 2, 3);
  const std::vector<float> column = ResizeBilinearAntialias({0, 1, 2, 3}, 1, 4, 1, 2, 1);
  for (int y = 0; y < 2; ++y) {
    for (int x = 0; x < 3; ++x) EXPECT_NEAR(out[y * 3 + x], column[y], 1e-6);
  }
}

TEST(ImagePreprocess, ScalesNormalisesAndLaysOutChw) {
  DecodedImage img;
  img.width = 2;
  img.height = 1;
  img.channels = 3;
  img.pixels = {0, 51, 255, 255, 102, 0};  // HWC
  auto out = PreprocessImage(img, Config(3, 1, 2, {0.5f, 0.2f, 0.f}, {0.5f, 0.1f, 2.f}), "img");
  ASSERT_TRUE(out.ok()) << out.status();
  const std::vector<float> want = {(0.f - 0.5f) / 0.5f,  (1.f - 0.5f) / 0.5f,   // channel 0
                                   (0.2f - 0.2f) / 0.1f, (0.4f - 0.2f) / 0.1f,  // channel 1
                                   (1.f - 0.f) / 2.f,    (0.f - 0.f) / 2.f};    // channel 2
  ASSERT_EQ(out->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR((*out)[i], want[i], 1e-5) << i;
}

TEST(ImagePreprocess, DecodeAndPreprocessResizesToTheModelResolution) {
  // 48x40 RGB PNG for a gray 32x32 model with mean 0.5, std 0.5: luma, resize, normalise.
  const auto px = TestPixels(48, 40, 3);
  const auto cfg = Config(1, 32, 32, {0.5f}, {0.5f});
  auto out = DecodeAndPreprocess(EncodePng(px, 48, 40, PNG_FORMAT_RGB), cfg, ImageLimits{}, "img");
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 32u * 32u);
  // The same pipeline by hand from the documented steps.
  std::vector<float> luma(48 * 40);
  for (size_t i = 0; i < luma.size(); ++i) {
    luma[i] =
        std::round(0.299f * px[i * 3] + 0.587f * px[i * 3 + 1] + 0.114f * px[i * 3 + 2]) / 255.f;
  }
  const std::vector<float> resized = ResizeBilinearAntialias(luma, 1, 40, 48, 32, 32);
  int off_by_rounding = 0;
  for (size_t i = 0; i < resized.size(); ++i) {
    const float want = (resized[i] - 0.5f) / 0.5f;
    EXPECT_NEAR((*out)[i], want, 2.f / 255.f * 2.f) << i;  // luma may round differently at .5
    off_by_rounding += std::abs((*out)[i] - want) > 1e-5f;
    EXPECT_GE((*out)[i], -1.f - 1e-6f);
    EXPECT_LE((*out)[i], 1.f + 1e-6f);
  }
  EXPECT_LT(off_by_rounding, 32 * 32 / 10);
}

TEST(ImagePreprocess, RefusesModelsWithoutGrayOrRgbInput) {
  const std::string png = EncodePng(TestPixels(4, 4, 3), 4, 4, PNG_FORMAT_RGB);
  auto r = DecodeAndPreprocess(png, Config(4, 4, 4, {0, 0, 0, 0}, {1, 1, 1, 1}), ImageLimits{},
                               "inputs[0]");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("inputs[0]: the model takes in_chans 4"));
}

}  // namespace
}  // namespace tost::service
