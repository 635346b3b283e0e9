"""OpenAI's Responses API and Conversations API on the HTTP front end (service/openai_http/
responses_routes.cc), driven by the unmodified `openai` client on the shipped tost-austen: a 100-turn
conversation through previous_response_id that prefills only each turn's new input and keeps its
latency flat; the Responses event stream against the same response unstreamed; structured output
under text.format; stored responses (retrieve, input_items and their pagination, delete, branches);
store=false with the state extension; conversations and their items; owners (API keys); hostile
requests refused in OpenAI's error shape, naming the field; and the Responses metrics moving by
exactly what a controlled sequence of requests makes them move."""
import base64
import json
import os
import re
import statistics
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from conftest import RunningServer, SOURCE_DIR, openai_client
from constrained_schemas import SCHEMAS, check_output
from tost_harness import metric_value, scrape_metrics, wait_for_metric

MODELS = os.path.join(SOURCE_DIR, "models")
MODEL = "tost-austen"
CONTEXT = 1024  # tost-austen's context_length (models/tost-austen/config.json)
KEY_A = "responses-key-alice-0123456789"
KEY_B = "responses-key-bob-9876543210ab"
UNKNOWN_RESPONSE = "resp_" + "0" * 32  # well formed, never handed out


client = openai_client


def request(srv, method, path, body=None, api_key=None, timeout=60):
    """(status, body bytes) of a raw request: what the openai client would never send."""
    data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(f"http://127.0.0.1:{srv.http_port}{path}", data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def error_of(raw):
    """The error object of an error body, which must be exactly OpenAI's shape."""
    body = json.loads(raw)
    assert set(body) == {"error"}, body
    e = body["error"]
    assert set(e) == {"message", "type", "param", "code"}, e
    assert isinstance(e["message"], str) and e["message"], e
    return e


def metric(srv, name, **labels):
    return metric_value(scrape_metrics(srv), name, **labels)


def prefilled(srv):
    return metric(srv, "tost_prefill_tokens_total", model=MODEL)


def cached(r):
    return cached_of(r.usage)


def cached_of(usage):
    return usage.input_tokens_details.cached_tokens


def extra(obj, key):
    """A field of a response the openai types do not declare (the ToST extensions)."""
    return (obj.model_extra or {}).get(key)


# --- 1. a 100-turn conversation ------------------------------------------------------------------

TURNS = 100
TURN_INPUT = "Yes."
TURN_OUTPUT_TOKENS = 3
EARLY, LATE = range(2, 12), range(91, 101)  # turns 2-11 and 91-100
REPEATS = 12  # extra timed calls of each early and late turn, interleaved


def test_a_hundred_turns_prefill_only_their_new_input_and_keep_their_latency(srv):
    """Each turn continues the previous one by previous_response_id: the prefill counter moves by
    exactly usage.input_tokens - cached_tokens, the same for every turn (the history is carried by
    the state, never prefilled again), cached_tokens is the whole previous conversation, and the
    last ten turns take no longer than the first ten (mean within 1.2x)."""
    c = client(srv)
    kw = dict(model=MODEL, input=TURN_INPUT, max_output_tokens=TURN_OUTPUT_TOKENS, temperature=0)
    # Warm up the route, the store and the decode path: a chain of its own, on another first input
    # (the chain's first turn must not start from the prefix-state cache).
    warm = c.responses.create(**{**kw, "input": "No."})
    for _ in range(5):
        warm = c.responses.create(previous_response_id=warm.id, **kw)

    ids, usages, latencies, deltas = [None], [None], [None], [None]  # 1-based: index = turn
    before = prefilled(srv)
    r = c.responses.create(**kw)
    first_prefill = wait_for_metric(srv, "tost_prefill_tokens_total", lambda v: v > before, model=MODEL) - before
    ids.append(r.id)
    usages.append(r.usage)
    latencies.append([])
    deltas.append(first_prefill)
    assert cached(r) == 0 and r.usage.output_tokens == TURN_OUTPUT_TOKENS, r.usage
    for turn in range(2, TURNS + 1):
        before = prefilled(srv)
        start = time.perf_counter()
        r = c.responses.create(previous_response_id=ids[-1], **kw)
        elapsed = time.perf_counter() - start
        prefill = r.usage.input_tokens - cached(r)
        got = wait_for_metric(srv, "tost_prefill_tokens_total", lambda v: v >= before + prefill, timeout_s=3,
                              model=MODEL, message=f"turn {turn}") - before
        assert got == prefill, f"turn {turn}: the prefill counter moved by {got}, usage says {prefill}: {r.usage}"
        if turn == 2:
            per_turn = r.usage.total_tokens - usages[1].total_tokens
            budget = usages[1].total_tokens + (TURNS - 1) * per_turn
            print(f"\n100 turns: {usages[1].total_tokens} tokens in turn 1, then {per_turn} per turn "
                  f"({prefill} prefilled): {budget} of the {CONTEXT}-token context")
            assert budget <= CONTEXT, f"{TURNS} turns of {per_turn} tokens do not fit the context: {budget}"
            # What turn 1 took in as its whole input (the rendered user message and the reply's
            # opening) is all turn 2 prefills.
            assert prefill == usages[1].input_tokens, (r.usage, usages[1])
        else:
            # Only the new input is prefilled: the same count at every turn, whatever the history.
            assert got == deltas[2], f"turn {turn} prefilled {got} tokens, turn 2 {deltas[2]}"
        # The history is the whole previous conversation, carried by the state.
        assert cached(r) == usages[-1].total_tokens, (turn, r.usage, usages[-1])
        assert cached(r) > cached_of(usages[-1]), (turn, r.usage)
        assert r.previous_response_id == ids[-1]
        ids.append(r.id)
        usages.append(r.usage)
        latencies.append([elapsed])
        deltas.append(got)
    assert usages[TURNS].total_tokens <= CONTEXT, usages[TURNS]

    # Each early and late turn again, alternating between the two windows so that any change in
    # the machine's load falls on both: a turn is the call continuing the turn before it (a branch
    # of the same state, stored like the chain's).
    for _ in range(REPEATS):
        for early, late in zip(EARLY, LATE):
            for turn in (early, late):
                start = time.perf_counter()
                r = c.responses.create(previous_response_id=ids[turn - 1], **kw)
                latencies[turn].append(time.perf_counter() - start)
                assert r.usage.input_tokens == usages[turn].input_tokens, (turn, r.usage, usages[turn])
    turn_latency = {t: statistics.median(latencies[t]) for t in (*EARLY, *LATE)}
    early_mean = statistics.mean(turn_latency[t] for t in EARLY)
    late_mean = statistics.mean(turn_latency[t] for t in LATE)
    ratio = late_mean / early_mean
    print(f"prefill per turn: turn 1 {deltas[1]} tokens (input {usages[1].input_tokens}), turns 2-100 "
          f"{sorted(set(deltas[2:]))} tokens; cached_tokens {cached_of(usages[2])} at turn 2, "
          f"{cached_of(usages[TURNS])} at turn 100; context {usages[TURNS].total_tokens} tokens at turn 100")
    print(f"latency (median of {1 + REPEATS} calls per turn): turns 2-11 mean {early_mean * 1e3:.2f} ms, "
          f"turns 91-100 mean {late_mean * 1e3:.2f} ms, ratio {ratio:.3f}")
    assert late_mean <= 1.2 * early_mean, (
        f"turns 91-100 took {late_mean * 1e3:.2f} ms on average, turns 2-11 {early_mean * 1e3:.2f} ms: "
        f"ratio {ratio:.3f} > 1.2")


def test_a_fresh_response_prefills_what_its_usage_says(srv):
    """docs/api.md: input_tokens - cached_tokens is what the turn computed of its input; a fresh
    response's last input token is fed by the first decode step, not a prefill chunk, so
    tost_prefill_tokens_total grows by one less (a continued one feeds the previous turn's last
    output token in its prefill instead, and the two agree exactly: the 100-turn test)."""
    c = client(srv)
    for text in ("A fresh response, never sent before.", "Another fresh one, longer than the first, 0123."):
        before = prefilled(srv)
        r = c.responses.create(model=MODEL, input=text, max_output_tokens=2, temperature=0, store=False)
        expected = r.usage.input_tokens - cached(r)
        wait_for_metric(srv, "tost_prefill_tokens_total", lambda v: v > before, model=MODEL)
        time.sleep(0.05)  # and nothing more comes
        got = prefilled(srv) - before
        assert got == expected - 1, (
            f"a fresh response: tost_prefill_tokens_total moved by {got}, usage.input_tokens - cached_tokens = "
            f"{expected} ({r.usage}); docs/api.md says the counter takes one less")


# --- 2. the event stream -------------------------------------------------------------------------

OPENING = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
CLOSING = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


def check_events(events, whole):
    """`events` (one streamed response) against `whole` (the same request unstreamed)."""
    types = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events))), types
    terminal = "response.completed" if whole.status == "completed" else "response.incomplete"
    n = len(events) - len(OPENING) - len(CLOSING) - 1
    assert n >= 1 and types == OPENING + ["response.output_text.delta"] * n + CLOSING + [terminal], types
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text, (text, whole.output_text)
    assert all(e.delta for e in events if e.type == "response.output_text.delta")
    created, final = events[0].response, events[-1].response
    assert created.status == "in_progress" and created.output == [] and created.usage is None
    assert created.id == final.id and final.status == whole.status
    # (The same prompt again: the prefix-state cache may serve it, so only cached_tokens may differ.)
    assert final.output_text == whole.output_text
    assert (final.usage.input_tokens, final.usage.output_tokens) == (whole.usage.input_tokens,
                                                                     whole.usage.output_tokens)
    assert final.incomplete_details == whole.incomplete_details
    item_id = events[2].item.id
    assert events[2].item.status == "in_progress" and final.output[0].id == item_id
    assert all(e.item_id == item_id for e in events[3:-1] if hasattr(e, "item_id")), types
    done = events[-4]
    assert done.text == whole.output_text
    assert events[-2].item.content[0].text == whole.output_text


