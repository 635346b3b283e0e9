// Per-device memory of LibTorch's CUDA caching allocator, for callers that include no LibTorch
// headers (the metrics exporter in service/).
#pragma once

#include <cstdint>
#include <vector>

namespace tost::model {

struct DeviceMemoryStats {
  int device = 0;               // CUDA device index
  int64_t allocated_bytes = 0;  // bytes held by live tensors
  int64_t reserved_bytes =
      0;  // bytes the caching allocator holds from the driver (allocated + cached)
};

// One entry per CUDA device whose caching allocator is initialised (that is, where this process has
// allocated CUDA memory). Empty when the build has no CUDA (TOST_WITH_CUDA undefined), when no
// device is visible, or before the first CUDA allocation: it never initialises CUDA itself.
std::vector<DeviceMemoryStats> CudaDeviceMemory();

// CUDA devices this process sees: 0 without a CUDA build, a driver or a device. Never throws.
int CudaDeviceCount();

// fp32 means fp32: TF32 off for cuBLAS and cuDNN (LibTorch enables it for cuDNN convolutions by
// default, which would round the vision stem's inputs to 10 mantissa bits). Call before serving.
void DisableTf32();

}  // namespace tost::model
