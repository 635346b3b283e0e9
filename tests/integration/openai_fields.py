"""Which field of OpenAI's completion and chat request schemas this server honours and which it
refuses by name: the one list test_openai_fields.py walks the pinned `openai` package's request
types against (docs/api.md, "Fields").

Every field of those schemas must be here, per route, as exactly one of
  Honoured(value, check): the server reads it; `check(base, probed)` asserts its effect, where
      `base` is the reply to the route's base request and `probed` the reply to the same request
      with the field set to `value` (an exception when the server refused it). A field made to be
      ignored again gives `probed == base` and fails its check. A check marked @with_server is
      called as check(base, probed, server) (ProbeServer: the server's log, and requests of its
      own), for an effect outside the reply (the access log) or across requests (a cache);
  Refused(value): a 400 whose param and message name the field.
Nested fields (stream_options.*, messages[].*) are keyed by their path. EXTENSIONS are the vLLM and
ToST fields the routes read beyond the schemas, probed the same way."""
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict


@dataclass
class Honoured:
    value: Any
    check: Callable[[Any, Any], None]
    base: Dict[str, Any] = field(default_factory=dict)  # set in both requests (e.g. stream=True)
    without: tuple = ()  # base fields left out of both requests (one the field replaces)


@dataclass
class Refused:
    value: Any
    base: Dict[str, Any] = field(default_factory=dict)


class ProbeServer:
    """What a @with_server check gets: `log_path` (the server's stderr) and `call(route, body)` (a
    reply, or the client's APIStatusError)."""

    def __init__(self, log_path, call):
        self.log_path = log_path
        self.call = call


def with_server(check):
    check.needs_server = True
    return check


COMPLETION_BASE = {"prompt": "It is a truth universally acknowledged", "max_tokens": 12, "seed": 7,
                   "temperature": 1.0}
CHAT_BASE = {"messages": [{"role": "user", "content": "Good morning, Miss Bennet"}], "max_tokens": 12,
             "seed": 7, "temperature": 1.0}


# --- reading replies -----------------------------------------------------------------------------

def texts(reply):
    """Each choice's text (chat: content), a streamed reply's chunks joined per choice."""
    if isinstance(reply, list):  # streamed chunks
        out = {}
        for ch in reply:
            for c in ch.choices:
                piece = c.delta.content if hasattr(c, "delta") else c.text
                out[c.index] = out.get(c.index, "") + (piece or "")
        return [out[i] for i in sorted(out)]
    return [c.message.content if hasattr(c, "message") else c.text for c in reply.choices]


def tokens_used(reply):
    return reply.usage.completion_tokens


def is_error(x):
    return isinstance(x, Exception)


# --- checks --------------------------------------------------------------------------------------

def differs(base, probed):
    assert not is_error(probed), probed
    assert texts(probed) != texts(base), f"same output as without the field: {texts(base)!r}"


def refused_as(status, param):
    def check(base, probed):
        assert is_error(probed), f"expected {status} naming {param}, got a reply"
        assert probed.status_code == status, probed
        assert probed.body["param"] == param, probed.body
    return check


def completion_tokens(n):
    def check(base, probed):
        assert not is_error(probed), probed
        assert tokens_used(base) > n
        assert tokens_used(probed) == n, tokens_used(probed)
    return check


def choices(n):
    def check(base, probed):
        assert not is_error(probed), probed
        assert len(base.choices) == 1 and len(probed.choices) == n
    return check


def stopped_short(base, probed):
    assert not is_error(probed), probed
    assert probed.choices[0].finish_reason == "stop"
    assert len(texts(probed)[0]) < len(texts(base)[0]) or tokens_used(probed) < tokens_used(base)


def one_token_stop(base, probed):
    """stop_token_ids holding the token logit_bias forces: the output ends after it."""
    assert not is_error(probed), probed
    assert tokens_used(base) == 12 and tokens_used(probed) == 1
    assert probed.choices[0].finish_reason == "stop"


def one_repeated_token(base, probed):
    """logit_bias +100 on one id: every drawn token is that id."""
    assert not is_error(probed), probed
    lp = probed.choices[0].logprobs
    toks = lp.tokens if hasattr(lp, "tokens") else [t.token for t in lp.content]
    assert len(toks) == 12 and len(set(toks)) == 1, toks
    assert texts(probed) != texts(base)


def completion_logprobs(n):
    def check(base, probed):
        assert not is_error(probed), probed
        assert base.choices[0].logprobs is None
        lp = probed.choices[0].logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == tokens_used(probed)
        assert all(len(top) == n for top in lp.top_logprobs)
    return check


def chat_logprobs(n):
    def check(base, probed):
        assert not is_error(probed), probed
        if base.choices[0].logprobs is not None:  # top_logprobs: the base has logprobs, no alternatives
            assert all(t.top_logprobs == [] for t in base.choices[0].logprobs.content)
        content = probed.choices[0].logprobs.content
        assert len(content) == tokens_used(probed)
        assert all(len(t.top_logprobs) == n and t.logprob <= 0 for t in content)
    return check


