// Reads a NumPy .npy file holding little-endian float32 (or float64, converted) values in C order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tost::service {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

absl::StatusOr<NpyArray> ParseNpy(const std::string& contents, const std::string& source);

}  // namespace tost::service
