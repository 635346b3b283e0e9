// Fused CPU tost::tssa_causal (prefill) and tost::tssa_step (decode).
//
// Every statistic is a prefix sum over tokens (S1 = Σw², S2 = ΣΠw², S3 = ΣΠ), so a sequence is a
// scan. The token axis is cut into chunks of kChunkTokens, fixed by position within the call; in
// each chunk the kernels keep chunk-local running sums from zero and read the statistic as
// start + local, where start is the state before the chunk. Two strategies evaluate exactly that:
//   sequential: one pass per sequence (w read once, y written once); sequences in parallel.
//   chunked:    for few long sequences, a two-level scan over all (sequence, chunk) tasks in
//               parallel: A) chunk totals of Σw²; prefix over chunks -> S1 start of each chunk;
//               B) Π per token (stored) and chunk totals of ΣΠw², ΣΠ; prefix -> S2, S3 starts;
//               C) y from Π and the running S2, S3. Three reads of w instead of one, in parallel.
// Both perform the same floating-point operations on the same values (the row kernels share the
// order and the form of every running sum), so they agree bit for bit, and neither depends on
// the thread count. tssa_step is the sequential scan of one token per sequence, on the state in
// place.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <vector>

#include "kernels/arg_checks.h"
#include "kernels/cpu/driver_util.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/tssa_cpu.h"
#include "kernels/tssa_ops.h"

namespace tost::kernels::cpu {
namespace {

using detail::CeilDiv;
using detail::Scratch;

constexpr int64_t kChunkTokens = 256;
// Rows per membership/output call of the sequential scan: Π of a block stays in L1.
constexpr int64_t kScanBlockRows = kPiBlockRows;
static_assert(kChunkTokens % kPiBlockRows == 0, "chunks hold whole Π blocks");
// The chunked scan reads w three times and does ~1.3x the arithmetic of the sequential one, so it
// is chosen only when it has at least two threads per sequence and enough chunks to share (one
// sequence of 16k tokens on 2 threads: ~9 ms chunked against ~11 ms sequential; docs/kernels.md).
constexpr int64_t kMinThreadsPerSequenceForChunkedScan = 2;
constexpr int64_t kMinChunksForChunkedScan = 4;
// Decode: sequences per parallel task (one token of D = 384 channels is ~0.2 µs of work).
constexpr int64_t kStepGrainSequences = 16;

template <typename T>
struct CausalProblem {
  using Acc = AccType<T>;
  const RowKernels<T>* kern = nullptr;
  const T* w = nullptr;
  int64_t batch_stride = 0, token_stride = 0;
  int64_t batch = 0, tokens = 0;
  HeadShape shape;
  const Acc* temp = nullptr;        // [K]
  const Acc* denom_bias = nullptr;  // [K, Tmax]
  int64_t tmax = 0;
  const int64_t* positions = nullptr;  // [B]; null: all sequences start at 0
  Acc* state = nullptr;  // [B, 2D+K] in Acc: the state before the call, replaced by the state after
  T* y = nullptr;        // [B, T, D] contiguous (tssa_step: [B, D])
  int64_t y_batch_stride = 0;

