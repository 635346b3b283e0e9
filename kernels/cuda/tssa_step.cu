// Causal TSSA decode step: one token per sequence, one block per sequence (the softmax over heads
// couples every channel of the token), its state row updated in place.
// Numerics and the shared building blocks: tssa_common.cuh.
#include <cstdint>

#include "kernels/cuda/tssa_common.cuh"

namespace tost::kernels::gpu {
TOST_GPU_BACKEND_NAMESPACE_BEGIN
namespace {

// Minimum resident blocks per SM requested from ptxas for the kernels whose threads keep CPT
// channels in registers. Without an explicit value ptxas trades a few spills for occupancy;
// these bounds (register caps 64, 85 or 255 at 256 threads) are the tightest that compile
// spill-free for sm_80 and sm_90 (checked with -Xptxas=-v, see TOST_CUDA_PTXAS_VERBOSE). Only
// __launch_bounds__ reads them, which a host compiler (the emulated build) ignores.
[[maybe_unused]] __host__ __device__ constexpr int StepMinBlocks(int cpt) {
  return cpt <= 16 ? 4 : 1;
}

// ---------------------------------------------------------------------------------------------
// Causal TSSA decode step: one block per sequence, its state row updated in place.

// The rows the step reads and updates: row b of `rows` for sequence b, or the row at row_ids[b] of
// a pool.
struct StepRows {
  float* rows;             // [pool_rows][2D+K]
  const int64_t* row_ids;  // [B] or null
  int64_t pool_rows;
};

// Dynamic shared memory (D + 2K) floats.
template <typename T, int CPT>
__global__ void __launch_bounds__(kRowThreads, StepMinBlocks(CPT))
    StepKernel(const T* __restrict__ w, const float* __restrict__ temp,
               const float* __restrict__ denom_bias, int64_t tmax,
               const int64_t* __restrict__ positions, StepRows state, T* __restrict__ y, int D,
               int K, int p, int group) {
  TOST_DYNAMIC_SHARED(float, smem);
  float* q_s = smem;       // [D]
  float* pi_s = q_s + D;   // [K]
  float* s3_s = pi_s + K;  // [K]
  const int b = blockIdx.x;
  const int tid = threadIdx.x;
  const int nt = blockDim.x;
  const int warp = tid / kWarpSize;
  const int nwarps = nt / kWarpSize;
  T* yrow = y + static_cast<int64_t>(b) * D;
  // Device row_ids are unchecked like positions: a row id outside the pool gets NaN and touches
  // nothing (the test is uniform over the block, so every thread returns before any barrier).
  const int64_t row = state.row_ids != nullptr ? state.row_ids[b] : b;
  if (row < 0 || row >= state.pool_rows) {
    for (int c = tid; c < D; c += nt) yrow[c] = FromFloat<T>(__int_as_float(0x7fc00000));
    return;
  }
  float* st = state.rows + row * (2 * D + K);
  const T* wrow = w + static_cast<int64_t>(b) * D;
  // Unchecked device positions (see CausalStatsKernel): NaN instead of an out-of-range read.
  const int64_t pos = positions[b];
  const bool pos_ok = pos >= 0 && pos < tmax;
  const float* db = denom_bias + (pos_ok ? pos : 0);
  const float pf = static_cast<float>(p);

  float v[CPT];
  float w2[CPT];
#pragma unroll
  for (int i = 0; i < CPT; ++i) {
    const int c = tid + i * nt;
    v[i] = 0.f;
    w2[i] = 0.f;
    if (c < D) {
      v[i] = ToFloat(wrow[c]);
      w2[i] = v[i] * v[i];
      const float s1 = st[c] + w2[i];
      st[c] = s1;
      q_s[c] = w2[i] / fmaxf(s1, kNormEps);
    }
  }
  __syncthreads();
  HeadSums<4>(
      K, p, group, warp, nwarps, [&](int c) { return q_s[c]; },
      [&](int k, float s) {
        pi_s[k] = (s + pf * (pos_ok ? db[k * tmax] : __int_as_float(0x7fc00000))) * temp[k];
      });
  __syncthreads();
  if (warp == 0) WarpSoftmaxInPlace(pi_s, K);
  __syncthreads();
  for (int k = tid; k < K; k += nt) {
    const float s3 = st[2 * D + k] + pi_s[k];
    st[2 * D + k] = s3;
    s3_s[k] = s3;
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < CPT; ++i) {
    const int c = tid + i * nt;
    if (c < D) {
      const int k = c / p;
      const float pk = pi_s[k];
      const float s2 = st[D + c] + pk * w2[i];
      st[D + c] = s2;
      yrow[c] = FromFloat<T>((-v[i] * pk) / (1.f + s2 / (s3_s[k] + kCountEps)));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.

template <typename T, int CPT>
cudaError_t RunStep(const Dims& d, const T* w, const float* temp, const float* denom_bias,
                    int64_t tmax, const int64_t* positions, StepRows state, T* y,
                    cudaStream_t stream) {
  const int D = static_cast<int>(d.channels);
  const int K = static_cast<int>(d.heads);
  const int p = D / K;
  const size_t smem = sizeof(float) * (static_cast<size_t>(D) + 2 * K);
  return Launch<StepKernel<T, CPT>, kRowThreads>(
      {dim3(static_cast<unsigned>(d.batch)), dim3(ThreadsFor(D, CPT)), smem, stream}, w, temp,
      denom_bias, tmax, positions, state, y, D, K, p, HeadGroup(p));
}

template <typename T>
cudaError_t LaunchStepT(const Dims& d, const void* w, const float* temp, const float* denom_bias,
                        int64_t tmax, const int64_t* positions, StepRows state, void* y,
                        cudaStream_t stream) {
  const T* wt = static_cast<const T*>(w);
  T* yt = static_cast<T*>(y);
  switch (ChannelsPerThread(d.channels)) {
    case 1:
      return RunStep<T, 1>(d, wt, temp, denom_bias, tmax, positions, state, yt, stream);
    case 2:
      return RunStep<T, 2>(d, wt, temp, denom_bias, tmax, positions, state, yt, stream);
    case 4:
      return RunStep<T, 4>(d, wt, temp, denom_bias, tmax, positions, state, yt, stream);
    case 8:
      return RunStep<T, 8>(d, wt, temp, denom_bias, tmax, positions, state, yt, stream);
    case 16:
      return RunStep<T, 16>(d, wt, temp, denom_bias, tmax, positions, state, yt, stream);
    default:
      return RunStep<T, 32>(d, wt, temp, denom_bias, tmax, positions, state, yt, stream);
  }
}

}  // namespace

cudaError_t LaunchTssaStep(const Dims& d, DType dtype, const void* w, const float* temp,
                           const float* denom_bias, int64_t tmax, const int64_t* positions,
                           float* state_rows, const int64_t* row_ids, int64_t pool_rows, void* y,
                           cudaStream_t stream) {
  if (UnsupportedReason(d) != nullptr || d.tokens != 1 || d.batch < 1 || d.channels < 1 ||
      positions == nullptr || (row_ids == nullptr && pool_rows != d.batch) || pool_rows < 1) {
    return cudaErrorInvalidValue;
  }
  const StepRows state{state_rows, row_ids, pool_rows};
  switch (dtype) {
    case DType::kFloat32:
      return LaunchStepT<float>(d, w, temp, denom_bias, tmax, positions, state, y, stream);
    case DType::kFloat16:
      return LaunchStepT<__half>(d, w, temp, denom_bias, tmax, positions, state, y, stream);
    case DType::kBFloat16:
      return LaunchStepT<__nv_bfloat16>(d, w, temp, denom_bias, tmax, positions, state, y, stream);
  }
  return cudaErrorInvalidValue;
}

TOST_GPU_BACKEND_NAMESPACE_END
}  // namespace tost::kernels::gpu
