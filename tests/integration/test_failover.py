"""Failover, end to end: two tost_server replicas (one session key, --batch_invariant_decode) behind
nginx (grpc_pass, weighted round robin), many concurrent generations through the proxy with the
resumable client (client/python/tost_client), and one replica lost mid-stream:

- SIGKILL: every client finishes, and every generation equals an uninterrupted run of the same
  request, token for token and position for position;
- SIGTERM (a drain): no accepted request fails, drained streams resume on the other replica;
- the killed replica restarted at its address: the proxy sends it traffic again;
- `tost_cli generate --resume` through the proxy, with the replica serving it killed.

The first replica carries three quarters of the streams (nginx weight 3 against 1), so losing it
cuts most streams mid-stream; each run prints how many were cut and resumed and fails unless at
least half were cut after they had received tokens. The runs are the `failover_*` ctest tests
(TOST_FAILOVER=1); server_end_to_end skips them and runs the tests of the client's bookkeeping
against a scripted stub."""
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

import grpc
import pytest

from conftest import SOURCE_DIR, RunningServer
from failover_proxy import Cluster
from tost_harness import collect_generate, metric_value, scrape_metrics

# The client library generates its stubs on first import into this cache (not the user's home).
os.environ.setdefault("TOST_CLIENT_CACHE_DIR", os.path.join(tempfile.gettempdir(), "tost_client_tests"))
sys.path.insert(0, os.path.join(SOURCE_DIR, "client", "python"))
import tost_client  # noqa: E402
from tost_client import tost_pb2 as pb2  # noqa: E402

sys.path.insert(0, os.path.join(SOURCE_DIR, "tools"))
import bpe  # noqa: E402

# The multi-replica runs; the client's own bookkeeping tests below (a scripted stub) always run.
failover_run = pytest.mark.skipif(not os.environ.get("TOST_FAILOVER"),
                                  reason="the failover runs are the `failover_*` ctest tests (TOST_FAILOVER=1)")

MODEL = "tost-austen"
MODELS = os.path.join(SOURCE_DIR, "models")
STREAMS = 32
MAX_NEW_TOKENS = 800       # a prompt of at most ~30 tokens keeps every stream inside the 1024 context
SNAPSHOT_EVERY = 8
KILL_AFTER_TOKENS = 48     # every client holds at least this many tokens when the replica is lost
WEIGHTS = (3, 1)           # the victim (replica 0) takes three streams in four
RUN_TIMEOUT_S = 240
# Batch-invariant decode, and with it prompts cut into the same prefill pieces whatever else is
# prefilling (a prefill's statistics depend in their last bits on the cut: one of these 32 sampled
# streams takes another token at position 519 when its prompt is fed in pieces of 7 rather than
# whole), so the same request gives the same tokens on any replica under any load.
SERVER_ARGS = ["--batch_invariant_decode"]
OPENINGS = ["It is a truth universally acknowledged", "Emma Woodhouse, handsome, clever, and rich",
            "The family of Dashwood had long been settled", "Sir Walter Elliot, of Kellynch Hall",
            "No one who had ever seen Catherine Morland", "About thirty years ago, Miss Maria Ward",
            "My dear Fanny, said her aunt", "Mr. Darcy walked off"]


# Every fourth stream is constrained: its blobs carry the constraint's progress, so a resumed
# stream goes on under it, and equals its uninterrupted (constrained) run only if it does. The
# pattern cannot complete within MAX_NEW_TOKENS, so every stream ends with LENGTH.
CONSTRAINT = r"[a-z ,.;]{20000}"


def make_request(i):
    """Half greedy, half seeded sampling (draws keyed by seed and position, so resumable too); every
    fourth under CONSTRAINT."""
    prompt = f"{OPENINGS[i % len(OPENINGS)]} (chapter {i}), ".encode()
    sampling = (pb2.SamplingParams(temperature=0.0) if i % 2 == 0
                else pb2.SamplingParams(temperature=0.8, top_p=0.95, seed=1000 + i))
    request = pb2.GenerateRequest(model=MODEL, prompt_bytes=prompt, max_new_tokens=MAX_NEW_TOKENS, sampling=sampling)
    if i % 4 == 3:
        request.constraint.regex = CONSTRAINT
    return request


