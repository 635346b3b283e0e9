#!/usr/bin/env python3
"""Noisy neighbour, weighted fair share and priority through tost_server (tost.v1 Generate over
gRPC, API keys naming two tenants), on the generation benchmark's LM (tests/bench/generation_bench.cc:
6 layers, C 384, byte vocabulary, random weights) or the model of --model-dir.

Four runs, each on a fresh server with --max_active_generations=S (--slots):
  noisy     tenant a keeps 4·S closed-loop streams (so most of a's requests wait) while tenant b
            sends --b-requests requests one at a time: b's time to first token (TTFT) at p50/p99,
            against its own TTFT on the idle server (its prefill and one decode step) plus two
            decode steps of the running batch (a's median inter-token latency, measured beside it).
  equal     weights 1:1, both tenants with 2·S closed-loop streams: each one's share of the decode
            tokens (the server's tost_tenant_generated_tokens_total over the window, and the
            tokens the client received).
  weighted  weights 3:1, the same load: the split should be 3:1.
  priority  tenant a fills every slot with 4·S streams at priority 10, and sends --b-requests more
            requests one at a time at priority -10: their TTFT against the same bound.

Each measured request asks for the server's timing trailer (x-tost-timing): where its first token
spent its time on the server (arrival, admission, submit, place, prefill, the first step's decode,
the first write), set beside the time the client measured, so that a slow first token shows where
its time went (`breakdown` in the JSON, and a table of the slowest on stdout).

--server-cpus / --client-cpus pin the server and the clients (the measuring process and a's load
process) to separate cores, as on a deployment where the clients are other machines; without them
they share every core. Say which one a figure comes from. --a-unique-prompts gives each of a's
requests a prompt of its own, so that each is prefilled (by default a's one prompt is a prefix-cache
hit after the first, and a's load is decode only); --server-arg passes a flag to the server (e.g.
--prefill_chunk_tokens=16); --step-thread-nice sets the nice value of its step-loop thread.

Writes one JSON file (--out) with every sample's summary and the raw per-request TTFTs. The
figures are wall-clock on whatever else the machine runs: say what else ran beside them.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

KEYS = {"a": "fairshare-tenant-a-0123456789", "b": "fairshare-tenant-b-0123456789"}
PROMPT = b"It is a truth universally acknowledged, that a single man in possession of a good fortune"
B_PROMPT = b"Elizabeth said"


def pct(values: List[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(p / 100.0 * len(s) + 0.5)) - 1))]


class Load:
    """Closed-loop Generate streams of one tenant: each stream starts its next request when the
    previous one ends. Counts the tokens received and the gaps between a stream's tokens."""

    def __init__(self, stub, pb2, model, tenant, streams, max_new_tokens, priority=0, unique=False):
        self.stub, self.pb2, self.model = stub, pb2, model
        self.unique = unique
        self.md = (("x-api-key", KEYS[tenant]),)
        self.max_new_tokens, self.priority = max_new_tokens, priority
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.tokens = 0
        self.gaps: List[float] = []
        self.errors: Dict[str, int] = {}
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(streams)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def run(self, i):
        n = 0
        while not self.stop.is_set():
            n += 1
            # Unique: a prompt no earlier one is a prefix of, so that each is prefilled (no
            # prefix-cache hit) and its chunk shares steps with b's.
            prompt = f"[{os.getpid()}-{i}-{n}] ".encode() + PROMPT if self.unique else PROMPT
            req = self.pb2.GenerateRequest(model=self.model, prompt_bytes=prompt,
                                           max_new_tokens=self.max_new_tokens, priority=self.priority,
                                           sampling=self.pb2.SamplingParams(temperature=1.0, seed=i * 100003 + n))
            last = None
            try:
                for msg in self.stub.Generate(req, metadata=self.md, timeout=600):
                    if msg.WhichOneof("event") != "token":
                        continue
                    now = time.monotonic()
                    with self.lock:
                        self.tokens += 1
                        if last is not None:
                            self.gaps.append(now - last)
                    last = now
                    if self.stop.is_set():
                        break
            except grpc.RpcError as e:
                with self.lock:
                    self.errors[e.code().name] = self.errors.get(e.code().name, 0) + 1
                time.sleep(0.05)

    def count(self):
        with self.lock:
            return self.tokens

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


