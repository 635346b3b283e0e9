#!/usr/bin/env bash
# Compiler launcher of the CUDA kernels (kernels/cuda/CMakeLists.txt): runs the compile it is given
# (the ccache launcher and nvcc, with -Xptxas=-v) and keeps ptxas' resource report of the object it
# writes beside it, as <object>.ptxas.txt, instead of printing it into the build log; any other
# output (warnings, errors) still goes to stderr. The cuda_ptxas_no_spills check reads these reports
# (tools/ptxas_report.py), so the kernels are compiled once, as they ship, not a second time for
# the check. ccache replays the report with a cached object.
#   scripts/ptxas-report-launcher.sh COMPILER-COMMAND... -o OBJECT ...
set -uo pipefail
object=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [[ ${args[i]} == -o ]] && object="${args[i + 1]:-}"
done
if [[ -z $object ]]; then
  exec "$@"  # not a compile (a link or a probe): nothing to keep
fi
err="$(mktemp)"
"$@" 2>"$err"
status=$?
# ptxas' -v report: its "ptxas info    : ..." lines and the indented "N bytes stack frame, N bytes
# spill stores, N bytes spill loads" line under each function; the rest is the compiler's to show.
report='^ptxas info|^ +[0-9]+ bytes stack frame'
grep -E "$report" "$err" >"$object.ptxas.txt"
grep -vE "$report" "$err" >&2
rm -f "$err"
exit "$status"
