// Kernels of the lean CPU decode step (contract in decode_kernels.h).
//
// Compiled once per instruction set, like row_kernels.cc (which says why this file defines no
// static data and lives in a namespace named after the ISA).
#include "kernels/cpu/decode_kernels.h"

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#ifndef TOST_CPU_ISA
#error \
    "decode_kernels.cc is compiled through kernels/cpu/CMakeLists.txt, which defines TOST_CPU_ISA"
#endif
#define TOST_CPU_CAT_(a, b) a##b
#define TOST_CPU_CAT(a, b) TOST_CPU_CAT_(a, b)
#define TOST_CPU_ISA_NAMESPACE TOST_CPU_CAT(isa_, TOST_CPU_ISA)
#define TOST_CPU_INLINE inline __attribute__((always_inline))

namespace tost::kernels::cpu {
namespace TOST_CPU_ISA_NAMESPACE {
namespace {

using at::vec::Vectorized;
using Vec = Vectorized<float>;

constexpr int64_t kLanes = Vec::size();
// Vectors of a panel's width, and how many of them one pass over the input keeps accumulating: four
// (one AVX-512 panel; half of an AVX2 one, which the registers of AVX2 cannot hold whole).
constexpr int kPanelVecs = static_cast<int>(kPanelWidth / kLanes);
constexpr int kBlockVecs = std::min(kPanelVecs, 4);
// Rows multiplied per pass: each weight vector loaded feeds that many rows' accumulators
// (4 rows x 4 vectors fill half of AVX-512's 32 registers; AVX2 has 16).
constexpr int kRowBlock = kLanes >= 16 ? 4 : 2;
static_assert(kPanelWidth % (kLanes * kBlockVecs) == 0, "a panel is whole column blocks");
// The fewest rows for which int8 and 16-bit weights go through float32 tiles (MatmulTiles) rather
// than the widening product: below, widening the weights for the few rows costs less than a tile's
// stores and reloads. Measured on the bench LM's four layers, one thread, int8, in a run with
// tiles from 2 rows (tssa_bench --sections=decode-products, Sapphire Rapids): the tiles took 0.99x
// the widening product's time at 8 rows and 0.84x at 12 at AVX2, 1.10x at 8 and 0.93x at 12 at
// AVX-512 without VNNI; bf16 and fp16 at AVX2, tiles from 8 rows: 1.01x and 1.06x at 8 rows,
// 0.85x and 0.88x at 12 (docs/perf/2026-11-29-avx2-int8/decode_products_avx2.txt).
constexpr int64_t kTileMinRows = kLanes >= 16 ? 12 : 8;

// How far ahead of the input channel being multiplied the panel is prefetched: about 2 KiB.
template <typename W>
constexpr int64_t kPrefetchInputs = 2048 / (kPanelWidth * static_cast<int64_t>(sizeof(W)));

// kLanes stored weight values, widened to float32.
TOST_CPU_INLINE Vec LoadWeights(const float* p) { return Vec::loadu(p); }
TOST_CPU_INLINE Vec LoadWeights(const c10::BFloat16* p) {
  Vec v;
  at::vec::load_to_float<c10::BFloat16>(p, v);
  return v;
}
TOST_CPU_INLINE Vec LoadWeights(const c10::Half* p) {
  Vec v;
  at::vec::load_to_float<c10::Half>(p, v);
  return v;
}
TOST_CPU_INLINE Vec LoadWeights(const int8_t* p) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(CPU_CAPABILITY_AVX2)
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  float widened[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) widened[j] = static_cast<float>(p[j]);
  return Vec::loadu(widened);
#endif
}

// Rows [0, kRows) of x times one column block (kBlockVecs vectors, from lane `lane0` of the panel)
// of the panel at `panel`, with the epilogue (scale, bias) and the store of channels below `out`.
template <int kRows, typename W>
TOST_CPU_INLINE void BlockProduct(const PackedMatrix& w, const W* panel, int64_t o0, int64_t lane0,
                                  const float* x, int64_t ldx, float* y, int64_t ldy) {
  Vec acc[kRows][kBlockVecs];
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kBlockVecs; ++c) acc[r][c] = Vec(0.f);
  }
  const W* p = panel + lane0;
  for (int64_t i = 0; i < w.in; ++i, p += kPanelWidth) {
    Vec xb[kRows];
    for (int r = 0; r < kRows; ++r) xb[r] = Vec(x[r * ldx + i]);
    for (int c = 0; c < kBlockVecs; ++c) {
      if ((c * kLanes * static_cast<int64_t>(sizeof(W))) % 64 == 0) {  // once per cache line
        __builtin_prefetch(p + kPrefetchInputs<W> * kPanelWidth + c * kLanes);
      }
      const Vec wv = LoadWeights(p + c * kLanes);
      for (int r = 0; r < kRows; ++r) acc[r][c] = at::vec::fmadd(wv, xb[r], acc[r][c]);
    }
  }
  for (int c = 0; c < kBlockVecs; ++c) {
    const int64_t o = o0 + lane0 + c * kLanes;
    const int64_t valid = std::min<int64_t>(kLanes, w.out - o);
    if (valid <= 0) break;
    const Vec scale = w.scale != nullptr ? Vec::loadu(w.scale + o) : Vec(1.f);
    const Vec bias = w.bias != nullptr ? Vec::loadu(w.bias + o) : Vec(0.f);
    for (int r = 0; r < kRows; ++r) {
      Vec v = acc[r][c];
      if (w.scale != nullptr) v = v * scale;
      if (w.bias != nullptr) v = v + bias;
      if (valid == kLanes) {
        v.store(y + r * ldy + o);
      } else {
        v.store(y + r * ldy + o, static_cast<int>(valid));
      }
    }
  }
}