# The server's timing trailer's points, in the order a first token passes them.
POINTS = ["admit", "submit", "placed", "prefill_start", "prefill_end", "first_token", "first_write"]


def parse_timing(value: str, sent_unix_us: int, ttft_s: float) -> Dict[str, float]:
    """The trailer as milliseconds: `sent_to_arrival` (the client's send to the server's arrival,
    both by the wall clock of this one machine), each point's gap from the one before, and
    `write_to_client` (the first write to the client's receipt)."""
    raw = dict(kv.split("=", 1) for kv in value.split(";"))
    out: Dict[str, float] = {"sent_to_arrival": (int(raw["arrival_unix_us"]) - sent_unix_us) / 1e3}
    prev = 0
    for p in POINTS:
        at = int(raw[p])
        if at < 0:
            out[p] = float("nan")
            continue
        out[p] = (at - prev) / 1e3
        prev = at
    out["write_to_client"] = ttft_s * 1e3 - out["sent_to_arrival"] - prev / 1e3
    out["server_ms"] = prev / 1e3
    out["first_step_prefill_tokens"] = int(raw["first_step_prefill_tokens"])
    out["first_step_batch"] = int(raw["first_step_batch"])
    out["placed_in_step_ms"] = (int(raw["first_token"]) - int(raw["first_step_start"])) / 1e3
    return out


def ttfts(stub, pb2, model, tenant, n, priority=0, max_new_tokens=4, timings=None) -> List[float]:
    """`n` requests one after another; each one's time to its first token, in seconds. With
    `timings` (a list), each request's server timing (parse_timing) is appended to it."""
    out = []
    md = (("x-api-key", KEYS[tenant]), ("x-tost-timing", "1"))
    for i in range(n):
        req = pb2.GenerateRequest(model=model, prompt_bytes=B_PROMPT, max_new_tokens=max_new_tokens,
                                  priority=priority, sampling=pb2.SamplingParams(temperature=1.0, seed=i))
        sent_unix_us = time.time_ns() // 1000
        t0 = time.monotonic()
        first = None
        call = stub.Generate(req, metadata=md, timeout=600)
        for msg in call:
            if msg.WhichOneof("event") == "token" and first is None:
                first = time.monotonic() - t0
        out.append(first)
        if timings is not None:
            trailer = dict(call.trailing_metadata()).get("x-tost-timing")
            timings.append(parse_timing(trailer, sent_unix_us, first) if trailer else {})
    return out


def breakdown(noisy: List[float], timings: List[Dict[str, float]]) -> Dict[str, object]:
    """The median of each part over every request and over the five slowest, and the five
    slowest requests' parts."""
    parts = ["sent_to_arrival", *POINTS, "write_to_client"]
    order = sorted(range(len(noisy)), key=lambda i: noisy[i])
    slow = order[-5:]

    def med(idx, k):
        vals = [timings[i][k] for i in idx if timings[i] and timings[i][k] == timings[i][k]]
        return statistics.median(vals) if vals else None
    return {
        "median_ms": {k: med(order, k) for k in parts},
        "slowest5_median_ms": {k: med(slow, k) for k in parts},
        "slowest5": [dict(ttft_ms=noisy[i] * 1e3, **timings[i]) for i in reversed(slow)],
    }


