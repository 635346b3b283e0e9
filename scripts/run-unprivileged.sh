#!/usr/bin/env bash
# Runs GoogleTest cases that need a process that file permissions deny, and fails unless every one
# of them ran and passed. A file or folder of mode 000 denies an ordinary user but not root, whose
# CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH bypass permissions: those cases skip themselves where
# mode 000 does not deny them, and CI runs as root. As root this script runs each binary through
# setpriv (util-linux) with both capabilities dropped from its bounding and inheritable sets, so
# they are gone for good in that process; as any other user, as that user.
#
# Why not setpriv --reuid=nobody: that user must then reach the binary, the libraries of the build
# tree and the shipped models, and a checkout under a private folder (a fresh-ci clone in a mktemp
# directory of mode 700) is out of its reach. Root without those two capabilities reads what its
# uid owns through the owner's permission bits, and nothing of mode 000.
#
#   scripts/run-unprivileged.sh BINARY FILTER [BINARY FILTER]...
#
#   FILTER   a --gtest_filter of exact case names (Suite.Case:Suite.Case); each must run and pass:
#            a case skipped, missing or failed fails the script.
set -euo pipefail
if (($# == 0 || $# % 2)); then
  echo "usage: scripts/run-unprivileged.sh BINARY FILTER [BINARY FILTER]...; got: $*" >&2
  exit 2
fi

drop=()
if (($(id -u) == 0)); then
  command -v setpriv >/dev/null || {
    echo "run-unprivileged: setpriv not found (util-linux; scripts/install-deps.sh installs it)" >&2
    exit 1
  }
  drop=(setpriv --bounding-set=-dac_override,-dac_read_search --inh-caps=-dac_override,-dac_read_search)
  # The drop itself needs CAP_SETPCAP; prove it took before trusting a pass.
  probe="$(mktemp)"
  trap 'rm -f "$probe"' EXIT
  chmod 000 "$probe"
  if ! "${drop[@]}" true; then
    echo "run-unprivileged: setpriv could not drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (no CAP_SETPCAP?)" >&2
    exit 1
  fi
  if "${drop[@]}" cat "$probe" 2>/dev/null; then
    echo "run-unprivileged: a file of mode 000 is still readable after dropping the capabilities" >&2
    exit 1
  fi
  echo "running as root without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (setpriv): mode 000 denies it"
else
  echo "running as $(id -un) (uid $(id -u)), not root: mode 000 denies this user"
fi

failed=0
while (($#)); do
  binary=$1 filter=$2
  shift 2
  IFS=: read -r -a cases <<<"$filter"
  set +e
  output="$("${drop[@]}" "$binary" "--gtest_filter=$filter" 2>&1)"
  status=$?
  set -e
  ran="$(sed -n 's/^\[==========\] \([0-9]*\) tests\{0,1\} from .* ran\..*/\1/p' <<<"$output" | tail -n 1)"
  passed="$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\{0,1\}\..*/\1/p' <<<"$output" | tail -n 1)"
  if ((status != 0)) || grep -q '^\[  SKIPPED \]' <<<"$output" ||
     [[ ${ran:-0} != "${#cases[@]}" || ${passed:-0} != "${#cases[@]}" ]]; then
    echo "FAIL: $(basename "$binary") --gtest_filter=$filter: exit status $status, ${ran:-no} case(s) ran," \
      "${passed:-none} passed, ${#cases[@]} expected to pass (none skipped); its output:"
    tail -n 40 <<<"$output"
    failed=1
  else
    echo "$(basename "$binary"): ${passed} case(s) passed: $filter"
  fi
done
exit "$failed"
