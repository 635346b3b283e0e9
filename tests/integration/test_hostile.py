"""Hostile input, end to end: every field is bounded, a client's string never comes back whole in
a status message or a log line, and no request gets a non-finite answer with OK. After each
request the server must still report SERVING."""
import numpy as np
import grpc
import pytest
import tritonclient.grpc as triton
from grpc_health.v1 import health_pb2, health_pb2_grpc

import conftest  # noqa: F401 - puts tools/pylib on sys.path
from tost_harness import acollect_generate, collect_generate, metric_value, scrape_metrics

HUGE = "m" * 300_000  # a 300 KB string where a model name or a session id belongs


def expect_refused(call, code, fragment, channel):
    with pytest.raises(grpc.RpcError) as e:
        call()
    assert e.value.code() == code, e.value.details()
    assert fragment in e.value.details(), e.value.details()
    # A short prefix of the client's string at most, and no control character.
    assert len(e.value.details()) < 1024, len(e.value.details())
    assert not any(ord(c) < 32 for c in e.value.details())
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    return e.value.details()


def test_client_strings_are_quoted_short_and_escaped(stub, channel, proto_modules):
    pb2, _ = proto_modules
    details = expect_refused(lambda: stub.Classify(pb2.ClassifyRequest(model=HUGE)),
                             grpc.StatusCode.NOT_FOUND, "(300000 bytes)", channel)
    assert "is not served" in details
    expect_refused(lambda: list(stub.Generate(pb2.GenerateRequest(session_id=HUGE, max_new_tokens=1))),
                   grpc.StatusCode.NOT_FOUND, "(300000 bytes)", channel)
    details = expect_refused(
        lambda: stub.Classify(pb2.ClassifyRequest(model="digits\r\n2026-01-01 INFO forged line\x1b[2J")),
        grpc.StatusCode.NOT_FOUND, "is not served", channel)
    assert "\\r\\n" in details and "\\x1b" in details


def test_kserve_strings_are_quoted_short(server, channel):
    client = triton.InferenceServerClient(url=server.address)
    pixels = triton.InferInput("image", [1, 1, 32, 32], "FP32")
    pixels.set_data_from_numpy(np.zeros((1, 1, 32, 32), dtype=np.float32))
    with pytest.raises(triton.InferenceServerException) as e:
        client.infer("tost-digits", [pixels], model_version=HUGE)
    assert "NOT_FOUND" in e.value.status() and len(e.value.message()) < 1024
    assert "(300000 bytes)" in e.value.message()
    bad = triton.InferInput("image", [1, 1, 32, 32], HUGE[:5000])
    with pytest.raises(triton.InferenceServerException) as e:
        client.infer("tost-digits", [bad])
    assert "INVALID_ARGUMENT" in e.value.status() and len(e.value.message()) < 1024


def test_repeated_fields_have_limits(stub, channel, proto_modules):
    pb2, _ = proto_modules
    expect_refused(lambda: list(stub.Generate(pb2.GenerateRequest(
        model="tost-austen", prompt_bytes=b"a", max_new_tokens=1,
        stop=pb2.StopConditions(stop_token_ids=list(range(1_000_000)))))),
        grpc.StatusCode.INVALID_ARGUMENT, "stop_token_ids: at most 64", channel)
    expect_refused(lambda: list(stub.Generate(pb2.GenerateRequest(
        model="tost-austen", prompt_bytes=b"a", max_new_tokens=1,
        stop=pb2.StopConditions(stop=["x"] * 17)))),
        grpc.StatusCode.INVALID_ARGUMENT, "stop: at most 16", channel)
    expect_refused(lambda: stub.CreateSession(pb2.CreateSessionRequest(
        model="tost-austen", stop=pb2.StopConditions(stop_token_ids=list(range(65))))),
        grpc.StatusCode.INVALID_ARGUMENT, "stop_token_ids", channel)


def test_inputs_that_would_overflow_the_model_are_refused(server, stub, channel, proto_modules):
    pb2, _ = proto_modules
    huge = pb2.FloatTensor(shape=[1, 1, 32, 32], data=[3e38] * 1024)
    expect_refused(lambda: stub.Classify(pb2.ClassifyRequest(model="tost-digits", tensor=huge)),
                   grpc.StatusCode.INVALID_ARGUMENT, "magnitude at most", channel)
    client = triton.InferenceServerClient(url=server.address)
    pixels = triton.InferInput("image", [1, 1, 32, 32], "FP32")
    pixels.set_data_from_numpy(np.full((1, 1, 32, 32), 3e38, dtype=np.float32))
    with pytest.raises(triton.InferenceServerException) as e:
        client.infer("tost-digits", [pixels])
    assert "INVALID_ARGUMENT" in e.value.status() and "magnitude" in e.value.message()
    # The largest accepted magnitude still gives finite probabilities.
    edge = pb2.FloatTensor(shape=[1, 1, 32, 32], data=[1e6, -1e6] * 512)
    result = stub.Classify(pb2.ClassifyRequest(model="tost-digits", tensor=edge, top_k=10))
    probs = [label.probability for label in result.results[0].labels]
    assert all(np.isfinite(probs)) and abs(sum(probs) - 1) < 1e-3
    for sampling, fragment in [(pb2.SamplingParams(repetition_penalty=1e-40), "repetition_penalty"),
                               (pb2.SamplingParams(temperature=1e-30), "temperature"),
                               (pb2.SamplingParams(temperature=1e30), "temperature")]:
        expect_refused(lambda: list(stub.Generate(pb2.GenerateRequest(
            model="tost-austen", prompt_bytes=b"a", max_new_tokens=2, sampling=sampling))),
            grpc.StatusCode.INVALID_ARGUMENT, fragment, channel)
    # Logprobs of the largest accepted temperature and penalty are finite.
    for token in collect_generate(stub.Generate(pb2.GenerateRequest(
            model="tost-austen", prompt_bytes=b"It was", max_new_tokens=8, top_logprobs=5,
            sampling=pb2.SamplingParams(temperature=100, repetition_penalty=100, seed=1)))).tokens:
        assert all(np.isfinite(alt.logprob) for alt in token.top_logprobs)


