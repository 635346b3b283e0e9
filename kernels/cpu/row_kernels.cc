// Row-range kernels of the fused CPU TSSA operators (contract in row_kernels.h).
//
// Compiled once per instruction set: CMake defines TOST_CPU_ISA (Default, Avx2, Avx512) together
// with at::vec's CPU_CAPABILITY macros and the matching -m flags, so Vectorized<float> is 8 lanes
// of plain C++ (Default), an __m256 (Avx2) or an __m512 (Avx512). Everything here lives in a
// namespace named after the ISA, so the three objects never share a symbol; see Note [Do not
// compile initializers with AVX] in ATen/cpu/vec/vec_base.h for why this file defines no static
// data.
#include "kernels/cpu/row_kernels.h"

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/reference.h"

#ifndef TOST_CPU_ISA
#error "row_kernels.cc is compiled through kernels/cpu/CMakeLists.txt, which defines TOST_CPU_ISA"
#endif
#define TOST_CPU_CAT_(a, b) a##b
#define TOST_CPU_CAT(a, b) TOST_CPU_CAT_(a, b)
// One token, so that formatters and readers see an ordinary namespace name.
#define TOST_CPU_ISA_NAMESPACE TOST_CPU_CAT(isa_, TOST_CPU_ISA)

namespace tost::kernels::cpu {
namespace TOST_CPU_ISA_NAMESPACE {
namespace {

using at::vec::Vectorized;

// The helpers below sit in the innermost loops; GCC at -O2 keeps some of them out of line (and
// the head vectors of HeadSums in memory) unless told otherwise.
#define TOST_CPU_INLINE inline __attribute__((always_inline))

// The reference's constants (F.normalize eps, group-size eps), in the accumulation type as the
// reference's tensor-scalar ops round them.
template <typename Acc>
constexpr Acc kNormEps = static_cast<Acc>(reference::kNormEps);
template <typename Acc>
constexpr Acc kCountEps = static_cast<Acc>(reference::kCountEps);

// Loads V elements of T as one Vectorized<Acc> and stores one back, with partial (tail) variants.
template <typename T>
struct Io {
  using Vec = Vectorized<T>;
  TOST_CPU_INLINE static Vec Load(const T* p) { return Vec::loadu(p); }
  static Vec Load(const T* p, int64_t n) { return Vec::loadu(p, n); }
  TOST_CPU_INLINE static void Store(T* p, const Vec& v) { v.store(p); }
  static void Store(T* p, const Vec& v, int64_t n) { v.store(p, n); }
};

template <typename T>
struct ReducedIo {
  using Vec = Vectorized<float>;
  TOST_CPU_INLINE static Vec Load(const T* p) {
    Vec v;
    at::vec::load_to_float<T>(p, v);
    return v;
  }
  static Vec Load(const T* p, int64_t n) {
    T buf[Vec::size()] = {};
    std::copy_n(p, n, buf);
    return Load(buf);
  }
  TOST_CPU_INLINE static void Store(T* p, const Vec& v) {
    at::vec::convert_from_float<T>(v, v).store(p, Vec::size());
  }
  static void Store(T* p, const Vec& v, int64_t n) {
    at::vec::convert_from_float<T>(v, v).store(p, n);
  }
};
template <>
struct Io<c10::BFloat16> : ReducedIo<c10::BFloat16> {};
template <>
struct Io<c10::Half> : ReducedIo<c10::Half> {};

template <typename Acc>
TOST_CPU_INLINE Acc ReduceAdd(const Vectorized<Acc>& v) {
  return at::vec::vec_reduce_all<Acc>([](Vectorized<Acc>& a, Vectorized<Acc>& b) { return a + b; },
                                      v);
}

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
// The lane sums of eight 8-lane vectors, as one vector: the classic hadd tree (9 shuffle/add
// steps for eight sums instead of eight separate reductions).
TOST_CPU_INLINE __m256 LaneSums8(const __m256 (&u)[8]) {
  const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(u[0], u[1]), _mm256_hadd_ps(u[2], u[3]));
  const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(u[4], u[5]), _mm256_hadd_ps(u[6], u[7]));
  // s0123 = [Σlo u0..u3 | Σhi u0..u3] (128-bit halves), likewise s4567.
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20),
                       _mm256_permute2f128_ps(s0123, s4567, 0x31));
}
#endif

