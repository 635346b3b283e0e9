#!/usr/bin/env python3
"""Runs every performance measurement (targets P1–P6, docs/performance.md) twice and reports the spread between the runs:

  P1, P2  tssa_bench (kernel and layer benchmarks; its stdout is parsed into JSON)
  P4      tost_generation_bench --positions=... (decode latency vs position, ToST vs KV cache; also
          its P5 arithmetic and its 64-vs-1-stream P6 figure)
  P3      tools/bench/p3_classify.py (tost_server vs in-process forward vs a Python gRPC server)
  P5      tools/bench/p5_session_memory.py (measured RSS growth per idle session vs per KV cache)
  P6      tools/bench/p6_streams.py (tokens/s and inter-token latency at 1..128 streams)

Results go to --out-dir: run1/ and run2/ (one JSON per step, raw logs), summary.json (each headline
figure of both runs and their relative spread, flagged above 10%), and plots/ (tools/plot_perf.py).
--quick shrinks every step to check the tooling in a few minutes; its figures mean nothing.

  tools/perf_report.py --build-dir build --out-dir build/perf/$(date +%F)
  tools/perf_report.py --build-dir build-perf --quick --out-dir /tmp/perf-quick
  tools/perf_report.py --out-dir build/perf/DATE --summarize-only   # summary and plots again
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "bench"))
import benchlib  # noqa: E402

STEPS = ("tssa", "generation", "p3", "p5", "p6")
P4_POSITIONS = "100,500,1000,2000,3000,4000"


def parse_tssa(text: str) -> dict:
    """The P1 and P2 tables of tssa_bench's output."""
    out = {"p1": [], "p2a": [], "p2b": []}
    section = None
    for line in text.splitlines():
        if line.startswith("P1 "):
            section = "p1"
        elif line.startswith("P2a"):
            section = "p2a"
        elif line.startswith("P2b"):
            section = "p2b"
        elif line and not line.startswith(" "):
            section = None  # any other heading ends the table
        m = re.search(r"DRAM bandwidth of these threads.*?: ([\d.]+) GB/s", line)
        if m:
            out["dram_gb_s"] = float(m.group(1))
        if section == "p1":
            m = re.match(r"\s+(\d+)\s+(\d+) \|\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x\s+([\d.]+)\s+(\d+)%", line)
            if m:
                out["p1"].append({"B": int(m.group(1)), "N": int(m.group(2)), "ref_ms": float(m.group(3)),
                                  "fused_ms": float(m.group(4)), "speedup": float(m.group(5)),
                                  "eff_gb_s": float(m.group(6)), "of_dram_pct": float(m.group(7))})
        elif section == "p2a":
            m = re.match(r"\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x\s*$", line)
            if m:
                out["p2a"].append({"N": int(m.group(1)), "tssa_ms": float(m.group(2)),
                                   "sdpa_ms": float(m.group(3)), "ratio": float(m.group(4))})
        elif section == "p2b":
            m = re.match(r"\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x\s+([\d.]+)", line)
            if m:
                out["p2b"].append({"N": int(m.group(1)), "tssa_mib": float(m.group(2)),
                                   "softmax_mib": float(m.group(3)), "ratio": float(m.group(4))})
    return out


def run_step(step: str, args, run_dir: str) -> dict:
    """Runs one step; returns {"seconds", "json": path} (raises on failure)."""
    quick = ["--quick"] if args.quick else []
    common = ["--build-dir", args.build_dir, "--loadgen-cpu", str(args.loadgen_cpu)]
    log = os.path.join(run_dir, f"{step}.log")
    t0 = time.monotonic()
    if step == "tssa":
        argv = [benchlib.find_binary(args.build_dir, "tests/bench/tssa_bench"), *quick]
    elif step == "generation":
        argv = [benchlib.find_binary(args.build_dir, "tests/bench/tost_generation_bench"), *quick,
                f"--server_bin={benchlib.find_binary(args.build_dir, 'service/tost_server')}",
                f"--positions={P4_POSITIONS}", f"--json={os.path.join(run_dir, 'generation.json')}"]
    else:
        script = {"p3": "p3_classify.py", "p5": "p5_session_memory.py", "p6": "p6_streams.py"}[step]
        argv = [sys.executable, os.path.join(HERE, "bench", script), *common, *quick,
                "--out", os.path.join(run_dir, f"{step}.json")]
    print(f"[{datetime.datetime.now():%H:%M:%S}] {step}: {' '.join(argv)}", flush=True)
    with open(log, "w") as f:
        rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, cwd=benchlib.ROOT).returncode
    seconds = time.monotonic() - t0
    if rc != 0:
        with open(log) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"{step} failed ({rc}); {log}:\n{tail}")
    if step == "tssa":
        with open(log) as f:
            benchlib.write_json(os.path.join(run_dir, "tssa.json"), parse_tssa(f.read()))
    print(f"  {step}: {seconds:.0f} s", flush=True)
    return {"seconds": seconds}