def test_the_stream_is_the_unstreamed_response_event_by_event(srv):
    c = client(srv)
    statuses = set()
    for seed in (11, 12, 13, 14):
        kw = dict(model=MODEL, input="Tell me of Bath, and of the Pump Room.", max_output_tokens=24, temperature=0.8,
                  extra_body={"seed": seed}, store=False)
        whole = c.responses.create(**kw)
        events = list(c.responses.create(stream=True, **kw))
        check_events(events, whole)
        statuses.add(whole.status)
    print(f"stream statuses: {sorted(statuses)}")
    # Sampled with a seed: a second seed gives another text (the comparison above has teeth).
    one = c.responses.create(model=MODEL, input="Tell me of Bath.", max_output_tokens=24, temperature=0.8,
                             extra_body={"seed": 1}, store=False)
    two = c.responses.create(model=MODEL, input="Tell me of Bath.", max_output_tokens=24, temperature=0.8,
                             extra_body={"seed": 2}, store=False)
    assert one.output_text != two.output_text


def test_a_stored_streamed_response_is_retrievable_and_continues(srv):
    c = client(srv)
    events = list(c.responses.create(model=MODEL, input="Good evening.", max_output_tokens=12, temperature=0,
                                     stream=True))
    final = events[-1].response
    got = c.responses.retrieve(final.id)
    assert got.output_text == final.output_text and got.usage == final.usage
    cont = c.responses.create(model=MODEL, previous_response_id=final.id, input="Indeed.", max_output_tokens=4,
                              temperature=0)
    assert cached(cont) == final.usage.total_tokens


