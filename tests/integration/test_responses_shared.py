"""The Responses and Conversations APIs (POST /v1/responses, /v1/conversations) on replicas that
share one Redis (--session_store=redis://..., the same --session_key_file, --batch_invariant_decode;
tests/integration/redis_server.py), called with the unmodified `openai` client on 127.0.0.1.

Every conversation here is one of the two scripted ones of `reference` (an opening, then the same
follow-up each turn, TOKENS output tokens a turn; greedy, or sampled with a seed, whose draws are
keyed by seed and position: the tiny model's greedy replies repeat themselves, sampled ones tell
states apart), run first on one server with the in-memory record store; wherever its turns land,
each turn's text and usage must equal the reference's byte for byte:

- a conversation of TURNS turns chained by previous_response_id, its turns alternating between two
  replicas until one is SIGKILLed right after the turn it served, then going on on the survivor;
  each turn prefills only its new input (tost_prefill_tokens_total on the replica that served it
  rises by usage.input_tokens - cached_tokens, the same for every continued turn), and each stored
  response takes at most 8 KiB of Redis memory (MEMORY USAGE of <prefix>r:<id>);
- two continuations of one response at once, one on each replica, both served;
- a conversation (conversations.create, responses.create(conversation=...)) whose turns and items
  alternate between the replicas;
- the store paused (SIGSTOP) or stopped: a continuation (previous_response_id) and a store:true
  response answer 503 with Retry-After and OpenAI's error body within the store's timeout, while a
  store:false response is served; once the store is back, the conversation continues.

The `responses_shared_end_to_end` ctest test (tests/integration/CMakeLists.txt) runs it;
server_end_to_end leaves this file out."""
import os
import threading
import time

import openai
import pytest

from conftest import SOURCE_DIR, RunningServer
from redis_server import RedisServer
from tost_harness import metric_value, scrape_metrics, wait_for_metric

MODEL = "tost-austen"
MODELS = os.path.join(SOURCE_DIR, "models")
TURNS = 20
KILL_AFTER = 9        # the replica that served this turn is SIGKILLed right after it
TOKENS = 8            # max_output_tokens per turn
OPENING = "Who is Mr. Darcy, and what does Elizabeth think of him?"
FOLLOW_UP = "Go on."
BRANCH = "And what of Mr. Wickham?"
# How each scripted conversation samples (seed: a ToST extension of the request body).
SAMPLING = {"greedy": {"temperature": 0},
            "sampled": {"temperature": 0.8, "top_p": 0.95, "extra_body": {"seed": 500}}}
MAX_RECORD_MEMORY = 8192  # bytes of Redis memory per stored response
CALL_TIMEOUT_S = 60
STORE_TIMEOUT_MS = 300


def user_input(turn):
    return OPENING if turn == 0 else FOLLOW_UP


def client_of(server):
    # No retries: a 503 is what some tests wait for.
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="unused",
                         max_retries=0, timeout=CALL_TIMEOUT_S)


def prefilled(server):
    return metric_value(scrape_metrics(server), "tost_prefill_tokens_total", model=MODEL)


def respond(server, text, mode="greedy", **kwargs):
    """One response on `server`, sampled as SAMPLING[mode] says: (the response, the prompt tokens
    that replica prefilled for it). Nothing else runs on the replica meanwhile."""
    before = prefilled(server)
    r = client_of(server).responses.create(model=MODEL, input=text, max_output_tokens=TOKENS, **SAMPLING[mode],
                                           **kwargs)
    assert r.status in ("completed", "incomplete"), r
    # Every turn prefills something; the counter moves in the step that prefills, before the reply,
    # but a scrape must not race it.
    wait_for_metric(server, "tost_prefill_tokens_total", lambda v: v > before, timeout_s=5, model=MODEL)
    return r, prefilled(server) - before


def turn_of(r, prefill):
    """What a turn must reproduce wherever it runs: its text, status and usage; and its prefill."""
    u = r.usage
    return {"text": r.output_text, "status": r.status, "input_tokens": u.input_tokens,
            "cached_tokens": u.input_tokens_details.cached_tokens, "output_tokens": u.output_tokens,
            "prefill": prefill}


def check_turn(got, expected, label):
    assert got == expected, f"{label}: expected {expected}, got {got}"


