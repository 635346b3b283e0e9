"""Constrained generation end to end on the shipped tost-austen model: sampled outputs (temperature
1, no top-k) under the ten JSON schemas of constrained_schemas.py, any JSON object, a regex, a
grammar and a choice list; every output that ends with end-of-text parses with the strict
json.loads (control characters refused) and validates with jsonschema, or matches; alternatives
reported are allowed ones. Bad constraints get INVALID_ARGUMENT with the compiler's words. Sessions, forks and state blobs cut mid-structure
carry the constraint's progress: continued call after call, forked, or resumed on a second
replica, the joined output still validates. Compiles are bounded: one caller's slow compiles leave
another's compiling, are stopped at --constraint_compile_kill_ms in their worker processes, and
hostile shapes are refused within a second over gRPC and HTTP."""
import http.client
import json
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from conftest import SOURCE_DIR, RunningServer, generator_status, proc_status
from constrained_schemas import SCHEMAS, check_output
from tost_harness import collect_generate, metric_value, scrape_metrics

MODEL = "tost-austen"
MODELS = os.path.join(SOURCE_DIR, "models")
SEEDS = range(20)
MAX_NEW_TOKENS = 256


@pytest.fixture(scope="module")
def api(proto_modules):
    pb2, pb2_grpc = proto_modules
    with RunningServer(MODELS) as srv, grpc.insecure_channel(srv.address) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        yield pb2, pb2_grpc.TostStub(channel)


def generate(api, constraint, seed, prompt=b"Her answer, written plainly:", **kw):
    """(output text, GenerateFinal, token messages) of one sampled constrained generation."""
    pb2, stub = api
    sampling = kw.pop("sampling", pb2.SamplingParams(temperature=1.0, top_k=0, seed=seed))
    metadata = kw.pop("metadata", None)
    request = pb2.GenerateRequest(model=MODEL, prompt_bytes=prompt, max_new_tokens=kw.pop("max_new_tokens", MAX_NEW_TOKENS),
                                  sampling=sampling, **kw)
    if constraint is not None:
        request.constraint.CopyFrom(constraint)
    got = collect_generate(stub.Generate(request, timeout=300, metadata=metadata))
    return got.output_bytes.decode("utf-8"), got.final, got.tokens


