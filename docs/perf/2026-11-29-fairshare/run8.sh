#!/usr/bin/env bash
# Runs 8 and 9 (the tag): a neighbour that really prefills (each of a's prompts its own), with the
# prefill that gives way (--prefill_yield_tokens 16; the window was 1 s in run 8's binary, 60 s,
# --prefill_yield_window_s, in run 9's) and without it (--prefill_yield_tokens=0), the same binary
# side by side; the same with the
# server and the clients sharing both cores; a decode-only neighbour (a's one prompt, a
# prefix-cache hit); and the 1:1 and 3:1 splits, to see that they hold with the pieces. Waits for a
# quiet machine as run6.sh does, and runs under the build lock.
#   bash docs/perf/2026-11-29-fairshare/run8.sh [tag]
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/perf/2026-11-29-fairshare
tag=${1:-run8}
# shellcheck source=docs/perf/2026-11-29-fairshare/lib.sh
source "$out/lib.sh"
wait_quiet
pinned=(--server-cpus 0 --client-cpus 1)
export PINNED="${pinned[*]}"
# shellcheck disable=SC2016  # expanded by the inner bash, where run and PINNED are exported
flock /tmp/tost-build.lock bash -c '
  run pinned-unique noisy,priority $PINNED --a-unique-prompts &&
  run pinned-unique-noyield noisy,priority $PINNED --a-unique-prompts --server-arg=--prefill_yield_tokens=0 &&
  run shared-cores-unique noisy,priority --a-unique-prompts &&
  run pinned noisy,priority $PINNED &&
  run pinned-split equal,weighted $PINNED'
for f in pinned-unique pinned-unique-noyield shared-cores-unique pinned pinned-split; do
  grep -E "^(uptime|\{)" "$out/$tag-$f.txt"
done
