#!/usr/bin/env python3
"""An HTTP/2 rapid-reset flood on the bare server and through the shipped gRPC edge proxy
(deploy/proxy, run by its own entrypoint script with Debian's nginx), side by side in one run, on
one copy of the server binary:

  bare    the flooder and a bystander call tost_server's gRPC port directly;
  proxy   both call the edge proxy in front of a fresh tost_server.

The flood is tests/integration/test_http2_hardening.py's raw-frame client (HEADERS, DATA,
RST_STREAM per stream, many streams per write), --connections connections for --seconds seconds,
from 127.0.0.3 (a client address of its own, as a flooding client's would be); the bystander
calls Classify and ListModels one after the other from 127.0.0.1. Reported per mode: streams sent,
the server's resident memory before, at the peak and --settle-s after the flood, its descriptors
at the peak, the bystander's latency (p50, p99, slowest) and errors, and for the proxy the calls it passed on
(by status) and refused; then the ratios proxy / bare.

  python3 tools/bench/edge_proxy_flood.py --out docs/perf/2026-11-29-edge-proxy/flood-run1.json
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
os.environ.setdefault("TOST_SOURCE_DIR", str(ROOT))

import grpc  # noqa: E402

from conftest import RunningServer  # noqa: E402
import tost_protos  # noqa: E402
from test_grpc_edge_proxy import EdgeProxy, open_fds  # noqa: E402
from test_http2_hardening import _bystander, digits_request, latency_summary, rss_mib  # noqa: E402

HARDENING = ROOT / "tests" / "integration" / "test_http2_hardening.py"


def cpu_flags() -> str:
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    wanted = ["avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8"]
    return " ".join(w for w in wanted if w in flags)


def run_mode(mode, args, pb2, pb2_grpc, tmp):
    srv = RunningServer(str(ROOT / "models"))
    proxy = None
    try:
        pid = srv.proc.pid
        target = srv.address
        if mode == "proxy":
            (Path(tmp) / mode).mkdir()
            proxy = EdgeProxy(srv.address, Path(tmp) / mode)
            target = proxy.address
        with grpc.insecure_channel(target) as ch:
            stub = pb2_grpc.TostStub(ch)
            start = time.monotonic()
            for _ in range(20):
                stub.Classify(digits_request(pb2), timeout=30)
                stub.ListModels(pb2.ListModelsRequest(), timeout=30)
            quiet_ms = (time.monotonic() - start) / 20 * 1000
        time.sleep(0.5)
        before = rss_mib(pid)
        fds = [open_fds(pid)]
        stop, latencies, errors = threading.Event(), [], []

        def sample():
            while not stop.is_set():
                fds[0] = max(fds[0], open_fds(pid))
                time.sleep(0.05)

        threads = [threading.Thread(target=_bystander, args=(target, pb2, pb2_grpc, stop, latencies, errors)),
                   threading.Thread(target=sample)]
        for t in threads:
            t.start()
        try:
            out = subprocess.run([sys.executable, str(HARDENING), "flood", target, str(pid), str(args.seconds),
                                  str(args.connections), "127.0.0.3", "100000000", "1000000"],
                                 capture_output=True, text=True, timeout=args.seconds + 120,
                                 env={**os.environ, "TOST_SOURCE_DIR": str(ROOT)})
            if out.returncode != 0:
                raise RuntimeError(f"{mode}: the flooder failed: {out.stderr[-2000:]}")
            flood = json.loads(out.stdout.splitlines()[-1])
        finally:
            stop.set()
            for t in threads:
                t.join()
        time.sleep(args.settle_s)
        after = rss_mib(pid)
        p50, p99, slowest = (round(t * 1000, 1) if latencies else None for t in latency_summary(latencies))

        accepting = True
        try:
            with grpc.insecure_channel(srv.address) as ch:
                pb2_grpc.TostStub(ch).ListModels(pb2.ListModelsRequest(), timeout=10)
        except grpc.RpcError:
            accepting = False
        result = {
            "mode": mode, "streams": flood["streams"], "reconnects": flood["reconnects"],
            "rss_before_mib": round(before, 1), "rss_peak_mib": round(flood["peak_rss_mib"], 1),
            "rss_after_mib": round(after, 1), "growth_peak_mib": round(flood["peak_rss_mib"] - before, 1),
            "growth_after_mib": round(after - before, 1), "fds_peak": fds[0],
            "bystander_calls": len(latencies), "bystander_errors": [str(e)[:200] for e in errors],
            "bystander_quiet_ms": round(quiet_ms, 2), "bystander_p50_ms": p50, "bystander_p99_ms": p99,
            "bystander_max_ms": slowest,
            "server_accepting_after": accepting, "server_alive": srv.alive(),
        }
        if proxy is not None:
            passed = proxy.statuses()  # the calls it passed on; the refused (429) get no log line
            result["proxy_passed_on"] = passed
            result["proxy_refused"] = flood["streams"] - sum(passed.values())
        return result
    finally:
        if proxy is not None:
            proxy.stop()
        srv.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--connections", type=int, default=38)
    p.add_argument("--settle-s", type=float, default=10, help="wait after the flood before reading memory")
    p.add_argument("--out", help="write the raw results as JSON here")
    a = p.parse_args()
    pb2, pb2_grpc = tost_protos.tost()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    header = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "commit": commit,
              "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
              "cpu": platform.processor() or "", "cpu_flags": cpu_flags(), "cores": os.cpu_count(),
              "load_average_at_start": os.getloadavg(),
              "nginx": subprocess.run(["/usr/sbin/nginx", "-v"], capture_output=True, text=True).stderr.strip()}
    print(json.dumps(header))
    results = []
    with tempfile.TemporaryDirectory(prefix="tost-edge-flood-") as tmp:
        for mode in ("bare", "proxy"):
            r = run_mode(mode, a, pb2, pb2_grpc, tmp)
            print(json.dumps(r))
            results.append(r)
    bare, prox = results
    ratios = {k: (round(prox[k] / bare[k], 3) if bare[k] else None)
              for k in ("growth_peak_mib", "growth_after_mib", "fds_peak", "bystander_p50_ms", "bystander_p99_ms",
                        "bystander_max_ms")}
    print(json.dumps({"ratios_proxy_over_bare": ratios}))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps({**header, "results": results, "ratios_proxy_over_bare": ratios},
                                          indent=1) + "\n")


if __name__ == "__main__":
    main()