template <typename W>
void MatmulTyped(const PackedMatrix& w, const float* x, int64_t rows, int64_t ldx,
                 int64_t panel_begin, int64_t panel_end, float* y, int64_t ldy) {
  const W* data = static_cast<const W*>(w.data);
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    const W* panel = data + p * w.in * kPanelWidth;
    const int64_t o0 = p * kPanelWidth;
    for (int64_t lane0 = 0; lane0 < kPanelWidth; lane0 += kBlockVecs * kLanes) {
      if (o0 + lane0 >= w.out) break;
      int64_t r = 0;
      for (; r + kRowBlock <= rows; r += kRowBlock) {
        BlockProduct<kRowBlock>(w, panel, o0, lane0, x + r * ldx, ldx, y + r * ldy, ldy);
      }
      switch (rows - r) {
        case 3:
          BlockProduct<3>(w, panel, o0, lane0, x + r * ldx, ldx, y + r * ldy, ldy);
          break;
        case 2:
          BlockProduct<2>(w, panel, o0, lane0, x + r * ldx, ldx, y + r * ldy, ldy);
          break;
        case 1:
          BlockProduct<1>(w, panel, o0, lane0, x + r * ldx, ldx, y + r * ldy, ldy);
          break;
        default:
          break;
      }
    }
  }
}

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
// int8 and 16-bit weights at many rows without the dot-product instructions. The widening product
// converts every vector it loads (int8: sign-extend, convert; bf16: zero-extend, shift; fp16:
// vcvtph2ps) for only kRowBlock rows'
// FMAs, so at many rows the conversions cost as much as the products. Here a tile of a panel
// (kTileInputs input channels × the panel's 64 channels) is widened once into float32 on the
// stack, and every row of the call (up to kTileRowGroup at a time) multiplies it from L1 cache at
// the rate of float32 weights: kTileRows rows × kTileVecs vectors of accumulators, each weight
// vector loaded feeding kTileRows FMAs. The partial sums wait in float32 between tiles, which
// stores and reloads them exactly, and each output lane takes the same FMAs in the same order as
// the widening product's (from zero, input by input, then ·scale, then + bias): the results are
// bit for bit the widening product's, so the path can follow the row count without breaking
// batch invariance.
constexpr int kTileVecs = 2;
constexpr int64_t kTileWidth = kTileVecs * kLanes;
// 6 × 2 accumulators + 2 weight vectors + a broadcast fill 15 of AVX2's 16 registers.
constexpr int kTileRows = kLanes >= 16 ? 8 : 6;
constexpr int64_t kTileInputs = 128;   // a tile: 128 × 64 float32 = 32 KiB
constexpr int64_t kTileRowGroup = 64;  // partial sums: 64 rows × 64 float32 = 16 KiB
static_assert(kPanelWidth % kTileWidth == 0, "a panel is whole tile columns");