def streamed(base, probed):
    assert not is_error(probed), probed
    assert isinstance(probed, list) and len(probed) > 1
    assert texts(probed) == texts(base)


def usage_chunk(base, probed):
    assert not is_error(probed), probed
    assert base[-1].usage is None
    assert probed[-1].choices == [] and probed[-1].usage.completion_tokens > 0


def echoed(base, probed):
    assert not is_error(probed), probed
    assert texts(probed)[0] == COMPLETION_BASE["prompt"] + texts(base)[0]


def json_start(base, probed):
    assert not is_error(probed), probed
    assert texts(probed)[0].lstrip().startswith("{"), texts(probed)
    assert texts(probed) != texts(base)


def longer_prompt(base, probed):
    """messages[].name is rendered into the prompt."""
    assert not is_error(probed), probed
    assert probed.usage.prompt_tokens > base.usage.prompt_tokens


def one_of(options):
    def check(base, probed):
        assert not is_error(probed), probed
        assert texts(probed)[0] in options, texts(probed)
    return check


def matches(pattern):
    def check(base, probed):
        import re
        assert not is_error(probed), probed
        assert re.fullmatch(pattern, texts(probed)[0]), texts(probed)
    return check


def state_returned(base, probed):
    assert not is_error(probed), probed
    assert getattr(base.choices[0], "state", None) is None
    assert probed.choices[0].state


def calls(n=None):
    """The reply holds tool calls (exactly n when given), the base none or more than n."""
    def check(base, probed):
        assert not is_error(probed), probed
        got = probed.choices[0].message.tool_calls or []
        assert got if n is None else len(got) == n, probed.choices[0]
        before = base.choices[0].message.tool_calls or []
        assert (not before) if n is None else len(before) > n, base.choices[0]
    return check


def access_log_line(log_path, request_id, timeout=10.0):
    """The text access-log line ("http") of the request `request_id`, once the server has written
    it (just after the answer)."""
    deadline = time.monotonic() + timeout
    while True:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if " http " in line and f" request_id={request_id} " in line:
                    return line.rstrip("\n")
        assert time.monotonic() < deadline, f"no access-log line for request {request_id}"
        time.sleep(0.05)


def logged(key, value):
    """The request's access-log line carries key=value; the base's has no such key."""
    @with_server
    def check(base, probed, server):
        assert not is_error(probed), probed
        line = access_log_line(server.log_path, probed._request_id)
        assert re.search(rf" {key}={re.escape(value)}( |$)", line), line
        base_line = access_log_line(server.log_path, base._request_id)
        assert f" {key}=" not in base_line, base_line
    return check


def cached(reply):
    return reply.usage.prompt_tokens_details.cached_tokens


SHARED_PROMPT = ("Mr. Bennet was so odd a mixture of quick parts, sarcastic humour, reserve, and caprice, that "
                 "the experience of three-and-twenty years had been insufficient to make his wife understand "
                 "his character. ")


def groups_a_shared_prefix(route):
    """Three requests that share a prefix (shorter than the prefill chunk, so the cache on its own
    keeps no state inside it) and then differ: without a key the third finds nothing cached; in
    one prompt_cache_key group the second stores the state at the shared prefix and the third
    starts from it. Each run has a prefix of its own (a fresh one per probe)."""
    @with_server
    def check(base, probed, server):
        assert not is_error(probed), probed
        tag = str(time.monotonic_ns())
        found = {}
        for key in (None, "group-" + tag):
            prefix = f"[{tag} {'keyed' if key else 'plain'}] {SHARED_PROMPT}"
            replies = []
            for tail in ("Of Jane.", "Wherefore Lydia?", "Kitty coughed."):
                body = {"max_tokens": 2, "seed": 1}
                if route == "chat":
                    body["messages"] = [{"role": "system", "content": prefix},
                                        {"role": "user", "content": tail}]
                else:
                    body["prompt"] = prefix + tail
                if key:
                    body["prompt_cache_key"] = key
                reply = server.call(route, body)
                assert not is_error(reply), reply
                assert reply.usage.prompt_tokens < 128, "keep the prompts within one prefill chunk"
                replies.append(reply)
            found[bool(key)] = [cached(r) for r in replies]
        assert found[False] == [0, 0, 0], found
        assert found[True][:2] == [0, 0] and found[True][2] > 40, found
    return check


def parses_as_json(base, probed):
    assert not is_error(probed), probed
    json.loads(texts(probed)[0])


FORCED = {"logit_bias": {"100": 100}}  # every draw takes token 100
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"town": {"type": "string", "maxLength": 12}}, "required": ["town"]}}}
CALL = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"town": "Bath"}'}}]

