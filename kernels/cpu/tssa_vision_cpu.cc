// Fused CPU tost::tssa (vision, global statistics over the N tokens of each sequence).
//
// Three passes over w, the fewest the math allows (Π needs ν from all tokens, the gate needs
// ΣΠw² from all tokens):
//   1. column pass     S1[c]  = Σ_j w[j,c]²                          -> 1/ν² = 1/max(√S1, 1e-12)²
//   2. membership pass Π[j,k] = softmax_k(temp[k]·Σ_c w²/ν²), stored (N·K values, 1/48 of w at
//   D=384);
//                      S2[c] = Σ_j Π[j,k(c)]·w[j,c]², n[k] = Σ_j Π[j,k] -> gate = 1/(1 + S2/(n +
//                      1e-8))
//   3. output pass     y[j,c] = −w[j,c]·Π[j,k(c)]·gate[c]
// Each sequence's tokens are cut into chunks whose length depends only on N; a task is one
// (sequence, chunk) and keeps its own partial sums, reduced in chunk order, so the result does
// not depend on the batch or the thread count. All three passes give each thread the same share of
// tasks first (ParallelTasks), so a thread re-reads data it has just read: while its share
// of w fits its caches only the first pass touches DRAM; a thread that finishes early takes
// unclaimed tasks of the others. Pass 2 walks the shares backwards so that, when w is larger than
// the last-level cache, each pass starts on the rows the previous one touched last.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <unistd.h>

#include <cmath>

#include "kernels/arg_checks.h"
#include "kernels/cpu/driver_util.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/tssa_cpu.h"
#include "kernels/reference.h"

namespace tost::kernels::cpu {
namespace {

using detail::CeilDiv;
using detail::Scratch;

// Tokens per task: at least 128 rows (amortises the per-task partial sums), at most 64 chunks per
// sequence (bounds the partial-sum scratch and the reduction), whole Π blocks.
int64_t ChunkRows(int64_t tokens) {
  return CeilDiv(std::max<int64_t>(128, CeilDiv(tokens, 64)), kPiBlockRows) * kPiBlockRows;
}

// Non-temporal stores for y once it is this many times the last-level cache.
constexpr double kStreamingFractionOfCache = 1.0;
// Sequences are processed in groups whose w fits in this fraction of the last-level cache: all
// three passes run over one group before the next, so only the first pass of each group reads w
// from DRAM (measured at B=8, N=16k: see docs/kernels.md). Sequences are independent, so the
// grouping changes no result.
constexpr double kGroupFractionOfCache = 0.5;

double LastLevelCacheBytes() {
  static const double bytes = [] {
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    return l3 > 0 ? static_cast<double>(l3) : 32.0 * (1 << 20);
  }();
  return bytes;
}

template <typename T>
void RunTssa(const RowKernels<T>& kern, const T* w, int64_t batch_stride, int64_t row_stride,
             const TssaDims& d, const AccType<T>* temp, T* y, bool stream) {
  using Acc = AccType<T>;
  const int64_t B = d.batch, N = d.tokens, D = d.channels, K = d.heads;
  const HeadShape shape{D, K, d.head_dim};
  const int64_t chunk = ChunkRows(N);
  const int64_t chunks = CeilDiv(N, chunk);
  const int64_t tasks = B * chunks;
  struct Task {
    int64_t b, r0;
    RowsView<T> rows;
  };
  const auto task = [&](int64_t t) {
    const int64_t b = t / chunks, r0 = (t % chunks) * chunk;
    return Task{
        b, r0,
        RowsView<T>{w + b * batch_stride + r0 * row_stride, std::min(chunk, N - r0), row_stride}};
  };

  auto partial = Scratch<Acc>(tasks * D);    // per task: Σw², then ΣΠw²
  auto partial_n = Scratch<Acc>(tasks * K);  // per task: ΣΠ
  auto inv_nu2 = Scratch<Acc>(B * D);
  auto gate = Scratch<Acc>(B * D);
  const int64_t pi_per_task = PiBufferSize(chunk, K);
  auto pi = Scratch<Acc>(tasks * pi_per_task);

  // Pass 1: Σ_j w² per task.
  std::fill_n(partial.get(), tasks * D, Acc(0));
  ParallelTasks(tasks, /*reverse=*/false,
                [&](int64_t t) { kern.sum_squares(task(t).rows, D, partial.get() + t * D); });
  // ν = max(√S1, 1e-12) (F.normalize clamps the norm); the kernels use w²·(1/ν²) for (w/ν)².
  at::parallel_for(0, B * D, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / D, c = i % D;
      Acc s1 = 0;
      for (int64_t ch = 0; ch < chunks; ++ch) s1 += partial[(b * chunks + ch) * D + c];
      const Acc nu = std::max(std::sqrt(s1), static_cast<Acc>(reference::kNormEps));
      inv_nu2[i] = Acc(1) / (nu * nu);
    }
  });

