"""W3C traceparent across replicas (docs/metrics.md, "Logs and request ids"): two tost_server
replicas sharing a real Redis (tests/integration/redis_server.py, the fixtures of
test_responses_shared.py), a client that sends one trace's traceparent with every call, a session
created and generated on one replica and continued on the other over gRPC, and a stored response
continued on the other over HTTP (previous_response_id). Every access-log line of those calls, on
both replicas, carries the trace id, a span id of the server's own, and the request id
"<trace id>-<span id>" that the response echoed; a client's own x-request-id is kept beside the
trace; a malformed traceparent is no trace."""
import json
import re
import time
import urllib.request

import grpc

import tost_protos
from redis_server import RedisServer
from test_responses_shared import Replicas

pb2, pb2_grpc = tost_protos.tost()
MODEL = "tost-austen"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALL_TIMEOUT_S = 60


def traceparent(parent_span):
    return f"00-{TRACE}-{parent_span}-01"


def access_lines(server, want, timeout_s=10):
    """The access-log lines (msg rpc or http) of `server` that carry TRACE, once there are `want`
    of them: an HTTP line is written after the last byte of its answer, so it may trail the
    client's read."""
    deadline = time.monotonic() + timeout_s
    while True:
        with open(server.log.name) as f:
            events = [json.loads(line) for line in f if line.strip()]
        lines = [e for e in events if e.get("msg") in ("rpc", "http") and e.get("trace_id") == TRACE]
        if len(lines) >= want or time.monotonic() > deadline:
            return lines, events
        time.sleep(0.05)


def post_json(server, path, body, headers):
    req = urllib.request.Request(f"http://127.0.0.1:{server.http_port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **headers})
    with urllib.request.urlopen(req, timeout=CALL_TIMEOUT_S) as r:
        return json.load(r), r.headers["x-request-id"]


def test_a_traced_session_shows_one_trace_id_in_both_replicas_access_logs(key_file):
    with RedisServer() as redis, Replicas(key_file, redis, extra=["--log_format=json"]) as (a, b):
        echoed = {}  # (replica, call) -> the x-request-id the client got back
        with grpc.insecure_channel(a.address) as ach, grpc.insecure_channel(b.address) as bch:
            stub_a, stub_b = pb2_grpc.TostStub(ach), pb2_grpc.TostStub(bch)
            info, call = stub_a.CreateSession.with_call(
                pb2.CreateSessionRequest(model=MODEL, sampling=pb2.SamplingParams(temperature=0)),
                metadata=[("traceparent", traceparent("00f067aa0ba902b1"))], timeout=CALL_TIMEOUT_S)
            echoed["a", "CreateSession"] = dict(call.initial_metadata())["x-request-id"]
            for stub, replica, span, prompt in ((stub_a, "a", "00f067aa0ba902b2", b"It was"),
                                                (stub_b, "b", "00f067aa0ba902b3", b" Then")):
                stream = stub.Generate(pb2.GenerateRequest(session_id=info.session_id, prompt_bytes=prompt,
                                                           max_new_tokens=4),
                                       metadata=[("traceparent", traceparent(span))], timeout=CALL_TIMEOUT_S)
                final = [m for m in stream if m.HasField("final")]
                assert final and final[0].final.session_id == info.session_id
                echoed[replica, "Generate"] = dict(stream.initial_metadata())["x-request-id"]
            # A client's own x-request-id stays the request id; the trace is logged beside it.
            _, call = stub_b.ListModels.with_call(
                pb2.ListModelsRequest(),
                metadata=[("traceparent", traceparent("00f067aa0ba902b4")), ("x-request-id", "client-7")],
                timeout=CALL_TIMEOUT_S)
            assert dict(call.initial_metadata())["x-request-id"] == "client-7"
            # A malformed traceparent (uppercase hex) is no trace.
            stub_b.ListModels(pb2.ListModelsRequest(), metadata=[("traceparent", traceparent("00F067AA0BA902B5"))],
                              timeout=CALL_TIMEOUT_S)

        # Over HTTP: a stored response on A, continued on B.
        first, echoed["a", "/v1/responses"] = post_json(
            a, "/v1/responses", {"model": MODEL, "input": "Who is Mr. Darcy?", "max_output_tokens": 4,
                                 "temperature": 0}, {"traceparent": traceparent("00f067aa0ba902b6")})
        _, echoed["b", "/v1/responses"] = post_json(
            b, "/v1/responses", {"model": MODEL, "input": "Go on.", "max_output_tokens": 4, "temperature": 0,
                                 "previous_response_id": first["id"]},
            {"traceparent": traceparent("00f067aa0ba902b7")})

        lines_a, _ = access_lines(a, want=3)
        lines_b, events_b = access_lines(b, want=3)
        print(f"\nreplica A: {[(e.get('rpc') or e.get('path'), e['request_id']) for e in lines_a]}")
        print(f"replica B: {[(e.get('rpc') or e.get('path'), e['request_id']) for e in lines_b]}")
        calls = {("a", e.get("rpc") or e.get("path")): e for e in lines_a}
        calls.update({("b", e.get("rpc") or e.get("path")): e for e in lines_b})
        assert set(calls) == {("a", "CreateSession"), ("a", "Generate"), ("a", "/v1/responses"),
                              ("b", "Generate"), ("b", "ListModels"), ("b", "/v1/responses")}, sorted(calls)
        spans = set()
        for key, e in calls.items():
            assert re.fullmatch(r"[0-9a-f]{16}", e["span_id"]) and e["span_id"] not in spans, (key, e)
            assert not e["span_id"].startswith("00f067aa0ba902b"), "the server's span id is its own"
            spans.add(e["span_id"])
            if key == ("b", "ListModels"):
                assert e["request_id"] == "client-7", e
            else:
                assert e["request_id"] == f"{TRACE}-{e['span_id']}", e
                assert echoed[key] == e["request_id"], (key, echoed[key], e)
            assert e.get("code", e.get("status")) in ("OK", 200), e
        # The malformed traceparent's call was logged without a trace.
        untraced = [e for e in events_b if e.get("msg") == "rpc" and e.get("rpc") == "ListModels"
                    and e["request_id"] != "client-7"]
        assert len(untraced) == 1 and "trace_id" not in untraced[0] and "span_id" not in untraced[0], untraced
        assert re.fullmatch(r"[0-9a-f]{16}", untraced[0]["request_id"]), untraced