// Rows per block: a block is read from memory once for the logits and again, from L1, for the
// statistics that need Π (16 rows of D = 384 floats are 24 KB); its softmax runs over rows.
constexpr int64_t kBlockRows = kPiBlockRows;
static_assert(kBlockRows % Vectorized<float>::size() == 0 &&
                  kBlockRows % Vectorized<double>::size() == 0,
              "a block of rows must fill whole vectors");
// out[j] = Σ lanes of h[j], j < 8.
template <typename Acc>
TOST_CPU_INLINE void LaneSums(const Vectorized<Acc> (&h)[8], Acc* out) {
  if constexpr (std::is_same_v<Acc, float>) {
#if defined(CPU_CAPABILITY_AVX512)
    __m256 u[8];
    for (int j = 0; j < 8; ++j) {
      const __m512 v = h[j];
      // extractf32x8 for both halves: GCC 12's _mm512_castps512_ps256 trips -Wuninitialized.
      u[j] = _mm256_add_ps(_mm512_extractf32x8_ps(v, 0), _mm512_extractf32x8_ps(v, 1));
    }
    _mm256_storeu_ps(out, LaneSums8(u));
    return;
#elif defined(CPU_CAPABILITY_AVX2)
    __m256 u[8];
    for (int j = 0; j < 8; ++j) u[j] = h[j];
    _mm256_storeu_ps(out, LaneSums8(u));
    return;
#endif
  }
  for (int j = 0; j < 8; ++j) out[j] = ReduceAdd(h[j]);
}

// For every head k of one row: dst[k * kBlockRows] = Σ lanes of head_vector(k) (the row's column
// of a head-major block), eight heads per reduction.
template <typename Acc, typename HeadVector>
TOST_CPU_INLINE void HeadSums(int64_t heads, HeadVector&& head_vector, Acc* dst) {
  Acc out[8];
  int64_t k0 = 0;
  for (; k0 + 8 <= heads; k0 += 8) {
    // Spelled out so that the eight vectors stay in registers.
    const Vectorized<Acc> h[8] = {head_vector(k0),     head_vector(k0 + 1), head_vector(k0 + 2),
                                  head_vector(k0 + 3), head_vector(k0 + 4), head_vector(k0 + 5),
                                  head_vector(k0 + 6), head_vector(k0 + 7)};
    LaneSums(h, out);
    for (int64_t j = 0; j < 8; ++j) dst[(k0 + j) * kBlockRows] = out[j];
  }
  if (k0 < heads) {
    Vectorized<Acc> h[8];
    for (int64_t j = 0; j < 8; ++j)
      h[j] = k0 + j < heads ? head_vector(k0 + j) : Vectorized<Acc>(Acc(0));
    LaneSums(h, out);
    for (int64_t j = 0; k0 + j < heads; ++j) dst[(k0 + j) * kBlockRows] = out[j];
  }
}

// Rows accumulated per load/store of the sum-of-squares accumulators.
constexpr int64_t kSumRows = 4;

// Π of row r, head k, in the blocked layout of row_kernels.h.
template <typename Acc>
TOST_CPU_INLINE Acc PiAt(const Acc* pi, int64_t heads, int64_t r, int64_t k) {
  return pi[(r / kBlockRows) * heads * kBlockRows + k * kBlockRows + r % kBlockRows];
}

