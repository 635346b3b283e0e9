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
  optionally (--streams, e.g. 1,8,32,64; tost_server and llama-server only) concurrent streams in a
    closed loop after 16-token and 2000-token prompts (--stream-prompts): aggregate tokens/s (the
    streamed tokens that arrive inside the measured window, counted exactly from their arrival
    times), inter-token latency p50 / p99 (the gaps between consecutive streamed events of a request
    that arrive inside the window; the first token's wait is TTFT, reported as its p50, not a gap);
  resident memory per open session at 4000 tokens (clamped to the context; --session-rss-tokens, 0
    skips it): tost_server's RSS slope over sessions held, llama-server's RSS with N slots of that
    context over its RSS with one small slot, CTranslate2's RSS slope over live generations held
    at their first token (definitions: README.md, "How a figure is measured").

Run with the scratch venv's Python of tools/bench/peers/setup.sh (PEERS_PYTHON): it has CTranslate2
and sees the project venv's grpcio.
"""
from __future__ import annotations

import argparse
import ctypes
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
# llama-X runs llama-server with flash attention off (-fa off), llama-X-fa with it on (-fa on): which
# is faster depends on the CPU and the position, and a peer is compared in its best configuration.
ENGINES = ("tost", "tost-bf16", "tost-fp16", "tost-int8", "llama-f32", "llama-f16", "llama-q8_0",
           "llama-f32-fa", "llama-f16-fa", "llama-q8_0-fa", "ct2-float32", "ct2-int8")
MODELS = ("bench-lm", "tost-austen")
# Context cells beyond prompt + new tokens that llama-server's slots get (it rounds a slot's context
# up to a multiple of 256 itself), and that the session-memory prompts stay below the context.
MARGIN = 16
# Sessions forked for tost_server's memory per session (TostEngine.session_rss).
TOST_FORKS = 256


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


def percentile(xs: List[float], q: float) -> Optional[float]:
    """The q-quantile (0..1) of xs, linearly interpolated between the closest ranks; None if empty."""
    if not xs:
        return None
    xs = sorted(xs)
    k = q * (len(xs) - 1)
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_growth(pid: int, add_one, n: int) -> dict:
    """Resident memory per added session, as tools/bench/p5_session_memory.py measures it: the
    process's VmRSS read before and after each of n calls of add_one(i) (which leaves one more
    session held), and the least-squares slope of the growth against the sessions held."""
    import benchlib
    from p5_session_memory import slope

    rss0 = benchlib.proc_rss_bytes(pid)
    xs, ys = [0], [0]
    for i in range(1, n + 1):
        add_one(i)
        xs.append(i)
        ys.append(benchlib.proc_rss_bytes(pid) - rss0)
    return {"sessions": n, "rss_before_bytes": rss0, "growth_bytes": ys[-1],
            "per_session_bytes": slope(xs, ys), "checkpoints": list(zip(xs, ys))}


# ---- tost_server ---------------------------------------------------------------------------------

class TostStream:
    """One streamed Generate: iterating yields (arrival time, tokens so far) per token; cancel()
    (from any thread) ends it, and the iteration then raises or stops."""

    def __init__(self, call):
        self.call = call
        self.cancelled = False

    def cancel(self):
        self.cancelled = True
        self.call.cancel()

    def __iter__(self):
        n = 0
        for r in self.call:
            if r.HasField("token"):
                n += 1
                yield time.perf_counter(), n
            elif r.HasField("final") and r.final.cached_tokens:
                raise RuntimeError(f"expected no prefix-cache hits, got {r.final.cached_tokens} cached tokens")


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
        # What the server chose for this CPU (cpu_precision_flags, cpu_products), for the raw file.
        self.info = [line for line in self.server.log_text().splitlines()
                     if "cpu_precision_flags" in line or "cpu_products" in line][:4]

    def open_stream(self, ids: Sequence[int], new_tokens: int) -> "TostStream":
        req = self.pb2.GenerateRequest(model=self.model, prompt_tokens=self.pb2.TokenIds(ids=list(ids)),
                                       max_new_tokens=new_tokens,
                                       sampling=self.pb2.SamplingParams(temperature=0.0))
        return TostStream(self.stub.Generate(req, timeout=600))

    def _stream(self, ids: Sequence[int], new_tokens: int):
        return iter(self.open_stream(ids, new_tokens))

    def decode(self, ids, new_tokens):
        return timed_decode(self._stream(ids, new_tokens))

    def request(self, ids, new_tokens, events: Optional[list] = None) -> int:
        """Tokens generated; with `events`, each streamed event's (time, tokens so far) appended."""
        n = 0
        for e in self._stream(ids, new_tokens):
            n = e[1]
            if events is not None:
                events.append(e)
        return n

    def session_rss(self, vocab_size: int, tokens: int, sessions: int, key: str) -> dict:
        """Resident memory per open session that has seen `tokens` tokens. `sessions` real ones:
        CreateSession, then Generate with its session_id of a (tokens - 1)-token prompt and one new
        token, held open (one opened and closed first: prefill buffers grown to this length); their
        slope is in `real`. A ToST session's state is a few KiB, below what `sessions` of them move
        RSS by (pages, allocator arenas), so the figure (`per_session_bytes`) is the slope over
        TOST_FORKS more sessions forked from those (ForkSession: the same state, copied), as
        tools/bench/p5_session_memory.py measures, after 32 forks opened and closed."""
        pb2 = self.pb2

        def open_session(k) -> str:
            info = self.stub.CreateSession(pb2.CreateSessionRequest(model=self.model), timeout=30)
            ids = prompt_ids(vocab_size, tokens - 1, f"{key}/{k}")
            req = pb2.GenerateRequest(model=self.model, session_id=info.session_id, max_new_tokens=1,
                                      prompt_tokens=pb2.TokenIds(ids=ids), sampling=pb2.SamplingParams(temperature=0.0))
            final = None
            for r in self.stub.Generate(req, timeout=600):
                if r.HasField("final"):
                    final = r.final
            # tokens - 1 with an end-of-text token, which the session does not consume.
            if final is None or not tokens - 1 <= final.position <= tokens:
                raise RuntimeError(f"expected a session at position {tokens}, got "
                                   f"{final.position if final else 'no final message'}")
            return info.session_id

        def fork(sid: str):
            info = self.stub.ForkSession(pb2.SessionRef(session_id=sid), timeout=30)
            if not tokens - 1 <= info.position <= tokens:
                raise RuntimeError(f"expected a fork at position {tokens}, got {info.position}")
            return info

        warm = open_session("warm")
        self.stub.CloseSession(pb2.SessionRef(session_id=warm), timeout=30)
        time.sleep(0.2)
        held: List[str] = []
        real = rss_growth(self.pid, lambda i: held.append(open_session(i)), sessions)
        for w in [fork(held[0]) for _ in range(32)]:
            self.stub.CloseSession(pb2.SessionRef(session_id=w.session_id), timeout=30)
        time.sleep(0.2)
        infos: list = []
        out = rss_growth(self.pid, lambda i: infos.append(fork(held[i % len(held)])), TOST_FORKS)
        st = self.stub.ServerStatus(pb2.ServerStatusRequest(), timeout=30)
        if st.sessions < sessions + TOST_FORKS:
            raise RuntimeError(f"expected the server to hold {sessions + TOST_FORKS} sessions, "
                               f"it holds {st.sessions}")
        out["real"] = real
        out["server_sessions"] = st.sessions
        out["server_state_bytes_per_session"] = st.session_state_bytes / st.sessions
        out["fork_state_bytes"] = infos[-1].state_bytes
        return out

    def stop(self):
        self.channel.close()
        self.server.__exit__(None, None, None)
        shutil.rmtree(self.repo, ignore_errors=True)