def generate_compiled(api, constraint, seed, timeout_s=60, **kw):
    """generate(), retried as the server's RESOURCE_EXHAUSTED for a compile past
    --constraint_compile_timeout_ms tells a client to: the compile goes on in the background, and
    a retry finds it compiled. These constraints compile in a fraction of the bound alone; a loaded
    machine (other tests, the background compile of the one before) can stretch that past it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return generate(api, constraint, seed, **kw)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def run_seeds(api, constraint, seeds=SEEDS, **kw):
    with ThreadPoolExecutor(max_workers=len(seeds)) as pool:
        return list(pool.map(lambda seed: generate(api, constraint, seed, **kw), seeds))


def check_complete(api, results, check, min_complete=0.5):
    """Every output that ended with end-of-text passes `check`; at least `min_complete` of them did
    (the test has teeth), and the others were cut by max_new_tokens."""
    pb2, _ = api
    complete = 0
    for text, final, _ in results:
        assert final.finish_reason in (pb2.FINISH_REASON_EOS, pb2.FINISH_REASON_LENGTH), (final, text)
        if final.finish_reason == pb2.FINISH_REASON_EOS:
            check(text)
            complete += 1
        else:
            assert final.generated_tokens == MAX_NEW_TOKENS
    print(f"{complete} of {len(results)} outputs complete")
    assert complete >= min_complete * len(results), f"only {complete} of {len(results)} outputs completed"


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_outputs_parse_and_validate(api, name):
    pb2, _ = api
    schema = SCHEMAS[name]
    results = run_seeds(api, pb2.Constraint(json_schema=json.dumps(schema)))

    check_complete(api, results, lambda text: check_output(schema, text))
    assert len({text for text, _, _ in results}) > 1, "sampling with 20 seeds gave one output"


def test_json_object_outputs_are_objects(api):
    pb2, _ = api
    # Free keys and values: the model's prose runs on inside strings, so most outputs are cut by
    # max_new_tokens (a prefix of an object); the ones that end are objects.
    results = run_seeds(api, pb2.Constraint(json_object=True), seeds=range(8))
    check_complete(api, results, lambda text: isinstance(json.loads(text), dict) or pytest.fail(text),
                   min_complete=0)
    for text, _, _ in results:
        assert text.startswith("{"), text


def test_regex_grammar_and_choice_outputs_match(api):
    pb2, _ = api
    pattern = r"[A-Z][a-z]{2,8} (was|is) [0-9]{1,3}"
    results = run_seeds(api, pb2.Constraint(regex=pattern), seeds=range(10))
    check_complete(api, results, lambda text: re.fullmatch(pattern, text) or pytest.fail(text))

    grammar = 'root ::= ("Mr. " | "Miss ") name\nname ::= [A-Z] [a-z] [a-z]? [a-z]?'
    results = run_seeds(api, pb2.Constraint(grammar=grammar), seeds=range(10))
    check_complete(api, results,
                   lambda text: re.fullmatch(r"(Mr\. |Miss )[A-Z][a-z]{1,3}", text) or pytest.fail(text))

    choices = ["Elizabeth", "Mr. Darcy", "Jane Bennet", "\"quoted\" \\ choice"]
    results = run_seeds(api, pb2.Constraint(choice=pb2.ChoiceList(choices=choices)), seeds=range(10),
                        top_logprobs=5)
    check_complete(api, results, lambda text: text in choices or pytest.fail(text))
    for _, _, tokens in results:
        for token in tokens:
            # The constrained distribution: finite logprobs of allowed tokens only, its mass at most 1.
            assert token.top_logprobs and sum(2.718281828 ** alt.logprob for alt in token.top_logprobs) <= 1.0001
            assert all(alt.logprob > -1e30 for alt in token.top_logprobs)
            assert token.logprob > -1e30


def test_a_short_budget_ends_with_length(api):
    pb2, _ = api
    text, final, _ = generate(api, pb2.Constraint(json_schema=json.dumps(SCHEMAS["nested_object"])), 1,
                              max_new_tokens=3)
    assert final.finish_reason == pb2.FINISH_REASON_LENGTH and final.generated_tokens == 3
    assert text.startswith("{")


def expect_error(api, code, words, constraint, **kw):
    with pytest.raises(grpc.RpcError) as err:
        generate(api, constraint, 1, **kw)
    assert err.value.code() == code, err.value
    for word in words:
        assert word in err.value.details(), err.value.details()
    return err.value.details()


def test_bad_constraints_are_invalid_arguments(api):
    pb2, _ = api
    bad = grpc.StatusCode.INVALID_ARGUMENT
    expect_error(api, bad, ["constraint", "json_schema"], pb2.Constraint())
    expect_error(api, bad, ["constraint.json_object"], pb2.Constraint(json_object=False))
    expect_error(api, bad, ["choices"], pb2.Constraint(choice=pb2.ChoiceList(choices=[])))
    # The compiler's own message comes back: a schema that is not JSON, a regex that does not
    # parse, a grammar without a root rule.
    details = expect_error(api, bad, [], pb2.Constraint(json_schema='{"type": "object", "properties": '))
    assert len(details) > 20, details
    expect_error(api, bad, [], pb2.Constraint(regex="([a-z"))
    expect_error(api, bad, [], pb2.Constraint(grammar='start ::= "x"'))


def continue_until_complete(api, first_text, first_final, max_calls=64, **where):
    """Continues a session or blob (`where`: session_id=... or a state blob, renewed from each
    final message) without naming its constraint, 12 tokens a call, until the output ends; the
    joined text."""
    pb2, _ = api
    text, final = first_text, first_final
    for _ in range(max_calls):
        if final.finish_reason == pb2.FINISH_REASON_EOS:
            return text
        assert final.finish_reason == pb2.FINISH_REASON_LENGTH, final
        if "state" in where:
            where = {"state": final.state}
        more, final, _ = generate(api, None, 0, prompt=b"", max_new_tokens=12, **where)
        text += more
    pytest.fail(f"the output did not complete in {max_calls} calls: {text!r}")


@pytest.mark.parametrize("name", ["nested_object", "array_of_objects", "string_formats"])
def test_a_session_continues_its_constrained_output_across_calls_and_forks(api, name):
    """Cut every 12 tokens, a session's output goes on under its constraint call after call, and a
    fork taken mid-structure goes on under it too: every joined output validates."""
    pb2, stub = api
    schema = SCHEMAS[name]
    for seed in range(4):
        session = stub.CreateSession(pb2.CreateSessionRequest(model=MODEL)).session_id
        text, final, _ = generate(api, pb2.Constraint(json_schema=json.dumps(schema)), seed,
                                  session_id=session, max_new_tokens=12)
        assert final.finish_reason == pb2.FINISH_REASON_LENGTH, (final, text)
        info = stub.ExportSession(pb2.SessionRef(session_id=session)).session
        assert info.constraint_pending
        fork = stub.ForkSession(pb2.SessionRef(session_id=session)).session_id
        joined = continue_until_complete(api, text, final, session_id=session)
        check_output(schema, joined)
        # The fork continues from where the session was when forked, under the same constraint,
        # with its own draws (another seed).
        forked_text, forked_final, _ = generate(api, None, 0, prompt=b"", session_id=fork, max_new_tokens=12,
                                                sampling=pb2.SamplingParams(temperature=1.0, top_k=0, seed=seed + 100))
        forked = continue_until_complete(api, text + forked_text, forked_final, session_id=fork)
        check_output(schema, forked)
        # Complete: the session is unconstrained again.
        assert not stub.ExportSession(pb2.SessionRef(session_id=session)).session.constraint_pending
        for s in (session, fork):
            stub.CloseSession(pb2.SessionRef(session_id=s))


def test_a_prompt_continues_the_constrained_output_or_is_refused(api):
    """A call's prompt on a session mid-structure becomes part of the output: allowed text steers
    it, text the constraint refuses is INVALID_ARGUMENT leaving the session as it was;
    clear_constraint continues unconstrained; a new constraint replaces the old."""
    pb2, stub = api
    pattern = r"[a-z]{3,12}@[a-z]{2,8}\.org"
    session = stub.CreateSession(pb2.CreateSessionRequest(model=MODEL)).session_id
    text, final, _ = generate(api, pb2.Constraint(regex=pattern), 3, session_id=session, max_new_tokens=2)
    assert final.finish_reason == pb2.FINISH_REASON_LENGTH
    before = stub.ExportSession(pb2.SessionRef(session_id=session)).session
    details = expect_error(api, grpc.StatusCode.INVALID_ARGUMENT, ["prompt", "constrained output", "clear_constraint"],
                           None, session_id=session, prompt=b"!")
    assert "token 0" in details, details
    after = stub.ExportSession(pb2.SessionRef(session_id=session)).session
    assert (after.position, after.constraint_pending) == (before.position, True)
    more, final, _ = generate(api, None, 3, session_id=session, prompt=b"q", max_new_tokens=64)
    assert final.finish_reason == pb2.FINISH_REASON_EOS, more
    assert re.fullmatch(pattern, text + "q" + more), text + "q" + more

    # Cut again, then cleared: the next call is free text.
    generate(api, pb2.Constraint(regex=pattern), 4, session_id=session, prompt=b"\n", max_new_tokens=2)
    assert stub.ExportSession(pb2.SessionRef(session_id=session)).session.constraint_pending
    expect_error(api, grpc.StatusCode.INVALID_ARGUMENT, ["clear_constraint"], pb2.Constraint(regex=pattern),
                 session_id=session, clear_constraint=True)
    _, final, _ = generate(api, None, 4, session_id=session, prompt=b"!", clear_constraint=True, max_new_tokens=4)
    assert final.generated_tokens == 4
    assert not stub.ExportSession(pb2.SessionRef(session_id=session)).session.constraint_pending
    stub.CloseSession(pb2.SessionRef(session_id=session))


def test_a_blob_cut_mid_structure_resumes_on_another_replica_under_its_constraint(proto_modules, key_file):
    """A state blob exported mid-structure (return_state, and the snapshots of state_every_tokens)
    continues on a second server with the same key, without naming the constraint, and the output
    joined over both servers validates."""
    pb2, pb2_grpc = proto_modules
    schema = SCHEMAS["nested_object"]
    args = [f"--session_key_file={key_file}"]
    with RunningServer(MODELS, args) as a, RunningServer(MODELS, args) as b, \
            grpc.insecure_channel(a.address) as ca, grpc.insecure_channel(b.address) as cb:
        grpc.channel_ready_future(ca).result(timeout=30)
        grpc.channel_ready_future(cb).result(timeout=30)
        on_a, on_b = (pb2, pb2_grpc.TostStub(ca)), (pb2, pb2_grpc.TostStub(cb))
        for seed in range(6):
            text, final, _ = generate(on_a, pb2.Constraint(json_schema=json.dumps(schema)), seed,
                                      max_new_tokens=10, return_state=True)
            assert final.finish_reason == pb2.FINISH_REASON_LENGTH and final.state, final
            check_output(schema, continue_until_complete(on_b, text, final, state=final.state))
        # A snapshot mid-stream resumes the same way: the tokens up to it, then the rest on b.
        request = pb2.GenerateRequest(model=MODEL, prompt_bytes=b"Her answer, written plainly:", max_new_tokens=256,
                                      sampling=pb2.SamplingParams(temperature=1.0, top_k=0, seed=42),
                                      constraint=pb2.Constraint(json_schema=json.dumps(schema)), state_every_tokens=8)
        got = collect_generate(on_a[1].Generate(request, timeout=300))
        upto, snapshot = next(((n, s) for n, s in zip(got.snapshot_token_counts, got.snapshots) if n >= 16),
                              (None, None))
        assert snapshot is not None
        prefix = b"".join(t.bytes for t in got.tokens[:upto]).decode()
        more, final, _ = generate(on_b, None, 0, prompt=b"", state=snapshot.state, max_new_tokens=200)
        check_output(schema, continue_until_complete(on_b, prefix + more, final, state=final.state))
        # The same blob with clear_constraint goes on unconstrained.
        _, final, _ = generate(on_b, None, 0, prompt=b"", state=snapshot.state, max_new_tokens=4, clear_constraint=True)
        assert final.generated_tokens == 4


def test_batch_invariant_constrained_outputs_do_not_depend_on_their_neighbours(proto_modules):
    """With --batch_invariant_decode a constrained generation gives the same tokens alone and among
    other generations (constrained or not): its mask is its row's alone."""
    pb2, pb2_grpc = proto_modules
    schema = pb2.Constraint(json_schema=json.dumps(SCHEMAS["bounds"]))
    with RunningServer(MODELS, ["--batch_invariant_decode"]) as srv, grpc.insecure_channel(srv.address) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        api = (pb2, pb2_grpc.TostStub(channel))
        alone = [generate(api, schema, seed)[0] for seed in range(6)]
        with ThreadPoolExecutor(max_workers=12) as pool:
            crowd = [pool.submit(generate, api, schema, seed) for seed in range(6)]
            noise = [pool.submit(generate, api, None, seed, max_new_tokens=64) for seed in range(6)]
            together = [f.result()[0] for f in crowd]
            for f in noise:
                f.result()
        status = generator_status(api[1].ServerStatus(pb2.ServerStatusRequest()), MODEL)
    assert status.max_decode_batch > 1, "the generations never shared a decode step"
    assert together == alone