def replica_args(key_file, redis, *extra):
    return [f"--session_key_file={key_file}", "--batch_invariant_decode", f"--session_store={redis.url()}", *extra]


class Replicas:
    """`n` tost_server replicas on one Redis; stopped (those still alive) when the block ends."""

    def __init__(self, key_file, redis, n=2, extra=()):
        self.servers = []
        try:
            for _ in range(n):
                self.servers.append(RunningServer(MODELS, replica_args(key_file, redis, *extra)))
        except BaseException:
            self.__exit__()
            raise

    def __enter__(self):
        return self.servers

    def __exit__(self, *exc):
        codes = [s.stop() for s in self.servers if s.alive()]
        if exc and exc[0] is None:
            assert all(c == 0 for c in codes), f"a replica did not exit cleanly on SIGTERM: {codes}"


def chain(previous):
    return {"previous_response_id": previous} if previous else {}


@pytest.fixture(scope="module")
def reference(key_file):
    """{mode: the scripted conversation's TURNS turns (turn_of)} for each mode of SAMPLING, on one
    server with the in-memory record store. Checks the usage and prefill of each turn."""
    with RunningServer(MODELS, [f"--session_key_file={key_file}", "--batch_invariant_decode"]) as server:
        out = {}
        for mode in SAMPLING:
            turns, previous = [], None
            for t in range(TURNS):
                r, prefill = respond(server, user_input(t), mode, **chain(previous))
                turns.append(turn_of(r, prefill))
                previous = r.id
            out[mode] = check_reference(mode, turns)
        assert server.stop() == 0
    assert out["greedy"] != out["sampled"]
    return out


def check_reference(mode, turns):
    texts = [t["text"] for t in turns]
    assert all(texts), f"a reference turn generated no text: {texts}"
    assert all(0 < t["output_tokens"] <= TOKENS for t in turns), turns
    # Each continued turn's input is the whole conversation: the previous turn's input and output
    # (the state), then the follow-up; only the follow-up is prefilled.
    follow_up = turns[1]["prefill"]
    assert follow_up > 0
    for t in range(1, TURNS):
        cur, prev = turns[t], turns[t - 1]
        assert cur["cached_tokens"] == prev["input_tokens"] + prev["output_tokens"], (t, prev, cur)
        assert cur["input_tokens"] - cur["cached_tokens"] == follow_up == cur["prefill"], \
            f"turn {t}: prefill {cur['prefill']}, usage {cur}; the follow-up is {follow_up} tokens"
    # A fresh state feeds the last prompt token by the first decode step, not by a prefill chunk.
    assert turns[0]["cached_tokens"] == 0 and turns[0]["prefill"] == turns[0]["input_tokens"] - 1, turns[0]
    assert turns[-1]["input_tokens"] + TOKENS < 1024, "the conversation should fit the context"
    print(f"\nreference, {mode}: {TURNS} turns, follow-up prefill {follow_up:g} tokens, last input "
          f"{turns[-1]['input_tokens']} tokens; texts {texts[:4]}...")
    return turns


def record_memory(redis, prefix="tost:"):
    """{key: MEMORY USAGE} of every stored record (<prefix>r:*)."""
    return {k: int(redis.client_command("MEMORY", "USAGE", k)) for k in redis.keys(f"{prefix}r:*")}


# ------------------------------------------------------------------------------------------------

