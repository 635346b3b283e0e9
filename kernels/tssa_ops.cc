#include "kernels/tssa_ops.h"

#include <ATen/core/dispatch/Dispatcher.h>

namespace tost::kernels {
namespace {

// Typed handles are looked up once; the dispatcher then routes by the inputs' device.
const auto& TssaHandle() {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("tost::tssa", "")
                                 .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return handle;
}

const auto& CausalHandle() {
  static const auto handle =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("tost::tssa_causal", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const std::optional<at::Tensor>&, const std::optional<at::Tensor>&)>();
  return handle;
}

const auto& StepHandle() {
  static const auto handle =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("tost::tssa_step", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, at::Tensor&, const std::optional<at::Tensor>&)>();
  return handle;
}

}  // namespace

at::Tensor tssa(const at::Tensor& w, const at::Tensor& temp) { return TssaHandle().call(w, temp); }

std::tuple<at::Tensor, at::Tensor> tssa_causal(const at::Tensor& w, const at::Tensor& temp,
                                               const at::Tensor& denom_bias,
                                               const std::optional<at::Tensor>& state,
                                               const std::optional<at::Tensor>& positions) {
  return CausalHandle().call(w, temp, denom_bias, state, positions);
}

at::Tensor tssa_step(const at::Tensor& w, const at::Tensor& temp, const at::Tensor& denom_bias,
                     const at::Tensor& positions, at::Tensor& state,
                     const std::optional<at::Tensor>& row_ids) {
  return StepHandle().call(w, temp, denom_bias, positions, state, row_ids);
}

}  // namespace tost::kernels