def test_metrics_count_compiles_cache_hits_and_mask_time(proto_modules):
    """A new schema compiles once (its time counted), the same schema again is a cache hit, a bad
    one counts as invalid; every constrained decode step observes its mask time."""
    pb2, pb2_grpc = proto_modules
    with RunningServer(MODELS) as srv, grpc.insecure_channel(srv.address) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        api = (pb2, pb2_grpc.TostStub(channel))
        schema = pb2.Constraint(json_schema=json.dumps(SCHEMAS["bounds"]))
        _, first, _ = generate(api, schema, 1, max_new_tokens=8)
        _, second, _ = generate(api, schema, 2, max_new_tokens=8)
        expect_error(api, grpc.StatusCode.INVALID_ARGUMENT, [], pb2.Constraint(regex="([a-z"))
        samples = scrape_metrics(srv)

    def m(name, **labels):  # None when the series is absent: each must be there, zeros included
        return metric_value(samples, name, default=None, model=MODEL, **labels)

    assert m("tost_constraint_compiles_total", outcome="ok") == 1
    assert m("tost_constraint_compiles_total", outcome="invalid") == 1
    assert m("tost_constraint_cache_hits_total") == 1
    assert m("tost_constraint_cache_entries") == 1
    assert 0 < m("tost_constraint_compile_seconds_total") < 10
    assert m("tost_constraint_compile_timeouts_total") == 0
    # One observation per decode step with a constrained row, and each of the calls' tokens (one
    # after the other) was drawn by a step of its own.
    steps = m("tost_constraint_mask_seconds_count")
    assert steps == first.generated_tokens + second.generated_tokens, steps
    assert 0 < m("tost_constraint_mask_seconds_sum") < 1