# ---- llama-server --------------------------------------------------------------------------------

class LlamaStream:
    """One streamed /completion (server-sent events): iterating yields (arrival time, tokens so far)
    per event that carries tokens (an event may carry several: llama-server holds a token back
    until its text is complete UTF-8; the twins' ASCII vocabulary makes that rare); the closing
    event, which carries none but the timings, is not yielded. cancel() (from any thread) shuts the
    connection, which llama-server takes as the client going away."""

    def __init__(self, engine: "LlamaEngine", ids, new_tokens: int):
        self.engine = engine
        self.body = engine._body(ids, new_tokens, True)
        self.conn = http.client.HTTPConnection("127.0.0.1", engine.port, timeout=600)
        self.cancelled = False

    def cancel(self):
        self.cancelled = True
        sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __iter__(self):
        try:
            self.conn.connect()
            if self.cancelled:  # after connect(): a cancel() from now on finds the socket
                return
            self.conn.request("POST", "/completion", self.body, {"Content-Type": "application/json"})
            resp = self.conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"llama-server /completion: HTTP {resp.status}: {resp.read()[:500]!r}")
            last = 0
            while True:
                line = resp.readline()
                if not line:
                    break
                if not line.startswith(b"data: "):
                    continue
                now = time.perf_counter()
                event = json.loads(line[6:])
                n = event["tokens_predicted"]
                if n > last:
                    last = n
                    yield now, n
                if event.get("stop"):
                    if "timings" in event:
                        self.engine.timings.append(event["timings"])
                    break
        finally:
            self.conn.close()


