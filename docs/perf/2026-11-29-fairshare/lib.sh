# shellcheck shell=bash
# Sourced by run6.sh and run8.sh: waits for a quiet machine, and runs tools/bench/fairshare.py
# with the provenance every raw file starts with. Needs $out and $tag set.
PY=${PY:-/opt/tost-deps/py-9c7413bbe85e35c8/bin/python}
WAIT_S=${WAIT_S:-1800}
quiet() {
  local load
  load=$(cut -d' ' -f1 /proc/loadavg)
  [[ $(pgrep -c cc1plus || true) == 0 ]] && awk -v l="$load" -v q="${QUIET_LOAD:-0.7}" 'BEGIN { exit !(l < q) }'
}
wait_quiet() {  # a 1-minute load average below $QUIET_LOAD (0.7) and no compiler running
  local deadline=$((SECONDS + WAIT_S))
  until quiet; do
    if ((SECONDS > deadline)); then echo "no quiet minute within ${WAIT_S}s: $(uptime)"; exit 1; fi
    sleep 10
  done
}
run() {  # name, runs (fairshare.py --runs), extra args
  local name=$1 runs=$2
  shift 2
  local cmd=("$PY" tools/bench/fairshare.py --runs "$runs" "$@" --out "$out/$tag-$name.json")
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
