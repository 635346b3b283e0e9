"""The shared session store, end to end: tost_server replicas keeping their sessions on a real Redis
(--session_store=redis://..., tests/integration/redis_server.py), behind Debian's nginx
(tests/integration/failover_proxy.py) or called directly, on 127.0.0.1.

Every session of these tests is one of SESSIONS scripted sessions (greedy or seeded sampling, a
short prompt and TOKENS new tokens per call), and every call's tokens, text and position must equal
the same call of the same session on one server with the in-memory store (`reference`; batch-
invariant decode makes them independent of batching), wherever the call lands:

- replicas: two replicas behind the proxy continue each other's sessions call by call; one SIGKILLed
  between calls, right after calls it acknowledged, loses nothing; both restarted, every session is
  still there; a replica killed mid-call holds its session until its lease expires, and the session
  then continues from its last acknowledged state; two Generates on one session at once through two
  replicas: exactly one runs, the other (and Export/Fork/Close meanwhile) is FAILED_PRECONDITION;
  the OpenAI-compatible routes continue sessions across replicas too, and a prompt one replica
  prefilled is a prefix-cache hit on the other (the cache's shared tier); a tenant's max_sessions
  holds over both replicas, with room again once a session is closed or expires;
- store: Redis SIGKILLed with an AOF (appendfsync always, and everysec after 1.5 s) and started
  again: every acknowledged session survives and the replicas reconnect by themselves; Redis paused
  or stopped: session calls answer UNAVAILABLE naming the store within the command timeout while
  stateless calls and health go on, and session calls work again once it is back; calls waiting
  for a paused store, more than either front end has I/O threads, hold up neither the HTTP health
  probe nor stateless calls on gRPC and HTTP, and 500 of them, far more than the admission threads,
  leave a stateless call's latency within 2x of its unloaded one; the flag combinations a replica
  refuses at startup.

The `shared_sessions_*` ctest tests (tests/integration/CMakeLists.txt) run them; server_end_to_end
leaves this file out."""
import itertools
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import tost_protos
from conftest import SOURCE_DIR, RunningServer
from failover_proxy import Cluster
from redis_server import RedisServer
from tost_harness import collect_generate, metric_value, scrape_metrics, wait_for_metric

pb2, pb2_grpc = tost_protos.tost()

MODEL = "tost-austen"
MODELS = os.path.join(SOURCE_DIR, "models")
SESSIONS = 32
CALLS = 5           # calls per session in the runs; the reference has EXTRA_CALLS more
EXTRA_CALLS = 3
TOKENS = 8          # max_new_tokens per call
CALL_TIMEOUT_S = 60
IDLE_TIMEOUT_S = 600
OPENINGS = ["It is a truth universally acknowledged", "Emma Woodhouse, handsome, clever, and rich",
            "The family of Dashwood had long been settled", "Sir Walter Elliot, of Kellynch Hall",
            "No one who had ever seen Catherine Morland", "About thirty years ago, Miss Maria Ward",
            "My dear Fanny, said her aunt", "Mr. Darcy walked off"]


# ------------------------------------------------------------------------------------------------
# The scripted sessions
# ------------------------------------------------------------------------------------------------

def sampling(i):
    """Even sessions greedy, odd ones seeded sampling (draws keyed by seed and position)."""
    return (pb2.SamplingParams(temperature=0.0) if i % 2 == 0
            else pb2.SamplingParams(temperature=0.8, top_p=0.95, seed=500 + i))


def prompt(i, k):
    return (f"{OPENINGS[i % len(OPENINGS)]} (session {i}), " if k == 0 else f" Then, {k}:").encode()


def create(stub, i):
    info = stub.CreateSession(pb2.CreateSessionRequest(model=MODEL, sampling=sampling(i)), timeout=CALL_TIMEOUT_S)
    assert info.position == 0 and info.model == MODEL
    return info.session_id


def advance(stub, session_id, i, k, max_new_tokens=TOKENS):
    """Call k of session i: (token ids, text, finish reason, position after)."""
    got = collect_generate(stub.Generate(pb2.GenerateRequest(session_id=session_id, prompt_bytes=prompt(i, k),
                                                             max_new_tokens=max_new_tokens), timeout=CALL_TIMEOUT_S))
    final = got.final
    assert final is not None and final.session_id == session_id
    return tuple(got.ids), got.text, final.finish_reason, final.position  # text: the tokens' and final.text


def for_each(n, fn, timeout_s=180):
    """fn(i) for i < n, each on its own thread (concurrent across i); their results. Fails the test
    naming each i whose call failed."""
    results, errors = [None] * n, {}

    def run(i):
        try:
            results[i] = fn(i)
        except Exception as e:  # noqa: BLE001 - reported below
            errors[i] = e

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [i for i, t in enumerate(threads) if t.is_alive()]
    assert not stuck, f"sessions {stuck} did not finish within {timeout_s} s"
    assert not errors, f"{len(errors)} session(s) failed: " + "; ".join(
        f"{i}: {describe(e)}" for i, e in sorted(errors.items())[:5])
    return results


def describe(e):
    if isinstance(e, grpc.RpcError):
        return f"{e.code().name}: {e.details()}"
    return repr(e)


def check_calls(got, reference, first_call, label):
    """got[i][j] is call first_call + j of session i: each equals the reference's."""
    for i, calls in enumerate(got):
        for j, call in enumerate(calls):
            expected = reference[i][first_call + j]
            assert call == expected, (f"{label}: session {i}, call {first_call + j}: expected {expected}, got {call} "
                                      "(tokens, text, finish reason, position)")


# ------------------------------------------------------------------------------------------------
# Servers, metrics
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def reference(key_file):
    """Every scripted session's CALLS + EXTRA_CALLS calls on one server with the in-memory store
    (sessions concurrent, calls of a session one after the other)."""
    server = RunningServer(MODELS, [f"--session_key_file={key_file}", "--batch_invariant_decode"])
    try:
        with grpc.insecure_channel(server.address) as ch:
            stub = pb2_grpc.TostStub(ch)

            def run(i):
                sid = create(stub, i)
                return [advance(stub, sid, i, k) for k in range(CALLS + EXTRA_CALLS)]

            calls = for_each(SESSIONS, run)
    finally:
        assert server.stop() == 0
    for i, session in enumerate(calls):
        assert all(len(c[0]) > 0 for c in session), f"reference session {i} generated nothing in a call: {session}"
        positions = [c[3] for c in session]
        assert positions == sorted(set(positions)), f"reference session {i}: positions do not advance: {positions}"
    return calls


