// Checks a safetensors file against the tensor list a config implies and converts it to float32
// LibTorch tensors. Model code only (includes ATen).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "model/config/config.h"
#include "model/config/safetensors.h"
#include "model/config/tensor_list.h"

namespace tost::model {

class Weights {
 public:
  // Every tensor in `file` must be expected, every non-optional expected tensor present, shapes
  // equal and dtypes equal to `dtype` (or I64 for integer ones). Errors name the file and tensor.
  static absl::StatusOr<Weights> FromFile(const SafetensorsFile& file,
                                          const std::vector<ExpectedTensor>& expected,
                                          WeightDtype dtype);

  // The float32 tensor `name` (must have been expected and present).
  const at::Tensor& at(const std::string& name) const;
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }

 private:
  std::map<std::string, at::Tensor> tensors_;
};

}  // namespace tost::model
