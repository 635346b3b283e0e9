#!/usr/bin/env bash
# Runs 6 and 7 (the tag): tools/bench/fairshare.py's noisy and priority runs, with the server's timing trailer,
# in five configurations: the server and the clients on every core (as runs 1-5); the server
# pinned to core 0 and the clients (the measuring process and a's load process) to core 1; pinned
# so, with the server's step-loop thread at nice 10 (whether letting gRPC's threads preempt a step
# helps); pinned, with each of a's prompts its own (prefilled, not a prefix-cache hit), at the
# default --prefill_chunk_tokens (128) and at 16. Waits (up to $WAIT_S seconds) for a quiet
# machine: a 1-minute load average below $QUIET_LOAD (0.7) and no compiler running; then runs
# under the build lock, so that no build starts meanwhile. Each output file starts with
# the command, the commit, the server binary's sha256, the CPU flags and the load before and after.
#   bash docs/perf/2026-11-29-fairshare/run6.sh [tag]
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/perf/2026-11-29-fairshare
tag=${1:-run6}
PY=${PY:-/opt/tost-deps/py-9c7413bbe85e35c8/bin/python}
WAIT_S=${WAIT_S:-1800}
deadline=$((SECONDS + WAIT_S))
quiet() {
  local load
  load=$(cut -d' ' -f1 /proc/loadavg)
  [[ $(pgrep -c cc1plus || true) == 0 ]] && awk -v l="$load" -v q="${QUIET_LOAD:-0.7}" 'BEGIN { exit !(l < q) }'
}
until quiet; do
  if ((SECONDS > deadline)); then echo "no quiet minute within ${WAIT_S}s: $(uptime)"; exit 1; fi
  sleep 10
done
run() {  # name, extra args
  local name=$1
  shift
  local cmd=("$PY" tools/bench/fairshare.py --runs noisy,priority "$@" --out "$out/$tag-$name.json")
  {
    echo "command: flock /tmp/tost-build.lock ${cmd[*]}"
    echo "commit: $(git rev-parse HEAD) ($(git status --short --untracked-files=no | wc -l) files of others' work uncommitted in the tree)"
    echo "server binary sha256: $(sha256sum build/service/tost_server | cut -d' ' -f1)"
    echo "cpu flags: $(grep -o 'avx[^ ]*\|amx[^ ]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
    echo "compilers running before: $(pgrep -c cc1plus || true)"
    echo "uptime before: $(uptime)"
    "${cmd[@]}"
    echo "uptime after: $(uptime)"
  } >"$out/$tag-$name.txt" 2>&1
}
export -f run quiet
export PY out tag
flock /tmp/tost-build.lock bash -c 'run shared-cores && run pinned --server-cpus 0 --client-cpus 1 &&
  run pinned-nice10 --server-cpus 0 --client-cpus 1 --step-thread-nice 10 &&
  run pinned-unique --server-cpus 0 --client-cpus 1 --a-unique-prompts &&
  run pinned-unique-chunk16 --server-cpus 0 --client-cpus 1 --a-unique-prompts \
    --server-arg=--prefill_chunk_tokens=16'
for f in shared-cores pinned pinned-nice10 pinned-unique pinned-unique-chunk16; do
  grep -E "^(uptime|\{)" "$out/$tag-$f.txt"
done
