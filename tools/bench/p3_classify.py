#!/usr/bin/env python3
"""P3: classification through tost_server vs (a) the server's own model called in-process at the
same batch size (the server's overhead, target <= 10%) and (b) the Python gRPC server a user would
write instead (tools/bench/python_classify_server.py: same model and weights, PyTorch eager, thread
pool), goal >= 1.5x images/s at the highest rate whose p99 stays <= 2x the unloaded latency.

Both servers run on the cores the load generator does not use; tost_loadgen is pinned to one core
(--loadgen-cpu). Per server:
  unloaded latency  p50 of a closed loop with one call in flight (the reference of the p99 bound);
  saturation        closed loop with 16 in flight: the most calls/s it completes;
  sweep             open loop (Poisson) at fractions of the saturation rate (halved below the
                    lowest while none passes, down to 1/64); a rate passes when no call failed and
                    p99 <= 2x the unloaded latency; the report is the images/s completed at the
                    highest passing rate.
Overhead: tost_server with calls of --overhead-batch images (one batched forward each; closed loop
with 1 and 2 in flight) against tost_classify_forward_bench, the same VisionModel forward in a loop
in-process, on the same cores, at that batch size.

Writes one JSON file (--out) and prints a summary. --quick: short runs, fewer rates. --device=cuda
runs both servers and the in-process forward on the GPU; --build-dir may also be the flat bin/ of
scripts/gpu-bundle.sh's bundle.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

PY_SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python_classify_server.py")


def check_predictions(address: str, model_dir: str) -> dict:
    """Every sample image under <model>/samples classified by the server: the same labels as the
    config records (the two servers run the same weights)."""
    import grpc
    import numpy as np

    pb2, pb2_grpc = benchlib.proto_modules()
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    stub = pb2_grpc.TostStub(grpc.insecure_channel(address))
    right = wrong = 0
    for s in config.get("provenance", {}).get("samples", []):
        x = np.load(os.path.join(model_dir, "samples", s["file"].replace(".png", ".npy"))).astype("<f4")
        r = stub.Classify(pb2.ClassifyRequest(model=config["name"], top_k=1, tensor=pb2.FloatTensor(
            shape=list(x.shape), raw=x.tobytes())), timeout=30)
        if r.results[0].labels[0].index == s["predicted"]:
            right += 1
        else:
            wrong += 1
    return {"samples_matching_recorded_prediction": right, "samples_differing": wrong}


def measure_server(name, address, build_dir, cpu, quick, batch_size) -> dict:
    dur, warm = ("2", "0.5") if quick else ("10", "2")
    base = [f"--duration_s={dur}", f"--warmup_s={warm}", "--workload=classify",
            f"--batch_size={batch_size}"]
    print(f"--- {name}: unloaded (1 in flight)")
    unloaded = benchlib.run_loadgen(build_dir, address, base + ["--concurrency=1"], cpu)
    unloaded_ms = unloaded["workloads"]["classify"]["latency_ms"]["p50"]
    print(f"--- {name}: saturation (16 in flight)")
    sat = benchlib.run_loadgen(build_dir, address, base + ["--concurrency=16"], cpu)
    sat_rps = sat["workloads"]["classify"]["requests_per_s"]
    fractions = [0.25, 0.5, 0.8, 1.0] if quick else [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1]
    sweep = []

    def probe(f):
        rate = max(1.0, f * sat_rps)
        print(f"--- {name}: open loop at {rate:.1f} calls/s ({f:.3f} x saturation)")
        r = benchlib.run_loadgen(build_dir, address, base + [f"--rate_per_s={rate:.3f}"], cpu)
        c = r["workloads"].get("classify", {})
        p99 = c.get("latency_ms", {}).get("p99", float("inf"))
        ok = (r["total"]["errors"] == 0 and r["skipped_sends"] == 0 and c.get("ok", 0) > 0
              and p99 <= 2 * unloaded_ms)
        sweep.append({"rate_per_s": rate, "fraction_of_saturation": f, "p50_ms": c.get("latency_ms", {}).get("p50"),
                      "p99_ms": p99, "images_per_s": c.get("images_per_s", 0), "errors": r["total"]["errors"],
                      "errors_by_code": c.get("errors_by_code", {}), "send_lag_p99_ms": r["send_lag_ms"]["p99"],
                      "loadgen_preemptions": r["client_preemptions"],
                      # A generator more than 1 ms behind its schedule at p99 was starved of its core
                      # (a busy machine): the point says more about the machine than the server.
                      "loadgen_kept_schedule": r["send_lag_ms"]["p99"] <= 1.0,
                      "passes": ok})
        return ok

    for f in fractions:
        probe(f)
    # None passed: halve the rate until one does (down to 1/64 of saturation), so a server whose
    # p99 bound holds only at low rates still gets its figure instead of none.
    f = min(fractions)
    while not any(s["passes"] for s in sweep) and f > 1 / 64:
        f /= 2
        probe(f)
    # Two bisection steps between the highest passing fraction and the next one up (full runs).
    for _ in range(0 if quick else 2):
        passed = [s["fraction_of_saturation"] for s in sweep if s["passes"]]
        if not passed:
            break
        lo = max(passed)
        above = [s["fraction_of_saturation"] for s in sweep if s["fraction_of_saturation"] > lo]
        if not above:
            break
        probe((lo + min(above)) / 2)
    sweep.sort(key=lambda s: s["rate_per_s"])
    passing = [s for s in sweep if s["passes"]]
    best = max(passing, key=lambda s: s["rate_per_s"]) if passing else None
    return {"unloaded": {"p50_ms": unloaded_ms, "p99_ms": unloaded["workloads"]["classify"]["latency_ms"]["p99"],
                         "images_per_s": unloaded["workloads"]["classify"]["images_per_s"]},
            "saturation": {"concurrency": 16, "requests_per_s": sat_rps,
                           "images_per_s": sat["workloads"]["classify"]["images_per_s"],
                           "p99_ms": sat["workloads"]["classify"]["latency_ms"]["p99"]},
            "p99_bound_ms": 2 * unloaded_ms, "sweep": sweep,
            "best": best, "best_images_per_s": best["images_per_s"] if best else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchlib.add_build_args(ap)
    ap.add_argument("--model-dir", default=os.path.join(benchlib.ROOT, "models", "tost-digits"))
    ap.add_argument("--batch-size", type=int, default=1, help="images per call in the sweep")
    ap.add_argument("--overhead-batch", type=int, default=8,
                    help="images per call for the overhead figure (tost_server's --max_batch_images)")
    ap.add_argument("--python-workers", type=int, default=4)
    ap.add_argument("--device", default="cpu",
                    help="where both servers and the in-process forward run: cpu or cuda[:N]")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="p3.json")
    args = ap.parse_args()
    cpus = benchlib.other_cpus(args.loadgen_cpu)
    model_dir = os.path.abspath(args.model_dir)
    model_name = os.path.basename(model_dir)
    result = {"target": "P3", "machine": benchlib.machine(), "model": model_name,
              "loadgen_cpu": args.loadgen_cpu, "server_cpus": cpus, "batch_size": args.batch_size,
              "quick": args.quick, "device": args.device}

    # In-process: the server's VisionModel forward, same cores, one intra-op thread.
    bench = benchlib.find_binary(args.build_dir, "tests/bench/tost_classify_forward_bench")
    out = subprocess.run(["taskset", "-c", ",".join(map(str, cpus)), bench, f"--model_dir={model_dir}",
                          f"--device={args.device}",
                          f"--batch_sizes=1,{args.overhead_batch}", f"--seconds={1 if args.quick else 5}"],
                         capture_output=True, text=True, check=True)
    result["in_process"] = json.loads(out.stdout)
    print("in-process forward:", json.dumps(result["in_process"]["batches"]))

    # Only this model in the repository the server loads (tost_server loads every model of it).
    import tempfile
    only = tempfile.mkdtemp(prefix="p3_repo_")
    os.symlink(model_dir, os.path.join(only, model_name))
    with benchlib.start_tost_server(args.build_dir, only, [f"--device={args.device}"], cpus=cpus) as server:
        result["tost_server_predictions"] = check_predictions(server.address, model_dir)
        result["tost_server"] = measure_server("tost_server", server.address, args.build_dir,
                                               args.loadgen_cpu, args.quick, args.batch_size)
        overhead = {}
        for conc in (1, 2):
            print(f"--- tost_server: {args.overhead_batch}-image calls, {conc} in flight")
            r = benchlib.run_loadgen(args.build_dir, server.address, [
                "--workload=classify", f"--batch_size={args.overhead_batch}", f"--concurrency={conc}",
                f"--duration_s={2 if args.quick else 10}", "--warmup_s=0.5"], args.loadgen_cpu)
            overhead[f"concurrency_{conc}"] = {
                "latency_p50_ms": r["workloads"]["classify"]["latency_ms"]["p50"],
                "images_per_s": r["workloads"]["classify"]["images_per_s"]}
        inproc = result["in_process"]["batches"][str(args.overhead_batch)]
        overhead["in_process_latency_p50_ms"] = inproc["latency_ms"]["p50"]
        overhead["in_process_images_per_s"] = inproc["images_per_s"]
        overhead["latency_overhead"] = overhead["concurrency_1"]["latency_p50_ms"] / inproc["latency_ms"]["p50"] - 1
        overhead["throughput_overhead"] = inproc["images_per_s"] / overhead["concurrency_2"]["images_per_s"] - 1
        result["overhead"] = overhead
    os.unlink(os.path.join(only, model_name))
    os.rmdir(only)

    py = benchlib.Process([sys.executable, PY_SERVER, f"--model-dir={model_dir}", "--port=0",
                           f"--workers={args.python_workers}", f"--device={args.device}"],
                          "python_classify_server", cpus=cpus)
    with py:
        result["python_server_predictions"] = check_predictions(py.address, model_dir)
        result["python_server"] = measure_server("python_server", py.address, args.build_dir,
                                                 args.loadgen_cpu, args.quick, args.batch_size)

    t, p = result["tost_server"]["best_images_per_s"], result["python_server"]["best_images_per_s"]
    result["ratio_images_per_s"] = t / p if p else None
    benchlib.write_json(args.out, result)
    o = result["overhead"]
    print(f"\nP3 classification, {model_name}, {args.batch_size} image(s) per call, load generator on "
          f"core {args.loadgen_cpu}, servers on {cpus}")
    print(f"  {'server':<16} {'unloaded p50 ms':>16} {'p99 bound ms':>13} {'best rate/s':>12} {'images/s':>10}")
    for key in ("tost_server", "python_server"):
        s = result[key]
        rate = s["best"]["rate_per_s"] if s["best"] else 0
        print(f"  {key:<16} {s['unloaded']['p50_ms']:>16.2f} {s['p99_bound_ms']:>13.2f} {rate:>12.1f} "
              f"{s['best_images_per_s']:>10.1f}")
    behind = sum(not w["loadgen_kept_schedule"] for k in ("tost_server", "python_server") for w in result[k]["sweep"])
    if behind:
        print(f"  WARNING: at {behind} sweep points the load generator fell > 1 ms behind its schedule at p99 "
              f"(its core was busy): rerun on a quiet machine")
    ratio = result["ratio_images_per_s"]
    print(f"  ratio tost/python images/s: {ratio:.2f}x (goal >= 1.5x)" if ratio else "  ratio: n/a")
    print(f"  overhead at {args.overhead_batch} images/call: latency p50 {o['concurrency_1']['latency_p50_ms']:.2f} "
          f"ms vs in-process {o['in_process_latency_p50_ms']:.2f} ms ({100 * o['latency_overhead']:+.1f}%); "
          f"throughput {o['concurrency_2']['images_per_s']:.0f} vs {o['in_process_images_per_s']:.0f} images/s "
          f"({100 * o['throughput_overhead']:+.1f}%) (target <= 10%)")
    print(f"  wrote {args.out}")


if __name__ == "__main__":
    main()
