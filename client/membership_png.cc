#include "client/membership_png.h"

#include <png.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"

namespace tost::service {
namespace {

// Distinct, colour-blind-friendly hues (Okabe-Ito), cycled beyond eight heads.
constexpr float kPalette[8][3] = {
    {0.90f, 0.62f, 0.00f}, {0.34f, 0.71f, 0.91f}, {0.00f, 0.62f, 0.45f}, {0.94f, 0.89f, 0.26f},
    {0.00f, 0.45f, 0.70f}, {0.84f, 0.37f, 0.00f}, {0.80f, 0.47f, 0.65f}, {0.60f, 0.60f, 0.60f}};

}  // namespace

absl::Status WriteMembershipPng(const std::string& path, const GrayImage& image,
                                const std::vector<float>& membership, int64_t heads, int64_t grid_h,
                                int64_t grid_w) {
  if (heads < 1 || grid_h < 1 || grid_w < 1 ||
      static_cast<int64_t>(membership.size()) != heads * grid_h * grid_w) {
    return absl::InvalidArgumentError(absl::StrCat("membership map holds ", membership.size(),
                                                   " values, expected ", heads, "x", grid_h, "x",
                                                   grid_w));
  }
  if (image.height < 1 || image.width < 1 ||
      static_cast<int64_t>(image.values.size()) != image.height * image.width) {
    return absl::InvalidArgumentError("background image is empty or misshapen");
  }
  const int64_t scale = std::max<int64_t>(1, 256 / std::max(image.height, image.width));
  const int64_t out_h = image.height * scale, out_w = image.width * scale;
  const auto [lo_it, hi_it] = std::minmax_element(image.values.begin(), image.values.end());
  const float lo = *lo_it, range = std::max(*hi_it - *lo_it, 1e-6f);
  const float uniform = 1.0f / static_cast<float>(heads);

  std::vector<png_byte> rgb(static_cast<size_t>(out_h * out_w * 3));
  for (int64_t y = 0; y < out_h; ++y) {
    for (int64_t x = 0; x < out_w; ++x) {
      const float gray = (image.values[(y / scale) * image.width + x / scale] - lo) / range;
      const int64_t token = (y * grid_h / out_h) * grid_w + x * grid_w / out_w;
      int64_t best = 0;
      for (int64_t h = 1; h < heads; ++h) {
        if (membership[h * grid_h * grid_w + token] > membership[best * grid_h * grid_w + token])
          best = h;
      }
      const float certainty =
          heads == 1 ? 1.f : (membership[best * grid_h * grid_w + token] - uniform) / (1 - uniform);
      const float alpha = 0.15f + 0.6f * std::clamp(certainty, 0.f, 1.f);
      for (int c = 0; c < 3; ++c) {
        const float v = (1 - alpha) * gray + alpha * kPalette[best % 8][c];
        rgb[(y * out_w + x) * 3 + c] =
            static_cast<png_byte>(std::clamp(v, 0.f, 1.f) * 255.f + 0.5f);
      }
    }
  }

  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (file == nullptr) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png != nullptr ? png_create_info_struct(png) : nullptr;
  if (png == nullptr || info == nullptr) {
    png_destroy_write_struct(&png, info != nullptr ? &info : nullptr);
    return absl::ResourceExhaustedError("libpng could not allocate its writer");
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return absl::DataLossError(absl::StrCat("libpng failed writing ", path));
  }
  png_init_io(png, file.get());
  png_set_IHDR(png, info, static_cast<png_uint_32>(out_w), static_cast<png_uint_32>(out_h), 8,
               PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int64_t y = 0; y < out_h; ++y) png_write_row(png, rgb.data() + y * out_w * 3);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return absl::OkStatus();
}

}  // namespace tost::service
