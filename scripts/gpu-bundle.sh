#!/usr/bin/env bash
# What a lent GPU machine runs, built here, so that none of its minutes go to compiling.
#
#   scripts/gpu-bundle.sh [--build DIR] [--out FILE]
#       The binary bundle (default build-gpu/tost-gpu-bundle.tar.gz, ignored; the device tool
#       carries it): the binaries CI built in DIR (default build/, CUDA on, sm_80 and sm_90 code)
#       with their debug sections stripped, the closure of Debian runtime libraries they load
#       (every library but glibc's, libstdc++ and libgcc_s, which every image has, and LibTorch's
#       and CUDA's, which the machine's PyTorch provides), each binary and library finding the rest
#       beside it ($ORIGIN), the Python wheels the GPU serving test needs on Python 3.12 (grpcio,
#       grpcio-tools and protobuf at the versions the tests run with here: the image has no grpcio-tools), and
#       MANIFEST (every file: bytes, sha256, where it came from). There, scripts/gpu-session.sh
#       unpacks and runs it against the image's torch and CUDA libraries.
#
# The fallbacks, for a machine the bundle does not fit (another torch, another architecture):
#   --kernels-source   build-gpu/googletest: Debian's GoogleTest source, for the standalone
#                      kernels build there (kernels/CMakeLists.txt; docs/kernels.md).
#   --server-source    build-gpu/debs: the server's Debian dev packages and everything they need
#                      but glibc and libstdc++ (OpenSSL, zlib and pkg-config included: the image
#                      may lack their dev files), unpacked there by scripts/gpu-sysroot.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD

build=build
out=build-gpu/tost-gpu-bundle.tar.gz
mode=binaries
while (($#)); do
  case $1 in
    --build) build=$2; shift ;;
    --build=*) build=${1#--build=} ;;
    --out) out=$2; shift ;;
    --out=*) out=${1#--out=} ;;
    --kernels-source) mode=kernels-source ;;
    --server-source) mode=server-source ;;
    *) echo "gpu-bundle: unknown argument '$1' (expected --build DIR, --out FILE, --kernels-source or --server-source)" >&2
       exit 2 ;;
  esac
  shift
done
die() { echo "gpu-bundle: $*" >&2; exit 1; }

# The whole bundle and the working tree travel together: 64 MiB in all.
carry_limit_kib=$((64 * 1024))

if [[ $mode == kernels-source ]]; then
  src=/usr/src/googletest
  [[ -f $src/CMakeLists.txt ]] || die "$src is missing: run scripts/install-deps.sh (it installs Debian's googletest)"
  rm -rf build-gpu/googletest
  mkdir -p build-gpu
  cp -r "$src" build-gpu/googletest
  echo "gpu-bundle: build-gpu/googletest ($(du -sh build-gpu/googletest | cut -f1)) ready to carry"
  exit 0
fi