  int64_t width() const { return StateWidth(shape.channels, shape.heads); }
  int64_t chunks() const { return CeilDiv(tokens, kChunkTokens); }
  RowsView<T> rows(int64_t b, int64_t t0, int64_t n) const {
    return RowsView<T>{w + b * batch_stride + t0 * token_stride, n, token_stride};
  }
  CausalCoeffs<Acc> coeffs(int64_t b, int64_t t0) const {
    const int64_t pos = (positions != nullptr ? positions[b] : 0) + t0;
    return CausalCoeffs<Acc>{temp, denom_bias + pos, tmax};
  }
  T* y_rows(int64_t b, int64_t t0) const { return y + b * y_batch_stride + t0 * shape.channels; }
};

// start += local for one chunk's totals (S1 | S2 | S3 laid out as in the state row).
template <typename Acc>
void Fold(Acc* start, const Acc* local, int64_t n) {
  for (int64_t i = 0; i < n; ++i) start[i] += local[i];
}

template <typename T>
void ScanSequential(const CausalProblem<T>& pr) {
  using Acc = AccType<T>;
  const int64_t D = pr.shape.channels, K = pr.shape.heads, W = pr.width();
  const int64_t group = pr.tokens == 1 ? kStepGrainSequences : 1;  // sequences per task
  ParallelTasks(CeilDiv(pr.batch, group), /*reverse=*/false, [&](int64_t task) {
    auto local = Scratch<Acc>(W);  // [local1 | local2 | local3]
    auto pi = Scratch<Acc>(PiBufferSize(kScanBlockRows, K));
    for (int64_t b = task * group; b < std::min(pr.batch, (task + 1) * group); ++b) {
      Acc* start = pr.state + b * W;
      for (int64_t c0 = 0; c0 < pr.tokens; c0 += kChunkTokens) {
        const int64_t c1 = std::min(pr.tokens, c0 + kChunkTokens);
        std::fill_n(local.get(), W, Acc(0));
        for (int64_t r0 = c0; r0 < c1; r0 += kScanBlockRows) {
          const RowsView<T> rows = pr.rows(b, r0, std::min(kScanBlockRows, c1 - r0));
          pr.kern->causal_membership(rows, pr.shape, pr.coeffs(b, r0), start, local.get(), pi.get(),
                                     nullptr, nullptr);
          pr.kern->causal_output(rows, pr.shape, pi.get(), start + D, start + 2 * D,
                                 local.get() + D, local.get() + 2 * D, pr.y_rows(b, r0));
        }
        Fold(start, local.get(), W);
      }
    }
  });
}

template <typename T>
void ScanChunked(const CausalProblem<T>& pr) {
  using Acc = AccType<T>;
  const int64_t D = pr.shape.channels, K = pr.shape.heads, W = pr.width();
  const int64_t chunks = pr.chunks(), tasks = pr.batch * chunks;
  const auto chunk_rows = [&](int64_t t) {
    const int64_t b = t / chunks, t0 = (t % chunks) * kChunkTokens;
    return std::pair{b, t0};
  };
  // Per task: its chunk's totals [local1 | local2 | local3], then the state before the chunk.
  auto totals = Scratch<Acc>(tasks * W);
  auto starts = Scratch<Acc>(tasks * W);
  const int64_t pi_per_task = PiBufferSize(kChunkTokens, K);
  auto pi = Scratch<Acc>(tasks * pi_per_task);
  std::fill_n(totals.get(), tasks * W, Acc(0));
  // Exclusive prefix over chunks of one part (offset, length) of the state row.
  const auto prefix = [&](int64_t offset, int64_t length) {
    at::parallel_for(0, pr.batch, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        std::copy_n(pr.state + b * W + offset, length, starts.get() + (b * chunks) * W + offset);
        for (int64_t c = 1; c < chunks; ++c) {
          Acc* s = starts.get() + (b * chunks + c) * W + offset;
          std::copy_n(s - W, length, s);
          Fold(s, totals.get() + (b * chunks + c - 1) * W + offset, length);
        }
        // The state after the call: the start of a chunk past the last one.
        Acc* out = pr.state + b * W + offset;
        std::copy_n(starts.get() + (b * chunks + chunks - 1) * W + offset, length, out);
        Fold(out, totals.get() + (b * chunks + chunks - 1) * W + offset, length);
      }
    });
  };

  // A: chunk totals of Σw² (the same fma chain causal_membership runs on local1).
  ParallelTasks(tasks, /*reverse=*/false, [&](int64_t t) {
    const auto [b, t0] = chunk_rows(t);
    pr.kern->sum_squares(pr.rows(b, t0, std::min(kChunkTokens, pr.tokens - t0)), D,
                         totals.get() + t * W);
  });
  prefix(0, D);

  // B: Π of every token and chunk totals of ΣΠw², ΣΠ (tasks walked backwards: cache reuse).
  ParallelTasks(tasks, /*reverse=*/true, [&](int64_t t) {
    const auto [b, t0] = chunk_rows(t);
    auto local1 = Scratch<Acc>(D);
    std::fill_n(local1.get(), D, Acc(0));
    Acc* tot = totals.get() + t * W;
    pr.kern->causal_membership(pr.rows(b, t0, std::min(kChunkTokens, pr.tokens - t0)), pr.shape,
                               pr.coeffs(b, t0), starts.get() + t * W, local1.get(),
                               pi.get() + t * pi_per_task, tot + D, tot + 2 * D);
  });
  prefix(D, D + K);

