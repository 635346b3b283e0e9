// Vectorised row-range kernels of the fused CPU TSSA operators, one table per instruction set.
//
// row_kernels.cc is compiled once per instruction set (DEFAULT, AVX2, AVX-512; see
// kernels/cpu/CMakeLists.txt) with at::vec's CPU_CAPABILITY set accordingly; isa.cc picks the
// table at run time. The kernels here are single-threaded and work on raw pointers over a range
// of token rows: the drivers (tssa_vision_cpu.cc, tssa_causal_cpu.cc) own tensors, scratch
// buffers and at::parallel_for, so nothing compiled with AVX-512 flags runs before the CPU has
// been checked, and no LibTorch code outside at::vec is instantiated in the per-ISA objects.
//
// Conventions shared by every kernel:
//   - A row is one token: `channels` = D = K·p contiguous elements, channel c of head k at k·p + c.
//     Consecutive rows are `row_stride` elements apart (any stride ≥ 0: strided views are read
//     in place).
//   - Acc = AccType<T> is the accumulation type: double for double inputs, float otherwise.
//   - Π is stored in Acc in blocks of kPiBlockRows rows, head-major within a block (the layout the
//     softmax over heads vectorises over rows in): row r, head k at
//     (r / kPiBlockRows)·K·kPiBlockRows + k·kPiBlockRows + r % kPiBlockRows, relative to the first
//     row of the call; a buffer for R rows holds ceil(R / kPiBlockRows)·K·kPiBlockRows values.
//   - Every kernel processes rows in increasing order and the same arithmetic for the same row,
//     so running sums that two kernels both compute (causal phase B and C) agree bit for bit.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <type_traits>

namespace tost::kernels::cpu {

inline constexpr int64_t kPiBlockRows = 16;

// Values of a Π buffer for `rows` rows of `heads` heads.
inline int64_t PiBufferSize(int64_t rows, int64_t heads) {
  return (rows + kPiBlockRows - 1) / kPiBlockRows * kPiBlockRows * heads;
}

template <typename T>
using AccType = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
struct RowsView {
  const T* data = nullptr;  // first row
  int64_t rows = 0;
  int64_t row_stride = 0;  // elements between consecutive rows
};

struct HeadShape {
  int64_t channels = 0;  // D
  int64_t heads = 0;     // K
  int64_t head_dim = 0;  // p = D / K
};

// Per-call constants of the causal membership logit s[k] = temp[k]·(Σ_c w²/S1 + p·δ[k, pos]).
template <typename Acc>
struct CausalCoeffs {
  const Acc* temp = nullptr;  // [K]
  const Acc* delta =
      nullptr;  // δ of the first row: row r of head k reads delta[k·delta_stride + r]
  int64_t delta_stride = 0;  // Tmax
};

template <typename T>
struct RowKernels {
  using Acc = AccType<T>;

  // acc[c] = fma(w[r,c], w[r,c], acc[c]) for r = 0..rows-1 in order (acc is not reset).
  void (*sum_squares)(const RowsView<T>& w, int64_t channels, Acc* acc);

  // Vision pass 2. For each row: Π[r] = softmax_k(temp[k]·Σ_c w[r,c]²·inv_nu2[c]) into pi
  // pi; s2[c] += Π[r,k]·w[r,c]²; n[k] += Π[r,k].
  void (*vision_membership)(const RowsView<T>& w, const HeadShape& shape, const Acc* inv_nu2,
                            const Acc* temp, Acc* pi, Acc* s2, Acc* n);

  // Vision pass 3: y[r,c] = (−w[r,c]·Π[r,k])·gate[c], y contiguous [rows, D]. `stream`: write y
  // with non-temporal stores where the ISA and alignment allow (for outputs far beyond the caches).
  void (*vision_output)(const RowsView<T>& w, const HeadShape& shape, const Acc* pi,
                        const Acc* gate, T* y, bool stream);

  // Causal phase "membership" for rows in order: local1 += w² (fma), S1 = start1 + local1,
  // Π[r] = softmax_k(temp[k]·(Σ_c w²/max(S1, 1e-12) + p·δ[k, r])) into pi. When local2
  // is not null, also local2 = fma(w², Π, local2) and local3 += Π exactly as causal_output does.
  void (*causal_membership)(const RowsView<T>& w, const HeadShape& shape,
                            const CausalCoeffs<Acc>& coeffs, const Acc* start1, Acc* local1,
                            Acc* pi, Acc* local2, Acc* local3);

  // Causal phase "output" for rows in order: local2 = fma(w², Π, local2), local3 += Π,
  // dots = (start2 + local2)·(1/((start3 + local3) + 1e-8)), y = (−w·Π)/(1 + dots).
  void (*causal_output)(const RowsView<T>& w, const HeadShape& shape, const Acc* pi,
                        const Acc* start2, const Acc* start3, Acc* local2, Acc* local3, T* y);
};

// One table per compiled instruction set (defined in row_kernels.cc, built once per ISA).
template <typename T>
const RowKernels<T>& RowKernelsDefault();
template <typename T>
const RowKernels<T>& RowKernelsAvx2();
template <typename T>
const RowKernels<T>& RowKernelsAvx512();

}  // namespace tost::kernels::cpu
