// The GPU test binaries' decision to run, skip (exit 77) or fail, over every kind of machine.
#include "tests/kernels/gpu_gate.h"

#include <gtest/gtest.h>

namespace tost::kernels::testing {
namespace {

GpuProbe NoDevice() {
  GpuProbe p;
  p.runtime_error = "cudaErrorNoDevice";
  return p;
}

TEST(GpuGate, SkipsOnlyWhereNoDeviceExists) {
  const GpuDecision d = DecideGpuRun(NoDevice());
  EXPECT_EQ(d.gate, GpuGate::kSkip);
  EXPECT_EQ(d.why,
            "no CUDA device: the CUDA runtime reports no device (cudaErrorNoDevice), and "
            "/dev/nvidia0 does not exist");
  GpuProbe no_driver = NoDevice();
  no_driver.runtime_error = "cudaErrorInsufficientDriver";  // no driver installed at all
  EXPECT_EQ(DecideGpuRun(no_driver).gate, GpuGate::kSkip);
  EXPECT_EQ(kSkipReturnCode, 77);
}

TEST(GpuGate, RunsWhereAtenSeesADevice) {
  GpuProbe p;
  p.runtime_devices = 1;
  p.device_node = true;
  p.aten_cuda = true;
  EXPECT_EQ(DecideGpuRun(p).gate, GpuGate::kRun);
}

TEST(GpuGate, FailsWhereADeviceExistsButAtenHasNoCudaBackend) {
  GpuProbe p;
  p.runtime_devices = 2;
  p.device_node = true;
  p.aten_cuda = false;
  const GpuDecision d = DecideGpuRun(p);
  EXPECT_EQ(d.gate, GpuGate::kFail);
  EXPECT_NE(d.why.find("the CUDA runtime reports 2 device(s), but ATen's CUDA backend is not "
                       "loaded (at::hasCUDA() is false)"),
            std::string::npos)
      << d.why;
  p.device_node = false;  // the runtime's word is enough
  EXPECT_EQ(DecideGpuRun(p).gate, GpuGate::kFail);
}

TEST(GpuGate, FailsWhereTheDriverHasADeviceTheRuntimeCannotUse) {
  GpuProbe p = NoDevice();
  p.runtime_error = "cudaErrorInsufficientDriver";
  p.device_node = true;
  const GpuDecision d = DecideGpuRun(p);
  EXPECT_EQ(d.gate, GpuGate::kFail);
  EXPECT_NE(d.why.find("/dev/nvidia0 exists (the driver has a device), but the CUDA runtime "
                       "reports no device (cudaErrorInsufficientDriver)"),
            std::string::npos)
      << d.why;
}

TEST(GpuGate, SkipsWhereCudaVisibleDevicesHidesEveryDevice) {
  GpuProbe p = NoDevice();
  p.device_node = true;
  p.visible_devices = "";
  const GpuDecision d = DecideGpuRun(p);
  EXPECT_EQ(d.gate, GpuGate::kSkip);
  EXPECT_EQ(d.why,
            "no CUDA device: the CUDA runtime reports no device (cudaErrorNoDevice), with "
            "CUDA_VISIBLE_DEVICES=''");
}

}  // namespace
}  // namespace tost::kernels::testing