_SHARED = {
    "model": Honoured("no-such-model", refused_as(404, "model")),
    "max_tokens": Honoured(3, completion_tokens(3)),
    "n": Honoured(2, choices(2)),
    "seed": Honoured(8, differs),
    "temperature": Honoured(0.0, differs),
    "top_p": Honoured(0.05, differs),
    "stop": Honoured(" ", stopped_short),
    "stream": Honoured(True, streamed),
    "stream_options": Honoured({"include_usage": True}, usage_chunk, base={"stream": True}),
    "stream_options.include_usage": Honoured(True, usage_chunk, base={"stream": True}),
    "stream_options.include_obfuscation": Refused(True, base={"stream": True}),
    "logit_bias": Honoured({"100": 100}, one_repeated_token),
    "frequency_penalty": Refused(0.5),
    "presence_penalty": Refused(0.5),
    "user": Honoured("user-1", logged("user", "user-1")),
}

FIELDS = {
    "completions": {
        **_SHARED,
        "prompt": Honoured("Emma Woodhouse, handsome, clever, and rich", differs),
        "logprobs": Honoured(3, completion_logprobs(3)),
        "logit_bias": Honoured({"100": 100}, one_repeated_token, base={"logprobs": 0}),
        "echo": Honoured(True, echoed),
        "suffix": Refused("the end"),
        "best_of": Refused(2),
    },
    "chat": {
        **_SHARED,
        "logit_bias": Honoured({"100": 100}, one_repeated_token, base={"logprobs": True}),
        "messages": Honoured([{"role": "user", "content": "What of Mr. Darcy?"}], differs),
        "messages[].content": Honoured("What of Mr. Darcy?", differs),
        "messages[].role": Honoured("system", differs),
        "messages[].name": Honoured("Elizabeth", longer_prompt),
        "messages[].refusal": Refused("I cannot", base={"role": "assistant"}),
        "messages[].audio": Refused({"id": "a"}, base={"role": "assistant"}),
        "messages[].tool_calls": Honoured(CALL, longer_prompt, base={"role": "assistant"}),
        "messages[].function_call": Refused({"name": "f", "arguments": "{}"}, base={"role": "assistant"}),
        # Read on every message: one naming no earlier call is refused (here, on a user message).
        "messages[].tool_call_id": Honoured("call_1", refused_as(400, "messages[0].tool_call_id")),
        "max_completion_tokens": Honoured(3, completion_tokens(3), without=("max_tokens",)),
        "logprobs": Honoured(True, chat_logprobs(0)),
        "top_logprobs": Honoured(2, chat_logprobs(2), base={"logprobs": True}),
        "response_format": Honoured({"type": "json_object"}, json_start),
        "tools": Honoured([WEATHER], longer_prompt),
        "tool_choice": Honoured("required", calls(), base={"tools": [WEATHER], "max_tokens": 300}),
        "parallel_tool_calls": Honoured(False, calls(1), base={"tools": [WEATHER], "tool_choice": "required",
                                                             "max_tokens": 300}),
        "functions": Refused([{"name": "f", "parameters": {"type": "object"}}]),
        "function_call": Refused("auto"),
        "audio": Refused({"voice": "alloy", "format": "mp3"}),
        "modalities": Refused(["text", "audio"]),
        "store": Refused(True),
        "metadata": Refused({"k": "v"}),
        "moderation": Refused({"model": "omni-moderation-latest"}),
        "prediction": Refused({"type": "content", "content": "Good morning"}),
        "web_search_options": Refused({}),
        "reasoning_effort": Refused("high"),
        "verbosity": Refused("low"),
        "service_tier": Refused("flex"),
        "prompt_cache_options": Refused({"ttl": "30m"}),
        "prompt_cache_retention": Refused("24h"),
        "safety_identifier": Honoured("hashed-user-1", logged("safety_identifier", "hashed-user-1")),
        "prompt_cache_key": Honoured("key-1", groups_a_shared_prefix("chat")),
    },
}

# The fields the routes read beyond OpenAI's schemas (vLLM's, and ToST's own), probed the same way.
EXTENSIONS = {
    "completions": {
        "top_k": Honoured(1, differs),
        "min_p": Honoured(0.5, differs),
        "repetition_penalty": Honoured(5.0, differs),
        "stop_token_ids": Honoured([100], one_token_stop, base=FORCED),
        "max_completion_tokens": Honoured(3, completion_tokens(3), without=("max_tokens",)),
        "guided_choice": Honoured(["yes", "no"], one_of({"yes", "no"})),
        "guided_regex": Honoured("[a-c]{4}", matches("[a-c]{4}")),
        "return_state": Honoured(True, state_returned),
        "structured_outputs": Honoured({"choice": ["yes", "no"]}, one_of({"yes", "no"})),
        # Chat's, read on completions too.
        "safety_identifier": Honoured("hashed-user-1", logged("safety_identifier", "hashed-user-1")),
        "prompt_cache_key": Honoured("key-1", groups_a_shared_prefix("completions")),
    },
    "chat": {
        "top_k": Honoured(1, differs),
        "min_p": Honoured(0.5, differs),
        "repetition_penalty": Honoured(5.0, differs),
        "stop_token_ids": Honoured([100], one_token_stop, base=FORCED),
        "guided_choice": Honoured(["yes", "no"], one_of({"yes", "no"})),
        "structured_outputs": Honoured({"regex": "[a-c]{4}"}, matches("[a-c]{4}")),
    },
}
