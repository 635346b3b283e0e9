#!/usr/bin/env bash
# Installs everything tost-serve needs on a fresh Debian 12 machine. Idempotent: a second run on a
# machine that has everything does no network work and takes about a second.
#
#   Debian packages : compilers' companions (ccache, ninja), gRPC 1.51 + protobuf 3.21, Abseil,
#                     prometheus-cpp, GoogleTest/Benchmark, image codecs, Prometheus (tests),
#                     Redis and hiredis (the shared session store and its client).
#   Python packages : requirements.txt into a virtual environment under
#                     $TOST_DEPS_DIR/py-<hash of requirements.txt> (default TOST_DEPS_DIR=/opt/tost-deps),
#                     so a fresh clone with the same pins reuses the multi-gigabyte torch wheel;
#                     requirements-deploy.txt (the offline Kubernetes/compose/YAML validators of
#                     tests/deploy) into its own small venv $TOST_DEPS_DIR/deploy-<hash>, so changing
#                     a validator's pin never rebuilds the torch venv; requirements-test.txt (small
#                     test clients) on top of the torch venv, keyed by its own hash.
#                     `build/deps.env` is written with both venvs' paths for the Makefile and CMake.
#   Debian sources  : Abseil's, the version libabsl-dev has, unpacked with Debian's patches into
#                     $TOST_DEPS_DIR/src/abseil_<version> (apt-get source; a deb-src entry for the
#                     release is added to apt when apt has none): scripts/run-sanitizers.sh
#                     compiles it with -fsanitize=thread, since Debian's libabsl is not instrumented.
#   PyPI sources    : XGrammar's sdist (xgrammar==0.2.8, its sha256 pinned below), unpacked with
#                     third_party/xgrammar/patches/*.patch applied into
#                     $TOST_DEPS_DIR/src/xgrammar-<version>-<hash of the patches>, whose C++ core
#                     cmake/TostXGrammar.cmake compiles (the structured-output grammars).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps_dir="${TOST_DEPS_DIR:-/opt/tost-deps}"

apt_packages=(
  build-essential cmake ninja-build ccache pkg-config git
  dpkg-dev  # apt-get source (Abseil's source for the ThreadSanitizer build)
  clang clang-format  # the thread-safety analysis pass and the format check (ctest)
  libclang-rt-dev  # libFuzzer + ASan/UBSan runtimes for scripts/run-fuzzers.sh (clang only recommends it)
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev googletest libgtest-dev libgmock-dev libbenchmark-dev
  libpng-dev libturbojpeg0-dev libssl-dev nlohmann-json3-dev python3-yaml
  libpcre2-dev  # GPT-2 pre-tokenisation (Unicode properties and look-ahead, which RE2 lacks)
  libboost-context-dev  # fibers of the CUDA kernel emulator (tests/kernels/emulator)
  # Boost.Beast/Asio (header-only) under the HTTP front end and /metrics (service/http): asynchronous,
  # a timeout per operation (so slow clients are cut off without a thread each), maintained, and in
  # Debian. 1.74 is Debian 12's; libboost1.81-dev cannot be installed beside it.
  libboost1.74-dev
  prometheus
  nginx-light  # the L7 gRPC proxy (grpc_pass) in front of several replicas in the failover tests
  gettext-base  # envsubst: deploy/proxy/entrypoint.sh renders the edge proxy's nginx.conf with it
  redis-server  # the shared session store the store tests start on loopback
  libhiredis-dev  # the client of that store: connections, command encoding, reply parsing
  patch  # third_party/xgrammar/patches, applied to XGrammar's source when it is unpacked
  patchelf  # scripts/gpu-bundle.sh: the bundled binaries find their libraries beside them ($ORIGIN)
  util-linux  # setpriv: ctest unprivileged_permission_tests drops the capabilities that bypass permissions
  r-cran-janeaustenr  # public-domain corpus of tools/train_lm.py (Jane Austen's novels)
)

sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: apt packages missing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -q
  # prometheus', nginx's and redis-server's postinst scripts start daemons (nginx on port 80, Redis
  # on 6379); the tests only need the binaries and start their own instances, so services are kept
  # from starting while installing (policy-rc.d exit 101: "action forbidden"), unless the machine
  # already has a policy of its own.
  policy=/usr/sbin/policy-rc.d
  own_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo_cmd tee "$policy" >/dev/null
    $sudo_cmd chmod +x "$policy"
    own_policy=1
  fi
  status=0
  $sudo_cmd apt-get install -y -q --no-install-recommends "${missing[@]}" || status=$?
  [ "$own_policy" = 1 ] && $sudo_cmd rm -f "$policy"
  [ "$status" = 0 ] || exit "$status"
fi

absl_version="$(dpkg-query -W -f='${Version}' libabsl-dev)"
absl_src="$deps_dir/src/abseil_$absl_version"
if [ ! -f "$absl_src/.complete" ]; then
  echo "install-deps: fetching Debian's source of abseil $absl_version into $absl_src"
  if ! apt-cache showsrc abseil 2>/dev/null | grep -qx "Version: $absl_version"; then
    codename="$(. /etc/os-release && echo "$VERSION_CODENAME")"
    $sudo_cmd tee /etc/apt/sources.list.d/tost-deb-src.sources >/dev/null <<SOURCES
# Source packages, for tost-serve's scripts/install-deps.sh (Abseil's source: sanitizer builds).
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: $codename $codename-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: $codename-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
    $sudo_cmd apt-get update -q
  fi
  mkdir -p "$deps_dir/src"
  tmp="$(mktemp -d "$deps_dir/src/.abseil.XXXXXX")"
  # Verified against the archive's signed Sources index; dpkg-source applies Debian's patches
  # (its absl/base/options.h: Abseil's own types, inline namespace debian3).
  (cd "$tmp" && apt-get source -q "abseil=$absl_version" 2>&1 |
    { grep -v '^W: Download is performed unsandboxed' || true; })
  rm -rf "$absl_src"
  mv "$tmp"/abseil-*/ "$absl_src"
  rm -rf "$tmp"
  touch "$absl_src/.complete"
fi