// Softmax over the heads of one block of logits [K][kBlockRows] in place, vectorised over rows:
// max-subtracted, exponentials, then scaled by 1/Σ (as ATen's softmax does). Lanes of rows past
// the end of the data hold zeros and are never read back.
template <typename Acc>
void SoftmaxBlock(Acc* x, int64_t heads) {
  using Vec = Vectorized<Acc>;
  constexpr int64_t V = Vec::size();
  for (int64_t r = 0; r < kBlockRows; r += V) {
    Vec m = Vec::loadu(x + r);
    for (int64_t k = 1; k < heads; ++k) m = at::vec::maximum(m, Vec::loadu(x + k * kBlockRows + r));
    Vec sum(Acc(0));
    for (int64_t k = 0; k < heads; ++k) {
      const Vec e = (Vec::loadu(x + k * kBlockRows + r) - m).exp();
      e.store(x + k * kBlockRows + r);
      sum = sum + e;
    }
    const Vec inv = Vec(Acc(1)) / sum;
    for (int64_t k = 0; k < heads; ++k)
      (Vec::loadu(x + k * kBlockRows + r) * inv).store(x + k * kBlockRows + r);
  }
}

// Rows ahead of the current one that the streaming passes prefetch: the hardware prefetchers stop
// at every 4 KiB page (under 3 rows of D = 384 floats), which leaves a single core far below the
// memory bandwidth on long streams.
constexpr int64_t kPrefetchRows = 16;

// Prefetches row `r` of `w` (if it exists) into all cache levels, one hint per 64-byte line.
template <typename T>
TOST_CPU_INLINE void PrefetchRow(const RowsView<T>& w, int64_t r, int64_t channels) {
  if (r >= w.rows) return;
  const char* p = reinterpret_cast<const char*>(w.data + r * w.row_stride);
  const int64_t bytes = channels * static_cast<int64_t>(sizeof(T));
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, 3);
}

template <typename T>
void SumSquares(const RowsView<T>& w, int64_t channels, AccType<T>* acc) {
  using Acc = AccType<T>;
  using Vec = Vectorized<Acc>;
  constexpr int64_t V = Vec::size();
  for (int64_t r0 = 0; r0 < w.rows; r0 += kSumRows) {
    const int64_t nr = std::min(kSumRows, w.rows - r0);
    const T* base = w.data + r0 * w.row_stride;
    for (int64_t r = 0; r < nr; ++r) PrefetchRow(w, r0 + r + kPrefetchRows, channels);
    int64_t c = 0;
    for (; c + V <= channels; c += V) {
      Vec a = Vec::loadu(acc + c);
      for (int64_t r = 0; r < nr; ++r) {
        const Vec x = Io<T>::Load(base + r * w.row_stride + c);
        a = at::vec::fmadd(x, x, a);
      }
      a.store(acc + c);
    }
    if (c < channels) {
      const int64_t n = channels - c;
      Vec a = Vec::loadu(acc + c, n);
      for (int64_t r = 0; r < nr; ++r) {
        const Vec x = Io<T>::Load(base + r * w.row_stride + c, n);
        a = at::vec::fmadd(x, x, a);
      }
      a.store(acc + c, n);
    }
  }
}