def test_previous_response_chains_alternate_replicas_and_survive_a_sigkill(key_file, reference):
    """Both scripted conversations, turn by turn together: turns alternate between the replicas
    until the one that served turn KILL_AFTER is SIGKILLed, then go on on the survivor."""
    with RedisServer() as redis, Replicas(key_file, redis) as replicas:
        victim = replicas[KILL_AFTER % 2]
        survivor = replicas[1 - KILL_AFTER % 2]
        ids = {mode: [] for mode in SAMPLING}
        served_by = []
        for t in range(TURNS):
            server = replicas[t % 2] if t <= KILL_AFTER else survivor
            i = replicas.index(server)
            for mode, chain_ids in ids.items():
                previous = chain_ids[-1] if chain_ids else None
                r, prefill = respond(server, user_input(t), mode, **chain(previous))
                check_turn(turn_of(r, prefill), reference[mode][t],
                           f"{mode} turn {t} on replica {i}" + (" after the other's SIGKILL" if t > KILL_AFTER else ""))
                assert r.previous_response_id == previous
                chain_ids.append(r.id)
            served_by.append(i)
            if t == KILL_AFTER:
                victim.kill()
        print(f"\n{TURNS} turns of each conversation served by replicas {served_by} (replica "
              f"{replicas.index(victim)} SIGKILLed after turn {KILL_AFTER}); every turn equal to the one-server run")

        # What the killed replica stored is the survivor's to read.
        c = client_of(survivor)
        for mode, chain_ids in ids.items():
            assert c.responses.retrieve(chain_ids[KILL_AFTER]).output_text == reference[mode][KILL_AFTER]["text"]
            items = c.responses.input_items.list(chain_ids[KILL_AFTER])
            assert [i.content[0].text for i in items.data] == [FOLLOW_UP]

        memory = record_memory(redis)
        assert set(memory) == {f"tost:r:{i}" for chain_ids in ids.values() for i in chain_ids}, \
            f"the store should hold exactly the {2 * TURNS} responses: {sorted(memory)[:3]}..."
        print(f"Redis memory per stored response: mean {sum(memory.values()) / len(memory):.0f}, "
              f"max {max(memory.values())} bytes (MEMORY USAGE of {len(memory)} records)")
        over = {k: v for k, v in memory.items() if v > MAX_RECORD_MEMORY}
        assert not over, f"stored responses over {MAX_RECORD_MEMORY} bytes of Redis memory: {over}"


def test_two_continuations_of_one_response_on_different_replicas(key_file, reference):
    mode = "sampled"
    expected = reference[mode]
    root_turn = 2
    with RedisServer() as redis, Replicas(key_file, redis) as replicas:
        previous = None
        for t in range(root_turn + 1):
            r, prefill = respond(replicas[t % 2], user_input(t), mode, **chain(previous))
            check_turn(turn_of(r, prefill), expected[t], f"turn {t}")
            previous = r.id
        root = previous

        # Both branches at once, one on each replica: both continue the root's state.
        barrier = threading.Barrier(2)
        branches, errors = [None, None], []
        before = [prefilled(s) for s in replicas]

        def branch(i):
            try:
                barrier.wait(timeout=30)
                branches[i] = client_of(replicas[i]).responses.create(
                    model=MODEL, input=FOLLOW_UP, max_output_tokens=TOKENS, previous_response_id=root,
                    **SAMPLING[mode])
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=branch, args=(i,)) for i in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(CALL_TIMEOUT_S)
        assert not errors, f"a branch failed: {errors}"
        assert branches[0].id != branches[1].id
        for i, b in enumerate(branches):
            assert b.previous_response_id == root
            wait_for_metric(replicas[i], "tost_prefill_tokens_total", lambda v: v > before[i], timeout_s=5, model=MODEL)
            check_turn(turn_of(b, prefilled(replicas[i]) - before[i]), expected[root_turn + 1],
                       f"branch on replica {i}")

        # Each branch goes on on the other replica; a third branch with other input, too.
        for i, b in enumerate(branches):
            r, prefill = respond(replicas[1 - i], FOLLOW_UP, mode, previous_response_id=b.id)
            check_turn(turn_of(r, prefill), expected[root_turn + 2], f"branch {i}'s next turn on replica {1 - i}")
        other, prefill = respond(replicas[0], BRANCH, mode, previous_response_id=root)
        assert other.usage.input_tokens_details.cached_tokens == expected[root_turn + 1]["cached_tokens"]
        assert prefill == other.usage.input_tokens - other.usage.input_tokens_details.cached_tokens > 0
        print(f"\nbranches of turn {root_turn}: {[b.output_text for b in branches]} on replicas 0 and 1 at once; "
              f"with other input: {other.output_text!r}")
        assert len(redis.keys("tost:r:*")) == root_turn + 1 + 2 + 2 + 1


