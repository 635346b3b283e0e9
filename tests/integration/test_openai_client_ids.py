"""OpenAI's end-user identifiers and cache key on the completions, chat and Responses routes, with the
unmodified `openai` client: `user` and `safety_identifier` go to the request's access-log line (in
text and in JSON logs), where a hostile value (quotes, newlines, a forged line, controls) stays
inside its one field of its one line and an oversized one is refused before it reaches the log;
`prompt_cache_key` makes requests that share a prefix start from it (usage's cached tokens). Every
bad value is a 400 naming its field, and the server goes on serving."""
import json
import os
import time

import openai
import pytest

from conftest import SOURCE_DIR, RunningServer
from openai_fields import SHARED_PROMPT, access_log_line

MODELS = os.path.join(SOURCE_DIR, "models")
MODEL = "tost-austen"
FORGED = "2026-01-01T00:00:00.000000Z INFO http request_id=forged status=200"
HOSTILE = 'eve" status=500 \n' + FORGED + '\r\n\x1b[31m\u2028\u202e'


@pytest.fixture(scope="module", params=["text", "json"])
def srv(request):
    s = RunningServer(MODELS, [f"--log_format={request.param}"])
    s.log_format = request.param
    yield s
    assert s.stop() == 0


def _client(srv):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{srv.http_port}/v1", api_key="none", max_retries=0,
                         timeout=120)


def _create(srv, route, **fields):
    c = _client(srv)
    if route == "completions":
        return c.completions.create(model=MODEL, prompt="It is a truth", max_tokens=2, extra_body=fields)
    if route == "chat":
        return c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Good day"}],
                                         max_tokens=2, extra_body=fields)
    return c.responses.create(model=MODEL, input="Good day", max_output_tokens=2, extra_body=fields)


def _log_fields(srv, request_id):
    """The access-log line of `request_id` as a dict (JSON logs), or its text line."""
    if srv.log_format == "text":
        return access_log_line(srv.log.name, request_id)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(srv.log.name, encoding="utf-8") as f:
            for line in f:
                event = json.loads(line)  # every line is one JSON object
                if event.get("msg") == "http" and event.get("request_id") == request_id:
                    return event
        time.sleep(0.05)
    raise AssertionError(f"no access-log line for request {request_id}")


def _log_lines(srv):
    with open(srv.log.name, encoding="utf-8", errors="strict") as f:
        return f.read().split("\n")


@pytest.mark.parametrize("route", ["completions", "chat", "responses"])
def test_user_and_safety_identifier_are_on_the_access_log_line(srv, route):
    reply = _create(srv, route, user="user-42", safety_identifier="sha256:ab12")
    got = _log_fields(srv, reply._request_id)
    if srv.log_format == "json":
        assert got["user"] == "user-42" and got["safety_identifier"] == "sha256:ab12", got
    else:
        assert " user=user-42 " in got + " " and " safety_identifier=sha256:ab12" in got, got
    plain = _log_fields(srv, _create(srv, route)._request_id)
    assert "user" not in plain and "safety_identifier" not in plain, plain


@pytest.mark.parametrize("route", ["completions", "chat", "responses"])
def test_a_hostile_identifier_stays_inside_its_field(srv, route):
    reply = _create(srv, route, user=HOSTILE, safety_identifier='x"\ny')
    got = _log_fields(srv, reply._request_id)
    lines = _log_lines(srv)
    # No line of the log starts as the forged one, and none holds a raw control character.
    assert not [line for line in lines if line.startswith(FORGED[:19])]
    assert not [line for line in lines if any(ord(c) < 0x20 or c in "\u2028\u202e" for c in line)]
    if srv.log_format == "json":
        assert got["user"] == HOSTILE and got["safety_identifier"] == 'x"\ny', got
    else:
        assert 'user="eve\\" status=500 \\n2026-01-01T00:00:00.000000Z INFO http request_id=forged ' in got, got
        assert 'safety_identifier="x\\"\\ny"' in got, got


@pytest.mark.parametrize("route", ["completions", "chat", "responses"])
@pytest.mark.parametrize("field,value,expected", [
    ("user", "u" * 10_000, "at most 256 characters, got one of 10000"),
    ("user", "\n" * 257, "at most 256 characters, got one of 257"),
    ("safety_identifier", "é" * 65, "at most 64 characters, got one of 65"),
    ("prompt_cache_key", "k" * 257, "at most 256 characters, got one of 257"),
    ("user", 7, "expected a string, got"),
    ("safety_identifier", {"id": "a"}, "expected a string, got"),
    ("prompt_cache_key", ["a"], "expected a string, got"),
])
def test_bad_identifiers_are_refused_by_name(srv, route, field, value, expected):
    size_before = os.path.getsize(srv.log.name)
    with pytest.raises(openai.BadRequestError) as e:
        _create(srv, route, **{field: value})
    assert e.value.body["param"] == field, e.value.body
    assert e.value.body["message"].startswith(field + ": ") and expected in e.value.body["message"], e.value.body
    time.sleep(0.2)
    with open(srv.log.name, encoding="utf-8") as f:
        f.seek(size_before)
        added = f.read()
    assert "u" * 300 not in added and len(added) < 2000, added[:500]
    assert _create(srv, route).usage is not None  # still serving


def test_at_the_bounds_identifiers_are_taken(srv):
    reply = _create(srv, "chat", user="u" * 256, safety_identifier="é" * 64, prompt_cache_key="k" * 256)
    got = _log_fields(srv, reply._request_id)
    assert ("u" * 256) in (got["user"] if srv.log_format == "json" else got)


def test_prompt_cache_key_on_the_responses_route(srv):
    """Three responses that share a prefix and then differ: in one prompt_cache_key group the third
    starts from the shared prefix the second stored; without a key nothing is cached."""
    c = _client(srv)
    tag = f"{time.monotonic_ns()} {srv.log_format}"
    found = {}
    for key in (None, "responses-group"):
        cached = []
        for tail in ("Of Jane.", "Wherefore Lydia?", "Kitty coughed."):
            r = c.responses.create(model=MODEL, instructions=f"[{tag} {key}] {SHARED_PROMPT}", input=tail,
                                   max_output_tokens=2, store=False,
                                   extra_body={"prompt_cache_key": key} if key else None)
            assert r.usage.input_tokens < 128, "keep the prompts within one prefill chunk"
            cached.append(r.usage.input_tokens_details.cached_tokens)
        found[key] = cached
    assert found[None] == [0, 0, 0], found
    assert found["responses-group"][:2] == [0, 0] and found["responses-group"][2] > 40, found
