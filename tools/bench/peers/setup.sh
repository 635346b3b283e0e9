#!/usr/bin/env bash
# Builds the peers the ToST peer benchmark measures tost_server against, cached under
# ${TOST_DEPS_DIR:-/opt/tost-deps}/peers/ so a second run only checks what is there:
#   - llama.cpp's llama-server, from the llama.cpp that the pinned llama-cpp-python sdist vendors
#     (PyPI is the one source of llama.cpp this workplace can reach; the sdist pins a llama.cpp commit);
#   - a scratch Python venv with CTranslate2, transformers and gguf (llama.cpp's own gguf-py), for
#     tools/bench/peers/make_twins.py and the in-process CTranslate2 runs of run_peers.py.
# Prints the two paths run_peers.py needs as KEY=VALUE lines at the end (also written to peers.env).
#
# Usage: tools/bench/peers/setup.sh [--jobs N] [--lock FILE] [--avx2]
#   --jobs N     compile jobs (default 2: the build shares the machine)
#   --avx2       also build llama-server for AVX2 (+FMA, F16C; no AVX-512), as on an AVX2-only CPU,
#                for a run forced to AVX2 on an AVX-512 machine (PEERS_LLAMA_SERVER_AVX2)
#   --lock FILE  hold flock(1) on FILE around the llama.cpp compile only, so builds that share the
#                machine and the same lock take turns instead of splitting the cores
set -euo pipefail

jobs=2
lock=""
avx2=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --jobs) jobs="$2"; shift 2 ;;
    --lock) lock="$2"; shift 2 ;;
    --avx2) avx2=1; shift ;;
    *) echo "setup.sh: unknown argument '$1' (expected --jobs N, --lock FILE or --avx2)" >&2; exit 2 ;;
  esac
done
locked=()
[[ -n "$lock" ]] && locked=(flock "$lock")

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
deps="${TOST_DEPS_DIR:-/opt/tost-deps}"
peers="$deps/peers"
mkdir -p "$peers/dl" "$peers/src"

# The project's own venv: its torch (a multi-gigabyte CUDA wheel) is reused by the scratch venv
# instead of downloading a second copy; CPU inference is all either converter needs from it.
deps_env="${TOST_DEPS_ENV:-$repo/build/deps.env}"
[[ -f "$deps_env" ]] || deps_env=/work/main/build/deps.env
tost_python="$(sed -n 's/^TOST_PYTHON=//p' "$deps_env" 2>/dev/null || true)"
if [[ -z "$tost_python" || ! -x "$tost_python" ]]; then
  echo "setup.sh: expected TOST_PYTHON=<python with torch> in $deps_env (run scripts/install-deps.sh); got '${tost_python}'" >&2
  exit 1
fi

# ---- llama.cpp, vendored by llama-cpp-python ---------------------------------------------------
LCP_VERSION=0.3.36
LCP_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
sdist="$peers/dl/llama_cpp_python-$LCP_VERSION.tar.gz"
if [[ ! -f "$sdist" ]] || ! echo "$LCP_SHA256  $sdist" | sha256sum -c --status; then
  # The per-release JSON endpoint (/pypi/<name>/<version>/json) is not served by every mirror; the
  # project JSON's releases[version] list is, and its URLs may be relative to the JSON's address.
  url="$(python3 - "$LCP_VERSION" <<'PY'
import json, sys, urllib.parse, urllib.request
version = sys.argv[1]
base = "https://pypi.org/pypi/llama-cpp-python/json"
with urllib.request.urlopen(base, timeout=60) as r:
    releases = json.load(r)["releases"]
files = [f for f in releases.get(version, []) if f["packagetype"] == "sdist"]
if not files:
    sys.exit(f"no sdist for llama-cpp-python {version}; releases has {sorted(releases)[-5:]} ...")
