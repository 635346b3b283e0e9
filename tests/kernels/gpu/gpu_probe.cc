#include "tests/kernels/gpu/gpu_probe.h"

#include <ATen/Context.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace tost::kernels::testing {

GpuProbe ProbeGpu() {
  GpuProbe p;
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e == cudaSuccess) {
    p.runtime_devices = devices;
  } else {
    p.runtime_error = cudaGetErrorName(e);
    (void)cudaGetLastError();  // not sticky: clear it for ATen's own calls
  }
  std::error_code ignored;
  p.device_node = std::filesystem::exists("/dev/nvidia0", ignored);
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) p.visible_devices = visible;
  p.aten_cuda = at::hasCUDA();
  return p;
}

std::optional<int> GpuGateExitStatus(const char* name) {
  const GpuDecision d = DecideGpuRun(ProbeGpu());
  switch (d.gate) {
    case GpuGate::kRun:
      return std::nullopt;
    case GpuGate::kSkip:
      std::printf("%s: skipped: %s\n", name, d.why.c_str());
      return kSkipReturnCode;
    case GpuGate::kFail:
      std::fprintf(stderr, "%s: FAILED: %s\n", name, d.why.c_str());
      return 1;
  }
  return 1;
}

}  // namespace tost::kernels::testing
