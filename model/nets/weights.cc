#include "model/nets/weights.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/isfinite.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tost::model {
namespace {

StDtype FileDtype(WeightDtype d) {
  switch (d) {
    case WeightDtype::kFloat16:
      return StDtype::kF16;
    case WeightDtype::kBFloat16:
      return StDtype::kBF16;
    case WeightDtype::kFloat32:
      break;
  }
  return StDtype::kF32;
}

at::ScalarType TorchDtype(StDtype d) {
  switch (d) {
    case StDtype::kF16:
      return at::kHalf;
    case StDtype::kBF16:
      return at::kBFloat16;
    case StDtype::kI64:
      return at::kLong;
    default:
      return at::kFloat;
  }
}

}  // namespace

absl::StatusOr<Weights> Weights::FromFile(const SafetensorsFile& file,
                                          const std::vector<ExpectedTensor>& expected,
                                          WeightDtype dtype) {
  std::map<std::string, const ExpectedTensor*> by_name;
  for (const auto& e : expected) by_name[e.name] = &e;
  for (const auto& [name, t] : file.tensors()) {
    if (by_name.count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.source(), ": unexpected tensor \"", name,
                       "\" (not part of this model's configuration)"));
    }
  }
  Weights w;
  for (const auto& e : expected) {
    auto it = file.tensors().find(e.name);
    if (it == file.tensors().end()) {
      if (e.optional) continue;
      return absl::InvalidArgumentError(absl::StrCat(file.source(), ": missing tensor \"", e.name,
                                                     "\" of shape [", absl::StrJoin(e.shape, ","),
                                                     "]"));
    }
    const StTensor& t = it->second;
    if (t.shape != e.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          file.source(), ": tensor \"", e.name, "\" has shape [", absl::StrJoin(t.shape, ","),
          "], expected [", absl::StrJoin(e.shape, ","), "] from config.json"));
    }
    const StDtype want = e.integer ? StDtype::kI64 : FileDtype(dtype);
    if (t.dtype != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          file.source(), ": tensor \"", e.name, "\" has dtype ", StDtypeName(t.dtype),
          ", expected ", StDtypeName(want), " (config dtype ", WeightDtypeName(dtype), ")"));
    }
    if (e.integer) continue;  // bookkeeping only
    // Copy the bytes into an aligned tensor (file offsets need not be aligned), then widen.
    at::Tensor raw = at::empty(t.shape, at::TensorOptions().dtype(TorchDtype(t.dtype)));
    std::memcpy(raw.data_ptr(), t.bytes.data(), t.bytes.size());
    at::Tensor owned = raw.to(at::kFloat).contiguous();
    if (!at::isfinite(owned).all().item<bool>()) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.source(), ": tensor \"", e.name, "\" contains NaN or infinite values"));
    }
    w.tensors_.emplace(e.name, std::move(owned));
  }
  return w;
}

const at::Tensor& Weights::at(const std::string& name) const {
  auto it = tensors_.find(name);
  TORCH_CHECK(it != tensors_.end(), "internal: weight \"", name, "\" was not loaded");
  return it->second;
}

}  // namespace tost::model
