#!/usr/bin/env python3
"""Responses API against resent chat history: the same --conversations scripted conversations of
--turns turns each, run several ways against tost-austen, one mode after the other in one run, on
one copy of the server binary:

  responses          POST /v1/responses, each turn continuing the previous one by
                     previous_response_id (store on, the default): the server keeps the
                     conversation's state in the record store, on Redis, and prefills only the
                     turn's new input;
  chat_cache         POST /v1/chat/completions resending the whole history (the messages list
                     grows by the user's input and the reply each turn), with the prefix-state
                     cache on (the default), which also spares most of a resent history's prefill;
  chat_nocache       the same with --prefix_cache_bytes=0: every turn prefills its whole history;
  responses_memory   responses on a server with the in-memory store (--session_store=memory);
  chat_cache_memory  chat_cache on a server with the in-memory store: no shared prefix tier in Redis.

Each mode gets a fresh redis-server (no persistence; tests/integration/redis_server.py) and a fresh
tost_server with a random --session_key_file and --session_store=redis://... (the deployment the
Responses API shares across replicas; chat_cache runs on the same flags, so its prefix cache has
its shared tier in that Redis too), or --session_store=memory for the *_memory modes. The server
and Redis are pinned to every core but --client-cpu, where this client runs (asyncio,
--concurrency conversations in flight on a keep-alive connection each, each one turn at a time).
Every turn is greedy (temperature 0) with --max-tokens output tokens, and its user input is drawn
(seeded) from short fixed lists: every mode sends the same user inputs; the replies may differ
between the APIs (a resent reply is tokenized again).

Reported per mode: tokens prefilled (tost_prefill_tokens_total delta), wall time, turns per second,
turn latency by turn index (mean, p50, p90), usage per turn; for the responses modes, each turn's
input_tokens - cached_tokens (min/max per turn: the new input only, checked against the history
each turn continues and against the prefill counter), and, on Redis, memory per stored response
(MEMORY USAGE over a sample of the <prefix>r:* keys, mean and max; INFO used_memory delta over
responses stored); the ratios between the modes; the CPU and the server's CPU ISA (its
`cpu_precision_flags` log field). Not part of `make test`:

  tools/bench/responses_bench.py --conversations 64 --turns 20    # a quick run (under a minute)
  tools/bench/responses_bench.py --out responses.json             # 1,000 x 20, the default (4 minutes)

Prints tables and one JSON line (also written to --out when given); exits non-zero when a turn
failed or a check did not hold.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

sys.path.insert(0, os.path.join(benchlib.ROOT, "tests", "integration"))
import redis_server  # noqa: E402

MODEL = "tost-austen"
MODELS = os.path.join(benchlib.ROOT, "models")
KEY_PREFIX = "tost:"
OPENINGS = ["Who is Mr. Darcy?", "Tell me about Emma.", "What is Bath like?", "Describe Pemberley.",
            "Who is Anne Elliot?", "What happened at the ball?", "Is Mr. Knightley kind?", "Where is Hartfield?"]
FOLLOW_UPS = ["Go on.", "Why?", "And then?", "What did she say?", "Tell me more.", "Was he right?",
              "Who else was there?", "How did it end?"]
MODES = ("responses", "chat_cache", "chat_nocache", "responses_memory", "chat_cache_memory")
MODE_FLAGS = {"chat_nocache": ["--prefix_cache_bytes=0"]}
MODE_NAMES = {"responses": "responses (previous_response_id), Redis store",
              "chat_cache": "chat, history resent, prefix cache on, Redis",
              "chat_nocache": "chat, history resent, prefix cache off",
              "responses_memory": "responses, in-memory store",
              "chat_cache_memory": "chat, resent, prefix cache on, memory store"}


def is_responses(mode: str) -> bool:
    return mode.startswith("responses")


def store_of(mode: str, redis) -> str:
    return "memory" if mode.endswith("_memory") else redis.url()


def script(conversations: int, turns: int, seed: int) -> list:
    """The user input of every turn of every conversation (the same for every mode)."""
    rng = random.Random(seed)
    return [[rng.choice(OPENINGS)] + [rng.choice(FOLLOW_UPS) for _ in range(turns - 1)]
            for _ in range(conversations)]


def percentile(sorted_values: list, q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, int(round(q / 100 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


def prefill_total(metrics_port: int) -> float:
    m = benchlib.scrape_metrics(metrics_port, "tost_prefill_tokens_total")
    return sum(v for k, v in m.items() if f'model="{MODEL}"' in k)


def http_duration(metrics_port: int, route: str) -> tuple:
    """(sum of seconds, count) of the server's tost_http_request_duration_seconds for `route`."""
    m = benchlib.scrape_metrics(metrics_port, "tost_http_request_duration_seconds_")
    label = f'route="{route}"'
    total = sum(v for k, v in m.items() if k.startswith("tost_http_request_duration_seconds_sum") and label in k)
    count = sum(v for k, v in m.items() if k.startswith("tost_http_request_duration_seconds_count") and label in k)
    return total, count


