#!/usr/bin/env bash
# Prepares what a lent GPU machine lacks, in build-gpu/ (ignored; the device tool carries it):
#
#   build-gpu/googletest  Debian's GoogleTest source (scripts/install-deps.sh installs it), for the
#                         standalone kernels build (kernels/CMakeLists.txt);
#   build-gpu/debs        with --server: the .deb files of the server's Debian dev packages and the
#                         libraries they need (gRPC, protobuf and its compiler, Abseil,
#                         prometheus-cpp, libpng, TurboJPEG, PCRE2, nlohmann-json, GoogleTest),
#                         less what every Linux image has (glibc, libstdc++, zlib, OpenSSL 3).
#
# The machine has PyTorch with CUDA, nvcc, CMake and ninja, and no network. There:
#   kernels only:
#     cmake -S kernels -B build-kernels -DTOST_PYTHON=$(which python3) -DTOST_WERROR=OFF \
#           -DTOST_GTEST_SOURCE_DIR=$PWD/build-gpu/googletest
#     cmake --build build-kernels -j && ctest --test-dir build-kernels -L gpu --output-on-failure
#     build-kernels/tests-kernels/gpu/tssa_gpu_bench
#   the whole server (carry build-gpu/debs; it unpacks them with dpkg -x into build-gpu/sysroot and
#   configures against it and the machine's PyTorch):
#     source scripts/gpu-sysroot.sh && cmake -S . -B build-cuda -G Ninja "${TOST_SYSROOT_CMAKE_ARGS[@]}"
#     cmake --build build-cuda -j && ctest --test-dir build-cuda -L gpu --output-on-failure
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

[[ ${1:-} == --server ]] || exit 0

dev_packages=(
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  prometheus-cpp-dev libpng-dev libturbojpeg0-dev nlohmann-json3-dev libpcre2-dev libgtest-dev
  libgmock-dev
)
# On every image already (and replacing them would break the machine's own programs).
base='^(libc6|libc6-dev|libc-dev-bin|linux-libc-dev|libgcc-s1|libstdc\+\+6|gcc-12-base|libcrypt1|libcrypt-dev|zlib1g|libssl3|libzstd1|libffi8|libgmp10|libdb5\.3|libnsl2|libnsl-dev|libtirpc3|libtirpc-dev|libtirpc-common|rpcsvc-proto|pkgconf|pkgconf-bin|libpkgconf3)$'
mapfile -t closure < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
  --no-breaks --no-replaces --no-enhances "${dev_packages[@]}" | grep -v '^ \|<' | sort -u |
  grep -Ev "$base")
rm -rf build-gpu/debs
mkdir -p build-gpu/debs
(cd build-gpu/debs && apt-get download -q "${closure[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
count=$(ls build-gpu/debs/*.deb | wc -l)
if [[ $count -ne ${#closure[@]} ]]; then
  echo "gpu-bundle: downloaded $count of ${#closure[@]} packages" >&2
  exit 1
fi
size_kib=$(du -sk build-gpu/debs | cut -f1)
echo "gpu-bundle: build-gpu/debs: $count packages, $((size_kib / 1024)) MiB (the device tool carries 64 MiB in all)"
if ((size_kib > 56 * 1024)); then
  echo "gpu-bundle: too large to carry with the sources" >&2
  exit 1
fi
