#include "kernels/token_bitmask_ops.h"

#include <ATen/core/dispatch/Dispatcher.h>

namespace tost::kernels {

at::Tensor& apply_token_bitmask_(at::Tensor& logits, const at::Tensor& bitmask,
                                 const std::optional<at::Tensor>& rows) {
  // Looked up once; the dispatcher then routes by the inputs' device.
  static const auto handle =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("tost::apply_token_bitmask_", "")
          .typed<at::Tensor&(at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&)>();
  return handle.call(logits, bitmask, rows);
}

}  // namespace tost::kernels