// Rows [0, kRows) of x (from input i0) times tile columns [lane0, lane0 + kTileWidth) of `tile`
// (`inputs` input channels, kPanelWidth apart), added to `partial` (rows kPanelWidth apart) or,
// for the first tile, stored there.
template <int kRows>
TOST_CPU_INLINE void TileProduct(const float* tile, int64_t inputs, int64_t lane0, const float* x,
                                 int64_t ldx, bool first, float* partial) {
  Vec acc[kRows][kTileVecs];
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kTileVecs; ++c) {
      acc[r][c] = first ? Vec(0.f) : Vec::loadu(partial + r * kPanelWidth + lane0 + c * kLanes);
    }
  }
  const float* t = tile + lane0;
  for (int64_t i = 0; i < inputs; ++i, t += kPanelWidth) {
    Vec wv[kTileVecs];
    for (int c = 0; c < kTileVecs; ++c) wv[c] = Vec::loadu(t + c * kLanes);
    for (int r = 0; r < kRows; ++r) {
      const Vec xb(x[r * ldx + i]);
      for (int c = 0; c < kTileVecs; ++c) acc[r][c] = at::vec::fmadd(wv[c], xb, acc[r][c]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kTileVecs; ++c) {
      acc[r][c].store(partial + r * kPanelWidth + lane0 + c * kLanes);
    }
  }
}

template <int kRows>
void TileRows(const float* tile, int64_t inputs, const float* x, int64_t ldx, bool first,
              float* partial) {
  for (int64_t lane0 = 0; lane0 < kPanelWidth; lane0 += kTileWidth) {
    TileProduct<kRows>(tile, inputs, lane0, x, ldx, first, partial);
  }
}

template <typename W>
void MatmulTiles(const PackedMatrix& w, const float* x, int64_t rows, int64_t ldx,
                 int64_t panel_begin, int64_t panel_end, float* y, int64_t ldy) {
  alignas(64) float tile[kTileInputs * kPanelWidth];
  alignas(64) float partial[kTileRowGroup * kPanelWidth];
  const auto* data = static_cast<const W*>(w.data);
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    const W* panel = data + p * w.in * kPanelWidth;
    const int64_t o0 = p * kPanelWidth;
    for (int64_t r0 = 0; r0 < rows; r0 += kTileRowGroup) {
      const int64_t group_rows = std::min(kTileRowGroup, rows - r0);
      const float* xg = x + r0 * ldx;
      for (int64_t i0 = 0; i0 < w.in; i0 += kTileInputs) {
        const int64_t inputs = std::min(kTileInputs, w.in - i0);
        const W* src = panel + i0 * kPanelWidth;
        for (int64_t j = 0; j < inputs * kPanelWidth; j += kLanes) {
          LoadWeights(src + j).store(tile + j);
        }
        const bool first = i0 == 0;
        int64_t r = 0;
        for (; r + kTileRows <= group_rows; r += kTileRows) {
          TileRows<kTileRows>(tile, inputs, xg + r * ldx + i0, ldx, first,
                              partial + r * kPanelWidth);
        }
        const float* xr = xg + r * ldx + i0;
        float* pr = partial + r * kPanelWidth;
        switch (group_rows - r) {
#define TOST_CPU_TILE_REST(n)                      \
  case n:                                          \
    TileRows<n>(tile, inputs, xr, ldx, first, pr); \
    break;
          TOST_CPU_TILE_REST(7)
          TOST_CPU_TILE_REST(6)
          TOST_CPU_TILE_REST(5)
          TOST_CPU_TILE_REST(4)
          TOST_CPU_TILE_REST(3)
          TOST_CPU_TILE_REST(2)
          TOST_CPU_TILE_REST(1)
#undef TOST_CPU_TILE_REST
          default:
            break;
        }
      }
      // The widening product's epilogue: ·scale, then + bias, channels below `out` stored.
      for (int64_t lane = 0; lane < kPanelWidth; lane += kLanes) {
        const int64_t o = o0 + lane;
        const int64_t valid = std::min<int64_t>(kLanes, w.out - o);
        if (valid <= 0) break;
        const Vec scale = w.scale != nullptr ? Vec::loadu(w.scale + o) : Vec(1.f);
        const Vec bias = w.bias != nullptr ? Vec::loadu(w.bias + o) : Vec(0.f);
        for (int64_t rr = 0; rr < group_rows; ++rr) {
          Vec v = Vec::loadu(partial + rr * kPanelWidth + lane);
          if (w.scale != nullptr) v = v * scale;
          if (w.bias != nullptr) v = v + bias;
          float* dst = y + (r0 + rr) * ldy + o;
          if (valid == kLanes) {
            v.store(dst);
          } else {
            v.store(dst, static_cast<int>(valid));
          }
        }
      }
    }
  }
}
#endif  // AVX2 or AVX512

