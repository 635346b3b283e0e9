#!/usr/bin/env bash
# Runs clang's thread-safety analysis over the serving engine, the session store's Redis client
# (service/store: its connection pool) and, given XGrammar's source tree, structured output's grammar
# cache (service/structured): GCC ignores the ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED
# annotations, so without this pass they are comments. Syntax only (no code is generated).
# Usage: check-thread-safety.sh GENERATED_PROTO_DIR [XGRAMMAR_SOURCE_DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
gen_dir="${1:?usage: $0 GENERATED_PROTO_DIR [XGRAMMAR_SOURCE_DIR]}"
xgrammar_dir="${2:-}"
status=0
sources=(service/engine/*.cc service/store/*.cc)
includes=(-I. -isystem "$gen_dir")
dirs="service/engine and service/store"
# service/structured includes XGrammar's headers: without its source tree (a configure that left
# tost::xgrammar out) the folder is not built, and not checked either.
if [ -n "$xgrammar_dir" ]; then
  sources+=(service/structured/*.cc)
  # The engine's constraint compiler (service/engine/constraints.cc) uses it under this define.
  includes+=(-isystem "$xgrammar_dir/include" -isystem "$xgrammar_dir/3rdparty/dlpack/include"
             -DTOST_WITH_STRUCTURED=1)
  dirs="service/engine, service/store and service/structured"
fi
for f in "${sources[@]}"; do
  clang++ -std=c++20 -fsyntax-only -Wthread-safety -Wthread-safety-beta -Werror "${includes[@]}" "$f" ||
    status=1
done
[ "$status" -eq 0 ] && echo "thread-safety analysis: ${#sources[@]} sources of $dirs clean"
exit "$status"