def test_bad_and_pathological_constraints_are_refused_while_a_stream_finishes(proto_modules):
    """Invalid constraints get INVALID_ARGUMENT with the compiler's words; one whose compiled form
    is over an eighth of --constraint_cache_bytes gets INVALID_ARGUMENT saying its size; one whose
    compile outlasts --constraint_compile_timeout_ms gets RESOURCE_EXHAUSTED. Deep nesting and a
    large enum within the bounds compile (asked again, as a client would, should a loaded machine
    stretch a compile past the bound). Meanwhile a stream on the same server runs to its end,
    and the server serves constrained requests after."""
    pb2, pb2_grpc = proto_modules
    nested = {"type": "integer"}
    for _ in range(60):
        nested = {"type": "object", "properties": {"a": nested}, "required": ["a"]}
    many = {f"p{i}": {"type": "object", "properties": {"x": {"type": "string", "maxLength": 30},
                                                       "y": {"enum": [1, 2, 3]}}, "required": ["x", "y"]}
            for i in range(400)}
    args = ["--constraint_cache_bytes=6000000", "--constraint_compile_timeout_ms=300"]
    with RunningServer(MODELS, args) as srv, grpc.insecure_channel(srv.address) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        api = (pb2, pb2_grpc.TostStub(channel))
        with ThreadPoolExecutor(max_workers=1) as pool:
            stream = pool.submit(generate, api, None, 5, max_new_tokens=300)
            bad = grpc.StatusCode.INVALID_ARGUMENT
            expect_error(api, bad, [], pb2.Constraint(json_schema='{"type": "object", "properties": '))
            expect_error(api, bad, [], pb2.Constraint(regex="([a-z"))
            expect_error(api, bad, [], pb2.Constraint(grammar='start ::= "x"'))
            # About 0.9 MB compiled (a token mask per count), in tens of milliseconds.
            expect_error(api, bad, ["compiled, it takes", "expected at most 750000", "--constraint_cache_bytes"],
                         pb2.Constraint(regex="[a-z]{1,60000}"))
            # About a second to compile.
            expect_error(api, grpc.StatusCode.RESOURCE_EXHAUSTED, ["took longer than 300 ms", "--constraint_compile_timeout_ms"],
                         pb2.Constraint(json_schema=json.dumps({"type": "object", "properties": many,
                                                                "required": list(many)})))
            for fine in (nested, {"enum": [f"v{i:05d}" for i in range(6000)]}):
                _, final, _ = generate_compiled(api, pb2.Constraint(json_schema=json.dumps(fine)), 1, max_new_tokens=4)
                assert final.generated_tokens == 4
            text, final, _ = stream.result(timeout=300)
        assert final.finish_reason == pb2.FINISH_REASON_LENGTH and final.generated_tokens == 300, final
        check_output(SCHEMAS["bounds"], generate(api, pb2.Constraint(json_schema=json.dumps(SCHEMAS["bounds"])), 3)[0])