def test_conversation_continues_on_the_other_replica(key_file, reference):
    mode = "sampled"
    expected = reference[mode]
    turns = 6
    with RedisServer() as redis, Replicas(key_file, redis) as replicas:
        clients = [client_of(s) for s in replicas]
        conv = clients[0].conversations.create(metadata={"test": "responses_shared"})
        for t in range(turns):
            i = t % 2
            r, prefill = respond(replicas[i], user_input(t), mode, conversation=conv.id)
            # The conversation holds the state: its turns are the previous_response_id chain's.
            check_turn(turn_of(r, prefill), expected[t], f"conversation turn {t} on replica {i}")

        # The other replica lists what each wrote, in order.
        items = clients[1].conversations.items.list(conv.id, order="asc", limit=100).data
        assert [(it.role, it.content[0].text) for it in items] == [
            pair for t in range(turns) for pair in (("user", user_input(t)), ("assistant", expected[t]["text"]))]
        assert clients[1].conversations.retrieve(conv.id).metadata == {"test": "responses_shared"}

        # An item added on one replica is answered on the other, prefilled with that turn's input.
        clients[0].conversations.items.create(conv.id, items=[{"type": "message", "role": "user",
                                                                "content": BRANCH}])
        r, prefill = respond(replicas[1], FOLLOW_UP, mode, conversation=conv.id)
        assert r.usage.input_tokens_details.cached_tokens == expected[turns]["cached_tokens"]
        assert prefill == r.usage.input_tokens - r.usage.input_tokens_details.cached_tokens > expected[turns]["prefill"]
        items = clients[0].conversations.items.list(conv.id, order="asc", limit=100).data
        assert [it.content[0].text for it in items[-3:]] == [BRANCH, FOLLOW_UP, r.output_text]


def test_store_unavailable_is_503_with_retry_after(key_file, reference):
    expected = reference["greedy"]
    with RedisServer(appendonly=True, appendfsync="always") as redis, \
            Replicas(key_file, redis, n=1, extra=[f"--session_store_timeout_ms={STORE_TIMEOUT_MS}"]) as (server,):
        c = client_of(server)
        r, prefill = respond(server, user_input(0))
        check_turn(turn_of(r, prefill), expected[0], "turn 0")
        root = r.id
        t = 1
        for outage in ("pause", "stop"):
            if outage == "pause":
                redis.pause()
            else:
                redis.stop()
            refusals = {}
            for what, kwargs in (("previous_response_id", {"previous_response_id": root}),
                                 ("store: true", {"store": True})):
                t0 = time.monotonic()
                with pytest.raises(openai.APIStatusError) as e:
                    c.responses.create(model=MODEL, input=FOLLOW_UP, temperature=0, max_output_tokens=TOKENS,
                                       **kwargs)
                took = time.monotonic() - t0
                refusals[what] = took
                label = f"{what} with Redis {outage}"
                response = e.value.response
                assert e.value.status_code == 503, f"{label}: {e.value.status_code} {response.text}"
                retry_after = response.headers.get("retry-after")
                assert retry_after is not None and retry_after.isdigit() and int(retry_after) >= 1, \
                    f"{label}: Retry-After {retry_after!r}"
                body = response.json()
                assert set(body) == {"error"}, f"{label}: {body}"
                error = body["error"]
                assert set(error) >= {"message", "type", "param", "code"}, f"{label}: {error}"
                assert error["type"] == "server_error" and error["code"] == "unavailable", f"{label}: {error}"
                assert "the session store (--session_store)" in error["message"], \
                    f"{label}: the message should name the store"
                assert redis.address not in error["message"], f"{label}: the message should not say where it is"
                assert took < 3.0, f"{label}: the 503 took {took:.2f} s (store timeout {STORE_TIMEOUT_MS} ms)"
            # What needs no store is served.
            stateless = c.responses.create(model=MODEL, input=OPENING, temperature=0, max_output_tokens=TOKENS,
                                           store=False)
            assert stateless.output_text == expected[0]["text"]
            print(f"\nRedis {outage}: 503 after " + ", ".join(f"{w} {s * 1000:.0f} ms" for w, s in refusals.items()))

            if outage == "pause":
                redis.resume()
            else:
                redis.start()  # its AOF (appendfsync always) holds every stored response
            deadline = time.monotonic() + 15
            while True:
                try:
                    r, prefill = respond(server, FOLLOW_UP, previous_response_id=root)
                    break
                except openai.APIStatusError as e:
                    assert e.status_code == 503, f"after the {outage}: {e.status_code} {e.response.text}"
                    assert time.monotonic() < deadline, "the store should serve again within 15 s of its return"
                    time.sleep(0.1)
            check_turn(turn_of(r, prefill), expected[t], f"turn {t} after the {outage}")
            root = r.id
            t += 1
        assert c.responses.retrieve(root).output_text == expected[t - 1]["text"]
