"""Tool calling on /v1/chat/completions with the unmodified `openai` client: seeded calls with
tool_choice "required" across three function schemas, each call's arguments parsed and validated
with jsonschema; a named function; a full round trip (the call, a tool message, the answer);
streamed tool-call deltas assembled into exactly the non-streamed call of the same seed, and sent as
the call is generated (many argument fragments, the first in the first half of the stream); a model
whose chat template has no tool format refused with a 400 that says so; and hostile input (tool
schemas huge, deeply nested, recursive without end, invalid; logit_bias with bad ids and values;
echo on a prompt past the context), each a 400 naming the field with the server still serving."""
import json
import os
import shutil
import time

import jsonschema
import openai
import pytest

from conftest import RunningServer, SOURCE_DIR, openai_client

MODELS = os.path.join(SOURCE_DIR, "models")
MODEL = "tost-austen"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a town over the next days",
    "parameters": {"type": "object", "properties": {
        "town": {"type": "string", "maxLength": 24},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["town", "days"]}}}
BOOK = {"type": "function", "function": {
    "name": "book_carriage", "description": "Book a carriage",
    "parameters": {"type": "object", "properties": {
        "passengers": {"type": "integer", "minimum": 1, "maximum": 6},
        "destination": {"type": "string", "enum": ["Bath", "London", "Pemberley", "Highbury"]},
        "luggage": {"type": "boolean"}}, "required": ["passengers", "destination"]}}}
LETTER = {"type": "function", "function": {
    "name": "send_letter", "description": "Send a letter",
    "parameters": {"type": "object", "properties": {
        "to": {"type": "string", "maxLength": 16},
        "urgent": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2}},
        "required": ["to", "urgent"]}}}
TOOLS = [WEATHER, BOOK, LETTER]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
USER = [{"role": "user", "content": "Will it rain in Bath, Mr. Knightley?"}]


client = openai_client


def required_call(c, seed, tools=TOOLS, **kw):
    return c.chat.completions.create(model=MODEL, messages=USER, tools=tools, tool_choice="required",
                                     parallel_tool_calls=False, max_tokens=300, seed=seed, **kw)


def test_required_calls_parse_and_validate(srv):
    c = client(srv)
    names = set()
    for seed in range(20):
        tools = [TOOLS[seed % 3]] if seed < 9 else TOOLS  # each schema alone, then all three offered
        r = required_call(c, seed, tools=tools)
        (choice,) = r.choices
        assert choice.finish_reason == "tool_calls", (seed, choice)
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])
        names.add(call.function.name)
    assert names == set(SCHEMAS), names  # all three schemas were called


def test_named_function(srv):
    r = client(srv).chat.completions.create(
        model=MODEL, messages=USER, tools=TOOLS, max_tokens=300, seed=4,
        tool_choice={"type": "function", "function": {"name": "book_carriage"}})
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "book_carriage"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["book_carriage"])
    with pytest.raises(openai.BadRequestError) as e:
        client(srv).chat.completions.create(model=MODEL, messages=USER, tools=TOOLS,
                                            tool_choice={"type": "function", "function": {"name": "nope"}})
    assert e.value.body["param"] == "tool_choice.function.name"


def test_round_trip(srv):
    c = client(srv)
    first = required_call(c, 7, tools=[WEATHER])
    call = first.choices[0].message.tool_calls[0]
    messages = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "Rain all week, and mud in the lanes."}]
    answer = c.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=30, seed=1)
    (choice,) = answer.choices
    assert choice.finish_reason in ("stop", "length") and not choice.message.tool_calls
    assert choice.message.content
    # The call and its result are in the prompt: more tokens than the question alone.
    alone = c.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER], max_tokens=1, seed=1)
    assert answer.usage.prompt_tokens > alone.usage.prompt_tokens + 10
    with pytest.raises(openai.BadRequestError) as e:  # a result for a call nobody made
        c.chat.completions.create(model=MODEL, messages=messages[:1] + messages[2:], tools=[WEATHER])
    assert e.value.body["param"] == "messages[1].tool_call_id"


