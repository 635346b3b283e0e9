// main of tost_gpu_tests: runs the cases only where this process can use a CUDA device, exits
// kSkipReturnCode (ctest: skipped) only where the machine has none, and fails where it has one
// that this process cannot use (tests/kernels/gpu_gate.h). A case that skips itself (one that
// needs two devices) no longer makes the whole binary read as skipped.
#include <gtest/gtest.h>

#include "tests/kernels/gpu/gpu_probe.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (GTEST_FLAG_GET(list_tests)) return RUN_ALL_TESTS();  // listing needs no device
  if (const auto status = tost::kernels::testing::GpuGateExitStatus("tost_gpu_tests")) {
    return *status;
  }
  return RUN_ALL_TESTS();
}
