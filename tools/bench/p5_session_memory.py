#!/usr/bin/env python3
"""P5: resident-memory growth per idle session, measured, both ways:

  ToST  tost_server holding --sessions sessions forked from one at position P (CreateSession,
        Generate of a P-1-token prompt plus one token, then ForkSession repeatedly). The server's
        VmRSS (/proc/<pid>/status) is read every tenth of the forks; growth per session is the
        least-squares slope of RSS against sessions held.
  KV    a KV-cache transformer of equal dims (PyTorch; same layers, heads, width and vocabulary,
        softmax attention) in its own process, holding as many P-token caches as fit in
        --kv-budget-gib (at least --kv-min-caches), each filled by a real causal forward over its
        own random prompt; growth per cache is the same slope of that process's VmRSS.

The shipped LM (models/tost-austen) has a context of 1024 tokens, short of the 4096 the target
names, so by default the ToST side serves a model with the shipped LM's dims and tokenizer at
context 4096 (random weights: state size depends on the dims, not the values). --shipped uses
models/tost-austen itself, at its own context length. Positions below P are measured too (fewer
sessions), for the memory-vs-tokens plot. Writes one JSON file (--out).
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

SHIPPED_LM = os.path.join(benchlib.ROOT, "models", "tost-austen")


def slope(xs, ys) -> float:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def rss_self() -> int:
    return benchlib.proc_rss_bytes(os.getpid())


# ------------------------------------------------------------------------------------------------
# KV-cache side (runs in a child process: --kv-child)
# ------------------------------------------------------------------------------------------------

def kv_child(lm: dict, tokens: int, budget_bytes: int, min_caches: int, max_caches: int) -> dict:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    libc = ctypes.CDLL("libc.so.6")
    C, H, L = lm["n_embd"], lm["n_head"], lm["n_layer"]
    hidden = int(lm.get("mlp_ratio", 4) * C)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.c_attn, self.c_proj = nn.Linear(C, 3 * C, bias=False), nn.Linear(C, C, bias=False)
            self.fc, self.fc_out = nn.Linear(C, hidden, bias=False), nn.Linear(hidden, C, bias=False)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
            x = x + self.fc_out(F.gelu(self.fc(self.ln_2(x))))
            # The cache a decoder keeps: K and V of every position, in their own storage.
            return x, (k.contiguous().clone(), v.contiguous().clone())

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(lm["vocab_size"], C)
            self.wpe = nn.Embedding(max(tokens, lm["context_length"]), C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))

        def prefill(self, idx):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            cache = []
            for b in self.blocks:
                x, kv = b(x)
                cache.append(kv)
            return cache

    torch.manual_seed(0)
    model = Gpt().eval()
    gen = torch.Generator().manual_seed(1)

    def one():
        with torch.inference_mode():
            return model.prefill(torch.randint(0, lm["vocab_size"], (1, tokens), generator=gen))

    one()  # warm-up: first-call allocations are not a cache's
    gc.collect()
    libc.malloc_trim(0)
    rss0 = rss_self()
    caches, xs, ys = [], [0], [0]
    t0 = time.monotonic()
    while len(caches) < max_caches:
        caches.append(one())
        gc.collect()
        libc.malloc_trim(0)  # the forward's activations go back; what stays is the caches
        growth = rss_self() - rss0
        xs.append(len(caches))
        ys.append(growth)
        if len(caches) >= min_caches and growth >= budget_bytes:
            break
    elapsed = time.monotonic() - t0
    cache_bytes = sum(t.numel() * t.element_size() for c in caches[:1] for kv in c for t in kv)
    return {"tokens": tokens, "caches": len(caches), "rss_before_bytes": rss0,
            "rss_after_bytes": rss0 + ys[-1], "growth_bytes": ys[-1],
            "growth_per_cache_bytes": slope(xs, ys), "mean_growth_per_cache_bytes": ys[-1] / len(caches),
            "tensor_bytes_per_cache": cache_bytes, "seconds": elapsed,
            "checkpoints": list(zip(xs, ys))[:: max(1, len(xs) // 32)]}


def run_kv(lm: dict, tokens: int, budget_bytes: int, min_caches: int, max_caches: int, cpus) -> dict:
    argv = [sys.executable, os.path.abspath(__file__), "--kv-child", json.dumps(
        {"lm": lm, "tokens": tokens, "budget_bytes": budget_bytes, "min_caches": min_caches,
         "max_caches": max_caches})]
    out = subprocess.run(argv, capture_output=True, text=True, preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    if out.returncode != 0:
        raise RuntimeError(f"KV-cache child failed: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------
# ToST side: tost_server
# ------------------------------------------------------------------------------------------------

def tost_sessions(server, pb2, stub, model: str, vocab: int, eos: int, position: int, sessions: int) -> dict:
    import random

    base = stub.CreateSession(pb2.CreateSessionRequest(model=model), timeout=30)
    rng = random.Random(position)
    prompt = [t for t in (rng.randrange(vocab) for _ in range(position + 16)) if t != eos][: position - 1]
    final = None
    for msg in stub.Generate(pb2.GenerateRequest(
            model=model, session_id=base.session_id, prompt_tokens=pb2.TokenIds(ids=prompt),
            max_new_tokens=1, sampling=pb2.SamplingParams(temperature=0.0)), timeout=600):
        if msg.HasField("final"):
            final = msg.final
    if final is None or final.position != position:
        raise RuntimeError(f"expected the base session at position {position}, got "
                           f"{final.position if final else 'no final message'}")
    # The fork path warmed up (gRPC buffers, allocator arenas) before the baseline.
    warm = [stub.ForkSession(pb2.SessionRef(session_id=base.session_id), timeout=30) for _ in range(32)]
    for w in warm:
        stub.CloseSession(pb2.SessionRef(session_id=w.session_id), timeout=30)
    time.sleep(0.2)
    rss0 = benchlib.proc_rss_bytes(server.pid)
    xs, ys = [0], [0]
    every = max(1, sessions // 10)
    info = None
    for i in range(1, sessions + 1):
        info = stub.ForkSession(pb2.SessionRef(session_id=base.session_id), timeout=30)
        if i % every == 0 or i == sessions:
            xs.append(i)
            ys.append(benchlib.proc_rss_bytes(server.pid) - rss0)
    return {"position": position, "sessions": sessions, "rss_before_bytes": rss0,
            "rss_after_bytes": rss0 + ys[-1], "growth_bytes": ys[-1],
            "growth_per_session_bytes": slope(xs, ys), "mean_growth_per_session_bytes": ys[-1] / sessions,
            "server_state_bytes": info.state_bytes, "checkpoints": list(zip(xs, ys))}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--kv-child":
        a = json.loads(sys.argv[2])
        print(json.dumps(kv_child(a["lm"], a["tokens"], a["budget_bytes"], a["min_caches"], a["max_caches"])))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchlib.add_build_args(ap)
    ap.add_argument("--sessions", type=int, default=1000, help="idle sessions at the largest position")
    ap.add_argument("--kv-budget-gib", type=float, default=8.0)
    ap.add_argument("--kv-min-caches", type=int, default=64)
    ap.add_argument("--shipped", action="store_true",
                    help="serve models/tost-austen itself (context 1024) instead of its dims at 4096")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="p5.json")
    args = ap.parse_args()
    if args.quick:
        args.kv_budget_gib = min(args.kv_budget_gib, 1.0)
    cpus = benchlib.other_cpus(args.loadgen_cpu)

    import grpc

    pb2, pb2_grpc = benchlib.proto_modules()
    with open(os.path.join(SHIPPED_LM, "config.json")) as f:
        shipped = json.load(f)
    repo = tempfile.mkdtemp(prefix="p5_repo_")
    if args.shipped:
        os.symlink(SHIPPED_LM, os.path.join(repo, "tost-austen"))
        model, lm = "tost-austen", dict(shipped["lm"])
    else:
        model = "austen-dims-4096"
        lm = benchlib.write_lm_like(SHIPPED_LM, repo, model, context_length=4096)
    top = lm["context_length"]
    positions = [top // 4, top] if args.quick else [top // 8, top // 4, top // 2, top]
    result = {"target": "P5", "machine": benchlib.machine(), "quick": args.quick, "model": model,
              "lm": lm, "shipped_context_length": shipped["lm"]["context_length"],
              "position": top, "tost": {}, "kv": {}}
    print(f"P5: {model}: {lm['n_layer']} layers, C {lm['n_embd']}, {lm['n_head']} heads, "
          f"context {top} (shipped LM's context: {shipped['lm']['context_length']})")

    counts = {p: (args.sessions if p == top else max(100, args.sessions // 4)) for p in positions}
    total = sum(counts.values()) + 200
    extra = [f"--max_sessions={total}", f"--session_budget_bytes={8 << 30}",
             "--session_idle_timeout_s=86400", f"--max_prompt_bytes={1 << 22}"]
    with benchlib.start_tost_server(args.build_dir, repo, extra, cpus=cpus) as server:
        stub = pb2_grpc.TostStub(grpc.insecure_channel(server.address))
        status = None
        for _ in range(600):
            try:
                status = stub.ModelInfo(pb2.ModelInfoRequest(model=model), timeout=10)
                if status.ready:
                    break
            except grpc.RpcError:
                pass
            time.sleep(0.2)
        for p in positions:
            r = tost_sessions(server, pb2, stub, model, lm["vocab_size"], status.eos_token_id, p, counts[p])
            result["tost"][str(p)] = r
            print(f"  ToST  position {p:5d}: {r['sessions']:5d} sessions, RSS +{r['growth_bytes'] / 2**20:.2f} MiB, "
                  f"{r['growth_per_session_bytes'] / 1024:.2f} KiB/session (server says {r['server_state_bytes'] / 1024:.2f} KiB)")
        final = stub.ServerStatus(pb2.ServerStatusRequest(), timeout=10)
        result["server_sessions_held"] = final.sessions
        if final.sessions < args.sessions:
            raise RuntimeError(f"expected the server to hold >= {args.sessions} sessions, it holds {final.sessions}")
    shutil.rmtree(repo)

    budget = int(args.kv_budget_gib * (1 << 30))
    for p in positions:
        small = p != top
        r = run_kv(lm, p, budget // 8 if small else budget, 8 if small else args.kv_min_caches,
                   100000, cpus)
        result["kv"][str(p)] = r
        print(f"  KV    {p:5d} tokens: {r['caches']:5d} caches, RSS +{r['growth_bytes'] / 2**30:.2f} GiB, "
              f"{r['growth_per_cache_bytes'] / 2**20:.2f} MiB/cache (tensors {r['tensor_bytes_per_cache'] / 2**20:.2f} MiB), "
              f"{r['seconds']:.0f} s")
    t, k = result["tost"][str(top)], result["kv"][str(top)]
    result["ratio"] = k["growth_per_cache_bytes"] / t["growth_per_session_bytes"] if t["growth_per_session_bytes"] > 0 else None
    benchlib.write_json(args.out, result)
    print(f"\nP5 resident-memory growth at position {top}: ToST {t['growth_per_session_bytes'] / 1024:.2f} KiB/session "
          f"({t['sessions']} sessions) vs KV cache {k['growth_per_cache_bytes'] / 2**20:.2f} MiB/cache "
          f"({k['caches']} caches): {result['ratio']:.0f}x (target >= 1000x)" if result["ratio"] else
          "\nP5: ToST growth not measurable (<= 0)")
    print(f"  wrote {args.out}")


if __name__ == "__main__":
    main()
