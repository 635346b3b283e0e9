#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (AddressSanitizer + UndefinedBehavior-
# Sanitizer) and runs each for a bounded time from a copy of its committed seed corpus
# (tests/fuzz/corpus/<name>), printing per target its executions, coverage and time. A crash, a
# sanitizer report, a failed property check, a timeout or running out of memory fails the script
# and prints the reproducer.
#
#   scripts/run-fuzzers.sh [--out DIR] [--time SECONDS] [--runs N] [--target NAME]... [--jobs N]
#                          [--xgrammar DIR] [--build-only] [--list]
#
#   --out DIR      work directory: objects, binaries, generated protobuf code, the corpus copies
#                  (DIR/corpus/<name>, refreshed from the seeds every run), logs and crash
#                  reproducers (DIR/artifacts/<name>/). Default: build-fuzz
#   --time S       seconds per target (libFuzzer -max_total_time; default 30)
#   --runs N       executions per target (libFuzzer -runs; default 100000; 0: no limit). A
#                  target stops at whichever of --time and --runs comes first. The two parsers
#                  of OpenAI-compatible request bodies (openai_request, responses_request) share
#                  one target's budget: each runs half of --time and of --runs.
#   --target NAME  run only this target (repeatable; default: all of them, see --list)
#   --jobs N       parallel compile jobs (default: the number of CPUs)
#   --xgrammar DIR XGrammar's patched source tree, which the constraint_compile target compiles
#                  with the same sanitizers (default: $TOST_XGRAMMAR_SOURCE_DIR, else the one
#                  build/deps.env records). Without one that target is left out, saying so (named
#                  with --target, it fails).
#   --build-only   compile and stop
#   FUZZ_CXX       the clang++ to use (default clang++); ccache is used when installed.
#
# Reproduce a finding: DIR/<name>_fuzz DIR/artifacts/<name>/crash-... (from the repository root).
# Everything is compiled directly with clang++ (the main build uses GCC, which has no libFuzzer);
# the fuzzed code is LibTorch-free. The compile is incremental (ninja, with header dependencies).
# XGrammar's C++ core (constraint_compile) is compiled from its source as cmake/TostXGrammar.cmake
# lists it, with coverage and the sanitizers: a finding inside it is reported like one in ours.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

all_targets=(npy image_decode safetensors config session_codec bpe_tokenizer gpt2_tokenizer
             request_input inflate openai_request responses_request constraint_compile)

out=build-fuzz
max_time=30
max_runs=100000
jobs="$(nproc 2>/dev/null || echo 2)"
build_only=0
xgrammar="${TOST_XGRAMMAR_SOURCE_DIR:-}"
targets=()
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --time) max_time="${2:?--time needs seconds}"; shift 2 ;;
    --runs) max_runs="${2:?--runs needs a count}"; shift 2 ;;
    --target) targets+=("${2:?--target needs a name}"); shift 2 ;;
    --jobs) jobs="${2:?--jobs needs a count}"; shift 2 ;;
    --xgrammar) xgrammar="${2:?--xgrammar needs a directory}"; shift 2 ;;
    --build-only) build_only=1; shift ;;
    --list) printf '%s\n' "${all_targets[@]}"; exit 0 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "run-fuzzers: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
for t in ${targets[@]+"${targets[@]}"}; do
  [[ " ${all_targets[*]} " == *" $t "* ]] || {
    echo "run-fuzzers: no target '$t' (targets: ${all_targets[*]})" >&2
    exit 2
  }
done
# XGrammar's source (cmake/TostXGrammar.cmake compiles the same tree into the main build).
[ -n "$xgrammar" ] || xgrammar="$(sed -n 's/^TOST_XGRAMMAR_SOURCE_DIR=//p' "$repo/build/deps.env" 2>/dev/null || true)"
if [ -n "$xgrammar" ] && [ ! -f "$xgrammar/.complete" ]; then
  echo "run-fuzzers: $xgrammar is not a complete XGrammar source tree (no .complete marker; run scripts/install-deps.sh)" >&2
  exit 1
fi
if [ -z "$xgrammar" ]; then
  if [[ " ${targets[*]-} " == *" constraint_compile "* ]]; then
    echo "run-fuzzers: constraint_compile needs XGrammar's source: pass --xgrammar DIR (scripts/install-deps.sh unpacks it)" >&2
    exit 2
  fi
  echo "run-fuzzers: constraint_compile is left out: no XGrammar source (--xgrammar, TOST_XGRAMMAR_SOURCE_DIR or build/deps.env)"
  all_targets=("${all_targets[@]/constraint_compile/}")
  mapfile -t all_targets < <(printf '%s\n' "${all_targets[@]}" | grep .)
