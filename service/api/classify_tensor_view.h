// ClassifyRequest.tensor as the shared input layer's FloatTensorView: the server's Classify
// handler and the request_input fuzz target read the tensor through this one function. Header-only
// (it needs tost.v1's generated message, which the proto-free input layer does not link).
#pragma once

#include "absl/types/span.h"
#include "service/api/request_input.h"
#include "tost/v1/tost.pb.h"

namespace tost::service {

// [C,H,W] (one image) or [B,C,H,W], as `data` or as `raw` bytes. proto3 bytes carry no presence,
// so an empty `raw` counts as not sent.
inline FloatTensorView ClassifyTensorView(const tost::v1::FloatTensor& t) {
  FloatTensorView view;
  view.shape = absl::MakeConstSpan(t.shape().data(), static_cast<size_t>(t.shape_size()));
  if (!t.raw().empty()) view.raw = t.raw();
  view.values = absl::MakeConstSpan(t.data().data(), static_cast<size_t>(t.data_size()));
  view.shape_field = "tensor.shape";
  view.raw_field = "tensor.raw";
  view.values_field = "tensor.data";
  return view;
}

}  // namespace tost::service
