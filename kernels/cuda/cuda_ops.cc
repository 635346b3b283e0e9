// The CUDA registrations of the `tost::` operators: DeviceOps (device_ops.h) on a real GPU, on the
// current CUDA stream of w's device. The schemas are defined once in register_ops.cc; the
// signatures here match its CPU ones.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "kernels/cuda/device_ops.h"

namespace tost::kernels {
namespace {

struct CudaBackend {
  static constexpr const char* kTssa = "tost::tssa (CUDA)";
  static constexpr const char* kTssaCausal = "tost::tssa_causal (CUDA)";
  static constexpr const char* kTssaStep = "tost::tssa_step (CUDA)";
  static constexpr const char* kApplyTokenBitmask = "tost::apply_token_bitmask_ (CUDA)";

  static c10::cuda::CUDAGuard Guard(const at::Device& device) {
    return c10::cuda::CUDAGuard(device);
  }
  static cudaStream_t Stream() { return at::cuda::getCurrentCUDAStream(); }
  static at::Tensor Workspace(const at::Tensor& like, size_t bytes) {
    return at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
  }
  // Pinned staging, then an asynchronous copy on the current stream (the caching host allocator
  // keeps the pinned block until the copy is done).
  static at::Tensor Upload(const at::Tensor& host, const at::Device& device) {
    return host.pin_memory().to(device, /*non_blocking=*/true);
  }
  // An AcceleratorError carries the cudaError_t, so the serving side can tell an error that lost
  // the device (sticky: the process must be replaced) from one that failed only this call.
  static void CheckLaunch(cudaError_t err, const char* op) {
    if (err == cudaSuccess) return;
    throw c10::AcceleratorError(
        c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
        static_cast<int32_t>(err),
        c10::str(op, ": CUDA kernel launch failed: ", cudaGetErrorName(err), " (",
                 cudaGetErrorString(err), ")"));
  }
};

using CudaOps = DeviceOps<CudaBackend>;

}  // namespace
}  // namespace tost::kernels

TORCH_LIBRARY_IMPL(tost, CUDA, m) {
  m.impl("tssa", &tost::kernels::CudaOps::Tssa);
  m.impl("tssa_causal", &tost::kernels::CudaOps::TssaCausal);
  m.impl("tssa_step", &tost::kernels::CudaOps::TssaStep);
  m.impl("apply_token_bitmask_", &tost::kernels::CudaOps::ApplyTokenBitmask);
}
