"""No silently ignored field on /v1/completions and /v1/chat/completions: every field of the pinned
`openai` package's request types (its TypedDicts, walked here, with the fields of stream_options and
of every message type) is in openai_fields.py as honoured or refused, and each is probed against
the real server with the unmodified client: an honoured field has the effect its check says (on the
reply, the access log or the prefix cache), a refused one gets a 400 naming it. A field the package
adds and the list lacks fails the first test; a honoured field the server stops reading fails its
probe."""
import os
import typing

import openai
import pytest
import typing_extensions
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_create_params

from conftest import SOURCE_DIR, openai_client
from openai_fields import CHAT_BASE, COMPLETION_BASE, EXTENSIONS, FIELDS, Honoured, ProbeServer, Refused

MODELS = os.path.join(SOURCE_DIR, "models")
MODEL = "tost-austen"


def _typed_dicts(tp):
    """The TypedDicts inside an annotation (through Optional, Union, Iterable and Required)."""
    if typing_extensions.is_typeddict(tp):  # the package's TypedDicts are typing_extensions'
        return [tp]
    return [t for arg in typing.get_args(tp) for t in _typed_dicts(arg)]


def _keys(td):
    return set(typing.get_type_hints(td))


# The nested request fields walked field by field: their sub-fields are as easy to drop silently.
_NESTED = {"stream_options": "stream_options.", "messages": "messages[]."}


def schema_fields(module):
    """Every request field of a create-params module, nested ones as "stream_options.x" or
    "messages[].x"; `stream` comes from the streaming variant."""
    hints = typing.get_type_hints(module.CompletionCreateParamsBase)
    fields = set(hints) | _keys(module.CompletionCreateParamsStreaming)
    for name, prefix in _NESTED.items():
        if name in hints:
            for td in _typed_dicts(hints[name]):
                fields |= {prefix + k for k in _keys(td)}
    return fields


SCHEMAS = {"completions": completion_create_params, "chat": chat_create_params}


def test_every_schema_field_is_honoured_or_refused():
    assert openai.__version__ == "2.54.0", "the list follows the pinned package (requirements-test.txt)"
    for route, module in SCHEMAS.items():
        fields = schema_fields(module)
        listed = set(FIELDS[route])
        assert not fields - listed, f"{route}: fields neither honoured nor refused: {sorted(fields - listed)}"
        assert not listed - fields, f"{route}: listed fields the schema does not have: {sorted(listed - fields)}"
        overlap = listed & set(EXTENSIONS[route])
        assert not overlap, f"{route}: schema fields listed as extensions: {sorted(overlap)}"


_client = openai_client


def _call(srv, route, body):
    """The reply to `body` (a list of chunks when streamed), or the client's APIStatusError.
    Fields outside the route's schema go through extra_body, as a client sends them."""
    top = {f for f in schema_fields(SCHEMAS[route]) if "." not in f}
    known = {k: v for k, v in body.items() if k in top}
    extra = {k: v for k, v in body.items() if k not in top}
    known.setdefault("model", MODEL)
    create = _client(srv).chat.completions.create if route == "chat" else _client(srv).completions.create
    try:
        reply = create(**known, extra_body=extra or None)
        return list(reply) if body.get("stream") else reply
    except openai.APIStatusError as e:
        return e


def _bodies(route, name, entry):
    """(base body, probed body) for one listed field."""
    base = dict(CHAT_BASE if route == "chat" else COMPLETION_BASE)
    if name.startswith("messages[]."):
        key = name[len("messages[]."):]
        message = {**base["messages"][0], **(entry.base or {})}
        probed_message = {**message, key: entry.value}
        return ({**base, "messages": [message]}, {**base, "messages": [probed_message]})
    base.update(getattr(entry, "base", {}) or {})
    for key in getattr(entry, "without", ()):
        base.pop(key, None)
    if name.startswith("stream_options."):
        return base, {**base, "stream_options": {name.split(".", 1)[1]: entry.value}}
    return base, {**base, name: entry.value}


def _param_of(name):
    return name.replace("messages[].", "messages[0].")


def _probe(srv, route, name, entry):
    base_body, probed_body = _bodies(route, name, entry)
    probed = _call(srv, route, probed_body)
    if isinstance(entry, Refused):
        assert isinstance(probed, openai.APIStatusError), f"{route} {name}={entry.value!r} was not refused"
        param = _param_of(name)
        assert probed.status_code == 400, probed
        assert probed.body["param"] == param, probed.body
        assert probed.body["message"].startswith(param + ":"), probed.body
        return
    base = _call(srv, route, base_body)
    assert not isinstance(base, Exception), base
    assert isinstance(entry, Honoured)
    if getattr(entry.check, "needs_server", False):
        entry.check(base, probed, ProbeServer(srv.log.name, lambda r, body: _call(srv, r, body)))
    else:
        entry.check(base, probed)


@pytest.mark.parametrize("route,name", [(r, n) for r in FIELDS for n in sorted(FIELDS[r])])
def test_schema_field(srv, route, name):
    _probe(srv, route, name, FIELDS[route][name])


@pytest.mark.parametrize("route,name", [(r, n) for r in EXTENSIONS for n in sorted(EXTENSIONS[r])])
def test_extension_field(srv, route, name):
    _probe(srv, route, name, EXTENSIONS[route][name])


def test_server_still_serving_after_the_probes(srv):
    reply = _call(srv, "completions", dict(COMPLETION_BASE))
    assert not isinstance(reply, Exception) and reply.choices[0].text