// acc[c] += Σ_r Π[r,k]·w[r,c]² over the rows of one block, for the p channels of head k starting
// at `off`; pi_k = Π of head k of the block (kBlockRows consecutive values).
template <typename T>
void AccumulateWeightedSquares(const T* base, int64_t row_stride, int64_t rows,
                               const AccType<T>* pi_k, int64_t off, int64_t head_dim,
                               AccType<T>* acc) {
  using Acc = AccType<T>;
  using Vec = Vectorized<Acc>;
  constexpr int64_t V = Vec::size();
  int64_t c = 0;
  for (; c + V <= head_dim; c += V) {
    // Four independent chains over the rows: one chain would wait on the FMA latency per row.
    Vec a0(Acc(0)), a1(Acc(0)), a2(Acc(0)), a3(Acc(0));
    const T* x_ptr = base + off + c;
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) {
      const Vec x0 = Io<T>::Load(x_ptr + r * row_stride),
                x1 = Io<T>::Load(x_ptr + (r + 1) * row_stride);
      const Vec x2 = Io<T>::Load(x_ptr + (r + 2) * row_stride),
                x3 = Io<T>::Load(x_ptr + (r + 3) * row_stride);
      a0 = at::vec::fmadd(x0 * x0, Vec(pi_k[r]), a0);
      a1 = at::vec::fmadd(x1 * x1, Vec(pi_k[r + 1]), a1);
      a2 = at::vec::fmadd(x2 * x2, Vec(pi_k[r + 2]), a2);
      a3 = at::vec::fmadd(x3 * x3, Vec(pi_k[r + 3]), a3);
    }
    for (; r < rows; ++r) {
      const Vec x = Io<T>::Load(x_ptr + r * row_stride);
      a0 = at::vec::fmadd(x * x, Vec(pi_k[r]), a0);
    }
    (Vec::loadu(acc + off + c) + ((a0 + a1) + (a2 + a3))).store(acc + off + c);
  }
  if (c < head_dim) {
    const int64_t n = head_dim - c;
    Vec a = Vec::loadu(acc + off + c, n);
    for (int64_t r = 0; r < rows; ++r) {
      const Vec x = Io<T>::Load(base + r * row_stride + off + c, n);
      a = at::vec::fmadd(x * x, Vec(pi_k[r]), a);
    }
    a.store(acc + off + c, n);
  }
}

// Σ_{r<rows} x[r] for one head's column of a Π block.
template <typename Acc>
TOST_CPU_INLINE Acc BlockColumnSum(const Acc* x, int64_t rows) {
  using Vec = Vectorized<Acc>;
  constexpr int64_t V = Vec::size();
  if (rows == kBlockRows) {
    Vec sum = Vec::loadu(x);
    for (int64_t r = V; r < kBlockRows; r += V) sum = sum + Vec::loadu(x + r);
    return ReduceAdd(sum);
  }
  Acc total = 0;
  for (int64_t r = 0; r < rows; ++r) total += x[r];
  return total;
}

// kHeadVecs > 0: the head width p is exactly kHeadVecs vectors (fully unrolled head loops);
// 0: any p, with a partial vector at the end of each head.
template <typename T, int kHeadVecs>
void VisionMembershipImpl(const RowsView<T>& w, const HeadShape& s, const AccType<T>* inv_nu2,
                          const AccType<T>* temp, AccType<T>* pi, AccType<T>* s2, AccType<T>* n) {
  using Acc = AccType<T>;
  using Vec = Vectorized<Acc>;
  constexpr int64_t V = Vec::size();
  const int64_t K = s.heads, p = s.head_dim;
  for (int64_t r0 = 0; r0 < w.rows; r0 += kBlockRows) {
    const int64_t nr = std::min(kBlockRows, w.rows - r0);
    const T* base = w.data + r0 * w.row_stride;
    Acc* block_pi = pi + (r0 / kBlockRows) * K * kBlockRows;
    if (nr < kBlockRows) std::fill_n(block_pi, K * kBlockRows, Acc(0));
    // s[k] = Σ_c (w/ν)², as w²·(1/ν²); temp is applied per head below, vectorised over rows.
    for (int64_t r = 0; r < nr; ++r) {
      PrefetchRow(w, r0 + r + kPrefetchRows, s.channels);
      const T* x_row = base + r * w.row_stride;
      HeadSums<Acc>(
          K,
          [&](int64_t k) __attribute__((always_inline)) {
            const int64_t off = k * p;
            Vec sum(Acc(0));
            if constexpr (kHeadVecs > 0) {
              for (int i = 0; i < kHeadVecs; ++i) {
                const Vec x = Io<T>::Load(x_row + off + i * V);
                sum = at::vec::fmadd(x * x, Vec::loadu(inv_nu2 + off + i * V), sum);
              }
            } else {
              int64_t c = 0;
              for (; c + V <= p; c += V) {
                const Vec x = Io<T>::Load(x_row + off + c);
                sum = at::vec::fmadd(x * x, Vec::loadu(inv_nu2 + off + c), sum);
              }
              if (c < p) {
                const Vec x = Io<T>::Load(x_row + off + c, p - c);
                sum = at::vec::fmadd(x * x, Vec::loadu(inv_nu2 + off + c, p - c), sum);
              }
            }
            return sum;
          },
          block_pi + r);
    }
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t r = 0; r < kBlockRows; r += V) {
        (Vec::loadu(block_pi + k * kBlockRows + r) * Vec(temp[k]))
            .store(block_pi + k * kBlockRows + r);
      }
    }
    SoftmaxBlock(block_pi, K);
    for (int64_t k = 0; k < K; ++k) {
      const Acc* pi_k = block_pi + k * kBlockRows;
      AccumulateWeightedSquares(base, w.row_stride, nr, pi_k, k * p, p, s2);
      n[k] += BlockColumnSum(pi_k, nr);
    }
  }
}

