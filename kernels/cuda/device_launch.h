// How the tssa_*.cu kernels reach the device: the one launch helper, the dynamic shared memory
// declaration and the carving of workspace buffers. Under nvcc these are a real `<<<...>>>` launch
// and plain pointer arithmetic. Compiled as host C++ with TOST_CUDA_EMULATION (tests/kernels/
// emulator), the same names come from the emulator, which runs every thread of a block as a fiber
// and checks races, bounds, uninitialised reads and barrier/shuffle use. Nothing else in the
// kernel sources differs between the two builds.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace tost::kernels::gpu {

// Grid, block, dynamic shared memory and stream of one launch.
struct LaunchShape {
  dim3 grid;
  dim3 block;
  size_t shared_bytes = 0;
  cudaStream_t stream = nullptr;
};

// Dynamic shared memory above this needs an explicit opt-in (cudaFuncSetAttribute), which the
// kernels never ask for; the emulator refuses such a launch as a device would.
inline constexpr size_t kMaxDefaultDynamicSharedBytes = 48 * 1024;

// Guard bytes after every buffer carved from a workspace: an overrun stays inside the one
// allocation, so the emulator poisons the guards for AddressSanitizer to see it.
inline constexpr size_t kWorkspaceGuardBytes = 256;

}  // namespace tost::kernels::gpu

#ifdef TOST_CUDA_EMULATION
#include "cuda_emulation.h"  // on the include path of the emulated build only
#else
#include <cuda_runtime.h>

#include <utility>

namespace tost::kernels::gpu {

// Launches kKernel with `shape`; kMaxThreads is the kernel's __launch_bounds__ (the same named
// constant), and a larger block is refused here as the device would refuse it. Returns the launch
// error (cudaGetLastError), never synchronises.
template <auto kKernel, int kMaxThreads, typename... Args>
cudaError_t Launch(const LaunchShape& shape, Args&&... args) {
  if (static_cast<long long>(shape.block.x) * shape.block.y * shape.block.z > kMaxThreads) {
    return cudaErrorInvalidConfiguration;
  }
  // A .h is formatted as C++, which would split the launch's chevrons.
  // clang-format off
  kKernel<<<shape.grid, shape.block, shape.shared_bytes, shape.stream>>>(std::forward<Args>(args)...);
  // clang-format on
  return cudaGetLastError();
}

// Buffer `name` of a carved workspace: `bytes` at `offset` from `base`.
inline void* WorkspaceBuffer(void* base, size_t offset, size_t /*bytes*/, const char* /*name*/) {
  return static_cast<char*>(base) + offset;
}

}  // namespace tost::kernels::gpu

#define TOST_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif
