"""The OpenAI-compatible API on the HTTP front end (service/openai_http), driven by the unmodified
`openai` Python client where it can be: models, completions and chats (streamed or not), stop
strings, seeds, logprobs, n > 1, usage and the prefix cache's cached_tokens over a 20-turn chat,
errors in OpenAI's shape, API keys, a full queue, SSE arriving as produced, 1000 concurrent streams,
and a client that stops reading."""
import asyncio
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request

import httpx
import openai
import pytest

from conftest import RunningServer, SOURCE_DIR, generator_status, openai_client
from tost_harness import metric_value, scrape_metrics, wait_for_metric

MODELS = os.path.join(SOURCE_DIR, "models")
MODEL = "tost-austen"
API_KEY = "openai-test-key-0123456789"


client = openai_client


def post(srv, path, body, headers=None, timeout=60):
    """(status, headers, body bytes) of a raw POST: what the openai client would never send."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{srv.http_port}{path}", data=data, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def error_of(body):
    e = json.loads(body)["error"]
    assert set(e) == {"message", "type", "param", "code"}, e
    return e


# --- the basics ---------------------------------------------------------------------------------

def test_models_lists_the_language_model_only(srv):
    models = client(srv).models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].owned_by == "tost-serve"


def test_completion(srv):
    r = client(srv).completions.create(model=MODEL, prompt="It is a truth universally acknowledged", max_tokens=12,
                                       seed=3)
    assert r.object == "text_completion" and r.id.startswith("cmpl-") and r.model == MODEL
    (choice,) = r.choices
    assert choice.finish_reason == "length" and choice.text
    assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_chat(srv):
    r = client(srv).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Good morning"}],
                                            max_tokens=40, seed=5)
    (choice,) = r.choices
    assert r.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length") and choice.message.content is not None
    # The template's closing quote ends a reply, and is not part of it.
    assert '"' not in choice.message.content


def test_streamed_completion_equals_the_non_streamed_one(srv):
    c = client(srv)
    whole = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20, seed=9)
    chunks = list(c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20, seed=9, stream=True,
                                       stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == whole.choices[0].text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20


def test_streamed_chat(srv):
    c = client(srv)
    chunks = list(c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}],
                                            max_tokens=8, seed=1, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.usage is None for ch in chunks)  # not asked for
    whole = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=8,
                                      seed=1)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == whole.choices[0].message.content


def test_stop_string_ends_the_text_before_it(srv):
    c = client(srv)
    free = c.completions.create(model=MODEL, prompt="It was the best of times", max_tokens=30, seed=2).choices[0]
    words = free.text.split()
    assert len(words) > 3, free.text
    stop = words[2]
    cut = c.completions.create(model=MODEL, prompt="It was the best of times", max_tokens=30, seed=2,
                               stop=[stop]).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[:free.text.index(stop)]


def test_seeds(srv):
    c = client(srv)

    def text(**kw):
        return c.completions.create(model=MODEL, prompt="The weather", max_tokens=24, temperature=1.0,
                                    **kw).choices[0].text
    assert text(seed=42) == text(seed=42)
    assert text(seed=42) != text(seed=43)
    # Unseeded requests are given a random seed, as OpenAI's are: they vary.
    assert len({text() for _ in range(3)}) > 1


def test_logprobs(srv):
    c = client(srv)
    r = c.completions.create(model=MODEL, prompt="Pride and", max_tokens=5, logprobs=2, seed=1)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 5 and len(lp.token_logprobs) == 5 and len(lp.top_logprobs) == 5
    assert all(len(top) == 2 for top in lp.top_logprobs)
    assert all(v <= 0 for v in lp.token_logprobs)
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
                                  logprobs=True, top_logprobs=2, seed=1)
    content = r.choices[0].logprobs.content
    assert content and all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)


def test_n_choices_sample_differently(srv):
    r = client(srv).completions.create(model=MODEL, prompt="In the morning", max_tokens=16, n=2, seed=7,
                                       temperature=1.0)
    assert [ch.index for ch in r.choices] == [0, 1]
    assert r.choices[0].text != r.choices[1].text
    assert r.usage.completion_tokens == 32
    # Choice 0 keeps the request's seed: it is what n = 1 gives.
    one = client(srv).completions.create(model=MODEL, prompt="In the morning", max_tokens=16, seed=7,
                                         temperature=1.0)
    assert one.choices[0].text == r.choices[0].text


def test_a_repeated_prompt_is_served_from_the_prefix_cache(srv):
    c = client(srv)
    prompt = "Mr. Darcy walked into the assembly room at Meryton, and every eye in the room turned"
    first = c.completions.create(model=MODEL, prompt=prompt + " 1", max_tokens=1, seed=1)
    again = c.completions.create(model=MODEL, prompt=prompt + " 1", max_tokens=1, seed=1)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    # Up to the prompt's last token, which the first decode step feeds.
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1


def test_return_state_continues_from_the_blob(srv):
    c = client(srv)
    r = c.completions.create(model=MODEL, prompt="She said", max_tokens=4, seed=1, extra_body={"return_state": True})
    state = r.choices[0].model_extra["state"]  # base64, a ToST extension of the choice
    cont = c.completions.create(model=MODEL, prompt=" and", max_tokens=4, seed=1, extra_body={"state": state})
    assert cont.usage.prompt_tokens >= 1 and cont.choices[0].model_extra.get("state")


def test_http_metrics_count_routes_and_codes(srv):
    # A request is counted when its last byte is written, which the client may see a moment before
    # the server records it: each count is waited for (10 s at most), then checked.
    before = metric_value(scrape_metrics(srv), "tost_http_requests_total", route="/v1/completions", code="200")
    client(srv).completions.create(model=MODEL, prompt="x", max_tokens=1)
    assert wait_for_metric(srv, "tost_http_requests_total", lambda v: v >= before + 1, route="/v1/completions",
                           code="200") == before + 1
    post(srv, "/v1/completions", b"{")
    assert wait_for_metric(srv, "tost_http_requests_total", lambda v: v >= 1, route="/v1/completions",
                           code="400") >= 1
    assert wait_for_metric(srv, "tost_http_request_duration_seconds_count", lambda v: v >= before + 2,
                           route="/v1/completions") >= before + 2


# --- errors -------------------------------------------------------------------------------------

def test_unknown_model_is_not_found(srv):
    with pytest.raises(openai.NotFoundError) as e:
        client(srv).completions.create(model="no-such-model", prompt="x", max_tokens=1)
    assert e.value.body["param"] == "model" and "no-such-model" in e.value.body["message"]


@pytest.mark.parametrize("body,param", [
    (b'{"model": "tost-austen", "prompt": ', None),                         # malformed JSON
    (b'{"model": "tost-austen", "prompt": "x", "max_tokens": "ten"}', "max_tokens"),
    (b'{"model": "tost-austen", "prompt": "\xff\xfe"}', None),              # invalid UTF-8
    (b'{"model": "tost-austen", "prompt": "x", "temperature": 9}', "temperature"),
])
def test_bad_requests_are_400_naming_the_field(srv, body, param):
    status, _, raw = post(srv, "/v1/completions", body)
    e = error_of(raw)
    assert status == 400 and e["type"] == "invalid_request_error", e
    if param is not None:
        assert e["param"] == param and param in e["message"], e


def test_unsupported_field_is_refused_by_name(srv):
    with pytest.raises(openai.BadRequestError) as e:
        client(srv).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], frequency_penalty=0.5)
    assert e.value.body["param"] == "frequency_penalty", e.value.body


def test_huge_body_is_413(srv):
    status, _, raw = post(srv, "/v1/completions", b'{"prompt": "' + b"x" * (9 << 20) + b'"}')
    assert status == 413, raw[:200]


def test_chat_with_a_classifier_is_400(srv):
    with pytest.raises(openai.BadRequestError) as e:
        client(srv).chat.completions.create(model="tost-digits", messages=[{"role": "user", "content": "x"}])
    assert e.value.body["param"] == "model" and "tost-digits" in e.value.body["message"]
    assert "tost_lm" in e.value.body["message"], e.value.body


def test_chat_with_a_model_without_template_is_400(tmp_path):
    repo = tmp_path / "models"
    shutil.copytree(os.path.join(MODELS, MODEL), repo / MODEL)
    config = json.loads((repo / MODEL / "config.json").read_text())
    del config["chat_template"]
    (repo / MODEL / "config.json").write_text(json.dumps(config))
    with RunningServer(str(repo)) as s:
        with pytest.raises(openai.BadRequestError) as e:
            client(s).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
        assert "chat template" in e.value.body["message"], e.value.body
        # Completions still serve it.
        assert client(s).completions.create(model=MODEL, prompt="x", max_tokens=2).choices[0].text is not None


def test_api_keys(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"alice {API_KEY}\n")
    with RunningServer(MODELS, [f"--api_keys_file={keys}"]) as s:
        with pytest.raises(openai.AuthenticationError):
            client(s, api_key="wrong-key-wrong-key-0000").models.list()
        status, _, raw = post(s, "/v1/completions", {"model": MODEL, "prompt": "x"})
        assert status == 401 and error_of(raw)["type"] == "authentication_error"
        assert client(s, api_key=API_KEY).completions.create(model=MODEL, prompt="x", max_tokens=2).choices


def test_full_queue_is_429_with_retry_after():
    with RunningServer(MODELS, ["--max_active_generations=1", "--max_queued_generations=0"]) as s:
        c = client(s)
        held = c.completions.create(model=MODEL, prompt="x", max_tokens=2000, stream=True)
        first = next(iter(held))  # the place is taken and generating
        assert first.choices
        try:
            with pytest.raises(openai.RateLimitError) as e:
                c.completions.create(model=MODEL, prompt="y", max_tokens=2)
            assert int(e.value.response.headers["retry-after"]) >= 1
            assert e.value.body["type"] == "rate_limit_error"
        finally:
            held.close()
        # The held stream's place comes back once its client went away.
        deadline = time.monotonic() + 10
        while True:
            try:
                assert c.completions.create(model=MODEL, prompt="y", max_tokens=2).choices
                break
            except openai.RateLimitError:
                assert time.monotonic() < deadline
                time.sleep(0.1)


# --- streaming ----------------------------------------------------------------------------------

def test_sse_events_arrive_before_the_generation_ends(srv):
    body = json.dumps({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 1000, "stream": True,
                       "stop": []})
    start = time.monotonic()
    p = subprocess.Popen(["curl", "-sN", "-H", "Content-Type: application/json", "-d", body,
                          f"http://127.0.0.1:{srv.http_port}/v1/completions"], stdout=subprocess.PIPE)
    first_line = p.stdout.readline()
    first_at = time.monotonic() - start
    rest = p.stdout.read()
    end_at = time.monotonic() - start
    assert p.wait() == 0
    assert first_line.startswith(b"data: {")
    assert rest.rstrip().endswith(b"data: [DONE]")
    print(f"first SSE event after {first_at * 1000:.0f} ms, [DONE] after {end_at * 1000:.0f} ms")
    assert first_at < end_at / 4, (first_at, end_at)


def test_a_thousand_concurrent_streams():
    # 1000 streams and the health checks stay within the HTTP server's 1024 connections.
    with RunningServer(MODELS, ["--max_active_generations=256", "--max_queued_generations=1024"]) as s:
        url = f"http://127.0.0.1:{s.http_port}"

        async def stream(http, i):
            body = {"model": MODEL, "prompt": f"Stream {i}", "max_tokens": 8, "stream": True, "seed": i}
            async with http.stream("POST", url + "/v1/completions", json=body) as r:
                assert r.status_code == 200, await r.aread()
                events = [line async for line in r.aiter_lines() if line.startswith("data: ")]
            assert events[-1] == "data: [DONE]", events[-3:]
            return len(events)

        async def main():
            limits = httpx.Limits(max_connections=1100, max_keepalive_connections=1100)
            async with httpx.AsyncClient(limits=limits, timeout=300) as http:
                start = time.monotonic()
                counts = await asyncio.gather(*(stream(http, i) for i in range(1000)))
                return counts, time.monotonic() - start

        # Health checks from a thread of their own (not the event loop the streams keep busy).
        done, latencies = threading.Event(), []

        def health():
            while not done.is_set():
                start = time.monotonic()
                with urllib.request.urlopen(url + "/v1/health/live", timeout=30) as r:
                    assert r.status == 200
                latencies.append(time.monotonic() - start)
                time.sleep(0.1)
        checker = threading.Thread(target=health)
        checker.start()
        try:
            counts, wall = asyncio.run(main())
        finally:
            done.set()
            checker.join()
        print(f"1000 SSE streams of 8 tokens: {wall:.1f} s wall; {len(latencies)} health checks meanwhile, "
              f"slowest {max(latencies) * 1000:.0f} ms")
        assert len(counts) == 1000 and all(n >= 3 for n in counts)
        assert len(latencies) >= 2


def stalled_streams(s):
    """ServerStatus.stalled_streams of the model, over gRPC."""
    import grpc
    import tost_protos
    pb2, pb2_grpc = tost_protos.tost()
    with grpc.insecure_channel(s.address) as ch:
        status = pb2_grpc.TostStub(ch).ServerStatus(pb2.ServerStatusRequest(), timeout=10)
    return generator_status(status, MODEL).stalled_streams


def test_a_client_that_stops_reading_is_cut_after_the_stall_timeout():
    with RunningServer(MODELS, ["--stream_stall_timeout_ms=500"]) as s:
        # Long events (8 choices with 20 alternatives per token: megabytes over the context) fill
        # the server's stream buffer and the kernel's long before the generation ends.
        body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1000, "stream": True, "n": 8,
                           "logprobs": 20, "stop": []}).encode()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", s.http_port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        assert sock.recv(64).startswith(b"HTTP/1.1 200")
        # Read nothing more: the server's buffer and the kernel's fill, the job pauses, and after
        # the stall timeout the server gives up on the connection.
        deadline = time.monotonic() + 20
        while stalled_streams(s) == 0:
            assert time.monotonic() < deadline, "the stream never stalled"
            time.sleep(0.2)
        # The connection was reset: reading now finds its end (after whatever the kernel held).
        sock.settimeout(10)
        try:
            while sock.recv(1 << 16):
                pass
        except ConnectionResetError:
            pass
        sock.close()
        assert client(s).completions.create(model=MODEL, prompt="still serving", max_tokens=2).choices


# --- a 20-turn chat and the prefix cache ----------------------------------------------------------

TURNS = 20
CHUNK = 32


def chat_conversation(s):
    """20 turns through the openai client, resending the whole conversation each turn. Per turn:
    prompt tokens, cached tokens, prefill tokens the server counted during the turn (ServerStatus),
    the reply."""
    import grpc
    import tost_protos
    pb2, pb2_grpc = tost_protos.tost()
    c = client(s)
    messages, turns = [], []
    with grpc.insecure_channel(s.address) as ch:
        stub = pb2_grpc.TostStub(ch)

        def prefilled():
            return generator_status(stub.ServerStatus(pb2.ServerStatusRequest(), timeout=10), MODEL).prefill_tokens
        for i in range(TURNS):
            messages.append({"role": "user", "content": f"Tell me, in the chapter {i}, what she said."})
            before = prefilled()
            r = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, seed=11,
                                          temperature=0.8)
            reply = r.choices[0].message.content
            messages.append({"role": "assistant", "content": reply})
            turns.append(dict(prompt=r.usage.prompt_tokens, cached=r.usage.prompt_tokens_details.cached_tokens,
                              prefill=prefilled() - before, reply=reply))
    return turns


def report(name, turns):
    print(f"\n{name}: turn prompt cached prefill")
    for i, t in enumerate(turns):
        print(f"  {i + 1:2d} {t['prompt']:4d} {t['cached']:4d} {t['prefill']:4d}")


def run_chat(*args):
    with RunningServer(MODELS, [f"--prefill_chunk_tokens={CHUNK}", *args]) as s:
        return chat_conversation(s)


def test_a_resent_20_turn_chat_prefills_only_the_new_message():
    turns = run_chat()
    report("20-turn chat, default decode", turns)
    assert turns[0]["cached"] == 0
    for prev, t in zip(turns, turns[1:]):
        # The previous prompt and reply are cached; what is fed is the new user message with the
        # template's quotes around it (and a reply token the tokenizer cut differently when the
        # reply is resent as text).
        new = t["prompt"] - t["cached"]
        assert t["cached"] >= prev["prompt"], (prev, t)
        assert new <= 24, (prev, t)
        assert t["prefill"] == new - 1, t  # the last prompt token is fed by the first decode step
    # Flat: the last turn prefills no more than the second, though its prompt is ten times longer.
    assert turns[-1]["prefill"] <= turns[1]["prefill"] + 4
    assert turns[-1]["prompt"] > 5 * turns[1]["prompt"] / 2


def test_batch_invariant_chat_replies_equal_the_uncached_servers():
    cached = run_chat("--batch_invariant_decode")
    cold = run_chat("--batch_invariant_decode", "--prefix_cache_bytes=0")
    report("20-turn chat, batch-invariant, cache", cached)
    report("20-turn chat, batch-invariant, no cache", cold)
    assert [t["reply"] for t in cached] == [t["reply"] for t in cold]
    assert all(t["cached"] == 0 for t in cold)
    for prev, t in zip(cached, cached[1:]):
        # Hits only on the chunk grid: the last multiple of the chunk the previous prompt reached.
        assert t["cached"] == (prev["prompt"] - 1) // CHUNK * CHUNK, (prev, t)
        assert t["prefill"] == t["prompt"] - 1 - t["cached"], t


# --- sessions and the drain -----------------------------------------------------------------------

def test_a_session_is_continued_by_its_owner_only(tmp_path):
    import grpc
    import tost_protos
    keys = tmp_path / "keys"
    keys.write_text(f"alice {API_KEY}\nbob {API_KEY[::-1]}\n")
    pb2, pb2_grpc = tost_protos.tost()
    with RunningServer(MODELS, [f"--api_keys_file={keys}"]) as s, grpc.insecure_channel(s.address) as ch:
        session = pb2_grpc.TostStub(ch).CreateSession(pb2.CreateSessionRequest(model=MODEL),
                                                      metadata=[("x-api-key", API_KEY)], timeout=10)
        alice, bob = client(s, api_key=API_KEY), client(s, api_key=API_KEY[::-1])
        first = alice.completions.create(model=MODEL, prompt="It was", max_tokens=3, seed=1,
                                         extra_body={"session_id": session.session_id})
        assert first.model_extra["session_id"] == session.session_id
        with pytest.raises(openai.APIStatusError) as e:
            bob.completions.create(model=MODEL, prompt="x", max_tokens=3, extra_body={"session_id": session.session_id})
        assert e.value.status_code in (403, 404), e.value
        # Bob's refusal left it to alice: continuing it sends only the new text (the rest is in
        # the session's state).
        second = alice.completions.create(model=MODEL, prompt=" and", max_tokens=3,
                                          extra_body={"session_id": session.session_id})
        assert second.usage.prompt_tokens == 1 and second.choices[0].text


def test_a_stream_in_flight_at_a_drain_ends_drained():
    import signal
    with RunningServer(MODELS, ["--drain_timeout_s=0"]) as s:
        stream = client(s).completions.create(model=MODEL, prompt="x", max_tokens=4000, stream=True, stop=[])
        chunks = iter(stream)
        assert next(chunks).choices
        s.proc.send_signal(signal.SIGTERM)
        reasons = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
        assert reasons[-1] == "drained", reasons[-3:]
        assert s.proc.wait(timeout=30) == 0