class LlamaEngine:
    def __init__(self, binary: str, gguf: str, slot_context: int, cpu: int, parallel: int = 1,
                 extra: Sequence[str] = ()):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="peers_llama_", suffix=".log", delete=False)
        # One thread for generation and for prompt batches, as tost_server's one intra-op thread;
        # the context of the model (per slot with --parallel 1); the web UI off (not measured).
        argv = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(self.port), "-t", "1", "-tb", "1",
                "-c", str(slot_context * parallel), "-np", str(parallel), "--no-webui", *extra]
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
        self.info = llama_build_flags(binary)

    def _log_tail(self) -> str:
        return self.log_text()[-3000:]

    def log_text(self) -> str:
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def _body(self, ids, new_tokens, stream):
        # temperature 0 is greedy in llama.cpp; ignore_eos as CTranslate2's suppressed end token.
        return json.dumps({"prompt": list(ids), "n_predict": new_tokens, "temperature": 0, "cache_prompt": False,
                           "ignore_eos": True, "stream": stream})

    def open_stream(self, ids, new_tokens) -> "LlamaStream":
        return LlamaStream(self, ids, new_tokens)

    def _stream(self, ids, new_tokens):
        return iter(self.open_stream(ids, new_tokens))

    def decode(self, ids, new_tokens):
        return timed_decode(self._stream(ids, new_tokens))

    def request(self, ids, new_tokens, events: Optional[list] = None) -> int:
        """Tokens generated. Without `events`, one non-streaming /completion (one JSON reply); with
        it, a streamed one, each event's (time, tokens so far) appended to `events`."""
        if events is not None:
            n = 0
            for e in self._stream(ids, new_tokens):
                n = e[1]
                events.append(e)
            return n
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
    def __init__(self, model_dir: str, compute_type: str, cpu: int, inter_threads: int = 1,
                 env: Optional[Dict[str, str]] = None):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--ct2-worker", model_dir,
                                      compute_type, str(cpu), str(inter_threads)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1,
                                     env={**os.environ, **env} if env else None)
        self.pid = self.proc.pid
        self.info = [json.dumps(self._call({"op": "ping"}))]

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

    def session_rss(self, vocab_size: int, tokens: int, sessions: int, key: str) -> dict:
        """Resident memory per live generation holding a (tokens - 1)-token prompt's KV cache and
        its first token (the worker's `hold`, which needs inter_threads >= sessions). First,
        `sessions` short ones held at once and released (every CTranslate2 worker thread has run),
        and one of full length held and released (buffers grown to this length)."""
        for i in range(sessions):
            self._call({"op": "hold", "ids": prompt_ids(vocab_size, 64, f"{key}/warm-short/{i}")})
        self._call({"op": "release"})
        self._call({"op": "hold", "ids": prompt_ids(vocab_size, tokens - 1, f"{key}/warm")})
        self._call({"op": "release"})
        out = rss_growth(self.pid, lambda i: self._call({"op": "hold", "ids": prompt_ids(vocab_size, tokens - 1,
                                                                                          f"{key}/{i}")}), sessions)
        self._call({"op": "release"})
        return out

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(60)


def ct2_worker(model_dir: str, compute_type: str, cpu: int, inter_threads: int = 1) -> None:
    """The CTranslate2 side: each generated token timed as it is made, as a client of the other
    engines times their streams; one JSON request and reply per line on stdin/stdout.
    inter_threads > 1 only for the session-memory measurement (`hold`: one live generation per
    CTranslate2 worker thread)."""
    os.sched_setaffinity(0, {cpu})  # before ctranslate2 starts its threads
    import ctranslate2

    generator = ctranslate2.Generator(model_dir, device="cpu", compute_type=compute_type, intra_threads=1,
                                      inter_threads=inter_threads)
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

    # Live generations for the session-memory measurement. generate_tokens alone does not hold a
    # session: its job runs on to max_length in a CTranslate2 worker thread whether or not the
    # iterator is read, and frees its KV cache when it ends. So the step callback blocks at the
    # second step until release: the iterator has handed out the first token, and the job, with the
    # prompt's KV cache (and the first token's), stays live. One job per worker thread
    # (inter_threads); glibc's arenas trimmed (malloc_trim) before each reading, so what stays
    # resident is what the live jobs hold.
    held: List[tuple] = []
    release = threading.Event()
    libc = ctypes.CDLL("libc.so.6")

    def hold(ids):
        if len(held) >= inter_threads:
            raise RuntimeError(f"expected at most inter_threads={inter_threads} live generations")
        reached = threading.Event()
        gate = release

        def step(result):
            if result.step >= 1:
                reached.set()
                gate.wait()
                return True
            return False

        it = generator.generate_tokens([vocab[i] for i in ids], max_length=4, sampling_topk=1,
                                       suppress_sequences=[[eos]], callback=step)
        first = next(it)
        if not reached.wait(600):
            raise RuntimeError("a held generation did not reach its second step in 600 s")
        held.append((it, first))
        libc.malloc_trim(0)

    def release_all():
        nonlocal release
        release.set()
        for it, _ in held:
            for _ in it:
                pass
        held.clear()
        release = threading.Event()
        libc.malloc_trim(0)

    for line in sys.stdin:
        msg = json.loads(line)
        try:
            if msg["op"] == "ping":
                out = {"ok": True, "version": ctranslate2.__version__,
                       "CT2_FORCE_CPU_ISA": os.environ.get("CT2_FORCE_CPU_ISA", "")}
            elif msg["op"] == "decode":
                out = timed_decode(stream(msg["ids"], msg["new_tokens"]))
            elif msg["op"] == "hold":
                hold(msg["ids"])
                out = {"held": len(held)}
            elif msg["op"] == "release":
                release_all()
                out = {"held": 0}
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