# XGrammar's source distribution from PyPI (its C++ core; the Python package is not used). The
# tarball is kept under $deps_dir/dist once its hash matched the pin; the unpacked, patched tree is
# keyed by the patches' content, so editing, adding or removing a patch unpacks a fresh tree.
xgrammar_version=0.2.8
xgrammar_sha256=8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80
shopt -s nullglob
xgrammar_patches=("$here"/third_party/xgrammar/patches/*.patch)
shopt -u nullglob
xgrammar_patch_hash="$(for p in "${xgrammar_patches[@]}"; do
  basename "$p"; sha256sum <"$p"; done | sha256sum | cut -c1-12)"
xgrammar_src="$deps_dir/src/xgrammar-$xgrammar_version-$xgrammar_patch_hash"
if [ ! -f "$xgrammar_src/.complete" ]; then
  xgrammar_tarball="$deps_dir/dist/xgrammar-$xgrammar_version.tar.gz"
  mkdir -p "$deps_dir/dist" "$deps_dir/src"
  if [ ! -f "$xgrammar_tarball" ] ||
    [ "$(sha256sum <"$xgrammar_tarball" | cut -d' ' -f1)" != "$xgrammar_sha256" ]; then
    echo "install-deps: downloading the xgrammar $xgrammar_version sdist from PyPI"
    # The release's JSON names the sdist's URL; a mirror that lacks the per-release endpoint
    # still serves the project's JSON, which lists every release's files.
    python3 - "$xgrammar_version" "$xgrammar_tarball.part" <<'PY'
import json
import sys
import urllib.error
import urllib.parse
import urllib.request

version, out = sys.argv[1], sys.argv[2]


def sdist_url():
    release_api = f"https://pypi.org/pypi/xgrammar/{version}/json"
    for api in (release_api, "https://pypi.org/pypi/xgrammar/json"):
        try:
            with urllib.request.urlopen(api, timeout=60) as response:
                meta = json.load(response)
        except urllib.error.HTTPError as error:
            if error.code == 404:
                continue
            raise
        files = meta["urls"] if api == release_api else meta["releases"].get(version, [])
        for entry in files:
            if entry["packagetype"] == "sdist":
                return urllib.parse.urljoin(api, entry["url"])
    sys.exit(f"install-deps: PyPI lists no sdist for xgrammar=={version} (expected a .tar.gz)")


with urllib.request.urlopen(sdist_url(), timeout=300) as response, open(out, "wb") as f:
    while chunk := response.read(1 << 20):
        f.write(chunk)
PY
    received="$(sha256sum <"$xgrammar_tarball.part" | cut -d' ' -f1)"
    if [ "$received" != "$xgrammar_sha256" ]; then
      rm -f "$xgrammar_tarball.part"
      echo "install-deps: the xgrammar $xgrammar_version sdist has sha256 $received," \
        "expected $xgrammar_sha256 (pinned in scripts/install-deps.sh)" >&2
      exit 1
    fi
    mv "$xgrammar_tarball.part" "$xgrammar_tarball"
  fi
  echo "install-deps: unpacking xgrammar $xgrammar_version with ${#xgrammar_patches[@]} patch(es) into $xgrammar_src"
  tmp="$(mktemp -d "$deps_dir/src/.xgrammar.XXXXXX")"
  tar -xzf "$xgrammar_tarball" -C "$tmp"
  for p in "${xgrammar_patches[@]}"; do
    if ! patch -d "$tmp/xgrammar-$xgrammar_version" -p1 --batch --forward --quiet <"$p"; then
      rm -rf "$tmp"
      echo "install-deps: $(basename "$p") does not apply to xgrammar $xgrammar_version's sdist" >&2
      exit 1
    fi
  done
  rm -rf "$xgrammar_src"
  mv "$tmp/xgrammar-$xgrammar_version" "$xgrammar_src"
  rm -rf "$tmp"
  touch "$xgrammar_src/.complete"
fi

python_bin="${TOST_PYTHON:-$(command -v python3.11 || command -v python3)}"
# make_venv PREFIX REQUIREMENTS [NOTE]: a venv at $deps_dir/PREFIX-<hash of REQUIREMENTS>, built
# once (a .complete marker), so a fresh clone with the same pins reuses it; prints its path.
make_venv() {
  local prefix=$1 requirements=$2 note=${3:-}
  local dir
  dir="$deps_dir/$prefix-$(sha256sum "$requirements" | cut -c1-16)"
  if [ ! -f "$dir/.complete" ]; then
    echo "install-deps: creating $dir from $(basename "$requirements")$note" >&2
    mkdir -p "$deps_dir"
    rm -rf "$dir"
    "$python_bin" -m venv "$dir"
    "$dir/bin/python" -m pip install -q --upgrade pip >&2
    "$dir/bin/python" -m pip install -q --no-cache-dir -r "$requirements" >&2
    touch "$dir/.complete"
  fi
  echo "$dir"
}
venv="$(make_venv py "$here/requirements.txt" " (the torch wheel is large: minutes on a cold machine)")"
deploy_venv="$(make_venv deploy "$here/requirements-deploy.txt")"
# requirements-test.txt on top of the torch venv, once per version of that file.
test_marker="$venv/.test-requirements-$(sha256sum "$here/requirements-test.txt" | cut -c1-16)"
if [ ! -f "$test_marker" ]; then
  echo "install-deps: installing requirements-test.txt into $venv"
  "$venv/bin/python" -m pip install -q --no-cache-dir -r "$here/requirements-test.txt"
  touch "$test_marker"
fi

mkdir -p "$here/build"
torch_cmake="$("$venv/bin/python" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "share", "cmake"))')"
cat > "$here/build/deps.env" <<ENV
TOST_VENV=$venv
TOST_PYTHON=$venv/bin/python
TOST_TORCH_CMAKE_PREFIX=$torch_cmake
TOST_DEPLOY_VENV=$deploy_venv
TOST_XGRAMMAR_SOURCE_DIR=$xgrammar_src
ENV
echo "install-deps: ok (venv $venv)"
