#!/usr/bin/env bash
# Fails, printing each offending line, when a source under the given paths includes a header the
# layer must not see: what keeps a library's boundary where its CMake target draws it, before a
# build without the forbidden dependency fails. Registered by tost_forbid_includes (cmake/
# TostCommon.cmake).
#   scripts/forbid-includes.sh EXTENDED_REGEX PATH...
set -euo pipefail
regex="${1:?usage: forbid-includes.sh EXTENDED_REGEX PATH...}"
shift
(($#)) || { echo "forbid-includes.sh: no path to check" >&2; exit 2; }
for path in "$@"; do
  # A moved or renamed folder must not turn the check into one that cannot fail.
  [[ -e $path ]] || { echo "forbid-includes.sh: $path does not exist" >&2; exit 2; }
done
if found="$(grep -rnE --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh' \
  "$regex" "$@")"; then
  echo "forbidden includes:"
  echo "$found"
  exit 1
fi
echo "no forbidden include in: $*"