@pytest.fixture(scope="module")
def requests():
    return [make_request(i) for i in range(STREAMS)]


def plain_run(stub, request):
    """One uninterrupted Generate: [(position, id)] and the final message."""
    got = collect_generate(stub.Generate(request, timeout=RUN_TIMEOUT_S))
    return list(zip(got.positions, got.ids)), got.final


@pytest.fixture(scope="module")
def reference(key_file, requests):
    """Each request run once, uninterrupted, straight on one server (no proxy, no snapshots); run
    together, which batch-invariant decode makes the same as one by one."""
    server = RunningServer(MODELS, [f"--session_key_file={key_file}", *SERVER_ARGS])
    try:
        with grpc.insecure_channel(server.address) as ch:
            stub = tost_client.TostStub(ch)
            results = [None] * len(requests)

            def run(i):
                results[i] = plain_run(stub, requests[i])

            threads = [threading.Thread(target=run, args=(i,)) for i in range(len(requests))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(RUN_TIMEOUT_S)
            assert all(r is not None for r in results), "a reference run did not finish"
    finally:
        assert server.stop() == 0
    for i, (tokens, final) in enumerate(results):
        # Long enough to be cut mid-way: EOS, a stop or the context would end a stream early.
        assert final.finish_reason == pb2.FINISH_REASON_LENGTH and len(tokens) == MAX_NEW_TOKENS, \
            f"reference {i}: {MAX_NEW_TOKENS} tokens and LENGTH expected, got {len(tokens)} and {final.finish_reason}"
    return results


class Sessions:
    """STREAMS resumable generations through one channel, each on its own thread; odd ones eager
    (tokens handed out on arrival, a continuation's checked against them), even ones buffered
    (tokens handed out once a snapshot covers them)."""

    def __init__(self, address, requests, max_retries=12):
        self.channel = grpc.insecure_channel(address)
        self.stub = tost_client.TostStub(self.channel)
        self.gens = [tost_client.generate(self.stub, r, state_every_tokens=SNAPSHOT_EVERY, max_retries=max_retries,
                                          deadline_s=RUN_TIMEOUT_S, backoff_s=0.05, max_backoff_s=1.0,
                                          eager=(i % 2 == 1))
                     for i, r in enumerate(requests)]
        self.progress = [0] * len(requests)
        self.done = [False] * len(requests)
        self.errors = {}
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(len(requests))]
        self.started = None

    def _run(self, i):
        try:
            for _ in self.gens[i]:
                self.progress[i] += 1
        except Exception as e:  # noqa: BLE001 - reported by check()
            self.errors[i] = e
        finally:
            self.done[i] = True

    def start(self):
        self.started = time.monotonic()
        for t in self.threads:
            t.start()
        return self

    def wait_all_mid_stream(self, tokens=KILL_AFTER_TOKENS, timeout_s=120):
        """Until every stream holds `tokens` tokens; fails if one finished or failed first (the
        loss of a replica would then not be mid-stream)."""
        deadline = time.monotonic() + timeout_s
        while min(self.progress) < tokens:
            assert not any(self.done), (f"a stream ended before every stream held {tokens} tokens: done "
                                        f"{[i for i, d in enumerate(self.done) if d]}, errors {self.errors}")
            assert time.monotonic() < deadline, (f"every stream should hold {tokens} tokens within {timeout_s} s; "
                                                 f"progress {self.progress}")
            time.sleep(0.005)
        assert not any(self.done), f"streams ended before the replica was lost: {self.done}"

    def join(self, timeout_s=RUN_TIMEOUT_S):
        deadline = self.started + timeout_s
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self.seconds = time.monotonic() - self.started
        stuck = [i for i, t in enumerate(self.threads) if t.is_alive()]
        assert not stuck, f"streams {stuck} had not finished after {timeout_s} s: progress {self.progress}"
        self.channel.close()

    def check(self, reference, label):
        """Every generation finished and equals the uninterrupted run; prints and returns the
        counts of streams cut and resumed."""
        assert not self.errors, f"{len(self.errors)} generation(s) failed: " + "; ".join(
            f"{i}: {e!r} breaks={getattr(e, 'breaks', None)}" for i, e in sorted(self.errors.items()))
        for i, gen in enumerate(self.gens):
            expected_tokens, expected_final = reference[i]
            got = [(t.position, t.id) for t in gen.tokens]
            if got != expected_tokens:
                first = next((k for k, (a, b) in enumerate(zip(got, expected_tokens)) if a != b),
                             min(len(got), len(expected_tokens)))
                pytest.fail(f"stream {i} ({label}): {len(expected_tokens)} tokens as uninterrupted expected, got "
                            f"{len(got)}; first difference at index {first}: expected "
                            f"{expected_tokens[first:first + 3]}, got {got[first:first + 3]}; breaks {gen.breaks}")
            assert gen.final.finish_reason == expected_final.finish_reason
            assert gen.final.position == expected_final.position
            if i % 4 == 3:
                text = b"".join(t.bytes for t in gen.tokens).decode()
                assert re.fullmatch(r"[a-z ,.;]+", text), f"stream {i} left its constraint: {text!r}"
        cut = [g for g in self.gens if g.breaks and g.breaks[0].received > 0]
        resumed = [g for g in self.gens if g.resumed_from_snapshot]
        restarted = [g for g in self.gens if any(b.resume_position is None for b in g.breaks)]
        breaks = sum(len(g.breaks) for g in self.gens)
        regenerated = sum(b.dropped for g in self.gens for b in g.breaks)
        reasons = sorted({b.reason.split(":")[0] for g in self.gens for b in g.breaks})
        print(f"\nfailover ({label}): {len(self.gens)} streams of {MAX_NEW_TOKENS} tokens in {self.seconds:.1f} s; "
              f"{len(cut)} cut mid-stream, {len(resumed)} resumed from a snapshot, {len(restarted)} sent again "
              f"from the prompt; {breaks} breaks ({', '.join(reasons) or 'none'}), {regenerated} tokens "
              f"generated again; every output equals the uninterrupted run")
        return len(cut), len(resumed)


