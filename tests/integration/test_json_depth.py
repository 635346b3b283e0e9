"""Deeply nested JSON bodies on every route of the HTTP front end that reads one: each is refused
with a 400 naming the depth limit before any recursive reader (nlohmann's dump, XGrammar's schema
converter) sees it, and the server goes on serving. A body nested 100,000 deep used to overflow the
stack of the thread that serialised a guided_json schema."""
import http.client
import json
import os

import pytest

from conftest import SOURCE_DIR, RunningServer

DEPTH = 100_000


@pytest.fixture(scope="module")
def server():
    s = RunningServer(os.path.join(SOURCE_DIR, "models"))
    yield s
    assert s.stop() == 0


def _post(port, path, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def _deep_array():
    return "[" * DEPTH + "]" * DEPTH


def _deep_object():
    return '{"a":' * DEPTH + "1" + "}" * DEPTH


def _create_conversation(port):
    status, body = _post(port, "/v1/conversations", b"{}")
    assert status == 200, body
    return json.loads(body)["id"]


# (path, body with the deep value in a field each route reads, or the whole body)
def _cases(conversation):
    chat = '{"model": "tost-austen", "messages": [{"role": "user", "content": "hi"}], "guided_json": %s}'
    return [
        ("/v1/completions", '{"model": "tost-austen", "prompt": %s}' % _deep_array()),
        ("/v1/chat/completions", chat % _deep_object()),
        ("/v1/chat/completions", _deep_array()),
        ("/v1/responses", '{"model": "tost-austen", "input": "hi", "text": {"format": '
         '{"type": "json_schema", "name": "x", "schema": %s}}}' % _deep_object()),
        ("/v1/responses", '{"model": "tost-austen", "input": "hi", "metadata": %s}' % _deep_object()),
        ("/v1/conversations", '{"items": %s}' % _deep_array()),
        (f"/v1/conversations/{conversation}", '{"metadata": %s}' % _deep_object()),
        (f"/v1/conversations/{conversation}/items", '{"items": %s}' % _deep_array()),
    ]


def test_bodies_nested_100000_deep_are_refused_on_every_route(server):
    port = server.http_port
    for path, body in _cases(_create_conversation(port)):
        status, answer = _post(port, path, body.encode())
        assert status == 400, (path, status, answer[:300])
        error = json.loads(answer)["error"]
        assert error["param"] == "body", (path, error)
        assert "nested at most 320 levels deep" in error["message"], (path, error)
        assert len(answer) < 1024, (path, len(answer))
    # Still serving, and a schema at a sane depth still constrains.
    status, answer = _post(port, "/v1/chat/completions", json.dumps({
        "model": "tost-austen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
        "guided_json": {"type": "object", "properties": {"a": {"type": "integer"}}}}).encode())
    assert status == 200, answer


def test_a_schema_past_the_constraint_nesting_bound_is_refused_naming_its_field(server):
    schema = '{"items":' * 257 + "{}" + "}" * 257
    body = ('{"model": "tost-austen", "messages": [{"role": "user", "content": "hi"}], '
            '"guided_json": %s}' % schema)
    status, answer = _post(server.http_port, "/v1/chat/completions", body.encode())
    assert status == 400, answer
    error = json.loads(answer)["error"]
    assert error["param"] == "guided_json"
    assert "nested at most 256 levels deep" in error["message"]
