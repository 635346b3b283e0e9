// The `tost::` operators on a CUDA-like device, templated on the backend that owns the device:
// validate with the shared argument checks, make the inputs contiguous float32 where the kernels
// need it, plan, and launch the kernels of tssa_*.cu and token_bitmask_kernels.cu through
// the plain launchers of tssa_cuda.h and token_bitmask_cuda.h. cuda_ops.cc instantiates it for a
// real GPU; the emulator's test build (tests/kernels/emulator) instantiates it for the same kernels
// compiled as host code, so both run exactly these checks and this planning.
//
// A Backend provides:
//   static constexpr const char* kTssa, kTssaCausal, kTssaStep, kApplyTokenBitmask
//                                                operator names for messages
//   static <guard> Guard(const at::Device&)      selects the device for the scope
//   static cudaStream_t Stream()                 stream the launches are enqueued on
//   static at::Tensor Workspace(const at::Tensor& like, size_t bytes)
//   static at::Tensor Upload(const at::Tensor& host, const at::Device&)   without synchronising
//   static void CheckLaunch(cudaError_t, const char* op)   throws with the device's explanation
//
// float64 w (and the degenerate D = 0) are not worth a kernel: they run the ATen reference on the
// device, which is exact by definition.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

#include "kernels/arg_checks.h"
#include "kernels/cuda/token_bitmask_cuda.h"
#include "kernels/cuda/tssa_cuda.h"
#include "kernels/reference.h"
#include "kernels/tssa_ops.h"

namespace tost::kernels {

template <typename Backend>
class DeviceOps {
 public:
  static at::Tensor Tssa(const at::Tensor& w_in, const at::Tensor& temp_in) {
    constexpr const char* kOp = Backend::kTssa;
    const TssaDims d = CheckTssaArgs(w_in, temp_in);
    if (UseReference(w_in, d)) return reference::tssa(w_in, temp_in);
    const gpu::DType dtype = KernelDType(w_in, kOp);
    const gpu::Dims dims = KernelDims(d, kOp);
    [[maybe_unused]] const auto guard = Backend::Guard(w_in.device());

    const at::Tensor w = w_in.contiguous();
    at::Tensor y = at::empty(w.sizes(), w.options());
    if (y.numel() == 0) return y;
    const at::Tensor temp = Float32(temp_in);
    const gpu::Plan plan = gpu::PlanTssa(dims);
    const at::Tensor ws = Backend::Workspace(w, plan.workspace_bytes);
    Backend::CheckLaunch(
        gpu::LaunchTssa(dims, plan, dtype, w.const_data_ptr(), temp.const_data_ptr<float>(),
                        y.mutable_data_ptr(), ws.mutable_data_ptr(), Backend::Stream()),
        kOp);
    return y;
  }

  static std::tuple<at::Tensor, at::Tensor> TssaCausal(
      const at::Tensor& w_in, const at::Tensor& temp_in, const at::Tensor& denom_bias_in,
      const std::optional<at::Tensor>& state_in, const std::optional<at::Tensor>& positions_in) {
    constexpr const char* kOp = Backend::kTssaCausal;
    const TssaDims d = CheckCausalArgs(w_in, temp_in, denom_bias_in, state_in, positions_in);
    if (UseReference(w_in, d))
      return reference::tssa_causal(w_in, temp_in, denom_bias_in, state_in, positions_in);
    const gpu::DType dtype = KernelDType(w_in, kOp);
    const gpu::Dims dims = KernelDims(d, kOp);
    [[maybe_unused]] const auto guard = Backend::Guard(w_in.device());

    const at::Tensor w = w_in.contiguous();
    const int64_t width = StateWidth(d.channels, d.heads);
    at::Tensor y = at::empty(w.sizes(), w.options());
    if (d.batch == 0 || d.tokens == 0) {
      // No token: the state passes through unchanged (as a new tensor, like the reference).
      at::Tensor state_out = state_in.has_value()
                                 ? state_in->clone(at::MemoryFormat::Contiguous)
                                 : at::zeros({d.batch, width}, w.options().dtype(at::kFloat));
      return {y, state_out};
    }
    const at::Tensor temp = Float32(temp_in);
    const at::Tensor denom_bias = Float32(denom_bias_in);
    const at::Tensor state = state_in.has_value() ? state_in->contiguous() : at::Tensor();
    const at::Tensor positions =
        positions_in.has_value() ? Positions(*positions_in, w.device()) : at::Tensor();
    at::Tensor state_out = at::empty({d.batch, width}, w.options().dtype(at::kFloat));

    const gpu::Plan plan = gpu::PlanTssaCausal(dims);
    const at::Tensor ws = Backend::Workspace(w, plan.workspace_bytes);
    Backend::CheckLaunch(
        gpu::LaunchTssaCausal(dims, plan, dtype, w.const_data_ptr(), temp.const_data_ptr<float>(),
                              denom_bias.const_data_ptr<float>(), denom_bias.size(1),
                              state.defined() ? state.const_data_ptr<float>() : nullptr,
                              positions.defined() ? positions.const_data_ptr<int64_t>() : nullptr,
                              y.mutable_data_ptr(), state_out.mutable_data_ptr<float>(),
                              ws.mutable_data_ptr(), Backend::Stream()),
        kOp);
    return {y, state_out};
  }