def store_args(redis, *extra, db=0):
    return [f"--session_store={redis.url(db)}", f"--session_idle_timeout_s={IDLE_TIMEOUT_S}", *extra]


def served_generates(replica):
    return metric_value(scrape_metrics(replica.server), "tost_requests_total", rpc="Generate", code="OK")


def stub_for(address):
    ch = grpc.insecure_channel(address)
    return ch, pb2_grpc.TostStub(ch)


def health(address):
    with grpc.insecure_channel(address) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


def check_store_layout(redis, session_ids, prefix="tost:", db=0, min_version=1):
    """Each session is a hash <prefix>s:<id> (blob, ver, owner, model) expiring within the idle
    timeout, and no lease is left."""
    keys = set(redis.keys(f"{prefix}s:*", db=db))
    assert keys == {f"{prefix}s:{sid}" for sid in session_ids}, \
        f"the store should hold exactly the {len(session_ids)} sessions: {sorted(keys)[:5]}..."
    assert redis.keys(f"{prefix}l:*", db=db) == [], "no lease should be left once every call has ended"
    for sid in session_ids[:4]:
        key = f"{prefix}s:{sid}"
        fields = set(redis.client_command("HKEYS", key, db=db).splitlines())
        assert {"blob", "ver", "owner", "model"} <= fields, f"{key}: fields {fields}"
        assert redis.client_command("HGET", key, "model", db=db) == MODEL
        assert int(redis.client_command("HGET", key, "ver", db=db)) >= min_version
        ttl_ms = int(redis.client_command("PTTL", key, db=db))
        assert 0 < ttl_ms <= IDLE_TIMEOUT_S * 1000, f"{key}: PTTL {ttl_ms}, expected (0, {IDLE_TIMEOUT_S * 1000}]"


def wait_session_calls_work(stubs, timeout_s=15):
    """Until CreateSession answers OK on each stub (the replica reached the store again); returns
    how many calls failed, and how, before."""
    failures = []
    for stub in stubs:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                create(stub, 0)
                break
            except grpc.RpcError as e:
                failures.append(f"{e.code().name}: {e.details()}")
                assert e.code() == grpc.StatusCode.UNAVAILABLE, f"UNAVAILABLE expected while reconnecting: {failures}"
                assert time.monotonic() < deadline, \
                    f"session calls should work again within {timeout_s} s of the store's return: {failures[-3:]}"
                time.sleep(0.1)
    return failures


# ------------------------------------------------------------------------------------------------
# Replicas
# ------------------------------------------------------------------------------------------------

def test_replicas_share_sessions_through_the_proxy(key_file, reference):
    with RedisServer() as redis, Cluster(MODELS, key_file, replicas=2, extra_args=store_args(redis)) as cluster:
        ch, stub = stub_for(cluster.proxy.address)
        with ch:
            def run(i):
                sid = create(stub, i)
                return sid, [advance(stub, sid, i, k) for k in range(CALLS)]

            t0 = time.monotonic()
            out = for_each(SESSIONS, run)
            seconds = time.monotonic() - t0
        check_calls([calls for _, calls in out], reference, 0, "through the proxy")
        served = [served_generates(r) for r in cluster.replicas]
        print(f"\n{SESSIONS} sessions x {CALLS} calls through nginx in {seconds:.2f} s; Generate calls served per "
              f"replica: {served}")
        assert sum(served) == SESSIONS * CALLS
        assert all(s > 0 for s in served), f"both replicas should serve session calls: {served}"
        for r in cluster.replicas:
            assert metric_value(scrape_metrics(r.server), "tost_session_store_commands_total", outcome="ok") > 0
            assert metric_value(scrape_metrics(r.server), "tost_session_store_commands_total", outcome="error") == 0
            assert metric_value(scrape_metrics(r.server), "tost_session_store_command_duration_seconds_count") > 0
        check_store_layout(redis, [sid for sid, _ in out], min_version=CALLS)


def test_replicas_sigkill_after_acknowledged_calls_then_restart_both(key_file, reference):
    with RedisServer() as redis, Cluster(MODELS, key_file, replicas=2, extra_args=store_args(redis)) as cluster:
        victim, survivor = cluster.replicas
        ch, stub = stub_for(cluster.proxy.address)
        vch, victim_stub = stub_for(victim.address)
        with ch, vch:
            ids = for_each(SESSIONS, lambda i: create(stub, i))
            first = for_each(SESSIONS, lambda i: [advance(stub, ids[i], i, 0)])
            # Call 1 of every session on the victim itself, acknowledged; then it dies.
            second = for_each(SESSIONS, lambda i: [advance(victim_stub, ids[i], i, 1)])
            victim.kill()
            rest = for_each(SESSIONS, lambda i: [advance(stub, ids[i], i, k) for k in range(2, CALLS)])
        check_calls(first, reference, 0, "before the kill")
        check_calls(second, reference, 1, "on the victim")
        check_calls(rest, reference, 2, "after the victim's SIGKILL")

        # Both stopped and started again at their addresses: the sessions live in the store.
        assert survivor.stop() == 0, "the surviving replica should exit cleanly on SIGTERM"
        victim.start()
        survivor.start()
        ch, stub = stub_for(cluster.proxy.address)
        with ch:
            again = for_each(SESSIONS, lambda i: [advance(stub, ids[i], i, CALLS)])
        check_calls(again, reference, CALLS, "after both replicas restarted")
        check_store_layout(redis, ids, min_version=CALLS + 1)