// The widening product in every precision (the previous int8 path at every row count).
void MatmulWidening(const PackedMatrix& w, const float* x, int64_t rows, int64_t ldx,
                    const void* /*prepared*/, int64_t panel_begin, int64_t panel_end, float* y,
                    int64_t ldy) {
  switch (w.type) {
    case PackedType::kFloat32:
      return MatmulTyped<float>(w, x, rows, ldx, panel_begin, panel_end, y, ldy);
    case PackedType::kBFloat16:
      return MatmulTyped<c10::BFloat16>(w, x, rows, ldx, panel_begin, panel_end, y, ldy);
    case PackedType::kFloat16:
      return MatmulTyped<c10::Half>(w, x, rows, ldx, panel_begin, panel_end, y, ldy);
    case PackedType::kInt8:
      return MatmulTyped<int8_t>(w, x, rows, ldx, panel_begin, panel_end, y, ldy);
  }
}

// The widening product, with int8 and 16-bit weights through tiles of float32 from kTileMinRows
// rows.
void Matmul(const PackedMatrix& w, const float* x, int64_t rows, int64_t ldx, const void* prepared,
            int64_t panel_begin, int64_t panel_end, float* y, int64_t ldy) {
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
  if (rows >= kTileMinRows) {
    switch (w.type) {
      case PackedType::kInt8:
        return MatmulTiles<int8_t>(w, x, rows, ldx, panel_begin, panel_end, y, ldy);
      case PackedType::kBFloat16:
        return MatmulTiles<c10::BFloat16>(w, x, rows, ldx, panel_begin, panel_end, y, ldy);
      case PackedType::kFloat16:
        return MatmulTiles<c10::Half>(w, x, rows, ldx, panel_begin, panel_end, y, ldy);
      case PackedType::kFloat32:
        break;
    }
  }
#endif
  MatmulWidening(w, x, rows, ldx, prepared, panel_begin, panel_end, y, ldy);
}

#if defined(CPU_CAPABILITY_AVX512)
// The dot-product variant: bfloat16 weights in pairs through vdpbf16ps, int8 weights in quads
// through vpdpbusd (AVX-512 BF16 and VNNI, which the AVX-512 flags of this object do not imply,
// so these functions carry their own target and run only where isa.cc found both). A 64-byte
// vector of weights holds 16 output channels × one group, so one instruction does 32 (pairs) or 64
// (quads) multiply-adds where the widening product does 16: the many-row steps that are bound by
// arithmetic get two or four times the rate, and the one-row steps bound by memory lose nothing.
#define TOST_CPU_DOT __attribute__((target("avx512bf16,avx512vnni")))

constexpr int64_t kGroupBytes = 256;  // one group of a panel: 64 channels × 4 bytes
constexpr int64_t kDotPrefetchGroups = 2048 / kGroupBytes;
// Rows per pass: 4 rows × 4 vectors of accumulators (6 rows, which would still fit AVX-512's 32
// registers with the weights and broadcasts, measured 1.5 times slower at 64 rows: GCC spills).
constexpr int kDotRows = 4;

