// Each model on a CUDA device computes on a CUDA stream of its own, taken from LibTorch's pool
// when its weights are placed: work of two models (a vision batch, a decode step) is not
// serialised behind one default stream, and one model's copies and kernels stay in order on its
// stream. Every model entry point makes the stream current for its thread while it runs (every
// thread that calls the model, since the vision model is called from the batcher and from
// handler threads). Internal to model/ (includes c10); nothing on the CPU.
#pragma once

#include <optional>

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace tost::model {

inline std::optional<c10::Stream> ModelStreamFor(const c10::Device& device) {
  if (!device.is_cuda()) return std::nullopt;
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStreamFromGlobalPool(device);
}

}  // namespace tost::model
