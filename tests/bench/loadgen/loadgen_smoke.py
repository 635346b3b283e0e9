#!/usr/bin/env python3
"""Smoke test of tost_loadgen against the real tost_server on the shipped models: a closed-loop
classify/generate mix, an open-loop run with a .npy input, and a streaming run with token-id
prompts, a couple of seconds each. Each JSON report must show successful calls of every workload
asked for, no failed ones, consistent percentiles and positive throughputs."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

# tools/pylib/tost_launch.py: starting tost_server, waiting for its listening line, stopping it.
sys.path.insert(0, os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                                 "tools", "pylib")))
import tost_launch  # noqa: E402


def check(report: dict, workloads, label: str) -> None:
    def fail(why):
        sys.exit(f"{label}: {why}\n{json.dumps(report, indent=2)}")

    if report["total"]["errors"] != 0:
        fail(f"expected no failed calls, got {report['total']['errors']}")
    for w in workloads:
        s = report["workloads"].get(w)
        if not s or s["ok"] < 1:
            fail(f"expected successful {w} calls")
        lat = s["latency_ms"]
        if not (0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]):
            fail(f"{w}: expected 0 < p50 <= p90 <= p99 <= max, got {lat}")
        if s["requests_per_s"] <= 0:
            fail(f"{w}: expected a positive request rate")
        if w == "classify" and s["images_per_s"] <= 0:
            fail("classify: expected positive images/s")
        if w == "generate":
            if s["tokens"] < s["ok"] or s["tokens_per_s"] <= 0:
                fail(f"generate: expected at least one token per call, got {s['tokens']} for {s['ok']} calls")
            if not (0 < s["ttft_ms"]["p50"] <= lat["max"]) or s["itl_ms"]["count"] < 1:
                fail("generate: expected TTFT below the call latency and inter-token samples")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server_bin", required=True)
    ap.add_argument("--loadgen_bin", required=True)
    ap.add_argument("--models", required=True)
    args = ap.parse_args()
    try:
        server = tost_launch.TostServer(args.models, binary=args.server_bin, metrics=False, intra_op_threads=None,
                                        log_requests=False, name="loadgen_smoke_server", stop_timeout_s=60,
                                        remove_log=True)
    except tost_launch.StartError as e:
        sys.exit(str(e))
    with server:
        target = f"--target={server.address}"
        npy = os.path.join(args.models, "tost-digits", "samples", "3_0.npy")
        runs = [
            ("closed-loop mix", ["--workload=classify:3,generate:1", "--concurrency=4", "--max_new_tokens=8"],
             ["classify", "generate"]),
            ("open-loop classify", ["--workload=classify", "--rate_per_s=50", "--arrivals=uniform",
                                    f"--input_npy={npy}", "--batch_size=2"], ["classify"]),
            ("streaming token ids", ["--workload=generate", "--concurrency=2", "--prompt_tokens=16",
                                     "--max_new_tokens=16", "--cpu=0"], ["generate"]),
        ]
        for label, extra, workloads in runs:
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                argv = [args.loadgen_bin, target, "--duration_s=2", "--warmup_s=0.5", f"--json={out.name}", *extra]
                r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
                print(f"== {label}\n{r.stdout}{r.stderr}", end="")
                if r.returncode != 0:
                    sys.exit(f"{label}: tost_loadgen exited {r.returncode}")
                check(json.load(open(out.name)), workloads, label)
        # A bad flag is refused with what was expected.
        r = subprocess.run([args.loadgen_bin, target, "--workload=embed"], capture_output=True, text=True)
        if r.returncode == 0 or "expected \"classify\" or \"generate\"" not in r.stderr:
            sys.exit(f"expected --workload=embed to be refused, got {r.returncode}: {r.stderr}")
    print("loadgen smoke: OK")


if __name__ == "__main__":
    main()