def test_an_image_far_larger_than_the_model_input_is_refused_before_decoding(stub, channel,
                                                                              proto_modules):
    import io

    from PIL import Image

    pb2, _ = proto_modules

    def png(side):
        out = io.BytesIO()
        Image.new("L", (side, side), 128).save(out, format="PNG")
        return out.getvalue()

    # tost-digits takes 32x32: 1024 x 1024 = 1024 times its input decodes, 2048 x 2048 does not
    # (a few KB of PNG would otherwise decode to 4 MPixel).
    ok = stub.Classify(pb2.ClassifyRequest(model="tost-digits", images=[png(1024)]))
    assert len(ok.results) == 1
    expect_refused(lambda: stub.Classify(pb2.ClassifyRequest(model="tost-digits", images=[png(2048)])),
                   grpc.StatusCode.INVALID_ARGUMENT, "max_decoded_pixels 1048576", channel)


def test_a_rapid_reset_burst_leaves_other_clients_answered_within_their_deadlines(proto_modules):
    import asyncio
    import os
    import time

    from conftest import SOURCE_DIR, RunningServer

    pb2, pb2_grpc = proto_modules
    srv = RunningServer(os.path.join(SOURCE_DIR, "models"))
    try:
        async def attack():
            # 10,000 streams opened and cancelled at once, on one connection.
            async with grpc.aio.insecure_channel(srv.address) as ch:
                stub = pb2_grpc.TostStub(ch)
                request = pb2.GenerateRequest(model="tost-austen", prompt_bytes=b"It was",
                                              max_new_tokens=64)
                for _ in range(10):
                    calls = [stub.Generate(request) for _ in range(1000)]
                    await asyncio.sleep(0.01)  # let the calls send their HEADERS
                    for call in calls:
                        call.cancel()  # RST_STREAM
                    await asyncio.sleep(0)

        async def bystander():
            async with grpc.aio.insecure_channel(srv.address) as ch:
                stub = pb2_grpc.TostStub(ch)
                worst = 0.0
                for _ in range(5):
                    start = time.monotonic()
                    await stub.ListModels(pb2.ListModelsRequest(), timeout=5)
                    # While the burst's streams fill every place, a Generate is refused at once
                    # with a retry hint (RESOURCE_EXHAUSTED), as overload should be; a client
                    # retries within its deadline, and the reset streams must free their places.
                    while True:
                        try:
                            got = await acollect_generate(stub.Generate(pb2.GenerateRequest(
                                model="tost-austen", prompt_bytes=b"It was", max_new_tokens=4),
                                timeout=10))
                            break
                        except grpc.aio.AioRpcError as e:
                            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                            assert time.monotonic() - start < 10, "no place freed within 10 s"
                            await asyncio.sleep(0.05)
                    assert got.final is not None  # and nothing after it (collect_generate checks)
                    worst = max(worst, time.monotonic() - start)
                return worst

        async def main():
            _, worst = await asyncio.gather(attack(), bystander())
            return worst

        worst = asyncio.run(main())
        print(f"slowest bystander round trip during the burst: {worst:.3f} s")
        # The burst reached the server: it counted the streams it saw (a stream reset before its
        # handler ran is not counted, so this is a floor).
        seen = metric_value(scrape_metrics(srv), "tost_requests_total", rpc="Generate")
        print(f"Generate calls the server saw: {seen:.0f}")
        assert seen >= 1000
        # Afterwards nothing is left running: the cancelled streams freed their places.
        with grpc.insecure_channel(srv.address) as ch:
            stub = pb2_grpc.TostStub(ch)
            deadline = time.monotonic() + 30
            while True:
                (g,) = stub.ServerStatus(pb2.ServerStatusRequest()).generators
                if g.active == 0 and g.queued == 0:
                    break
                assert time.monotonic() < deadline, g
                time.sleep(0.1)
    finally:
        assert srv.stop() == 0