template <typename T>
void VisionMembership(const RowsView<T>& w, const HeadShape& s, const AccType<T>* inv_nu2,
                      const AccType<T>* temp, AccType<T>* pi, AccType<T>* s2, AccType<T>* n) {
  constexpr int64_t V = Vectorized<AccType<T>>::size();
  switch (s.head_dim % V == 0 ? s.head_dim / V : 0) {
    case 1:
      return VisionMembershipImpl<T, 1>(w, s, inv_nu2, temp, pi, s2, n);
    case 2:
      return VisionMembershipImpl<T, 2>(w, s, inv_nu2, temp, pi, s2, n);
    case 3:
      return VisionMembershipImpl<T, 3>(w, s, inv_nu2, temp, pi, s2, n);
    case 4:
      return VisionMembershipImpl<T, 4>(w, s, inv_nu2, temp, pi, s2, n);
    case 6:  // p = 48 with 8-lane vectors (AVX2 float, AVX-512 double)
      return VisionMembershipImpl<T, 6>(w, s, inv_nu2, temp, pi, s2, n);
    case 8:  // p = 64 with 8-lane vectors
      return VisionMembershipImpl<T, 8>(w, s, inv_nu2, temp, pi, s2, n);
    default:
      return VisionMembershipImpl<T, 0>(w, s, inv_nu2, temp, pi, s2, n);
  }
}

// Stores a full vector of y; with `stream`, as a non-temporal store when the address allows
// (float32 on AVX2/AVX-512), which skips reading the destination line first and leaves the caches
// to w. Callers fence with StreamFence() before returning.
template <typename T>
TOST_CPU_INLINE void StoreY(T* p, const Vectorized<AccType<T>>& v, bool stream) {
  if constexpr (std::is_same_v<T, float>) {
#if defined(CPU_CAPABILITY_AVX512)
    if (stream && (reinterpret_cast<uintptr_t>(p) & 63) == 0) return _mm512_stream_ps(p, v);
#elif defined(CPU_CAPABILITY_AVX2)
    if (stream && (reinterpret_cast<uintptr_t>(p) & 31) == 0) return _mm256_stream_ps(p, v);
#endif
  }
  (void)stream;
  Io<T>::Store(p, v);
}

TOST_CPU_INLINE void StreamFence() {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  _mm_sfence();
#endif
}

template <typename T>
void VisionOutput(const RowsView<T>& w, const HeadShape& s, const AccType<T>* pi,
                  const AccType<T>* gate, T* y, bool stream) {
  using Acc = AccType<T>;
  using Vec = Vectorized<Acc>;
  constexpr int64_t V = Vec::size();
  const int64_t K = s.heads, p = s.head_dim, D = s.channels;
  for (int64_t r = 0; r < w.rows; ++r) {
    PrefetchRow(w, r + kPrefetchRows, D);
    const T* x_row = w.data + r * w.row_stride;
    T* y_row = y + r * D;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t off = k * p;
      const Vec neg_pi(-PiAt(pi, K, r, k));
      int64_t c = 0;
      for (; c + V <= p; c += V) {
        const Vec x = Io<T>::Load(x_row + off + c);
        StoreY(y_row + off + c, x * neg_pi * Vec::loadu(gate + off + c), stream);
      }
      if (c < p) {
        const Vec x = Io<T>::Load(x_row + off + c, p - c);
        Io<T>::Store(y_row + off + c, x * neg_pi * Vec::loadu(gate + off + c, p - c), p - c);
      }
    }
  }
  if (stream) StreamFence();
}