  // Pass 2: Π, ΣΠw², ΣΠ per task (tasks walked backwards, see the file comment).
  std::fill_n(partial.get(), tasks * D, Acc(0));
  std::fill_n(partial_n.get(), tasks * K, Acc(0));
  ParallelTasks(tasks, /*reverse=*/true, [&](int64_t t) {
    const Task tk = task(t);
    kern.vision_membership(tk.rows, shape, inv_nu2.get() + tk.b * D, temp,
                           pi.get() + t * pi_per_task, partial.get() + t * D,
                           partial_n.get() + t * K);
  });
  // gate = 1/(1 + dots), dots = ΣΠw² / (ΣΠ + 1e-8).
  at::parallel_for(0, B * D, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / D, c = i % D, k = c / d.head_dim;
      Acc s2 = 0, n = 0;
      for (int64_t ch = 0; ch < chunks; ++ch) {
        s2 += partial[(b * chunks + ch) * D + c];
        n += partial_n[(b * chunks + ch) * K + k];
      }
      gate[i] = Acc(1) / (Acc(1) + s2 / (n + static_cast<Acc>(reference::kCountEps)));
    }
  });

  // Pass 3: y = −w·Π·gate. With `stream` (an output larger than the last-level cache) y is written
  // around the caches: it would only evict w and cost a line read per line written.
  ParallelTasks(tasks, /*reverse=*/false, [&](int64_t t) {
    const Task tk = task(t);
    kern.vision_output(tk.rows, shape, pi.get() + t * pi_per_task, gate.get() + tk.b * D,
                       y + (tk.b * N + tk.r0) * D, stream);
  });
}

}  // namespace

at::Tensor tssa_with(const CpuKernelOptions& options, const at::Tensor& w_in,
                     const at::Tensor& temp_in) {
  const TssaDims d = CheckTssaArgs(w_in, temp_in);
  const at::Tensor w = detail::WithUnitChannelStride(w_in);
  at::Tensor y = at::empty({d.batch, d.tokens, d.channels},
                           w.options().memory_format(at::MemoryFormat::Contiguous));
  if (y.numel() == 0) return y;
  const CpuIsa isa = options.isa.value_or(ActiveCpuIsa());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, w.scalar_type(), "tost::tssa (CPU)", [&] {
        using Acc = AccType<scalar_t>;
        const at::Tensor temp = temp_in.to(detail::kAccScalarType<scalar_t>).contiguous();
        const double sequence_bytes = static_cast<double>(d.tokens * d.channels) * sizeof(scalar_t);
        const int64_t group = std::clamp<int64_t>(
            static_cast<int64_t>(kGroupFractionOfCache * LastLevelCacheBytes() / sequence_bytes), 1,
            d.batch);
        // y is streamed past the caches when the whole of it would not fit: the consumer reads it
        // after every group, so caching one group's y would only evict the next group's w.
        const bool stream = options.streaming_stores.value_or(
            static_cast<double>(y.nbytes()) > kStreamingFractionOfCache * LastLevelCacheBytes());
        for (int64_t b0 = 0; b0 < d.batch; b0 += group) {
          TssaDims part = d;
          part.batch = std::min(group, d.batch - b0);
          RunTssa<scalar_t>(KernelsFor<scalar_t>(isa),
                            w.const_data_ptr<scalar_t>() + b0 * w.stride(0), w.stride(0),
                            w.stride(1), part, temp.const_data_ptr<Acc>(),
                            y.mutable_data_ptr<scalar_t>() + b0 * d.tokens * d.channels, stream);
        }
      });
  return y;
}

at::Tensor tssa(const at::Tensor& w, const at::Tensor& temp) { return tssa_with({}, w, temp); }

}  // namespace tost::kernels::cpu
