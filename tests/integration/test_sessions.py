"""Sessions end to end: export → stop the server → start another → import → continue gives exactly
the uninterrupted tokens (greedy and seeded, alone and beside 32 concurrent streams in the
batch-invariant decode mode); stateless continuation; fork; per-step batching of 64 streams;
drain with a resumable blob; the gRPC status codes of the failure cases (INVALID_ARGUMENT for a
tampered or truncated blob, NOT_FOUND for a closed session or another user's, UNAUTHENTICATED
without a valid key, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED with a retry hint when full); blob
hardening (PERMISSION_DENIED for another caller's blob, FAILED_PRECONDITION once it expires, key
rotation through a key list)."""
import base64
import os
import signal
import sys
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from conftest import SOURCE_DIR, RunningServer, concurrent_generates
from tost_harness import collect_generate

MODEL = "tost-austen"
PROMPT = b"It was a bright cold day in April, and "
sys.path.insert(0, os.path.join(SOURCE_DIR, "tools"))
import bpe  # noqa: E402
PROMPT_IDS = bpe.Tokenizer.load(os.path.join(SOURCE_DIR, "models", MODEL, "tokenizer.json")).encode(PROMPT)


def start(key_file, *extra):
    return RunningServer(os.path.join(SOURCE_DIR, "models"), [f"--session_key_file={key_file}",
                                                               "--batch_invariant_decode", *extra])


def stub_for(server, pb2_grpc):
    ch = grpc.insecure_channel(server.address)
    grpc.channel_ready_future(ch).result(timeout=30)
    return ch, pb2_grpc.TostStub(ch)


def collect(stream):
    """(token ids, GenerateFinal, StateSnapshots) of a Generate stream."""
    got = collect_generate(stream)
    return got.ids, got.final, got.snapshots


def background_load(stub, pb2, n, tokens=24):
    """n concurrent streams of other prompts, so the continued session shares its decode steps."""
    errors = []

    def run(i):
        try:
            collect(stub.Generate(pb2.GenerateRequest(model=MODEL, prompt_bytes=f"noise {i} ".encode(),
                                                      max_new_tokens=tokens,
                                                      sampling=pb2.SamplingParams(temperature=1.0, seed=i)),
                                  timeout=300))
        except grpc.RpcError as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads, errors


@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("concurrent", [0, 32])
def test_export_restart_import_continues_exactly(proto_modules, key_file, temperature, concurrent):
    pb2, pb2_grpc = proto_modules
    sampling = pb2.SamplingParams(temperature=temperature, seed=1234, top_p=0.95)
    first = start(key_file)
    try:
        ch, stub = stub_for(first, pb2_grpc)
        whole, final, _ = collect(stub.Generate(pb2.GenerateRequest(model=MODEL, prompt_bytes=PROMPT,
                                                                    max_new_tokens=30, sampling=sampling), timeout=120))
        assert len(whole) == 30 or final.finish_reason == pb2.FINISH_REASON_EOS
        session = stub.CreateSession(pb2.CreateSessionRequest(model=MODEL, sampling=sampling))
        part1, _, _ = collect(stub.Generate(pb2.GenerateRequest(session_id=session.session_id, prompt_bytes=PROMPT,
                                                                max_new_tokens=12), timeout=120))
        blob = stub.ExportSession(pb2.SessionRef(session_id=session.session_id)).state
        ch.close()
    finally:
        assert first.stop() == 0
    second = start(key_file)
    try:
        ch, stub = stub_for(second, pb2_grpc)
        imported = stub.ImportSession(pb2.ImportSessionRequest(state=blob))
        assert imported.position == len(PROMPT_IDS) + 12
        threads, errors = background_load(stub, pb2, concurrent)
        part2, final2, _ = collect(stub.Generate(pb2.GenerateRequest(session_id=imported.session_id,
                                                                     max_new_tokens=18), timeout=300))
        for t in threads:
            t.join()
        assert not errors
        assert part1 + part2 == whole[:len(part1) + len(part2)]
        if concurrent:
            status = stub.ServerStatus(pb2.ServerStatusRequest())
            assert status.generators[0].max_decode_batch > 1
        ch.close()
    finally:
        assert second.stop() == 0