def test_the_stream_helper(srv):
    """client.responses.stream(): the SDK's own accumulator reads the stream to a final response,
    which needs a response.completed event: a seed whose reply ends by itself."""
    c = client(srv)
    kw = dict(model=MODEL, input="Good morning.", max_output_tokens=200, temperature=0.8, store=False)
    for seed in range(20):
        whole = c.responses.create(extra_body={"seed": seed}, **kw)
        if whole.status == "completed":
            break
    else:
        pytest.fail("no seed in 20 gave a reply that ended within 200 tokens")
    with c.responses.stream(extra_body={"seed": seed}, **kw) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == whole.output_text == final.output_text
    assert final.status == "completed" and final.usage.output_tokens == whole.usage.output_tokens


# --- 3. structured output ------------------------------------------------------------------------

def test_json_schema_outputs_validate(srv):
    c = client(srv)
    max_tokens = 256

    def run(name, seed):
        fmt = {"type": "json_schema", "name": name, "schema": SCHEMAS[name], "strict": True}
        r = c.responses.create(model=MODEL, input="Tell me about her, plainly.", max_output_tokens=max_tokens,
                               temperature=1.0, extra_body={"seed": seed}, store=False, text={"format": fmt})
        assert r.text.format.type == "json_schema" and r.text.format.name == name, r.text
        return name, r

    jobs = [(name, seed) for name in ("bounds", "nested_object", "top_level_array") for seed in range(6)]
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda job: run(*job), jobs))
    complete = 0
    for name, r in results:
        if r.status == "completed":
            value = check_output(SCHEMAS[name], r.output_text)
            if isinstance(value, dict):  # properties in the schema's order
                assert list(value) == [k for k in SCHEMAS[name]["properties"] if k in value], r.output_text
            complete += 1
        else:
            assert r.status == "incomplete" and r.usage.output_tokens == max_tokens, (r.status, r.usage)
    print(f"json_schema: {complete} of {len(results)} outputs complete")
    assert complete >= len(results) // 2, f"only {complete} of {len(results)} outputs completed"
    assert len({r.output_text for _, r in results}) > len(results) // 2, "the seeds gave few distinct outputs"


def json_object_prefix(text):
    """Whether `text` is a JSON object or the start of one: closing its open string, giving its last
    key a value (or finishing a literal) and closing its brackets makes one."""
    stack, in_string, escaped = [], False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]":
            if not stack or stack.pop() != ch:
                return False
    head = text
    if in_string:
        unicode_escape = re.search(r"\\u([0-9a-fA-F]{0,3})$", text)
        head += "n" if escaped else "0" * (4 - len(unicode_escape.group(1))) if unicode_escape else ""
        head += '"'
    closers = "".join(reversed(stack))
    for mid in ("", "0", ":0", '"":0', "e", "l", "ue", "se"):
        try:
            return isinstance(json.loads(head + mid + closers), dict)
        except ValueError:
            continue
    return False


def test_json_object_outputs_are_objects(srv):
    """tost-austen's prose runs on inside the strings of a free object: no output ends within the
    budget, so each must be the start of an object, and any that ends, an object."""
    assert json_object_prefix('{"a": [1, "b') and json_object_prefix('{"a": tr') and json_object_prefix('{"a":')
    assert not json_object_prefix('{"a" 1') and not json_object_prefix('["a"') and not json_object_prefix('{}}')
    c = client(srv)
    kw = dict(model=MODEL, input="Describe her as JSON.", max_output_tokens=64, temperature=1.0, store=False)
    statuses = []
    for seed in range(4):
        r = c.responses.create(extra_body={"seed": seed}, text={"format": {"type": "json_object"}}, **kw)
        assert r.text.format.type == "json_object"
        assert r.output_text.startswith("{") and json_object_prefix(r.output_text), r.output_text
        if r.status == "completed":
            assert isinstance(json.loads(r.output_text), dict), r.output_text
        statuses.append(r.status)
        # The same seed without the format: prose, which the format turned into an object.
        free = c.responses.create(extra_body={"seed": seed}, **kw)
        assert not json_object_prefix(free.output_text), free.output_text
    print(f"json_object: {statuses}")


# --- 4. stored responses -------------------------------------------------------------------------

ITEMS = [
    {"role": "user", "content": "First."},
    {"role": "assistant", "content": "Second."},
    {"role": "user", "content": [{"type": "input_text", "text": "Third."}]},
    {"type": "message", "role": "developer", "content": "Fourth."},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fif"},
                                                     {"type": "input_text", "text": "th."}]},
]
ITEM_TEXTS = ["First.", "Second.", "Third.", "Fourth.", "Fifth."]
ITEM_ROLES = ["user", "assistant", "user", "developer", "user"]


def texts_of(items):
    return [item.content[0].text for item in items]