  // C: y, with S2 and S3 running from each chunk's start.
  ParallelTasks(tasks, /*reverse=*/false, [&](int64_t t) {
    const auto [b, t0] = chunk_rows(t);
    auto local = Scratch<Acc>(D + K);
    std::fill_n(local.get(), D + K, Acc(0));
    const Acc* st = starts.get() + t * W;
    pr.kern->causal_output(pr.rows(b, t0, std::min(kChunkTokens, pr.tokens - t0)), pr.shape,
                           pi.get() + t * pi_per_task, st + D, st + 2 * D, local.get(),
                           local.get() + D, pr.y_rows(b, t0));
  });
}

bool UseChunkedScan(CausalScan scan, int64_t batch, int64_t tokens) {
  switch (scan) {
    case CausalScan::kSequential:
      return false;
    case CausalScan::kChunked:
      return true;
    case CausalScan::kAuto:
      break;
  }
  return batch * kMinThreadsPerSequenceForChunkedScan <= at::get_num_threads() &&
         !at::in_parallel_region() && CeilDiv(tokens, kChunkTokens) >= kMinChunksForChunkedScan;
}

// The state [B, 2D+K] in the accumulation type, as a tensor the kernels may overwrite.
at::Tensor WorkingState(const std::optional<at::Tensor>& state, at::ScalarType acc,
                        const TssaDims& d, const at::Tensor& like) {
  if (!state.has_value())
    return at::zeros({d.batch, StateWidth(d.channels, d.heads)}, like.options().dtype(acc));
  return state->to(acc, /*non_blocking=*/false, /*copy=*/true).contiguous();
}

template <typename T>
CausalProblem<T> MakeProblem(const CpuKernelOptions& options, const at::Tensor& w,
                             const TssaDims& d, const at::Tensor& temp,
                             const at::Tensor& denom_bias, const at::Tensor& positions,
                             at::Tensor& state, at::Tensor& y) {
  using Acc = AccType<T>;
  CausalProblem<T> pr;
  pr.kern = &KernelsFor<T>(options.isa.value_or(ActiveCpuIsa()));
  pr.w = w.const_data_ptr<T>();
  pr.batch = d.batch;
  pr.tokens = d.tokens;
  pr.shape = HeadShape{d.channels, d.heads, d.head_dim};
  pr.temp = temp.const_data_ptr<Acc>();
  pr.denom_bias = denom_bias.const_data_ptr<Acc>();
  pr.tmax = denom_bias.size(1);
  pr.positions = positions.defined() ? positions.const_data_ptr<int64_t>() : nullptr;
  pr.state = state.mutable_data_ptr<Acc>();
  pr.y = y.mutable_data_ptr<T>();
  return pr;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> tssa_causal_with(const CpuKernelOptions& options,
                                                    const at::Tensor& w_in,
                                                    const at::Tensor& temp_in,
                                                    const at::Tensor& denom_bias_in,
                                                    const std::optional<at::Tensor>& state_in,
                                                    const std::optional<at::Tensor>& positions_in) {
  const TssaDims d = CheckCausalArgs(w_in, temp_in, denom_bias_in, state_in, positions_in);
  const at::Tensor w = detail::WithUnitChannelStride(w_in);
  at::Tensor y = at::empty({d.batch, d.tokens, d.channels},
                           w.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor state;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, w.scalar_type(), "tost::tssa_causal (CPU)", [&] {
        const at::ScalarType acc = detail::kAccScalarType<scalar_t>;
        state = WorkingState(state_in, acc, d, w);
        if (d.batch == 0 || d.tokens == 0) return;
        const at::Tensor temp = temp_in.to(acc).contiguous();
        const at::Tensor denom_bias = denom_bias_in.to(acc).contiguous();
        const at::Tensor positions =
            positions_in.has_value() ? positions_in->to(w.device()).contiguous() : at::Tensor();
        CausalProblem<scalar_t> pr =
            MakeProblem<scalar_t>(options, w, d, temp, denom_bias, positions, state, y);
        pr.batch_stride = w.stride(0);
        pr.token_stride = w.stride(1);
        pr.y_batch_stride = d.tokens * d.channels;
        if (UseChunkedScan(options.causal_scan, d.batch, d.tokens)) {
          ScanChunked(pr);
        } else {
          ScanSequential(pr);
        }
      });
  return {y, state.to(at::kFloat)};
}

at::Tensor tssa_step_with(const CpuKernelOptions& options, const at::Tensor& w_in,
                          const at::Tensor& temp_in, const at::Tensor& denom_bias_in,
                          const at::Tensor& positions_in, at::Tensor& state) {
  const TssaDims d = CheckStepArgs(w_in, temp_in, denom_bias_in, positions_in, state);
  const at::Tensor w = detail::WithUnitChannelStride(w_in);
  at::Tensor y =
      at::empty({d.batch, d.channels}, w.options().memory_format(at::MemoryFormat::Contiguous));
  if (d.batch == 0) return y;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, w.scalar_type(), "tost::tssa_step (CPU)", [&] {
        const at::ScalarType acc = detail::kAccScalarType<scalar_t>;
        // The kernels update a contiguous state of the accumulation type in place: the caller's
        // state itself when it is one (float32 contiguous, the usual case), else a working copy.
        at::Tensor work = (state.scalar_type() == acc && state.is_contiguous())
                              ? state
                              : WorkingState(state, acc, d, w);
        const at::Tensor temp = temp_in.to(acc).contiguous();
        const at::Tensor denom_bias = denom_bias_in.to(acc).contiguous();
        const at::Tensor positions = positions_in.to(w.device()).contiguous();
        CausalProblem<scalar_t> pr =
            MakeProblem<scalar_t>(options, w, d, temp, denom_bias, positions, work, y);
        pr.batch_stride = w.stride(0);
        pr.token_stride = 0;  // one token
        pr.y_batch_stride = d.channels;
        ScanSequential(pr);
        if (!work.is_same(state)) state.copy_(work);
      });
  return y;
}

