// Whether a GPU test binary runs its cases, reports itself skipped, or fails, from what the process
// sees of the machine. ctest reads the exit status: kSkipReturnCode (its SKIP_RETURN_CODE) only
// where the machine has no CUDA device at all. A machine with a device that this process cannot
// use (ATen's CUDA backend not loaded, a driver the CUDA runtime rejects) fails, so a broken GPU
// build never reads as "skipped". LibTorch- and CUDA-free: the decision is unit-tested in every
// build (tost_kernel_tests); the probe is tests/kernels/gpu/gpu_probe.h.
#pragma once

#include <optional>
#include <string>

namespace tost::kernels::testing {

// ctest's SKIP_RETURN_CODE of the GPU tests (the Automake convention ctest users follow).
inline constexpr int kSkipReturnCode = 77;

struct GpuProbe {
  int runtime_devices = 0;    // cudaGetDeviceCount's count; 0 when it failed
  std::string runtime_error;  // cudaGetDeviceCount's error name; empty when it succeeded
  bool device_node = false;   // /dev/nvidia0 exists: the NVIDIA driver sees a device
  std::optional<std::string> visible_devices;  // CUDA_VISIBLE_DEVICES, when set
  bool aten_cuda = false;                      // at::hasCUDA()
};

enum class GpuGate { kRun, kSkip, kFail };

struct GpuDecision {
  GpuGate gate = GpuGate::kFail;
  std::string why;  // for kSkip and kFail: one line saying what was seen
};

GpuDecision DecideGpuRun(const GpuProbe& probe);

}  // namespace tost::kernels::testing