def test_stored_response_lifecycle(srv):
    c = client(srv)
    r = c.responses.create(model=MODEL, input=ITEMS, max_output_tokens=8, temperature=0, metadata={"case": "life"})
    assert r.id.startswith("resp_") and r.store is True and r.metadata == {"case": "life"}
    got = c.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()

    # Input items: newest first by default; pages by limit, order and after.
    page = c.responses.input_items.list(r.id)
    assert texts_of(page.data) == ITEM_TEXTS[::-1] and page.has_more is False
    assert [i.role for i in page.data] == ITEM_ROLES[::-1]
    assert page.first_id == page.data[0].id and page.last_id == page.data[-1].id
    ids = [i.id for i in page.data][::-1]  # oldest first
    assert len(set(ids)) == len(ids) and all(i.startswith("msg_") for i in ids)
    p1 = c.responses.input_items.list(r.id, limit=2, order="asc")
    assert [i.id for i in p1.data] == ids[:2] and p1.has_more is True
    assert (p1.first_id, p1.last_id) == (ids[0], ids[1])
    p2 = c.responses.input_items.list(r.id, limit=2, order="asc", after=p1.last_id)
    assert [i.id for i in p2.data] == ids[2:4] and p2.has_more is True
    p3 = c.responses.input_items.list(r.id, limit=2, order="asc", after=p2.last_id)
    assert [i.id for i in p3.data] == ids[4:] and p3.has_more is False and p3.first_id == p3.last_id == ids[4]
    d = c.responses.input_items.list(r.id, limit=3, order="desc", after=ids[3])
    assert [i.id for i in d.data] == ids[2::-1] and d.has_more is False
    # The SDK's auto-pagination walks every page.
    assert [i.id for i in c.responses.input_items.list(r.id, limit=2, order="asc")] == ids
    assert [i.id for i in c.responses.input_items.list(r.id, limit=1)] == ids[::-1]
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.input_items.list(r.id, limit=0)
    assert e.value.body["param"] == "limit", e.value.body
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.input_items.list(r.id, order="sideways")
    assert e.value.body["param"] == "order", e.value.body
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.input_items.list(r.id, after="msg_" + "f" * 32)
    assert e.value.body["param"] == "after", e.value.body

    # Branches: two continuations of the same response each continue its state (sampled with one
    # seed: greedy tost-austen says "I am sure" to anything).
    kw = dict(model=MODEL, previous_response_id=r.id, max_output_tokens=16, temperature=1.0, extra_body={"seed": 5})
    a = c.responses.create(input="Tell me of Emma Woodhouse and of Highbury.", **kw)
    b = c.responses.create(input="What of the weather at Bath?", **kw)
    assert cached(a) == cached(b) == r.usage.total_tokens
    assert a.previous_response_id == b.previous_response_id == r.id
    assert a.output_text != b.output_text, (a.output_text, b.output_text)
    again = c.responses.create(input="Tell me of Emma Woodhouse and of Highbury.", **kw)
    assert again.output_text == a.output_text and again.usage == a.usage

    # Delete: then every use of the id is a 404, and the branches live on (their own states).
    assert c.responses.delete(r.id) is None
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.input_items.list(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.create(input="Still there?", **kw)
    assert e.value.body["param"] == "previous_response_id" and r.id in e.value.body["message"], e.value.body
    assert e.value.body["type"] == "not_found_error", e.value.body
    cont = c.responses.create(model=MODEL, previous_response_id=a.id, input="Go on.", max_output_tokens=4,
                              temperature=0)
    assert cached(cont) == a.usage.total_tokens
    assert c.responses.retrieve(b.id).output_text == b.output_text


# --- 5. store=false and the state extension --------------------------------------------------------

def test_store_false_keeps_nothing_and_a_returned_state_continues(srv):
    c = client(srv)
    stored_before = metric(srv, "tost_responses_stored_total")
    records_before = metric(srv, "tost_response_store_records")
    r = c.responses.create(model=MODEL, input="Nothing kept.", max_output_tokens=4, store=False)
    assert r.store is False and extra(r, "state") is None
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.create(model=MODEL, input="x", previous_response_id=r.id, max_output_tokens=1)
    assert e.value.body["param"] == "previous_response_id"

    s = c.responses.create(model=MODEL, input="Keep my state.", max_output_tokens=6, temperature=0, store=False,
                           extra_body={"return_state": True})
    state = extra(s, "state")
    assert isinstance(state, str) and len(base64.b64decode(state, validate=True)) > 0
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(s.id)
    t = c.responses.create(model=MODEL, input="And go on.", max_output_tokens=6, temperature=0, store=False,
                           extra_body={"state": state, "return_state": True})
    assert cached(t) == s.usage.total_tokens > 0, (s.usage, t.usage)
    assert extra(t, "state") and extra(t, "state") != state
    # The same state continues the same way twice: it is a value, not a session that moved on.
    u = c.responses.create(model=MODEL, input="And go on.", max_output_tokens=6, temperature=0, store=False,
                           extra_body={"state": state})
    assert u.output_text == t.output_text and u.usage == t.usage
    assert metric(srv, "tost_responses_stored_total") == stored_before
    assert metric(srv, "tost_response_store_records") == records_before

    # A damaged blob is refused, naming the field; a state with previous_response_id too.
    blob = bytearray(base64.b64decode(state))
    blob[len(blob) // 2] ^= 0x40
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=MODEL, input="x", max_output_tokens=1, store=False,
                           extra_body={"state": base64.b64encode(bytes(blob)).decode()})
    assert e.value.body["param"] == "state", e.value.body
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=MODEL, input="x", max_output_tokens=1, previous_response_id=UNKNOWN_RESPONSE,
                           extra_body={"state": state})
    assert e.value.body["param"] == "state", e.value.body


# --- 6. conversations ----------------------------------------------------------------------------