def headline(run_dir: str) -> dict:
    """The figures compared across runs, by name."""
    def load(name):
        path = os.path.join(run_dir, name)
        return json.load(open(path)) if os.path.exists(path) else None

    h = {}
    t = load("tssa.json")
    if t:
        for r in t["p1"]:
            h[f"P1 B{r['B']} N{r['N']} speedup"] = r["speedup"]
            h[f"P1 B{r['B']} N{r['N']} % of DRAM"] = r["of_dram_pct"]
        for r in t["p2a"]:
            h[f"P2 N{r['N']} SDPA/TSSA time"] = r["ratio"]
        for r in t["p2b"]:
            h[f"P2 N{r['N']} peak-memory ratio"] = r["ratio"]
    g = load("generation.json")
    if g:
        h["P4 ToST latency ratio 4000/100"] = g["p4"]["tost_ratio"]
        h["P4 KV-cache latency ratio 4000/100"] = g["p4"]["kv_ratio"]
        h["P6 (generation_bench) 64 vs 1 stream"] = g["p6"]["ratio"]
        if "in_process_step_many_ms" in g["p6"]:  # the model's own steps: P6's ceiling
            h["P6 in-process ceiling 64 vs 1 row"] = (
                g["p6"]["streams"] * g["p6"]["in_process_step_one_ms"] / g["p6"]["in_process_step_many_ms"])
    p3 = load("p3.json")
    if p3:
        h["P3 tost_server images/s at p99 bound"] = p3["tost_server"]["best_images_per_s"]
        h["P3 python server images/s at p99 bound"] = p3["python_server"]["best_images_per_s"]
        h["P3 ratio tost/python"] = p3["ratio_images_per_s"]
        h["P3 latency overhead vs in-process"] = p3["overhead"]["latency_overhead"]
        h["P3 throughput overhead vs in-process"] = p3["overhead"]["throughput_overhead"]
    p5 = load("p5.json")
    if p5:
        top = str(p5["position"])
        h["P5 ToST bytes/session"] = p5["tost"][top]["growth_per_session_bytes"]
        h["P5 KV bytes/cache"] = p5["kv"][top]["growth_per_cache_bytes"]
        h["P5 ratio"] = p5["ratio"]
    p6 = load("p6.json")
    if p6:
        for p in p6["points"]:
            h[f"P6 tokens/s at {p['streams']} streams"] = p["tokens_per_s"]
            h[f"P6 ITL p99 ms at {p['streams']} streams"] = p["itl_p99_ms"]
        h["P6 (loadgen) 64 vs 1 stream"] = p6["ratio_64_vs_1"]
    return h


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    benchlib.add_build_args(ap)
    ap.add_argument("--out-dir", default=os.path.join(benchlib.ROOT, "build", "perf", f"{datetime.date.today()}"),
                    help="results directory (default build/perf/DATE, inside the ignored build tree)")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--only", default=",".join(STEPS), help=f"comma-separated subset of {','.join(STEPS)}")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--summarize-only", action="store_true",
                    help="run nothing: rebuild summary.json and the plots from the runs already in --out-dir")
    args = ap.parse_args()
    args.build_dir = os.path.abspath(args.build_dir)
    steps = [s for s in args.only.split(",") if s]
    for s in steps:
        if s not in STEPS:
            raise SystemExit(f"--only: expected steps among {','.join(STEPS)}, got {s!r}")
    os.makedirs(args.out_dir, exist_ok=True)
    started = datetime.datetime.now().astimezone()
    timings = {}
    summary_path = os.path.join(args.out_dir, "summary.json")
    if args.summarize_only and os.path.exists(summary_path):
        with open(summary_path) as f:
            earlier = json.load(f)
        started = datetime.datetime.fromisoformat(earlier["started"])
        timings = earlier["step_seconds"]
    for run in range(1, args.runs + 1):
        run_dir = os.path.join(args.out_dir, f"run{run}")
        os.makedirs(run_dir, exist_ok=True)
        for step in [] if args.summarize_only else steps:
            timings[f"run{run} {step}"] = run_step(step, args, run_dir)["seconds"]

    heads = [headline(os.path.join(args.out_dir, f"run{r}")) for r in range(1, args.runs + 1)]
    rows = {}
    for name in heads[0]:
        values = [h.get(name) for h in heads]
        nums = [v for v in values if isinstance(v, (int, float))]
        spread = None
        if len(nums) >= 2 and sum(abs(v) for v in nums) > 0:
            mean = sum(abs(v) for v in nums) / len(nums)
            spread = (max(nums) - min(nums)) / mean
        rows[name] = {"values": values, "spread": spread, "within_10pct": spread is not None and spread <= 0.10}
    summary = {"started": started.isoformat(timespec="seconds"),
               "finished": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
               "quick": args.quick, "runs": args.runs, "machine": benchlib.machine(),
               "git_commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                            cwd=benchlib.ROOT).stdout.strip(),
               "build_dir": args.build_dir, "step_seconds": timings, "figures": rows}
    if args.summarize_only and os.path.exists(summary_path):
        # What was measured, when and at which commit stays the measuring run's.
        summary.update({k: earlier[k] for k in ("finished", "quick", "machine", "git_commit", "build_dir")})
    benchlib.write_json(summary_path, summary)

    print(f"\n{'figure':<44} " + " ".join(f"{'run ' + str(r):>12}" for r in range(1, args.runs + 1)) + f" {'spread':>8}")
    for name, r in rows.items():
        vals = " ".join(f"{v:>12.4g}" if isinstance(v, (int, float)) else f"{'-':>12}" for v in r["values"])
        flag = "" if r["within_10pct"] or r["spread"] is None else "  > 10%"
        spread = f"{100 * r['spread']:>7.1f}%" if r["spread"] is not None else f"{'-':>8}"
        print(f"{name:<44} {vals} {spread}{flag}")
    total = sum(timings.values())
    print(f"\nsteps took {total / 60:.1f} min in all; wrote {os.path.join(args.out_dir, 'summary.json')}")
    if not args.no_plots:
        subprocess.run([sys.executable, os.path.join(HERE, "plot_perf.py"), args.out_dir], check=True)


if __name__ == "__main__":
    main()
