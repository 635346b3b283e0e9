#!/usr/bin/env bash
# Collects, for the runtime stage of the images, what the built binaries need beyond the Debian
# packages that stage installs: tost_server, its constraint compile worker tost_constraint_compiler
# (which it runs from beside itself: both go to /usr/local/bin) and tost_cli, and every shared
# library they load from outside /lib and /usr/lib (LibTorch and the CUDA libraries of the torch
# wheel, libtost_kernels.so), each copied to OUT at its own absolute path, so the RUNPATH the build
# recorded in the binaries, and the wheel's $ORIGIN-relative RPATHs, resolve unchanged at run time
# (no LD_LIBRARY_PATH).
#
#   collect-runtime.sh cpu|cuda OUT     copy into OUT
#   collect-runtime.sh cpu|cuda --list  print what would be copied
# cuda also takes the wheel's whole torch/lib and nvidia/ trees: LibTorch and cuDNN dlopen() parts
# of themselves (cuDNN's engine libraries, NVRTC's builtins) that no DT_NEEDED entry names.
# Run from the repository root after `make build` (reads build/deps.env for the wheel's location).
set -euo pipefail
mode="${1:?cpu or cuda}" out="${2:?OUT directory or --list}"
case "$mode" in cpu | cuda) ;; *) echo "collect-runtime: mode must be cpu or cuda, got '$mode'" >&2; exit 2 ;; esac
bins=(build/service/tost_server build/service/tost_constraint_compiler build/client/tost_cli)
for b in "${bins[@]}"; do [ -x "$b" ] || { echo "collect-runtime: $b is not built (run make build)" >&2; exit 1; }; done

# The loader's view: ldd lists the whole DT_NEEDED closure with the RUNPATHs applied.
missing="$(ldd "${bins[@]}" | awk '$2 == "=>" && $3 == "not" {print $1}' | sort -u)"
[ -z "$missing" ] || { echo "collect-runtime: unresolved libraries: $missing" >&2; exit 1; }
mapfile -t paths < <(ldd "${bins[@]}" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
  xargs -r realpath --no-symlinks | grep -v -E '^/(usr/)?lib(64)?/' | sort -u)
if [ "$mode" = cuda ]; then
  torch_cmake="$(sed -n 's/^TOST_TORCH_CMAKE_PREFIX=//p' build/deps.env)"
  torch_dir="$(realpath --no-symlinks "$torch_cmake/../..")"
  paths+=("$torch_dir/lib" "$(dirname "$torch_dir")/nvidia")
fi

if [ "$out" = --list ]; then
  for b in "${bins[@]}"; do echo "/usr/local/bin/${b##*/}"; done
  printf '%s\n' "${paths[@]}"
  exit 0
fi
out="$(realpath -m "$out")"
mkdir -p "$out/usr/local/bin"
cp "${bins[@]}" "$out/usr/local/bin/"
# -L: a library reached through a symlink (libfoo.so.1 -> libfoo.so.1.2) is stored under the name
# the loader asks for. From / with relative sources: coreutils' --parents mis-resolves the parent
# directories of an absolute source when it preserves their attributes.
for p in "${paths[@]}"; do (cd / && cp -R -L --preserve=mode,timestamps --parents "${p#/}" "$out"); done
size="$(du -sh "$out" | cut -f1)"
echo "collect-runtime: $mode: ${#bins[@]} binaries and ${#paths[@]} library paths into $out ($size)"