def test_conversations(srv):
    c = client(srv)
    conv = c.conversations.create(items=[{"type": "message", "role": "user", "content": "Good day, Mr. Knightley."}],
                                  metadata={"topic": "bath"})
    assert conv.id.startswith("conv_") and conv.object == "conversation" and conv.metadata == {"topic": "bath"}
    assert c.conversations.retrieve(conv.id).model_dump() == conv.model_dump()
    updated = c.conversations.update(conv.id, metadata={"topic": "emma", "mood": "grave"})
    assert updated.metadata == {"topic": "emma", "mood": "grave"}
    assert c.conversations.retrieve(conv.id).metadata == {"topic": "emma", "mood": "grave"}
    (pending,) = c.conversations.items.list(conv.id).data
    assert pending.role == "user" and pending.content[0].text == "Good day, Mr. Knightley."

    kw = dict(model=MODEL, max_output_tokens=8, temperature=0)
    # The first response prefills the item the conversation was created with, then its input: what
    # the two messages as one input give, token for token.
    r1 = c.responses.create(conversation=conv.id, input="And to you.", **kw)
    ref = c.responses.create(input=[{"role": "user", "content": "Good day, Mr. Knightley."},
                                    {"role": "user", "content": "And to you."}], store=False, **kw)
    assert r1.conversation.id == conv.id and cached(r1) == 0
    # (ref's prompt is r1's, token for token: the prefix-state cache serves all of it but the last.)
    assert cached(ref) == ref.usage.input_tokens - 1, ref.usage
    assert (r1.usage.input_tokens, r1.usage.output_tokens, r1.output_text) == (
        ref.usage.input_tokens, ref.usage.output_tokens, ref.output_text), (r1.usage, ref.usage)
    # The second continues its state: only its own input is prefilled.
    r2 = c.responses.create(conversation={"id": conv.id}, input="Indeed.", **kw)
    assert cached(r2) == r1.usage.total_tokens > 0, r2.usage
    listed = list(c.conversations.items.list(conv.id, order="asc"))
    assert [(i.role, i.content[0].text) for i in listed] == [
        ("user", "Good day, Mr. Knightley."), ("user", "And to you."), ("assistant", r1.output_text),
        ("user", "Indeed."), ("assistant", r2.output_text)]
    assert listed[0].id == pending.id and listed[2].id == r1.output[0].id and listed[4].id == r2.output[0].id
    assert listed[2].content[0].type == "output_text" and listed[1].content[0].type == "input_text"
    newest = c.conversations.items.list(conv.id, limit=2)
    assert [i.id for i in newest.data] == [listed[4].id, listed[3].id] and newest.has_more is True
    assert c.conversations.items.retrieve(listed[3].id, conversation_id=conv.id).model_dump() == listed[3].model_dump()

    # Items added between responses are pending: the next response takes them in before its input.
    added = c.conversations.items.create(conv.id, items=[{"role": "user", "content": "Pray, do go on, sir."},
                                                         {"role": "user", "content": "Dropped."}])
    assert [i.content[0].text for i in added.data] == ["Pray, do go on, sir.", "Dropped."]
    # An answered item cannot be deleted; a pending one can.
    with pytest.raises(openai.BadRequestError) as e:
        c.conversations.items.delete(listed[1].id, conversation_id=conv.id)
    assert e.value.body["param"] == "item_id", e.value.body
    after_delete = c.conversations.items.delete(added.data[1].id, conversation_id=conv.id)
    assert after_delete.id == conv.id
    with pytest.raises(openai.NotFoundError):
        c.conversations.items.retrieve(added.data[1].id, conversation_id=conv.id)
    with pytest.raises(openai.NotFoundError):
        c.conversations.items.delete("msg_" + "e" * 32, conversation_id=conv.id)
    r3 = c.responses.create(conversation=conv.id, input="Well?", **kw)
    # The same turn continued from r2 with both messages as its input: the same tokens, the same reply.
    ref3 = c.responses.create(previous_response_id=r2.id, store=False, input=[
        {"role": "user", "content": "Pray, do go on, sir."}, {"role": "user", "content": "Well?"}], **kw)
    assert cached(r3) == r2.usage.total_tokens
    assert r3.usage == ref3.usage and r3.output_text == ref3.output_text, (r3.usage, ref3.usage)
    assert [i.content[0].text for i in c.conversations.items.list(conv.id, limit=3).data] == [
        r3.output_text, "Well?", "Pray, do go on, sir."]

    # Refusals: with previous_response_id, with store=false.
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(conversation=conv.id, previous_response_id=r2.id, input="x", **kw)
    assert e.value.body["param"] == "conversation", e.value.body
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(conversation=conv.id, store=False, input="x", **kw)
    assert e.value.body["param"] == "store", e.value.body

    # Deleted: every use of it is a 404; the responses it made live on.
    assert c.conversations.delete(conv.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        c.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError):
        c.conversations.items.list(conv.id)
    with pytest.raises(openai.NotFoundError):
        c.conversations.update(conv.id, metadata={"a": "b"})
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.create(conversation=conv.id, input="x", **kw)
    assert e.value.body["param"] == "conversation", e.value.body
    assert c.responses.retrieve(r3.id).output_text == r3.output_text


# --- 7. owners -----------------------------------------------------------------------------------

def test_responses_and_conversations_belong_to_their_api_key(tmp_path):
    keys = tmp_path / "api_keys"
    keys.write_text(f"alice {KEY_A}\nbob {KEY_B}\n")
    with RunningServer(MODELS, [f"--api_keys_file={keys}"]) as s:
        a, b = client(s, KEY_A), client(s, KEY_B)
        kw = dict(model=MODEL, max_output_tokens=4, temperature=0)
        r = a.responses.create(input="Alice's turn.", extra_body={"return_state": True}, **kw)

        def unknown_message(call, rid):
            with pytest.raises(openai.NotFoundError) as e:
                call()
            return e.value.body["message"].replace(rid, "ID")

        # Bob gets exactly the answer an unknown id gets.
        for name, call in [
                ("retrieve", lambda rid: b.responses.retrieve(rid)),
                ("input_items", lambda rid: b.responses.input_items.list(rid)),
                ("delete", lambda rid: b.responses.delete(rid)),
                ("previous_response_id", lambda rid: b.responses.create(previous_response_id=rid, input="x", **kw))]:
            assert unknown_message(lambda: call(r.id), r.id) == unknown_message(
                lambda: call(UNKNOWN_RESPONSE), UNKNOWN_RESPONSE), name
        with pytest.raises(openai.NotFoundError) as e:
            b.responses.create(previous_response_id=r.id, input="x", **kw)
        assert e.value.body["param"] == "previous_response_id"
        # Alice's response is untouched by Bob's delete, and continues for her.
        assert a.responses.retrieve(r.id).output_text == r.output_text
        assert cached(a.responses.create(previous_response_id=r.id, input="Again.", **kw)) == r.usage.total_tokens
        # Her state blob is bound to her too (a blob is not an id to hide: 403, as on the chat routes).
        with pytest.raises(openai.PermissionDeniedError) as e:
            b.responses.create(input="x", store=False, extra_body={"state": extra(r, "state")}, **kw)
        assert e.value.body["param"] == "state" and e.value.body["type"] == "permission_error", e.value.body
        # No key at all.
        with pytest.raises(openai.AuthenticationError):
            client(s, "no-such-key-0123456789abcdef").responses.retrieve(r.id)

        conv = a.conversations.create(items=[{"role": "user", "content": "Hello."}], metadata={"owner": "alice"})
        for name, call in [
                ("retrieve", lambda: b.conversations.retrieve(conv.id)),
                ("update", lambda: b.conversations.update(conv.id, metadata={"owner": "bob"})),
                ("delete", lambda: b.conversations.delete(conv.id)),
                ("items.list", lambda: b.conversations.items.list(conv.id)),
                ("items.create", lambda: b.conversations.items.create(conv.id, items=[{"role": "user", "content": "x"}])),
                ("items.retrieve", lambda: b.conversations.items.retrieve(
                    a.conversations.items.list(conv.id).data[0].id, conversation_id=conv.id)),
                ("items.delete", lambda: b.conversations.items.delete(
                    a.conversations.items.list(conv.id).data[0].id, conversation_id=conv.id)),
                ("responses.create", lambda: b.responses.create(conversation=conv.id, input="x", **kw))]:
            with pytest.raises(openai.NotFoundError) as e:
                call()
            assert "another API key" in e.value.body["message"], (name, e.value.body)
        assert a.conversations.retrieve(conv.id).metadata == {"owner": "alice"}
        (item,) = a.conversations.items.list(conv.id).data
        assert item.content[0].text == "Hello."
        assert a.responses.create(conversation=conv.id, input="Hi.", **kw).conversation.id == conv.id
        assert a.conversations.delete(conv.id).deleted is True


