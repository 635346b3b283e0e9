#!/usr/bin/env bash
# On a machine without a CUDA device, the GPU tests report themselves as skipped by their exit
# status (77, their SKIP_RETURN_CODE), and ctest reports each as skipped: neither passed nor failed.
# Runs each --binary and expects 77 and the line naming why, then runs ctest on the build directory
# that registers the tests and reads its report. Where a device exists this check does not apply:
# it exits 77 itself.
#   scripts/check-gpu-skips.sh [--ctest CTEST] [--binary PATH]... CTEST_DIR TEST...
set -euo pipefail
ctest_bin=ctest
binaries=()
while [[ ${1:-} == --* ]]; do
  case $1 in
    --ctest) ctest_bin="$2" ;;
    --binary) binaries+=("$2") ;;
    *)
      echo "check-gpu-skips: unknown option $1" >&2
      exit 2
      ;;
  esac
  shift 2
done
if [[ $# -lt 2 ]]; then
  echo "usage: scripts/check-gpu-skips.sh [--ctest CTEST] [--binary PATH]... CTEST_DIR TEST...; got: $*" >&2
  exit 2
fi
ctest_dir="$1"
shift
if [[ -e /dev/nvidia0 ]] || nvidia-smi -L >/dev/null 2>&1; then
  echo "a CUDA device is present (/dev/nvidia0 or nvidia-smi): the GPU tests run here, nothing to check"
  exit 77
fi
failed=0
for binary in "${binaries[@]}"; do
  set +e
  output="$("$binary" 2>&1)"
  status=$?
  set -e
  if [[ $status != 77 ]]; then
    echo "FAIL: $binary exited $status without a CUDA device, expected 77; its output:"
    echo "$output" | tail -n 20
    failed=1
  elif ! grep -q "skipped: no CUDA device" <<<"$output"; then
    echo "FAIL: $binary exited 77 without saying 'skipped: no CUDA device'; its output:"
    echo "$output" | tail -n 20
    failed=1
  else
    echo "$binary: exit status 77 ($(head -n 1 <<<"$output"))"
  fi
done
names="$(IFS='|'; echo "$*")"
set +e
report="$("$ctest_bin" --test-dir "$ctest_dir" -R "^($names)\$" 2>&1)"
status=$?
set -e
for name in "$@"; do
  line="$(grep -E "Test +#[0-9]+: $name " <<<"$report" || true)"
  if [[ -z $line ]]; then
    echo "FAIL: ctest in $ctest_dir did not run $name; its report:"
    echo "$report"
    failed=1
  elif [[ $line != *"***Skipped"* ]]; then
    echo "FAIL: ctest reports $name as other than skipped: $line"
    failed=1
  else
    echo "ctest: $line"
  fi
done
if [[ $status != 0 ]]; then
  echo "FAIL: ctest exited $status (skipped tests are not failures); its report:"
  echo "$report"
  failed=1
fi
exit "$failed"
