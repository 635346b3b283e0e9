#include "tests/kernels/gpu_gate.h"

namespace tost::kernels::testing {

GpuDecision DecideGpuRun(const GpuProbe& p) {
  const std::string runtime =
      p.runtime_error.empty()
          ? "the CUDA runtime reports " + std::to_string(p.runtime_devices) + " device(s)"
          : "the CUDA runtime reports no device (" + p.runtime_error + ")";
  // ATen found a device itself: nothing else matters.
  if (p.aten_cuda) return {GpuGate::kRun, ""};
  if (p.runtime_devices > 0) {
    return {GpuGate::kFail, runtime +
                                ", but ATen's CUDA backend is not loaded (at::hasCUDA() is false): "
                                "libtorch_cuda.so must be a NEEDED entry of this binary (ctest "
                                "torch_cuda_needed), and load"};
  }
  // CUDA_VISIBLE_DEVICES set: whoever runs the tests chose which devices this process sees.
  if (p.device_node && !p.visible_devices.has_value()) {
    return {GpuGate::kFail, "/dev/nvidia0 exists (the driver has a device), but " + runtime +
                                ": the driver and this process's CUDA runtime disagree (a "
                                "driver older than the runtime?)"};
  }
  std::string why = "no CUDA device: " + runtime;
  if (p.visible_devices.has_value())
    why += ", with CUDA_VISIBLE_DEVICES='" + *p.visible_devices + "'";
  if (!p.device_node) why += ", and /dev/nvidia0 does not exist";
  return {GpuGate::kSkip, why};
}

}  // namespace tost::kernels::testing