def print_breakdown(b: Dict[str, object]) -> None:
    cols = ["sent_to_arrival", *POINTS, "write_to_client"]
    print("  ms: " + " ".join(f"{c:>15}" for c in ["ttft", *cols, "step_prefill_tok"]))
    for row in b["slowest5"]:
        vals = [row["ttft_ms"], *[row.get(c, float("nan")) for c in cols]]
        print("      " + " ".join(f"{v:15.2f}" for v in vals) + f" {row.get('first_step_prefill_tokens', -1):15d}")
    for name in ("median_ms", "slowest5_median_ms"):
        print(f"  {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in b[name].items() if v is not None))


def decode_steps(server) -> float:
    m = benchlib.scrape_metrics(server.metrics_port, "tost_batch_size_count")
    return sum(v for k, v in m.items() if 'workload="generate"' in k)


def load_process(args, server, tenant, streams, tokens, priority):
    """A's closed-loop streams in a process of their own, so that their Python threads do not hold
    the measuring process's interpreter lock."""
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--load-only",
                             f"--address={server.address}", f"--tenant={tenant}", f"--streams={streams}",
                             f"--tokens={tokens}", f"--priority={priority}", f"--model={args.model}",
                             *(["--a-unique-prompts"] if args.a_unique_prompts else [])],
                            preexec_fn=(lambda: os.sched_setaffinity(0, args.client_cpus))
                            if args.client_cpus else None)


def prefill_tokens(server) -> float:
    m = benchlib.scrape_metrics(server.metrics_port, "tost_prefill_tokens_total")
    return sum(m.values())


def server_tokens(server, tenant) -> float:
    m = benchlib.scrape_metrics(server.metrics_port, "tost_tenant_generated_tokens_total")
    return m.get(f'tost_tenant_generated_tokens_total{{tenant="{tenant}"}}', 0.0)


def renice_step_threads(server, nice: int) -> List[int]:
    """Sets the nice value of the server's step-loop threads ("step:<model>"), so that the kernel
    lets the server's other threads (gRPC's, the token delivery) preempt a step on a shared core.
    Their thread ids."""
    tids = []
    for tid in os.listdir(f"/proc/{server.pid}/task"):
        with open(f"/proc/{server.pid}/task/{tid}/comm") as f:
            if f.read().startswith("step:"):
                os.setpriority(os.PRIO_PROCESS, int(tid), nice)
                tids.append(int(tid))
    return tids


def start(args, weights, workdir):
    keys = os.path.join(workdir, "keys.txt")
    with open(keys, "w") as f:
        for t in ("a", "b"):
            f.write(f"{t} {KEYS[t]} weight={weights[t]}\n")
    flags = [f"--max_active_generations={args.slots}", "--max_queued_generations=1024",
             f"--api_keys_file={keys}", f"--intra_op_threads={args.intra_op_threads}", *args.server_arg]
    return benchlib.start_tost_server(args.build_dir, args.repo, flags, metrics=True,
                                      cpus=args.server_cpus or None)