// The mask of the first n of 16 lanes (n clamped to 0..16).
TOST_CPU_INLINE __mmask16 FirstLanes(int64_t n) {
  return n >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << std::max<int64_t>(0, n)) - 1);
}

// Where the prepared rows' scales follow their words.
template <typename Word>
TOST_CPU_INLINE auto* RowScales(const PackedMatrix& w, Word* words, int64_t rows) {
  using Scale = std::conditional_t<std::is_const_v<Word>, const float, float>;
  return reinterpret_cast<Scale*>(words + rows * w.groups());
}

// Rows of x rounded to bfloat16 (to nearest even), two input channels per 32-bit word, `groups`
// words per row, the padding channel zero.
TOST_CPU_DOT void RowsToPairs(const float* x, int64_t rows, int64_t ldx, int64_t in, int64_t groups,
                              uint32_t* words) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    auto* out = reinterpret_cast<uint16_t*>(words + r * groups);
    for (int64_t i = 0; i < groups * 2; i += 16) {
      const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(FirstLanes(in - i), xr + i));
      _mm256_mask_storeu_epi16(out + i, FirstLanes(groups * 2 - i), (__m256i)v);
    }
  }
}

// Rows of x quantised to unsigned 8 bits, four input channels per word: q = round(x·127/absmax)
// + 128 (zero point 128, so q·w sums differ from (q − 128)·w sums by the matrix's
// zero_point_sums), the row's scale absmax/127 in `row_scale` (0 for an all-zero row).
TOST_CPU_DOT void RowsToQuads(const float* x, int64_t rows, int64_t ldx, int64_t in, int64_t groups,
                              uint32_t* words, float* row_scale) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    __m512 amax = _mm512_setzero_ps();
    for (int64_t i = 0; i < in; i += 16) {
      amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_maskz_loadu_ps(FirstLanes(in - i), xr + i)));
    }
    const float absmax = _mm512_reduce_max_ps(amax);
    row_scale[r] = absmax / 127.f;
    const __m512 inv = _mm512_set1_ps(absmax > 0.f ? 127.f / absmax : 0.f);
    const __m512i zero_point = _mm512_set1_epi32(128), lo = _mm512_setzero_si512(),
                  hi = _mm512_set1_epi32(255);
    auto* out = reinterpret_cast<uint8_t*>(words + r * groups);
    for (int64_t i = 0; i < groups * 4; i += 16) {
      // _mm512_cvtps_epi32 rounds to nearest even (the default MXCSR mode).
      __m512i q = _mm512_add_epi32(
          _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(FirstLanes(in - i), xr + i), inv)),
          zero_point);
      q = _mm512_min_epi32(_mm512_max_epi32(q, lo), hi);
      _mm_mask_storeu_epi8(out + i, FirstLanes(groups * 4 - i), _mm512_cvtepi32_epi8(q));
    }
  }
}

// Rows [0, kRows) of the converted x (`groups` words each) times one panel's groups.
template <int kRows, bool kQuads>
TOST_CPU_DOT TOST_CPU_INLINE void DotPanel(const PackedMatrix& w, const uint8_t* panel, int64_t o0,
                                           const uint32_t* words, int64_t groups,
                                           const float* row_scale, float* y, int64_t ldy) {
  __m512i acc[kRows][4];
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_si512();
  }
  const uint8_t* p = panel;
  for (int64_t g = 0; g < groups; ++g, p += kGroupBytes) {
    __m512i xb[kRows];
    for (int r = 0; r < kRows; ++r) {
      xb[r] = _mm512_set1_epi32(static_cast<int>(words[r * groups + g]));
    }
    for (int c = 0; c < 4; ++c) {
      __builtin_prefetch(p + kDotPrefetchGroups * kGroupBytes + c * 64);
      const __m512i wv = _mm512_loadu_si512(p + c * 64);
      for (int r = 0; r < kRows; ++r) {
        if constexpr (kQuads) {
          acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], xb[r], wv);
        } else {
          acc[r][c] = _mm512_castps_si512(
              _mm512_dpbf16_ps(_mm512_castsi512_ps(acc[r][c]), (__m512bh)wv, (__m512bh)xb[r]));
        }
      }
    }
  }
  for (int c = 0; c < 4; ++c) {
    const int64_t o = o0 + c * 16;
    if (o >= w.out) break;
    const __mmask16 store = FirstLanes(w.out - o);
    for (int r = 0; r < kRows; ++r) {
      __m512 v;
      if constexpr (kQuads) {
        const __m512i exact =
            _mm512_sub_epi32(acc[r][c], _mm512_loadu_si512(w.zero_point_sums + o));
        v = _mm512_mul_ps(_mm512_cvtepi32_ps(exact), _mm512_mul_ps(_mm512_loadu_ps(w.scale + o),
                                                                   _mm512_set1_ps(row_scale[r])));
      } else {
        v = _mm512_castsi512_ps(acc[r][c]);
      }
      if (w.bias != nullptr) v = _mm512_add_ps(v, _mm512_loadu_ps(w.bias + o));
      _mm512_mask_storeu_ps(y + r * ldy + o, store, v);
    }
  }
}