def start_engine(engine: str, model: str, args, dims: dict, parallel: int = 1, slot_ctx: Optional[int] = None,
                 llama_extra: Sequence[str] = (), ct2_env: Optional[Dict[str, str]] = None):
    """`parallel`: llama-server's slots (-np) and CTranslate2's inter_threads; `slot_ctx`: the context of
    each llama-server slot (default: the model's with one slot, 256 with several); `ct2_env`: more
    environment for the CTranslate2 worker."""
    twin = os.path.join(args.twins, model)
    if engine == "tost" or engine.startswith("tost-"):
        dtype = engine.split("-", 1)[1] if "-" in engine else "fp32"
        return TostEngine(args.tost_server, os.path.join(args.twins, "tost-repo", model), model, args.cpu,
                          dtype)
    if engine.startswith("llama-"):
        if slot_ctx is None:
            slot_ctx = dims["context_length"] if parallel == 1 else 256
        quant, fa = (engine[6:-3], "on") if engine.endswith("-fa") else (engine[6:], "off")
        return LlamaEngine(args.llama_server, os.path.join(twin, f"gguf-{quant}.gguf"), slot_ctx,
                           args.cpu, parallel, ["-fa", fa, *llama_extra])
    return Ct2Engine(os.path.join(twin, f"ct2-{engine[4:]}"), engine[4:], args.cpu, parallel, ct2_env)


def stream_slot_ctx(dims: dict, prompt_len: int, new_tokens: int) -> int:
    """llama-server's context per slot for the streams after `prompt_len`-token prompts: the prompt,
    the new tokens and MARGIN, at least the 256 of earlier runs, at most the model's context."""
    return min(dims["context_length"], max(256, prompt_len + new_tokens + MARGIN))


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
                    duration_s: float, warmup_s: float, max_warmup_s: float, max_window_s: float) -> dict:
    """Closed loop: n client threads each send a streamed request as soon as its last one ended, and
    record every streamed event's arrival time. The measured window begins once warmup_s has passed
    and every stream has received its first token (the prompts of the first wave, all sent at once,
    have been prefilled), but at most max_warmup_s after the start. It lasts duration_s and until n
    requests have ended in it (one cycle of the loop: where prefill dominates, a server may run the
    streams in waves, a burst of prefills then a burst of decoding, and a window shorter than a wave
    would see one or the other), at most max_window_s; then the requests still in flight are
    cancelled. Counted inside
    the window [t_begin, t_end): the tokens that arrived in it (exactly, from the events' counts),
    the gaps between consecutive events of one request whose later event arrived in it (inter-token
    latency; a llama-server event that carries several tokens is one gap), and the times to first
    token of requests whose first token arrived in it."""
    v = dims["vocab_size"]
    lock = threading.Lock()
    stop = threading.Event()
    everyone_started = threading.Event()
    live: Dict[int, object] = {}
    records: List[tuple] = []  # (sent, [(time, tokens so far), ...])
    errors: List[str] = []
    started = [False] * n
    n_started = [0]
    window = {"begin": None, "ended": 0}  # requests that ended since the window began

    def client(i: int):
        k = 0
        while not stop.is_set():
            ids = prompt_ids(v, prompt_len, f"{model}/streams/{prompt_len}/{n}/{i}/{k}")
            k += 1
            sent = time.perf_counter()
            s = eng.open_stream(ids, new_tokens)
            with lock:
                if stop.is_set():
                    s.cancel()
                    break
                live[i] = s
            events: List[tuple] = []
            try:
                for e in s:
                    events.append(e)
                    if not started[i]:
                        with lock:
                            started[i] = True
                            n_started[0] += 1
                            if n_started[0] == n:
                                everyone_started.set()
                if events and not s.cancelled and window["begin"] is not None and events[-1][0] >= window["begin"]:
                    with lock:
                        window["ended"] += 1
            except Exception as e:  # counted, the loop goes on; a cancelled stream's end is not an error
                if not s.cancelled:
                    with lock:
                        errors.append(str(e)[:200])
                    time.sleep(0.1)
            with lock:
                live.pop(i, None)
                records.append((sent, events))

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    everyone_started.wait(max_warmup_s)
    time.sleep(max(0.0, start + warmup_s - time.perf_counter()))
    t_begin = time.perf_counter()
    window["begin"] = t_begin
    time.sleep(duration_s)
    while window["ended"] < n and time.perf_counter() < t_begin + max_window_s:
        time.sleep(0.05)
    t_end = time.perf_counter()
    with lock:
        stop.set()
        in_flight = list(live.values())
    for s in in_flight:
        s.cancel()
    for t in threads:
        t.join(120)
    stuck = sum(1 for t in threads if t.is_alive())

    tokens = 0
    gaps: List[float] = []
    ttft: List[float] = []
    for sent, events in records:
        prev_t, prev_n = sent, 0
        for j, (t, c) in enumerate(events):
            if t_begin <= t < t_end:
                tokens += c - prev_n
                (gaps if j else ttft).append(t - prev_t)
            prev_t, prev_n = t, c
    ms = 1e3
    itl50, itl99, ttft50 = percentile(gaps, 0.5), percentile(gaps, 0.99), percentile(ttft, 0.5)
    return {"streams": n, "prompt_tokens": prompt_len, "new_tokens": new_tokens,
            "warmup_s": t_begin - start, "warmup_capped": not everyone_started.is_set(), "window_s": t_end - t_begin,
            "window_capped": window["ended"] < n, "requests_ended_in_window": window["ended"],
            "tokens_in_window": tokens, "tokens_per_s": tokens / (t_end - t_begin),
            "itl_p50_ms": itl50 * ms if itl50 is not None else None,
            "itl_p99_ms": itl99 * ms if itl99 is not None else None, "gaps_in_window": len(gaps),
            "ttft_p50_ms": ttft50 * ms if ttft50 is not None else None, "first_tokens_in_window": len(ttft),
            "requests": len(records),
            "requests_completed": sum(1 for _, e in records if e and e[-1][1] >= new_tokens),
            "requests_in_window": sum(1 for _, e in records if e and e[0][0] < t_end and e[-1][0] >= t_begin),
            "cancelled_in_flight": len(in_flight), "stuck_clients": stuck, "errors": len(errors),
            "first_error": errors[0] if errors else None}


