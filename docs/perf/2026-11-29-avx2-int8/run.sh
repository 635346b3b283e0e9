#!/usr/bin/env bash
# Regenerates the raw files of this directory from a build of the commit it names (build/ in the
# repository root). Forced AVX2 runs cap LibTorch and the project's kernels (ATEN_CPU_CAPABILITY),
# oneDNN (ONEDNN_MAX_CPU_ISA) and MKL (MKL_ENABLE_INSTRUCTIONS) to AVX2, as on an AVX2-only CPU.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/perf/2026-11-29-avx2-int8
header() {
  echo "# command: $*"
  echo "# commit: $(git rev-parse HEAD)"
  echo "# date: $(date -u +%FT%TZ)"
  echo "# cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "# cpu flags: $(grep -o 'avx512[a-z_0-9]*\|amx[a-z_0-9]*\|avx2\|fma\|f16c' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg) (2 cores shared with other engineers' builds and tests)"
}
run() {
  local file=$1
  shift
  { header "$@"; "$@" 2>&1; echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"; } > "$out/$file"
}
avx2=(env ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2)
run decode_products.txt build/tests/bench/tssa_bench --sections=decode-products --threads=1
run decode_products_avx2.txt "${avx2[@]}" build/tests/bench/tssa_bench --sections=decode-products \
  --threads=1
run lean_table_int8_avx2.txt "${avx2[@]}" build/tests/bench/tost_generation_bench \
  --lean_table_only --dtype=int8 --long_prompt_tokens=4000
run lean_table_int8_avx512_vnni.txt build/tests/bench/tost_generation_bench \
  --lean_table_only --dtype=int8 --long_prompt_tokens=4000
run lean_table_fp32_avx2.txt "${avx2[@]}" build/tests/bench/tost_generation_bench \
  --lean_table_only --dtype=fp32 --long_prompt_tokens=4000
# The lean step at 128 rows (and in the server's default 128-token prefill chunks).
run lean_table_int8_avx2_128.txt "${avx2[@]}" build/tests/bench/tost_generation_bench \
  --lean_table_only --dtype=int8 --long_prompt_tokens=4000 --lean_max_rows=128
run lean_table_int8_avx512_vnni_128.txt build/tests/bench/tost_generation_bench \
  --lean_table_only --dtype=int8 --long_prompt_tokens=4000 --lean_max_rows=128
# bf16 through the same tiles, forced AVX2.
run lean_table_bf16_avx2_128.txt "${avx2[@]}" build/tests/bench/tost_generation_bench \
  --lean_table_only --dtype=bf16 --long_prompt_tokens=4000 --lean_max_rows=128