template <bool kQuads>
TOST_CPU_DOT void DotPanels(const PackedMatrix& w, const uint32_t* words, const float* row_scale,
                            int64_t rows, int64_t panel_begin, int64_t panel_end, float* y,
                            int64_t ldy) {
  const int64_t groups = w.groups();
  const auto* data = static_cast<const uint8_t*>(w.data);
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    const uint8_t* panel = data + p * groups * kGroupBytes;
    const int64_t o0 = p * kPanelWidth;
    int64_t r = 0;
    for (; r + kDotRows <= rows; r += kDotRows) {
      DotPanel<kDotRows, kQuads>(w, panel, o0, words + r * groups, groups, row_scale + r,
                                 y + r * ldy, ldy);
    }
    switch (rows - r) {
#define TOST_CPU_DOT_REST(n)                                                                  \
  case n:                                                                                     \
    DotPanel<n, kQuads>(w, panel, o0, words + r * groups, groups, row_scale + r, y + r * ldy, \
                        ldy);                                                                 \
    break;
      TOST_CPU_DOT_REST(3)
      TOST_CPU_DOT_REST(2)
      TOST_CPU_DOT_REST(1)
#undef TOST_CPU_DOT_REST
      default:
        break;
    }
  }
}

TOST_CPU_DOT void PrepareDot(const PackedMatrix& w, const float* x, int64_t rows, int64_t ldx,
                             void* prepared) {
  if (w.group == 1) return;
  auto* words = static_cast<uint32_t*>(prepared);
  if (w.group == 4) {
    RowsToQuads(x, rows, ldx, w.in, w.groups(), words, RowScales(w, words, rows));
  } else {
    RowsToPairs(x, rows, ldx, w.in, w.groups(), words);
  }
}

TOST_CPU_DOT void MatmulDot(const PackedMatrix& w, const float* x, int64_t rows, int64_t ldx,
                            const void* prepared, int64_t panel_begin, int64_t panel_end, float* y,
                            int64_t ldy) {
  if (w.group == 1) return Matmul(w, x, rows, ldx, prepared, panel_begin, panel_end, y, ldy);
  const auto* words = static_cast<const uint32_t*>(prepared);
  const float* row_scale = RowScales(w, words, rows);
  if (w.group == 4) {
    DotPanels<true>(w, words, row_scale, rows, panel_begin, panel_end, y, ldy);
  } else {
    DotPanels<false>(w, words, row_scale, rows, panel_begin, panel_end, y, ldy);
  }
}
#endif  // CPU_CAPABILITY_AVX512

// Σ x over n values: lane-wise vector sums, then the lanes and the tail in order.
float Sum(const float* x, int64_t n) {
  Vec acc(0.f);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) acc = acc + Vec::loadu(x + i);
  float lanes[kLanes];
  acc.store(lanes);
  float total = 0.f;
  for (int64_t j = 0; j < kLanes; ++j) total += lanes[j];
  for (; i < n; ++i) total += x[i];
  return total;
}