def test_streamed_deltas_assemble_into_the_non_streamed_call(srv):
    c = client(srv)
    for seed in (11, 12):
        whole = required_call(c, seed).choices[0].message.tool_calls
        calls = {}
        finish = None
        for chunk in required_call(c, seed, stream=True):
            for ch in chunk.choices:
                finish = ch.finish_reason or finish
                for d in ch.delta.tool_calls or []:
                    entry = calls.setdefault(d.index, {"name": "", "arguments": "", "id": None})
                    if d.id:
                        entry["id"] = d.id
                    if d.function and d.function.name:
                        entry["name"] += d.function.name
                    if d.function and d.function.arguments:
                        entry["arguments"] += d.function.arguments
        assert finish == "tool_calls"
        assert [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)] == \
            [(t.function.name, t.function.arguments) for t in whole]
        assert all(calls[i]["id"].startswith("call_") for i in calls)


NOTES = {"type": "function", "function": {
    "name": "take_notes", "description": "Write down the names of the callers",
    "parameters": {"type": "object", "properties": {
        "names": {"type": "array", "items": {"type": "string", "minLength": 6, "maxLength": 10},
                  "minItems": 12, "maxItems": 12}}, "required": ["names"]}}}


def test_tool_call_deltas_arrive_while_the_call_is_generated(srv):
    """A long call streams as it is written: its start, then many argument fragments spread over
    the generation (the first well before the last token), not one piece at the end."""
    c = client(srv)
    kw = dict(model=MODEL, messages=USER, tools=[NOTES], max_tokens=400, seed=21,
              tool_choice={"type": "function", "function": {"name": "take_notes"}})
    whole = c.chat.completions.create(**kw).choices[0].message.tool_calls
    started = time.monotonic()
    arrivals, fragments, start_at, finished_at = [], [], None, None
    for chunk in c.chat.completions.create(**kw, stream=True):
        now = time.monotonic() - started
        for ch in chunk.choices:
            for d in ch.delta.tool_calls or []:
                if d.id:
                    assert start_at is None
                    start_at = now
                    assert d.function.name == "take_notes" and d.function.arguments == ""
                elif d.function.arguments:
                    fragments.append(d.function.arguments)
                    arrivals.append(now)
            if ch.finish_reason:
                finished_at = now
                assert ch.finish_reason == "tool_calls"
    assert "".join(fragments) == whole[0].function.arguments
    jsonschema.validate(json.loads("".join(fragments)), NOTES["function"]["parameters"])
    usage = c.chat.completions.create(**kw).usage.completion_tokens
    assert len(fragments) > usage // 2, (len(fragments), usage)  # about one fragment per token
    # Spread over the generation: the call's start and its first fragment came in the first half of
    # the stream's time (from the request to its last chunk), not with its end.
    assert start_at < arrivals[0] < arrivals[-1] <= finished_at
    assert arrivals[0] < 0.5 * finished_at, (start_at, arrivals, finished_at)
    print(f"take_notes: {len(fragments)} argument fragments for {usage} tokens, the first at "
          f"{arrivals[0] * 1e3:.1f} ms, the last at {arrivals[-1] * 1e3:.1f} ms, the end at {finished_at * 1e3:.1f} ms")


def test_parallel_calls_may_be_several(srv):
    r = client(srv).chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, tool_choice="required",
                                            max_tokens=400, seed=5)
    calls = r.choices[0].message.tool_calls
    assert calls, r.choices[0]
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_auto_and_none(srv):
    c = client(srv)
    auto = c.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, tool_choice="auto",
                                     max_tokens=20, seed=2)
    assert auto.choices[0].finish_reason in ("stop", "length", "tool_calls")
    none = c.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, tool_choice="none",
                                     max_tokens=20, seed=2)
    plain = c.chat.completions.create(model=MODEL, messages=USER, max_tokens=20, seed=2)
    assert none.choices[0].message.content == plain.choices[0].message.content  # no tools shown


def test_a_template_without_a_tool_format_is_refused(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(os.path.join(MODELS, MODEL), repo / MODEL)
    config = json.loads((repo / MODEL / "config.json").read_text())
    del config["chat_template"]["tools"]
    (repo / MODEL / "config.json").write_text(json.dumps(config))
    s = RunningServer(str(repo))
    try:
        c = client(s)
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, tool_choice="auto")
        assert e.value.body["param"] == "tools"
        assert "has no tool format in its chat template" in e.value.body["message"]
        assert c.chat.completions.create(model=MODEL, messages=USER, max_tokens=3).choices[0].message
    finally:
        assert s.stop() == 0


def nested(depth):
    schema = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