fi
((${#targets[@]})) || targets=("${all_targets[@]}")
[[ "$max_time" =~ ^[0-9]+$ && "$max_runs" =~ ^[0-9]+$ && "$jobs" =~ ^[1-9][0-9]*$ ]] || {
  echo "run-fuzzers: --time, --runs and --jobs take whole numbers" >&2
  exit 2
}

mkdir -p "$out"
out="$(cd "$out" && pwd)"
case "$out/" in
  "$repo/tests/fuzz/"*) echo "run-fuzzers: --out must not be inside tests/fuzz" >&2; exit 2 ;;
esac

# --- toolchain -------------------------------------------------------------------------------------
cxx="${FUZZ_CXX:-clang++}"
command -v "$cxx" >/dev/null || { echo "run-fuzzers: $cxx not found (scripts/install-deps.sh installs clang)" >&2; exit 1; }
command -v ninja >/dev/null || { echo "run-fuzzers: ninja not found (scripts/install-deps.sh installs ninja-build)" >&2; exit 1; }
command -v protoc >/dev/null || { echo "run-fuzzers: protoc not found (protobuf-compiler)" >&2; exit 1; }
# ccache as the main build uses it (cmake/TostCommon.cmake): paths relative to the repository, so
# that a fresh clone at another path hits the cache.
launcher=""
command -v ccache >/dev/null &&
  launcher="env CCACHE_BASEDIR=$repo CCACHE_NOHASHDIR=true CCACHE_SLOPPINESS=include_file_mtime,include_file_ctime,time_macros ccache "
if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' |
    "$cxx" -x c++ - -fsanitize=fuzzer,address,undefined -o "$out/.toolchain-check" 2>"$out/.toolchain-check.log"; then
  cat "$out/.toolchain-check.log" >&2
  echo "run-fuzzers: $cxx cannot link libFuzzer with ASan/UBSan: install libclang-rt-dev (scripts/install-deps.sh)" >&2
  exit 1
fi
rm -f "$out/.toolchain-check" "$out/.toolchain-check.log"

pc_modules=(absl_status absl_statusor absl_strings absl_str_format absl_flat_hash_map absl_hash
            absl_time absl_synchronization protobuf libpng libturbojpeg libpcre2-8 libcrypto zlib)
pc_cflags="$(pkg-config --cflags "${pc_modules[@]}")"
pc_libs="$(pkg-config --libs "${pc_modules[@]}")"

gen="$out/gen"
sanitize="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
# -gline-tables-only: a report's file and line, without -g's full debug info (and its compile time).
cxxflags="-std=c++20 -O1 -gline-tables-only -fno-omit-frame-pointer $sanitize -I$repo -isystem $gen $pc_cflags"

# --- build graph -----------------------------------------------------------------------------------
# Sources each target links besides its own tests/fuzz/<name>_fuzz.cc. Everything fuzzed is
# LibTorch-free (model/config/safetensors.cc included: only nlohmann-json and Abseil).
declare -A deps=(
  [npy]="client/npy.cc"
  [image_decode]="imaging/image_decode.cc model/config/config.cc model/config/device.cc base/file_util.cc base/utf8.cc model/config/json_utf8.cc"
  [safetensors]="model/config/safetensors.cc base/file_util.cc base/utf8.cc model/config/json_utf8.cc"
  [config]="model/config/config.cc model/config/device.cc base/file_util.cc base/utf8.cc model/config/json_utf8.cc"
  [session_codec]="service/engine/session_codec.cc model/sampling/sampler.cc model/config/config.cc model/config/device.cc base/file_util.cc base/utf8.cc model/config/json_utf8.cc gen/tost/v1/session_state.pb.cc"
  [bpe_tokenizer]="model/text/bpe_tokenizer.cc base/utf8.cc model/config/json_utf8.cc"
  [gpt2_tokenizer]="model/text/gpt2_tokenizer.cc base/utf8.cc model/config/json_utf8.cc"
  [inflate]="service/api/inflate.cc"
  [request_input]="service/api/request_input.cc imaging/image_decode.cc model/config/config.cc model/config/device.cc base/file_util.cc base/utf8.cc model/config/json_utf8.cc gen/tost/v1/tost.pb.cc gen/kserve/v2/grpc_service.pb.cc"
  [constraint_compile]="service/structured/constraint.cc service/structured/compiled_constraint.cc service/structured/constraint_matcher.cc service/structured/grammar_vocabulary.cc model/text/tokenizer.cc model/text/bpe_tokenizer.cc model/text/gpt2_tokenizer.cc model/config/config.cc model/config/device.cc base/file_util.cc base/utf8.cc model/config/json_utf8.cc base/nesting.cc base/error_detail.cc"
  [openai_request]="service/openai/request.cc service/openai/client_identifiers.cc service/openai/tool_call_stream.cc service/openai/json_fields.cc service/structured/constraint.cc service/openai/chat_template.cc service/openai/error.cc service/openai/response.cc service/engine/text_stream.cc model/text/tokenizer.cc model/text/bpe_tokenizer.cc model/text/gpt2_tokenizer.cc model/config/config.cc model/config/device.cc base/file_util.cc base/utf8.cc model/config/json_utf8.cc base/nesting.cc"
  [responses_request]="service/openai/responses_request.cc service/openai/client_identifiers.cc service/openai/responses_body.cc service/openai/conversation_record.cc service/openai/json_fields.cc service/openai/error.cc base/utf8.cc model/config/json_utf8.cc base/nesting.cc"
)
# XGrammar's sources, as cmake/TostXGrammar.cmake lists them (read from there, so the two builds
# cannot drift), named xgrammar/cpp/<file> here; its flags are the main build's, plus coverage and
# the sanitizers. -gline-tables-only: file and line in the reports, a fraction of -g's compile time.
xgrammar_flags=""
xgrammar_include=""
if [ -n "$xgrammar" ]; then
  mapfile -t xgrammar_sources < <(sed -n '/^set(_tost_xgrammar_sources/,/)/p' "$repo/cmake/TostXGrammar.cmake" |
    grep -oE '[A-Za-z0-9_/]+\.cc')
  ((${#xgrammar_sources[@]} > 10)) || {
    echo "run-fuzzers: could not read XGrammar's sources from cmake/TostXGrammar.cmake" >&2
    exit 1
  }
  for f in "${xgrammar_sources[@]}"; do deps[constraint_compile]+=" xgrammar/cpp/$f"; done
  xgrammar_include="-isystem $xgrammar/include -isystem $xgrammar/3rdparty/dlpack/include"
  xgrammar_flags="-std=c++17 -w -gline-tables-only -DXGRAMMAR_ENABLE_CPPTRACE=0 -DXGRAMMAR_ENABLE_INTERNAL_CHECK=0 -I$xgrammar/cpp -isystem $xgrammar/3rdparty/picojson $xgrammar_include"
fi
protos=(tost/v1/session_state tost/v1/tost kserve/v2/grpc_service)
gen_headers=""
for p in "${protos[@]}"; do gen_headers+=" gen/$p.pb.h"; done

src_path() {  # as ninja names them
  case "$1" in
    gen/*) echo "$1" ;;
    xgrammar/*) echo "$xgrammar/${1#xgrammar/}" ;;
    *) echo "$repo/$1" ;;
  esac
}
obj_path() { echo "obj/${1%.cc}.o"; }
{
  echo "# Generated by scripts/run-fuzzers.sh; rewritten on every run."
  echo "cxx = $launcher$cxx"
  echo "cxxflags = $cxxflags"
  echo "ldflags = -fsanitize=fuzzer $sanitize"
  echo "libs = $pc_libs"
  echo "rule protoc"
  echo "  command = protoc --proto_path=$repo/proto --cpp_out=$gen \$proto"
  echo "  description = protoc \$proto"
  echo "rule cxx"
  echo "  command = \$cxx \$cxxflags \$extra -MD -MF \$out.d -c \$in -o \$out"
  echo "  depfile = \$out.d"
  echo "  deps = gcc"
  echo "  description = clang++ \$in"
  echo "rule link"
  echo "  command = \$cxx \$ldflags \$in -o \$out \$libs"
  echo "  description = link \$out"
  for p in "${protos[@]}"; do
    echo "build gen/$p.pb.cc gen/$p.pb.h: protoc $repo/proto/$p.proto"
    echo "  proto = $repo/proto/$p.proto"
  done
  declare -A seen=()
  for t in "${all_targets[@]}"; do
    objs=""
    for s in tests/fuzz/${t}_fuzz.cc ${deps[$t]}; do
      o="$(obj_path "$s")"
      objs+=" $o"
      [ -n "${seen[$s]:-}" ] && continue
      seen[$s]=1
      # Library code gets coverage instrumentation without libFuzzer's main; targets likewise
      # (-fsanitize=fuzzer is given at link time).
      echo "build $o: cxx $(src_path "$s") ||$gen_headers"
      case "$s" in
        tests/fuzz/constraint_compile_fuzz.cc) echo "  extra = -fsanitize=fuzzer-no-link -Wall -Wextra $xgrammar_include" ;;
        tests/fuzz/*) echo "  extra = -fsanitize=fuzzer-no-link -Wall -Wextra" ;;
        service/structured/*) echo "  extra = -fsanitize=fuzzer-no-link $xgrammar_include" ;;
        xgrammar/*) echo "  extra = -fsanitize=fuzzer-no-link $xgrammar_flags" ;;
        *) echo "  extra = -fsanitize=fuzzer-no-link" ;;
      esac
    done
    echo "build ${t}_fuzz: link$objs"
  done
} >"$out/build.ninja.new"
mv "$out/build.ninja.new" "$out/build.ninja"

bins=()
for t in "${targets[@]}"; do bins+=("${t}_fuzz"); done
echo "run-fuzzers: building ${targets[*]} in $out ($cxx, ASan+UBSan${launcher:+, ccache}," \
  "$jobs jobs)"
t_build=$(date +%s)
# -k 0: a source that does not compile (say, one being edited) fails its own targets only; the
# others still run, and the script fails at the end.
failed=()
if ! ninja -C "$out" -j "$jobs" -k 0 "${bins[@]}" >"$out/build.log" 2>&1; then
  grep -E -A12 '^FAILED: ' "$out/build.log" | head -n 80
  built=()
  for t in "${targets[@]}"; do
    if ninja -C "$out" -n "${t}_fuzz" 2>/dev/null | grep -q 'no work to do'; then
      built+=("$t")
    else
      failed+=("$t (build)")
    fi
  done
  echo "run-fuzzers: build failed for ${failed[*]} (full log: $out/build.log)" >&2
  targets=("${built[@]}")
fi
echo "run-fuzzers: built in $(($(date +%s) - t_build)) s"
((build_only)) && exit $((${#failed[@]} > 0))

# --- run -------------------------------------------------------------------------------------------
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:allocator_may_return_null=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
if command -v llvm-symbolizer >/dev/null; then
  export ASAN_SYMBOLIZER_PATH="${ASAN_SYMBOLIZER_PATH:-$(command -v llvm-symbolizer)}"
else
  ASAN_OPTIONS+=":allow_addr2line=1"
  UBSAN_OPTIONS+=":allow_addr2line=1"
fi
export TOST_SOURCE_DIR="$repo"

# Targets that share one target's budget (time and executions), each taking 1/N of it: the chat
# and completions bodies and the Responses and Conversations bodies go through the same JSON
# parse and field readers (service/openai/json_fields.cc), and the stage's time stays what it was
# with one of them.
declare -A budget_share=([openai_request]=2 [responses_request]=2)
printf '%-18s %10s %8s %8s %8s %7s  %s\n' target executions exec/s cov ft time result
t_all=$(date +%s)
for t in ${targets[@]+"${targets[@]}"}; do
  seeds="$repo/tests/fuzz/corpus/$t"
  corpus="$out/corpus/$t"
  artifacts="$out/artifacts/$t"
  log="$out/logs/$t.log"
  rm -rf "$corpus"
  mkdir -p "$corpus" "$artifacts" "$out/logs"
  [ -d "$seeds" ] && cp -R "$seeds/." "$corpus/"
  dict=()
  [ -f "$repo/tests/fuzz/$t.dict" ] && dict=("-dict=$repo/tests/fuzz/$t.dict")
  share="${budget_share[$t]:-1}"
  runs=$(((max_runs + share - 1) / share))
  ((runs > 0)) || runs=-1
  secs_max=$(((max_time + share - 1) / share))
  t0=$(date +%s)
  rc=0
  "$out/${t}_fuzz" -max_total_time="$secs_max" -runs="$runs" -print_final_stats=1 \
    -rss_limit_mb=2048 -timeout=25 -artifact_prefix="$artifacts/" "${dict[@]}" "$corpus" \
    >"$log" 2>&1 || rc=$?
  secs=$(($(date +%s) - t0))
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
  rate=""
  [ -n "$execs" ] && rate=$((execs / (secs > 0 ? secs : 1)))
  status_line="$(grep -E '^#[0-9]+.* cov: ' "$log" | tail -n 1 || true)"
  cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$status_line")"
  ft="$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$status_line")"
  result=ok
  if ((rc != 0)); then
    result="FAILED (exit $rc)"
    failed+=("$t")
  fi
  printf '%-18s %10s %8s %8s %8s %6ss  %s\n' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" \
    "$secs" "$result"
  if ((rc != 0)); then
    echo "---- $t: last lines of $log"
    grep -v -E '^#[0-9]+|NEW_FUNC' "$log" | tail -n 60 | cut -c1-400
    reproducer="$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)"
    if [ -n "$reproducer" ]; then
      echo "---- $t: reproducer $reproducer"
      echo "     run it again: (cd $repo && $out/${t}_fuzz $reproducer)"
    fi
  fi
done
echo "run-fuzzers: ${#targets[@]} target(s) run in $(($(date +%s) - t_all)) s, ${max_time} s / ${max_runs} executions each (${!budget_share[*]}: a share each); logs in $out/logs"
if ((${#failed[@]})); then
  echo "run-fuzzers: FAILED: ${failed[*]}" >&2
  exit 1
fi
