// The emulated CUDA device: DeviceOps (kernels/cuda/device_ops.h) instantiated for the kernels of
// kernels/cuda/*.cu compiled as host code, registered as CPU test operators `tost_emulated::` with
// the schemas of the real ones, and kernel_device.h on top of them (so tssa_cuda_test.cc's cases
// run here exactly as on a GPU).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cstdio>
#include <cstdlib>

#include "emulator.h"
#include "kernels/cuda/device_ops.h"
#include "kernels/op_schemas.h"
#include "tests/kernels/gpu/kernel_device.h"

namespace tost::kernels {
namespace {

struct EmulatedBackend {
  static constexpr const char* kTssa = "tost_emulated::tssa (emulated CUDA)";
  static constexpr const char* kTssaCausal = "tost_emulated::tssa_causal (emulated CUDA)";
  static constexpr const char* kTssaStep = "tost_emulated::tssa_step (emulated CUDA)";
  static constexpr const char* kApplyTokenBitmask =
      "tost_emulated::apply_token_bitmask_ (emulated CUDA)";

  struct NoGuard {};
  static NoGuard Guard(const at::Device& device) {
    TORCH_CHECK(device.is_cpu(), "the emulated CUDA operators take CPU tensors, got ", device);
    return {};
  }
  static cudaStream_t Stream() { return nullptr; }
  static at::Tensor Workspace(const at::Tensor& like, size_t bytes) {
    at::Tensor ws = at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
    emu::RegisterWorkspace(ws.mutable_data_ptr(), bytes);
    return ws;
  }
  static at::Tensor Upload(const at::Tensor& host, const at::Device& device) {
    return host.to(device);
  }
  static void CheckLaunch(cudaError_t err, const char* op) {
    TORCH_CHECK(err == cudaSuccess, op, ": emulated kernel launch failed: ", emu::ErrorName(err),
                "\n", emu::LastLaunchReport());
  }
};

using EmulatedOps = DeviceOps<EmulatedBackend>;

// The seed of the block and fiber order: TOST_EMULATOR_SEED explores other schedules.
const bool kSeeded = [] {
  emu::Options options;
  if (const char* seed = std::getenv("TOST_EMULATOR_SEED")) {
    options.seed = std::strtoull(seed, nullptr, 10);
  }
  emu::SetOptions(options);
  std::fprintf(stderr, "emulator: schedule seed %llu (set TOST_EMULATOR_SEED to change)\n",
               static_cast<unsigned long long>(options.seed));
  return true;
}();

}  // namespace
}  // namespace tost::kernels

TORCH_LIBRARY(tost_emulated, m) {
  m.def(tost::kernels::schemas::kTssa);
  m.def(tost::kernels::schemas::kTssaCausal);
  m.def(tost::kernels::schemas::kTssaStep);
  m.def(tost::kernels::schemas::kApplyTokenBitmask);
}

TORCH_LIBRARY_IMPL(tost_emulated, CPU, m) {
  m.impl("tssa", &tost::kernels::EmulatedOps::Tssa);
  m.impl("tssa_causal", &tost::kernels::EmulatedOps::TssaCausal);
  m.impl("tssa_step", &tost::kernels::EmulatedOps::TssaStep);
  m.impl("apply_token_bitmask_", &tost::kernels::EmulatedOps::ApplyTokenBitmask);
}

namespace tost::kernels::testing {

bool DeviceAvailable() { return true; }
std::string DeviceName() { return "emulated CUDA"; }
at::Tensor ToDevice(const at::Tensor& t) { return t.clone(at::MemoryFormat::Contiguous); }
bool OnDevice(const at::Tensor& t) { return t.is_cpu(); }

at::Tensor Tssa(const at::Tensor& w, const at::Tensor& temp) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("tost_emulated::tssa", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(w, temp);
}

std::tuple<at::Tensor, at::Tensor> TssaCausal(const at::Tensor& w, const at::Tensor& temp,
                                              const at::Tensor& denom_bias,
                                              const std::optional<at::Tensor>& state,
                                              const std::optional<at::Tensor>& positions) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("tost_emulated::tssa_causal", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const std::optional<at::Tensor>&, const std::optional<at::Tensor>&)>();
  return op.call(w, temp, denom_bias, state, positions);
}

at::Tensor TssaStep(const at::Tensor& w, const at::Tensor& temp, const at::Tensor& denom_bias,
                    const at::Tensor& positions, at::Tensor& state,
                    const std::optional<at::Tensor>& row_ids) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("tost_emulated::tssa_step", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, at::Tensor&, const std::optional<at::Tensor>&)>();
  return op.call(w, temp, denom_bias, positions, state, row_ids);
}

at::Tensor& ApplyTokenBitmask(at::Tensor& logits, const at::Tensor& bitmask,
                              const std::optional<at::Tensor>& rows) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("tost_emulated::apply_token_bitmask_", "")
          .typed<at::Tensor&(at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&)>();
  return op.call(logits, bitmask, rows);
}

}  // namespace tost::kernels::testing