# --- expiry and eviction -------------------------------------------------------------------------

def test_records_expire_a_ttl_after_their_last_write():
    ttl = 2
    with RunningServer(MODELS, [f"--response_ttl_s={ttl}"]) as s:
        c = client(s)
        r = c.responses.create(model=MODEL, input="Soon gone.", max_output_tokens=2)
        conv = c.conversations.create(items=[{"role": "user", "content": "Soon gone too."}])
        written = time.monotonic()  # both were written before this: both expire by written + ttl
        assert c.responses.retrieve(r.id).id == r.id
        time.sleep(max(0.0, written + 0.5 * ttl - time.monotonic()))
        # A write (an item added) restarts the conversation's clock; a read does not restart the response's.
        rewriting = time.monotonic()
        c.conversations.items.create(conv.id, items=[{"role": "user", "content": "Still here."}])
        rewritten = time.monotonic()
        c.responses.retrieve(r.id)
        time.sleep(max(0.0, written + ttl + 0.3 - time.monotonic()))
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(r.id)
        assert time.monotonic() - rewriting < ttl - 0.1, "the machine is too slow for this check's margins"
        assert c.conversations.retrieve(conv.id).id == conv.id
        misses = metric(s, "tost_previous_response_lookups_total", result="miss")
        with pytest.raises(openai.NotFoundError) as e:
            c.responses.create(model=MODEL, input="x", previous_response_id=r.id, max_output_tokens=1)
        assert e.value.body["param"] == "previous_response_id"
        assert metric(s, "tost_previous_response_lookups_total", result="miss") == misses + 1
        time.sleep(max(0.0, rewritten + ttl + 0.3 - time.monotonic()))
        with pytest.raises(openai.NotFoundError):
            c.conversations.retrieve(conv.id)
        with pytest.raises(openai.NotFoundError) as e:
            c.responses.create(model=MODEL, input="x", conversation=conv.id, max_output_tokens=1)
        assert e.value.body["param"] == "conversation"


def test_the_store_evicts_the_least_recently_used_past_its_bound():
    bound = 1 << 20  # the flag's minimum
    with RunningServer(MODELS, [f"--response_store_max_bytes={bound}"]) as s:
        c = client(s)
        kw = dict(model=MODEL, input="One of many.", max_output_tokens=2, temperature=0)
        old, kept = c.responses.create(**kw), c.responses.create(**kw)
        made = 0
        while metric(s, "tost_response_store_evictions_total") < 20:
            assert made < 2000, f"{made} responses and nothing evicted: the bound is not kept"
            c.responses.create(**kw)
            made += 1
            if made % 10 == 0:
                c.responses.retrieve(kept.id)  # a use: `kept` stays among the most recently used
        held = metric(s, "tost_response_store_bytes")
        print(f"\n{made + 2} responses stored, {metric(s, 'tost_response_store_records'):.0f} held in "
              f"{held:.0f} bytes (bound {bound}), {metric(s, 'tost_response_store_evictions_total'):.0f} evicted")
        assert 0.8 * bound < held <= bound, held
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(old.id)
        assert c.responses.retrieve(kept.id).id == kept.id
        cont = c.responses.create(previous_response_id=kept.id, **kw)
        assert cached(cont) == kept.usage.total_tokens


# --- 8. hostile input ----------------------------------------------------------------------------

MISSING = object()
TOO_MANY_ITEMS = [{"role": "user", "content": "x"}] * 257
LONG_INPUT = " ".join(["word"] * 5000)


