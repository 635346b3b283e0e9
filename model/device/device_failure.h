// CUDA errors that end the replica. Most CUDA errors fail one call and leave the device usable (an
// invalid argument, running out of memory). A "sticky" error — an illegal address, a launch
// failure, a device-side assert, an uncorrectable ECC error or one the GPU's error containment
// caught, an MPS client terminated by its server — corrupts the CUDA context: every
// later CUDA call in this process fails, so no request can succeed again. The only recovery is a
// new process; the server reports NOT_SERVING and exits non-zero so its orchestrator replaces it.
//
// GuardTorch (torch_boundary.h) reports every CUDA error here; the server installs the handler.
#pragma once

#include <functional>
#include <string>

namespace tost::model {

// cudaError_t values after which the context is unusable (the CUDA runtime documents each of these
// as leaving the process in an inconsistent state).
bool IsStickyCudaError(int cuda_error_code);

// Called once, on the thread that saw the first sticky error, with a description of it. Replaces
// any previous handler; an empty function removes it.
void SetDeviceLostHandler(std::function<void(const std::string& why)> handler);

// Records a CUDA error seen by a model call. Returns true (and, the first time, runs the handler)
// when it is sticky.
bool ReportCudaError(int cuda_error_code, const std::string& what);

// The first sticky error's description; empty while the device is healthy.
std::string DeviceLostReason();

}  // namespace tost::model
