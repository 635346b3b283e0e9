// The tensors a configuration implies: names, shapes, and which are optional. The loader checks a
// file against this list; tools and benchmarks use it to write model files. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config/config.h"

namespace tost::model {

struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
  bool optional = false;  // may be absent (e.g. BatchNorm's num_batches_tracked, the tied lm_head)
  bool integer = false;   // int64 bookkeeping tensor rather than a weight of the config's dtype
};

std::vector<ExpectedTensor> VisionTensorList(const VisionConfig& c);
std::vector<ExpectedTensor> LanguageTensorList(const LanguageConfig& c);

}  // namespace tost::model
