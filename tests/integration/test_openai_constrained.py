"""Structured output through the OpenAI-compatible API, driven by the unmodified `openai` client on the
shipped tost-austen: response_format json_schema on chat completions for every schema of
constrained_schemas.py (20 seeds each, sampled at temperature 1), on completions and on streams;
json_object; vLLM's guided_json, guided_regex, guided_grammar and guided_choice (extra_body). Every
output that ends by itself ("stop") passes the strict parser and the schema with its formats, or
matches; the others were cut by max_tokens ("length"). Bad constraints and two constraint sources
are 400s naming the field, while a constrained stream on the same server runs on."""
import json
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from conftest import SOURCE_DIR, openai_client
from constrained_schemas import SCHEMAS, check_output

MODELS = os.path.join(SOURCE_DIR, "models")
MODEL = "tost-austen"
SEEDS = range(20)
MAX_TOKENS = 256
MESSAGES = [{"role": "user", "content": "Tell me about her, plainly."}]
PROMPT = "Her answer, written plainly:"


def client(srv):
    return openai_client(srv, timeout=300)


def json_schema_format(name, strict=True):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": strict}}


# Each returns (text, finish_reason, completion_tokens) of one sampled request.
def chat(c, seed, **kw):
    r = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=kw.pop("max_tokens", MAX_TOKENS),
                                  temperature=1.0, seed=seed, **kw)
    (choice,) = r.choices
    return choice.message.content, choice.finish_reason, r.usage.completion_tokens


def completion(c, seed, **kw):
    r = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=kw.pop("max_tokens", MAX_TOKENS),
                             temperature=1.0, seed=seed, **kw)
    (choice,) = r.choices
    return choice.text, choice.finish_reason, r.usage.completion_tokens


def streamed_chat(c, seed, **kw):
    chunks = list(c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=1.0,
                                            seed=seed, stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    (finish,) = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    return text, finish, chunks[-1].usage.completion_tokens


def run_seeds(call, seeds=SEEDS, **kw):
    with ThreadPoolExecutor(max_workers=len(seeds)) as pool:
        return list(pool.map(lambda seed: call(seed, **kw), seeds))


def check_complete(results, check, min_complete=0.5):
    """Every output that ended by itself passes `check`; at least `min_complete` of them did (the test
    has teeth), and the others were cut by max_tokens."""
    complete = 0
    for text, finish, tokens in results:
        assert finish in ("stop", "length"), (finish, text)
        if finish == "stop":
            check(text)
            complete += 1
        else:
            assert tokens == MAX_TOKENS, (tokens, text)
    print(f"{complete} of {len(results)} outputs complete")
    assert complete >= min_complete * len(results), f"only {complete} of {len(results)} outputs completed"


def schema_check(schema):
    def check(text):
        value = check_output(schema, text)
        # Properties come in the schema's order (the server passes the schema on unsorted).
        if isinstance(value, dict) and "properties" in schema:
            assert list(value) == [k for k in schema["properties"] if k in value], text
    return check


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_chat_json_schema_outputs_validate(srv, name):
    c = client(srv)
    results = run_seeds(lambda seed: chat(c, seed, response_format=json_schema_format(name, strict=name != "bounds")))
    check_complete(results, schema_check(SCHEMAS[name]))
    assert len({text for text, _, _ in results}) > 1, "sampling with 20 seeds gave one output"


@pytest.mark.parametrize("name", ["nested_object", "top_level_array"])
def test_completions_json_schema_outputs_validate(srv, name):
    c = client(srv)
    # The openai client's completions.create has no response_format argument: the body field is sent.
    results = run_seeds(lambda seed: completion(c, seed, extra_body={"response_format": json_schema_format(name)}))
    check_complete(results, schema_check(SCHEMAS[name]))


@pytest.mark.parametrize("name", ["array_of_objects", "string_formats"])
def test_streamed_chat_json_schema_outputs_validate(srv, name):
    c = client(srv)
    results = run_seeds(lambda seed: streamed_chat(c, seed, response_format=json_schema_format(name)))
    check_complete(results, schema_check(SCHEMAS[name]))


def test_json_object_outputs_are_objects(srv):
    c = client(srv)
    # Free keys and values: the model's prose runs on inside strings, so many outputs are cut by
    # max_tokens (a prefix of an object); the ones that end are objects.
    results = run_seeds(lambda seed: chat(c, seed, response_format={"type": "json_object"}), seeds=range(8))
    check_complete(results, lambda text: isinstance(json.loads(text), dict) or pytest.fail(text), min_complete=0)
    assert all(text.startswith("{") for text, _, _ in results), results


def test_guided_json_takes_an_object_or_a_string(srv):
    c = client(srv)
    schema = SCHEMAS["bounds"]
    for guided in (schema, json.dumps(schema)):
        results = run_seeds(lambda seed: completion(c, seed, extra_body={"guided_json": guided}), seeds=range(6))
        check_complete(results, schema_check(schema))


def test_guided_regex_grammar_and_choice_outputs_match(srv):
    c = client(srv)
    pattern = r"[A-Z][a-z]{2,8} (was|is) [0-9]{1,3}"
    results = run_seeds(lambda seed: chat(c, seed, extra_body={"guided_regex": pattern}), seeds=range(8))
    check_complete(results, lambda text: re.fullmatch(pattern, text) or pytest.fail(text))

    grammar = 'root ::= ("Mr. " | "Miss ") name\nname ::= [A-Z] [a-z] [a-z]? [a-z]?'
    results = run_seeds(lambda seed: completion(c, seed, extra_body={"guided_grammar": grammar}), seeds=range(8))
    check_complete(results, lambda text: re.fullmatch(r"(Mr\. |Miss )[A-Z][a-z]{1,3}", text) or pytest.fail(text))

    # A choice holding the chat template's stop string (a quote): a constrained reply is not cut by it.
    choices = ["Elizabeth", "Mr. Darcy", "\"quoted\" \\ choice"]
    for call in (chat, completion, streamed_chat):
        results = run_seeds(lambda seed: call(c, seed, extra_body={"guided_choice": choices}), seeds=range(8))
        check_complete(results, lambda text: text in choices or pytest.fail(text), min_complete=1)


def test_n_choices_are_each_constrained(srv):
    r = client(srv).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=MAX_TOKENS, n=3, seed=4,
                                            temperature=1.0, response_format=json_schema_format("bounds"))
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    for ch in r.choices:
        if ch.finish_reason == "stop":
            schema_check(SCHEMAS["bounds"])(ch.message.content)


