#!/usr/bin/env bash
# Fails when a tracked C++, CUDA or tost proto file is not formatted by .clang-format (Google style,
# 100 columns). Fix with: scripts/check-format.sh --fix
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' 'proto/tost/*.proto')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
if ! clang-format --dry-run -Werror "${files[@]}" 2>/tmp/clang-format-check.$$; then
  grep -E '^[^ ].*: error:' /tmp/clang-format-check.$$ | cut -d: -f1 | sort -u | sed 's/^/not formatted: /'
  rm -f /tmp/clang-format-check.$$
  echo "run scripts/check-format.sh --fix (clang-format $(clang-format --version | grep -o '[0-9][0-9.]*' | head -1))"
  exit 1
fi
rm -f /tmp/clang-format-check.$$
echo "clang-format: ${#files[@]} files formatted"
