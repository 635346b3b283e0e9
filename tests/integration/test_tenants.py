"""Tenants, priority and quotas, end to end on tost-austen: a bad tenants file stops the start
naming its line and field; a priority out of --max_priority is refused over gRPC and HTTP; a
generation preempted many times by higher-priority calls (one active slot) completes with exactly
the tokens it produces alone under --batch_invariant_decode; a tenant past its tokens_per_minute
(a 4-s window here) is refused with RESOURCE_EXHAUSTED over gRPC and 429 with Retry-After over
every HTTP route, naming the quota, while another tenant goes on; the per-tenant metrics name the
configured tenants and count the rest as "other"; a Generate asking for the x-tost-timing trailer
gets where its first token spent its time on the server; a tenant's highest_priority refuses
calls asking for more urgency (PERMISSION_DENIED, 403)."""
import json
import os
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest

from conftest import SOURCE_DIR, RunningServer
from tost_harness import collect_generate, generate_preempted_repeatedly, metric_value, scrape_metrics
import tost_launch

LM = "tost-austen"
MODELS = os.path.join(SOURCE_DIR, "models")
KEY_A = "tenant-a-key-0123456789"
KEY_B = "tenant-b-key-0123456789"
KEY_Q = "tenant-q-key-0123456789"


def keys_file(tmp_path, text):
    path = tmp_path / "keys.txt"
    path.write_text(text)
    return str(path)


def test_a_bad_tenants_file_stops_the_start_naming_its_line_and_field(tmp_path):
    for text, expected in [
        ("a weight=2\nb\na\n", "tenants.txt:3: duplicate tenant \"a\""),
        ("a max_concurrent=0\n", "tenants.txt:1: field max_concurrent is 0"),
        ("a weight=-2\n", "tenants.txt:1: field weight must be a number in (0, 1000]"),
        ("a tokens_per_minute=lots\n", "tenants.txt:1: field tokens_per_minute must be an integer"),
        ("a\nb highest_priority=-x\n", "tenants.txt:2: field highest_priority must be an integer"),
        ("a highest_priority=-101\n", "tenants.txt:1: field highest_priority of tenant \"a\" must be within "
                                      "the priorities calls may ask for, [-100, 100] (--max_priority), got -101"),
    ]:
        path = tmp_path / "tenants.txt"
        path.write_text(text)
        with pytest.raises(tost_launch.StartError) as e:
            RunningServer(MODELS, [f"--tenants_file={path}"])
        log = str(e.value).replace('\\"', '"')  # the log line escapes quotes
        assert expected in log, log[-2000:]
    # Named in both the API-keys file and the tenants file.
    keys = keys_file(tmp_path, f"a {KEY_A} weight=2\n")
    (tmp_path / "tenants.txt").write_text("a weight=3\n")
    with pytest.raises(tost_launch.StartError) as e:
        RunningServer(MODELS, [f"--api_keys_file={keys}", f"--tenants_file={tmp_path / 'tenants.txt'}"])
    assert "tenants.txt:1: duplicate tenant \"a\" (first named at" in str(e.value).replace('\\"', '"')