def run_noisy(args, stub_of, pb2, workdir, priority_run=False):
    with start(args, {"a": 1, "b": 1}, workdir) as server:
        stub = stub_of(server)
        # The measured calls' tenant: its prefix-cache scope is its own, so the idle baseline and
        # the warm-up are its calls too (in the priority run, a's).
        tenant = "a" if priority_run else "b"
        ttfts(stub, pb2, args.model, tenant, 5)  # warm
        if args.step_thread_nice:
            assert renice_step_threads(server, args.step_thread_nice), "no step:<model> thread found"
        alone_timings: List[Dict[str, float]] = []
        alone = ttfts(stub, pb2, args.model, tenant, args.b_requests, timings=alone_timings)
        load = load_process(args, server, "a", 4 * args.slots, args.a_tokens, 10 if priority_run else 0)
        try:
            time.sleep(args.warmup_s)
            steps0, t0 = decode_steps(server), time.monotonic()
            fed0, a_gen0 = prefill_tokens(server), server_tokens(server, "a")
            timings: List[Dict[str, float]] = []
            if priority_run:
                # The same tenant, so that only the priority tells the requests apart.
                noisy = ttfts(stub, pb2, args.model, "a", args.b_requests, priority=-10, timings=timings)
            else:
                noisy = ttfts(stub, pb2, args.model, "b", args.b_requests, timings=timings)
            elapsed, steps = time.monotonic() - t0, decode_steps(server) - steps0
            fed, a_gen = prefill_tokens(server) - fed0, server_tokens(server, "a") - a_gen0
            waiting = benchlib.scrape_metrics(server.metrics_port, "tost_tenant_generations")
            preempt = benchlib.scrape_metrics(server.metrics_port, "tost_generation_preemptions_total")
        finally:
            load.send_signal(signal.SIGTERM)
            load.wait(timeout=60)
    # The running batch's step period: the decode steps the server ran while b's requests were
    # measured (every one of them with a's rows in it).
    step = elapsed / steps
    bound = statistics.median(alone) + 2 * step
    return {
        "slots": args.slots, "a_streams": 4 * args.slots, "a_max_new_tokens": args.a_tokens,
        "requests": args.b_requests, "ttft_alone_s": alone, "ttft_under_load_s": noisy,
        "ttft_alone_p50_ms": 1e3 * statistics.median(alone),
        "ttft_p50_ms": 1e3 * statistics.median(noisy), "ttft_p99_ms": 1e3 * pct(noisy, 99),
        "ttft_max_ms": 1e3 * max(noisy),
        "decode_steps": steps, "decode_step_period_ms": 1e3 * step,
        # What a's load got meanwhile: prompt tokens fed (a's, but for b's few) and a's tokens.
        "prefill_tokens_per_s": fed / elapsed, "a_generated_tokens_per_s": a_gen / elapsed,
        "bound_ms": 1e3 * bound, "p99_within_bound": pct(noisy, 99) <= bound,
        "tenant_generations_at_end": waiting, "preemptions": preempt,
        # a's load process holds 4·S generations throughout; none at the end means it died (its
        # gRPC client once did), and the run measured b beside nothing: discard it.
        "a_load_held": waiting.get('tost_tenant_generations{tenant="a"}', 0.0) > 0,
        # Where b would wait without fair share: behind a's 3·S waiting requests, S at a time.
        "fifo_wait_estimate_ms": 1e3 * 3 * args.a_tokens * step,
        "server_timing_under_load": timings, "server_timing_alone": alone_timings,
        "breakdown_under_load": breakdown(noisy, timings),
        "breakdown_alone": breakdown(alone, alone_timings),
    }


