#include "model/device/device_memory.h"

#include <ATen/Context.h>

#ifdef TOST_WITH_CUDA
#include <exception>

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace tost::model {

std::vector<DeviceMemoryStats> CudaDeviceMemory() {
  std::vector<DeviceMemoryStats> out;
#ifdef TOST_WITH_CUDA
  const int devices = c10::cuda::device_count();  // noexcept: 0 without a driver or device
  constexpr auto kAggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  for (int d = 0; d < devices; ++d) {
    try {
      // Throws (c10::Error) while the allocator is uninitialised: no CUDA memory used yet, and
      // initialising CUDA only to report zero would cost a context per device.
      const auto stats =
          c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(d));
      out.push_back(
          {d, stats.allocated_bytes[kAggregate].current, stats.reserved_bytes[kAggregate].current});
    } catch (const std::exception&) {
      continue;
    }
  }
#endif
  return out;
}

int CudaDeviceCount() {
#ifdef TOST_WITH_CUDA
  return static_cast<int>(c10::cuda::device_count());  // noexcept
#else
  return 0;
#endif
}

void DisableTf32() {
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
}

}  // namespace tost::model