def test_replicas_a_call_cut_by_sigkill_holds_its_session_until_the_lease_expires(key_file, reference):
    lease_ms = 2000
    with RedisServer() as redis, Cluster(MODELS, key_file, replicas=2,
                                         extra_args=store_args(redis, f"--session_lease_ms={lease_ms}")) as cluster:
        victim, survivor = cluster.replicas
        vch, victim_stub = stub_for(victim.address)
        sch, survivor_stub = stub_for(survivor.address)
        with vch, sch:
            sid = create(victim_stub, 0)
            acknowledged = advance(victim_stub, sid, 0, 0)
            assert acknowledged == reference[0][0]
            # A long call on the victim: killed once it has streamed a token (it holds the lease).
            stream = victim_stub.Generate(pb2.GenerateRequest(session_id=sid, prompt_bytes=b" Long:",
                                                              max_new_tokens=900), timeout=CALL_TIMEOUT_S)
            assert next(stream).HasField("token")
            victim.kill()
            killed_at = time.monotonic()
            with pytest.raises(grpc.RpcError):
                for _ in stream:
                    pass
            # The lease outlives the replica: the session is busy on the survivor ...
            with pytest.raises(grpc.RpcError) as e:
                advance(survivor_stub, sid, 0, 1)
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, describe(e.value)
            assert "in use by another Generate" in e.value.details()
            # ... until it expires; the session is then at its last acknowledged state.
            while True:
                try:
                    call = advance(survivor_stub, sid, 0, 1)
                    break
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, describe(e)
                    assert time.monotonic() - killed_at < lease_ms / 1000 + 3, \
                        f"the lease of a killed replica should expire within {lease_ms} ms: {describe(e)}"
                    time.sleep(0.05)
            freed_after = time.monotonic() - killed_at
        print(f"\nsession free again {freed_after:.2f} s after its replica's SIGKILL (lease {lease_ms} ms)")
        assert call == reference[0][1], "the session should continue from its last acknowledged call"


def generate_outcome(stub, sid, max_new_tokens, barrier=None, hold_s=0.0):
    """('ok', position) or (code, details) of one Generate on the session. With hold_s, the client
    reads nothing for that long after its first message: a stream whose client does not read
    pauses (a few tokens buffered), so the call holds its session at least that long."""
    if barrier is not None:
        barrier.wait()
    try:
        stream = stub.Generate(pb2.GenerateRequest(session_id=sid, max_new_tokens=max_new_tokens),
                               timeout=CALL_TIMEOUT_S)
        if hold_s:
            first = next(stream)
            time.sleep(hold_s)
            stream = itertools.chain([first], stream)
        return "ok", collect_generate(stream).final.position
    except grpc.RpcError as e:
        return e.code(), e.details()


def position(stub, sid):
    return stub.ExportSession(pb2.SessionRef(session_id=sid), timeout=CALL_TIMEOUT_S).session.position


def test_replicas_two_generates_on_one_session_one_wins(key_file, reference):
    with RedisServer() as redis, Cluster(MODELS, key_file, replicas=2, extra_args=store_args(redis)) as cluster:
        a, b = cluster.replicas
        ach, stub_a = stub_for(a.address)
        bch, stub_b = stub_for(b.address)
        with ach, bch:
            sid = create(stub_a, 0)
            assert advance(stub_a, sid, 0, 0) == reference[0][0]
            start = position(stub_b, sid)
            assert start == reference[0][0][3]

            # A Generate in flight on A (one token read, the rest left unread): B refuses every
            # call that would read or change the session meanwhile; so does A itself.
            stream = stub_a.Generate(pb2.GenerateRequest(session_id=sid, max_new_tokens=300), timeout=CALL_TIMEOUT_S)
            assert next(stream).HasField("token")
            assert redis.keys("tost:l:*") == [f"tost:l:{sid}"], "the running Generate should hold the session's lease"
            lease_ttl_ms = int(redis.client_command("PTTL", f"tost:l:{sid}"))
            assert 0 < lease_ttl_ms <= 10000, f"the lease should expire within --session_lease_ms: PTTL {lease_ttl_ms}"
            busy = {}
            for name, call in (
                    ("Generate on B", lambda: advance(stub_b, sid, 0, 1)),
                    ("Generate on A", lambda: advance(stub_a, sid, 0, 1)),
                    ("ExportSession on B", lambda: stub_b.ExportSession(pb2.SessionRef(session_id=sid), timeout=10)),
                    ("ForkSession on B", lambda: stub_b.ForkSession(pb2.SessionRef(session_id=sid), timeout=10)),
                    ("CloseSession on B", lambda: stub_b.CloseSession(pb2.SessionRef(session_id=sid), timeout=10))):
                with pytest.raises(grpc.RpcError) as e:
                    call()
                busy[name] = (e.value.code(), e.value.details())
            final = collect_generate(stream).final
            for name, (code, details) in busy.items():
                assert code == grpc.StatusCode.FAILED_PRECONDITION, f"{name} on a busy session: {code.name}: {details}"
            assert "in use by another Generate" in busy["Generate on B"][1], busy["Generate on B"]
            assert final.position == start + 300
            # Acknowledged: the next call on the other replica runs at once.
            assert generate_outcome(stub_b, sid, 10) == ("ok", start + 310)
            pos = start + 310

            # Two clients at once, one per replica: exactly one runs, the session advances once. Each
            # holds its stream half a second after its first token, so the two calls overlap
            # whatever the load.
            rounds = []
            for r in range(3):
                barrier = threading.Barrier(2)
                out = [None, None]
                threads = [threading.Thread(target=lambda j, s: out.__setitem__(j, generate_outcome(s, sid, 200, barrier, 0.5)),
                                            args=(j, s)) for j, s in enumerate((stub_a, stub_b))]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(CALL_TIMEOUT_S)
                winners = [o for o in out if o[0] == "ok"]
                losers = [o for o in out if o[0] != "ok"]
                rounds.append("AB"[out.index(winners[0])] if len(winners) == 1 else "?")
                assert len(winners) == 1, f"round {r}: exactly one of two concurrent Generates should run: {out}"
                assert losers[0][0] == grpc.StatusCode.FAILED_PRECONDITION, f"round {r}: {losers[0]}"
                assert "in use by another Generate" in losers[0][1], losers[0]
                assert winners[0][1] == pos + 200, f"round {r}: the winner should advance by its own call: {out}"
                pos += 200
                assert position(stub_a, sid) == pos == position(stub_b, sid), \
                    f"round {r}: the session should have advanced by one call's 200 tokens, to {pos}"
            print(f"\nconcurrent Generates on one session, winners by round: {rounds}")
        assert redis.keys("tost:l:*") == [], "no lease should be left"


