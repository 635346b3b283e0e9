#!/usr/bin/env bash
# Builds the LibTorch-free code and its tests under sanitizers and runs them, printing each stage's
# time. Two builds of the project, each configured with -DTOST_TORCH_FREE_ONLY=ON (no LibTorch,
# CUDA or gRPC; cmake/TostSanitize.cmake) and compiled with GCC (the compiler of the main build;
# clang's sanitizers already run in scripts/run-fuzzers.sh):
#
#   asan  -DTOST_SANITIZE=address,undefined (-fno-sanitize-recover=all: the first report ends the
#         process): the LibTorch-free libraries' tests (tost_torch_free_tests: base/, config,
#         safetensors, tokenizers, sampler, image decoding), the engine's (tost_engine_tests), the
#         generation call's and the OpenAI protocol layer's (tost_generation_tests), the
#         session store's Redis client's (tost_store_tests, on real redis-server processes), and
#         the committed fuzz seeds replayed through every fuzz target (tests/sanitize: npy, image
#         decoding, safetensors, config.json, session blobs, both tokenizers, the request input
#         layer, gzip/deflate inflation, the OpenAI-compatible and the Responses request bodies;
#         constraint_compile only where XGrammar is built with the sanitizer). Leaks are reported
#         too.
#   tsan  -DTOST_SANITIZE=thread: the engine's tests (dynamic batcher, generation scheduler,
#         session store and codec on the fake models of tests/service/engine), repeated, shuffled;
#         the Redis client's (its connection pool under concurrent callers), 3 times, shuffled.
#         Debian's Abseil is not instrumented (its absl::Mutex is invisible to TSan, so everything
#         it orders looks racy): this script compiles the same Debian source version (fetched by
#         scripts/install-deps.sh with apt-get source) with -fsanitize=thread and caches the
#         install in $TOST_DEPS_DIR/absl-tsan-<hash of version, compiler and flags> (default
#         TOST_DEPS_DIR=/opt/tost-deps), so only the first run builds it. GoogleTest is built
#         with the sanitizer in both builds; protobuf, OpenSSL, libpng, libjpeg-turbo and PCRE2
#         stay Debian's (their own synchronisation is pthread's, which TSan intercepts).
#
#   scripts/run-sanitizers.sh [--only asan|tsan] [--out DIR] [--jobs N] [--repeat N] [--build-only]
#
#   --only asan|tsan  one of the two (default: both, asan first)
#   --out DIR         build directories DIR/asan and DIR/tsan (default: build-asan and build-tsan;
#                     the ctests sanitize_asan_ubsan and sanitize_tsan use build/sanitize)
#   --jobs N          parallel compile jobs (default: the number of CPUs)
#   --repeat N        runs of the engine's tests under TSan, shuffled (default 10)
#   --build-only      configure and compile, run nothing
#   CXX, CC           the compilers (default g++ and gcc); ccache is used when installed.
#
# A sanitizer report fails the script and prints the end of the binary's log (DIR/logs/<name>.log,
# where the whole report is). Reports in third-party code only are suppressed by exact frame in
# tests/sanitize/tsan.supp, each with the reason; our own code's are fixed, never suppressed.
#
# By hand, after a run: rerun one test under its sanitizer with its build's binary, e.g.
#   build-tsan/tests/service/tost_engine_tests --gtest_filter='SchedulerTest.*'
# (the sanitizer options this script sets are printed at its start; TSan reads its suppressions
# from TSAN_OPTIONS), or `ctest --test-dir build-asan` for the whole asan build, one test at a time.
#
# Time on the 2-core CI machine (../shared/tools/fresh-ci; docs/testing.md, "Sanitizers"): cold (no
# ccache, no cached Abseil) asan 335 s, tsan 162 s (Abseil 64 s of it); warm asan 26 s, tsan 6 s.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

only=""
out=""
jobs="$(nproc 2>/dev/null || echo 2)"
repeat=10
build_only=0
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    --only) only="${2:?--only needs asan or tsan}"; shift 2 ;;
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --jobs) jobs="${2:?--jobs needs a count}"; shift 2 ;;
    --repeat) repeat="${2:?--repeat needs a count}"; shift 2 ;;
    --build-only) build_only=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "run-sanitizers: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
case "$only" in "" | asan | tsan) ;; *) echo "run-sanitizers: --only takes asan or tsan" >&2; exit 2 ;; esac
[[ "$jobs" =~ ^[1-9][0-9]*$ && "$repeat" =~ ^[1-9][0-9]*$ ]] || {
  echo "run-sanitizers: --jobs and --repeat take positive whole numbers" >&2
  exit 2
}
if [ -n "$out" ]; then
  asan_dir="$out/asan"
  tsan_dir="$out/tsan"
else
  asan_dir="$repo/build-asan"
  tsan_dir="$repo/build-tsan"
fi