def llama_session_rss(args, engine: str, model: str, dims: dict, tokens: int, sessions: int) -> dict:
    """llama-server allocates its KV cache for its whole context at start-up, so a slope over
    requests would show nothing: (RSS of a server with `sessions` slots of tokens + MARGIN context,
    after every slot has processed a (tokens - 1)-token prompt for one new token, all at once) minus
    (RSS of one with one 256-token slot after a short request), over `sessions`. Both servers log at
    verbosity 4, which prints llama.cpp's own KV cache and compute buffer sizes."""
    import benchlib

    v = dims["vocab_size"]
    sizes = ("llama_kv_cache: size", "CPU compute buffer size", "n_ctx_seq ")

    def logged(eng) -> List[str]:
        return [ln.strip() for ln in eng.log_text().splitlines() if any(k in ln for k in sizes)]

    small = start_engine(engine, model, args, dims, parallel=1, slot_ctx=256, llama_extra=("-lv", "4"))
    try:
        small.request(prompt_ids(v, 64, f"{model}/rss/{tokens}/warm"), 8)
        time.sleep(0.2)
        rss_small = benchlib.proc_rss_bytes(small.pid)
        small_log = logged(small)
    finally:
        small.stop()
    slot_ctx = min(dims["context_length"], tokens + MARGIN)
    big = start_engine(engine, model, args, dims, parallel=sessions, slot_ctx=slot_ctx, llama_extra=("-lv", "4"))
    try:
        rss_idle = benchlib.proc_rss_bytes(big.pid)
        got: List[int] = []
        errors: List[str] = []

        def one(i):
            try:
                got.append(big.request(prompt_ids(v, tokens - 1, f"{model}/rss/{tokens}/{i}"), 1))
            except Exception as e:
                errors.append(str(e)[:300])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(sessions)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError(f"llama-server session-memory requests failed: {errors[0]}")
        time.sleep(0.2)
        rss_big = benchlib.proc_rss_bytes(big.pid)
        big_log = logged(big)
        argv = big.argv
    finally:
        big.stop()
    return {"sessions": sessions, "slot_ctx": slot_ctx, "argv": argv, "rss_one_small_slot_bytes": rss_small,
            "rss_idle_bytes": rss_idle, "rss_after_bytes": rss_big,
            "per_session_bytes": (rss_big - rss_small) / sessions, "log_small": small_log, "log": big_log}


def measure_session_rss(engine: str, model: str, args, dims: dict, tokens: int, sessions: int) -> dict:
    key = f"{model}/rss/{tokens}"
    if engine.startswith("llama-"):
        out = llama_session_rss(args, engine, model, dims, tokens, sessions)
    else:
        # CTranslate2: one worker thread per live generation, and glibc's mmap threshold fixed (which
        # also stops it from rising) so that freed prefill buffers go back to the system instead of
        # staying resident in those threads' arenas (on tost-austen they otherwise added about 16 MiB
        # to each session's 4 MiB KV cache).
        ct2 = engine.startswith("ct2-")
        eng = start_engine(engine, model, args, dims, parallel=sessions if ct2 else 1,
                           ct2_env={"MALLOC_MMAP_THRESHOLD_": "131072"} if ct2 else None)
        try:
            out = eng.session_rss(dims["vocab_size"], tokens, sessions, key)
        finally:
            eng.stop()
    out["tokens"] = tokens
    out["mib_per_session"] = out["per_session_bytes"] / 2**20
    return out