HOSTILE_TOOLS = [
    ("huge", {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 40}
                                               for i in range(2000)}}, "tools[0].function.parameters"),
    # 140 objects nest 280 JSON levels: within the body's 320, past a schema's 256.
    ("deep", nested(140), "tools[0].function.parameters"),
    ("recursive without end", {"$ref": "#"}, "tools[0].function.parameters"),
    ("requiring itself", {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
     "tools[0].function.parameters"),
    # Invalid only to the grammar compiler: named by the function's own field as the others.
    ("invalid", {"type": 5}, "tools[0].function.parameters"),
    ("a missing reference", {"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}},
     "tools[0].function.parameters"),
]


@pytest.mark.parametrize("what,schema,param", HOSTILE_TOOLS, ids=[h[0] for h in HOSTILE_TOOLS])
def test_hostile_tool_schemas(srv, what, schema, param):
    c = client(srv)
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=USER, tools=[tool], tool_choice="required", max_tokens=50)
    assert e.value.body["param"] == param, e.value.body
    assert e.value.body["message"].startswith(param + ":") and len(e.value.body["message"]) < 1024
    assert c.chat.completions.create(model=MODEL, messages=USER, max_tokens=2).choices[0].message


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "bad"}}])
def test_a_schema_only_the_compiler_refuses_is_named_by_its_element(srv, tool_choice):
    """Two valid functions, then one whose parameters pass every check of the parser and that only
    the grammar compiler refuses: the 400 names tools[2].function.parameters, not `tools`."""
    c = client(srv)
    bad = {"type": "function", "function": {"name": "bad", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}, "required": ["a"]}}}
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=USER, tools=[*TOOLS[:2], bad], tool_choice=tool_choice,
                                  max_tokens=50)
    assert e.value.body["param"] == "tools[2].function.parameters", e.value.body
    assert e.value.body["message"].startswith("tools[2].function.parameters: "), e.value.body
    reply = c.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS[:2], tool_choice="required",
                                      max_tokens=300, seed=3)
    assert reply.choices[0].message.tool_calls


@pytest.mark.parametrize("bias,param", [
    ({"2048": 1}, "logit_bias"),              # past the vocabulary
    ({"-5": 1}, "logit_bias"),                # not an id
    ({"7": 100.5}, 'logit_bias["7"]'),        # past OpenAI's range
    ({"7": "much"}, 'logit_bias["7"]'),
    ({str(i): 1 for i in range(301)}, "logit_bias"),  # past OpenAI's 300
])
def test_hostile_logit_bias(srv, bias, param):
    c = client(srv)
    for create in (lambda: c.completions.create(model=MODEL, prompt="Emma", logit_bias=bias, max_tokens=2),
                   lambda: c.chat.completions.create(model=MODEL, messages=USER, logit_bias=bias, max_tokens=2)):
        with pytest.raises(openai.BadRequestError) as e:
            create()
        assert e.value.body["param"] == param, e.value.body
    assert c.completions.create(model=MODEL, prompt="Emma", max_tokens=2).choices[0].text is not None


def test_echo_on_a_prompt_past_the_context(srv):
    c = client(srv)
    long_prompt = "It is a truth universally acknowledged. " * 400  # some 2,400 tokens; the context is 1024
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt=long_prompt, echo=True, logprobs=1, max_tokens=0)
    assert e.value.body["param"] == "prompt" and "at most 1024 tokens" in e.value.body["message"]
    assert c.completions.create(model=MODEL, prompt="Emma", max_tokens=2).choices[0].text is not None


def test_structured_outputs_structural_tag(srv):
    """vLLM's structured_outputs.structural_tag: an XGrammar structural tag, compiled as such."""
    tag = {"type": "structural_tag", "format": {"type": "sequence", "elements": [
        {"type": "const_string", "value": "Answer: "},
        {"type": "json_schema", "json_schema": {"type": "object", "properties": {"yes": {"type": "boolean"}},
                                                "required": ["yes"]}}]}}
    c = client(srv)
    for given in (tag, json.dumps(tag)):
        r = c.completions.create(model=MODEL, prompt="Is it so?", max_tokens=200, seed=1,
                                 extra_body={"structured_outputs": {"structural_tag": given}})
        text = r.choices[0].text
        assert text.startswith("Answer: "), text
        if r.choices[0].finish_reason == "stop":
            jsonschema.validate(json.loads(text[len("Answer: "):]), tag["format"]["elements"][1]["json_schema"])
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt="x", max_tokens=2, extra_body={"structured_outputs": {
            "structural_tag": {"type": "structural_tag", "format": {"type": "bogus"}}}})
    assert e.value.body["param"] == "structured_outputs.structural_tag"