cxx="$(command -v "${CXX:-g++}")" && cc="$(command -v "${CC:-gcc}")" || {
  echo "run-sanitizers: ${CXX:-g++} or ${CC:-gcc} not found" >&2
  exit 1
}
command -v ninja >/dev/null || { echo "run-sanitizers: ninja not found (scripts/install-deps.sh)" >&2; exit 1; }
deps_dir="${TOST_DEPS_DIR:-/opt/tost-deps}"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:history_size=4:suppressions=$repo/tests/sanitize/tsan.supp}"
export TOST_SOURCE_DIR="$repo"

failed=()
# stage NAME COMMAND...: runs COMMAND, printing its time; a failure is recorded and returned.
stage() {
  local name=$1 t0 rc=0
  shift
  t0=$(date +%s)
  echo "=== [sanitize] $name"
  "$@" || rc=$?
  if ((rc)); then
    echo "=== [sanitize] $name FAILED (exit $rc) after $(($(date +%s) - t0)) s"
    failed+=("$name")
  else
    echo "=== [sanitize] $name took $(($(date +%s) - t0)) s"
  fi
  return "$rc"
}

# configure DIR CMAKE_ARGS...: a LibTorch-free build in DIR, quiet unless it fails.
configure() {
  local dir=$1
  shift
  mkdir -p "$dir/logs"
  # Another compiler than the cached one: start afresh (CMake would drop the other options).
  if [ -f "$dir/CMakeCache.txt" ] && ! grep -qx "CMAKE_CXX_COMPILER:[A-Z]*=$cxx" "$dir/CMakeCache.txt"; then
    rm -rf "$dir/CMakeCache.txt" "$dir/CMakeFiles"
  fi
  cmake -S "$repo" -B "$dir" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" \
    -DTOST_TORCH_FREE_ONLY=ON "$@" >"$dir/logs/configure.log" 2>&1 || {
    tail -n 40 "$dir/logs/configure.log"
    return 1
  }
}

# build DIR TARGET...: compiles, printing the failures only.
build() {
  local dir=$1
  shift
  cmake --build "$dir" -j "$jobs" ${1:+--target "$@"} >"$dir/logs/build.log" 2>&1 || {
    grep -E -A20 '^FAILED: ' "$dir/logs/build.log" | head -n 100
    echo "(full log: $dir/logs/build.log)"
    return 1
  }
  echo "$(grep -c 'Building CXX' "$dir/logs/build.log" || true) objects compiled (ccache hits included)"
}

# run_one DIR NAME COMMAND...: one test binary under its sanitizer; a line per binary, and the end
# of its log when it fails (a sanitizer report, a failed test).
run_one() {
  local dir=$1 name=$2 t0 ms rc=0 summary
  shift 2
  t0=$(date +%s%N)
  (cd "$repo" && "$@") >"$dir/logs/$name.log" 2>&1 || rc=$?
  ms=$((($(date +%s%N) - t0) / 1000000))
  summary="$(grep -E '^\[==========\] .* ran\.|^replayed ' "$dir/logs/$name.log" | tail -n 1 || true)"
  printf '  %-24s %4d.%d s  %s  %s\n' "$name" $((ms / 1000)) $((ms % 1000 / 100)) \
    "$( ((rc)) && echo "FAILED (exit $rc)" || echo ok)" "${summary#\[==========\] }"
  # Every skip with its reason (gtest's "file:line: Skipped" and the line after it), once however
  # often --gtest_repeat ran it: the log stays under DIR/logs, the skip must show in CI's.
  grep -A1 -E ': Skipped$' "$dir/logs/$name.log" | grep -v -- '^--$' | paste -d' ' - - | sort |
    uniq -c | while read -r times line; do echo "    skipped (${times}x): ${line:0:240}"; done || true
  if ((rc)); then
    echo "---- $name: end of $dir/logs/$name.log"
    grep -v -E '^\[ +(RUN|OK) +\]|^replay: ' "$dir/logs/$name.log" | tail -n 80 | cut -c1-300
    # A replay that failed names its input on the last replay: line.
    grep -E '^replay: ' "$dir/logs/$name.log" | tail -n 1
    return 1
  fi
}

