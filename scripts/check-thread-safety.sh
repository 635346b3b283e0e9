#!/usr/bin/env bash
# Runs clang's thread-safety analysis over the serving engine, the generation call
# (service/generation), the session store's Redis client (service/store: its connection pool), the
# gRPC and HTTP front ends (service/api, service/http and the OpenAI routes of service/openai_http),
# metrics and logging (service/observability) and, given
# XGrammar's source tree, structured output's grammar cache (service/structured): GCC ignores the
# ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED annotations, so without this pass they are
# comments. Syntax only (no code is generated). gRPC, Boost, prometheus-cpp and nlohmann/json are
# Debian's system headers; the generated protos come from the build tree.
# Usage: check-thread-safety.sh GENERATED_PROTO_DIR [XGRAMMAR_SOURCE_DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
gen_dir="${1:?usage: $0 GENERATED_PROTO_DIR [XGRAMMAR_SOURCE_DIR]}"
xgrammar_dir="${2:-}"
status=0
dirs=(service/engine service/store service/generation service/api service/http service/openai_http service/observability)
includes=(-I. -isystem "$gen_dir")
# What the build defines for these folders: tost_http's Asio and Beast configuration (public, so
# every includer of its headers sees the same types), and tost_api's version string for KServe's
# server metadata (any value: the analysis does not read it).
defines=(-DBOOST_ASIO_NO_DEPRECATED -DBOOST_BEAST_USE_STD_STRING_VIEW '-DTOST_SERVE_VERSION="0"')
# service/structured includes XGrammar's headers: without its source tree (a configure that left
# tost::xgrammar out) the folder is not built, and not checked either.
if [ -n "$xgrammar_dir" ]; then
  dirs+=(service/structured)
  # The engine's constraint compiler (service/engine/constraints.cc) uses it under this define.
  includes+=(-isystem "$xgrammar_dir/include" -isystem "$xgrammar_dir/3rdparty/dlpack/include"
             -DTOST_WITH_STRUCTURED=1)
fi
sources=()
for d in "${dirs[@]}"; do sources+=("$d"/*.cc); done
# One clang per core: each source is checked on its own, and the front ends' (Beast, gRPC) take
# seconds each.
printf '%s\0' "${sources[@]}" |
  xargs -0 -n 1 -P "$(nproc 2>/dev/null || echo 2)" clang++ -std=c++20 -fsyntax-only -Wthread-safety \
    -Wthread-safety-beta -Werror "${includes[@]}" "${defines[@]}" || status=1
[ "$status" -eq 0 ] && echo "thread-safety analysis: ${#sources[@]} sources of ${dirs[*]} clean"
exit "$status"