# ------------------------------------------------------------------------------------------------
# The store
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("appendfsync", ["always", "everysec"])
def test_store_sigkill_of_redis_with_an_aof_loses_no_acknowledged_call(key_file, reference, appendfsync):
    n = 16
    password = "aof-test-password"
    db = 2
    with RedisServer(appendonly=True, appendfsync=appendfsync, requirepass=password) as redis, \
            Cluster(MODELS, key_file, replicas=2, extra_args=store_args(redis, db=db)) as cluster:
        channels = [stub_for(r.address) for r in cluster.replicas]
        stubs = [s for _, s in channels]
        try:
            # Calls alternate between the replicas: both hold connections to the store.
            ids = for_each(n, lambda i: create(stubs[i % 2], i))
            before = for_each(n, lambda i: [advance(stubs[(i + k) % 2], ids[i], i, k) for k in range(2)])
            check_calls(before, reference, 0, "before Redis' SIGKILL")
            check_store_layout(redis, ids, db=db, min_version=2)
            if appendfsync == "everysec":
                time.sleep(1.6)  # Redis writes the AOF out once a second
            redis.kill()

            # Down: a session call fails UNAVAILABLE at once (its message is checked last).
            _, down_message = unavailable_within(lambda: advance(stubs[0], ids[0], 0, 2), password=password)

            redis.start()
            failures = wait_session_calls_work(stubs)
            after = for_each(n, lambda i: [advance(stubs[(i + k) % 2], ids[i], i, k) for k in range(2, 4)])
            check_calls(after, reference, 2, f"after Redis' SIGKILL and restart (appendfsync {appendfsync})")
            reconnects = [metric_value(scrape_metrics(r.server), "tost_session_store_reconnects_total")
                          for r in cluster.replicas]
            print(f"\nappendfsync {appendfsync}: {n} sessions survived Redis' SIGKILL; {len(failures)} calls failed "
                  f"before the replicas reached it again; reconnects per replica {reconnects}")
            assert all(x > 0 for x in reconnects), f"each replica should count its reconnection: {reconnects}"
            assert all(r.alive() and r.starts == 1 for r in cluster.replicas), "no replica should have restarted"
            check_messages_name_the_store([("Generate(session_id) with Redis down", down_message)], redis, db)
        finally:
            for ch, _ in channels:
                ch.close()


def unavailable_within(call, limit_s=3.0, password=None):
    """`call` fails UNAVAILABLE within limit_s, its message without the store's password; returns
    the seconds it took and the message."""
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        call()
    seconds = time.monotonic() - t0
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE, describe(e.value)
    assert seconds < limit_s, f"UNAVAILABLE took {seconds:.2f} s (store timeout 300 ms)"
    if password:
        assert password not in e.value.details(), f"the message shows the store's password: {e.value.details()}"
    return seconds, e.value.details()


def check_messages_name_the_store(messages, redis, db=0):
    """Each UNAVAILABLE message ([(what, message)]) names the store by its flag, not by its address
    (the server's log has that). Checked at the end of a test, so that what else it checks has run."""
    for what, message in messages:
        assert "the session store (--session_store)" in message, f"{what}: the message should name the store: {message!r}"
        assert redis.display_url(db) not in message and redis.address not in message, \
            f"{what}: the message should not say where the store is: {message!r}"


def test_store_down_fails_session_calls_fast_and_keeps_the_rest_serving(key_file, reference, tmp_path):
    password = "store-down-password"
    password_file = tmp_path / "redis.password"
    password_file.write_text(password)
    prefix = "e2e-down:"
    lease_ms = 1000
    with RedisServer(appendonly=True, requirepass=password) as redis:
        server = RunningServer(MODELS, [
            f"--session_key_file={key_file}", "--batch_invariant_decode",
            f"--session_store={redis.url(password=False)}", f"--session_store_password_file={password_file}",
            "--session_store_timeout_ms=300", f"--session_lease_ms={lease_ms}",
            f"--session_store_key_prefix={prefix}", f"--session_idle_timeout_s={IDLE_TIMEOUT_S}"])
        try:
            ch, stub = stub_for(server.address)
            with ch:
                sid = create(stub, 0)
                assert advance(stub, sid, 0, 0) == reference[0][0]
                assert redis.keys(f"{prefix}s:*") == [f"{prefix}s:{sid}"]
                _, stateless = advance_stateless(stub, return_state=True)
                blob = stateless.state
                assert blob
                k = 1
                messages = []
                for outage in ("pause", "stop"):
                    victim_of_close = create(stub, 1)
                    errors_before = metric_value(scrape_metrics(server), "tost_session_store_commands_total",
                                                 outcome="error")
                    if outage == "pause":
                        redis.pause()
                    else:
                        redis.stop()
                    took = {name: unavailable_within(call, password=password) for name, call in (
                        ("CreateSession", lambda: create(stub, 0)),
                        ("Generate(session_id)", lambda: advance(stub, sid, 0, 9)),
                        ("ForkSession", lambda: stub.ForkSession(pb2.SessionRef(session_id=sid), timeout=10)),
                        ("ExportSession", lambda: stub.ExportSession(pb2.SessionRef(session_id=sid), timeout=10)),
                        ("CloseSession",
                         lambda: stub.CloseSession(pb2.SessionRef(session_id=victim_of_close), timeout=10)))}
                    messages += [(f"{name} with Redis {outage}", message) for name, (_, message) in took.items()]
                    # What needs no store goes on.
                    tokens, _ = advance_stateless(stub)
                    assert tokens
                    tokens, final = advance_stateless(stub, state=blob)
                    assert tokens and final.state
                    assert health(server.address) == health_pb2.HealthCheckResponse.SERVING
                    errors = metric_value(scrape_metrics(server), "tost_session_store_commands_total",
                                          outcome="error") - errors_before
                    assert errors > 0, "tost_session_store_commands_total{outcome=\"error\"} should rise"
                    print(f"\nRedis {outage}: UNAVAILABLE after " +
                          ", ".join(f"{name} {s * 1000:.0f} ms" for name, (s, _) in took.items()) +
                          f"; {errors:g} store errors counted")

                    if outage == "pause":
                        redis.resume()
                    else:
                        redis.start()
                    # Back: the session continues where it was (a lease a refused Generate took
                    # while the store was paused may hold it for up to lease_ms).
                    deadline = time.monotonic() + lease_ms / 1000 + 10
                    while True:
                        try:
                            call = advance(stub, sid, 0, k)
                            break
                        except grpc.RpcError as e:
                            assert e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION), \
                                describe(e)
                            assert time.monotonic() < deadline, f"session calls should work again: {describe(e)}"
                            time.sleep(0.1)
                    assert call == reference[0][k], \
                        f"after the {outage}: the session should continue from its last call: {call}"
                    assert position(stub, sid) == call[3]
                    k += 1
                    create(stub, 0)
                assert metric_value(scrape_metrics(server), "tost_session_store_reconnects_total") > 0
                assert health(server.address) == health_pb2.HealthCheckResponse.SERVING
                check_messages_name_the_store(messages, redis)
        finally:
            assert server.stop() == 0


