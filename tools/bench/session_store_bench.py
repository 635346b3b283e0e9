#!/usr/bin/env python3
"""Shared session store: how fast one tost_server fills a Redis with sessions, and what each costs
there. One session of tost-austen is created and given a prompt (CreateSession, Generate), then
forked --sessions times (ForkSession over gRPC, --concurrency calls in flight on grpc.aio, in
--client-processes processes); every fork reads the session from the store and writes a new one.
Reported: forks per second, Redis' used_memory (INFO memory) before and after, hence bytes per
session and sessions per GiB, and the store's key count (every fork must be there).

By default it starts its own redis-server (no persistence: no AOF, no RDB; tests/integration/
redis_server.py) and one tost_server (--session_store=redis://..., a random --session_key_file,
--session_idle_timeout_s a day so nothing expires during the run); --redis-url uses a running Redis
(its whole database is counted, so give it an empty one) and, with --server, a running tost_server
that uses that store. Not part of `make test`:

  tools/bench/session_store_bench.py --quick          # 2,000 sessions
  tools/bench/session_store_bench.py --sessions 20000
  tools/bench/session_store_bench.py                  # 1,000,000 sessions (about 5 GB of Redis)

Prints one table and one JSON line (also written to --out when given).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

sys.path.insert(0, os.path.join(benchlib.ROOT, "tests", "integration"))
import redis_server  # noqa: E402

MODEL = "tost-austen"
MODELS = os.path.join(benchlib.ROOT, "models")
PROMPT = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
          "must be in want of a wife.")
GIB = 1 << 30


def fork_worker(address: str, session_id: str, count: int, concurrency: int, done, errors) -> None:
    """Forks `session_id` `count` times, `concurrency` calls in flight; adds to the shared counters
    `done` and `errors` as it goes (a child process of its own)."""
    pb2, pb2_grpc = benchlib.proto_modules()
    import grpc

    async def run():
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb2_grpc.TostStub(channel)
            ref = pb2.SessionRef(session_id=session_id)
            left = count
            ok = failed = 0

            async def one():
                nonlocal left, ok, failed
                while left > 0:
                    left -= 1
                    try:
                        await stub.ForkSession(ref, timeout=60)
                        ok += 1
                    except grpc.aio.AioRpcError as e:
                        failed += 1
                        if failed <= 3:
                            print(f"ForkSession failed: {e.code().name}: {e.details()}", file=sys.stderr)
                    if ok % 256 == 0 or failed:
                        with done.get_lock():
                            done.value += ok
                        with errors.get_lock():
                            errors.value += failed
                        ok = failed = 0

            await asyncio.gather(*[one() for _ in range(concurrency)])
            with done.get_lock():
                done.value += ok
            with errors.get_lock():
                errors.value += failed

    asyncio.run(run())


def fork_all(address: str, session_id: str, total: int, concurrency: int, processes: int,
             progress_s: float) -> dict:
    ctx = multiprocessing.get_context("spawn")
    done, errors = ctx.Value("q", 0), ctx.Value("q", 0)
    shares = [total // processes + (1 if i < total % processes else 0) for i in range(processes)]
    procs = [ctx.Process(target=fork_worker, args=(address, session_id, n, concurrency, done, errors))
             for n in shares if n]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    last = t0
    while any(p.is_alive() for p in procs):
        for p in procs:
            p.join(timeout=0.2)
        now = time.monotonic()
        if now - last >= progress_s:
            last = now
            print(f"  {done.value:>10,} forks in {now - t0:7.1f} s ({done.value / (now - t0):,.0f}/s), "
                  f"{errors.value} errors", flush=True)
    seconds = time.monotonic() - t0
    failed = [p.exitcode for p in procs if p.exitcode != 0]
    if failed:
        raise SystemExit(f"a fork client process failed: exit codes {failed}")
    return {"forks": done.value, "errors": errors.value, "seconds": seconds}


def store_sessions(url: str, prefix: str) -> int:
    """Keys of sessions in the store (<prefix>s:*), counted by SCAN."""
    return len(redis_server.redis_cli(url, "--scan", "--pattern", f"{prefix}s:*",
                                      timeout_s=3600).splitlines())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default=os.environ.get("TOST_BUILD_DIR", benchlib.DEFAULT_BUILD),
                    help="CMake build directory with tost_server (default build/)")
    ap.add_argument("--sessions", type=int, default=1_000_000, help="forks to make (default 1,000,000)")
    ap.add_argument("--quick", action="store_true", help="2,000 sessions")
    ap.add_argument("--concurrency", type=int, default=64, help="ForkSession calls in flight per client process")
    ap.add_argument("--client-processes", type=int, default=1, help="client processes (grpc.aio each)")
    ap.add_argument("--generate-tokens", type=int, default=16, help="tokens the source session generates")
    ap.add_argument("--redis-url", default="", help="use this Redis (redis://[user:password@]host:port[/db])")
    ap.add_argument("--server", default="", help="use this tost_server (host:port; needs --redis-url, its store)")
    ap.add_argument("--key-prefix", default="tost:", help="the server's --session_store_key_prefix")
    ap.add_argument("--progress-s", type=float, default=10, help="seconds between progress lines")
    ap.add_argument("--out", default="", help="also write the JSON here")
    args = ap.parse_args()
    total = 2000 if args.quick else args.sessions
    if args.server and not args.redis_url:
        ap.error("--server needs --redis-url (the store it uses), to read its memory")

    pb2, pb2_grpc = benchlib.proto_modules()
    import grpc

    redis = server = None
    key_dir = tempfile.mkdtemp(prefix="session_store_bench_")
    try:
        if args.redis_url:
            url = args.redis_url
        else:
            redis = redis_server.RedisServer(appendonly=False)
            url = redis.url()
        if args.server:
            address = args.server
        else:
            key_file = os.path.join(key_dir, "session.key")
            with open(key_file, "wb") as f:
                f.write(os.urandom(32))
            server = benchlib.start_tost_server(args.build_dir, MODELS, [
                f"--session_key_file={key_file}", f"--session_store={url}",
                f"--session_store_key_prefix={args.key_prefix}", "--session_idle_timeout_s=86400"])
            address = server.address

        with grpc.insecure_channel(address) as channel:
            stub = pb2_grpc.TostStub(channel)
            source = stub.CreateSession(pb2.CreateSessionRequest(model=MODEL), timeout=30)
            for msg in stub.Generate(pb2.GenerateRequest(session_id=source.session_id, prompt_bytes=PROMPT.encode(),
                                                         max_new_tokens=args.generate_tokens), timeout=60):
                pass
            exported = stub.ExportSession(pb2.SessionRef(session_id=source.session_id), timeout=30)
        blob_bytes = len(exported.state)
        keys_before = store_sessions(url, args.key_prefix)
        mem_before = redis_server.info(url, "memory")
        rss_before = benchlib.proc_rss_bytes(server.pid) if server else None

        print(f"forking session {source.session_id} (position {exported.session.position}, blob {blob_bytes} "
              f"bytes) {total:,} times: {args.client_processes} client process(es) x {args.concurrency} in flight")
        run = fork_all(address, source.session_id, total, args.concurrency, args.client_processes, args.progress_s)

        mem_after = redis_server.info(url, "memory")
        keys_after = store_sessions(url, args.key_prefix)
        rss_after = benchlib.proc_rss_bytes(server.pid) if server else None
    finally:
        if server is not None:
            server.stop()
        if redis is not None:
            redis.close()
        for name in os.listdir(key_dir):
            os.unlink(os.path.join(key_dir, name))
        os.rmdir(key_dir)

    added = keys_after - keys_before
    used = int(mem_after["used_memory"]) - int(mem_before["used_memory"])
    per_session = used / added if added else None
    result = {
        "bench": "session_store", "machine": benchlib.machine(), "model": MODEL, "quick": args.quick,
        "store": re.sub(r"//[^@/]*@", "//", url), "server": address,
        "requested": total, "forks": run["forks"], "errors": run["errors"], "seconds": round(run["seconds"], 2),
        "forks_per_s": round(run["forks"] / run["seconds"], 1), "concurrency": args.concurrency,
        "client_processes": args.client_processes, "source_position": exported.session.position,
        "blob_bytes": blob_bytes, "store_sessions_added": added,
        "used_memory_before": int(mem_before["used_memory"]), "used_memory_after": int(mem_after["used_memory"]),
        "used_memory_rss_after": int(mem_after["used_memory_rss"]),
        "bytes_per_session": round(per_session, 1) if per_session else None,
        "sessions_per_gib": int(GIB / per_session) if per_session else None,
        "server_rss_before": rss_before, "server_rss_after": rss_after,
    }
    print(f"\nShared session store: {MODEL} sessions forked through tost_server into Redis")
    rows = [("forks (ok / errors)", f"{run['forks']:,} / {run['errors']:,}"),
            ("time", f"{run['seconds']:.1f} s"),
            ("fork rate", f"{result['forks_per_s']:,.0f} sessions/s"),
            ("sessions added to the store", f"{added:,}"),
            ("session blob", f"{blob_bytes:,} bytes (position {exported.session.position})"),
            ("Redis used_memory before", f"{result['used_memory_before']:,} bytes"),
            ("Redis used_memory after", f"{result['used_memory_after']:,} bytes "
                                        f"(rss {result['used_memory_rss_after']:,})"),
            ("bytes per session", f"{per_session:,.0f}" if per_session else "-"),
            ("sessions per GiB", f"{result['sessions_per_gib']:,}" if per_session else "-")]
    if rss_before is not None:
        rows.append(("tost_server RSS before / after", f"{rss_before / 2**20:,.0f} / {rss_after / 2**20:,.0f} MiB"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    line = json.dumps(result, sort_keys=True)
    print(line)
    if args.out:
        benchlib.write_json(args.out, result)
    if added != run["forks"]:
        raise SystemExit(f"the store gained {added} sessions for {run['forks']} acknowledged forks")
    if run["errors"]:
        raise SystemExit(f"{run['errors']} forks failed")


if __name__ == "__main__":
    main()