// Σ (x − mean)², the same way.
float SumSquares(const float* x, int64_t n, float mean) {
  Vec acc(0.f);
  const Vec m(mean);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const Vec d = Vec::loadu(x + i) - m;
    acc = at::vec::fmadd(d, d, acc);
  }
  float lanes[kLanes];
  acc.store(lanes);
  float total = 0.f;
  for (int64_t j = 0; j < kLanes; ++j) total += lanes[j];
  for (; i < n; ++i) total += (x[i] - mean) * (x[i] - mean);
  return total;
}

void LayerNorm(const float* x, int64_t n, const float* weight, const float* bias, float eps,
               float* y) {
  const float mean = Sum(x, n) / static_cast<float>(n);
  const float rstd = 1.f / std::sqrt(SumSquares(x, n, mean) / static_cast<float>(n) + eps);
  const Vec m(mean), s(rstd);
  for (int64_t i = 0; i < n; i += kLanes) {
    const int count = static_cast<int>(std::min<int64_t>(kLanes, n - i));
    const bool whole = count == kLanes;
    const Vec xv = whole ? Vec::loadu(x + i) : Vec::loadu(x + i, count);
    const Vec wv = whole ? Vec::loadu(weight + i) : Vec::loadu(weight + i, count);
    Vec v = (xv - m) * s * wv;
    if (bias != nullptr) v = v + (whole ? Vec::loadu(bias + i) : Vec::loadu(bias + i, count));
    if (whole) {
      v.store(y + i);
    } else {
      v.store(y + i, count);
    }
  }
}

void Gelu(float* x, int64_t n) {
  const Vec half(0.5f), one(1.f), inv_sqrt2(static_cast<float>(M_SQRT1_2));
  for (int64_t i = 0; i < n; i += kLanes) {
    const int count = static_cast<int>(std::min<int64_t>(kLanes, n - i));
    const Vec v = count == kLanes ? Vec::loadu(x + i) : Vec::loadu(x + i, count);
    const Vec g = v * half * (one + (v * inv_sqrt2).erf());
    if (count == kLanes) {
      g.store(x + i);
    } else {
      g.store(x + i, count);
    }
  }
}

void AddScaled(float* x, const float* gamma, const float* y, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    at::vec::fmadd(Vec::loadu(gamma + i), Vec::loadu(y + i), Vec::loadu(x + i)).store(x + i);
  }
  for (; i < n; ++i) x[i] = std::fma(gamma[i], y[i], x[i]);
}

void PrepareNothing(const PackedMatrix& /*w*/, const float* /*x*/, int64_t /*rows*/,
                    int64_t /*ldx*/, void* /*prepared*/) {}

constexpr DecodeKernels kTable{{1, 1, 1, 1}, &PrepareNothing, &Matmul,
                               &LayerNorm,   &Gelu,           &AddScaled};
constexpr DecodeKernels kWideningTable{{1, 1, 1, 1}, &PrepareNothing, &MatmulWidening,
                                       &LayerNorm,   &Gelu,           &AddScaled};
#if defined(CPU_CAPABILITY_AVX512)
// Indexed by PackedType: float32, bfloat16 (pairs), float16, int8 (quads).
constexpr DecodeKernels kDotTable{{1, 2, 1, 4}, &PrepareDot, &MatmulDot,
                                  &LayerNorm,   &Gelu,       &AddScaled};
#endif

}  // namespace
}  // namespace TOST_CPU_ISA_NAMESPACE

const DecodeKernels& TOST_CPU_CAT(DecodeKernels, TOST_CPU_ISA)() {
  return TOST_CPU_ISA_NAMESPACE::kTable;
}

const DecodeKernels& TOST_CPU_CAT(TOST_CPU_CAT(DecodeKernels, TOST_CPU_ISA), Widening)() {
  return TOST_CPU_ISA_NAMESPACE::kWideningTable;
}

#if defined(CPU_CAPABILITY_AVX512)
const DecodeKernels& DecodeKernelsAvx512Dot() { return TOST_CPU_ISA_NAMESPACE::kDotTable; }
#endif

}  // namespace tost::kernels::cpu
