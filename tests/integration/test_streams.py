"""Generate streams on the callback API, end to end: many streams hold no thread each, and a client
that stops reading pauses its own generation, which is ended after --stream_stall_timeout_ms with
its state kept for its session."""
import asyncio
import os
import time

import grpc
import pytest

from conftest import SOURCE_DIR, RunningServer, generator_status
from tost_harness import acollect_generate, collect_generate

MODEL = "tost-austen"


def server_threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def generator(status_response):
    return generator_status(status_response, MODEL)


def test_256_streams_all_admitted_run_on_fewer_than_64_threads(proto_modules):
    pb2, pb2_grpc = proto_modules
    srv = RunningServer(os.path.join(SOURCE_DIR, "models"),
                        ["--max_active_generations=64", "--max_queued_generations=192"])
    try:
        idle_threads = server_threads(srv.proc.pid)

        async def main():
            # A small receive window, never grown: the transport holds about a kilobyte per
            # stream, so unread streams really stop. With gRPC's default window a stream's 24
            # tokens fit in the transport's buffers unread, the jobs never pause, and a client
            # slow to poll (a loaded CI machine) found every generation already over: (0, 0).
            async with grpc.aio.insecure_channel(srv.address,
                                                 options=[("grpc.http2.lookahead_bytes", 1024),
                                                          ("grpc.http2.bdp_probe", 0)]) as ch:
                stub = pb2_grpc.TostStub(ch)
                calls = [stub.Generate(pb2.GenerateRequest(
                    model=MODEL, prompt_bytes=b"It was", max_new_tokens=200,
                    sampling=pb2.SamplingParams(temperature=1.0, seed=i)), timeout=300)
                    for i in range(256)]
                # Nothing is read yet: the 64 active streams pause after their buffered tokens and
                # the 192 others wait to become active, so all 256 are in flight at once.
                deadline = time.monotonic() + 60
                while True:
                    g = generator(await stub.ServerStatus(pb2.ServerStatusRequest()))
                    if (g.active, g.queued) == (64, 192) or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.05)
                assert (g.active, g.queued, g.max_active) == (64, 192, 64)
                busy_threads = server_threads(srv.proc.pid)

                async def read(call):
                    got = await acollect_generate(call)
                    return len(got.tokens), got.final

                results = await asyncio.gather(*(read(c) for c in calls))
                return busy_threads, results

        busy_threads, results = asyncio.run(main())
        print(f"server threads: {idle_threads} idle, {busy_threads} with 256 streams in flight")
        assert busy_threads < 64, f"{busy_threads} server threads with 256 streams ({idle_threads} idle)"
        assert len(results) == 256
        for tokens, final in results:
            assert final is not None and final.generated_tokens == tokens
            assert final.finish_reason in (pb2.FINISH_REASON_LENGTH, pb2.FINISH_REASON_EOS,
                                           pb2.FINISH_REASON_STOP)
    finally:
        assert srv.stop() == 0