def generator(address):
    with grpc.insecure_channel(address) as ch:
        (g,) = [g for g in tost_client.TostStub(ch).ServerStatus(pb2.ServerStatusRequest(), timeout=10).generators
                if g.model == MODEL]
        return g


def generate_calls(replica):
    """Generate RPCs the replica finished (tost_requests_total, any status)."""
    return metric_value(scrape_metrics(replica.server), "tost_requests_total", rpc="Generate")


@failover_run
def test_sigkill_mid_stream_loses_no_token_and_the_restarted_replica_serves_again(key_file, requests, reference):
    with Cluster(MODELS, key_file, replicas=2, weights=WEIGHTS, extra_args=SERVER_ARGS) as cluster:
        victim, survivor = cluster.replicas
        sessions = Sessions(cluster.proxy.address, requests).start()
        try:
            sessions.wait_all_mid_stream()
            on_victim = generator(victim.address).active
            victim.kill()
        finally:
            sessions.join()
        print(f"\nSIGKILL with {on_victim} of {STREAMS} streams active on the killed replica")
        cut, resumed = sessions.check(reference, "SIGKILL")
        assert 2 * cut >= STREAMS, f"at least {STREAMS // 2} of {STREAMS} streams cut mid-stream expected, got {cut}"
        assert resumed >= cut // 2, f"most cut streams should resume from a snapshot: {resumed} of {cut}"

        # The replica comes back at its address. nginx left it out for fail_timeout after the
        # connections it refused, and then ramps its share back up to its weight (3 of 4): rounds
        # of 16 generations through the proxy until it serves most of a round.
        victim.start()
        steps_before = generator(victim.address).decode_steps
        per_round = []
        deadline = time.monotonic() + 90
        while not per_round or per_round[-1] < 8:
            assert time.monotonic() < deadline, \
                f"the restarted replica should serve 8 of 16 calls of a round; per round: {per_round}"
            before = generate_calls(victim)
            again = Sessions(cluster.proxy.address, requests[:16])
            again.start().join()
            again.check(reference, f"after the restart, round {len(per_round) + 1}")
            per_round.append(int(generate_calls(victim) - before))
        steps = generator(victim.address).decode_steps - steps_before
        print(f"restarted replica: Generate calls served per round of 16 through the proxy: {per_round}; "
              f"{steps} decode steps")
        assert steps > 0, "the restarted replica's decode steps should rise"
        assert survivor.alive()