def server_isa(log_text: str) -> str:
    m = re.search(r'cpu_precision_flags="([^"]*)"', log_text)
    return m.group(1) if m else "unknown (no cpu_precision_flags in the server's log)"


def torch_isa() -> str:
    try:
        import torch

        return f"{torch.backends.cpu.get_cpu_capability()} (torch {torch.__version__})"
    except Exception as e:  # noqa: BLE001 - informational only
        return f"unknown ({e.__class__.__name__})"


def redis_pipe(url: str, commands: list) -> list:
    """Runs `commands` (argument lists without spaces) through one redis-cli, its replies in order."""
    text = "".join(" ".join(str(a) for a in c) + "\n" for c in commands)
    out = subprocess.run([redis_server.REDIS_CLI, "-u", url, "--no-auth-warning"], input=text,
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"redis-cli failed: {out.stderr}")
    return out.stdout.splitlines()


def key_kinds(redis) -> dict:
    """How many keys of each kind (<prefix>r: records, <prefix>p: prefix-cache entries, ...)."""
    kinds = {}
    for k in redis.keys("*"):
        kind = k[:len(KEY_PREFIX) + 2] if k.startswith(KEY_PREFIX) else "other"
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


# ------------------------------------------------------------------------------------------------
# The client
# ------------------------------------------------------------------------------------------------