def hostile_cases():
    """(name, overrides of a valid body, expected status, expected param)."""
    cases = [
        ("model missing", {"model": MISSING}, 400, "model"),
        ("model empty", {"model": ""}, 400, "model"),
        ("model a number", {"model": 5}, 400, "model"),
        ("model unknown", {"model": "no-such-model"}, 404, "model"),
        ("input missing", {"input": MISSING}, 400, "input"),
        ("input a number", {"input": 5}, 400, "input"),
        ("input empty", {"input": []}, 400, "input"),
        ("input role tool", {"input": [{"role": "tool"}]}, 400, "input[0].role"),
        ("input function_call_output", {"input": [{"type": "function_call_output"}]}, 400, "input[0].type"),
        ("input image", {"input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "https://example.com/a.png"}]}]}, 400, "input[0].content[0].type"),
        ("input 257 items", {"input": TOO_MANY_ITEMS}, 400, "input"),
        ("input past the context", {"input": LONG_INPUT}, 400, "input"),
        ("instructions a number", {"instructions": 5}, 400, "instructions"),
        ("previous_response_id empty", {"previous_response_id": ""}, 400, "previous_response_id"),
        ("previous_response_id a number", {"previous_response_id": 5}, 400, "previous_response_id"),
        ("previous_response_id 10 KB", {"previous_response_id": "r" * 10240}, 400, "previous_response_id"),
        ("previous_response_id unknown", {"previous_response_id": UNKNOWN_RESPONSE}, 404, "previous_response_id"),
        ("conversation without id", {"conversation": {}}, 400, "conversation.id"),
        ("conversation unknown", {"conversation": "conv_" + "0" * 32}, 404, "conversation"),
        ("store a string", {"store": "yes"}, 400, "store"),
        ("max_output_tokens 0", {"max_output_tokens": 0}, 400, "max_output_tokens"),
        ("max_output_tokens -1", {"max_output_tokens": -1}, 400, "max_output_tokens"),
        ("max_output_tokens 2**40", {"max_output_tokens": 2**40}, 400, "max_output_tokens"),
        ("max_output_tokens a string", {"max_output_tokens": "3"}, 400, "max_output_tokens"),
        # Within int32 but past the server's --max_new_tokens (4096 by default).
        ("max_output_tokens 10**6", {"max_output_tokens": 10**6}, 400, "max_output_tokens"),
        ("temperature -1", {"temperature": -1}, 400, "temperature"),
        ("temperature 3", {"temperature": 3}, 400, "temperature"),
        ("temperature a string", {"temperature": "hot"}, 400, "temperature"),
        ("top_p 0", {"top_p": 0}, 400, "top_p"),
        ("top_p 1.5", {"top_p": 1.5}, 400, "top_p"),
        ("seed 2**70", {"seed": 2**70}, 400, "seed"),
        ("seed 1.5", {"seed": 1.5}, 400, "seed"),
        ("metadata 17 keys", {"metadata": {f"k{i}": "v" for i in range(17)}}, 400, "metadata"),
        ("metadata long key", {"metadata": {"k" * 65: "v"}}, 400, "metadata."),
        ("metadata number value", {"metadata": {"a": 1}}, 400, 'metadata."a"'),
        ("metadata long value", {"metadata": {"a": "v" * 513}}, 400, 'metadata."a"'),
        ("metadata an array", {"metadata": ["a", "b"]}, 400, "metadata"),
        ("text format xml", {"text": {"format": {"type": "xml"}}}, 400, "text.format.type"),
        ("json_schema without schema", {"text": {"format": {"type": "json_schema", "name": "s"}}}, 400,
         "text.format.schema"),
        ("json_schema bad name", {"text": {"format": {"type": "json_schema", "name": "bad name!",
                                                      "schema": {"type": "object"}}}}, 400, "text.format.name"),
        ("stream a string", {"stream": "yes"}, 400, "stream"),
        ("tools", {"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]}, 400, "tools"),
        ("background", {"background": True}, 400, "background"),
        ("reasoning", {"reasoning": {"effort": "low"}}, 400, "reasoning"),
        ("include", {"include": ["x"]}, 400, "include"),
        ("truncation auto", {"truncation": "auto"}, 400, "truncation"),
        ("top_logprobs", {"top_logprobs": 2}, 400, "top_logprobs"),
        ("unknown field", {"foo": 1}, 400, "foo"),
        ("state not base64", {"state": "!!not base64!!"}, 400, "state"),
        ("return_state a string", {"return_state": "yes"}, 400, "return_state"),
    ]
    return cases


def test_hostile_requests_are_refused_naming_the_field(srv):
    c = client(srv)
    keep = c.responses.create(model=MODEL, input="Before the storm.", max_output_tokens=6, temperature=0)
    kw = dict(model=MODEL, previous_response_id=keep.id, input="Go on.", max_output_tokens=6, temperature=0,
              store=False)
    cont_before = c.responses.create(**kw)
    stored_before = metric(srv, "tost_responses_stored_total")

    failures = []
    for name, overrides, status, param in hostile_cases():
        body = {"model": MODEL, "input": "x", "max_output_tokens": 2}
        body.update(overrides)
        body = {k: v for k, v in body.items() if v is not MISSING}
        got_status, raw = request(srv, "POST", "/v1/responses", body)
        try:
            e = error_of(raw)
        except (AssertionError, ValueError) as err:
            failures.append(f"{name}: {got_status} {raw[:200]!r} ({err})")
            continue
        ok = got_status == status and e["param"] is not None and (
            e["param"].startswith(param) if param.endswith(".") else e["param"] == param)
        ok = ok and e["type"] == ("invalid_request_error" if status == 400 else "not_found_error")
        if name == "input past the context":  # the engine's words, naming the limit
            ok = ok and "exceeds the context length of 1024 tokens" in e["message"]
        else:  # the parser's: the message starts with the field
            ok = ok and (status != 400 or e["message"].startswith(e["param"]))
        if not ok:
            failures.append(f"{name}: expected {status} param {param!r}, got {got_status} {e}")
    # Bodies that are not JSON, or not UTF-8, or not an object.
    for name, raw_body in [("invalid JSON", b'{"model": "tost-austen", "input": '),
                           ("invalid UTF-8", b'{"model": "tost-austen", "input": "\xff\xfe"}'),
                           ("an array", b'[1, 2]'), ("empty", b"")]:
        got_status, raw = request(srv, "POST", "/v1/responses", raw_body)
        e = error_of(raw)
        if got_status != 400 or e["param"] != "body" or e["type"] != "invalid_request_error":
            failures.append(f"{name}: expected 400 param 'body', got {got_status} {e}")
    # Through the SDK too: its exception carries the same body.
    for kwargs, param in [(dict(temperature=3), "temperature"), (dict(extra_body={"foo": 1}), "foo"),
                          (dict(text={"format": {"type": "xml"}}), "text.format.type")]:
        with pytest.raises(openai.BadRequestError) as err:
            c.responses.create(model=MODEL, input="x", max_output_tokens=2, **kwargs)
        if err.value.body["param"] != param:
            failures.append(f"SDK {kwargs}: expected param {param!r}, got {err.value.body}")
    assert not failures, "\n".join(failures)

    # The server still serves, keeps what it stored before, and continues it exactly as before.
    assert c.responses.create(model=MODEL, input="After the storm.", max_output_tokens=4).output_text is not None
    assert c.responses.retrieve(keep.id).model_dump() == keep.model_dump()
    cont_after = c.responses.create(**kw)
    assert cont_after.output_text == cont_before.output_text and cont_after.usage == cont_before.usage
    # None of the refused requests stored anything.
    assert metric(srv, "tost_responses_stored_total") == stored_before + 1  # "After the storm."


def test_hostile_conversation_requests(srv):
    failures = []
    cases = [
        ("POST", "/v1/conversations", {"items": 5}, 400, "items"),
        ("POST", "/v1/conversations", {"items": [{"role": "tool", "content": "x"}]}, 400, "items[0].role"),
        ("POST", "/v1/conversations", {"metadata": {f"k{i}": "v" for i in range(17)}}, 400, "metadata"),
        ("POST", "/v1/conversations", {"foo": 1}, 400, "foo"),
        ("POST", "/v1/conversations", b"{", 400, "body"),
        ("GET", "/v1/conversations/conv_" + "0" * 32, None, 404, None),
        ("GET", "/v1/conversations/" + "c" * 100, None, 404, None),
    ]
    conv_id = client(srv).conversations.create().id
    cases += [
        ("POST", f"/v1/conversations/{conv_id}", {}, 400, "metadata"),
        ("POST", f"/v1/conversations/{conv_id}", {"items": []}, 400, "items"),
        ("POST", f"/v1/conversations/{conv_id}/items", {}, 400, "items"),
        ("POST", f"/v1/conversations/{conv_id}/items", {"items": []}, 400, "items"),
        ("GET", f"/v1/conversations/{conv_id}/items?limit=101", None, 400, "limit"),
        ("GET", f"/v1/conversations/{conv_id}/items?order=up", None, 400, "order"),
        ("GET", f"/v1/conversations/{conv_id}/items/msg_nothing", None, 404, "item_id"),
        ("GET", "/v1/responses/" + "r" * 100, None, 404, None),
        ("GET", f"/v1/responses/{UNKNOWN_RESPONSE}/input_items?limit=x", None, 400, "limit"),
    ]
    for method, path, body, status, param in cases:
        got_status, raw = request(srv, method, path, body)
        e = error_of(raw)
        if got_status != status or (param is not None and e["param"] != param):
            failures.append(f"{method} {path[:60]} {body!r:.60}: expected {status} {param!r}, got {got_status} {e}")
    assert not failures, "\n".join(failures)
    assert client(srv).conversations.retrieve(conv_id).metadata == {}


# --- 9. metrics ----------------------------------------------------------------------------------

COUNTERS = {
    "stored": ("tost_responses_stored_total", {}),
    "continuations": ("tost_response_continuations_total", {}),
    "hits": ("tost_previous_response_lookups_total", {"result": "hit"}),
    "misses": ("tost_previous_response_lookups_total", {"result": "miss"}),
    "records": ("tost_response_store_records", {}),
}


def counters(srv):
    samples = scrape_metrics(srv)
    return {k: metric_value(samples, name, **labels) for k, (name, labels) in COUNTERS.items()}


def test_responses_metrics_move_by_what_a_sequence_of_requests_does(srv):
    c = client(srv)
    kw = dict(model=MODEL, input="Count me.", max_output_tokens=2, temperature=0)
    before = counters(srv)
    bytes_before = metric(srv, "tost_response_store_bytes")
    stored_bytes_before = metric(srv, "tost_responses_stored_bytes_total")
    steps = []

    def step(name, call, **expected):
        """Runs `call`; each counter must have moved by expected[counter] (0 when not named)."""
        start = counters(srv)
        call()
        want = {k: start[k] + expected.get(k, 0) for k in COUNTERS}
        for k in COUNTERS:
            name_, labels = COUNTERS[k]
            wait_for_metric(srv, name_, lambda v, k=k: v == want[k], timeout_s=5, message=f"{name}: {k}", **labels)
        steps.append(name)

    ids = {}
    step("fresh, stored", lambda: ids.setdefault("r1", c.responses.create(**kw).id), stored=1, records=1)
    step("continued, stored", lambda: ids.setdefault("r2", c.responses.create(previous_response_id=ids["r1"], **kw).id),
         stored=1, continuations=1, hits=1, records=1)
    step("fresh, not stored", lambda: c.responses.create(store=False, **kw))

    def miss():
        with pytest.raises(openai.NotFoundError):
            c.responses.create(previous_response_id=UNKNOWN_RESPONSE, **kw)
    step("unknown previous_response_id", miss, misses=1)

    def deleted_miss():
        c.responses.delete(ids["r2"])
        with pytest.raises(openai.NotFoundError):
            c.responses.create(previous_response_id=ids["r2"], **kw)
    step("deleted, then continued", deleted_miss, misses=1, records=-1)

    def malformed():
        with pytest.raises(openai.BadRequestError):
            c.responses.create(previous_response_id="", **kw)
    step("malformed previous_response_id (never looked up)", malformed)
    conv = {}
    step("conversation created", lambda: conv.setdefault("id", c.conversations.create().id), records=1)
    step("conversation, first response", lambda: c.responses.create(conversation=conv["id"], **kw),
         stored=1, records=1)
    step("conversation, second response", lambda: c.responses.create(conversation=conv["id"], **kw),
         stored=1, continuations=1, records=1)
    step("conversation deleted", lambda: c.conversations.delete(conv["id"]), records=-1)
    after = counters(srv)
    moved = {k: after[k] - before[k] for k in COUNTERS}
    print(f"\nmetrics over {len(steps)} steps: {moved}")
    assert moved == {"stored": 4, "continuations": 2, "hits": 1, "misses": 2, "records": 3}, moved
    # Bytes: each stored record is counted; the gauge holds what is still stored.
    assert metric(srv, "tost_responses_stored_bytes_total") - stored_bytes_before > 4 * 4160
    assert metric(srv, "tost_response_store_bytes") > bytes_before