def http_post(port, path, body, key=None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["x-api-key"] = key
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def test_priority_out_of_range_is_refused_on_grpc_and_every_http_route(proto_modules):
    pb2, pb2_grpc = proto_modules
    srv = RunningServer(MODELS, ["--max_priority=10"])
    try:
        stub = pb2_grpc.TostStub(grpc.insecure_channel(srv.address))
        got = collect_generate(stub.Generate(pb2.GenerateRequest(
            model=LM, prompt_bytes=b"Hi", max_new_tokens=2, priority=11)), capture_error=True)
        assert got.error is not None and got.error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "priority must be in [-10, 10]" in got.error.details()
        assert "got 11" in got.error.details()
        ok = collect_generate(stub.Generate(pb2.GenerateRequest(
            model=LM, prompt_bytes=b"Hi", max_new_tokens=2, priority=-10)))
        assert len(ok.tokens) == 2
        for path, body in [
            ("/v1/completions", {"model": LM, "prompt": "Hi", "max_tokens": 2, "priority": -11}),
            ("/v1/chat/completions",
             {"model": LM, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
              "priority": 99}),
            ("/v1/responses", {"model": LM, "input": "Hi", "max_output_tokens": 2, "priority": 50}),
        ]:
            status, _, text = http_post(srv.http_port, path, body)
            assert status == 400, (path, status, text)
            assert "priority must be in [-10, 10]" in text, text
        status, _, text = http_post(srv.http_port, "/v1/completions",
                                    {"model": LM, "prompt": "Hi", "max_tokens": 2, "priority": "high"})
        assert status == 400 and "priority" in text
        status, _, text = http_post(srv.http_port, "/v1/completions",
                                    {"model": LM, "prompt": "Hi", "max_tokens": 2, "priority": 3})
        assert status == 200, text
    finally:
        srv.stop()


def test_a_generation_preempted_many_times_keeps_its_exact_tokens(proto_modules):
    pb2, pb2_grpc = proto_modules
    srv = RunningServer(MODELS, ["--batch_invariant_decode", "--max_active_generations=1",
                                 "--prefill_chunk_tokens=8"])
    try:
        stub = pb2_grpc.TostStub(grpc.insecure_channel(srv.address))
        low = pb2.GenerateRequest(model=LM, prompt_bytes=b"It is a truth universally acknowledged, that",
                                  max_new_tokens=900, priority=5,
                                  sampling=pb2.SamplingParams(temperature=1.0, seed=4242))
        alone = collect_generate(stub.Generate(low))
        assert len(alone.tokens) >= 60
        # Higher-priority calls, one each time the long one has drawn two more tokens: each takes
        # the only slot from it, and it goes on afterwards where it stopped.
        urgent_request = pb2.GenerateRequest(model=LM, prompt_bytes=b"Mr. Darcy", max_new_tokens=3, priority=-5,
                                             sampling=pb2.SamplingParams(temperature=0.0))
        got, urgent = generate_preempted_repeatedly(stub, pb2, low, urgent_request,
                                                    expected_tokens=len(alone.tokens), max_urgent=60)
        preempted = metric_value(scrape_metrics(srv), "tost_generation_preemptions_total",
                                 model=LM, reason="priority")
        # An urgent call that arrives before the long one got its slot back (its last tokens were
        # still on their way to the client) finds it parked already, and preempts nothing.
        assert urgent >= 15 and urgent // 2 <= preempted <= urgent, (urgent, preempted)
        assert got.ids == alone.ids
        assert got.final.finish_reason == alone.final.finish_reason
    finally:
        srv.stop()


def test_a_tokens_per_minute_quota_refuses_with_retry_after_and_spares_others(proto_modules, tmp_path):
    pb2, pb2_grpc = proto_modules
    keys = keys_file(tmp_path, f"a {KEY_A}\nq {KEY_Q} tokens_per_minute=120\n# b is not named\n"
                               f"b {KEY_B}\n")
    srv = RunningServer(MODELS, [f"--api_keys_file={keys}", "--tenant_token_window_s=4"])
    try:
        stub = pb2_grpc.TostStub(grpc.insecure_channel(srv.address))
        q_md = (("x-api-key", KEY_Q),)
        # Four closed-loop streams of q for three windows (12 s): what it gets is what its quota
        # allows, about 120 tokens a window, prompts included.
        totals = {"tokens": 0, "refusals": 0, "error": None}
        lock = threading.Lock()
        deadline = time.monotonic() + 12.0

        routes = {
            "/v1/completions": {"model": LM, "prompt": "Hi", "max_tokens": 2},
            "/v1/chat/completions":
                {"model": LM, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
            "/v1/responses": {"model": LM, "input": "Hi", "max_output_tokens": 2},
        }
        http_refusals = {}

        def call_q(max_new_tokens):
            """One gRPC call of q; a refusal is counted and then asked of every HTTP route too.
            Returns whether the call was refused."""
            got = collect_generate(stub.Generate(pb2.GenerateRequest(
                model=LM, prompt_bytes=b"Hi", max_new_tokens=max_new_tokens), metadata=q_md), capture_error=True)
            with lock:
                if got.error is not None:
                    if got.error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                        totals["error"] = got.error
                    totals["refusals"] += 1
                    totals["last_refusal"] = got.error.details()
                else:
                    totals["tokens"] += got.final.prompt_tokens + len(got.tokens)
            if got.error is None:
                return False
            # Out of its window now: every HTTP route refuses it too (the first answer that is a
            # refusal is kept; one that found room again is tried later).
            for path, body in routes.items():
                if path in http_refusals:
                    continue
                status, headers, text = http_post(srv.http_port, path, body, key=KEY_Q)
                if status == 200:
                    with lock:
                        totals["tokens"] += 4  # two prompt tokens (at most) and two drawn
                    continue
                http_refusals[path] = (status, headers, text)
            return True

        def stream():
            while time.monotonic() < deadline:
                if call_q(16):
                    time.sleep(0.2)

        threads = [threading.Thread(target=stream) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        streamed_tokens = totals["tokens"]
        # The streams meet a refusal only when one of their calls starts while the window is full,
        # which their timing decides (on a loaded machine it may never happen). Made certain here:
        # once the window has emptied, one long call fills it and waits, parked, for room; a call
        # started meanwhile is refused, on gRPC and on every HTTP route.
        if totals["refusals"] == 0 or set(http_refusals) != set(routes):
            time.sleep(4.2)
            holder = stub.Generate(pb2.GenerateRequest(model=LM, prompt_bytes=b"Hi", max_new_tokens=1000),
                                   metadata=q_md)
            holding = threading.Thread(target=collect_generate, args=(holder,), kwargs={"capture_error": True})
            holding.start()
            try:
                probe_deadline = time.monotonic() + 10
                while time.monotonic() < probe_deadline and (
                        totals["refusals"] == 0 or set(http_refusals) != set(routes)):
                    call_q(1)
                    time.sleep(0.05)
            finally:
                holder.cancel()
                holding.join()
        assert totals["error"] is None, totals["error"]
        assert totals["refusals"] > 0
        assert "quota tokens_per_minute=120" in totals["last_refusal"]
        assert "retry after about" in totals["last_refusal"]
        # Three windows and the start of a fourth (its first tokens may be in before the end), plus
        # a generation that ends after the deadline; the unit test holds it to 5% on a fake clock.
        assert 0.7 * 360 <= streamed_tokens <= 1.05 * 4 * 120 + 16 * 4, totals
        assert set(http_refusals) == set(routes)
        for path, (status, headers, text) in http_refusals.items():
            assert status == 429, (path, status, text)
            assert "quota tokens_per_minute=120" in text
            retry = int(headers.get("Retry-After", "0"))
            assert 1 <= retry <= 5, headers
        # Another tenant is not affected.
        a = collect_generate(stub.Generate(pb2.GenerateRequest(model=LM, prompt_bytes=b"Hi",
                                                               max_new_tokens=8),
                                           metadata=(("x-api-key", KEY_A),)))
        assert len(a.tokens) == 8
        samples = scrape_metrics(srv)
        assert metric_value(samples, "tost_tenant_quota_refusals_total",
                            tenant="q", quota="tokens_per_minute") >= 4
        assert metric_value(samples, "tost_tenant_generated_tokens_total", tenant="a") == 8
        # b is in the keys file: it is a configured tenant, with its own series; no "other" traffic.
        assert metric_value(samples, "tost_tenant_generated_tokens_total", tenant="other") == 0
        # The window empties: q is served again.
        time.sleep(4.2)
        status, _, text = http_post(srv.http_port, "/v1/completions",
                                    {"model": LM, "prompt": "Hi", "max_tokens": 2}, key=KEY_Q)
        assert status == 200, text
    finally:
        srv.stop()


def test_max_concurrent_refuses_past_the_quota_on_grpc_and_http(proto_modules, tmp_path):
    pb2, pb2_grpc = proto_modules
    keys = keys_file(tmp_path, f"a {KEY_A} max_concurrent=1\nb {KEY_B}\n")
    srv = RunningServer(MODELS, [f"--api_keys_file={keys}"])
    try:
        stub = pb2_grpc.TostStub(grpc.insecure_channel(srv.address))
        md = (("x-api-key", KEY_A),)
        long_call = stub.Generate(pb2.GenerateRequest(model=LM, prompt_bytes=b"Hi", max_new_tokens=2000),
                                  metadata=md)
        next(iter(long_call))  # running
        got = collect_generate(stub.Generate(pb2.GenerateRequest(model=LM, prompt_bytes=b"Hi",
                                                                 max_new_tokens=2), metadata=md),
                               capture_error=True)
        assert got.error is not None and got.error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "quota max_concurrent=1" in got.error.details()
        status, headers, text = http_post(srv.http_port, "/v1/chat/completions",
                                          {"model": LM, "messages": [{"role": "user", "content": "Hi"}],
                                           "max_tokens": 2}, key=KEY_A)
        assert status == 429 and "quota max_concurrent=1" in text and headers.get("Retry-After") == "1"
        b = collect_generate(stub.Generate(pb2.GenerateRequest(model=LM, prompt_bytes=b"Hi", max_new_tokens=2),
                                           metadata=(("x-api-key", KEY_B),)))
        assert len(b.tokens) == 2
        long_call.cancel()
    finally:
        srv.stop()


def test_session_quotas_refuse_past_max_sessions_and_close_gives_room_back(proto_modules, tmp_path):
    pb2, pb2_grpc = proto_modules
    keys = keys_file(tmp_path, f"a {KEY_A} max_sessions=2\nb {KEY_B}\n")
    srv = RunningServer(MODELS, [f"--api_keys_file={keys}"])
    try:
        stub = pb2_grpc.TostStub(grpc.insecure_channel(srv.address))
        md = (("x-api-key", KEY_A),)
        first = stub.CreateSession(pb2.CreateSessionRequest(model=LM), metadata=md)
        stub.CreateSession(pb2.CreateSessionRequest(model=LM), metadata=md)
        with pytest.raises(grpc.RpcError) as e:
            stub.CreateSession(pb2.CreateSessionRequest(model=LM), metadata=md)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "quota max_sessions=2 reached" in e.value.details()
        stub.CreateSession(pb2.CreateSessionRequest(model=LM), metadata=(("x-api-key", KEY_B),))
        stub.CloseSession(pb2.SessionRef(session_id=first.session_id), metadata=md)
        stub.CreateSession(pb2.CreateSessionRequest(model=LM), metadata=md)
    finally:
        srv.stop()
    # With a shared store the quota holds across replicas: test_shared_sessions.py.


def test_the_timing_trailer_shows_where_the_first_token_spent_its_time(proto_modules):
    pb2, pb2_grpc = proto_modules
    srv = RunningServer(MODELS, [])
    try:
        stub = pb2_grpc.TostStub(grpc.insecure_channel(srv.address))
        req = pb2.GenerateRequest(model=LM, prompt_bytes=b"It is a truth", max_new_tokens=3)
        call = stub.Generate(req, metadata=(("x-tost-timing", "1"),))
        assert sum(1 for m in call if m.WhichOneof("event") == "token") == 3
        trailer = dict(call.trailing_metadata()).get("x-tost-timing")
        assert trailer, call.trailing_metadata()
        t = {k: int(v) for k, v in (kv.split("=", 1) for kv in trailer.split(";"))}
        assert abs(t["arrival_unix_us"] / 1e6 - time.time()) < 60, t
        order = ["admit", "submit", "placed", "prefill_start", "prefill_end", "first_token", "first_write"]
        assert all(t[k] >= 0 for k in order), t
        assert [t[k] for k in order] == sorted(t[k] for k in order), t
        # The first token's step began at its place or later, and before its prefill ended.
        assert t["placed"] <= t["first_step_start"] <= t["prefill_end"], t
        # The prompt's tokens but the last were prefilled, in the step of the first token (alone).
        assert t["first_step_prefill_tokens"] >= 1 and t["first_step_batch"] == 1, t
        # Only a caller who asks gets it.
        plain = stub.Generate(req)
        assert sum(1 for m in plain if m.WhichOneof("event") == "token") == 3
        assert "x-tost-timing" not in dict(plain.trailing_metadata())
    finally:
        srv.stop()


def test_a_tenants_highest_priority_refuses_more_urgent_calls_on_grpc_and_http(proto_modules, tmp_path):
    pb2, pb2_grpc = proto_modules
    keys = keys_file(tmp_path, f"a {KEY_A} highest_priority=0\nb {KEY_B}\n")
    srv = RunningServer(MODELS, [f"--api_keys_file={keys}", "--max_priority=10"])
    try:
        stub = pb2_grpc.TostStub(grpc.insecure_channel(srv.address))
        md = (("x-api-key", KEY_A),)
        got = collect_generate(stub.Generate(pb2.GenerateRequest(model=LM, prompt_bytes=b"Hi", max_new_tokens=2,
                                                                 priority=-1), metadata=md), capture_error=True)
        assert got.error is not None and got.error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert 'tenant "a" may ask for priority 0 or higher (its highest_priority=0' in got.error.details()
        assert "got priority -1" in got.error.details()
        assert len(collect_generate(stub.Generate(pb2.GenerateRequest(model=LM, prompt_bytes=b"Hi", max_new_tokens=2,
                                                                      priority=0), metadata=md)).tokens) == 2
        for path, body in [
            ("/v1/completions", {"model": LM, "prompt": "Hi", "max_tokens": 2, "priority": -3}),
            ("/v1/chat/completions",
             {"model": LM, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "priority": -3}),
            ("/v1/responses", {"model": LM, "input": "Hi", "max_output_tokens": 2, "priority": -3}),
        ]:
            status, _, text = http_post(srv.http_port, path, body, key=KEY_A)
            assert status == 403, (path, status, text)
            assert "highest_priority=0" in text and "got priority -3" in text, text
        # Another tenant keeps the whole range.
        assert len(collect_generate(stub.Generate(pb2.GenerateRequest(model=LM, prompt_bytes=b"Hi", max_new_tokens=2,
                                                                      priority=-10),
                                                  metadata=(("x-api-key", KEY_B),))).tokens) == 2
        status, _, text = http_post(srv.http_port, "/v1/completions",
                                    {"model": LM, "prompt": "Hi", "max_tokens": 2, "priority": -10}, key=KEY_B)
        assert status == 200, text
    finally:
        srv.stop()
