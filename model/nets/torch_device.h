// A Placement (model/config/device.h) as LibTorch options. Model code only (includes ATen).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "model/config/device.h"

namespace tost::model {

inline c10::ScalarType ComputeScalarType(ComputeDtype d) {
  switch (d) {
    case ComputeDtype::kBFloat16:
      return c10::kBFloat16;
    case ComputeDtype::kFloat16:
      return c10::kHalf;
    case ComputeDtype::kInt8:
      return c10::kChar;  // the CPU's dense weights (quantised); ResolvePlacement keeps it off CUDA
    case ComputeDtype::kFloat32:
      break;
  }
  return c10::kFloat;
}

inline c10::Device TorchDevice(const Placement& p) {
  return p.cuda ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(p.index))
                : c10::Device(c10::kCPU);
}

}  // namespace tost::model