def best(values: List[float], higher_is_better: bool) -> float:
    return max(values) if higher_is_better else min(values)


def fmt_num(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3f}"


def fmt_ratio(r: float) -> str:
    return f"{r:.2f}" if abs(r) >= 0.1 else f"{r:.2g}"


def fmt_table(result: dict) -> str:
    engines = result["engines"]
    w = 34
    lines = [f"{'model':<12} {'metric':<{w}} " + " ".join(f"{e:>20}" for e in engines)]
    lines.append("  (each peer: its figure, then tost/peer in parentheses; ms and MiB: below 1 means tost is "
                 "faster or smaller; tokens/s: above 1 means tost is faster)")
    for model, m in result["models"].items():
        rows = [(f"decode ms/token @{p}", m["decode_ms"][p]) for p in m["decode_ms"]]
        rows.append((f"prefill tok/s ({m['prefill_len']})", m["prefill_tps"]))
        for plen, by_n in m.get("streams", {}).items():
            for n, by_engine in by_n.items():
                for key, label in (("tokens_per_s", "tok/s"), ("itl_p50_ms", "ITL p50 ms"),
                                   ("itl_p99_ms", "ITL p99 ms"), ("ttft_p50_ms", "TTFT p50 ms")):
                    rows.append((f"x{n} after {plen}: {label}", {e: r.get(key) for e, r in by_engine.items()}))
        if m.get("session_rss"):
            rows.append((f"RSS MiB/session @{m['session_rss_tokens']}",
                         {e: r["mib_per_session"] for e, r in m["session_rss"].items()}))
        for name, vals in rows:
            cells = []
            tost = vals.get("tost")
            for e in engines:
                x = vals.get(e)
                if x is None:
                    cells.append(f"{'-':>20}")
                elif e == "tost" or not tost or not x:
                    cells.append(f"{fmt_num(x):>20}")
                else:
                    cells.append(f"{fmt_num(x) + f' ({fmt_ratio(tost / x)})':>20}")
            lines.append(f"{model:<12} {name:<{w}} " + " ".join(cells))
    return "\n".join(lines)


def ct2_version() -> Optional[str]:
    try:
        import ctranslate2

        return ctranslate2.__version__
    except ImportError:
        return None


def load_now() -> dict:
    """The machine's load as the run saw it: `uptime`, and how many compilers (cc1plus) ran, since
    other work on the same cores moves the figures."""
    up = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    cc = subprocess.run(["pgrep", "-c", "cc1plus"], capture_output=True, text=True).stdout.strip()
    return {"utc": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()), "uptime": up, "cc1plus": int(cc or 0)}


def cpu_flags() -> List[str]:
    """The CPU's flags from /proc/cpuinfo (the first processor's)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return line.split(":", 1)[1].split()
    except OSError:
        pass
    return []


def sha256(path: str) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def provenance(args) -> dict:
    """What a raw file must name: the commit the binaries were built from (HEAD and whether the tree
    differed from it), the CPU and its flags, the environment that caps instruction sets, and the
    load at the start (the end's is added when the run ends)."""
    def git(*a):
        r = subprocess.run(["git", "-C", ROOT, *a], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else ""

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"), "tree_dirty_files": dirty.splitlines() if dirty else [],
            "tost_server": os.path.abspath(args.tost_server),
            "tost_server_mtime_utc": time.strftime("%Y-%m-%d %H:%M:%SZ",
                                                   time.gmtime(os.path.getmtime(args.tost_server))),
            "tost_server_sha256": sha256(args.tost_server), "ld_library_path": os.environ.get("LD_LIBRARY_PATH", ""),
            "llama_server": os.path.abspath(args.llama_server),
            "llama_server_build": llama_build_flags(args.llama_server), "cpu_flags": cpu_flags(),
            "env": {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "CT2_FORCE_CPU_ISA", "ONEDNN_MAX_CPU_ISA",
                                               "MKL_ENABLE_INSTRUCTIONS") if k in os.environ},
            "start": load_now()}


def llama_build_flags(binary: str) -> List[str]:
    """The instruction-set options llama-server was configured with (its build tree's CMakeCache.txt,
    which setup.sh keeps beside bin/): GGML_NATIVE, GGML_AVX*, GGML_FMA, GGML_F16C."""
    cache = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(binary))), "CMakeCache.txt")
    try:
        with open(cache) as f:
            return [line.strip() for line in f
                    if line.startswith(("GGML_NATIVE:", "GGML_AVX", "GGML_FMA:", "GGML_F16C:", "GGML_AMX"))]
    except OSError:
        return []


