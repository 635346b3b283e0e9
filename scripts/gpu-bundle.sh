#!/usr/bin/env bash
# Prepares what a lent GPU machine lacks for the standalone kernels build (kernels/CMakeLists.txt):
# a GoogleTest source tree, copied from Debian's googletest package (scripts/install-deps.sh
# installs it) into build-gpu/googletest, an ignored path the device tool can carry along.
# The machine has PyTorch with CUDA, nvcc and CMake, and no network. Then, on the GPU machine:
#   cmake -S kernels -B build-kernels -DTOST_PYTHON=$(which python3) \
#         -DTOST_GTEST_SOURCE_DIR=$PWD/build-gpu/googletest
#   cmake --build build-kernels -j && ctest --test-dir build-kernels -L gpu --output-on-failure
#   build-kernels/tests-kernels/gpu/tssa_gpu_bench
set -euo pipefail
cd "$(dirname "$0")/.."
src=/usr/src/googletest
if [[ ! -f $src/CMakeLists.txt ]]; then
  echo "gpu-bundle: $src is missing: run scripts/install-deps.sh (it installs Debian's googletest)" >&2
  exit 1
fi
rm -rf build-gpu/googletest
mkdir -p build-gpu
cp -r "$src" build-gpu/googletest
echo "gpu-bundle: build-gpu/googletest ($(du -sh build-gpu/googletest | cut -f1)) ready to carry"