def test_store_paused_holds_up_no_call_that_needs_none(key_file):
    """Admission (a session's checkout from the store among it) runs on handler threads, not on
    gRPC's callback threads nor the HTTP server's I/O threads: while Generate(session_id) calls and
    OpenAI session requests wait for a paused Redis, more of them than either front end has I/O
    threads, the HTTP health probe, a stateless OpenAI completion, a stateless Generate and gRPC
    health each answer in a fraction of the store's timeout; the waiting calls then fail UNAVAILABLE
    and session calls work again once the store is back."""
    import openai

    timeout_ms = 4000
    quick_s = 1.5  # well under the store's timeout: nothing waited for it
    waiting_grpc, waiting_http = 8, 6
    with RedisServer() as redis, RunningServer(MODELS, [
            f"--session_key_file={key_file}", *store_args(redis, f"--session_store_timeout_ms={timeout_ms}")]) as server:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="unused",
                               max_retries=0, timeout=CALL_TIMEOUT_S)
        ch, stub = stub_for(server.address)
        with ch:
            # One session each: calls on a session that is checked out fail at once, store or not.
            sids = [create(stub, i) for i in range(waiting_grpc + waiting_http)]
            # The client's first call takes it a second (imports, its platform headers): paid here,
            # not while the store is paused.
            client.models.list()
            outcomes = {}

            def session_call(i):
                t0 = time.monotonic()
                try:
                    if i < waiting_grpc:
                        advance(stub, sids[i], i, 1)
                        outcomes[i] = ("ok", time.monotonic() - t0)
                    else:
                        client.completions.create(model=MODEL, prompt="Then,", max_tokens=TOKENS,
                                                  extra_body={"session_id": sids[i]})
                        outcomes[i] = ("ok", time.monotonic() - t0)
                except grpc.RpcError as e:
                    outcomes[i] = (e.code().name, time.monotonic() - t0)
                except openai.APIStatusError as e:
                    outcomes[i] = (e.status_code, time.monotonic() - t0)

            redis.pause()
            try:
                threads = [threading.Thread(target=session_call, args=(i,), daemon=True)
                           for i in range(waiting_grpc + waiting_http)]
                for t in threads:
                    t.start()
                # Every one of them is in its admission, waiting for the store.
                wait_for_metric(server, "tost_admissions", lambda v: v == waiting_grpc + waiting_http,
                                timeout_s=2, pool="store", state="running")
                took = {}

                def timed(name, call):
                    t0 = time.monotonic()
                    call()
                    took[name] = time.monotonic() - t0

                def http_live():
                    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/v1/health/live",
                                                timeout=CALL_TIMEOUT_S) as r:
                        assert r.status == 200

                timed("GET /v1/health/live", http_live)
                def stateless_completion():
                    # On a connection of its own (the client's pooled ones are the waiting calls').
                    # Its prefix-cache lookup in the store gives up after the shared tier's 200 ms.
                    body = json.dumps({"model": MODEL, "prompt": "Stateless,", "max_tokens": TOKENS}).encode()
                    request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v1/completions", data=body,
                                                     headers={"Content-Type": "application/json"})
                    with urllib.request.urlopen(request, timeout=CALL_TIMEOUT_S) as r:
                        assert json.loads(r.read())["choices"][0]["text"]

                timed("stateless /v1/completions", stateless_completion)
                timed("stateless Generate", lambda: advance_stateless(stub))
                timed("gRPC health", lambda: health(server.address))
                still_waiting = sum(t.is_alive() for t in threads)
                admitting = metric_value(scrape_metrics(server), "tost_admissions", pool="store", state="running")
                for t in threads:
                    t.join(timeout_ms / 1000 + 10)
            finally:
                redis.resume()
            print(f"\nwhile {waiting_grpc} Generate(session_id) and {waiting_http} OpenAI session requests "
                  "waited for the paused store: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in took.items()))
            slow = {k: round(v, 2) for k, v in took.items() if v >= quick_s}
            assert not slow, f"calls that need no store waited for it (s; its timeout is {timeout_ms} ms): {slow}"
            assert still_waiting == waiting_grpc + waiting_http, \
                f"only {still_waiting} session calls were still waiting for the store when the others were timed"
            assert admitting == waiting_grpc + waiting_http, \
                f"tost_admissions{{pool=\"store\",state=\"running\"}} should count the calls waiting for the store: {admitting}"
            assert sorted(outcomes) == list(range(waiting_grpc + waiting_http)), f"calls did not end: {outcomes}"
            assert all(outcomes[i][0] == "UNAVAILABLE" for i in range(waiting_grpc)), outcomes
            assert all(outcomes[i][0] == 503 for i in range(waiting_grpc, waiting_grpc + waiting_http)), outcomes
            wait_session_calls_work([stub])


def test_store_paused_500_session_calls_leave_stateless_latency_alone(key_file):
    """Admission runs on two pools: calls that touch the store (a session's checkout, a stored
    response read, the session RPCs) on one, calls that need none on the other. With 500 of the
    first kind stuck on a paused Redis (Generate(session_id) and ExportSession on gRPC, session
    completions and previous_response_id responses on HTTP), far more than either pool has
    threads, a stateless Generate and a stateless completion keep their unloaded latency within
    2x (medians, the unloaded one measured just before the pause); once Redis is back every stuck
    call ends and session calls work again. On one shared pool the stateless calls waited for the
    store's timeout (30 s here: past their 10 s deadline). A round whose ratio another process's
    load spoils (the unloaded and loaded figures are taken a second apart) is run again, up to
    3 rounds: calls that wait behind the store fail every one (and a stateless call that waits for
    seconds fails the test at once)."""
    timeout_ms = 30_000  # the stuck calls wait for the store past the measurement
    grpc_generates, grpc_exports, http_completions, http_responses = 440, 20, 25, 15
    stuck = grpc_generates + grpc_exports + http_completions + http_responses
    assert stuck == 500
    samples = 11
    rounds = 3
    stateless_tokens = 32  # a few ms of decoding: scheduling noise is small beside it
    local = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own per channel
    with RedisServer() as redis, RunningServer(MODELS, [
            f"--session_key_file={key_file}", "--max_queued_generations=1024",
            *store_args(redis, f"--session_store_timeout_ms={timeout_ms}")]) as server:
        busy = grpc.insecure_channel(server.address, options=local)
        quiet = grpc.insecure_channel(server.address, options=local)
        with busy, quiet:
            stub, quiet_stub = pb2_grpc.TostStub(busy), pb2_grpc.TostStub(quiet)
            creates = [stub.CreateSession.future(pb2.CreateSessionRequest(model=MODEL, sampling=sampling(i)),
                                                 timeout=CALL_TIMEOUT_S)
                       for i in range(grpc_generates + grpc_exports + http_completions)]
            sids = [f.result().session_id for f in creates]

            def stateless_generate():
                got = collect_generate(quiet_stub.Generate(
                    pb2.GenerateRequest(model=MODEL, prompt_bytes=b"Stateless, ", max_new_tokens=stateless_tokens),
                    timeout=10))
                assert got.final is not None and got.final.generated_tokens > 0

            def http_post(path, body, timeout_s):
                # A connection of its own each (urllib opens one per request).
                request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}{path}",
                                                 data=json.dumps(body).encode(),
                                                 headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(request, timeout=timeout_s) as r:
                        return r.status, json.loads(r.read())
                except urllib.error.HTTPError as e:
                    return e.code, None

            def stateless_completion():
                code, body = http_post("/v1/completions",
                                       {"model": MODEL, "prompt": "Stateless,", "max_tokens": stateless_tokens}, 10)
                assert code == 200 and body["choices"][0]["text"], (code, body)

            def latencies(call):
                took = []
                for _ in range(samples):
                    t0 = time.monotonic()
                    try:
                        call()
                    except (grpc.RpcError, OSError) as e:  # past its 10 s deadline: counted as such
                        took.append(time.monotonic() - t0)
                        print(f"\n  a stateless call failed after {took[-1]:.1f} s: {e}")
                        break  # the others would wait as long
                    took.append(time.monotonic() - t0)
                return took

            def median(xs):
                return sorted(xs)[len(xs) // 2]

            def show(xs):
                return f"{median(xs) * 1000:.1f} ms ({', '.join(f'{s * 1000:.0f}' for s in xs)})"

            calls = {"stateless Generate": stateless_generate, "stateless /v1/completions": stateless_completion}
            for call in calls.values():
                call()  # warm: the first calls' one-off costs are no part of the latency

            def one_round():
                """Unloaded latencies, then the same with the 500 calls stuck; the stuck calls'
                outcomes once the store is back."""
                unloaded = {name: latencies(call) for name, call in calls.items()}
                outcomes = {}

                def http_session_call(i):
                    if i < http_completions:
                        body = {"model": MODEL, "prompt": "Then,", "max_tokens": 1,
                                "session_id": sids[grpc_generates + grpc_exports + i]}
                        outcomes[("http", i)] = http_post("/v1/completions", body, CALL_TIMEOUT_S)[0]
                    else:
                        # An id the store is asked about (unknown: 404 once the store answers).
                        body = {"model": MODEL, "input": "Then,", "max_output_tokens": 1,
                                "previous_response_id": f"resp_{i:032x}"}
                        outcomes[("http", i)] = http_post("/v1/responses", body, CALL_TIMEOUT_S)[0]

                redis.pause()
                try:
                    generates = [stub.Generate(pb2.GenerateRequest(session_id=sids[i], prompt_bytes=b" Then,",
                                                                   max_new_tokens=1), timeout=CALL_TIMEOUT_S)
                                 for i in range(grpc_generates)]
                    exports = [stub.ExportSession.future(pb2.SessionRef(session_id=sids[grpc_generates + i]),
                                                         timeout=CALL_TIMEOUT_S)
                               for i in range(grpc_exports)]
                    threads = [threading.Thread(target=http_session_call, args=(i,), daemon=True)
                               for i in range(http_completions + http_responses)]
                    for t in threads:
                        t.start()
                    # Every generation call is in its admission (a thread's or the queue's), waiting
                    # for the store.
                    admitting = wait_for_metric(server, "tost_admissions", lambda v: v >= stuck - grpc_exports,
                                                timeout_s=20,
                                                message="the session calls should all wait for the store")
                    loaded = {name: latencies(call) for name, call in calls.items()}
                    still_waiting = (sum(not g.done() for g in generates) + sum(not f.done() for f in exports) +
                                     sum(t.is_alive() for t in threads))
                finally:
                    redis.resume()
                print(f"\n{stuck} session calls waiting for the paused store ({admitting:g} in admission):")
                for name in calls:
                    print(f"  {name}: unloaded median {show(unloaded[name])}, loaded median {show(loaded[name])}")
                assert still_waiting == stuck, \
                    f"only {still_waiting} of the {stuck} session calls still waited for the store when timed"
                # The store is back: every stuck call ends, as the store answers it.
                for g in generates:
                    got = collect_generate(g, capture_error=True)
                    outcomes[("generate", id(g))] = "OK" if got.error is None else got.error.code().name
                for f in exports:
                    outcomes[("export", id(f))] = "OK" if f.exception() is None else f.exception().code().name
                for t in threads:
                    t.join(CALL_TIMEOUT_S)
                counts = {}
                for outcome in outcomes.values():
                    counts[outcome] = counts.get(outcome, 0) + 1
                print(f"  once the store was back: {counts}")
                assert len(outcomes) == stuck, f"calls did not end: {stuck - len(outcomes)}"
                assert counts.get("OK", 0) == grpc_generates + grpc_exports, counts
                assert counts.get(200, 0) == http_completions and counts.get(404, 0) == http_responses, counts
                return {name: (round(median(unloaded[name]), 4), round(median(loaded[name]), 4)) for name in calls
                        if median(loaded[name]) > 2 * median(unloaded[name])}

            slow, run = {}, 0
            while run < rounds:
                run += 1
                slow = one_round()
                # Seconds are no other process's noise: the calls waited for the store.
                if not slow or any(loaded >= 5 for _, loaded in slow.values()):
                    break
            assert not slow, f"stateless calls waited behind the store-bound ones in each of {run} round(s) " \
                             f"(median s, unloaded, loaded; the last round's): {slow}"
            wait_session_calls_work([quiet_stub])


def advance_stateless(stub, state=b"", return_state=False):
    """A Generate with no session: a fresh prompt, or the continuation of a state blob."""
    request = (pb2.GenerateRequest(state=state, max_new_tokens=TOKENS) if state else
               pb2.GenerateRequest(model=MODEL, prompt_bytes=b"Stateless, ", max_new_tokens=TOKENS,
                                   return_state=return_state))
    got = collect_generate(stub.Generate(request, timeout=CALL_TIMEOUT_S))
    return got.ids, got.final


def server_refuses(*args):
    """Runs tost_server with `args` (and a repository, local ports off); its exit status and
    output, which must come without it serving."""
    binary = os.environ.get("TOST_SERVER_BIN")
    if not binary or not os.path.exists(binary):
        pytest.fail("TOST_SERVER_BIN must point at the built binary (run through ctest)")
    out = subprocess.run([binary, f"--model_repository={MODELS}", "--host=127.0.0.1", "--port=0",
                          "--metrics_port=-1", "--http_port=-1", *args],
                         capture_output=True, text=True, timeout=60)
    assert "listening on" not in out.stdout, f"tost_server {args} should refuse to start: {out.stdout}"
    return out.returncode, out.stdout + out.stderr


def test_store_flags_a_replica_refuses_at_startup(key_file, tmp_path):
    password_file = tmp_path / "pw"
    password_file.write_text("x")
    empty_password = tmp_path / "empty"
    empty_password.write_text("\n")
    free = RedisServer(start=False)  # a port nothing listens on
    try:
        # A good configuration starts although its store is down (session calls then fail), so
        # the refusals below are the flags' doing, not the flags being unknown.
        with RunningServer(MODELS, [f"--session_key_file={key_file}", f"--session_store={free.url()}",
                                    "--session_store_timeout_ms=200"]) as server:
            assert health(server.address) == health_pb2.HealthCheckResponse.SERVING
            ch, stub = stub_for(server.address)
            with ch:
                _, message = unavailable_within(lambda: create(stub, 0))
            assert server.stop() == 0
            check_messages_name_the_store([("CreateSession with no Redis", message)], free)

        cases = [
            ([f"--session_store={free.url()}"], "session_key_file"),
            ([f"--session_key_file={key_file}", "--session_store=rediss://x:1"], "session_store"),
            ([f"--session_key_file={key_file}", "--session_store=memory",
              f"--session_store_password_file={password_file}"], "session_store"),
            ([f"--session_key_file={key_file}", f"--session_store={free.url()}", "--session_lease_ms=50"],
             "session_lease_ms"),
            # The store's password file missing or empty: named, before anything is served.
            ([f"--session_key_file={key_file}", f"--session_store={free.url()}",
              f"--session_store_password_file={tmp_path / 'missing'}"], "missing"),
            ([f"--session_key_file={key_file}", f"--session_store={free.url()}",
              f"--session_store_password_file={empty_password}"], "session_store_password_file"),
            # A session must not expire in the store while a replica holds its lease.
            ([f"--session_key_file={key_file}", f"--session_store={free.url()}", "--session_idle_timeout_s=5",
              "--session_lease_ms=6000"], "must be at least --session_lease_ms"),
        ]
        for args, named in cases:
            code, output = server_refuses(*args)
            assert code != 0, f"tost_server {args} should exit non-zero: {output}"
            assert named in output, f"tost_server {args}: the refusal should name --{named}: {output}"
            assert "Unknown command line flag" not in output, output
    finally:
        free.close()


def test_store_that_refuses_the_credentials_stops_the_start(key_file, tmp_path):
    """A store that answers and refuses the server's credentials at start-up stops the start, with
    the reason naming --session_store (and the password file when the password came from one): a
    replica that started would report SERVING, take traffic, and fail every session call. A store
    that cannot be reached at start-up, down or not answering, does not stop it (the store may be
    down at start-up); nor does the right password."""
    right, wrong = "right-password-5e1", "wrong-password-9c4"
    wrong_file = tmp_path / "wrong.password"
    wrong_file.write_text(wrong + "\n")
    acl = ["user tost on >acl-right-password-77 ~* &* +@all"]
    with RedisServer(requirepass=right, config=acl) as redis:
        cases = [
            ("a wrong password in the URL",
             [f"--session_store=redis://default:{wrong}@{redis.address}/0"], "--session_store"),
            ("a wrong password in the password file",
             [f"--session_store={redis.url(password=False)}", f"--session_store_password_file={wrong_file}"],
             f"--session_store_password_file {wrong_file}"),
            ("an ACL user's wrong password",
             [f"--session_store=redis://tost:{wrong}@{redis.address}/0"], "user 'tost'"),
            ("no password where the store requires one",
             [f"--session_store={redis.url(password=False)}"], "requires a password"),
        ]
        for what, args, named in cases:
            code, output = server_refuses(f"--session_key_file={key_file}", "--session_store_timeout_ms=2000",
                                          *args)
            assert code != 0, f"{what}: tost_server should exit non-zero: {output}"
            for fragment in ("--session_store", "refused", "authentication failed", redis.display_url(), named):
                assert fragment in output, f"{what}: the refusal should say {fragment!r}: {output}"
            assert wrong not in output and right not in output, f"{what}: the output shows a password: {output}"
            assert "loading models" not in output, f"{what}: refused after loading the models: {output}"

        # The same store with the right password: the start goes on, and sessions work.
        with RunningServer(MODELS, [f"--session_key_file={key_file}", *store_args(redis)]) as server:
            assert health(server.address) == health_pb2.HealthCheckResponse.SERVING
            ch, stub = stub_for(server.address)
            with ch:
                create(stub, 0)
            assert server.stop() == 0

        # Paused (connections accepted, nothing answered), it is an outage, not a refusal: the
        # start goes on within the store's timeout, SERVING, and session calls wait for its return.
        redis.pause()
        try:
            t0 = time.monotonic()
            with RunningServer(MODELS, [f"--session_key_file={key_file}", "--session_store_timeout_ms=300",
                                        *store_args(redis)]) as server:
                started_s = time.monotonic() - t0
                assert health(server.address) == health_pb2.HealthCheckResponse.SERVING
                with open(server.log.name) as f:
                    log = f.read()
                assert "not reached at start-up" in log and redis.display_url() in log, log
                redis.resume()
                ch, stub = stub_for(server.address)
                with ch:
                    wait_session_calls_work([stub])
                assert server.stop() == 0
            print(f"\nstarted in {started_s:.1f} s with the store paused")
        finally:
            redis.resume()


def test_replicas_share_openai_sessions_and_the_prefix_cache(key_file):
    """The OpenAI-compatible routes continue a session another replica advanced (the session's new
    state is stored before the response ends), and a prompt one replica prefilled is a prefix-cache
    hit on the other (the shared tier in the store)."""
    import openai

    with RedisServer() as redis:
        args = [f"--session_key_file={key_file}", *store_args(redis)]
        with RunningServer(MODELS, args) as a, RunningServer(MODELS, args) as b:
            clients = [openai.OpenAI(base_url=f"http://127.0.0.1:{s.http_port}/v1", api_key="unused",
                                     max_retries=0, timeout=CALL_TIMEOUT_S) for s in (a, b)]
            ch, stub = stub_for(a.address)
            with ch:
                sid = create(stub, 0)
                positions = []
                for k in range(4):  # A, B, A, B
                    done = clients[k % 2].completions.create(
                        model=MODEL, prompt=prompt(0, k).decode(), max_tokens=TOKENS, seed=1,
                        extra_body={"session_id": sid})
                    assert done.model_extra["session_id"] == sid
                    assert done.choices[0].text, done
                    positions.append(position(stub, sid))
                assert positions == sorted(set(positions)), f"each call advances the session: {positions}"
                assert metric_value(scrape_metrics(a), "tost_http_requests_total", route="/v1/completions", code="200") == 2
                assert metric_value(scrape_metrics(b), "tost_http_requests_total", route="/v1/completions", code="200") == 2

                # A long prompt, prefilled on A only (a stateless call).
                long_prompt = (" ".join(OPENINGS) * 3).encode()
                final = collect_generate(stub.Generate(pb2.GenerateRequest(model=MODEL, prompt_bytes=long_prompt,
                                                                           max_new_tokens=2),
                                                       timeout=CALL_TIMEOUT_S)).final
                assert final.cached_tokens == 0
            # Entries reach the store asynchronously.
            deadline = time.monotonic() + 10
            while not redis.keys("tost:p:*") and time.monotonic() < deadline:
                time.sleep(0.05)
            assert redis.keys("tost:p:*"), "replica A published no prefix-cache entry to the store"
            ch, stub = stub_for(b.address)
            with ch:
                final = collect_generate(stub.Generate(pb2.GenerateRequest(model=MODEL,
                                                                           prompt_bytes=long_prompt + b" More.",
                                                                           max_new_tokens=2),
                                                       timeout=CALL_TIMEOUT_S)).final
            assert final.cached_tokens >= 64, f"B should start from A's prefill: {final}"
            assert metric_value(scrape_metrics(b), "tost_prefix_cache_shared_hits_total", model=MODEL) >= 1


def test_replicas_hold_a_tenants_session_quota_together(key_file, tmp_path):
    """A tenant's max_sessions holds over both replicas of one store: the third of max_sessions=2,
    on either replica, is RESOURCE_EXHAUSTED naming the quota; closing a session on one replica
    gives room on the other, an expired one gives room back by itself, and another tenant is not
    limited. (Sessions are created over gRPC only: no HTTP route creates one.)"""
    key_a, key_b = "quota-tenant-a-0123456789", "quota-tenant-b-0123456789"
    keys = tmp_path / "keys.txt"
    keys.write_text(f"a {key_a} max_sessions=2\nb {key_b}\n")
    md_a, md_b = (("x-api-key", key_a),), (("x-api-key", key_b),)
    with RedisServer() as redis:
        args = [f"--session_key_file={key_file}", f"--api_keys_file={keys}", f"--session_store={redis.url(0)}",
                "--session_idle_timeout_s=3", "--session_lease_ms=1000"]
        with RunningServer(MODELS, args) as a, RunningServer(MODELS, args) as b:
            cha, stub_a = stub_for(a.address)
            chb, stub_b = stub_for(b.address)
            with cha, chb:
                first = stub_a.CreateSession(pb2.CreateSessionRequest(model=MODEL), metadata=md_a).session_id
                stub_b.CreateSession(pb2.CreateSessionRequest(model=MODEL), metadata=md_a)
                for stub in (stub_a, stub_b):
                    with pytest.raises(grpc.RpcError) as e:
                        stub.CreateSession(pb2.CreateSessionRequest(model=MODEL), metadata=md_a)
                    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value
                    assert 'tenant "a": quota max_sessions=2 reached (2 sessions held)' in e.value.details()
                for _ in range(3):
                    stub_b.CreateSession(pb2.CreateSessionRequest(model=MODEL), metadata=md_b)
                # A Generate on the session through the other replica keeps it counted once.
                got = collect_generate(stub_b.Generate(pb2.GenerateRequest(session_id=first, prompt_bytes=b"Hi",
                                                                           max_new_tokens=2), metadata=md_a))
                assert len(got.tokens) == 2
                with pytest.raises(grpc.RpcError) as e:
                    stub_a.CreateSession(pb2.CreateSessionRequest(model=MODEL), metadata=md_a)
                assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                stub_b.CloseSession(pb2.SessionRef(session_id=first), metadata=md_a)
                stub_a.CreateSession(pb2.CreateSessionRequest(model=MODEL), metadata=md_a)
                with pytest.raises(grpc.RpcError) as e:
                    stub_b.CreateSession(pb2.CreateSessionRequest(model=MODEL), metadata=md_a)
                assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                # Both of a's sessions expire (3 s idle): room again, with no replica's help.
                time.sleep(4)
                stub_b.CreateSession(pb2.CreateSessionRequest(model=MODEL), metadata=md_a)
                stub_a.CreateSession(pb2.CreateSessionRequest(model=MODEL), metadata=md_a)
            assert metric_value(scrape_metrics(a), "tost_tenant_quota_refusals_total", tenant="a",
                                quota="max_sessions") >= 1