def run_split(args, stub_of, pb2, workdir, weights):
    with start(args, weights, workdir) as server:
        stub = stub_of(server)
        loads = {t: Load(stub, pb2, args.model, t, 2 * args.slots, args.split_tokens).start()
                 for t in ("a", "b")}
        time.sleep(args.warmup_s)
        c0 = {t: loads[t].count() for t in loads}
        s0 = {t: server_tokens(server, t) for t in loads}
        t0 = time.monotonic()
        time.sleep(args.window_s)
        elapsed = time.monotonic() - t0
        c1 = {t: loads[t].count() for t in loads}
        s1 = {t: server_tokens(server, t) for t in loads}
        for load in loads.values():
            load.finish()
        preempt = benchlib.scrape_metrics(server.metrics_port, "tost_generation_preemptions_total")
    server_rate = {t: (s1[t] - s0[t]) / elapsed for t in loads}
    client_rate = {t: (c1[t] - c0[t]) / elapsed for t in loads}
    expected = weights["a"] / (weights["a"] + weights["b"])
    share = server_rate["a"] / (server_rate["a"] + server_rate["b"])
    ratio = server_rate["a"] / server_rate["b"] if server_rate["b"] else None
    want = weights["a"] / weights["b"]
    return {
        "weights": weights, "streams_per_tenant": 2 * args.slots, "slots": args.slots,
        "max_new_tokens": args.split_tokens, "window_s": elapsed,
        "server_tokens_per_s": server_rate, "client_tokens_per_s": client_rate,
        "a_share": share, "expected_a_share": expected, "a_to_b": ratio, "expected_a_to_b": want,
        "within_10_percent": ratio is not None and abs(ratio / want - 1) <= 0.10,
        "errors": {t: loads[t].errors for t in loads}, "preemptions": preempt,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchlib.add_build_args(ap)
    ap.add_argument("--model-dir", default="", help="serve this model instead of the benchmark LM")
    ap.add_argument("--model", default="", help=argparse.SUPPRESS)
    ap.add_argument("--slots", type=int, default=4, help="--max_active_generations")
    ap.add_argument("--a-tokens", type=int, default=64, help="max_new_tokens of a's noisy streams")
    ap.add_argument("--a-unique-prompts", action="store_true",
                    help="a's prompts all differ, so each is prefilled (default: one prompt, a "
                         "prefix-cache hit after the first)")
    ap.add_argument("--split-tokens", type=int, default=256, help="max_new_tokens in the split runs")
    ap.add_argument("--b-requests", type=int, default=50)
    ap.add_argument("--warmup-s", type=float, default=3.0)
    ap.add_argument("--window-s", type=float, default=20.0)
    ap.add_argument("--intra-op-threads", type=int, default=1)
    ap.add_argument("--runs", default="noisy,equal,weighted,priority")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="a further tost_server flag, e.g. --server-arg=--prefill_chunk_tokens=16 (repeatable)")
    ap.add_argument("--server-cpus", default="", help="cores for the server, e.g. 0 (default: all)")
    ap.add_argument("--client-cpus", default="", help="cores for the clients, e.g. 1 (default: all)")
    ap.add_argument("--step-thread-nice", type=int, default=0,
                    help="nice value for the server's step-loop threads (default 0: unchanged)")
    ap.add_argument("--out", default="fairshare.json")
    # What load_process runs.
    ap.add_argument("--load-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    ap.add_argument("--tenant", help=argparse.SUPPRESS)
    ap.add_argument("--streams", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--priority", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.server_cpus = [int(c) for c in args.server_cpus.split(",") if c]
    args.client_cpus = [int(c) for c in args.client_cpus.split(",") if c]
    if args.load_only:
        pb2, pb2_grpc = benchlib.proto_modules()
        stub = pb2_grpc.TostStub(grpc.insecure_channel(args.address))
        done = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: done.set())
        load = Load(stub, pb2, args.model, args.tenant, args.streams, args.tokens, args.priority,
                    args.a_unique_prompts).start()
        done.wait()
        load.stop.set()
        os._exit(0)  # its streams end with the process
    if args.client_cpus:
        os.sched_setaffinity(0, args.client_cpus)
    pb2, pb2_grpc = benchlib.proto_modules()
    workdir = tempfile.mkdtemp(prefix="fairshare_")
    args.repo, args.model, lm = benchlib.lm_repo("fairshare_repo_", args.model_dir)

    def stub_of(server):
        return pb2_grpc.TostStub(grpc.insecure_channel(server.address))

    result = {"machine": benchlib.machine(), "model": args.model, "lm": lm, "args": {
        k: v for k, v in vars(args).items() if k not in ("repo",)}, "runs": {}}
    try:
        isa = sorted(set(w for line in open("/proc/cpuinfo") if line.startswith("flags")
                         for w in line.split() if w.startswith(("avx512", "amx")) or w == "avx2"))
        result["machine"]["isa"] = isa
    except OSError:
        pass
    for run in args.runs.split(","):
        print(f"--- {run}", flush=True)
        if run == "noisy":
            r = run_noisy(args, stub_of, pb2, workdir)
        elif run == "priority":
            r = run_noisy(args, stub_of, pb2, workdir, priority_run=True)
        elif run == "equal":
            r = run_split(args, stub_of, pb2, workdir, {"a": 1, "b": 1})
        elif run == "weighted":
            r = run_split(args, stub_of, pb2, workdir, {"a": 3, "b": 1})
        else:
            raise SystemExit(f"unknown run {run!r}")
        result["runs"][run] = r
        summary = {k: v for k, v in r.items() if not isinstance(v, list) and not k.startswith("breakdown")}
        print(summary, flush=True)
        for k in ("breakdown_alone", "breakdown_under_load"):
            if k in r:
                print(f" {k}:")
                print_breakdown(r[k])
    result["machine"]["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    shutil.rmtree(workdir)
    shutil.rmtree(args.repo)
    benchlib.write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