class Connection:
    """One keep-alive HTTP/1.1 connection to the server, one request at a time: a few lines of
    asyncio streams, because httpx's AsyncClient spent about 8 ms of CPU per request with 64
    connections open (measured here), which made the client, not the server, the bottleneck."""

    def __init__(self, port: int):
        self.port = port
        self.reader = self.writer = None

    async def post(self, path: str, body: dict) -> tuple:
        """(status, parsed JSON body)."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        data = json.dumps(body).encode()
        self.writer.write(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n" % (path.encode(), len(data)) + data)
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split()[1])
        headers = {}
        for line in head[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        if "content-length" not in headers:
            raise RuntimeError(f"{path}: a response without Content-Length: {head}")
        payload = await self.reader.readexactly(int(headers["content-length"]))
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return status, json.loads(payload)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = self.reader = None


async def run_conversations(mode: str, http_port: int, inputs: list, concurrency: int, max_tokens: int,
                            progress_s: float) -> dict:
    """Every conversation of `inputs`, `concurrency` at a time (one connection each), each turn
    after the previous one's answer. Returns per conversation its turns [(latency s, input/prompt
    tokens, cached tokens, output tokens, finish)] and the errors."""
    conversations = [None] * len(inputs)
    errors = []
    next_conv = 0
    done_turns = 0

    async def one(conn: Connection, i: int) -> None:
        nonlocal done_turns
        turns = []
        previous = None
        messages = []
        for t, text in enumerate(inputs[i]):
            if is_responses(mode):
                path = "/v1/responses"
                body = {"model": MODEL, "input": text, "temperature": 0, "max_output_tokens": max_tokens}
                if previous:
                    body["previous_response_id"] = previous
            else:
                path = "/v1/chat/completions"
                messages.append({"role": "user", "content": text})
                body = {"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": max_tokens}
            t0 = time.perf_counter()
            status, data = await conn.post(path, body)
            latency = time.perf_counter() - t0
            if status != 200:
                errors.append(f"conversation {i} turn {t + 1}: {status} {json.dumps(data)[:300]}")
                break
            u = data["usage"]
            if is_responses(mode):
                previous = data["id"]
                turns.append((latency, u["input_tokens"], u["input_tokens_details"]["cached_tokens"],
                              u["output_tokens"], data["status"]))
            else:
                choice = data["choices"][0]
                messages.append({"role": "assistant", "content": choice["message"]["content"]})
                turns.append((latency, u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"],
                              u["completion_tokens"], choice["finish_reason"]))
            done_turns += 1
        conversations[i] = turns

    async def worker() -> None:
        nonlocal next_conv
        conn = Connection(http_port)
        try:
            while next_conv < len(inputs):
                i = next_conv
                next_conv += 1
                try:
                    await one(conn, i)
                except (OSError, asyncio.IncompleteReadError, RuntimeError, ValueError) as e:
                    errors.append(f"conversation {i}: {e.__class__.__name__}: {e}")
                    await conn.close()
        finally:
            await conn.close()

    async def progress(t0: float) -> None:
        total = sum(len(c) for c in inputs)
        while True:
            await asyncio.sleep(progress_s)
            s = time.monotonic() - t0
            print(f"  {mode}: {done_turns:,}/{total:,} turns in {s:.0f} s ({done_turns / s:,.0f}/s), "
                  f"{len(errors)} errors", flush=True)

    t0 = time.monotonic()
    reporter = asyncio.create_task(progress(t0))
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    reporter.cancel()
    return {"conversations": conversations, "errors": errors}


# ------------------------------------------------------------------------------------------------
# One mode
# ------------------------------------------------------------------------------------------------

def run_mode(mode: str, args, binary_dir: str, key_file: str, inputs: list, server_cpus: list) -> dict:
    print(f"--- {mode}: {len(inputs):,} conversations x {args.turns} turns, {args.concurrency} in flight", flush=True)
    redis = redis_server.RedisServer(appendonly=False)
    try:
        os.sched_setaffinity(redis.proc.pid, server_cpus)
        store = store_of(mode, redis)
        flags = [f"--session_key_file={key_file}", f"--session_store={store}",
                 f"--session_store_key_prefix={KEY_PREFIX}", *MODE_FLAGS.get(mode, [])]
        server = benchlib.start_tost_server(binary_dir, MODELS, flags, cpus=server_cpus, metrics=True)
        with server:
            isa = server_isa(server.log_text())
            route = "/v1/responses" if is_responses(mode) else "/v1/chat/completions"
            mem_before = redis_server.info(redis.url(), "memory")
            prefill_before = prefill_total(server.metrics_port)
            dur_before = http_duration(server.metrics_port, route)
            cpu_before = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.monotonic()
            run = asyncio.run(run_conversations(mode, server.http_port, inputs, args.concurrency, args.max_tokens,
                                                args.progress_s))
            seconds = time.monotonic() - t0
            cpu_after = resource.getrusage(resource.RUSAGE_SELF)
            prefill = prefill_total(server.metrics_port) - prefill_before
            dur_after = http_duration(server.metrics_port, route)
            mem_after = redis_server.info(redis.url(), "memory")
            server_rss = benchlib.proc_rss_bytes(server.pid)
            out = {"mode": mode, "server_flags": MODE_FLAGS.get(mode, []) + [
                       f"--session_store={'memory' if store == 'memory' else 'redis://...'}", "--session_key_file=..."],
                   "server_cpu_isa": isa, "seconds": round(seconds, 2),
                   "prefill_tokens": int(prefill), "errors": run["errors"][:20], "error_count": len(run["errors"]),
                   "client_cpu_s": round((cpu_after.ru_utime + cpu_after.ru_stime)
                                         - (cpu_before.ru_utime + cpu_before.ru_stime), 1),
                   "server_rss_bytes": server_rss,
                   "server_mean_request_ms": round(1000 * (dur_after[0] - dur_before[0])
                                                   / max(1, dur_after[1] - dur_before[1]), 3),
                   "redis_used_memory_before": int(mem_before["used_memory"]),
                   "redis_used_memory_after": int(mem_after["used_memory"]),
                   "redis_keys": key_kinds(redis)}
            out.update(summarize(mode, run["conversations"], args.turns))
            if is_responses(mode):
                out["checks"] = responses_checks(run["conversations"], prefill)
            if mode == "responses":
                out["redis"] = record_memory(redis, args.memory_sample, out["turns_done"],
                                             int(mem_after["used_memory"]) - int(mem_before["used_memory"]))
            code = server.stop()
            if code != 0:
                out["errors"].append(f"tost_server exited with {code}")
                out["error_count"] += 1
        return out
    finally:
        redis.close()


def summarize(mode: str, conversations: list, turns: int) -> dict:
    done = [c for c in conversations if c]
    by_turn = []
    for t in range(turns):
        rows = [c[t] for c in done if len(c) > t]
        if not rows:
            continue
        lat = sorted(r[0] for r in rows)
        new_input = [r[1] - r[2] for r in rows]
        by_turn.append({
            "turn": t + 1, "n": len(rows),
            "latency_ms_mean": round(1000 * sum(lat) / len(lat), 2),
            "latency_ms_p50": round(1000 * percentile(lat, 50), 2),
            "latency_ms_p90": round(1000 * percentile(lat, 90), 2),
            "input_tokens_mean": round(sum(r[1] for r in rows) / len(rows), 1),
            "input_tokens_max": max(r[1] for r in rows),
            "cached_tokens_mean": round(sum(r[2] for r in rows) / len(rows), 1),
            "uncached_input_min": min(new_input), "uncached_input_max": max(new_input),
            "uncached_input_mean": round(sum(new_input) / len(new_input), 2),
            "output_tokens_mean": round(sum(r[3] for r in rows) / len(rows), 2),
        })
    all_lat = sorted(r[0] for c in done for r in c)
    return {"conversations_done": sum(1 for c in conversations if c is not None and len(c) == turns),
            "turns_done": len(all_lat), "by_turn": by_turn,
            "usage_uncached_input_tokens": sum(r[1] - r[2] for c in done for r in c),
            "usage_input_tokens": sum(r[1] for c in done for r in c),
            "output_tokens": sum(r[3] for c in done for r in c),
            "max_context_tokens": max((r[1] + r[3] for c in done for r in c), default=0),
            "latency_ms_mean": round(1000 * sum(all_lat) / max(1, len(all_lat)), 2),
            "latency_ms_p50": round(1000 * percentile(all_lat, 50), 2),
            "latency_ms_p90": round(1000 * percentile(all_lat, 90), 2),
            "latency_ms_p99": round(1000 * percentile(all_lat, 99), 2)}


def responses_checks(conversations: list, prefill: float) -> dict:
    """Each continued turn's cached tokens are the whole history before it (the previous turn's
    input and output): what it prefills is its new input only. The server's prefill counter agrees:
    it counts every uncached input token, but for a turn that starts from a fresh state, whose last
    prompt token is fed by the first decode step instead of a prefill chunk."""
    history_mismatch = 0
    expected_prefill = 0
    for c in conversations:
        for t, (_, inp, cached, out, _) in enumerate(c or []):
            if t == 0:
                expected_prefill += inp - cached - 1
            else:
                expected_prefill += inp - cached
                if cached != c[t - 1][1] + c[t - 1][3]:
                    history_mismatch += 1
    return {"continued_turns_not_caching_their_whole_history": history_mismatch,
            "prefill_counter": int(prefill), "prefill_expected_from_usage": expected_prefill,
            "ok": history_mismatch == 0 and int(prefill) == expected_prefill}


def record_memory(redis, sample: int, stored: int, used_delta: int) -> dict:
    keys = redis.keys(f"{KEY_PREFIX}r:*")
    rng = random.Random(1)
    picked = rng.sample(keys, min(sample, len(keys)))
    usage = [int(x) for x in redis_pipe(redis.url(), [["MEMORY", "USAGE", k] for k in picked])]
    lengths = [int(x) for x in redis_pipe(redis.url(), [["STRLEN", k] for k in picked])]
    return {"records": len(keys), "responses_stored": stored, "sampled": len(picked),
            "memory_usage_mean": round(sum(usage) / max(1, len(usage)), 1),
            "memory_usage_max": max(usage, default=0), "memory_usage_min": min(usage, default=0),
            "value_bytes_mean": round(sum(lengths) / max(1, len(lengths)), 1),
            "used_memory_delta": used_delta,
            "used_memory_delta_per_response": round(used_delta / stored, 1) if stored else None}


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------

def report(result: dict) -> None:
    modes = result["modes"]
    m = result["machine"]
    print(f"\nResponses API vs resent chat history: {MODEL}, {result['conversations']:,} conversations x "
          f"{result['turns']} turns, {result['concurrency']} in flight, {result['max_tokens']} output tokens a turn, "
          f"greedy")
    print(f"  CPU: {m.get('cpu_model', '?')}, {m['cpus']} cores (client on core {result['client_cpu']}, server and "
          f"Redis on {result['server_cpus']}); server CPU ISA: {result['server_cpu_isa']}; "
          f"LibTorch capability: {result['torch_cpu_capability']}")
    print(f"  server binary sha256 {result['binary_sha256'][:16]}, tree {result['git_head']}")
    names = MODE_NAMES
    print(f"\n  {'mode':<46} {'wall s':>8} {'turns/s':>8} {'prefilled':>11} {'per turn':>9} {'lat mean':>9} "
          f"{'p50':>7} {'p90':>7} {'p99':>7} {'srv ms':>7} {'cli cpu':>8} {'errors':>6}")
    for name in MODES:
        r = modes.get(name)
        if r is None:
            continue
        print(f"  {names[name]:<46} {r['seconds']:>8.1f} {r['turns_done'] / r['seconds']:>8.0f} "
              f"{r['prefill_tokens']:>11,} {r['prefill_tokens'] / max(1, r['turns_done']):>9.1f} "
              f"{r['latency_ms_mean']:>9.1f} {r['latency_ms_p50']:>7.1f} {r['latency_ms_p90']:>7.1f} "
              f"{r['latency_ms_p99']:>7.1f} {r['server_mean_request_ms']:>7.1f} {r['client_cpu_s']:>8.1f} "
              f"{r['error_count']:>6}")
    print("  (lat: client-side turn latency in ms; srv ms: the server's mean request duration; cli cpu: this "
          "client's CPU seconds)")

    print("\n  turn latency by turn index, ms (mean / p50 / p90), and tokens prefilled per turn by usage "
          "(input - cached: mean, and min-max for responses)")
    header = f"  {'turn':>4}"
    for name in MODES:
        if name in modes:
            header += f"  {name + ' mean/p50/p90':>26} {'new':>9}"
    print(header)
    for t in range(result["turns"]):
        line = f"  {t + 1:>4}"
        for name in MODES:
            if name not in modes:
                continue
            rows = [b for b in modes[name]["by_turn"] if b["turn"] == t + 1]
            if not rows:
                line += f"  {'-':>26} {'-':>9}"
                continue
            b = rows[0]
            lat = f"{b['latency_ms_mean']:.1f}/{b['latency_ms_p50']:.1f}/{b['latency_ms_p90']:.1f}"
            new = (f"{b['uncached_input_min']}-{b['uncached_input_max']}" if is_responses(name)
                   else f"{b['uncached_input_mean']:.1f}")
            line += f"  {lat:>26} {new:>9}"
        print(line)

    print()
    for name in MODES:
        if name in modes and is_responses(name):
            c = modes[name]["checks"]
            print(f"  {name}: each continued turn cached its whole history: "
                  f"{'yes' if c['continued_turns_not_caching_their_whole_history'] == 0 else 'NO'} "
                  f"({c['continued_turns_not_caching_their_whole_history']} turns did not); prefill counter "
                  f"{c['prefill_counter']:,} vs {c['prefill_expected_from_usage']:,} from usage: "
                  f"{'equal' if c['prefill_counter'] == c['prefill_expected_from_usage'] else 'DIFFERENT'}")
    if "responses" in modes:
        r = modes["responses"]
        red = r["redis"]
        print(f"  Redis per stored response: MEMORY USAGE mean {red['memory_usage_mean']:,.0f} B, max "
              f"{red['memory_usage_max']:,} B over {red['sampled']:,} sampled of {red['records']:,} records "
              f"(value {red['value_bytes_mean']:,.0f} B); used_memory delta {red['used_memory_delta']:,} B / "
              f"{red['responses_stored']:,} responses = {red['used_memory_delta_per_response']:,.0f} B; keys "
              f"{r['redis_keys']}")
    for name in ("chat_cache", "chat_nocache"):
        if name in modes:
            r = modes[name]
            print(f"  {name}: Redis used_memory {r['redis_used_memory_before']:,} -> {r['redis_used_memory_after']:,} B, "
                  f"keys {r['redis_keys']}")

    print("\n  ratios (measured side by side in this run)")
    for k, v in result["ratios"].items():
        print(f"    {k:<72} {v:>6.2f}")


def ratios(modes: dict) -> dict:
    """Each other mode against responses (on Redis), and the two in-memory modes against each other."""
    out = {}
    last = lambda m: modes[m]["by_turn"][-1]["latency_ms_mean"]  # noqa: E731
    pairs = [(name, "responses") for name in MODES if name != "responses"]
    pairs.append(("chat_cache_memory", "responses_memory"))
    for name, base in pairs:
        c, r = modes.get(name), modes.get(base)
        if c is None or r is None:
            continue
        out[f"prefilled tokens, {name} / {base}"] = c["prefill_tokens"] / max(1, r["prefill_tokens"])
        out[f"wall time, {name} / {base}"] = c["seconds"] / r["seconds"]
        out[f"mean turn latency, {name} / {base}"] = c["latency_ms_mean"] / r["latency_ms_mean"]
        out[f"mean latency of the last turn, {name} / {base}"] = last(name) / last(base)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default=os.environ.get("TOST_BUILD_DIR", benchlib.DEFAULT_BUILD),
                    help="CMake build directory with tost_server (default build/)")
    ap.add_argument("--conversations", type=int, default=1000)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--concurrency", type=int, default=64, help="conversations in flight")
    ap.add_argument("--max-tokens", type=int, default=8, help="max_output_tokens / max_tokens per turn")
    ap.add_argument("--modes", default=",".join(MODES), help=f"a comma-separated subset of {','.join(MODES)}")
    ap.add_argument("--client-cpu", type=int, default=0, help="core this client is pinned to; servers get the rest")
    ap.add_argument("--memory-sample", type=int, default=2000, help="stored responses whose MEMORY USAGE is read")
    ap.add_argument("--seed", type=int, default=0, help="seed of the user inputs' draw")
    ap.add_argument("--progress-s", type=float, default=30, help="seconds between progress lines")
    ap.add_argument("--out", default="", help="also write the JSON here")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in MODES for m in modes):
        ap.error(f"--modes: each of {','.join(MODES)}")
    with open(os.path.join(MODELS, MODEL, "config.json")) as f:
        context = json.load(f)["lm"]["context_length"]

    server_cpus = benchlib.other_cpus(args.client_cpu)
    machine = benchlib.machine()
    os.sched_setaffinity(0, [args.client_cpu])
    inputs = script(args.conversations, args.turns, args.seed)
    work = tempfile.mkdtemp(prefix="responses_bench_")
    try:
        # One copy of the binary for every mode, whatever is rebuilt meanwhile.
        source = benchlib.find_binary(args.build_dir, "service/tost_server")
        binary = os.path.join(work, "tost_server")
        shutil.copy2(source, binary)
        with open(binary, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        key_file = os.path.join(work, "session.key")
        with open(key_file, "wb") as f:
            f.write(os.urandom(32))
        head = subprocess.run(["git", "-C", benchlib.ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", benchlib.ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        results = {}
        for mode in modes:
            results[mode] = run_mode(mode, args, work, key_file, inputs, server_cpus)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    isa = next(iter(results.values()))["server_cpu_isa"] if results else "?"
    result = {"bench": "responses", "machine": machine, "model": MODEL, "context_length": context,
              "conversations": args.conversations, "turns": args.turns, "concurrency": args.concurrency,
              "max_tokens": args.max_tokens, "seed": args.seed, "client_cpu": args.client_cpu,
              "server_cpus": server_cpus, "server_cpu_isa": isa, "torch_cpu_capability": torch_isa(),
              "binary": source, "binary_sha256": sha, "binary_mtime": time.strftime(
                  "%Y-%m-%dT%H:%M:%SZ", time.gmtime(os.path.getmtime(source))),
              "git_head": head + ("+dirty" if dirty else ""),
              "argv": sys.argv[1:], "loadavg_end": open("/proc/loadavg").read().split()[:3],
              "modes": results, "ratios": ratios(results)}
    report(result)
    line = json.dumps(result, sort_keys=True)
    print(line)
    if args.out:
        benchlib.write_json(args.out, result)

    problems = []
    for name, r in results.items():
        if r["error_count"]:
            problems.append(f"{name}: {r['error_count']} errors, e.g. {r['errors'][:2]}")
        if r["conversations_done"] != args.conversations:
            problems.append(f"{name}: {r['conversations_done']} of {args.conversations} conversations finished")
        if r["max_context_tokens"] > context:
            problems.append(f"{name}: a turn reached {r['max_context_tokens']} tokens, past the context of {context}")
    for name, r in results.items():
        if is_responses(name) and not r["checks"]["ok"]:
            problems.append(f"{name}: {r['checks']}")
    if problems:
        raise SystemExit("FAILED: " + "; ".join(problems))


if __name__ == "__main__":
    main()