def test_a_short_budget_ends_with_length(srv):
    text, finish, tokens = chat(client(srv), 1, max_tokens=3, response_format=json_schema_format("nested_object"))
    assert finish == "length" and tokens == 3 and text.startswith("{"), (text, finish, tokens)


def test_bad_constraints_are_400_naming_the_field_while_a_constrained_stream_runs(srv):
    c = client(srv)
    streamed = {}
    stream = threading.Thread(target=lambda: streamed.update(result=streamed_chat(
        c, 3, response_format=json_schema_format("array_of_objects"))))
    stream.start()

    def refused(param, words, **kw):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, **kw)
        body = e.value.body
        assert body["param"] == param and body["type"] == "invalid_request_error", body
        for word in (param, *words):
            assert word in body["message"], body
        return body["message"]

    schema_param = "response_format.json_schema.schema"
    # The compiler's own words: an unknown type, a reference to nothing, a pattern that is no regex.
    refused(schema_param, ["no-such-type"], response_format={
        "type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "object", "properties": {
            "a": {"type": "no-such-type"}}}}})
    refused(schema_param, ["$defs"], response_format={
        "type": "json_schema", "json_schema": {"name": "bad", "schema": {"$ref": "#/$defs/missing"}}})
    refused("guided_json", [], extra_body={"guided_json": '{"type": "object", "properties": '})
    refused("guided_regex", ["Unclosed"], extra_body={"guided_regex": "([a-z"})
    refused("guided_grammar", ["root"], extra_body={"guided_grammar": 'start ::= "x"'})
    # Shapes the protocol layer refuses.
    refused("guided_regex", ["response_format", "one constraint per request"],
            response_format={"type": "json_object"}, extra_body={"guided_regex": "[a-z]+"})
    refused("guided_choice", ["guided_json"], extra_body={"guided_json": {}, "guided_choice": ["a"]})
    refused("response_format.json_schema.name", ["a-z, A-Z, 0-9, _ and -"],
            response_format={"type": "json_schema", "json_schema": {"name": "no spaces", "schema": {}}})
    refused("response_format.type", ["json_schema"], response_format={"type": "yaml"})
    refused("guided_choice", [], extra_body={"guided_choice": []})

    stream.join(timeout=300)
    text, finish, tokens = streamed["result"]
    assert finish in ("stop", "length"), (finish, text)
    if finish == "stop":
        schema_check(SCHEMAS["array_of_objects"])(text)
    else:
        assert tokens == MAX_TOKENS


def test_a_returned_state_continues_under_its_constraint(srv):
    """A constrained completion cut by max_tokens with return_state returns a state in the middle of
    the structure; continuing it (no constraint named, no prompt) completes an output that
    validates, and a prompt the constraint refuses there is a 400 naming the prompt."""
    c = client(srv)
    schema = SCHEMAS["nested_object"]
    for seed in range(4):
        r = c.completions.create(model=MODEL, prompt="Her answer, written plainly:", max_tokens=8, seed=seed,
                                 temperature=1.0, extra_body={"guided_json": schema, "return_state": True})
        text, choice = r.choices[0].text, r.choices[0]
        assert choice.finish_reason == "length"
        if seed == 0:
            with pytest.raises(openai.BadRequestError) as e:
                c.completions.create(model=MODEL, prompt="\u0007", max_tokens=4,
                                     extra_body={"state": choice.model_extra["state"]})
            assert e.value.body["param"] == "prompt" and "constrained output" in e.value.body["message"]
        for _ in range(40):
            r = c.completions.create(model=MODEL, prompt="", max_tokens=16,
                                     extra_body={"state": choice.model_extra["state"]})
            choice = r.choices[0]
            text += choice.text
            if choice.finish_reason == "stop":
                break
        check_output(schema, text)