@failover_run
def test_sigterm_drains_and_drained_streams_resume_elsewhere(key_file, requests, reference):
    # One second of drain: the streams run on, then end DRAINED with their blobs.
    with Cluster(MODELS, key_file, replicas=2, weights=WEIGHTS,
                 extra_args=[*SERVER_ARGS, "--drain_timeout_s=1"]) as cluster:
        victim, survivor = cluster.replicas
        sessions = Sessions(cluster.proxy.address, requests).start()
        try:
            sessions.wait_all_mid_stream()
            on_victim = generator(victim.address).active
            victim.terminate()
            assert victim.server.proc.wait(timeout=30) == 0, "the drained replica should exit 0"
        finally:
            sessions.join()
        print(f"\nSIGTERM with {on_victim} of {STREAMS} streams active on the drained replica")
        cut, resumed = sessions.check(reference, "SIGTERM")
        drained = [g for g in sessions.gens if any(b.reason == "DRAINED" for b in g.breaks)]
        print(f"{len(drained)} streams ended DRAINED and went on elsewhere")
        assert 2 * cut >= STREAMS, f"at least {STREAMS // 2} of {STREAMS} streams cut mid-stream expected, got {cut}"
        assert 2 * len(drained) >= STREAMS, \
            f"a drain should end most streams with DRAINED: {len(drained)} of {STREAMS}"
        # A drain loses nothing: every cut stream continued from the blob the drain handed it.
        for g in drained:
            assert g.resumed_from_snapshot, g.breaks
        assert survivor.alive()