template <typename T>
void CausalMembership(const RowsView<T>& w, const HeadShape& s,
                      const CausalCoeffs<AccType<T>>& coeffs, const AccType<T>* start1,
                      AccType<T>* local1, AccType<T>* pi, AccType<T>* local2, AccType<T>* local3) {
  using Acc = AccType<T>;
  using Vec = Vectorized<Acc>;
  constexpr int64_t V = Vec::size();
  const int64_t K = s.heads, p = s.head_dim;
  const Vec eps(kNormEps<Acc>);
  const Vec p_vec(static_cast<Acc>(p));
  for (int64_t r0 = 0; r0 < w.rows; r0 += kBlockRows) {
    const int64_t nr = std::min(kBlockRows, w.rows - r0);
    const T* base = w.data + r0 * w.row_stride;
    Acc* block_pi = pi + (r0 / kBlockRows) * K * kBlockRows;
    if (nr < kBlockRows) std::fill_n(block_pi, K * kBlockRows, Acc(0));
    // Σ_c w²/S1 per head, rows in order (S1 is a running sum).
    for (int64_t r = 0; r < nr; ++r) {
      const T* x_row = base + r * w.row_stride;
      HeadSums<Acc>(
          K,
          [&](int64_t k) __attribute__((always_inline)) {
            const int64_t off = k * p;
            Vec sum(Acc(0));
            for (int64_t c = 0; c < p; c += V) {
              const int64_t n = std::min(V, p - c);
              const int64_t o = off + c;
              Vec x, l1, st1;
              if (n == V) {
                x = Io<T>::Load(x_row + o);
                l1 = at::vec::fmadd(x, x, Vec::loadu(local1 + o));
                l1.store(local1 + o);
                st1 = Vec::loadu(start1 + o);
              } else {
                x = Io<T>::Load(x_row + o, n);
                l1 = at::vec::fmadd(x, x, Vec::loadu(local1 + o, n));
                l1.store(local1 + o, n);
                st1 = Vec::loadu(start1 + o, n);
              }
              // S1 = max(S1_0 + Σ w², 1e-12), clamp on the squared sum (docs/model-semantics.md
              // §2.1 step 2). Padding lanes hold 0/1e-12 = 0.
              sum = sum + (x * x) / at::vec::maximum(st1 + l1, eps);
            }
            return sum;
          },
          block_pi + r);
    }
    // s = temp[k]·(Σ_c w²/S1 + p·δ[k, pos]), vectorised over the rows of the block.
    for (int64_t k = 0; k < K; ++k) {
      const Acc* delta_k = coeffs.delta + k * coeffs.delta_stride + r0;
      for (int64_t r = 0; r < kBlockRows; r += V) {
        const int64_t n = std::min(V, nr - r);
        if (n <= 0) break;
        Acc* x = block_pi + k * kBlockRows + r;
        const Vec delta = n == V ? Vec::loadu(delta_k + r) : Vec::loadu(delta_k + r, n);
        ((Vec::loadu(x) + delta * p_vec) * Vec(coeffs.temp[k])).store(x);
      }
    }
    SoftmaxBlock(block_pi, K);
    if (local2 == nullptr) continue;
    // Phase B of the chunked scan: the same running sums causal_output keeps, in the same order.
    for (int64_t r = 0; r < nr; ++r) {
      const T* x_row = base + r * w.row_stride;
      for (int64_t k = 0; k < K; ++k) {
        const Acc pik = block_pi[k * kBlockRows + r];
        local3[k] += pik;
        const Vec vpi(pik);
        const int64_t off = k * p;
        for (int64_t c = 0; c < p; c += V) {
          const int64_t n = std::min(V, p - c);
          const int64_t o = off + c;
          if (n == V) {
            const Vec x = Io<T>::Load(x_row + o);
            at::vec::fmadd(x * x, vpi, Vec::loadu(local2 + o)).store(local2 + o);
          } else {
            const Vec x = Io<T>::Load(x_row + o, n);
            at::vec::fmadd(x * x, vpi, Vec::loadu(local2 + o, n)).store(local2 + o, n);
          }
        }
      }
    }
  }
}