def llama_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True)
    return (out.stdout + out.stderr).strip().splitlines()[0] if (out.stdout + out.stderr).strip() else "?"


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--ct2-worker":
        ct2_worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
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
    ap.add_argument("--streams", default="", help="concurrent streams for aggregate tokens/s and inter-token "
                    "latency, e.g. 1,8,32,64 (tost and llama-server only; off by default)")
    ap.add_argument("--stream-prompts", default="16,2000",
                    help="prompt lengths the streams are measured after (clamped so prompt + --stream-tokens fit "
                    "the context); 16 alone is the streams of earlier runs")
    ap.add_argument("--stream-tokens", type=int, default=64, help="new tokens per stream request")
    ap.add_argument("--stream-duration-s", type=float, default=8,
                    help="least measured window after prompts of at most 256 tokens")
    ap.add_argument("--long-stream-duration-s", type=float, default=5,
                    help="least measured window after longer prompts (prefill-dominated)")
    ap.add_argument("--stream-window-max-s", type=float, default=300,
                    help="most measured window (it also lasts until as many requests as streams ended in it)")
    ap.add_argument("--stream-warmup-s", type=float, default=2,
                    help="least warm-up before a window; it also lasts until every stream has had a first token")
    ap.add_argument("--stream-warmup-max-s", type=float, default=300, help="most warm-up before a window")
    ap.add_argument("--session-rss-tokens", type=int, default=4000,
                    help="resident memory per open session of this many tokens (clamped to the context "
                    "less 16); 0 skips it")
    ap.add_argument("--session-rss-sessions", type=int, default=8, help="sessions held for it")
    ap.add_argument("--session-rss-engines", default="",
                    help="the engines whose session memory is measured (default: every engine; the -fa "
                    "variants hold the same KV cache as the plain ones)")
    ap.add_argument("--isa-class", default="",
                    help="a label for the CPU class measured, written to the JSON (e.g. 'AVX-512 BF16/VNNI', "
                    "'AVX2 forced on AVX-512 hardware'); render_readme.py heads a block with it")
    ap.add_argument("--quick", action="store_true", help="positions 100,4000, 16 new tokens, no streams, "
                    "session memory at 1000 tokens with 4 sessions")
    ap.add_argument("--dry-run", action="store_true", help="check the arguments and inputs, measure nothing")
    ap.add_argument("--out", default="peers.json")
    args = ap.parse_args()
    if args.quick:
        args.positions, args.new_tokens, args.streams = "100,4000", 16, ""
        args.session_rss_tokens = min(args.session_rss_tokens, 1000)
        args.session_rss_sessions = min(args.session_rss_sessions, 4)
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
    stream_prompts = [int(s) for s in args.stream_prompts.split(",") if s]
    if streams and (not stream_prompts or min(stream_prompts) < 1 or min(streams) < 1):
        raise SystemExit(f"expected positive --streams and --stream-prompts, got {streams} and {stream_prompts}")
    if args.session_rss_tokens and (args.session_rss_tokens < 2 or args.session_rss_sessions < 2):
        raise SystemExit("expected --session-rss-tokens >= 2 (or 0) and --session-rss-sessions >= 2")
    if args.dry_run:
        print(f"ok: engines {engines}, models {models}, positions {positions}, streams {streams} after prompts "
              f"{stream_prompts if streams else []}, session memory "
              + (f"at {args.session_rss_tokens} tokens, {args.session_rss_sessions} sessions"
                 if args.session_rss_tokens else "off"))
        return
    import benchlib

    machine = benchlib.machine()  # before this process pins itself: its affinity is the machine's
    os.sched_setaffinity(0, {args.client_cpu})
    run_t0 = time.monotonic()
    result: dict = {"machine": machine, "argv": sys.argv, "engines": engines, "cpu": args.cpu,
                    "client_cpu": args.client_cpu, "new_tokens": args.new_tokens, "rounds": args.rounds,
                    "streams": {"counts": streams, "prompts": stream_prompts if streams else [],
                                "new_tokens": args.stream_tokens, "duration_s": args.stream_duration_s,
                                "long_duration_s": args.long_stream_duration_s,
                                "window_max_s": args.stream_window_max_s,
                                "warmup_s": args.stream_warmup_s, "warmup_max_s": args.stream_warmup_max_s},
                    "session_rss": {"tokens": args.session_rss_tokens, "sessions": args.session_rss_sessions},
                    "versions": {"ctranslate2": ct2_version(), "llama-server": llama_version(args.llama_server)},
                    "date_utc": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()), "models": {}, "raw": [],
                    "isa_class": args.isa_class, "provenance": provenance(args)}
    for model in models:
        d = dims[model]
        ctx = d["context_length"]
        # Prompt plus generated tokens stay inside the context.
        pos = sorted({min(p, ctx - args.new_tokens - 1) for p in positions})
        prefill_len = min(args.prefill_len, ctx - 2)
        result["models"][model] = {"dims": d, "positions": pos, "prefill_len": prefill_len,
                                   "decode_ms": {str(p): {} for p in pos}, "prefill_tps": {}, "seconds": {}}
        t0 = time.monotonic()
        for rnd in range(args.rounds):
            order = engines if rnd % 2 == 0 else engines[::-1]
            for engine in order:
                print(f"[{model} round {rnd + 1}] {engine} ...", flush=True)
                eng = start_engine(engine, model, args, d)
                try:
                    r = measure_single(eng, model, rnd, d, pos, prefill_len, args.new_tokens)
                    r["engine_info"] = eng.info
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
        result["models"][model]["seconds"]["single"] = time.monotonic() - t0
        if streams:
            t0 = time.monotonic()
            agg: Dict[str, Dict[str, Dict[str, dict]]] = {}
            plens = sorted({min(p, ctx - args.stream_tokens - 1) for p in stream_prompts})
            for engine in [e for e in engines if not e.startswith("ct2-")]:
                for plen in plens:
                    print(f"[{model} streams after {plen}-token prompts] {engine} ...", flush=True)
                    eng = start_engine(engine, model, args, d, parallel=max(streams),
                                       slot_ctx=stream_slot_ctx(d, plen, args.stream_tokens))
                    try:
                        # Warm-up, not measured: a stream, and one prompt of this length.
                        eng.request(prompt_ids(d["vocab_size"], 16, f"{model}/streams/warm"), args.stream_tokens)
                        if plen > 16:
                            eng.request(prompt_ids(d["vocab_size"], plen, f"{model}/streams/warm/{plen}"), 1)
                        duration = args.long_stream_duration_s if plen > 256 else args.stream_duration_s
                        for n in streams:
                            p0 = time.monotonic()
                            s = measure_streams(eng, model, d, n, plen, args.stream_tokens, duration,
                                                args.stream_warmup_s, args.stream_warmup_max_s,
                                                args.stream_window_max_s)
                            s["point_s"] = time.monotonic() - p0
                            if isinstance(eng, LlamaEngine):
                                s["llama_argv"] = eng.argv
                            result["raw"].append({"model": model, "engine": engine, "streams": s, "engine_info": eng.info})
                            agg.setdefault(str(plen), {}).setdefault(str(n), {})[engine] = {
                                k: s[k] for k in ("tokens_per_s", "itl_p50_ms", "itl_p99_ms", "ttft_p50_ms")}
                            print(f"  x{n}: {s['tokens_per_s']:.0f} tok/s, ITL p50/p99 "
                                  f"{s['itl_p50_ms'] or 0:.1f}/{s['itl_p99_ms'] or 0:.1f} ms, warm-up "
                                  f"{s['warmup_s']:.0f} s{' (capped)' if s['warmup_capped'] else ''}, window "
                                  f"{s['window_s']:.0f} s{' (capped)' if s['window_capped'] else ''}, "
                                  f"{s['point_s']:.0f} s in all", flush=True)
                    finally:
                        eng.stop()
            result["models"][model]["streams"] = agg
            result["models"][model]["seconds"]["streams"] = time.monotonic() - t0
        if args.session_rss_tokens:
            t0 = time.monotonic()
            rss_tokens = min(args.session_rss_tokens, ctx - MARGIN)
            m = result["models"][model]
            m["session_rss_tokens"] = rss_tokens
            # For reference: the twin's KV cache of that many tokens (K and V, every layer).
            kv = 2 * d["n_layer"] * d["n_embd"] * rss_tokens
            m["twin_kv_bytes"] = {"f32": 4 * kv, "f16": 2 * kv}
            m["session_rss"] = {}
            rss_engines = [e for e in args.session_rss_engines.split(",") if e] or engines
            for engine in [e for e in engines if e in rss_engines]:
                print(f"[{model} session memory at {rss_tokens} tokens] {engine} ...", flush=True)
                r = measure_session_rss(engine, model, args, d, rss_tokens, args.session_rss_sessions)
                m["session_rss"][engine] = r
                real = (f" ({r['real']['per_session_bytes'] / 2**20:.3f} over the {r['real']['sessions']} "
                        f"prefilled ones; the server counts {r['server_state_bytes_per_session'] / 1024:.1f} KiB)"
                        if "real" in r else "")
                print(f"  {r['mib_per_session']:.3f} MiB/session{real}", flush=True)
            m["seconds"]["session_rss"] = time.monotonic() - t0
    result["seconds"] = time.monotonic() - run_t0
    result["provenance"]["end"] = load_now()
    table = fmt_table(result)
    result["table"] = table
    benchlib.write_json(args.out, result)
    print()
    print(table)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