@failover_run
def test_tost_cli_resume_through_the_proxy_survives_a_kill(key_file):
    cli = os.environ.get("TOST_CLI_BIN")
    if not cli or not os.path.exists(cli):
        pytest.fail("TOST_CLI_BIN must point at the built tost_cli (run through ctest)")
    tokenizer = bpe.Tokenizer.load(os.path.join(MODELS, MODEL, "tokenizer.json"))
    prompt_ids = tokenizer.encode(b"It is a truth universally acknowledged")
    max_new = 1000 - len(prompt_ids)
    args = [cli, "generate", f"--model={MODEL}", "--prompt_tokens=" + ",".join(map(str, prompt_ids)),
            f"--max_new_tokens={max_new}", "--temperature=0.8", "--top_p=0.95", "--seed=42"]
    with Cluster(MODELS, key_file, replicas=2, extra_args=SERVER_ARGS) as cluster:
        direct = subprocess.run([*args, f"--server={cluster.replicas[1].address}"], capture_output=True,
                                text=True, timeout=120)
        assert direct.returncode == 0, direct.stderr
        expected = direct.stdout.split()
        assert len(expected) == len(prompt_ids) + max_new, direct.stdout

        # Other streams share the decode steps, so the CLI's stream lasts seconds.
        load = Sessions(cluster.proxy.address, [make_request(i) for i in range(STREAMS)])
        load.start()
        proc = subprocess.Popen([*args, f"--server={cluster.proxy.address}", "--resume", "--state_every_tokens=8",
                                 "--max_retries=10", "--timeout_s=180"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = [], []
        readers = [threading.Thread(target=lambda f=f, acc=acc: acc.extend(iter(f.readline, "")), daemon=True)
                   for f, acc in ((proc.stdout, out), (proc.stderr, err))]
        for t in readers:
            t.start()
        kills = 0
        try:
            # Which replica serves the CLI is the proxy's choice: the replicas are killed in turn
            # (each restarted before the next is killed) until the CLI reports a break.
            deadline = time.monotonic() + 120
            while proc.poll() is None and not any("stream broke" in line for line in err):
                assert time.monotonic() < deadline, f"tost_cli reported no break within 120 s after {kills} kills"
                if load.progress and min(load.progress) < 16:
                    time.sleep(0.02)  # the CLI and the load are under way first
                    continue
                r = cluster.replicas[kills % 2]
                r.kill()
                kills += 1
                time.sleep(0.3)
                r.start()
            proc.wait(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for t in readers:
                t.join(10)
            load.join()
        stderr = "".join(err)
        assert proc.returncode == 0, stderr
        assert not load.errors, f"the other streams should all finish: {load.errors}"
        assert any("stream broke" in line for line in err), \
            f"the CLI's stream should have been cut ({kills} kills); it finished first: {stderr}"
        assert "".join(out).split() == expected, \
            f"tost_cli --resume output differs from the uninterrupted run; stderr: {stderr}"
        print(f"\ntost_cli --resume, {kills} replica kill(s):\n{stderr}")


# The client's bookkeeping against a scripted stub: each call of Generate plays the next script,
# a list of messages and an optional error raised after them.

class ScriptedError(grpc.RpcError):
    def __init__(self, code, details="scripted"):
        super().__init__()
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


class ScriptedCall:
    def __init__(self, messages, error):
        self.messages, self.error = messages, error

    def __iter__(self):
        yield from self.messages
        if self.error is not None:
            raise self.error

    async def __aiter__(self):  # the same script as a grpc.aio call plays it
        for message in self.messages:
            yield message
        if self.error is not None:
            raise self.error

    def cancel(self):
        pass


class ScriptedStub:
    def __init__(self, *scripts):
        self.scripts = list(scripts)
        self.requests = []

    def Generate(self, request, timeout=None, metadata=None):  # noqa: N802 - the stub's method name
        self.requests.append(request)
        messages, error = self.scripts.pop(0)
        return ScriptedCall(messages, error)


def tok(position, token_id):
    return pb2.GenerateResponse(token=pb2.GeneratedToken(id=token_id, position=position, text=f"<{token_id}>"))


def snap(position, state=b"blob"):
    return pb2.GenerateResponse(snapshot=pb2.StateSnapshot(state=state + str(position).encode(), position=position))


def final(reason, position, generated, state=b""):
    return pb2.GenerateResponse(final=pb2.GenerateFinal(finish_reason=reason, position=position,
                                                        generated_tokens=generated, state=state))


FIRST = pb2.GenerateRequest(model=MODEL, prompt_bytes=b"abc", max_new_tokens=6)
LENGTH, DRAINED = pb2.FINISH_REASON_LENGTH, pb2.FINISH_REASON_DRAINED


def run_scripted(*scripts, **options):
    """Plays the scripts through tost_client.generate, and again through the asyncio
    AsyncResumableGeneration, which must hand out, ask and fail the same."""
    def play(collect, cls):
        stub = ScriptedStub(*scripts)
        gen = cls(stub, FIRST, state_every_tokens=2, backoff_s=0, **options)
        try:
            return stub, gen, collect(gen), None
        except tost_client.ResumeError as e:
            return stub, gen, None, e

    async def collect_async(gen):
        return [(t.position, t.id) async for t in gen]

    stub, gen, out, error = play(lambda gen: [(t.position, t.id) for t in gen], tost_client.generate)
    a_stub, a_gen, a_out, a_error = play(lambda gen: asyncio.run(collect_async(gen)),
                                         tost_client.AsyncResumableGeneration)
    assert (type(a_error), str(a_error), a_out) == (type(error), str(error), out)
    assert a_stub.requests == stub.requests and a_gen.breaks == gen.breaks and a_gen.tokens == gen.tokens
    if error is not None:
        raise error
    return stub, gen, out


@pytest.mark.parametrize("eager", [False, True])
def test_a_break_drops_the_tokens_past_the_snapshot_and_continues_with_the_tokens_left(eager):
    # Prompt of 3 tokens: the first generated token sits at position 3.
    stub, gen, out = run_scripted(
        ([tok(3, 10), tok(4, 11), snap(4), tok(5, 12)], ScriptedError(grpc.StatusCode.INTERNAL, "RST_STREAM")),
        ([tok(5, 12), tok(6, 13), snap(6), tok(7, 14), tok(8, 15), final(LENGTH, 9, 4)], None),
        eager=eager)
    assert out == [(3, 10), (4, 11), (5, 12), (6, 13), (7, 14), (8, 15)]
    first, resume = stub.requests
    assert first.return_state and first.state_every_tokens == 2 and first.prompt_bytes == b"abc"
    assert resume.state == b"blob4" and resume.max_new_tokens == 4 and not resume.prompt_bytes
    assert [(b.reason.split(":")[0], b.received, b.dropped, b.resume_position) for b in gen.breaks] == \
        [("INTERNAL", 3, 1, 4)]
    assert gen.final.finish_reason == LENGTH and gen.text == "<10><11><12><13><14><15>"


def test_a_break_before_the_first_snapshot_sends_the_request_again():
    stub, gen, out = run_scripted(
        ([tok(3, 10)], ScriptedError(grpc.StatusCode.UNAVAILABLE)),
        ([], ScriptedError(grpc.StatusCode.UNAVAILABLE)),
        ([tok(3, 10), tok(4, 11), snap(4), tok(5, 12), tok(6, 13), snap(6), tok(7, 14), tok(8, 15),
          final(LENGTH, 9, 6)], None))
    assert out == [(3, 10), (4, 11), (5, 12), (6, 13), (7, 14), (8, 15)]
    assert stub.requests[1] == stub.requests[0] == stub.requests[2]
    assert [b.resume_position for b in gen.breaks] == [None, None]


def test_a_drain_continues_from_its_blob_even_right_after_a_snapshot():
    stub, gen, out = run_scripted(
        # Drained right after the snapshot at 4: its blob holds tokens up to 4 as well.
        ([tok(3, 10), tok(4, 11), snap(4), final(DRAINED, 5, 2, b"drained")], None),
        # Drained before the continuation produced a token: its blob is the call's own input.
        ([final(DRAINED, 5, 0, b"drained")], None),
        ([tok(5, 12), final(DRAINED, 6, 1, b"drained again")], None),
        ([tok(6, 13), tok(7, 14), snap(7), tok(8, 15), final(LENGTH, 9, 3)], None))
    assert out == [(3, 10), (4, 11), (5, 12), (6, 13), (7, 14), (8, 15)]
    assert [(r.state, r.max_new_tokens) for r in stub.requests[1:]] == \
        [(b"drained", 4), (b"drained", 4), (b"drained again", 3)]
    assert [b.reason for b in gen.breaks] == ["DRAINED"] * 3 and sum(b.dropped for b in gen.breaks) == 0


def test_a_drain_of_a_fresh_prompt_before_any_token_sends_the_prompt_again():
    stub, gen, out = run_scripted(
        ([final(DRAINED, 0, 0, b"empty state")], None),
        ([tok(3, 10), tok(4, 11), snap(4), tok(5, 12), tok(6, 13), snap(6), tok(7, 14), tok(8, 15),
          final(LENGTH, 9, 6)], None))
    assert len(out) == 6 and stub.requests[1] == stub.requests[0]


def test_errors_that_would_fail_again_and_retries_in_a_row_end_the_generation():
    with pytest.raises(tost_client.ResumeError) as e:
        run_scripted(([tok(3, 10)], ScriptedError(grpc.StatusCode.INVALID_ARGUMENT, "bad blob")))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "bad blob" in str(e.value)
    unavailable = ([], ScriptedError(grpc.StatusCode.UNAVAILABLE, "no upstream"))
    with pytest.raises(tost_client.ResumeError) as e:
        run_scripted(*[unavailable] * 3, max_retries=2)
    assert len(e.value.breaks) == 3 and "3 break(s) in a row" in str(e.value) and "no upstream" in str(e.value)


def test_positions_that_do_not_line_up_and_a_diverging_continuation_are_reported():
    with pytest.raises(tost_client.ProtocolError, match="token at position 7, expected position 5"):
        run_scripted(([tok(3, 10), tok(4, 11), snap(4)], ScriptedError(grpc.StatusCode.INTERNAL)),
                     ([tok(7, 12)], None))
    with pytest.raises(tost_client.ProtocolError, match="snapshot at position 5, expected the last token's position 4"):
        run_scripted(([tok(3, 10), tok(4, 11), snap(5)], None))
    with pytest.raises(tost_client.DivergedError, match="gave token 99 at position 5, where token 12"):
        run_scripted(([tok(3, 10), tok(4, 11), snap(4), tok(5, 12)], ScriptedError(grpc.StatusCode.INTERNAL)),
                     ([tok(5, 99)], None), eager=True)


def test_sessions_cannot_move_between_replicas():
    with pytest.raises(ValueError, match="session_id"):
        tost_client.generate(ScriptedStub(), pb2.GenerateRequest(session_id="s", max_new_tokens=4))
    with pytest.raises(ValueError, match="max_new_tokens must be > 0"):
        tost_client.generate(ScriptedStub(), pb2.GenerateRequest(model=MODEL, prompt_bytes=b"a"))
