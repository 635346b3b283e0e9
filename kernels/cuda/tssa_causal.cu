// Causal TSSA prefill: y, and the state after the last token, as
//   ChunkSumSq → ChunkScan(S1) → CausalStats (local S1 scan, Π, chunk sums) → ChunkScan(S2, S3)
//   → CausalApply (local S2/S3 scan, y)
// Numerics, chunking and the shared building blocks: tssa_common.cuh.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/tssa_common.cuh"

namespace tost::kernels::gpu {
TOST_GPU_BACKEND_NAMESPACE_BEGIN
namespace {

constexpr int kMaxTileTokens = 16;          // CausalStats: tokens per shared-memory q tile
constexpr size_t kCausalTileFloats = 8192;  // 32 KiB budget for the q tile

// Minimum resident blocks per SM requested from ptxas for the kernels whose threads keep CPT
// channels in registers. Without an explicit value ptxas trades a few spills for occupancy;
// these bounds (register caps 64, 85 or 255 at 256 threads) are the tightest that compile
// spill-free for sm_80 and sm_90 (checked with -Xptxas=-v, see TOST_CUDA_PTXAS_VERBOSE). Only
// __launch_bounds__ reads them, which a host compiler (the emulated build) ignores.
[[maybe_unused]] __host__ __device__ constexpr int CausalStatsMinBlocks(int cpt) {
  return cpt <= 4 ? 4 : (cpt <= 16 ? 3 : 1);
}
[[maybe_unused]] __host__ __device__ constexpr int CausalApplyMinBlocks(int cpt) {
  return cpt <= 4 ? 4 : (cpt <= 8 ? 3 : 1);
}

// In-place exclusive scan over chunks of part[b][g][i] (layout [B][chunks][width]), seeded with
// state_in[b][offset + i] (or 0); the total goes to state_out[b][offset + i]. grid
// B·ceil(width/32), dynamic shared memory kReduceWarps·32 floats.
__global__ void __launch_bounds__(kReduceThreads)
    ChunkScanKernel(float* __restrict__ part, int chunks, int width,
                    const float* __restrict__ state_in, int64_t state_width, int offset,
                    float* __restrict__ state_out) {
  TOST_DYNAMIC_SHARED(float, totals);  // [kReduceWarps][32]
  const int groups = (width + kWarpSize - 1) / kWarpSize;
  const int64_t b = blockIdx.x / groups;
  const int lane = threadIdx.x & (kWarpSize - 1);
  const int warp = threadIdx.x / kWarpSize;
  const int i = static_cast<int>(blockIdx.x % groups) * kWarpSize + lane;
  const bool valid = i < width;
  float* col = part + b * chunks * width + i;
  int g0, g1;
  WarpChunkRange(chunks, warp, &g0, &g1);
  float sum = 0.f;
  if (valid) {
    for (int g = g0; g < g1; ++g) sum += col[static_cast<int64_t>(g) * width];
  }
  totals[warp * kWarpSize + lane] = sum;
  __syncthreads();
  float run = (valid && state_in != nullptr) ? state_in[b * state_width + offset + i] : 0.f;
  for (int w = 0; w < warp; ++w) run += totals[w * kWarpSize + lane];
  if (!valid) return;
  if (warp == kReduceWarps - 1) state_out[b * state_width + offset + i] = run + sum;
  for (int g = g0; g < g1; ++g) {
    const float v = col[static_cast<int64_t>(g) * width];
    col[static_cast<int64_t>(g) * width] = run;
    run += v;
  }
}

// ---------------------------------------------------------------------------------------------
// Causal TSSA (prefill).

// Per chunk, given the exclusive S1 prefix prefix1[b][g][c] (state S1 included): the local S1 scan,
// q = w²/max(S1, 1e-12) in a shared tile of `tile` tokens, one warp per token for the logits
// temp[k]·(Σ_c q + p·δ[k,pos]) and the head softmax, Π to pi[b][t][k], and the chunk sums
// part23[b][g][c] = Σ_t Π·w², part23[b][g][D+k] = Σ_t Π. Thread i owns channels i + j·blockDim.
// grid B·chunks (block b·chunks + g), dynamic shared memory (tile·(D+K) + K) floats.
template <typename T, int CPT>
__global__ void __launch_bounds__(kRowThreads, CausalStatsMinBlocks(CPT))
    CausalStatsKernel(const T* __restrict__ w, const float* __restrict__ temp,
                      const float* __restrict__ denom_bias, int64_t tmax,
                      const int64_t* __restrict__ positions, const float* __restrict__ prefix1,
                      float* __restrict__ pi, float* __restrict__ part23, int64_t tokens, int D,
                      int K, int p, int group, int64_t chunk_tokens, int chunks, int tile) {
  TOST_DYNAMIC_SHARED(float, smem);
  float* q_s = smem;              // [tile][D]
  float* pi_s = q_s + tile * D;   // [tile][K]
  float* s3_s = pi_s + tile * K;  // [K], entry k owned by thread k % blockDim
  const int g = static_cast<int>(blockIdx.x % chunks);
  const int b = static_cast<int>(blockIdx.x / chunks);
  const int tid = threadIdx.x;
  const int nt = blockDim.x;
  const int lane = tid & (kWarpSize - 1);
  const int warp = tid / kWarpSize;
  const int nwarps = nt / kWarpSize;
  const int64_t t0 = g * chunk_tokens;
  const int64_t t1 = min(tokens, t0 + chunk_tokens);
  const int64_t pos0 = (positions != nullptr ? positions[b] : 0);
  // Positions come from the device unchecked (a host check would synchronise): a sequence whose
  // tokens fall outside denom_bias gets NaN instead of an out-of-range read.
  const bool pos_ok = pos0 >= 0 && pos0 <= tmax - tokens;
  const T* wb = w + static_cast<int64_t>(b) * tokens * D;
  const float* pre = prefix1 + (static_cast<int64_t>(b) * chunks + g) * D;
  const float pf = static_cast<float>(p);

  float run1[CPT];
  float acc2[CPT];
  int head[CPT];
#pragma unroll
  for (int i = 0; i < CPT; ++i) {
    const int c = tid + i * nt;
    run1[i] = c < D ? pre[c] : 0.f;
    acc2[i] = 0.f;
    head[i] = c < D ? c / p : 0;
  }
  for (int k = tid; k < K; k += nt) s3_s[k] = 0.f;

  for (int64_t ts = t0; ts < t1; ts += tile) {
    const int n = static_cast<int>(min(static_cast<int64_t>(tile), t1 - ts));
    // (i) S1 running sums and q for the tile.
    for (int j = 0; j < n; ++j) {
      const T* row = wb + (ts + j) * D;
      float* qrow = q_s + j * D;
#pragma unroll
      for (int i = 0; i < CPT; ++i) {
        const int c = tid + i * nt;
        if (c < D) {
          const float v = ToFloat(row[c]);
          const float w2 = v * v;
          run1[i] += w2;
          qrow[c] = w2 / fmaxf(run1[i], kNormEps);
        }
      }
    }
    __syncthreads();
    // (ii) Logits and softmax over heads, one warp per token.
    for (int j = warp; j < n; j += nwarps) {
      const float* qrow = q_s + j * D;
      float* prow = pi_s + j * K;
      const float* db = denom_bias + (pos_ok ? pos0 + ts + j : 0);
      // At 16 channels a thread the unrolled loop costs CausalStats a spill (80 registers).
      HeadSums<CPT >= 16 ? 1 : 4>(
          K, p, group, 0, 1, [&](int c) { return qrow[c]; },
          [&](int k, float s) {
            prow[k] = (s + pf * (pos_ok ? db[k * tmax] : __int_as_float(0x7fc00000))) * temp[k];
          });
      __syncwarp();
      WarpSoftmaxInPlace(prow, K);
      float* pg = pi + (static_cast<int64_t>(b) * tokens + ts + j) * K;
      for (int k = lane; k < K; k += kWarpSize) pg[k] = prow[k];
    }
    __syncthreads();
    // (iii) Chunk sums of Π·w² and Π.
    for (int j = 0; j < n; ++j) {
      const T* row = wb + (ts + j) * D;
      const float* prow = pi_s + j * K;
#pragma unroll
      for (int i = 0; i < CPT; ++i) {
        const int c = tid + i * nt;
        if (c < D) {
          const float v = ToFloat(row[c]);
          acc2[i] += prow[head[i]] * (v * v);
        }
      }
    }
    for (int k = tid; k < K; k += nt) {
      float s = s3_s[k];
      for (int j = 0; j < n; ++j) s += pi_s[j * K + k];
      s3_s[k] = s;
    }
    // No barrier needed before the next tile: its step (i) writes only q_s, which nothing reads
    // after the barrier ending (ii), and pi_s is rewritten only after the barrier ending (i). (The
    // emulator's race checker confirms it: tests/kernels/emulator.)
  }

  float* out = part23 + (static_cast<int64_t>(b) * chunks + g) * (D + K);
#pragma unroll
  for (int i = 0; i < CPT; ++i) {
    const int c = tid + i * nt;
    if (c < D) out[c] = acc2[i];
  }
  for (int k = tid; k < K; k += nt) out[D + k] = s3_s[k];
}

// Per chunk, given the exclusive prefixes prefix23[b][g][c] (S2) and prefix23[b][g][D+k] (S3):
// the local inclusive scans of Π·w² and Π, and y = (−w·Π) / (1 + S2/(S3 + 1e-8)). grid B·chunks
// (block b·chunks + g).
template <typename T, int CPT>
__global__ void __launch_bounds__(kRowThreads, CausalApplyMinBlocks(CPT))
    CausalApplyKernel(const T* __restrict__ w, const float* __restrict__ pi,
                      const float* __restrict__ prefix23, T* __restrict__ y, int64_t tokens, int D,
                      int K, int p, int64_t chunk_tokens, int chunks) {
  const int g = static_cast<int>(blockIdx.x % chunks);
  const int b = static_cast<int>(blockIdx.x / chunks);
  const int tid = threadIdx.x;
  const int nt = blockDim.x;
  const int64_t t0 = g * chunk_tokens;
  const int64_t t1 = min(tokens, t0 + chunk_tokens);
  const float* pre = prefix23 + (static_cast<int64_t>(b) * chunks + g) * (D + K);
  float run2[CPT];
  float run3[CPT];
  int head[CPT];
#pragma unroll
  for (int i = 0; i < CPT; ++i) {
    const int c = tid + i * nt;
    head[i] = c < D ? c / p : 0;
    run2[i] = c < D ? pre[c] : 0.f;
    run3[i] = c < D ? pre[D + head[i]] : 0.f;
  }
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t r = static_cast<int64_t>(b) * tokens + t;
    const T* row = w + r * D;
    T* yrow = y + r * D;
    const float* prow = pi + r * K;
#pragma unroll
    for (int i = 0; i < CPT; ++i) {
      const int c = tid + i * nt;
      if (c < D) {
        const float v = ToFloat(row[c]);
        const float pk = prow[head[i]];
        run2[i] += pk * (v * v);
        run3[i] += pk;
        yrow[c] = FromFloat<T>((-v * pk) / (1.f + run2[i] / (run3[i] + kCountEps)));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.

int CausalTile(const Dims& d, int64_t chunk_tokens) {
  const int64_t fit = (static_cast<int64_t>(kCausalTileFloats) - d.heads) / (d.channels + d.heads);
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>({fit, kMaxTileTokens, chunk_tokens})));
}

struct CausalWorkspace {
  float* part1;   // [B][chunks][D]
  float* part23;  // [B][chunks][D+K]
  float* pi;      // [B][T][K]
};

struct CausalLayout {
  size_t part1 = 0, part23 = 0, pi = 0, total = 0;
  size_t part1_bytes = 0, part23_bytes = 0, pi_bytes = 0;
};

CausalLayout LayoutCausal(const Dims& d, int64_t chunks) {
  CausalLayout l;
  l.part1_bytes = sizeof(float) * d.batch * chunks * d.channels;
  l.part23_bytes = sizeof(float) * d.batch * chunks * (d.channels + d.heads);
  l.pi_bytes = sizeof(float) * d.batch * d.tokens * d.heads;
  l.part23 = l.part1 + Footprint(l.part1_bytes);
  l.pi = l.part23 + Footprint(l.part23_bytes);
  l.total = l.pi + Footprint(l.pi_bytes);
  return l;
}

CausalWorkspace CarveCausal(const Dims& d, int64_t chunks, void* base) {
  const CausalLayout l = LayoutCausal(d, chunks);
  return {static_cast<float*>(WorkspaceBuffer(base, l.part1, l.part1_bytes, "part1")),
          static_cast<float*>(WorkspaceBuffer(base, l.part23, l.part23_bytes, "part23")),
          static_cast<float*>(WorkspaceBuffer(base, l.pi, l.pi_bytes, "pi"))};
}

template <typename T, int CPT>
cudaError_t RunCausalScans(const Dims& d, const Plan& plan, const T* w, const float* temp,
                           const float* denom_bias, int64_t tmax, const float* state_in,
                           const int64_t* positions, T* y, float* state_out,
                           const CausalWorkspace& ws, cudaStream_t stream) {
  const int D = static_cast<int>(d.channels);
  const int K = static_cast<int>(d.heads);
  const int p = D / K;
  const int chunks = static_cast<int>(plan.chunks);
  const int64_t state_width = 2 * d.channels + d.heads;
  const dim3 grid(static_cast<unsigned>(plan.chunks * d.batch));
  const int threads = ThreadsFor(D, CPT);
  const int tile = CausalTile(d, plan.chunk_tokens);

  TOST_RETURN_IF_CUDA_ERROR((Launch<ChunkScanKernel, kReduceThreads>(
      {dim3(static_cast<unsigned>(d.batch * CeilDiv(D, kWarpSize))), dim3(kReduceThreads),
       sizeof(float) * kReduceThreads, stream},
      ws.part1, chunks, D, state_in, state_width, 0, state_out)));
  const size_t stats_smem = sizeof(float) * (static_cast<size_t>(tile) * (D + K) + K);
  TOST_RETURN_IF_CUDA_ERROR((Launch<CausalStatsKernel<T, CPT>, kRowThreads>(
      {grid, dim3(threads), stats_smem, stream}, w, temp, denom_bias, tmax, positions, ws.part1,
      ws.pi, ws.part23, d.tokens, D, K, p, HeadGroup(p), plan.chunk_tokens, chunks, tile)));
  TOST_RETURN_IF_CUDA_ERROR((Launch<ChunkScanKernel, kReduceThreads>(
      {dim3(static_cast<unsigned>(d.batch * CeilDiv(D + K, kWarpSize))), dim3(kReduceThreads),
       sizeof(float) * kReduceThreads, stream},
      ws.part23, chunks, D + K, state_in, state_width, D, state_out)));
  return Launch<CausalApplyKernel<T, CPT>, kRowThreads>({grid, dim3(threads), 0, stream}, w, ws.pi,
                                                        ws.part23, y, d.tokens, D, K, p,
                                                        plan.chunk_tokens, chunks);
}

template <typename T>
cudaError_t LaunchCausalT(const Dims& d, const Plan& plan, const void* w_raw, const float* temp,
                          const float* denom_bias, int64_t tmax, const float* state_in,
                          const int64_t* positions, void* y_raw, float* state_out, void* workspace,
                          cudaStream_t stream) {
  const CausalWorkspace ws = CarveCausal(d, plan.chunks, workspace);
  const T* w = static_cast<const T*>(w_raw);
  T* y = static_cast<T*>(y_raw);
  const int D = static_cast<int>(d.channels);
  const dim3 grid(static_cast<unsigned>(plan.chunks * d.batch));
  const int chunks = static_cast<int>(plan.chunks);

  constexpr int kVec = 16 / sizeof(T);
  if (d.channels % kVec == 0 && Aligned16(w)) {
    TOST_RETURN_IF_CUDA_ERROR((Launch<ChunkSumSqKernel<T, kVec>, kColumnThreads>(
        {grid, dim3(ColumnThreads(D, kVec)), 0, stream}, w, ws.part1, d.tokens, D,
        plan.chunk_tokens, chunks)));
  } else {
    TOST_RETURN_IF_CUDA_ERROR((Launch<ChunkSumSqKernel<T, 1>, kColumnThreads>(
        {grid, dim3(ColumnThreads(D, 1)), 0, stream}, w, ws.part1, d.tokens, D, plan.chunk_tokens,
        chunks)));
  }

  switch (ChannelsPerThread(D)) {
    case 1:
      return RunCausalScans<T, 1>(d, plan, w, temp, denom_bias, tmax, state_in, positions, y,
                                  state_out, ws, stream);
    case 2:
      return RunCausalScans<T, 2>(d, plan, w, temp, denom_bias, tmax, state_in, positions, y,
                                  state_out, ws, stream);
    case 4:
      return RunCausalScans<T, 4>(d, plan, w, temp, denom_bias, tmax, state_in, positions, y,
                                  state_out, ws, stream);
    case 8:
      return RunCausalScans<T, 8>(d, plan, w, temp, denom_bias, tmax, state_in, positions, y,
                                  state_out, ws, stream);
    case 16:
      return RunCausalScans<T, 16>(d, plan, w, temp, denom_bias, tmax, state_in, positions, y,
                                   state_out, ws, stream);
    default:
      return RunCausalScans<T, 32>(d, plan, w, temp, denom_bias, tmax, state_in, positions, y,
                                   state_out, ws, stream);
  }
}

}  // namespace

Plan PlanTssaCausal(const Dims& d) {
  Plan plan;
  if (d.tokens < 1) return plan;
  plan.chunk_tokens = ChunkTokens(d.tokens);
  plan.chunks = CeilDiv(d.tokens, plan.chunk_tokens);
  plan.workspace_bytes = LayoutCausal(d, plan.chunks).total;
  return plan;
}

cudaError_t LaunchTssaCausal(const Dims& d, const Plan& plan, DType dtype, const void* w,
                             const float* temp, const float* denom_bias, int64_t tmax,
                             const float* state_in, const int64_t* positions, void* y,
                             float* state_out, void* workspace, cudaStream_t stream) {
  if (!ValidPlan(d, plan)) return cudaErrorInvalidValue;
  switch (dtype) {
    case DType::kFloat32:
      return LaunchCausalT<float>(d, plan, w, temp, denom_bias, tmax, state_in, positions, y,
                                  state_out, workspace, stream);
    case DType::kFloat16:
      return LaunchCausalT<__half>(d, plan, w, temp, denom_bias, tmax, state_in, positions, y,
                                   state_out, workspace, stream);
    case DType::kBFloat16:
      return LaunchCausalT<__nv_bfloat16>(d, plan, w, temp, denom_bias, tmax, state_in, positions,
                                          y, state_out, workspace, stream);
  }
  return cudaErrorInvalidValue;
}

TOST_GPU_BACKEND_NAMESPACE_END
}  // namespace tost::kernels::gpu
