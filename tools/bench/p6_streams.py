#!/usr/bin/env python3
"""P6: aggregate decode tokens/s and inter-token latency through tost_server at 1, 8, 32, 64 and
128 concurrent Generate streams, driven by tost_loadgen (C++, one pinned core, closed loop: each
stream that ends is replaced at once). The P6 ratio is the one tests/bench/generation_bench.cc
prints: aggregate tokens/s with 64 streams over 1 stream, on the same server and model.

The model is generation_bench's (a 4096-context causal ToST, 6 layers, C 384, 6 heads, byte
vocabulary, random weights; 2 layers, C 96 with --quick) unless --model-dir names another. The
server decodes up to --max-active streams together (tost_server's default is 64; the curve needs
128). Writes one JSON file (--out).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchlib.add_build_args(ap)
    ap.add_argument("--streams", default="1,8,32,64,128")
    ap.add_argument("--tokens", type=int, default=64, help="max_new_tokens per stream")
    ap.add_argument("--duration-s", type=float, default=20)
    ap.add_argument("--max-active", type=int, default=128)
    ap.add_argument("--model-dir", default="", help="serve this model instead of the benchmark LM")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="p6.json")
    args = ap.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    duration, warmup = (3.0, 1.0) if args.quick else (args.duration_s, 3.0)
    cpus = benchlib.other_cpus(args.loadgen_cpu)

    repo, model, lm = benchlib.lm_repo("p6_repo_", args.model_dir, quick=args.quick)
    result = {"target": "P6", "machine": benchlib.machine(), "quick": args.quick, "model": model, "lm": lm,
              "tokens_per_stream": args.tokens, "max_active_generations": args.max_active,
              "duration_s": duration, "loadgen_cpu": args.loadgen_cpu, "server_cpus": cpus, "points": []}
    with benchlib.start_tost_server(args.build_dir, repo, [f"--max_active_generations={args.max_active}"],
                                    cpus=cpus) as server:
        for n in streams:
            print(f"--- {n} concurrent streams")
            r = benchlib.run_loadgen(args.build_dir, server.address, [
                "--workload=generate", f"--concurrency={n}", f"--max_new_tokens={args.tokens}",
                "--prompt_text=Once upon a time", f"--duration_s={duration}", f"--warmup_s={warmup}",
                f"--generate_model={model}"], args.loadgen_cpu)
            g = r["workloads"]["generate"]
            result["points"].append({
                "streams": n, "tokens_per_s": g["tokens_per_s"], "requests_per_s": g["requests_per_s"],
                "itl_p50_ms": g["itl_ms"]["p50"], "itl_p99_ms": g["itl_ms"]["p99"],
                "ttft_p50_ms": g["ttft_ms"]["p50"], "ttft_p99_ms": g["ttft_ms"]["p99"],
                "errors": g["errors"], "errors_by_code": g["errors_by_code"],
                "loadgen_cpu_s": r["client_cpu_s"], "measured_s": r["measured_s"]})
    shutil.rmtree(repo)
    base = next((p["tokens_per_s"] for p in result["points"] if p["streams"] == 1), None)
    for p in result["points"]:
        p["ratio_vs_1"] = p["tokens_per_s"] / base if base else None
    p64 = next((p for p in result["points"] if p["streams"] == 64), None)
    result["ratio_64_vs_1"] = p64["ratio_vs_1"] if p64 else None
    benchlib.write_json(args.out, result)
    print(f"\nP6 decode through tost_server, {model}, {args.tokens} tokens per stream, closed loop")
    print(f"  {'streams':>7} {'tokens/s':>10} {'x 1 stream':>10} {'ITL p50 ms':>11} {'ITL p99 ms':>11} "
          f"{'TTFT p99 ms':>12} {'errors':>7}")
    for p in result["points"]:
        print(f"  {p['streams']:>7} {p['tokens_per_s']:>10.1f} {p['ratio_vs_1'] or 0:>10.2f} {p['itl_p50_ms']:>11.2f} "
              f"{p['itl_p99_ms']:>11.2f} {p['ttft_p99_ms']:>12.2f} {p['errors']:>7}")
    if result["ratio_64_vs_1"]:
        print(f"  P6: 64 streams vs 1: {result['ratio_64_vs_1']:.1f}x (target >= 8x)")
    print(f"  wrote {args.out}")


if __name__ == "__main__":
    main()