def test_client_that_stops_reading_pauses_and_is_cancelled_with_its_session_kept(proto_modules):
    pb2, pb2_grpc = proto_modules
    stall_ms = 2000
    srv = RunningServer(os.path.join(SOURCE_DIR, "models"), [f"--stream_stall_timeout_ms={stall_ms}"])
    try:
        control = grpc.insecure_channel(srv.address)
        stub = pb2_grpc.TostStub(control)
        session = stub.CreateSession(pb2.CreateSessionRequest(
            model=MODEL, sampling=pb2.SamplingParams(temperature=0.8, seed=7)))
        # A small receive window, never grown: the transport holds few messages, so the server's
        # own bound on unread tokens is what stops the generation.
        slow = grpc.insecure_channel(srv.address, options=[("grpc.http2.lookahead_bytes", 1024),
                                                           ("grpc.http2.bdp_probe", 0)])
        call = pb2_grpc.TostStub(slow).Generate(pb2.GenerateRequest(
            session_id=session.session_id, prompt_bytes=b"It was a truth", max_new_tokens=900,
            top_logprobs=20), timeout=120)

        # The position stops moving well before max_new_tokens, long before the stall timeout.
        last, still_since, started = -1, None, time.monotonic()
        while time.monotonic() - started < stall_ms / 1000 * 0.8:
            g = generator(stub.ServerStatus(pb2.ServerStatusRequest()))
            if g.decoded_tokens != last:
                last, still_since = g.decoded_tokens, time.monotonic()
            elif g.paused == 1 and time.monotonic() - still_since > 0.3:
                break
            time.sleep(0.02)
        assert g.paused == 1, g
        paused_at = g.decoded_tokens
        assert 0 < paused_at < 900

        # After the stall timeout the stream is cancelled and the session gets its state back.
        deadline = time.monotonic() + 30
        while generator(stub.ServerStatus(pb2.ServerStatusRequest())).stalled_streams < 1:
            assert time.monotonic() < deadline, "the stalled stream was never ended"
            time.sleep(0.05)
        # The server cancelled the call (the client was not reading, so it cannot hear why).
        got = collect_generate(call, capture_error=True)
        assert got.error is not None, "the stalled stream ended without an error"
        assert got.error.code() == grpc.StatusCode.CANCELLED
        received = len(got.tokens)
        g = generator(stub.ServerStatus(pb2.ServerStatusRequest()))
        assert g.decoded_tokens == paused_at and g.paused == 0 and g.active == 0
        assert received <= paused_at

        # The session holds every token generated (none lost, none repeated) and continues.
        info = stub.ExportSession(pb2.SessionRef(session_id=session.session_id)).session
        prompt_tokens = info.position - paused_at
        assert prompt_tokens > 0
        final = collect_generate(stub.Generate(pb2.GenerateRequest(session_id=session.session_id,
                                                                   max_new_tokens=4))).final
        assert final is not None and final.position == info.position + final.generated_tokens
        slow.close()
        control.close()
    finally:
        assert srv.stop() == 0


def test_a_full_scheduler_refuses_before_looking_at_the_prompt(proto_modules):
    pb2, pb2_grpc = proto_modules
    srv = RunningServer(os.path.join(SOURCE_DIR, "models"),
                        ["--max_active_generations=1", "--max_queued_generations=0"])
    try:
        ch = grpc.insecure_channel(srv.address)
        stub = pb2_grpc.TostStub(ch)
        holder = stub.Generate(pb2.GenerateRequest(model=MODEL, prompt_bytes=b"It was", max_new_tokens=500))
        next(holder)  # it holds the only place (and, unread, pauses there)
        # A megabyte of prompt text, or ids outside the vocabulary: refused for want of a place
        # first, so a full server spends nothing on them.
        for request in (pb2.GenerateRequest(model=MODEL, prompt_bytes=b"word " * 200_000),
                        pb2.GenerateRequest(model=MODEL, prompt_tokens=pb2.TokenIds(ids=[10**6]))):
            with pytest.raises(grpc.RpcError) as e:
                list(stub.Generate(request))
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
        holder.cancel()
        ch.close()
    finally:
        assert srv.stop() == 0


def test_a_drain_ends_within_its_timeout_and_a_second_even_with_a_stalled_client(proto_modules):
    import signal
    import time

    pb2, pb2_grpc = proto_modules
    drain_s = 2
    srv = RunningServer(os.path.join(SOURCE_DIR, "models"), [f"--drain_timeout_s={drain_s}"])
    slow = grpc.insecure_channel(srv.address, options=[("grpc.http2.lookahead_bytes", 1024),
                                                       ("grpc.http2.bdp_probe", 0)])
    call = pb2_grpc.TostStub(slow).Generate(pb2.GenerateRequest(
        model=MODEL, prompt_bytes=b"It was", max_new_tokens=900, top_logprobs=20), timeout=120)
    next(call)  # streaming, then never read again: its writes wait on the flow-control window
    time.sleep(0.5)
    start = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=30) == 0
    elapsed = time.monotonic() - start
    print(f"drain with a stalled client: {elapsed:.2f} s (--drain_timeout_s={drain_s})")
    assert elapsed < drain_s + 1.9, elapsed
    slow.close()