def test_stateless_continuation_across_replicas(proto_modules, key_file):
    pb2, pb2_grpc = proto_modules
    sampling = pb2.SamplingParams(temperature=0.8, seed=77)
    a, b = start(key_file), start(key_file)
    try:
        cha, sa = stub_for(a, pb2_grpc)
        chb, sb = stub_for(b, pb2_grpc)
        whole, _, _ = collect(sa.Generate(pb2.GenerateRequest(model=MODEL, prompt_bytes=PROMPT, max_new_tokens=24,
                                                              sampling=sampling), timeout=120))
        # Round robin: each call goes to the other replica, carrying only the blob.
        got, final, snaps = collect(sa.Generate(pb2.GenerateRequest(model=MODEL, prompt_bytes=PROMPT, max_new_tokens=8,
                                                                    sampling=sampling, return_state=True,
                                                                    state_every_tokens=3), timeout=120))
        assert len(snaps) == 2 and final.state
        for replica in (sb, sa):
            more, final, _ = collect(replica.Generate(pb2.GenerateRequest(state=final.state, max_new_tokens=8),
                                                      timeout=120))
            got += more
        assert got == whole
        cha.close()
        chb.close()
    finally:
        assert a.stop() == 0 and b.stop() == 0


def test_fork_continues_identically_and_blobs_are_checked(stub, proto_modules):
    pb2, _ = proto_modules
    s = stub.CreateSession(pb2.CreateSessionRequest(model=MODEL, sampling=pb2.SamplingParams(temperature=1.0, seed=5)))
    collect(stub.Generate(pb2.GenerateRequest(session_id=s.session_id, prompt_bytes=PROMPT, max_new_tokens=4)))
    fork = stub.ForkSession(pb2.SessionRef(session_id=s.session_id))
    assert fork.session_id != s.session_id and fork.position == len(PROMPT_IDS) + 4
    a, _, _ = collect(stub.Generate(pb2.GenerateRequest(session_id=s.session_id, max_new_tokens=10)))
    b, _, _ = collect(stub.Generate(pb2.GenerateRequest(session_id=fork.session_id, max_new_tokens=10)))
    assert a == b
    blob = bytearray(stub.ExportSession(pb2.SessionRef(session_id=s.session_id)).state)
    blob[len(blob) // 2] ^= 1
    with pytest.raises(grpc.RpcError) as e:
        stub.ImportSession(pb2.ImportSessionRequest(state=bytes(blob)))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "authentication" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        collect(stub.Generate(pb2.GenerateRequest(state=bytes(blob[:40]), max_new_tokens=1)))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    stub.CloseSession(pb2.SessionRef(session_id=fork.session_id))
    with pytest.raises(grpc.RpcError) as e:
        collect(stub.Generate(pb2.GenerateRequest(session_id=fork.session_id, max_new_tokens=1)))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_sixty_four_streams_share_decode_steps(stub, proto_modules):
    pb2, _ = proto_modules
    before = stub.ServerStatus(pb2.ServerStatusRequest()).generators[0]
    results = concurrent_generates(stub, pb2, MODEL)
    after = stub.ServerStatus(pb2.ServerStatusRequest()).generators[0]
    steps = after.decode_steps - before.decode_steps
    tokens = after.decoded_tokens - before.decoded_tokens
    assert tokens == sum(len(r) for r in results)
    # The scheduler's own record: the streams were decoded in shared steps, not one by one.
    assert after.max_decode_batch > 1
    assert tokens / steps > 4, f"{tokens} tokens in {steps} steps"


def test_overload_deadline_auth_and_drain(proto_modules, key_file, tmp_path):
    pb2, pb2_grpc = proto_modules
    keys = tmp_path / "keys"
    keys.write_text("alice 0123456789abcdef0123\nbob fedcba9876543210fedc\n")
    srv = start(key_file, "--max_active_generations=1", "--max_queued_generations=0", f"--api_keys_file={keys}",
                "--drain_timeout_s=0")  # cut in-flight streams at once
    try:
        ch, stub = stub_for(srv, pb2_grpc)
        alice = [("x-api-key", "0123456789abcdef0123")]
        bob = [("authorization", "Bearer fedcba9876543210fedc")]
        for call in (lambda: stub.ListModels(pb2.ListModelsRequest()),
                     lambda: collect(stub.Generate(pb2.GenerateRequest(model=MODEL, prompt_bytes=b"a"))),
                     lambda: stub.ServerStatus(pb2.ServerStatusRequest(), metadata=[("x-api-key", "wrong-key-000000000")])):
            with pytest.raises(grpc.RpcError) as e:
                call()
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # Sessions are bound to their creator.
        s = stub.CreateSession(pb2.CreateSessionRequest(model=MODEL), metadata=alice)
        with pytest.raises(grpc.RpcError) as e:
            stub.ExportSession(pb2.SessionRef(session_id=s.session_id), metadata=bob)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        # Deadline: 1000 tokens cannot be produced in 50 ms here (about 1-2k tokens/s for one stream).
        with pytest.raises(grpc.RpcError) as e:
            collect(stub.Generate(pb2.GenerateRequest(model=MODEL, prompt_bytes=b"a", max_new_tokens=1000,
                                                      sampling=pb2.SamplingParams(temperature=1.0, seed=9)),
                                  metadata=alice, timeout=0.05))
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        time.sleep(0.2)  # the scheduler frees the slot on its next step
        # One slot, no queue: a second stream is refused with a retry hint.
        long_call = stub.Generate(pb2.GenerateRequest(model=MODEL, prompt_bytes=b"a", max_new_tokens=4000,
                                                      sampling=pb2.SamplingParams(temperature=1.0, seed=3)),
                                  metadata=alice, timeout=120)
        first = next(long_call)
        assert first.HasField("token")
        with pytest.raises(grpc.RpcError) as e:
            collect(stub.Generate(pb2.GenerateRequest(model=MODEL, prompt_bytes=b"b", max_new_tokens=1),
                                  metadata=bob))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "retry" in e.value.details()
        # Health Watch sees the drain; the cut stream ends with DRAINED and a resumable blob.
        health = health_pb2_grpc.HealthStub(ch)
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        srv.proc.send_signal(signal.SIGTERM)
        assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
        tokens, final, _ = collect(long_call)
        assert final.finish_reason == pb2.FINISH_REASON_DRAINED and final.state
        blob = final.state
        assert srv.proc.wait(timeout=60) == 0
        ch.close()
    finally:
        srv.stop()
    other = start(key_file, f"--api_keys_file={keys}")
    try:
        ch, stub = stub_for(other, pb2_grpc)
        more, final, _ = collect(stub.Generate(pb2.GenerateRequest(state=blob, max_new_tokens=5),
                                               metadata=[("x-api-key", "0123456789abcdef0123")], timeout=60))
        assert len(more) == 5 or final.finish_reason == pb2.FINISH_REASON_EOS
        ch.close()
    finally:
        assert other.stop() == 0


ALICE = [("x-api-key", "0123456789abcdef0123")]
BOB = [("authorization", "Bearer fedcba9876543210fedc")]


def api_keys(tmp_path):
    keys = tmp_path / "api_keys"
    keys.write_text("alice 0123456789abcdef0123\nbob fedcba9876543210fedc\n")
    return str(keys)


def exported_blob(stub, pb2, metadata=None, tokens=3):
    """A session with a few tokens generated, exported."""
    s = stub.CreateSession(pb2.CreateSessionRequest(model=MODEL), metadata=metadata)
    collect(stub.Generate(pb2.GenerateRequest(session_id=s.session_id, prompt_bytes=PROMPT, max_new_tokens=tokens),
                          metadata=metadata, timeout=60))
    return stub.ExportSession(pb2.SessionRef(session_id=s.session_id), metadata=metadata).state


def test_a_blob_is_bound_to_the_caller_that_exported_it(proto_modules, key_file, tmp_path):
    pb2, pb2_grpc = proto_modules
    srv = start(key_file, f"--api_keys_file={api_keys(tmp_path)}")
    try:
        ch, stub = stub_for(srv, pb2_grpc)
        blob = exported_blob(stub, pb2, ALICE)
        # Bob holds alice's blob: refused, without naming either of them.
        with pytest.raises(grpc.RpcError) as e:
            stub.ImportSession(pb2.ImportSessionRequest(state=blob), metadata=BOB)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "belongs to another caller" in e.value.details()
        assert "alice" not in e.value.details() and "bob" not in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            collect(stub.Generate(pb2.GenerateRequest(state=blob, max_new_tokens=2), metadata=BOB, timeout=60))
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # Alice continues it, and the blob a stateless continuation returns is hers too.
        imported = stub.ImportSession(pb2.ImportSessionRequest(state=blob), metadata=ALICE)
        assert imported.position == len(PROMPT_IDS) + 3
        _, final, _ = collect(stub.Generate(pb2.GenerateRequest(state=blob, max_new_tokens=2), metadata=ALICE,
                                            timeout=60))
        assert final.state
        with pytest.raises(grpc.RpcError) as e:
            stub.ImportSession(pb2.ImportSessionRequest(state=final.state), metadata=BOB)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        ch.close()
    finally:
        assert srv.stop() == 0


def test_a_blob_is_refused_once_its_ttl_has_passed(proto_modules, key_file):
    pb2, pb2_grpc = proto_modules
    srv = start(key_file, "--session_blob_ttl_s=1")
    try:
        ch, stub = stub_for(srv, pb2_grpc)
        blob = exported_blob(stub, pb2)
        stub.ImportSession(pb2.ImportSessionRequest(state=blob))  # within its second
        time.sleep(1.5)
        with pytest.raises(grpc.RpcError) as e:
            stub.ImportSession(pb2.ImportSessionRequest(state=blob))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "expired" in e.value.details() and "export the session again" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            collect(stub.Generate(pb2.GenerateRequest(state=blob, max_new_tokens=1), timeout=60))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        ch.close()
    finally:
        assert srv.stop() == 0


def test_a_key_list_verifies_blobs_of_every_listed_key_and_signs_with_the_first(proto_modules, tmp_path):
    pb2, pb2_grpc = proto_modules
    old_key = os.urandom(32)
    old_file = tmp_path / "old.key"
    old_file.write_bytes(old_key)  # the single-key format: the whole file is the key
    rotated_file = tmp_path / "rotated.keys"
    rotated_file.write_text("tost-session-keys\n# the new key signs\nthe-new-session-key-0123456789\n"
                            f"# the old one still verifies\nbase64:{base64.b64encode(old_key).decode()}\n")
    old, rotated = start(str(old_file)), start(str(rotated_file))
    try:
        cho, so = stub_for(old, pb2_grpc)
        chr_, sr = stub_for(rotated, pb2_grpc)
        imported = sr.ImportSession(pb2.ImportSessionRequest(state=exported_blob(so, pb2)))
        assert imported.position == len(PROMPT_IDS) + 3
        # What the rotated server signs (with its new key) is not verified by the old key alone.
        with pytest.raises(grpc.RpcError) as e:
            so.ImportSession(pb2.ImportSessionRequest(state=exported_blob(sr, pb2)))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not one of this server's" in e.value.details()
        cho.close()
        chr_.close()
    finally:
        assert old.stop() == 0 and rotated.stop() == 0


def test_reflection_lists_our_services(channel):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name for r in responses for s in r.list_services_response.service}
    assert {"tost.v1.Tost", "grpc.health.v1.Health", "inference.GRPCInferenceService"} <= names
