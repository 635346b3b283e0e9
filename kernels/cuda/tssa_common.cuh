// What the three TSSA paths (tssa_vision.cu, tssa_causal.cu, tssa_step.cu) share: the numerics
// every kernel follows, the launch constants, element conversion and vector access, the warp-level
// building blocks, the cross-chunk reduction layout, the ChunkSumSq kernel, and the host-side
// sizing of threads, chunks and workspaces. Included by the .cu files only (no separate device
// linking: each translation unit compiles the pieces it uses).
//
// The ATen reference (kernels/reference.cc) is the ground truth (docs/model-semantics.md §1.1,
// §2.1, §2.2); the eps placement follows it exactly:
//   vision  ν = max(sqrt(Σ_j w²), 1e-12)           (clamp on the norm)
//   causal  S1 = max(S1_0 + Σ_{s≤t} w², 1e-12)     (clamp on the squared sum; the state keeps
//           S1 unclamped), logit = temp[k] · (Σ_c w²/S1 + p·δ[k, pos])
//   both    dots = Σ Π·w² / (Σ Π + 1e-8),  y = (−w·Π) / (1 + dots)
// All statistics are float32 at every input precision; every reduction has a fixed order, so
// results are deterministic run to run (no floating-point atomics).
//
// Work decomposition (B sequences, N/T tokens, D = K·p channels):
//   * Token-axis reductions are cut into chunks of `chunk_tokens` tokens, one thread block per
//     (chunk, sequence). Threads own channels and walk the chunk's tokens, so every global access
//     is a coalesced row segment; per-chunk partials go to a workspace and are combined by a
//     second small kernel (vision: a sum; causal: an exclusive scan that also emits the state).
//   * Per-token head logits and the softmax over the K heads are warp-level: a warp owns a token
//     row, lanes form groups of `group` lanes (a power of two ≥ min(p, 32)), one group per head,
//     and reduce with shuffles.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/device_launch.h"
#include "kernels/cuda/tssa_cuda.h"
#ifndef TOST_CUDA_EMULATION
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace tost::kernels::gpu {
TOST_GPU_BACKEND_NAMESPACE_BEGIN

inline constexpr float kNormEps = 1e-12f;  // reference::kNormEps
inline constexpr float kCountEps = 1e-8f;  // reference::kCountEps
inline constexpr unsigned kFullMask = 0xffffffffu;
inline constexpr int kWarpSize = 32;

inline constexpr int kColumnThreads = 256;  // ChunkSumSq, TssaStats, TssaApply
// CausalStats, CausalApply, Step: thread i owns channels i + j·blockDim.
inline constexpr int kRowThreads = 256;
inline constexpr int kMaxChannelsPerThread = 32;
static_assert(kMaxChannelsPerThread * kRowThreads >= kMaxChannels,
              "row kernels must cover kMaxChannels");
inline constexpr int kReduceWarps = 8;  // ChunkScan, Norm, Gate: warps splitting the chunks
inline constexpr int kReduceThreads = kReduceWarps * kWarpSize;
inline constexpr int64_t kMaxChunkTokens = 64;
inline constexpr int64_t kMinChunkTokens = 8;
inline constexpr int64_t kTargetChunks = 64;
// The token-chunked kernels run one block per (sequence, chunk) on a flat grid.x.
inline constexpr int64_t kMaxGridBlocks = INT32_MAX;

#define TOST_RETURN_IF_CUDA_ERROR(expr)             \
  do {                                              \
    const cudaError_t tost_err_ = (expr);           \
    if (tost_err_ != cudaSuccess) return tost_err_; \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Element conversion and vector access.

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// V consecutive elements; for V > 1 the address must be aligned to sizeof(T)·V (one vector access).
template <typename T, int V>
__device__ __forceinline__ void LoadVec(const T* __restrict__ p, float (&out)[V]) {
  if constexpr (V == 1) {
    out[0] = ToFloat(p[0]);
  } else {
    const Pack<T, V> pk = *reinterpret_cast<const Pack<T, V>*>(p);
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = ToFloat(pk.v[i]);
  }
}

template <typename T, int V>
__device__ __forceinline__ void StoreVec(T* __restrict__ p, const float (&in)[V]) {
  if constexpr (V == 1) {
    p[0] = FromFloat<T>(in[0]);
  } else {
    Pack<T, V> pk;
#pragma unroll
    for (int i = 0; i < V; ++i) pk.v[i] = FromFloat<T>(in[i]);
    *reinterpret_cast<Pack<T, V>*>(p) = pk;
  }
}

// ---------------------------------------------------------------------------------------------
// Warp-level building blocks.

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Per-head sums Σ_{c<p} q(k·p + c) for every head k handled by the calling warp. Lanes form groups
// of `group` lanes (power of two, ≤ 32), one head per group per pass; passes first_pass,
// first_pass + pass_stride, ... cover the heads. The group leader hands (k, sum) to `sink`.
// Must be called by all 32 lanes of the warp (the pass loop is warp-uniform). kUnroll unrolls the
// channel loop (the same sum order at any value): 4 where the registers allow it.
template <int kUnroll, typename Q, typename Sink>
__device__ __forceinline__ void HeadSums(int heads, int p, int group, int first_pass,
                                         int pass_stride, Q q, Sink sink) {
  const int lane = threadIdx.x & (kWarpSize - 1);
  const int per_pass = kWarpSize / group;
  const int g = lane / group;
  const int gl = lane & (group - 1);
  for (int pass = first_pass; pass * per_pass < heads; pass += pass_stride) {
    const int k = pass * per_pass + g;
    float s = 0.f;
    if (k < heads) {
      const int base = k * p;
      // Unrolled, the loads of several channels are in flight at once (one sum, the same order).
#pragma unroll(kUnroll)
      for (int c = gl; c < p; c += group) s += q(base + c);
    }
    for (int o = group >> 1; o > 0; o >>= 1) s += __shfl_xor_sync(kFullMask, s, o);
    if (gl == 0 && k < heads) sink(k, s);
  }
}

// In-place softmax of x[0..K) (shared memory) by one warp. Each lane rewrites only the entries it
// read, so callers need a __syncwarp() only between producing x and calling this.
__device__ __forceinline__ void WarpSoftmaxInPlace(float* x, int heads) {
  const int lane = threadIdx.x & (kWarpSize - 1);
  float m = __int_as_float(0xff800000);  // -inf
  for (int k = lane; k < heads; k += kWarpSize) m = fmaxf(m, x[k]);
  m = WarpMax(m);
  float s = 0.f;
  for (int k = lane; k < heads; k += kWarpSize) {
    const float e = expf(x[k] - m);
    x[k] = e;
    s += e;
  }
  s = WarpSum(s);
  for (int k = lane; k < heads; k += kWarpSize) x[k] = x[k] / s;
}

// ---------------------------------------------------------------------------------------------
// Kernels shared by the vision and causal paths.

// part[b][g][c] = Σ_{t ∈ chunk g} w[b,t,c]²   (layout [B][chunks][D]). grid B·chunks (block
// b·chunks + g).
template <typename T, int V>
__global__ void __launch_bounds__(kColumnThreads)
    ChunkSumSqKernel(const T* __restrict__ w, float* __restrict__ part, int64_t tokens, int D,
                     int64_t chunk_tokens, int chunks) {
  const int g = static_cast<int>(blockIdx.x % chunks);
  const int b = static_cast<int>(blockIdx.x / chunks);
  const int64_t t0 = g * chunk_tokens;
  const int rows = static_cast<int>(min(tokens, t0 + chunk_tokens) - t0);
  const T* wb = w + (static_cast<int64_t>(b) * tokens + t0) * D;
  float* out = part + (static_cast<int64_t>(b) * chunks + g) * D;
  for (int c = threadIdx.x * V; c < D; c += blockDim.x * V) {
    float acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0.f;
      // Two rows in flight at every V (a few registers here): at V = 8 one 16-byte load a thread
      // left the kernel at 66 % of DRAM bandwidth on an H100.
#pragma unroll(V == 1 ? 4 : 2)
    for (int r = 0; r < rows; ++r) {
      float v[V];
      LoadVec<T, V>(wb + static_cast<int64_t>(r) * D + c, v);
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] += v[i] * v[i];
    }
#pragma unroll
    for (int i = 0; i < V; ++i) out[c + i] = acc[i];
  }
}

// The cross-chunk reductions (scan, norm, gate) run one block per (sequence, 32 columns): lane l of
// every warp owns column 32·group + l (coalesced rows), and the kReduceWarps warps split the chunks
// into contiguous ranges, reduced in parallel and combined in warp order. The order of every sum
// depends on the number of chunks only, so results do not change with the batch.
__device__ __forceinline__ void WarpChunkRange(int chunks, int warp, int* begin, int* end) {
  const int per = chunks / kReduceWarps;
  const int rem = chunks % kReduceWarps;
  *begin = warp * per + min(warp, rem);
  *end = *begin + per + (warp < rem ? 1 : 0);
}

// ---------------------------------------------------------------------------------------------
// Host-side sizing.

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline size_t AlignUp(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Bytes a workspace buffer of `bytes` occupies: 256-byte aligned, then a guard (see
// kWorkspaceGuardBytes) before the next buffer.
inline size_t Footprint(size_t bytes) { return AlignUp(bytes) + kWorkspaceGuardBytes; }

// Lanes per head group for HeadSums: the smallest power of two ≥ p, capped at a warp.
inline int HeadGroup(int64_t p) {
  int g = 1;
  while (g < p && g < kWarpSize) g <<= 1;
  return g;
}

// Threads of a column kernel covering D channels V at a time: whole warps, at most kColumnThreads.
inline int ColumnThreads(int64_t D, int V) {
  const int64_t lanes = CeilDiv(D, V);
  return static_cast<int>(std::min<int64_t>(
      kColumnThreads, std::max<int64_t>(kWarpSize, CeilDiv(lanes, kWarpSize) * kWarpSize)));
}

// Channels per thread of the causal and step kernels: the smallest power of two that covers D
// with at most kRowThreads threads.
inline int ChannelsPerThread(int64_t D) {
  int cpt = 1;
  while (cpt < kMaxChannelsPerThread && D > static_cast<int64_t>(cpt) * kRowThreads) cpt <<= 1;
  return cpt;
}

inline int ThreadsFor(int64_t D, int cpt) {
  return static_cast<int>(
      std::max<int64_t>(kWarpSize, CeilDiv(CeilDiv(D, cpt), kWarpSize) * kWarpSize));
}

// Tokens per chunk, from the sequence length alone: a sequence's result (every sum's order) then
// never depends on what it is batched with or on the GPU model, as on the CPU. kMinChunkTokens,
// doubled up to kMaxChunkTokens while a sequence would have more than kTargetChunks chunks (short
// sequences get many small chunks, so even batch 1 fills the GPU).
inline int64_t ChunkTokens(int64_t tokens) {
  int64_t chunk = kMinChunkTokens;
  while (chunk < kMaxChunkTokens && CeilDiv(tokens, chunk) > kTargetChunks) chunk *= 2;
  return std::max<int64_t>(1, std::min(chunk, tokens));
}

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline bool ValidPlan(const Dims& d, const Plan& plan) {
  return UnsupportedReason(d) == nullptr && d.batch >= 1 && d.tokens >= 1 && d.channels >= 1 &&
         plan.chunk_tokens >= 1 && plan.chunks == CeilDiv(d.tokens, plan.chunk_tokens) &&
         plan.chunks <= kMaxGridBlocks / d.batch;
}

TOST_GPU_BACKEND_NAMESPACE_END
}  // namespace tost::kernels::gpu
