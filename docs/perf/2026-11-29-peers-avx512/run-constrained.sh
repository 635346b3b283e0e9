#!/usr/bin/env bash
# Writes constrained-<dtype>.json and .txt here: constrained decoding (JSON schema) against free
# decoding through tost_server at 1 and 64 streams, per precision (tools/bench/constrained.py: the
# server on one core, tost_loadgen on the other). The .txt names the commit, CPU and load.
# Usage: run-constrained.sh [dtype ...]   (default: fp32 int8); with ATEN_CPU_CAPABILITY=avx2 in the
# environment (and ONEDNN_MAX_CPU_ISA / MKL_ENABLE_INSTRUCTIONS=AVX2) it runs forced to AVX2, and
# writes to ../2026-11-29-peers-avx2-forced instead. BUILD_DIR: a folder laid out as build/ with
# tost_server and tost_loadgen in their places (default build/; a copy keeps a rebuild during the
# run from replacing them; LD_LIBRARY_PATH then names the folder of its libtost_kernels.so).
# ROUNDS: interleaved rounds of each point, the best of which counts (default 2; 3 halves the
# chance that one slow round decides a ratio near its target).
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/perf/2026-11-29-peers-avx512
[[ "${ATEN_CPU_CAPABILITY:-}" == avx2 ]] && out=docs/perf/2026-11-29-peers-avx2-forced
PY=$(sed -n 's/^TOST_PYTHON=//p' build/deps.env)
# Each precision twice: the schema as it is (constrained calls end when their JSON closes, after
# about 37 tokens against a free call's 60), and with minItems 4 (-full: every call runs its 64
# tokens), whose ratio is the constraint's cost per token alone.
for dtype in "${@:-fp32 int8}"; do
  for d in $dtype $(for x in $dtype; do echo "$x-full"; done); do
    extra=()
    [[ "$d" == *-full ]] && extra=(--min-items 4)
    cmd=("$PY" tools/bench/constrained.py --build-dir "${BUILD_DIR:-build}" --server-arg=--dtype="${d%-full}" --rounds "${ROUNDS:-2}"
         "${extra[@]}" --out "$out/constrained-$d.json")
    {
      echo "# command: ${cmd[*]}"
      echo "# env: ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-} ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-} MKL_ENABLE_INSTRUCTIONS=${MKL_ENABLE_INSTRUCTIONS:-}"
      echo "# commit: $(git rev-parse HEAD) (tree: $(git status --porcelain --untracked-files=no | wc -l) changed tracked files)"
      bin="${BUILD_DIR:-build}/service/tost_server"
      echo "# binary: $bin, built $(date -u -r "$bin" +%FT%TZ), sha256 $(sha256sum "$bin" | cut -c1-16)"
      echo "# date: $(date -u +%FT%TZ)"
      echo "# cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
      echo "# cpu flags: $(grep -o 'avx512[a-z_0-9]*\|amx[a-z_0-9]*\|avx_vnni\|avx2\|fma\|f16c' /proc/cpuinfo | sort -u | tr '\n' ' ')"
      echo "# uptime before: $(uptime); compilers running: $(pgrep -c cc1plus || true)"
      "${cmd[@]}" 2>&1
      echo "# uptime after: $(uptime); compilers running: $(pgrep -c cc1plus || true)"
    } > "$out/constrained-$d.txt"
  done
done