# --- bounded compiles ----------------------------------------------------------------------------

KEY_ALICE = "alice-0123456789abcdef"
KEY_BOB = "bob-0123456789abcdef01"
WORKER = "tost_constraint"  # the compile worker's name as /proc/<pid>/stat has it (15 bytes)


def slow_schema(salt, properties=200):
    """Within every shape bound (a pattern may spell out 1000 characters), yet some 75 ms of compile
    per property on tost-austen: 200 of them take some 15 s of a core, far past the kill bound."""
    props = {f"p{i}_{salt}": {"type": "string", "pattern": "^[a-z]{1000}$"} for i in range(properties)}
    return json.dumps({"type": "object", "properties": props, "required": list(props)})


def stat_fields(pid):
    """/proc/<pid>/stat's fields after the command name (field 3, the state, is [0])."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def compile_workers(server_pid):
    """The pids of the server's children that are compile workers."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # gone since it was listed
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        if comm == WORKER and int(stat.rsplit(")", 1)[1].split()[1]) == server_pid:
            found.append(int(name))
    return found


def cpu_seconds(pid):
    """User and system CPU time of `pid` and its reaped children."""
    fields = stat_fields(pid)
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def wait_for(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.02)


def test_one_callers_slow_compiles_leave_another_compiling_and_are_stopped(proto_modules, tmp_path):
    """Alice sends two schemas that pass every shape bound but compile for some 15 s each. Each is
    refused with RESOURCE_EXHAUSTED after --constraint_compile_timeout_ms (2 s) while it compiles on
    in a worker process; meanwhile Bob's new schema compiles and generates normally. At
    --constraint_compile_kill_ms (5 s) both workers are killed: none is left, the server's CPU
    returns to idle, its memory grew by little and each worker's stayed under
    --constraint_compile_memory_mb; the same schema is refused from then on within a second,
    naming the kill. Before compiles ran in workers, both ran on in the server for their 15 s
    (150 s and more for the schemas the shape bounds now refuse), and every other new constraint
    was refused meanwhile."""
    pb2, pb2_grpc = proto_modules
    keys = tmp_path / "api_keys"
    keys.write_text(f"alice {KEY_ALICE}\nbob {KEY_BOB}\n")
    kill_ms, memory_mb = 5000, 256
    args = [f"--api_keys_file={keys}", f"--constraint_compile_kill_ms={kill_ms}",
            f"--constraint_compile_memory_mb={memory_mb}"]
    alice, bob = [("x-api-key", KEY_ALICE)], [("x-api-key", KEY_BOB)]
    with RunningServer(MODELS, args) as srv, grpc.insecure_channel(srv.address) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        api = (pb2, pb2_grpc.TostStub(channel))
        pid = srv.proc.pid
        # The vocabulary is built on the first constrained request: before measuring.
        generate(api, pb2.Constraint(regex="[a-z]{3}"), 1, metadata=bob, max_new_tokens=4)
        rss_before = proc_status(pid)["VmRSS"]
        start = time.monotonic()
        worker_peaks = {}
        with ThreadPoolExecutor(max_workers=2) as pool:
            slow = [pool.submit(expect_error, api, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                ["took longer than 2000 ms", "--constraint_compile_timeout_ms"],
                                pb2.Constraint(json_schema=slow_schema(i)), metadata=alice)
                    for i in range(2)]
            wait_for(lambda: len(compile_workers(pid)) == 2, 3, "both slow compiles in their workers")
            # Bob's new schema compiles beside them (no slot of Alice's is his) and constrains.
            bob_start = time.monotonic()
            schema = SCHEMAS["bounds"]
            text, final, _ = generate(api, pb2.Constraint(json_schema=json.dumps(schema)), 7, metadata=bob)
            bob_s = time.monotonic() - bob_start
            assert final.finish_reason in (pb2.FINISH_REASON_EOS, pb2.FINISH_REASON_LENGTH), final
            if final.finish_reason == pb2.FINISH_REASON_EOS:
                check_output(schema, text)
            for w in compile_workers(pid):
                try:
                    worker_peaks[w] = proc_status(w)["VmHWM"]
                    with open(f"/proc/{w}/status") as f:
                        peak_vm = [int(line.split()[1]) for line in f if line.startswith("VmPeak:")][0]
                    assert peak_vm <= memory_mb << 10, f"worker {w} mapped {peak_vm} KiB"
                except OSError:
                    pass  # ended meanwhile
            for f in slow:
                f.result(timeout=30)
        refused_s = time.monotonic() - start
        assert refused_s < 4, refused_s
        # Killed at kill_ms: no worker left, however long their compiles would have run.
        wait_for(lambda: not compile_workers(pid), kill_ms / 1000 + 3 - (time.monotonic() - start),
                 "the workers killed at --constraint_compile_kill_ms")
        stopped_s = time.monotonic() - start
        assert stopped_s >= kill_ms / 1000 - 0.5, stopped_s
        # The server's CPU back to idle: less than a tenth of a core over a second.
        cpu = cpu_seconds(pid)
        time.sleep(1.0)
        idle_cpu = cpu_seconds(pid) - cpu
        assert idle_cpu < 0.1, f"{idle_cpu} s of CPU in an idle second after the kill"
        status = proc_status(pid)
        grown_mib = (status["VmHWM"] - rss_before) / 1024
        # docs/api.md: compiles add at most --constraint_cache_bytes (256 MiB) of compiled
        # constraints and, while they run, what their workers proved a compile takes; these
        # killed ones added nothing of theirs.
        assert grown_mib < 64, f"the server's peak RSS grew by {grown_mib:.0f} MiB"
        # Refused at once from now on, naming the kill, whoever asks.
        again = time.monotonic()
        expect_error(api, grpc.StatusCode.INVALID_ARGUMENT,
                     [f"ran past {kill_ms} ms (--constraint_compile_kill_ms) and was stopped"],
                     pb2.Constraint(json_schema=slow_schema(0)), metadata=bob)
        assert time.monotonic() - again < 1
        samples = scrape_metrics(srv)

        def m(name, **labels):
            return metric_value(samples, name, default=None, model=MODEL, **labels)

        assert m("tost_constraint_compiles_total", outcome="stopped") == 2
        assert m("tost_constraint_compile_timeouts_total") == 2
        assert m("tost_constraint_compiles_running") == 0
        print(f"slow compiles refused after {refused_s:.2f} s, workers gone after {stopped_s:.2f} s, "
              f"Bob's constrained generation {bob_s:.2f} s, worker peak RSS {max(worker_peaks.values(), default=0)} KiB, "
              f"server peak RSS +{grown_mib:.1f} MiB, idle CPU {idle_cpu:.3f} s/s")