int64_t TssaStepRowScratch(const HeadShape& shape) {
  return StateWidth(shape.channels, shape.heads) + PiBufferSize(kScanBlockRows, shape.heads);
}

// ScanSequential's work for one sequence of one token, on raw memory.
void TssaStepRow(const RowKernels<float>& kernels, const HeadShape& shape, const float* w,
                 const float* temp, const float* denom_bias, int64_t tmax, int64_t position,
                 float* state, float* y, float* scratch) {
  const int64_t D = shape.channels, W = StateWidth(D, shape.heads);
  float* local = scratch;  // [local1 | local2 | local3]
  float* pi = scratch + W;
  std::fill_n(local, W, 0.f);
  const RowsView<float> row{w, 1, 0};
  kernels.causal_membership(row, shape, CausalCoeffs<float>{temp, denom_bias + position, tmax},
                            state, local, pi, nullptr, nullptr);
  kernels.causal_output(row, shape, pi, state + D, state + 2 * D, local + D, local + 2 * D, y);
  Fold(state, local, W);
}

std::tuple<at::Tensor, at::Tensor> tssa_causal(const at::Tensor& w, const at::Tensor& temp,
                                               const at::Tensor& denom_bias,
                                               const std::optional<at::Tensor>& state,
                                               const std::optional<at::Tensor>& positions) {
  return tssa_causal_with({}, w, temp, denom_bias, state, positions);
}

at::Tensor tssa_step(const at::Tensor& w, const at::Tensor& temp, const at::Tensor& denom_bias,
                     const at::Tensor& positions, at::Tensor& state,
                     const std::optional<at::Tensor>& row_ids) {
  if (!row_ids.has_value()) return tssa_step_with({}, w, temp, denom_bias, positions, state);
  CheckStepArgs(w, temp, denom_bias, positions, state, row_ids);
  // A pool in host memory: the named rows are gathered, stepped and written back (the copies are
  // a few KB per sequence; the device kernels index the pool in place instead).
  const at::Tensor rows = row_ids->to(state.device());
  at::Tensor work = state.index_select(0, rows);
  at::Tensor y = tssa_step_with({}, w, temp, denom_bias, positions, work);
  state.index_copy_(0, rows, work);
  return y;
}

}  // namespace tost::kernels::cpu
