"""The prefix-state cache end to end: a stateless client resending a 20-turn conversation (each
prompt = the previous prompt + the previous reply + new text, as token ids) prefills only the new
tokens from turn 2 on (cached_tokens in GenerateFinal, the prefill-token counter of ServerStatus
flat per turn), while a server started with --prefix_cache_bytes=0 prefills the whole history every
turn; with --batch_invariant_decode the replies equal the uncached server's token for token; two API
keys never share entries, and calls on sessions report none."""
import os
import struct
import sys
import time

import pytest

import tost_protos
from conftest import SOURCE_DIR, RunningServer, generator_status
from tost_harness import collect_generate

MODEL = "tost-austen"
MODELS = os.path.join(SOURCE_DIR, "models")
TURNS = 20
REPLY_TOKENS = 16
CHUNK = 16  # --prefill_chunk_tokens: fine enough for grid-exact hits on these short prompts
sys.path.insert(0, os.path.join(SOURCE_DIR, "tools"))
import bpe  # noqa: E402
TOKENIZER = bpe.Tokenizer.load(os.path.join(MODELS, MODEL, "tokenizer.json"))
OPENING = TOKENIZER.encode(b"It is a truth universally acknowledged, that a single man in possession")
NEW_TEXT = [TOKENIZER.encode(f" Then, in the chapter {i}, she said that".encode()) for i in range(TURNS)]
ALICE = [("x-api-key", "0123456789abcdef0123")]
BOB = [("authorization", "Bearer fedcba9876543210fedc")]


def generate(stub, pb2, ids, metadata=None, **kw):
    """(reply token ids, GenerateFinal) of one Generate on token ids."""
    request = pb2.GenerateRequest(model=MODEL, prompt_tokens=pb2.TokenIds(ids=ids), max_new_tokens=REPLY_TOKENS,
                                  sampling=pb2.SamplingParams(temperature=0.8, top_k=40, seed=11), **kw)
    got = collect_generate(stub.Generate(request, metadata=metadata, timeout=120))
    return got.ids, got.final


def statistics(blob):
    """The statistics bytes a state blob carries ("TOSTSESS", u32 version, u32 payload length,
    payload, MAC): what must be bit-identical, beyond the tokens drawn from it."""
    (length,) = struct.unpack("<I", blob[12:16])
    payload = tost_protos.session_state().SessionState()
    payload.ParseFromString(blob[16:16 + length])
    return payload.position, payload.stats


def conversation(stub, pb2):
    """Runs the 20 turns; per turn: prompt length, new tokens, reply, cached_tokens, prefill tokens
    the server counted during the turn, wall seconds."""
    turns, prompt, reply = [], list(OPENING), []
    for i in range(TURNS):
        prompt = prompt + reply + NEW_TEXT[i] if i else prompt + NEW_TEXT[0]
        before = generator_status(stub.ServerStatus(pb2.ServerStatusRequest()), MODEL).prefill_tokens
        start = time.monotonic()
        reply, final = generate(stub, pb2, prompt, return_state=True)
        elapsed = time.monotonic() - start
        after = generator_status(stub.ServerStatus(pb2.ServerStatusRequest()), MODEL).prefill_tokens
        assert final.prompt_tokens == len(prompt)
        turns.append(dict(prompt=len(prompt), new=len(NEW_TEXT[i]), reply=list(reply), cached=final.cached_tokens,
                          prefill=after - before, seconds=elapsed, state=statistics(final.state)))
    return turns


def report(name, turns):
    print(f"\n{name}: turn prompt new cached prefill seconds")
    for i, t in enumerate(turns):
        print(f"  {i + 1:2d} {t['prompt']:4d} {t['new']:3d} {t['cached']:4d} {t['prefill']:4d} {t['seconds']:.3f}")
    print(f"  total prefill {sum(t['prefill'] for t in turns)}, wall {sum(t['seconds'] for t in turns):.2f} s")


def run(proto_modules, *args):
    pb2, pb2_grpc = proto_modules
    import grpc
    with RunningServer(MODELS, [f"--prefill_chunk_tokens={CHUNK}", *args]) as srv, \
            grpc.insecure_channel(srv.address) as channel:
        stub = pb2_grpc.TostStub(channel)
        turns = conversation(stub, pb2)
        status = generator_status(stub.ServerStatus(pb2.ServerStatusRequest()), MODEL)
        return turns, status


def test_a_resent_conversation_prefills_only_its_new_tokens(proto_modules):
    cached, status = run(proto_modules)
    cold, cold_status = run(proto_modules, "--prefix_cache_bytes=0")
    report("cache", cached)
    report("no cache", cold)
    assert cached[0]["cached"] == 0
    assert cached[0]["prefill"] == cached[0]["prompt"] - 1
    for prev, t in zip(cached, cached[1:]):
        # Everything but the new text is cached except the previous reply's last token: it was
        # drawn and never fed (the state keeps it pending), so this turn feeds it with the new text
        # but the new text's last token, which the first decode step feeds, as a cold run does.
        assert t["cached"] == prev["prompt"] + len(prev["reply"]) - 1, t
        assert t["prefill"] == t["new"], t
    for t in cold:
        assert t["cached"] == 0
        assert t["prefill"] == t["prompt"] - 1
    assert status.prefix_cache_lookups == TURNS
    assert status.prefix_cache_hits == TURNS - 1
    assert status.prefix_cache_hit_tokens == sum(t["cached"] for t in cached)
    assert status.prefix_cache_entries > 0 and status.prefix_cache_bytes > 0
    assert cold_status.prefix_cache_lookups == 0 and cold_status.prefix_cache_entries == 0
    agree = sum(a["reply"] == b["reply"] for a, b in zip(cached, cold))
    same = sum(a["state"] == b["state"] for a, b in zip(cached, cold))
    print(f"default decode: {agree} of {TURNS} replies and {same} end states equal to the uncached server's")