# The acceptance's hostile shapes, and one past each of the schema's count bounds (docs/api.md,
# Constrained generation): (kind, text, words of the refusal).
HOSTILE = [
    ("json_schema", '{"items":' * 60000 + "{}" + "}" * 60000, "at most 65536 bytes"),
    ("json_schema", json.dumps({"enum": list(range(100000))}), "at most 65536 bytes"),
    ("regex", "(a+)+$" * ((1 << 20) // 6), "at most 65536 bytes"),
    ("grammar", "root ::= " + "(" * 60000 + '"a"' + ")" * 60000, "at most 65536 bytes"),
    ("json_schema", '{"items":' * 300 + "{}" + "}" * 300, "nested at most 256 levels deep"),
    ("regex", "(" * 300 + "a" + ")" * 300, "nested at most 256 levels deep"),
    ("json_schema", json.dumps({"type": "object", "properties": {f"p{i}": {} for i in range(1025)}}),
     "at most 1024 optional properties"),
    ("json_schema", json.dumps({"enum": list(range(8193))}), "at most 8192 enum and const values"),
    ("json_schema", json.dumps({"type": "string", "pattern": "^[a-z]{30000}$"}),
     "each pattern of a json_schema to spell out at most 1024 characters"),
]


def test_hostile_constraints_are_refused_within_a_second_over_grpc_and_http(proto_modules):
    pb2, pb2_grpc = proto_modules
    with RunningServer(MODELS) as srv, grpc.insecure_channel(srv.address) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        api = (pb2, pb2_grpc.TostStub(channel))
        for kind, text, words in HOSTILE:
            start = time.monotonic()
            expect_error(api, grpc.StatusCode.INVALID_ARGUMENT, [words], pb2.Constraint(**{kind: text}))
            took = time.monotonic() - start
            assert took < 1, (kind, words, took)
            field = {"json_schema": "guided_json", "regex": "guided_regex", "grammar": "guided_grammar"}[kind]
            body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                               "max_tokens": 4, field: text}).encode()
            conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=30)
            start = time.monotonic()
            conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
            answer = conn.getresponse()
            error = json.loads(answer.read())["error"]
            took = time.monotonic() - start
            conn.close()
            assert answer.status == 400, (kind, words, answer.status, error)
            assert error["param"] == field and words in error["message"], (kind, error)
            assert took < 1, (kind, words, took)
        # Nothing crashed: the server constrains as before.
        _, final, _ = generate(api, pb2.Constraint(regex="[a-z]{3}"), 1, max_new_tokens=8)
        assert final.finish_reason == pb2.FINISH_REASON_EOS, final
