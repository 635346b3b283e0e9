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
# shellcheck source=docs/perf/2026-11-29-fairshare/lib.sh
source "$out/lib.sh"
wait_quiet
flock /tmp/tost-build.lock bash -c 'run shared-cores noisy,priority && run pinned noisy,priority --server-cpus 0 --client-cpus 1 &&
  run pinned-nice10 noisy,priority --server-cpus 0 --client-cpus 1 --step-thread-nice 10 &&
  run pinned-unique noisy,priority --server-cpus 0 --client-cpus 1 --a-unique-prompts &&
  run pinned-unique-chunk16 noisy,priority --server-cpus 0 --client-cpus 1 --a-unique-prompts \
    --server-arg=--prefill_chunk_tokens=16'
for f in shared-cores pinned pinned-nice10 pinned-unique pinned-unique-chunk16; do
  grep -E "^(uptime|\{)" "$out/$tag-$f.txt"
done
