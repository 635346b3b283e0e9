# Sourced on a lent GPU machine (scripts/gpu-bundle.sh --server made build-gpu/debs here): unpacks
# the Debian packages into build-gpu/sysroot (dpkg -x: files only, nothing installed on the
# machine) and sets what a configure against it needs:
#   TOST_SYSROOT_CMAKE_ARGS  CMake arguments (prefix path, protoc and the gRPC plugin, the
#                            machine's python3 and its PyTorch, CUDA on);
#   PATH, LD_LIBRARY_PATH, PKG_CONFIG_PATH  the sysroot's tools, libraries and .pc files.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
sysroot="$here/build-gpu/sysroot"
if [[ ! -f $sysroot/.complete ]]; then
  rm -rf "$sysroot"
  mkdir -p "$sysroot"
  for deb in "$here"/build-gpu/debs/*.deb; do dpkg -x "$deb" "$sysroot" || return 1; done
  touch "$sysroot/.complete"
fi
multiarch=x86_64-linux-gnu
export PATH="$sysroot/usr/bin:$PATH"
export LD_LIBRARY_PATH="$sysroot/usr/lib/$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Debian's .pc files name prefix=/usr: pkg-config rewrites their paths into the sysroot.
export PKG_CONFIG_PATH="$sysroot/usr/lib/$multiarch/pkgconfig:$sysroot/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$sysroot"
TOST_SYSROOT_CMAKE_ARGS=(
  -DCMAKE_PREFIX_PATH="$sysroot/usr;$sysroot/usr/lib/$multiarch/cmake"
  -DProtobuf_PROTOC_EXECUTABLE="$sysroot/usr/bin/protoc"
  -DTOST_GRPC_CPP_PLUGIN="$sysroot/usr/bin/grpc_cpp_plugin"
  -DTOST_PYTHON="$(command -v python3)"
  -DTOST_ENABLE_CUDA=ON
  # The machine's compiler is not the one the code is kept warning-free with: its new warnings
  # stay warnings.
  -DTOST_WERROR=OFF
)
export TOST_SYSROOT_CMAKE_ARGS
