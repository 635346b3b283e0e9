// Renders a TSSA layer's membership map Π over its image as a PNG: every patch token is tinted
// with the colour of the head (group) it belongs to most, more strongly the surer Π is. Used by
// `tost_cli classify --membership_png=PREFIX`.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tost::service {

struct GrayImage {
  int64_t height = 0, width = 0;
  std::vector<float> values;  // any range; rendered min-max normalised
};

// `membership`: [heads, grid_h, grid_w]. The output is scaled up so small images stay visible.
absl::Status WriteMembershipPng(const std::string& path, const GrayImage& image,
                                const std::vector<float>& membership, int64_t heads, int64_t grid_h,
                                int64_t grid_w);

}  // namespace tost::service
