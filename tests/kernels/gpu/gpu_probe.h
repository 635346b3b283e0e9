// What this process sees of the machine's CUDA devices, for the GPU test binaries' decision to run,
// skip or fail (tests/kernels/gpu_gate.h).
#pragma once

#include "tests/kernels/gpu_gate.h"

namespace tost::kernels::testing {

// Asks the CUDA runtime directly (not only ATen, whose answer is what may be broken) and looks for
// the driver's device file.
GpuProbe ProbeGpu();

// The gate for binary `name`: prints why and returns the exit status for kSkip (kSkipReturnCode)
// and kFail (1); nullopt for kRun.
std::optional<int> GpuGateExitStatus(const char* name);

}  // namespace tost::kernels::testing
