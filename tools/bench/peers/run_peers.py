#!/usr/bin/env python3
"""tost_server (fp32, and with --dtype bf16 / fp16 / int8 as the engines tost-bf16 / tost-fp16 /
tost-int8) against what a
user would run instead on a CPU, side by side in one run: llama.cpp's
llama-server (GGUF f32, f16, q8_0) and CTranslate2 (float32, int8), each serving a GPT-2 twin with
the ToST model's dims (tools/bench/peers/make_twins.py). Every engine is pinned to the same core
with one thread, decodes greedily, and is warmed up before it is measured; two rounds, the engine
order reversed in the second, and each figure is the better of the two rounds (both are in the
JSON). Fairness rules and the measured table: tools/bench/peers/README.md.

Measured per model through each server's network API (CTranslate2 has no server: it runs in a
separate process on the same core, called in-process there):
  decode ms/token at prompt lengths 100, 1000, 4000 (clamped to the context): a fresh random prompt
    of that many token ids, --new-tokens greedy tokens streamed back; the time from the first
    streamed event to the last over the tokens generated in between (so prefill is excluded);
  prefill tokens/s of a 4000-token prompt: its length over the wall time of a request for one
    token (the prompt, one decode step, the round trip);
  optionally aggregate decode tokens/s of 1, 8, 32, 64 concurrent streams after a 16-token prompt
    (tost_server and llama-server only; --streams).

Run with the scratch venv's Python of tools/bench/peers/setup.sh (PEERS_PYTHON): it has CTranslate2
and sees the project venv's grpcio.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "bench"))

# tost-bf16 / tost-fp16 / tost-int8: tost_server with --dtype (weights in that precision on the CPU),
# the counterparts of llama-f16 (bf16, fp16) and of llama-q8_0 and ct2-int8 (int8); "tost" is fp32,
# the one every ratio is taken to.
ENGINES = ("tost", "tost-bf16", "tost-fp16", "tost-int8", "llama-f32", "llama-f16", "llama-q8_0", "ct2-float32", "ct2-int8")
MODELS = ("bench-lm", "tost-austen")


# ---- prompts -------------------------------------------------------------------------------------

def prompt_ids(vocab_size: int, length: int, key: str) -> List[int]:
    """Random token ids, never end-of-text (the last id). A fresh prompt per request (keyed by model,
    round and purpose) so no engine can reuse a cached prefix; the same ids for every engine."""
    rng = random.Random(key)
    return [rng.randrange(vocab_size - 1) for _ in range(length)]


def timed_decode(events) -> Dict[str, float]:
    """`events` yields (time, tokens generated so far) as a stream arrives; the decode rate is taken
    between the first event and the last, so the prompt's prefill is not in it. Servers may hold a
    token back (llama-server waits for complete UTF-8), so counts come from the events themselves."""
    first = last = None
    for t, n in events:
        if first is None:
            first = (t, n)
        last = (t, n)
    if first is None or last[1] <= first[1]:
        raise RuntimeError(f"expected a stream of several tokens, got events {first} .. {last}")
    return {"ms_per_token": (last[0] - first[0]) * 1e3 / (last[1] - first[1]), "tokens": last[1],
            "timed_tokens": last[1] - first[1]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- tost_server ---------------------------------------------------------------------------------

class TostEngine:
    def __init__(self, binary: str, model_dir: str, model: str, cpu: int, dtype: str = "fp32"):
        import grpc
        import tost_launch
        import tost_protos

        self.pb2, pb2_grpc = tost_protos.tost()
        self.model = model
        self.repo = tempfile.mkdtemp(prefix="peers_tost_")
        os.symlink(os.path.abspath(model_dir), os.path.join(self.repo, model))
        # --prefix_cache_bytes=0: the counterpart of llama-server's cache_prompt false.
        self.server = tost_launch.TostServer(self.repo, ["--prefix_cache_bytes=0", f"--dtype={dtype}"], binary=binary,
                                             metrics=False, http=False, log_requests=False,
                                             intra_op_threads=1, cpus=[cpu], stop_timeout_s=60,
                                             remove_log=True).__enter__()
        self.channel = grpc.insecure_channel(self.server.address)
        self.stub = pb2_grpc.TostStub(self.channel)
        self.pid = self.server.proc.pid

    def _stream(self, ids: Sequence[int], new_tokens: int):
        req = self.pb2.GenerateRequest(model=self.model, prompt_tokens=self.pb2.TokenIds(ids=list(ids)),
                                       max_new_tokens=new_tokens,
                                       sampling=self.pb2.SamplingParams(temperature=0.0))
        n = 0
        for r in self.stub.Generate(req, timeout=600):
            if r.HasField("token"):
                n += 1
                yield time.perf_counter(), n
            elif r.HasField("final") and r.final.cached_tokens:
                raise RuntimeError(f"expected no prefix-cache hits, got {r.final.cached_tokens} cached tokens")

    def decode(self, ids, new_tokens):
        return timed_decode(self._stream(ids, new_tokens))

    def request(self, ids, new_tokens) -> int:
        n = 0
        for _, n in self._stream(ids, new_tokens):
            pass
        return n

    def stop(self):
        self.channel.close()
        self.server.__exit__(None, None, None)
        shutil.rmtree(self.repo, ignore_errors=True)


# ---- llama-server --------------------------------------------------------------------------------

class LlamaEngine:
    def __init__(self, binary: str, gguf: str, slot_context: int, cpu: int, parallel: int = 1):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="peers_llama_", suffix=".log", delete=False)
        # One thread for generation and for prompt batches, as tost_server's one intra-op thread;
        # the context of the model (per slot with --parallel 1); the web UI off (not measured).
        argv = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(self.port), "-t", "1", "-tb", "1",
                "-c", str(slot_context * parallel), "-np", str(parallel), "--no-webui"]
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
        self.pid = self.proc.pid
        deadline = time.monotonic() + 180
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited {self.proc.returncode} before ready: {' '.join(argv)}\n"
                                   f"{self._log_tail()}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    conn.close()
                    break
                conn.close()
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"llama-server not ready in 180 s: {' '.join(argv)}\n{self._log_tail()}")
            time.sleep(0.2)
        self.timings: List[dict] = []

    def _log_tail(self) -> str:
        with open(self.log.name, errors="replace") as f:
            return f.read()[-3000:]

    def _body(self, ids, new_tokens, stream):
        # temperature 0 is greedy in llama.cpp; ignore_eos as CTranslate2's suppressed end token.
        return json.dumps({"prompt": list(ids), "n_predict": new_tokens, "temperature": 0, "cache_prompt": False,
                           "ignore_eos": True, "stream": stream})

    def _stream(self, ids, new_tokens):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        conn.request("POST", "/completion", self._body(ids, new_tokens, True), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"llama-server /completion: HTTP {resp.status}: {resp.read()[:500]!r}")
        while True:
            line = resp.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            now = time.perf_counter()
            event = json.loads(line[6:])
            yield now, event["tokens_predicted"]
            if event.get("stop"):
                if "timings" in event:
                    self.timings.append(event["timings"])
                break
        conn.close()

    def decode(self, ids, new_tokens):
        return timed_decode(self._stream(ids, new_tokens))

    def request(self, ids, new_tokens) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        conn.request("POST", "/completion", self._body(ids, new_tokens, False), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        if resp.status != 200:
            raise RuntimeError(f"llama-server /completion: HTTP {resp.status}: {body[:500]!r}")
        out = json.loads(body)
        self.timings.append(out.get("timings", {}))
        return out["tokens_predicted"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.unlink(self.log.name)


# ---- CTranslate2 (in a worker process on the servers' core) -------------------------------------

class Ct2Engine:
    def __init__(self, model_dir: str, compute_type: str, cpu: int):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--ct2-worker", model_dir,
                                      compute_type, str(cpu)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)
        self.pid = self.proc.pid
        self._call({"op": "ping"})

    def _call(self, msg: dict) -> dict:
        self.proc.stdin.write(json.dumps(msg) + "\n")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the CTranslate2 worker exited ({self.proc.wait()}) on {msg['op']}")
        out = json.loads(line)
        if "error" in out:
            raise RuntimeError(f"CTranslate2 worker: {out['error']}")
        return out

    def decode(self, ids, new_tokens):
        return self._call({"op": "decode", "ids": list(ids), "new_tokens": new_tokens})

    def request(self, ids, new_tokens) -> int:
        return self._call({"op": "request", "ids": list(ids), "new_tokens": new_tokens})["tokens"]

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(30)


def ct2_worker(model_dir: str, compute_type: str, cpu: int) -> None:
    """The CTranslate2 side: each generated token timed as it is made, as a client of the other
    engines times their streams; one JSON request and reply per line on stdin/stdout."""
    os.sched_setaffinity(0, {cpu})  # before ctranslate2 starts its threads
    import ctranslate2

    generator = ctranslate2.Generator(model_dir, device="cpu", compute_type=compute_type, intra_threads=1,
                                      inter_threads=1)
    with open(os.path.join(model_dir, "vocabulary.json")) as f:
        vocab = json.load(f)
    eos = vocab[-1]

    def stream(ids, new_tokens):
        # The step callback of generate_batch runs in CTranslate2's decoding thread as each token is
        # made, so its timestamps are the tokens' times. generate_tokens would not do: it hands
        # steps to this Python thread through a queue, and on the one shared core that thread may
        # only run once decoding is over, which makes the steps look simultaneous.
        times: List[float] = []

        def step(_):
            times.append(time.perf_counter())
            return len(times) >= new_tokens

        # sampling_topk=1 is greedy; the end token suppressed so every run makes new_tokens tokens,
        # as llama-server's ignore_eos.
        generator.generate_batch([[vocab[i] for i in ids]], max_length=new_tokens, sampling_topk=1,
                                 suppress_sequences=[[eos]], include_prompt_in_result=False, callback=step)
        return [(t, n + 1) for n, t in enumerate(times)]

    for line in sys.stdin:
        msg = json.loads(line)
        try:
            if msg["op"] == "ping":
                out = {"ok": True, "version": ctranslate2.__version__}
            elif msg["op"] == "decode":
                out = timed_decode(stream(msg["ids"], msg["new_tokens"]))
            else:
                n = 0
                for _, n in stream(msg["ids"], msg["new_tokens"]):
                    pass
                out = {"tokens": n}
        except Exception as e:  # reported to the parent, which names the request
            out = {"error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


# ---- measurement ---------------------------------------------------------------------------------

def start_engine(engine: str, model: str, args, dims: dict, parallel: int = 1):
    twin = os.path.join(args.twins, model)
    if engine == "tost" or engine.startswith("tost-"):
        dtype = engine.split("-", 1)[1] if "-" in engine else "fp32"
        return TostEngine(args.tost_server, os.path.join(args.twins, "tost-repo", model), model, args.cpu,
                          dtype)
    if engine.startswith("llama-"):
        # With several slots each needs only the stream test's prompt and reply, not the whole context.
        slot_ctx = dims["context_length"] if parallel == 1 else 256
        return LlamaEngine(args.llama_server, os.path.join(twin, f"gguf-{engine[6:]}.gguf"), slot_ctx,
                           args.cpu, parallel)
    return Ct2Engine(os.path.join(twin, f"ct2-{engine[4:]}"), engine[4:], args.cpu)


def measure_single(eng, model: str, rnd: int, dims: dict, positions: List[int], prefill_len: int,
                   new_tokens: int) -> dict:
    v = dims["vocab_size"]
    # Warm-up, not measured: a short stream and the longest prompt (buffers grown to their size).
    eng.decode(prompt_ids(v, 64, f"{model}/{rnd}/warm"), 8)
    eng.request(prompt_ids(v, prefill_len, f"{model}/{rnd}/warm-prefill"), 1)
    out: dict = {"decode": {}, "prefill": None}
    for p in positions:
        out["decode"][str(p)] = eng.decode(prompt_ids(v, p, f"{model}/{rnd}/decode/{p}"), new_tokens)
    ids = prompt_ids(v, prefill_len, f"{model}/{rnd}/prefill")
    t0 = time.perf_counter()
    eng.request(ids, 1)
    s = time.perf_counter() - t0
    out["prefill"] = {"tokens": prefill_len, "s": s, "tokens_per_s": prefill_len / s}
    return out


def measure_streams(eng, model: str, dims: dict, n: int, prompt_len: int, new_tokens: int,
                    duration_s: float, warmup_s: float) -> dict:
    """Closed loop: n client threads each send a request as soon as its last one ended. Each request's
    tokens count in the proportion of its duration that lies inside the measured window (spread
    evenly over it): counting only requests that end inside the window would step the figure by
    whole waves of n requests."""
    v = dims["vocab_size"]
    start = time.perf_counter()
    t_begin, t_end = start + warmup_s, start + warmup_s + duration_s
    done: List[tuple] = []
    errors: List[str] = []
    lock = threading.Lock()

    def client(i: int):
        k = 0
        while time.perf_counter() < t_end:
            ids = prompt_ids(v, prompt_len, f"{model}/streams/{n}/{i}/{k}")
            k += 1
            began = time.perf_counter()
            try:
                got = eng.request(ids, new_tokens)
            except Exception as e:  # counted, the loop goes on
                with lock:
                    errors.append(str(e)[:200])
                continue
            now = time.perf_counter()
            with lock:
                done.append((began, now, got))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tokens = sum(g * max(0.0, min(e, t_end) - max(b, t_begin)) / (e - b) for b, e, g in done if e > b)
    return {"streams": n, "tokens_per_s": tokens / duration_s, "requests": len(done),
            "requests_in_window": sum(1 for b, e, _ in done if b < t_end and e > t_begin), "errors": len(errors),
            "first_error": errors[0] if errors else None}


def best(values: List[float], higher_is_better: bool) -> float:
    return max(values) if higher_is_better else min(values)


def fmt_table(result: dict) -> str:
    engines = result["engines"]
    lines = [f"{'model':<12} {'metric':<26} " + " ".join(f"{e:>20}" for e in engines)]
    lines.append("  (each peer: its figure, then tost/peer in parentheses; ms/token: below 1 means tost is "
                 "faster; tokens/s: above 1 means tost is faster)")
    for model, m in result["models"].items():
        rows = [(f"decode ms/token @{p}", m["decode_ms"][p], False) for p in m["decode_ms"]]
        rows.append((f"prefill tok/s ({m['prefill_len']})", m["prefill_tps"], True))
        for n, vals in m.get("streams_tps", {}).items():
            rows.append((f"aggregate tok/s x{n}", vals, True))
        for name, vals, _ in rows:
            cells = []
            tost = vals.get("tost")
            for e in engines:
                x = vals.get(e)
                if x is None:
                    cells.append(f"{'-':>20}")
                elif e == "tost" or tost is None:
                    cells.append(f"{x:>20.3f}" if x < 100 else f"{x:>20.0f}")
                else:
                    num = f"{x:.3f}" if x < 100 else f"{x:.0f}"
                    cells.append(f"{num + f' ({tost / x:.2f})':>20}")
            lines.append(f"{model:<12} {name:<26} " + " ".join(cells))
    return "\n".join(lines)


def ct2_version() -> Optional[str]:
    try:
        import ctranslate2

        return ctranslate2.__version__
    except ImportError:
        return None


def llama_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True)
    return (out.stdout + out.stderr).strip().splitlines()[0] if (out.stdout + out.stderr).strip() else "?"


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--ct2-worker":
        ct2_worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    deps = os.environ.get("TOST_DEPS_DIR", "/opt/tost-deps")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tost-server", required=True, help="tost_server binary (build/service/tost_server)")
    ap.add_argument("--llama-server", required=True, help="llama-server binary (PEERS_LLAMA_SERVER of setup.sh)")
    ap.add_argument("--twins", default=os.path.join(deps, "peers", "twins"), help="make_twins.py's --out")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)),
                    help="the one core every engine runs on (default: the last this process may use)")
    ap.add_argument("--client-cpu", type=int, default=min(os.sched_getaffinity(0)),
                    help="the core the measuring client runs on")
    ap.add_argument("--positions", default="100,1000,4000")
    ap.add_argument("--prefill-len", type=int, default=4000)
    ap.add_argument("--new-tokens", type=int, default=32, help="tokens generated per decode measurement")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--streams", default="", help="concurrent streams for aggregate tokens/s, e.g. 1,8,32,64 "
                    "(tost and llama-server only; off by default)")
    ap.add_argument("--stream-tokens", type=int, default=64)
    ap.add_argument("--stream-duration-s", type=float, default=10)
    ap.add_argument("--quick", action="store_true", help="positions 100,4000, 16 new tokens, no streams")
    ap.add_argument("--dry-run", action="store_true", help="check the arguments and inputs, measure nothing")
    ap.add_argument("--out", default="peers.json")
    args = ap.parse_args()
    if args.quick:
        args.positions, args.new_tokens, args.streams = "100,4000", 16, ""
    engines = [e for e in args.engines.split(",") if e]
    models = [m for m in args.models.split(",") if m]
    bad = [e for e in engines if e not in ENGINES] + [m for m in models if m not in MODELS]
    if bad:
        raise SystemExit(f"unknown engine(s)/model(s) {bad}; expected engines from {ENGINES}, models from {MODELS}")
    if "tost" not in engines:
        raise SystemExit("expected 'tost' among --engines: the table is of ratios to it")
    for path, what in ((args.tost_server, "--tost-server"), (args.llama_server, "--llama-server")):
        if not os.access(path, os.X_OK):
            raise SystemExit(f"expected an executable {what}, got {path}")
    dims = {}
    for m in models:
        p = os.path.join(args.twins, m, "dims.json")
        if not os.path.exists(p):
            raise SystemExit(f"expected {p}; run make_twins.py --out {args.twins} first")
        with open(p) as f:
            dims[m] = json.load(f)
    if any(e.startswith("ct2-") for e in engines) and ct2_version() is None:
        raise SystemExit(f"expected ctranslate2 importable by {sys.executable}; run it with setup.sh's PEERS_PYTHON")
    positions = [int(p) for p in args.positions.split(",") if p]
    streams = [int(s) for s in args.streams.split(",") if s]
    if args.dry_run:
        print(f"ok: engines {engines}, models {models}, positions {positions}, streams {streams}")
        return
    import benchlib

    machine = benchlib.machine()  # before this process pins itself: its affinity is the machine's
    os.sched_setaffinity(0, {args.client_cpu})
    result: dict = {"machine": machine, "argv": sys.argv, "engines": engines, "cpu": args.cpu,
                    "client_cpu": args.client_cpu, "new_tokens": args.new_tokens, "rounds": args.rounds,
                    "versions": {"ctranslate2": ct2_version(), "llama-server": llama_version(args.llama_server)},
                    "date_utc": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()), "models": {}, "raw": []}
    for model in models:
        d = dims[model]
        ctx = d["context_length"]
        # Prompt plus generated tokens stay inside the context.
        pos = sorted({min(p, ctx - args.new_tokens - 1) for p in positions})
        prefill_len = min(args.prefill_len, ctx - 2)
        result["models"][model] = {"dims": d, "positions": pos, "prefill_len": prefill_len,
                                   "decode_ms": {str(p): {} for p in pos}, "prefill_tps": {}}
        for rnd in range(args.rounds):
            order = engines if rnd % 2 == 0 else engines[::-1]
            for engine in order:
                print(f"[{model} round {rnd + 1}] {engine} ...", flush=True)
                eng = start_engine(engine, model, args, d)
                try:
                    r = measure_single(eng, model, rnd, d, pos, prefill_len, args.new_tokens)
                    if isinstance(eng, LlamaEngine):
                        r["llama_timings"] = eng.timings[-len(pos) - 1:]
                finally:
                    eng.stop()
                result["raw"].append({"model": model, "round": rnd, "engine": engine, **r})
        for e in engines:
            raws = [r for r in result["raw"] if r["model"] == model and r["engine"] == e]
            for p in pos:
                result["models"][model]["decode_ms"][str(p)][e] = best(
                    [r["decode"][str(p)]["ms_per_token"] for r in raws], False)
            result["models"][model]["prefill_tps"][e] = best([r["prefill"]["tokens_per_s"] for r in raws], True)
        if streams:
            agg: Dict[str, Dict[str, float]] = {str(n): {} for n in streams}
            for engine in [e for e in engines if not e.startswith("ct2-")]:
                print(f"[{model} streams] {engine} ...", flush=True)
                eng = start_engine(engine, model, args, d, parallel=max(streams))
                try:
                    eng.request(prompt_ids(d["vocab_size"], 16, f"{model}/streams/warm"), args.stream_tokens)
                    for n in streams:
                        s = measure_streams(eng, model, d, n, 16, args.stream_tokens, args.stream_duration_s, 2.0)
                        result["raw"].append({"model": model, "engine": engine, "streams": s})
                        agg[str(n)][engine] = s["tokens_per_s"]
                finally:
                    eng.stop()
            result["models"][model]["streams_tps"] = agg
    table = fmt_table(result)
    result["table"] = table
    benchlib.write_json(args.out, result)
    print()
    print(table)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
