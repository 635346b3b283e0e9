#include "model/nets/lean_row_limits.h"

namespace tost::model {

// From tost_generation_bench --lean_table_only on the bench LM (one core, lean / LibTorch time per
// step; docs/kernels.md has the tables):
// - AVX-512 without AMX: fp32 0.26-0.73 at 1-64 rows; fp16 0.25-0.59 at 1-64. bf16 and int8 with
//   the AVX-512 BF16/VNNI dot products: bf16 0.33 at 1 row, 0.70 at 16, 0.90 at 64; int8 0.20 at
//   1, 0.22 at 16, 0.40 at 64. Without them (widening products): bf16 0.28 at 1 row, 0.82 at 16,
//   1.08 at 32, so at AVX-512 without the dot products oneDNN's bf16 products take over past 16.
// - AVX2 (ATEN_CPU_CAPABILITY=avx2, oneDNN and MKL capped to AVX2 too, on a loaded 2-core
//   Sapphire Rapids; docs/perf/2026-11-29-avx2-int8): int8 through float32 tiles 4.50 / 8.72 ms at
//   16 rows, 17.0 / 20.8 at 64, 33.1 / 36.2 at 128, a 4000-token prompt in 128-token chunks at
//   3 978 / 3 683 tokens/s; with the VNNI quads 7.86 / 35.6 ms at 128 rows and 17 834 / 3 638
//   tokens/s. So int8 stays lean to 128 rows (the server's default prefill chunk). bf16 at AVX2
//   (where LibTorch widens the weight to float32 for every product) goes through the same tiles:
//   4.87 / 9.04 ms at 16 rows, 17.8 / 22.0 at 64, 35.8 / 38.5 at 128: lean to 64.
// - AMX (Sapphire Rapids, 2 cores at 2.1 GHz, 2026-11-28): oneDNN's bf16 products run on AMX
//   tiles and win past 16 rows (lean / LibTorch 1.02 / 4.76 ms at 1 row, 6.12 / 6.99 at 16,
//   10.9 / 5.63 at 32, 25.8 / 10.5 at 64; a 1024-token prompt 3 058 tokens/s in 64-token lean
//   chunks against 9 657 in LibTorch's 128-token ones). int8 stays lean there at every size
//   measured (6.52 / 13.99 at 64 rows), fp32 too, barely (14.0 / 14.6 at 64).
int64_t LeanMaxRows(ComputeDtype dtype, const LeanCpuClass& cpu) {
  switch (dtype) {
    case ComputeDtype::kFloat32:
    case ComputeDtype::kFloat16:
      return 64;
    case ComputeDtype::kBFloat16:
      if (cpu.amx_bf16) return 16;
      return cpu.dot_products || cpu.avx2 ? 64 : 16;
    case ComputeDtype::kInt8:
      return 128;
  }
  return 0;
}

}  // namespace tost::model