print(urllib.parse.urljoin(base, files[0]["url"]))
PY
)"
  echo "setup.sh: downloading $url"
  curl -fL --retry 3 -o "$sdist.part" "$url"
  got="$(sha256sum "$sdist.part" | cut -d' ' -f1)"
  if [[ "$got" != "$LCP_SHA256" ]]; then
    echo "setup.sh: llama-cpp-python $LCP_VERSION sdist sha256 expected $LCP_SHA256, got $got" >&2
    exit 1
  fi
  mv "$sdist.part" "$sdist"
fi
src="$peers/src/llama_cpp_python-$LCP_VERSION"
if [[ ! -f "$src/vendor/llama.cpp/CMakeLists.txt" ]]; then
  rm -rf "$src.part" && mkdir -p "$src.part"
  tar -xzf "$sdist" -C "$src.part" --strip-components=1
  rm -rf "$src" && mv "$src.part" "$src"
fi
llama="$src/vendor/llama.cpp"
build="$peers/build/llama.cpp-$LCP_VERSION-native"
server="$build/bin/llama-server"
if [[ ! -x "$server" ]]; then
  start=$(date +%s)
  # GGML_NATIVE: the peer gets this CPU's full instruction set (AVX-512 here), as tost_server's
  # build does; LLAMA_CURL off: no model downloads, and no libcurl headers needed.
  cmake -S "$llama" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
    -DBUILD_SHARED_LIBS=OFF
  "${locked[@]}" cmake --build "$build" --target llama-server -j "$jobs"
  echo "setup.sh: llama-server built in $(( $(date +%s) - start )) s"
fi
server_avx2="$peers/build/llama.cpp-$LCP_VERSION-avx2/bin/llama-server"
if [[ "$avx2" == 1 && ! -x "$server_avx2" ]]; then
  start=$(date +%s)
  # The instruction sets of an AVX2-only CPU (Haswell to Zen 3), none of AVX-512's.
  cmake -S "$llama" -B "$peers/build/llama.cpp-$LCP_VERSION-avx2" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
    -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF \
    -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
    -DBUILD_SHARED_LIBS=OFF
  "${locked[@]}" cmake --build "$peers/build/llama.cpp-$LCP_VERSION-avx2" --target llama-server -j "$jobs"
  echo "setup.sh: llama-server (AVX2) built in $(( $(date +%s) - start )) s"
fi

# ---- scratch venv: CTranslate2, transformers, gguf ----------------------------------------------
# Pins: keyed into the venv's name so a changed pin builds a fresh venv next to the old one.
# transformers 4.57.6 is the version llama.cpp's requirements-convert_hf_to_gguf.txt pins.
pins=(ctranslate2==4.8.5 transformers==4.57.6 sentencepiece==0.2.3 numpy==2.4.6 safetensors==0.8.0)
key="$(printf '%s\n' "${pins[@]}" "llama-cpp-python==$LCP_VERSION" "$tost_python" | sha256sum | cut -c1-16)"
venv="$peers/venv-$key"
if [[ ! -f "$venv/.complete" ]]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  # Reuse the project venv's torch (and its numpy/safetensors) at the lowest priority: packages
  # installed here shadow it, and pip never touches an environment outside its own.
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  tost_site="$("$tost_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$tost_site" > "$site/zz-tost-torch.pth"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet "${pins[@]}"
  # convert_hf_to_gguf.py must use the gguf-py of the same llama.cpp commit, not PyPI's gguf.
  "$venv/bin/python" -m pip install --quiet --no-deps "$llama/gguf-py"
  "$venv/bin/python" -c 'import torch, transformers, ctranslate2, gguf; print("torch", torch.__version__, "transformers", transformers.__version__, "ctranslate2", ctranslate2.__version__)'
  touch "$venv/.complete"
fi

"$server" --version 2>&1 | sed -n '1,2p' >&2 || true
{
  echo "PEERS_LLAMA_SERVER=$server"
  echo "PEERS_LLAMA_CPP=$llama"
  echo "PEERS_PYTHON=$venv/bin/python"
  if [[ -x "$server_avx2" ]]; then echo "PEERS_LLAMA_SERVER_AVX2=$server_avx2"; fi
} | tee "$peers/peers.env"
