#!/usr/bin/env bash
# The whole tree configures on a machine without promtool, nginx, redis-server and redis-cli, and
# with TOST_WERROR=OFF no compile line of the project's own targets carries -Werror: what a lent GPU
# machine (no Debian packages, a newer compiler) needs. Configures a scratch build directory with
# the tools hidden behind paths that do not exist, then checks the configure log, the tests it
# registered and the compile lines it generated (no -Werror; -g1, the default TOST_DEBUG_INFO), and
# that an unknown TOST_DEBUG_INFO stops the configure with a message naming it. The configure is
# told that the three tools may be missing (TOST_EXPECTED_TESTS_WITHOUT): its ctest expected_tests
# must pass there, and the same check without that leave must fail, naming the tests left out.
#   scripts/check-configure-options.sh --out DIR [cmake arguments...]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ ${1:-} != --out || -z ${2:-} ]]; then
  echo "usage: scripts/check-configure-options.sh --out DIR [cmake arguments...]; got: $*" >&2
  exit 2
fi
out="$2"
shift 2
rm -rf "$out"
log="$out.log"
if ! cmake -S "$here" -B "$out" "$@" -DTOST_WERROR=OFF -DTOST_PROMTOOL=/nonexistent/promtool \
  -DTOST_NGINX=/nonexistent/nginx -DTOST_REDIS_SERVER=/nonexistent/redis-server \
  -DTOST_REDIS_CLI=/nonexistent/redis-cli "-DTOST_EXPECTED_TESTS_WITHOUT=promtool;nginx;redis" \
  >"$log" 2>&1; then
  tail -n 40 "$log"
  echo "FAIL: the tree does not configure without promtool, nginx and redis (log: $log)"
  exit 1
fi
failed=0
for expected in "the tests prometheus_rules and prometheus_config are left out" \
  "the tests failover_sigkill_and_restart, failover_sigterm_drain, failover_tost_cli_resume and grpc_edge_proxy_flood are left out" \
  "the tests shared_sessions_replicas and shared_sessions_store_failures are left out" \
  "the tests responses_shared_end_to_end and request_tracing_end_to_end are left out"; do
  if ! tr -s ' \n' ' ' <"$log" | grep -qF "$expected"; then
    echo "FAIL: the configure log does not say '$expected' (log: $log)"
    failed=1
  fi
done
registered="$(ctest --test-dir "$out" -N | grep -E 'Test +#[0-9]+: (prometheus_|failover_|shared_sessions_|responses_shared_|grpc_edge_proxy_|request_tracing_)' || true)"
if [[ -n $registered ]]; then
  echo "FAIL: tests that need promtool, nginx or redis are registered without them:"
  echo "$registered"
  failed=1
fi
# The expected-tests check (scripts/check-expected-tests.py) in the mode this configure asked for
# passes, and without it fails on exactly the tests the tools' absence left out.
if ! expected="$(ctest --test-dir "$out" -R '^expected_tests$' --output-on-failure 2>&1)" ||
   ! grep -q "100% tests passed" <<<"$expected"; then
  echo "FAIL: ctest expected_tests does not pass in a configure told that promtool, nginx and redis may be missing:"
  echo "$expected" | tail -n 30
  failed=1
fi
python="$(sed -n 's/^TOST_PYTHON:[A-Z]*=//p' "$out/CMakeCache.txt")"
strict="$("${python:-python3}" "$here/scripts/check-expected-tests.py" --build "$out" 2>&1)" && strict_status=0 || strict_status=$?
missing="$(grep -oE '^FAIL: missing: [a-z_]+' <<<"$strict" | sed 's/^FAIL: missing: //' | sort | tr '\n' ' ')"
want="failover_sigkill_and_restart failover_sigterm_drain failover_tost_cli_resume grpc_edge_proxy_flood prometheus_config prometheus_rules request_tracing_end_to_end responses_shared_end_to_end shared_sessions_replicas shared_sessions_store_failures "
if [[ $strict_status == 0 || $missing != "$want" ]]; then
  echo "FAIL: without --without, check-expected-tests.py should fail naming exactly: $want; it exited $strict_status:"
  echo "$strict" | tail -n 30
  failed=1
fi
if grep -qE -- '-Werror( |=|,)' "$out/build.ninja"; then
  echo "FAIL: TOST_WERROR=OFF, yet a compile line has -Werror:"
  grep -oE -- '[^ ]*-Werror[^ ]*' "$out/build.ninja" | sort | uniq -c
  failed=1
fi
# Debug information: line tables by default (TOST_DEBUG_INFO=lines), and a value it does not know
# is refused at configure time, naming the option and what it takes.
if ! grep -qE -- ' -g1( |$)' "$out/build.ninja"; then
  echo "FAIL: TOST_DEBUG_INFO defaults to lines, yet no compile line has -g1"
  failed=1
fi
if cmake -S "$here" -B "$out-bad" "$@" -DTOST_DEBUG_INFO=everything >"$out-bad.log" 2>&1; then
  echo "FAIL: the tree configured with TOST_DEBUG_INFO=everything"
  failed=1
elif ! grep -q "TOST_DEBUG_INFO must be lines or full, got 'everything'" "$out-bad.log"; then
  echo "FAIL: TOST_DEBUG_INFO=everything was refused without saying why (log: $out-bad.log)"
  failed=1
fi
rm -rf "$out-bad" "$out-bad.log"
if [[ $failed == 1 ]]; then
  echo "(the build directory $out and its configure log $log are kept)"
  exit 1
fi
rm -rf "$out" "$log"
echo "configures without promtool, nginx and redis (their tests left out, saying so; expected_tests passes when told so and fails when not), without -Werror, with line-table debug info by default, and refuses an unknown TOST_DEBUG_INFO"
