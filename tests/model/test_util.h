// Helpers shared by the model tests: fixture locations and reading tensors from safetensors.
#pragma once

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/config/safetensors.h"

namespace tost::model::testing {

inline std::string ParityDir() {
  const char* dir = std::getenv("TOST_PARITY_DIR");
  return dir == nullptr ? "" : dir;
}

template <typename T>
std::vector<T> TensorValues(const SafetensorsFile& file, const std::string& name,
                            std::vector<int64_t>* shape = nullptr) {
  auto t = file.Find(name);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return {};
  if (shape != nullptr) *shape = (*t)->shape;
  std::vector<T> out((*t)->numel());
  if ((*t)->dtype == StDtype::kI64) {
    std::vector<int64_t> wide(out.size());
    std::memcpy(wide.data(), (*t)->bytes.data(), (*t)->bytes.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(wide[i]);
  } else {
    EXPECT_EQ((*t)->dtype, StDtype::kF32) << name;
    std::vector<float> f(out.size());
    std::memcpy(f.data(), (*t)->bytes.data(), (*t)->bytes.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(f[i]);
  }
  return out;
}

// max |a - b| / max(|b|): the parity measure ("relative to the logits' scale").
inline double RelativeMaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

}  // namespace tost::model::testing