asan_tests() {
  local d=$asan_dir status=0
  run_one "$d" tost_torch_free_tests "$d/tests/tost_torch_free_tests" --gtest_brief=1 \
    --gtest_filter='-Parity*' || status=1
  run_one "$d" tost_engine_tests "$d/tests/service/tost_engine_tests" --gtest_brief=1 || status=1
  run_one "$d" tost_generation_tests "$d/tests/service/tost_generation_tests" --gtest_brief=1 ||
    status=1
  run_one "$d" tost_store_tests "$d/tests/service/store/tost_store_tests" --gtest_brief=1 || status=1
  # Every fuzz target's replay (tests/sanitize/CMakeLists.txt) over its committed seeds.
  local replay t
  for replay in "$d"/tests/sanitize/*_replay; do
    t="$(basename "$replay" _replay)"
    run_one "$d" "${t}_replay" "$replay" "$repo/tests/fuzz/corpus/$t" || status=1
  done
  return "$status"
}

# Debian's Abseil source (the version libabsl-dev has, unpacked with Debian's patches by
# scripts/install-deps.sh), compiled with -fsanitize=thread into a cache keyed by everything that
# changes the objects. Sets absl_prefix.
absl_flags="-O1 -g -fno-omit-frame-pointer -fsanitize=thread"
tsan_abseil() {
  local version src key build
  version="$(dpkg-query -W -f='${Version}' libabsl-dev 2>/dev/null)" || {
    echo "run-sanitizers: libabsl-dev is not installed (scripts/install-deps.sh)" >&2
    return 1
  }
  src="$deps_dir/src/abseil_$version"
  if [ ! -f "$src/.complete" ]; then
    echo "no Debian source of abseil $version in $src: running scripts/install-deps.sh"
    bash "$repo/scripts/install-deps.sh" || return 1
    [ -f "$src/.complete" ] || { echo "run-sanitizers: install-deps.sh did not fetch $src" >&2; return 1; }
  fi
  # Debian's own configuration (debian/rules: static, C++17), the sanitizer's flags, and what
  # makes the objects differ: the source version, the compiler and this recipe's revision.
  local cmake_args=(-DCMAKE_BUILD_TYPE= "-DCMAKE_CXX_FLAGS=$absl_flags" "-DCMAKE_C_FLAGS=$absl_flags"
                    -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=OFF -DBUILD_TESTING=OFF
                    -DABSL_PROPAGATE_CXX_STD=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON
                    -DCMAKE_INSTALL_LIBDIR=lib)
  key="$(printf '%s\n' "recipe 1" "abseil $version" "$(command -v "$cxx")" "$("$cxx" --version | head -n 1)" \
    "${cmake_args[@]}" | sha256sum | cut -c1-16)"
  absl_prefix="$deps_dir/absl-tsan-$key"
  if [ -f "$absl_prefix/.complete" ]; then
    echo "cached: $absl_prefix (abseil $version, $absl_flags)"
    return 0
  fi
  mkdir -p "$deps_dir"
  # One builder at a time (a ctest and a run by hand may start together); the loser finds it cached.
  exec 9>"$deps_dir/.absl-tsan.lock"
  flock 9
  if [ ! -f "$absl_prefix/.complete" ]; then
    echo "building abseil $version with $absl_flags into $absl_prefix"
    build="$(mktemp -d "$deps_dir/.absl-tsan-build.XXXXXX")"
    local launcher=()
    command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
    rm -rf "$absl_prefix"  # an interrupted install: .complete is written last
    cmake -S "$src" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" \
      "${launcher[@]}" "${cmake_args[@]}" -DCMAKE_INSTALL_PREFIX="$absl_prefix" \
      >"$build/configure.log" 2>&1 &&
      cmake --build "$build" -j "$jobs" >"$build/build.log" 2>&1 &&
      cmake --install "$build" >"$build/install.log" 2>&1 &&
      touch "$absl_prefix/.complete"
    if [ ! -f "$absl_prefix/.complete" ]; then
      tail -n 40 "$build"/*.log
      echo "run-sanitizers: building abseil failed (logs in $build)" >&2
      flock -u 9
      return 1
    fi
    echo "$(grep -c 'Building CXX' "$build/build.log" || true) objects compiled"
    rm -rf "$build"
  fi
  flock -u 9
}

tsan_tests() {
  local d=$tsan_dir
  local status=0
  run_one "$d" tost_engine_tests "$d/tests/service/tost_engine_tests" --gtest_brief=1 \
    --gtest_repeat="$repeat" --gtest_shuffle || status=1
  # Each repetition starts real redis-server processes: fewer than the engine's.
  run_one "$d" tost_store_tests "$d/tests/service/store/tost_store_tests" --gtest_brief=1 \
    --gtest_filter='RedisClient*:RedisSessionStore*:RedisPrefixTier*' --gtest_repeat=3 --gtest_shuffle || status=1
  return "$status"
}

t_all=$(date +%s)
echo "run-sanitizers: $cxx, $jobs jobs; ASAN_OPTIONS=$ASAN_OPTIONS UBSAN_OPTIONS=$UBSAN_OPTIONS" \
  "TSAN_OPTIONS=$TSAN_OPTIONS"
if [ "$only" != tsan ]; then
  if stage "asan: configure" configure "$asan_dir" -DTOST_SANITIZE=address,undefined &&
     stage "asan: build" build "$asan_dir" && ((!build_only)); then
    stage "asan: tests" asan_tests || true
  fi
fi
if [ "$only" != asan ]; then
  if stage "tsan: abseil" tsan_abseil &&
     stage "tsan: configure" configure "$tsan_dir" -DTOST_SANITIZE=thread \
       -Dabsl_DIR="$absl_prefix/lib/cmake/absl" &&
     stage "tsan: build" build "$tsan_dir" tost_engine_tests tost_store_tests && ((!build_only)); then
    stage "tsan: tests" tsan_tests || true
  fi
fi
echo "run-sanitizers: total $(($(date +%s) - t_all)) s"
if ((${#failed[@]})); then
  echo "run-sanitizers: FAILED: ${failed[*]}" >&2
  exit 1
fi
