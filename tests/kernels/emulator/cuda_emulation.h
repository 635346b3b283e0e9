// The CUDA device API of kernels/cuda/*.cu as host C++, for the emulated build
// (TOST_CUDA_EMULATION): kernels/cuda/device_launch.h includes this instead of launching with
// `<<<...>>>`. Every thread of a block runs as a fiber of the emulator (emulator.h); the intrinsics
// below are its synchronisation points. half and bfloat16 come from the CUDA headers' host code;
// libcudart is not linked (nothing here may call the CUDA runtime).
#pragma once

#ifndef TOST_CUDA_EMULATION
#error "cuda_emulation.h belongs to the emulated build (TOST_CUDA_EMULATION) only"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "emulator.h"

// Kernel qualifiers and attributes have no meaning on the host. (__launch_bounds__ is checked by
// Launch through the named constant the kernel passes to both.)
#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __host__
#define __host__
#undef __forceinline__
#define __forceinline__ inline
#define __launch_bounds__(...)

// Device-only intrinsics the kernels use, with the device's semantics.
inline float __int_as_float(int bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
template <typename T>
inline T min(T a, T b) {
  return b < a ? b : a;
}

inline void __syncthreads(int line = __builtin_LINE()) { ::tost::emu::SyncThreads(line); }
inline void __syncwarp(unsigned mask = 0xffffffffu, int line = __builtin_LINE()) {
  ::tost::emu::SyncWarp(mask, line);
}

template <typename T>
inline T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32,
                         int line = __builtin_LINE()) {
  static_assert(sizeof(T) == 4 && std::is_trivially_copyable_v<T>, "32-bit shuffles only");
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  bits = ::tost::emu::ShuffleXor(mask, bits, lane_mask, width, line);
  std::memcpy(&value, &bits, sizeof bits);
  return value;
}

// The built-in variables, read from the current fiber. Defined after every CUDA header (those
// declare variables of these names for nvcc).
#define threadIdx (::tost::emu::ThreadIdx())
#define blockIdx (::tost::emu::BlockIdx())
#define blockDim (::tost::emu::BlockDim())
#define gridDim (::tost::emu::GridDim())

#define TOST_DYNAMIC_SHARED(type, name) \
  type* name = static_cast<type*>(::tost::emu::DynamicSharedMemory())

namespace tost::kernels::gpu {

namespace emulation_detail {

// "ChunkSumSqKernel<float, 4>" out of the signature of KernelName<&...ChunkSumSqKernel<float, 4>>.
template <auto kKernel>
std::string_view KernelName() {
  std::string_view s = __PRETTY_FUNCTION__;
  const std::string_view key = "kKernel = &";
  const size_t at = s.find(key);
  if (at == std::string_view::npos) return s;
  s.remove_prefix(at + key.size());
  if (!s.empty() && s.back() == ']') s.remove_suffix(1);
  // Drop the namespaces: the last "::" before the template arguments.
  const size_t args = s.find('<');
  const size_t ns = s.substr(0, args).rfind("::");
  if (ns != std::string_view::npos) s.remove_prefix(ns + 2);
  return s;
}

template <typename... P, typename... Args>
std::tuple<P...> KernelArguments(void (*)(P...), Args&&... args) {
  return std::tuple<P...>(std::forward<Args>(args)...);
}

}  // namespace emulation_detail

// Emulated launch: checks the configuration as the device would (block size against kMaxThreads
// and 1024, grid limits, dynamic shared memory), then runs every block, its threads as fibers.
// Returns cudaSuccess, the configuration error, or cudaErrorLaunchFailure when a checker reported
// (emu::LastLaunchReport() has the text).
template <auto kKernel, int kMaxThreads, typename... Args>
cudaError_t Launch(const LaunchShape& shape, Args&&... args) {
  const auto arguments = emulation_detail::KernelArguments(kKernel, std::forward<Args>(args)...);
  return ::tost::emu::RunKernel(emulation_detail::KernelName<kKernel>(), kMaxThreads, shape.grid,
                                shape.block, shape.shared_bytes,
                                [&arguments] { std::apply(kKernel, arguments); });
}

// Buffer `name` of a carved workspace: unpoisons exactly `bytes` (the guard after it stays
// poisoned) and tracks which of its words were written.
inline void* WorkspaceBuffer(void* base, size_t offset, size_t bytes, const char* name) {
  return ::tost::emu::WorkspaceBuffer(static_cast<char*>(base) + offset, bytes, name);
}

}  // namespace tost::kernels::gpu
