#!/usr/bin/env bash
# Builds and runs the emulated CUDA kernel tests (tests/kernels/emulator): the kernels of
# kernels/cuda/ compiled as host C++ with clang, every thread a fiber, every access checked for
# races, bounds and uninitialised reads, and the GPU test cases run against the ATen reference.
#
#   scripts/run-emulated-kernels.sh [--out DIR] [--python PY] [--jobs N] [--build-only]
#                                   [-- GTEST_ARGS...]
#
#   --out DIR     build directory (default build-emulated)
#   --python PY   the interpreter whose torch wheel provides LibTorch (default: the venv recorded
#                 in build/deps.env by scripts/install-deps.sh)
#   --jobs N      parallel compile jobs (default: the number of CPUs)
#   --build-only  configure and compile, run nothing (ctest emulated_cuda_kernels_build, which
#                 compiles alone on every core before emulated_cuda_kernels runs beside others)
#   GTEST_ARGS    passed to the test binary, e.g. -- --gtest_filter='EmulatorTest.*'
#   TOST_EMULATOR_SEED  another block/fiber schedule (the seed in use is printed first)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$repo/build-emulated"
python=""
jobs="$(nproc 2>/dev/null || echo 2)"
build_only=0
while (($#)); do
  case "$1" in
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --python) python="${2:?--python needs an interpreter}"; shift 2 ;;
    --jobs) jobs="${2:?--jobs needs a count}"; shift 2 ;;
    --build-only) build_only=1; shift ;;
    --) shift; break ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run-emulated-kernels: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [[ -z "$python" ]]; then
  python="$(sed -n 's/^TOST_PYTHON=//p' "$repo/build/deps.env" 2>/dev/null || true)"
  [[ -n "$python" ]] || { echo "run-emulated-kernels: pass --python (no build/deps.env)" >&2; exit 2; }
fi

t0=$(date +%s)
cmake -S "$repo/tests/kernels/emulator" -B "$out" -G Ninja -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DTOST_PYTHON="$python" >/dev/null
cmake --build "$out" -j "$jobs"
t1=$(date +%s)
echo "=== emulated kernels: build took $((t1 - t0)) s"
((build_only)) && exit 0
# The symbolizer gives the reports their file:line.
symbolizer="$(command -v llvm-symbolizer || ls /usr/bin/llvm-symbolizer-* 2>/dev/null | head -n1 || true)"
ASAN_SYMBOLIZER_PATH="${ASAN_SYMBOLIZER_PATH:-$symbolizer}" OMP_NUM_THREADS=1 \
  "$out/tost_emulated_kernel_tests" "$@"
echo "=== emulated kernels: tests took $(( $(date +%s) - t1 )) s"
