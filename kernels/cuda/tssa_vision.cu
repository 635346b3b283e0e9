// Vision TSSA (global statistics over the N tokens): y = −w·Π/(1 + dots), as
//   ChunkSumSq (read w) → Norm → TssaStats (Π, Σ Π·w², Σ Π per chunk) → Gate → TssaApply
// Numerics, chunking and the shared building blocks: tssa_common.cuh.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/tssa_common.cuh"

namespace tost::kernels::gpu {
TOST_GPU_BACKEND_NAMESPACE_BEGIN
namespace {

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

// ---------------------------------------------------------------------------------------------
// Vision TSSA.

// nu[b][c] = max(sqrt(Σ_g part[b][g][c]), 1e-12). grid B·ceil(D/32), dynamic shared memory
// kReduceWarps·32 floats (see WarpChunkRange).
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
// dynamic shared memory 2·kReduceWarps·32 floats (see WarpChunkRange).
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
// Host side.

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

}  // namespace

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

TOST_GPU_BACKEND_NAMESPACE_END
}  // namespace tost::kernels::gpu
