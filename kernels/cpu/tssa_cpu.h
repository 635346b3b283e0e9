// Fused CPU kernels of the three TSSA operators (contract: kernels/tssa_ops.h; ground truth:
// kernels/reference.cc). register_ops.cc registers the first three functions as the CPU
// implementations of tost::tssa, tost::tssa_causal and tost::tssa_step; model code calls the
// dispatcher (tssa_ops.h), never these directly.
//
// Properties every kernel keeps (docs/kernels.md has the algorithms and the measurements):
//   - statistics, Π and every accumulation in float32 (float64 for float64 w); y in w's dtype;
//     the state is float32;
//   - w is read in place when its channel stride is 1 (any batch/token strides), else copied once;
//   - the work is cut into pieces whose size depends only on the shape of one sequence, so a
//     sequence's result is the same bit for bit whatever the batch, the thread count and, for
//     tssa_causal, whichever of its two scan strategies runs.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

#include "kernels/cpu/isa.h"

namespace tost::kernels::cpu {

// How tssa_causal walks the token axis. Both give identical results.
enum class CausalScan {
  kAuto,  // chunked with >= 2 threads per sequence and >= 4 chunks of 256 tokens, else sequential
  kSequential,  // one pass per sequence (reads w once), sequences in parallel
  kChunked,     // three passes over fixed token chunks, chunks of every sequence in parallel
};

struct CpuKernelOptions {
  std::optional<CpuIsa> isa;  // instruction set; default: ActiveCpuIsa()
  CausalScan causal_scan = CausalScan::kAuto;
  // tssa: write y with non-temporal stores (float32, AVX2/AVX-512); default: when y is larger than
  // the last-level cache. Results are identical either way.
  std::optional<bool> streaming_stores;
};

// The registered implementations (exact schema signatures).
at::Tensor tssa(const at::Tensor& w, const at::Tensor& temp);
std::tuple<at::Tensor, at::Tensor> tssa_causal(const at::Tensor& w, const at::Tensor& temp,
                                               const at::Tensor& denom_bias,
                                               const std::optional<at::Tensor>& state,
                                               const std::optional<at::Tensor>& positions);
at::Tensor tssa_step(const at::Tensor& w, const at::Tensor& temp, const at::Tensor& denom_bias,
                     const at::Tensor& positions, at::Tensor& state,
                     const std::optional<at::Tensor>& row_ids = std::nullopt);

// The same with explicit options, for tests and benchmarks.
at::Tensor tssa_with(const CpuKernelOptions& options, const at::Tensor& w, const at::Tensor& temp);
std::tuple<at::Tensor, at::Tensor> tssa_causal_with(const CpuKernelOptions& options,
                                                    const at::Tensor& w, const at::Tensor& temp,
                                                    const at::Tensor& denom_bias,
                                                    const std::optional<at::Tensor>& state,
                                                    const std::optional<at::Tensor>& positions);
at::Tensor tssa_step_with(const CpuKernelOptions& options, const at::Tensor& w,
                          const at::Tensor& temp, const at::Tensor& denom_bias,
                          const at::Tensor& positions, at::Tensor& state);

// One decode token of one sequence on float32 memory the caller owns (the lean decode step, which
// runs without tensors): the arithmetic of tssa_step for that sequence, bit for bit. w [D],
// temp [K], denom_bias [K, tmax] (row k at k·tmax), state [2D+K] updated in place, y [D]; `scratch`
// holds TssaStepRowScratch(shape) floats. position + 1 must not exceed tmax (not checked here).
int64_t TssaStepRowScratch(const HeadShape& shape);
void TssaStepRow(const RowKernels<float>& kernels, const HeadShape& shape, const float* w,
                 const float* temp, const float* denom_bias, int64_t tmax, int64_t position,
                 float* state, float* y, float* scratch);

}  // namespace tost::kernels::cpu