if [[ $mode == server-source ]]; then
  dev_packages=(
    libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
    prometheus-cpp-dev libpng-dev libturbojpeg0-dev nlohmann-json3-dev libpcre2-dev libgtest-dev
    libgmock-dev libhiredis-dev libboost1.74-dev libssl-dev zlib1g-dev pkgconf
  )
  # On every image already, and replacing them would break the machine's own programs.
  base='^(libc6|libc6-dev|libc-dev-bin|linux-libc-dev|libgcc-s1|libstdc\+\+6|gcc-12-base|libcrypt1|libcrypt-dev|libzstd1|libffi8|libgmp10|libdb5\.3|libnsl2|libnsl-dev|libtirpc3|libtirpc-dev|libtirpc-common|rpcsvc-proto)$'
  mapfile -t closure < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
    --no-breaks --no-replaces --no-enhances "${dev_packages[@]}" | grep -v '^ \|<' | sort -u |
    grep -Ev "$base")
  rm -rf build-gpu/debs
  mkdir -p build-gpu/debs
  (cd build-gpu/debs && apt-get download -q "${closure[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
  count=$(ls build-gpu/debs/*.deb | wc -l)
  [[ $count -eq ${#closure[@]} ]] || die "downloaded $count of ${#closure[@]} packages"
  size_kib=$(du -sk build-gpu/debs | cut -f1)
  echo "gpu-bundle: build-gpu/debs: $count packages, $((size_kib / 1024)) MiB (the device tool carries 64 MiB in all)"
  ((size_kib <= carry_limit_kib - 16 * 1024)) || die "too large to carry with the sources"
  exit 0
fi

# ---- the binary bundle ------------------------------------------------------------------------
command -v patchelf >/dev/null || die "patchelf is missing: run scripts/install-deps.sh"
[[ -f $build/deps.env ]] || die "$build/deps.env is missing: build first (make build)"
python=$(sed -n 's/^TOST_PYTHON=//p' "$build/deps.env")
binaries=(
  service/tost_server service/tost_constraint_compiler client/tost_cli
  tests/kernels/gpu/tost_gpu_tests tests/kernels/gpu/tssa_gpu_bench
  tests/bench/tost_classify_forward_bench tests/bench/tost_generation_bench tests/bench/tost_loadgen
)
for b in "${binaries[@]}"; do
  [[ -x $build/$b ]] || die "$build/$b is missing: build with CUDA on (make build CUDA=ON)"
done
grep -q '^TOST_ENABLE_CUDA:BOOL=ON' "$build/CMakeCache.txt" || die "$build was configured without CUDA (TOST_ENABLE_CUDA=OFF)"
torch_site=$("$python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
torch_version=$("$python" -c 'import torch; print(torch.__version__)')

stage=$(mktemp -d "${TMPDIR:-/tmp}/tost-gpu-bundle.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root=$stage/tost-gpu-bundle
mkdir -p "$root/bin" "$root/lib" "$root/wheels"

# Every image has these (glibc, the C++ runtime); a bundled copy would shadow the machine's own.
every_image='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libutil\.so\.1|libstdc\+\+\.so\.6|libgcc_s\.so\.1)$'
declare -A origin_of  # bundled file -> where it came from
for b in "${binaries[@]}"; do
  name=$(basename "$b")
  strip --strip-debug -o "$root/bin/$name" "$build/$b"
  origin_of[bin/$name]="built: $b"
  # ldd resolves the whole closure (what the libraries need too) as the loader would here.
  while read -r soname path; do
    [[ $soname =~ $every_image ]] && continue
    [[ -z $path || $path == "not" ]] && die "$b: $soname does not resolve here (ldd)"
    [[ $path == "$torch_site"/* ]] && continue  # LibTorch and CUDA: the machine's PyTorch has them
    [[ -e $root/lib/$soname ]] && continue
    if [[ $path == "$PWD/$build"/* || $path == "$(cd "$build" && pwd)"/* ]]; then
      strip --strip-debug -o "$root/lib/$soname" "$path"
      origin_of[lib/$soname]="built: ${path#"$(cd "$build" && pwd)"/}"
    else
      cp -L "$path" "$root/lib/$soname"
      real=$(readlink -f "$path")
      pkg=$(dpkg -S "$real" 2>/dev/null | head -1 | cut -d: -f1,2 | cut -d: -f1) || true
      [[ -n $pkg ]] || pkg=$(dpkg -S "$path" 2>/dev/null | head -1 | cut -d: -f1) || true
      version=$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null || echo "?")
      origin_of[lib/$soname]="debian: ${pkg:-unknown} $version"
    fi
  done < <(ldd "$build/$b" | awk '/=>/ {print $1, $3; next} {n = split($1, p, "/"); print p[n], ""}')
done
chmod u+w "$root"/lib/* "$root"/bin/*
for f in "$root"/bin/*; do patchelf --set-rpath '$ORIGIN/../lib' "$f"; done
for f in "$root"/lib/*; do patchelf --set-rpath '$ORIGIN' "$f"; done

# The GPU serving test's Python packages, for the image's Python 3.12, cached between runs.
wheel_cache="${TOST_DEPS_DIR:-/opt/tost-deps}/wheels-cp312"
mkdir -p "$wheel_cache"
pins=()
for p in grpcio grpcio-tools protobuf; do  # the versions the tests run with here
  version=$("$python" -c "import importlib.metadata as m; print(m.version('$p'))") ||
    die "$p is not installed in $python: run scripts/install-deps.sh"
  pins+=("$p==$version")
done
"$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$wheel_cache" "${pins[@]}" ||
  die "could not download ${pins[*]} for Python 3.12 from PyPI"
for pin in "${pins[@]}"; do
  dist=${pin%%==*}; dist=${dist//-/_}; version=${pin##*==}
  wheel=$(ls "$wheel_cache/${dist}-${version}-"*.whl 2>/dev/null | head -1)
  [[ -n $wheel ]] || die "no wheel of $pin in $wheel_cache"
  cp "$wheel" "$root/wheels/"
  origin_of[wheels/$(basename "$wheel")]="pypi: $pin"
done

commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo " (with uncommitted changes)" || true)
archs=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build/CMakeCache.txt")
{
  echo "# tost-serve GPU bundle: scripts/gpu-bundle.sh, unpacked and run by scripts/gpu-session.sh"
  echo "commit: $commit$dirty"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(g++ --version | head -1)"
  echo "torch: $torch_version (the machine's must be the same build: LibTorch and CUDA come from it)"
  echo "cuda architectures: ${archs:-80 90, the default of kernels/cuda}"
  echo "every image has: glibc, libstdc++, libgcc_s (not bundled)"
  echo
  printf '%-60s %10s  %-64s  %s\n' path bytes sha256 origin
  for f in $(cd "$root" && find bin lib wheels -type f | sort); do
    printf '%-60s %10s  %-64s  %s\n' "$f" "$(stat -c %s "$root/$f")" \
      "$(sha256sum "$root/$f" | cut -d' ' -f1)" "${origin_of[$f]}"
  done
} >"$root/MANIFEST"

mkdir -p "$(dirname "$out")"
tar -C "$stage" -czf "$out.tmp" tost-gpu-bundle
mv "$out.tmp" "$out"
bundle_kib=$(( $(stat -c %s "$out") / 1024 ))
tree_kib=$(( $(git ls-files -z | du -ck --files0-from=- 2>/dev/null | tail -1 | cut -f1) ))
echo "gpu-bundle: $out: $(ls "$root/bin" | wc -l) binaries, $(ls "$root/lib" | wc -l) libraries, $(ls "$root/wheels" | wc -l) wheels; $((bundle_kib / 1024)) MiB compressed, $(( $(du -sk "$root" | cut -f1) / 1024 )) MiB unpacked; with the tracked sources ($((tree_kib / 1024)) MiB) $(((bundle_kib + tree_kib) / 1024)) of the 64 MiB the device tool carries"
((bundle_kib + tree_kib <= carry_limit_kib)) || die "the bundle and the sources exceed the 64 MiB the device tool carries"