template <typename T>
void CausalOutput(const RowsView<T>& w, const HeadShape& s, const AccType<T>* pi,
                  const AccType<T>* start2, const AccType<T>* start3, AccType<T>* local2,
                  AccType<T>* local3, T* y) {
  using Acc = AccType<T>;
  using Vec = Vectorized<Acc>;
  constexpr int64_t V = Vec::size();
  const int64_t K = s.heads, p = s.head_dim, D = s.channels;
  const Vec one(Acc(1));
  for (int64_t r = 0; r < w.rows; ++r) {
    const T* x_row = w.data + r * w.row_stride;
    T* y_row = y + r * D;
    for (int64_t k = 0; k < K; ++k) {
      const Acc pik = PiAt(pi, K, r, k);
      local3[k] += pik;
      // dots = S2 / (S3 + 1e-8), as S2 · (1/(S3 + 1e-8)): one division per head instead of per
      // channel.
      const Vec inv_count(Acc(1) / ((start3[k] + local3[k]) + kCountEps<Acc>));
      const Vec vpi(pik), neg_pi(-pik);
      const int64_t off = k * p;
      for (int64_t c = 0; c < p; c += V) {
        const int64_t n = std::min(V, p - c);
        const int64_t o = off + c;
        if (n == V) {
          const Vec x = Io<T>::Load(x_row + o);
          const Vec l2 = at::vec::fmadd(x * x, vpi, Vec::loadu(local2 + o));
          l2.store(local2 + o);
          const Vec dots = (Vec::loadu(start2 + o) + l2) * inv_count;
          Io<T>::Store(y_row + o, (x * neg_pi) / (one + dots));
        } else {
          const Vec x = Io<T>::Load(x_row + o, n);
          const Vec l2 = at::vec::fmadd(x * x, vpi, Vec::loadu(local2 + o, n));
          l2.store(local2 + o, n);
          const Vec dots = (Vec::loadu(start2 + o, n) + l2) * inv_count;
          Io<T>::Store(y_row + o, (x * neg_pi) / (one + dots), n);
        }
      }
    }
  }
}

template <typename T>
constexpr RowKernels<T> kTable{&SumSquares<T>, &VisionMembership<T>, &VisionOutput<T>,
                               &CausalMembership<T>, &CausalOutput<T>};

}  // namespace
}  // namespace TOST_CPU_ISA_NAMESPACE

template <typename T>
const RowKernels<T>& TOST_CPU_CAT(RowKernels, TOST_CPU_ISA)() {
  return TOST_CPU_ISA_NAMESPACE::kTable<T>;
}

template const RowKernels<float>& TOST_CPU_CAT(RowKernels, TOST_CPU_ISA)<float>();
template const RowKernels<double>& TOST_CPU_CAT(RowKernels, TOST_CPU_ISA)<double>();
template const RowKernels<c10::Half>& TOST_CPU_CAT(RowKernels, TOST_CPU_ISA)<c10::Half>();
template const RowKernels<c10::BFloat16>& TOST_CPU_CAT(RowKernels, TOST_CPU_ISA)<c10::BFloat16>();

}  // namespace tost::kernels::cpu