  static at::Tensor TssaStep(const at::Tensor& w_in, const at::Tensor& temp_in,
                             const at::Tensor& denom_bias_in, const at::Tensor& positions_in,
                             at::Tensor& state, const std::optional<at::Tensor>& row_ids_in) {
    constexpr const char* kOp = Backend::kTssaStep;
    const TssaDims d = CheckStepArgs(w_in, temp_in, denom_bias_in, positions_in, state, row_ids_in);
    if (UseReference(w_in, d))
      return reference::tssa_step(w_in, temp_in, denom_bias_in, positions_in, state, row_ids_in);
    const gpu::DType dtype = KernelDType(w_in, kOp);
    const gpu::Dims dims = KernelDims(d, kOp);
    [[maybe_unused]] const auto guard = Backend::Guard(w_in.device());

    const at::Tensor w = w_in.contiguous();
    at::Tensor y = at::empty(w.sizes(), w.options());
    if (d.batch == 0) return y;
    const at::Tensor temp = Float32(temp_in);
    const at::Tensor denom_bias = Float32(denom_bias_in);
    const at::Tensor positions = Positions(positions_in, w.device());
    // Row ids index the pool in place (uploaded like positions when they are on the host).
    const at::Tensor row_ids =
        row_ids_in.has_value() ? Positions(*row_ids_in, w.device()) : at::Tensor();
    // The kernel updates a contiguous state in place; a strided one is updated through a copy.
    at::Tensor st = state.is_contiguous() ? state : state.contiguous();
    Backend::CheckLaunch(
        gpu::LaunchTssaStep(dims, dtype, w.const_data_ptr(), temp.const_data_ptr<float>(),
                            denom_bias.const_data_ptr<float>(), denom_bias.size(1),
                            positions.const_data_ptr<int64_t>(), st.mutable_data_ptr<float>(),
                            row_ids.defined() ? row_ids.const_data_ptr<int64_t>() : nullptr,
                            st.size(0), y.mutable_data_ptr(), Backend::Stream()),
        kOp);
    if (!st.is_same(state)) state.copy_(st);
    return y;
  }

  // One launch (plus the upload of host rows, pinned and non-blocking), whatever the mask.
  static at::Tensor& ApplyTokenBitmask(at::Tensor& logits, const at::Tensor& bitmask_in,
                                       const std::optional<at::Tensor>& rows_in) {
    constexpr const char* kOp = Backend::kApplyTokenBitmask;
    const TokenBitmaskDims d = CheckTokenBitmaskArgs(logits, bitmask_in, rows_in);
    const gpu::TokenBitmaskShape shape{d.rows, d.vocab, d.masked_rows, d.words};
    const char* why = gpu::TokenBitmaskUnsupportedReason(shape);
    TORCH_CHECK(why == nullptr, kOp, ": ", why, " (got logits [", d.rows, ", ", d.vocab,
                "], bitmask [", d.masked_rows, ", ", d.words, "])");
    if (d.masked_rows == 0 || d.vocab == 0) return logits;
    [[maybe_unused]] const auto guard = Backend::Guard(logits.device());
    const at::Tensor bitmask = bitmask_in.contiguous();
    const at::Tensor rows =
        rows_in.has_value() ? Positions(*rows_in, logits.device()) : at::Tensor();
    const gpu::RowIdType row_type = !rows.defined()                  ? gpu::RowIdType::kNone
                                    : rows.scalar_type() == at::kInt ? gpu::RowIdType::kInt32
                                                                     : gpu::RowIdType::kInt64;
    Backend::CheckLaunch(
        gpu::LaunchApplyTokenBitmask(
            shape, logits.mutable_data_ptr<float>(), bitmask.const_data_ptr<int32_t>(),
            rows.defined() ? rows.const_data_ptr() : nullptr, row_type, Backend::Stream()),
        kOp);
    return logits;
  }

 private:
  static bool UseReference(const at::Tensor& w, const TssaDims& d) {
    return w.scalar_type() == at::kDouble || d.channels == 0;
  }

  static gpu::DType KernelDType(const at::Tensor& w, const char* op) {
    const at::ScalarType t = w.scalar_type();
    TORCH_CHECK(t == at::kFloat || t == at::kHalf || t == at::kBFloat16, op,
                ": the CUDA kernel supports float32, float16, bfloat16 and float64 w, got ", t);
    return t == at::kFloat  ? gpu::DType::kFloat32
           : t == at::kHalf ? gpu::DType::kFloat16
                            : gpu::DType::kBFloat16;
  }

  static gpu::Dims KernelDims(const TssaDims& d, const char* op) {
    const gpu::Dims g{d.batch, d.tokens, d.channels, d.heads};
    const char* why = gpu::UnsupportedReason(g);
    TORCH_CHECK(why == nullptr, op, ": ", why, " (got B=", d.batch, ", tokens=", d.tokens,
                ", D=", d.channels, ", K=", d.heads, ")");
    return g;
  }

  // Positions (or row_ids, or a bitmask's rows) on the device: host ones (range-checked on the host
  // by the argument checks) are uploaded once, from pinned memory without blocking; device ones are
  // used as they are (the kernels guard their range).
  static at::Tensor Positions(const at::Tensor& positions, const at::Device& device) {
    if (positions.device() == device) return positions.contiguous();
    return Backend::Upload(positions.contiguous(), device);
  }

  // temp [K] and denom_bias [K, Tmax] as contiguous float32 (no copy when they already are).
  static at::Tensor Float32(const at::Tensor& t) { return t.to(at::kFloat).contiguous(); }
};

}  // namespace tost::kernels
