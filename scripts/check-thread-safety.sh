#!/usr/bin/env bash
# Runs clang's thread-safety analysis over the serving engine and the session store's Redis client
# (service/store: its connection pool): GCC ignores the ABSL_GUARDED_BY /
# ABSL_EXCLUSIVE_LOCKS_REQUIRED annotations, so without this pass they are comments. Syntax only
# (no code is generated). Usage: check-thread-safety.sh GENERATED_PROTO_DIR
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
gen_dir="${1:?usage: $0 GENERATED_PROTO_DIR}"
status=0
sources=(service/engine/*.cc service/store/*.cc)
for f in "${sources[@]}"; do
  clang++ -std=c++20 -fsyntax-only -Wthread-safety -Wthread-safety-beta -Werror -I. -isystem "$gen_dir" "$f" ||
    status=1
done
[ "$status" -eq 0 ] && echo "thread-safety analysis: ${#sources[@]} sources of service/engine and service/store clean"
exit "$status"