def test_batch_invariant_hits_give_the_uncached_servers_replies(proto_modules):
    cached, _ = run(proto_modules, "--batch_invariant_decode")
    cold, _ = run(proto_modules, "--batch_invariant_decode", "--prefix_cache_bytes=0")
    report("batch-invariant, cache", cached)
    report("batch-invariant, no cache", cold)
    assert [t["reply"] for t in cached] == [t["reply"] for t in cold]
    # The tiny model's draws seldom flip on a last-bit difference: the statistics each turn ends
    # with (prompt and reply fed, from the returned state) must be the same bits too.
    for i, (a, b) in enumerate(zip(cached, cold)):
        assert a["state"] == b["state"], f"turn {i + 1}: statistics differ from the uncached server's"
    for prev, t in zip(cached, cached[1:]):
        # Only states a cold prefill computes too: the last multiple of the chunk the previous
        # prompt's prefill reached (the previous reply was fed by decode steps, cut after each
        # token, and the prompt's end lies between two cuts of a cold prefill).
        assert t["cached"] == (prev["prompt"] - 1) // CHUNK * CHUNK, t
        assert t["prefill"] == t["prompt"] - 1 - t["cached"], t


def test_two_api_keys_do_not_share_entries_and_sessions_report_none(proto_modules, tmp_path):
    pb2, pb2_grpc = proto_modules
    import grpc
    keys = tmp_path / "api_keys"
    keys.write_text("alice 0123456789abcdef0123\nbob fedcba9876543210fedc\n")
    prompt = OPENING + NEW_TEXT[0]
    with RunningServer(MODELS, [f"--api_keys_file={keys}"]) as srv, grpc.insecure_channel(srv.address) as channel:
        stub = pb2_grpc.TostStub(channel)
        assert generate(stub, pb2, prompt, ALICE)[1].cached_tokens == 0
        assert generate(stub, pb2, prompt, ALICE)[1].cached_tokens == len(prompt) - 1
        assert generate(stub, pb2, prompt, BOB)[1].cached_tokens == 0
        assert generate(stub, pb2, prompt, BOB)[1].cached_tokens == len(prompt) - 1
        # A session brings its own state: it never starts from the cache, even on a cached prompt.
        session = stub.CreateSession(pb2.CreateSessionRequest(model=MODEL), metadata=ALICE)
        assert generate(stub, pb2, prompt, ALICE, session_id=session.session_id)[1].cached_tokens == 0
        # A session's first call starts at position 0, so its end state is stored, under its owner.
        other = OPENING + NEW_TEXT[2]
        session = stub.CreateSession(pb2.CreateSessionRequest(model=MODEL), metadata=ALICE)
        reply, final = generate(stub, pb2, other, ALICE, session_id=session.session_id)
        assert final.cached_tokens == 0
        assert generate(stub, pb2, other + reply + NEW_TEXT[1], BOB)[1].cached_tokens == 0
        assert generate(stub, pb2, other + reply + NEW_TEXT[1], ALICE)[1].cached_tokens == len(other + reply) - 1


def test_prompt_cache_key_groups_grpc_calls(proto_modules):
    """GenerateRequest.prompt_cache_key as OpenAI's: three prompts that share a long prefix and then
    differ, at the default chunk (128, past these prompts: no grid state helps). Without a key
    nothing is cached; in one group the third starts from the prefix the second stored. A key past
    256 characters is refused naming the field."""
    pb2, pb2_grpc = proto_modules
    import grpc
    shared = OPENING * 3
    with RunningServer(MODELS, []) as srv, grpc.insecure_channel(srv.address) as channel:
        stub = pb2_grpc.TostStub(channel)
        found = {}
        for key in ("", "grpc-group"):
            head = TOKENIZER.encode(f"[{key or 'none'}]".encode())
            found[key] = [generate(stub, pb2, head + shared + NEW_TEXT[i], prompt_cache_key=key)[1].cached_tokens
                          for i in range(3)]
        assert found[""] == [0, 0, 0], found
        assert found["grpc-group"][:2] == [0, 0], found
        assert found["grpc-group"][2] >= len(shared), found
        with pytest.raises(grpc.RpcError) as e:
            generate(stub, pb2, shared, prompt_cache_key="k" * 257)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "prompt_cache_key must be at most 256 characters, got 257" in e.value.details()
        # Refused before anything ran: the server goes on serving, the group as it was.
        assert generate(stub, pb2, head + shared + NEW_TEXT[0], prompt_cache_key="grpc-group")[1].cached_tokens >= len(shared)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
