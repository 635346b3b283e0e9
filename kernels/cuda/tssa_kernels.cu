// CUDA kernels of the three TSSA operators (docs/model-semantics.md §1.1, §2.1, §2.2). The ATen
// reference (kernels/reference.cc) is the ground truth; the eps placement follows it exactly:
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
//   vision  : ChunkSumSq → Norm → TssaStats (Π, Σ Π·w², Σ Π per chunk) → Gate → TssaApply
//   causal  : ChunkSumSq → ChunkScan(S1) → CausalStats (local S1 scan, Π, chunk sums)
//             → ChunkScan(S2, S3) → CausalApply (local S2/S3 scan, y)
//   step    : one block per sequence; all heads of the token in one block (softmax couples them).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/device_launch.h"
#include "kernels/cuda/tssa_cuda.h"
#ifndef TOST_CUDA_EMULATION
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace tost::kernels::gpu {
TOST_GPU_BACKEND_NAMESPACE_BEGIN
namespace {

constexpr float kNormEps = 1e-12f;  // reference::kNormEps
constexpr float kCountEps = 1e-8f;  // reference::kCountEps
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpSize = 32;

constexpr int kColumnThreads = 256;  // ChunkSumSq, TssaStats, TssaApply
constexpr int kRowThreads =
    256;  // CausalStats, CausalApply, Step: thread i owns channels i + j·blockDim
constexpr int kMaxChannelsPerThread = 32;
static_assert(kMaxChannelsPerThread * kRowThreads >= kMaxChannels,
              "row kernels must cover kMaxChannels");
constexpr int kReduceWarps = 8;  // ChunkScan, Norm, Gate: warps splitting the chunks
constexpr int kReduceThreads = kReduceWarps * kWarpSize;
constexpr int64_t kMaxChunkTokens = 64;
constexpr int64_t kMinChunkTokens = 8;
constexpr int64_t kTargetChunks = 64;
constexpr int kMaxTileTokens = 16;          // CausalStats: tokens per shared-memory q tile
constexpr size_t kCausalTileFloats = 8192;  // 32 KiB budget for the q tile
constexpr size_t kSmemLimit = kMaxDefaultDynamicSharedBytes;  // no opt-in to more
// TssaStats' row-group partials: at most kColumnThreads·V floats, V ≤ 8 (16-byte vectors of
// 2-byte elements).
constexpr size_t kStatsPartialFloats = kColumnThreads * 8;
// TssaStats' tile: about this many bytes of w a tile (24 KiB: 16 rows at D = 384 in float32, 24 in
// bfloat16 where the shared memory ends), 16 bytes a load; the tile holds them as float32.
constexpr int64_t kStatsTileLoadBytes = 24 * 1024;
// TssaStats' loads are in flight only while a block fills its tile, so an SM needs several blocks:
// 4 (a 64-register cap) with at most 4 elements a thread per row.
[[maybe_unused]] constexpr int kStatsMinBlocks = 4;  // only __launch_bounds__ reads it

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

// in[i]²·scale[i] as float to 16-byte aligned memory (V = 1, or a multiple of 4), at most 16
// bytes per store: the widest a device store is, and the widest the emulator sees as one.
// Computed in the store: values copied unchanged can become a host memcpy, which the emulator does
// not see.
template <typename T, int V>
__device__ __forceinline__ void StoreScaledSquares(float* __restrict__ p, const Pack<T, V>& in,
                                                   const float (&scale)[V]) {
  if constexpr (V == 1) {
    const float x = ToFloat(in.v[0]);
    p[0] = x * x * scale[0];
  } else {
    static_assert(V % 4 == 0, "V floats in 16-byte stores");
#pragma unroll
    for (int i0 = 0; i0 < V; i0 += 4) {
      Pack<float, 4> pk;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float x = ToFloat(in.v[i0 + i]);
        pk.v[i] = x * x * scale[i0 + i];
      }
      *reinterpret_cast<Pack<float, 4>*>(p + i0) = pk;
    }
  }
}

// Row-loop unrolling of the column kernels: enough independent loads in flight without pushing
// the register count past what keeps them spill-free (V elements per load already).
template <int V>
__host__ __device__ constexpr int RowUnroll() {
  return V == 1 ? 4 : (V <= 4 ? 2 : 1);
}

// The column layout of TssaStats for D channels, V per thread, `block` threads: `lanes` threads
// cover a row; the block holds `groups` such row groups (1 when a row needs the whole block).
struct StatsColumns {
  int lanes;
  int groups;
};
__host__ __device__ constexpr StatsColumns StatsColumnLayout(int D, int V, int block) {
  const int lanes = (D + V - 1) / V;
  return {lanes, lanes >= block ? 1 : block / lanes};
}

// TssaStats' dynamic shared memory, offsets in floats: Π of the chunk's rows [chunk][K], the row
// groups' partials [groups][D] (none with one group), then the tile of w² [tile_rows][D], 32-byte
// aligned (float vectors of up to 8).
struct StatsSmem {
  int64_t pi_floats;
  int64_t partial_floats;
  int64_t tile_floats;
  int64_t bytes;
};
__host__ __device__ constexpr StatsSmem StatsSmemLayout(int64_t chunk_tokens, int D, int K,
                                                        StatsColumns cols, int tile_rows) {
  const int64_t partials = chunk_tokens * K;
  const int64_t tile = (partials + (cols.groups > 1 ? int64_t{cols.groups} * D : 0) + 7) / 8 * 8;
  return {0, partials, tile, (tile + int64_t{tile_rows} * D) * static_cast<int64_t>(sizeof(float))};
}

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
[[maybe_unused]] __host__ __device__ constexpr int StepMinBlocks(int cpt) {
  return cpt <= 16 ? 4 : 1;
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
// Vision TSSA.

// nu[b][c] = max(sqrt(Σ_g part[b][g][c]), 1e-12). grid B·ceil(D/32), dynamic shared memory
// kReduceWarps·32 floats (see ChunkScanKernel).
__global__ void __launch_bounds__(kReduceThreads)
    NormKernel(const float* __restrict__ part, float* __restrict__ nu, int chunks, int D) {
  TOST_DYNAMIC_SHARED(float, totals);  // [kReduceWarps][32]
  const int groups = (D + kWarpSize - 1) / kWarpSize;
  const int64_t b = blockIdx.x / groups;
  const int lane = threadIdx.x & (kWarpSize - 1);
  const int warp = threadIdx.x / kWarpSize;
  const int c = static_cast<int>(blockIdx.x % groups) * kWarpSize + lane;
  int g0, g1;
  WarpChunkRange(chunks, warp, &g0, &g1);
  float s = 0.f;
  if (c < D) {
    const float* col = part + b * chunks * D + c;
    for (int g = g0; g < g1; ++g) s += col[static_cast<int64_t>(g) * D];
  }
  totals[warp * kWarpSize + lane] = s;
  __syncthreads();
  if (warp != 0 || c >= D) return;
  float total = 0.f;
  for (int w = 0; w < kReduceWarps; ++w) total += totals[w * kWarpSize + lane];
  nu[b * D + c] = fmaxf(sqrtf(total), kNormEps);
}

// Per chunk: Π for every token (softmax over heads of temp[k]·Σ_c w²/ν²), written to pi[b][t][k],
// and the chunk partials part[b][g][c] = Σ_t Π[t,k(c)]·w², part[b][g][D+k] = Σ_t Π[t,k]
// (layout [B][chunks][D+K]). grid B·chunks, dynamic shared memory StatsSmemLayout(...).bytes.
//
// Both phases need every row of the chunk: the rows phase (one warp per token: head sums and the
// softmax) and the columns phase (threads own channels: Σ_t Π·w²). Read from device memory twice,
// the second read mostly missed L1 (38 % hits on an H100): the kernel moved twice the bytes it
// needed. So the chunk passes through shared memory in tiles of `tile_rows` rows, each read from
// device memory once in vector loads, and kept as q = w²/ν² in float32, what the rows phase sums;
// the columns phase sums Π·q and scales by ν² once at the end.
//
// Columns: D/V threads cover a row (96 of 256 at D = 384 in float32), so the block splits into
// row groups of D/V threads; each thread loads, and later sums, the same V channels of rows
// rg, rg + groups, ... Group j's running sums are carried from tile to tile in its own slot of
// the destination (the group partials, or `part` itself with one group), so every sum keeps the
// chunk's row order whatever the tiling, and the groups' partials are added in group order: a
// fixed order for a given D, V and block size, never one that depends on the batch.
template <typename T, int V>
__global__ void __launch_bounds__(kColumnThreads, kStatsMinBlocks)
    TssaStatsKernel(const T* __restrict__ w, const float* __restrict__ temp,
                    const float* __restrict__ nu, float* __restrict__ pi, float* __restrict__ part,
                    int64_t tokens, int D, int K, int p, int group, int64_t chunk_tokens,
                    int chunks, int tile_rows) {
  static_assert(V <= 4, "kStatsMinBlocks' register cap holds 4 elements a thread per row");
  TOST_DYNAMIC_SHARED(float, smem);
  const int g = static_cast<int>(blockIdx.x % chunks);
  const int b = static_cast<int>(blockIdx.x / chunks);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & (kWarpSize - 1);
  const int warp = tid / kWarpSize;
  const int block = static_cast<int>(blockDim.x);
  const int nwarps = block / kWarpSize;
  const int64_t t0 = g * chunk_tokens;
  const int rows = static_cast<int>(min(tokens, t0 + chunk_tokens) - t0);
  const T* wb = w + (static_cast<int64_t>(b) * tokens + t0) * D;
  const float* nub = nu + static_cast<int64_t>(b) * D;
  float* out = part + (static_cast<int64_t>(b) * chunks + g) * (D + K);

  const StatsColumns cols = StatsColumnLayout(D, V, block);
  const int rg = cols.groups == 1 ? 0 : tid / cols.lanes;
  const int c_first = (cols.groups == 1 ? tid : tid % cols.lanes) * V;
  const int c_stride = cols.groups == 1 ? block * V : D;  // with groups, one pass covers D
  const StatsSmem sm = StatsSmemLayout(chunk_tokens, D, K, cols, tile_rows);
  float* pi_s = smem + sm.pi_floats;           // [rows][K]
  float* partials = smem + sm.partial_floats;  // [groups][D] when groups > 1
  float* q_s = smem + sm.tile_floats;          // [tile_rows][D]: w²/ν² of the tile's rows

  for (int ts = 0; ts < rows; ts += tile_rows) {
    const int n = min(tile_rows, rows - ts);
    // The tile: this thread's channels of rows ts + r, r ≡ rg (mod groups) (chunk row order, as
    // the columns phase sums them), a few vector loads in flight (V > 1 only when D % V == 0 and
    // w is 16-byte aligned: 16 bytes a load in float32, 8 in 2-byte types).
    const int r_first = (rg - ts % cols.groups + cols.groups) % cols.groups;
    if (rg < cols.groups) {
      for (int c = c_first; c < D; c += c_stride) {
        float inv[V];
#pragma unroll
        for (int i = 0; i < V; ++i) inv[i] = 1.f / (nub[c + i] * nub[c + i]);
        // Four units in flight; two for float16, whose conversions cost ptxas an 8-byte spill at
        // four within the 64-register cap (float32 and bfloat16 fit).
        constexpr int kInFlight = std::is_same_v<T, __half> ? 2 : 4;
        for (int r0 = r_first; r0 < n; r0 += cols.groups * kInFlight) {
          Pack<T, V> raw[kInFlight];
#pragma unroll
          for (int j = 0; j < kInFlight; ++j) {
            const int r = r0 + j * cols.groups;
            if (r < n) {
              raw[j] =
                  *reinterpret_cast<const Pack<T, V>*>(wb + static_cast<int64_t>(ts + r) * D + c);
            }
          }
#pragma unroll
          for (int j = 0; j < kInFlight; ++j) {
            const int r = r0 + j * cols.groups;
            if (r < n) StoreScaledSquares<T, V>(q_s + r * D + c, raw[j], inv);
          }
        }
      }
    }
    __syncthreads();

    // Rows: one warp per token.
    for (int r = warp; r < n; r += nwarps) {
      const float* row = q_s + r * D;
      float* prow = pi_s + (ts + r) * K;
      HeadSums<4>(
          K, p, group, 0, 1, [&](int c) { return row[c]; },
          [&](int k, float s) { prow[k] = s * temp[k]; });
      __syncwarp();
      WarpSoftmaxInPlace(prow, K);
      float* pg = pi + (static_cast<int64_t>(b) * tokens + t0 + ts + r) * K;
      for (int k = lane; k < K; k += kWarpSize) pg[k] = prow[k];
    }
    __syncthreads();

    // Columns: this tile's rows of the thread's row group, added to its running sums of Π·q.
    if (rg < cols.groups) {
      for (int c = c_first; c < D; c += c_stride) {
        float* dest = cols.groups == 1 ? out + c : partials + rg * D + c;
        int hk[V];
        float acc[V];
#pragma unroll
        for (int i = 0; i < V; ++i) {
          hk[i] = (c + i) / p;
          acc[i] = ts == 0 ? 0.f : dest[i];
        }
        // The usual case, V channels of one head (p % V == 0): one Π a row, not V.
        const bool one_head = hk[0] == hk[V - 1];
#pragma unroll(RowUnroll <V>())
        for (int r = r_first; r < n; r += cols.groups) {
          float q[V];
          LoadVec<float, V>(q_s + r * D + c, q);
          const float* prow = pi_s + (ts + r) * K;
          if (one_head) {
            const float pk = prow[hk[0]];
#pragma unroll
            for (int i = 0; i < V; ++i) acc[i] += pk * q[i];
          } else {
#pragma unroll
            for (int i = 0; i < V; ++i) acc[i] += prow[hk[i]] * q[i];
          }
        }
#pragma unroll
        for (int i = 0; i < V; ++i) dest[i] = acc[i];
      }
    }
    __syncthreads();  // the next tile overwrites this one
  }
  // Σ Π·w² = ν²·Σ Π·q, each channel's sum scaled by the thread that owns it.
  if (cols.groups > 1) {  // block-uniform
    for (int c = tid; c < D; c += block) {
      float s = 0.f;
      for (int j = 0; j < cols.groups; ++j) s += partials[j * D + c];
      out[c] = s * (nub[c] * nub[c]);
    }
  } else {
    for (int c = c_first; c < D; c += c_stride) {
#pragma unroll
      for (int i = 0; i < V; ++i) out[c + i] *= nub[c + i] * nub[c + i];
    }
  }
  for (int k = tid; k < K; k += block) {
    float s = 0.f;
    for (int r = 0; r < rows; ++r) s += pi_s[r * K + k];
    out[D + k] = s;
  }
}

// denom[b][c] = 1 + Σ_g part[b][g][c] / (Σ_g part[b][g][D+k(c)] + 1e-8). grid B·ceil(D/32),
// dynamic shared memory 2·kReduceWarps·32 floats (see ChunkScanKernel).
__global__ void __launch_bounds__(kReduceThreads)
    GateKernel(const float* __restrict__ part, float* __restrict__ denom, int chunks, int D, int K,
               int p) {
  TOST_DYNAMIC_SHARED(float, totals);  // [2][kReduceWarps][32]: Σ Π·w², Σ Π
  const int groups = (D + kWarpSize - 1) / kWarpSize;
  const int64_t b = blockIdx.x / groups;
  const int lane = threadIdx.x & (kWarpSize - 1);
  const int warp = threadIdx.x / kWarpSize;
  const int c = static_cast<int>(blockIdx.x % groups) * kWarpSize + lane;
  const int width = D + K;
  int g0, g1;
  WarpChunkRange(chunks, warp, &g0, &g1);
  float s2 = 0.f;
  float n = 0.f;
  if (c < D) {
    const float* base = part + b * chunks * width;
    const int hc = D + c / p;
    for (int g = g0; g < g1; ++g) {
      s2 += base[static_cast<int64_t>(g) * width + c];
      n += base[static_cast<int64_t>(g) * width + hc];
    }
  }
  totals[warp * kWarpSize + lane] = s2;
  totals[(kReduceWarps + warp) * kWarpSize + lane] = n;
  __syncthreads();
  if (warp != 0 || c >= D) return;
  float s2_total = 0.f;
  float n_total = 0.f;
  for (int w = 0; w < kReduceWarps; ++w) {
    s2_total += totals[w * kWarpSize + lane];
    n_total += totals[(kReduceWarps + w) * kWarpSize + lane];
  }
  denom[b * D + c] = 1.f + s2_total / (n_total + kCountEps);
}

// y[b,t,c] = (−w·Π[b,t,k(c)]) / denom[b][c]. grid B·chunks (block b·chunks + g).
template <typename T, int V>
__global__ void __launch_bounds__(kColumnThreads)
    TssaApplyKernel(const T* __restrict__ w, const float* __restrict__ pi,
                    const float* __restrict__ denom, T* __restrict__ y, int64_t tokens, int D,
                    int K, int p, int64_t chunk_tokens, int chunks) {
  const int g = static_cast<int>(blockIdx.x % chunks);
  const int b = static_cast<int>(blockIdx.x / chunks);
  const int64_t t0 = g * chunk_tokens;
  const int rows = static_cast<int>(min(tokens, t0 + chunk_tokens) - t0);
  const int64_t row0 = static_cast<int64_t>(b) * tokens + t0;
  const T* wb = w + row0 * D;
  T* yb = y + row0 * D;
  const float* pib = pi + row0 * K;
  const float* denb = denom + static_cast<int64_t>(b) * D;
  for (int c = threadIdx.x * V; c < D; c += blockDim.x * V) {
    // Per element a multiply by 1/denom, not a division, and one Π load a row where the V
    // channels share a head (p % V == 0): at 2-byte elements the division and V loads of Π per
    // row made the kernel issue-bound on an H100 (61 % of DRAM bandwidth, against 80 % in float32).
    int hk[V];
    float inv_den[V];
#pragma unroll
    for (int i = 0; i < V; ++i) {
      hk[i] = (c + i) / p;
      inv_den[i] = 1.f / denb[c + i];
    }
    const bool one_head = hk[0] == hk[V - 1];
#pragma unroll(RowUnroll <V>())
    for (int r = 0; r < rows; ++r) {
      float v[V];
      LoadVec<T, V>(wb + static_cast<int64_t>(r) * D + c, v);
      const float* prow = pib + static_cast<int64_t>(r) * K;
      if (one_head) {
        const float pk = prow[hk[0]];
#pragma unroll
        for (int i = 0; i < V; ++i) v[i] = -v[i] * pk * inv_den[i];
      } else {
#pragma unroll
        for (int i = 0; i < V; ++i) v[i] = -v[i] * prow[hk[i]] * inv_den[i];
      }
      StoreVec<T, V>(yb + static_cast<int64_t>(r) * D + c, v);
    }
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

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

size_t AlignUp(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Bytes a workspace buffer of `bytes` occupies: 256-byte aligned, then a guard (see
// kWorkspaceGuardBytes) before the next buffer.
size_t Footprint(size_t bytes) { return AlignUp(bytes) + kWorkspaceGuardBytes; }

// Lanes per head group for HeadSums: the smallest power of two ≥ p, capped at a warp.
int HeadGroup(int64_t p) {
  int g = 1;
  while (g < p && g < kWarpSize) g <<= 1;
  return g;
}

// Lanes per head for TssaStats' rows phase, where the row is already in shared memory: as few as
// put every head of the row in one pass of the warp (K·group ≤ 32), each lane summing p/group
// channels, rather than one head a pass over HeadGroup(p) lanes (8 passes of 2 loads and 5
// shuffles at K = 8, p = 48, against one pass of 12 loads and 2 shuffles). Never more lanes than
// channels.
int StatsHeadGroup(int64_t p, int64_t K) {
  int g = 1;
  while (2 * g * K <= kWarpSize && g < HeadGroup(p)) g <<= 1;
  return g;
}

// Threads of a column kernel covering D channels V at a time: whole warps, at most kColumnThreads.
int ColumnThreads(int64_t D, int V) {
  const int64_t lanes = CeilDiv(D, V);
  return static_cast<int>(std::min<int64_t>(
      kColumnThreads, std::max<int64_t>(kWarpSize, CeilDiv(lanes, kWarpSize) * kWarpSize)));
}

// Channels per thread of the causal and step kernels: the smallest power of two that covers D
// with at most kRowThreads threads.
int ChannelsPerThread(int64_t D) {
  int cpt = 1;
  while (cpt < kMaxChannelsPerThread && D > static_cast<int64_t>(cpt) * kRowThreads) cpt <<= 1;
  return cpt;
}

int ThreadsFor(int64_t D, int cpt) {
  return static_cast<int>(
      std::max<int64_t>(kWarpSize, CeilDiv(CeilDiv(D, cpt), kWarpSize) * kWarpSize));
}

// Tokens per chunk, from the sequence length alone: a sequence's result (every sum's order) then
// never depends on what it is batched with or on the GPU model, as on the CPU. kMinChunkTokens,
// doubled up to kMaxChunkTokens while a sequence would have more than kTargetChunks chunks (short
// sequences get many small chunks, so even batch 1 fills the GPU).
int64_t ChunkTokens(int64_t tokens) {
  int64_t chunk = kMinChunkTokens;
  while (chunk < kMaxChunkTokens && CeilDiv(tokens, chunk) > kTargetChunks) chunk *= 2;
  return std::max<int64_t>(1, std::min(chunk, tokens));
}

int CausalTile(const Dims& d, int64_t chunk_tokens) {
  const int64_t fit = (static_cast<int64_t>(kCausalTileFloats) - d.heads) / (d.channels + d.heads);
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>({fit, kMaxTileTokens, chunk_tokens})));
}

// Rows of TssaStats' tile: about kStatsTileLoadBytes of w, at least one row (PlanTssa keeps room
// for it), at most the chunk and what the shared memory left beside Π and the partials holds;
// from 8 rows on a multiple of 8, so that the rows phase gives each of the block's 8 warps as many
// rows.
int StatsTileRows(int64_t chunk_tokens, int D, int K, int V, size_t element_bytes) {
  constexpr int64_t kWarps = kColumnThreads / kWarpSize;
  const StatsColumns cols = StatsColumnLayout(D, V, kColumnThreads);
  const int64_t fixed = StatsSmemLayout(chunk_tokens, D, K, cols, 0).bytes;
  const int64_t fit = (static_cast<int64_t>(kSmemLimit) - fixed) / (D * sizeof(float));
  const int64_t want = std::max<int64_t>(1, kStatsTileLoadBytes / (D * element_bytes));
  int64_t rows = std::max<int64_t>(1, std::min({want, fit, chunk_tokens}));
  if (rows >= kWarps) rows -= rows % kWarps;
  return static_cast<int>(rows);
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The token-chunked kernels run one block per (sequence, chunk) on a flat grid.x.
constexpr int64_t kMaxGridBlocks = INT32_MAX;

bool ValidPlan(const Dims& d, const Plan& plan) {
  return UnsupportedReason(d) == nullptr && d.batch >= 1 && d.tokens >= 1 && d.channels >= 1 &&
         plan.chunk_tokens >= 1 && plan.chunks == CeilDiv(d.tokens, plan.chunk_tokens) &&
         plan.chunks <= kMaxGridBlocks / d.batch;
}

// -- vision ---------------------------------------------------------------------------------------

struct TssaWorkspace {
  float* part;  // [B][chunks][D+K] (pass A uses it as [B][chunks][D])
  float* vec;   // [B][D]: ν, then 1 + dots
  float* pi;    // [B][N][K]
};

// Byte offsets and sizes of the workspace buffers; `total` is the workspace size.
struct TssaLayout {
  size_t part = 0, vec = 0, pi = 0, total = 0;
  size_t part_bytes = 0, vec_bytes = 0, pi_bytes = 0;
};

TssaLayout LayoutTssa(const Dims& d, int64_t chunks) {
  TssaLayout l;
  l.part_bytes = sizeof(float) * d.batch * chunks * (d.channels + d.heads);
  l.vec_bytes = sizeof(float) * d.batch * d.channels;
  l.pi_bytes = sizeof(float) * d.batch * d.tokens * d.heads;
  l.vec = l.part + Footprint(l.part_bytes);
  l.pi = l.vec + Footprint(l.vec_bytes);
  l.total = l.pi + Footprint(l.pi_bytes);
  return l;
}

TssaWorkspace CarveTssa(const Dims& d, int64_t chunks, void* base) {
  const TssaLayout l = LayoutTssa(d, chunks);
  return {static_cast<float*>(WorkspaceBuffer(base, l.part, l.part_bytes, "part")),
          static_cast<float*>(WorkspaceBuffer(base, l.vec, l.vec_bytes, "vec")),
          static_cast<float*>(WorkspaceBuffer(base, l.pi, l.pi_bytes, "pi"))};
}

template <typename T, int V>
cudaError_t RunTssa(const Dims& d, const Plan& plan, const T* w, const float* temp, T* y,
                    void* workspace, cudaStream_t stream) {
  const TssaWorkspace ws = CarveTssa(d, plan.chunks, workspace);
  const int D = static_cast<int>(d.channels);
  const int K = static_cast<int>(d.heads);
  const int p = D / K;
  const int chunks = static_cast<int>(plan.chunks);
  const dim3 grid(static_cast<unsigned>(plan.chunks * d.batch));
  const int col_threads = ColumnThreads(D, V);
  const dim3 reduce_grid(static_cast<unsigned>(d.batch * CeilDiv(D, kWarpSize)));
  const dim3 reduce_block(kReduceThreads);

  TOST_RETURN_IF_CUDA_ERROR((Launch<ChunkSumSqKernel<T, V>, kColumnThreads>(
      {grid, dim3(col_threads), 0, stream}, w, ws.part, d.tokens, D, plan.chunk_tokens, chunks)));
  TOST_RETURN_IF_CUDA_ERROR((Launch<NormKernel, kReduceThreads>(
      {reduce_grid, reduce_block, sizeof(float) * kReduceThreads, stream}, ws.part, ws.vec, chunks,
      D)));
  // TssaStats reads 2-byte elements 4 at a time (8-byte loads), not 8: its tile then holds 16 bytes
  // of float32 a thread a row, which shared memory serves without bank conflicts (32 bytes a lane
  // was two-way), and the kernel fits 64 registers (4 blocks an SM, against 3 at 80). Measured on
  // an H100 at 8 × 16384 × 384 in bfloat16: 8 at a time took 175 µs with 62 % of L1 throughput.
  constexpr int SV = V > 4 ? 4 : V;
  const int tile_rows = StatsTileRows(plan.chunk_tokens, D, K, SV, sizeof(T));
  const StatsSmem stats_smem =
      StatsSmemLayout(plan.chunk_tokens, D, K, StatsColumnLayout(D, SV, kColumnThreads), tile_rows);
  TOST_RETURN_IF_CUDA_ERROR((Launch<TssaStatsKernel<T, SV>, kColumnThreads>(
      {grid, dim3(kColumnThreads), static_cast<size_t>(stats_smem.bytes), stream}, w, temp, ws.vec,
      ws.pi, ws.part, d.tokens, D, K, p, StatsHeadGroup(p, K), plan.chunk_tokens, chunks,
      tile_rows)));
  TOST_RETURN_IF_CUDA_ERROR((Launch<GateKernel, kReduceThreads>(
      {reduce_grid, reduce_block, 2 * sizeof(float) * kReduceThreads, stream}, ws.part, ws.vec,
      chunks, D, K, p)));
  return Launch<TssaApplyKernel<T, V>, kColumnThreads>({grid, dim3(col_threads), 0, stream}, w,
                                                       ws.pi, ws.vec, y, d.tokens, D, K, p,
                                                       plan.chunk_tokens, chunks);
}

template <typename T>
cudaError_t LaunchTssaT(const Dims& d, const Plan& plan, const void* w, const float* temp, void* y,
                        void* workspace, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const T* wt = static_cast<const T*>(w);
  T* yt = static_cast<T*>(y);
  if (d.channels % kVec == 0 && Aligned16(wt) && Aligned16(yt)) {
    return RunTssa<T, kVec>(d, plan, wt, temp, yt, workspace, stream);
  }
  return RunTssa<T, 1>(d, plan, wt, temp, yt, workspace, stream);
}

// -- causal ---------------------------------------------------------------------------------------

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

// -- step -----------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Public entry points.

const char* UnsupportedReason(const Dims& d) {
  if (d.batch < 0 || d.tokens < 0 || d.channels < 0) return "negative dimension";
  if (d.heads < 1) return "the number of heads K must be at least 1";
  if (d.channels % d.heads != 0) return "channels D must be divisible by the number of heads K";
  if (d.channels > kMaxChannels) return "the CUDA kernels support at most 8192 channels (D)";
  if (d.heads > kMaxHeads) return "the CUDA kernels support at most 1024 heads (K)";
  if (d.tokens > (int64_t{1} << 40)) return "too many tokens";
  if (d.batch > 0 && CeilDiv(2 * d.channels + d.heads, kWarpSize) > kMaxGridBlocks / d.batch) {
    return "B sequences of this width exceed the 2^31-1 thread blocks of a launch";
  }
  if (d.batch > 0 && d.tokens > 0 &&
      CeilDiv(d.tokens, ChunkTokens(d.tokens)) > kMaxGridBlocks / d.batch) {
    return "B sequences of this length exceed the 2^31-1 thread blocks of a launch";
  }
  return nullptr;
}

Plan PlanTssa(const Dims& d) {
  Plan plan;
  if (d.tokens < 1) return plan;
  int64_t chunk = ChunkTokens(d.tokens);
  // TssaStats' shared memory: Π of the chunk, the row groups' partials (at most
  // kStatsPartialFloats), the tile's alignment (up to 7 floats) and at least one row of w².
  while (chunk > 1 &&
         sizeof(float) * (chunk * d.heads + kStatsPartialFloats + 7 + d.channels) > kSmemLimit) {
    chunk /= 2;
  }
  plan.chunk_tokens = chunk;
  plan.chunks = CeilDiv(d.tokens, chunk);
  plan.workspace_bytes = LayoutTssa(d, plan.chunks).total;
  return plan;
}

Plan PlanTssaCausal(const Dims& d) {
  Plan plan;
  if (d.tokens < 1) return plan;
  plan.chunk_tokens = ChunkTokens(d.tokens);
  plan.chunks = CeilDiv(d.tokens, plan.chunk_tokens);
  plan.workspace_bytes = LayoutCausal(d, plan.chunks).total;
  return plan;
}

cudaError_t LaunchTssa(const Dims& d, const Plan& plan, DType dtype, const void* w,
                       const float* temp, void* y, void* workspace, cudaStream_t stream) {
  if (!ValidPlan(d, plan)) return cudaErrorInvalidValue;
  switch (dtype) {
    case DType::kFloat32:
      return LaunchTssaT<float>(d, plan, w, temp, y, workspace, stream);
    case DType::kFloat16:
      return LaunchTssaT<__half>(d, plan, w, temp, y, workspace, stream);
    case DType::kBFloat16:
      return LaunchTssaT<__nv_bfloat16>(d, plan, w, temp, y, workspace, stream);
  }
  return cudaErrorInvalidValue;
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
