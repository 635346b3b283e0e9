"""Careless operators and hostile timing, end to end: every numeric flag out of range stops the
start with the flag named as typed and its range; a second server on a port another one serves
refuses to start; a call whose deadline passed, or passes while it runs, is reported failed and
leaves the session it named as it was; deadlines far ahead (up to grpc-timeout's 99,999,999 hours)
are in the future; during a drain no session is created (CreateSession, ForkSession and
ImportSession answer UNAVAILABLE) while the sessions held can still be exported."""
import json
import os
import signal
import socket
import struct
import subprocess
import time

import grpc
import numpy as np
import pytest

from conftest import SOURCE_DIR, RunningServer, _binary
from tost_harness import collect_generate

LM = "tost-austen"
MODELS = os.path.join(SOURCE_DIR, "models")


def _run_server(*flags, timeout=30):
    """tost_server with `flags` on a free port, expected to stop by itself; (exit code, stderr)."""
    proc = subprocess.run([_binary("TOST_SERVER_BIN"), f"--model_repository={MODELS}", "--host=127.0.0.1",
                           "--port=0", "--metrics_port=-1", "--http_port=-1", *flags],
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stderr


# (flag as typed, what its message must say): each is refused at start, before any model loads.
BAD_FLAGS = [
    ("--max_new_tokens=-1", "[1, "),
    ("--max_prompt_bytes=-1", "[1, "),
    ("--max_tensor_elements=-1", "[1, "),
    ("--max_images_per_request=-1", "[1, "),
    ("--max_batch_size=-1", "[1, "),
    ("--drain_timeout_s=-1", "[0, "),
    ("--keepalive_time_ms=-1", "[1, "),
    ("--keepalive_timeout_ms=-1", "[1, "),
    ("--max_active_generations=0", "[1, "),
    ("--max_queued_generations=-1", "[0, "),
    ("--stream_stall_timeout_ms=-1", "0 = never"),
    ("--session_idle_timeout_s=0", "[1, "),
    ("--classify_timeout_us=-1", "0 = no default deadline"),
    ("--max_queue_size=0", "[1, "),
    ("--prefill_chunk_tokens=0", "[1, "),
    ("--prefill_yield_tokens=-1", "0 = whole chunks, never stopped"),
    ("--prefill_yield_window_s=-1", "[0, 86400]"),
    ("--max_sessions=0", "[1, "),
    ("--metrics_port=70000", "-1 = no endpoint"),
    ("--http_port=70000", "-1 = no HTTP front end"),
    ("--prefix_cache_bytes=-1", "[0, "),
    ("--constraint_cache_entries=0", "[1, "),
    ("--constraint_cache_bytes=100", "[65536, "),
    ("--constraint_compile_timeout_ms=-1", "0 = only constraints already compiled"),
    ("--constraint_mask_threads=-1", "[0, 256]"),
    ("--session_store_timeout_ms=0", "[10, "),
    ("--session_lease_ms=50", "[100, "),
    ("--port=-2", "[0, 65535]"),
    ("--drain_timeout_s=99999999", "[0, 86400]"),
]


@pytest.mark.parametrize("flag,range_text", BAD_FLAGS, ids=[f for f, _ in BAD_FLAGS])
def test_a_flag_out_of_range_stops_the_start_naming_the_flag(flag, range_text):
    started = time.monotonic()
    code, err = _run_server(flag)
    assert code == 1, err
    assert flag in err and "expected an integer in" in err and range_text in err, err
    # Refused before any model loads, and no internal option's name leaks out.
    assert "loading models" not in err, err
    for internal in ("max_active_jobs", "max_queued_jobs", "stream_stall_timeout must", "timeout_us must"):
        assert internal not in err, err
    assert time.monotonic() - started < 20


def test_every_bad_flag_is_listed_at_once():
    code, err = _run_server("--max_new_tokens=0", "--max_queue_size=0")
    assert code == 1
    assert "--max_new_tokens=0" in err and "--max_queue_size=0" in err, err


def test_the_renamed_images_per_request_flag_keeps_its_old_name_with_a_warning(proto_modules):
    """--max_batch_size is the old name of --max_images_per_request: alone it still sets the limit
    (and the log says what to write instead); given beside the new name with another value, the
    start is refused, since which one was meant is unknowable."""
    pb2, pb2_grpc = proto_modules
    code, err = _run_server("--max_batch_size=2", "--max_images_per_request=3")
    assert code == 1, err
    assert "--max_batch_size=2 and --max_images_per_request=3 disagree" in err, err
    assert "loading models" not in err, err

    old_name = RunningServer(MODELS, ["--max_batch_size=2"])
    try:
        x = np.zeros((3, 1, 32, 32), np.float32)
        with grpc.insecure_channel(old_name.address) as channel:
            stub = pb2_grpc.TostStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Classify(pb2.ClassifyRequest(
                    model="tost-digits", tensor=pb2.FloatTensor(shape=list(x.shape), raw=x.tobytes())), timeout=30)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "1 to 2 images per request (--max_images_per_request), got 3" in refused.value.details()
            two = stub.Classify(pb2.ClassifyRequest(
                model="tost-digits", tensor=pb2.FloatTensor(shape=[2, 1, 32, 32], raw=x[:2].tobytes())), timeout=30)
            assert len(two.results) == 2
    finally:
        old_name.stop()
    with open(old_name.log.name) as f:
        log = f.read()
    assert "--max_batch_size is deprecated" in log and "write --max_images_per_request=2 instead" in log, log


def test_a_second_server_on_a_port_in_use_refuses_to_start(proto_modules):
    pb2, pb2_grpc = proto_modules
    first = RunningServer(MODELS)
    try:
        code, err = _run_server(f"--port={first.port}")
        assert code == 1, err
        assert "port in use" in err and f"--port={first.port}" in err, err
        # ... and the metrics port is checked the same way, before any model loads.
        code, err = _run_server(f"--metrics_port={first.metrics_port}", "--metrics_address=127.0.0.1")
        assert code == 1 and "port in use" in err and "--metrics_port" in err, err
        # The first server still has every connection.
        with grpc.insecure_channel(first.address) as ch:
            names = [m.name for m in pb2_grpc.TostStub(ch).ListModels(pb2.ListModelsRequest(), timeout=30).models]
            assert LM in names
    finally:
        assert first.stop() == 0


@pytest.fixture(scope="module")
def server():
    s = RunningServer(MODELS, ["--batch_invariant_decode"])
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def stub(server, proto_modules):
    _, pb2_grpc = proto_modules
    ch = grpc.insecure_channel(server.address)
    grpc.channel_ready_future(ch).result(timeout=30)
    yield pb2_grpc.TostStub(ch)
    ch.close()


def _position(stub, pb2, session_id):
    return stub.ExportSession(pb2.SessionRef(session_id=session_id), timeout=30).session.position


def _generate_on(stub, pb2, sid, timeout, max_new_tokens=400):
    """A Generate on session `sid`; its final message, or the RpcError it failed with."""
    request = pb2.GenerateRequest(session_id=sid, prompt_bytes=b"The weather was fine, and ",
                                  max_new_tokens=max_new_tokens)
    got = collect_generate(stub.Generate(request, timeout=timeout), capture_error=True)
    if got.error is not None:
        return got.error
    assert got.final is not None, "the stream ended without its final message"
    return got.final


def _settled_position(stub, pb2, sid):
    """The session's position once the last call has checked it back in (busy until then)."""
    for _ in range(200):
        try:
            return _position(stub, pb2, sid)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e
            time.sleep(0.02)
    raise AssertionError(f"session {sid} stayed busy")


def test_a_call_that_fails_its_deadline_leaves_its_session_as_it_was(stub, proto_modules):
    """Deadlines from already past to mid-generation (400 tokens take ~0.2 s here): every call is
    reported DEADLINE_EXCEEDED and the session stays where it was, before and after a call that
    succeeds and moves it."""
    pb2, _ = proto_modules
    sid = stub.CreateSession(pb2.CreateSessionRequest(model=LM), timeout=30).session_id
    timeouts = [1e-6, 1e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 4e-2]
    for expected in (0, None):
        if expected is None:  # a call without a deadline moves the session; failed ones then keep that
            final = _generate_on(stub, pb2, sid, timeout=60, max_new_tokens=8)
            assert not isinstance(final, grpc.RpcError), final
            expected = final.position
            assert expected > 0 and _settled_position(stub, pb2, sid) == expected
        for timeout in timeouts:
            outcome = _generate_on(stub, pb2, sid, timeout)
            assert isinstance(outcome, grpc.RpcError), f"timeout {timeout}: finished {outcome}"
            assert outcome.code() == grpc.StatusCode.DEADLINE_EXCEEDED, (outcome.code(), outcome.details())
            position = _settled_position(stub, pb2, sid)
            assert position == expected, f"timeout {timeout}: session at {position}, expected {expected}"


def raw_grpc_call(address, path, request, headers=(), timeout_s=30):
    """One unary-request gRPC call over a raw HTTP/2 connection (the h2 library), so its headers can
    be what grpcio will not send (grpcio itself fails a timeout past ~290 years before sending).
    Returns (grpc-status, grpc-message, [response message bytes]); grpc-status -1 when the server
    reset the stream without one."""
    import h2.config
    import h2.connection
    import h2.events
    import h2.exceptions

    host, port = address.rsplit(":", 1)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    body = request.SerializeToString()
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        conn.initiate_connection()
        conn.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":path", path),
                              (":authority", address), ("content-type", "application/grpc"), ("te", "trailers"),
                              *headers])
        conn.send_data(1, b"\x00" + struct.pack(">I", len(body)) + body, end_stream=True)
        sock.sendall(conn.data_to_send())
        fields, data, ended, pending = {}, b"", False, b""
        while not ended:
            chunk = sock.recv(65536)
            assert chunk, "the server closed the connection before the call ended"
            pending += chunk
            # One frame at a time: a frame h2 refuses (gRPC may send trailers after resetting a
            # call that expired on arrival) then costs only itself, not the events before it.
            while not ended and len(pending) >= 9 + int.from_bytes(pending[:3].rjust(3, b"\0"), "big"):
                size = 9 + int.from_bytes(pending[:3], "big")
                frame, pending = pending[:size], pending[size:]
                try:
                    events = conn.receive_data(frame)
                except h2.exceptions.ProtocolError:  # h2 then holds the connection closed
                    events, ended = [], True
                for event in events:
                    if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                        fields.update(dict(event.headers))
                    elif isinstance(event, h2.events.DataReceived):
                        data += event.data
                        if not event.stream_ended:
                            conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                        ended = True
            if not ended:
                sock.sendall(conn.data_to_send())
    messages = []
    while data:
        (length,) = struct.unpack(">I", data[1:5])
        messages.append(data[5:5 + length])
        data = data[5 + length:]
    return int(fields.get("grpc-status", -1)), fields.get("grpc-message", ""), messages


# Up to eight digits of hours are valid grpc-timeout values; 2562047H is where system_clock's
# nanoseconds end, the others far beyond.
@pytest.mark.parametrize("timeout", ["2562047H", "9999999H", "99999999H", "99999999S", "1H"])
def test_deadlines_far_ahead_are_in_the_future(server, proto_modules, timeout):
    pb2, _ = proto_modules
    code, message, replies = raw_grpc_call(
        server.address, "/tost.v1.Tost/Generate",
        pb2.GenerateRequest(model=LM, prompt_bytes=b"It was ", max_new_tokens=4), [("grpc-timeout", timeout)])
    assert code == 0, (code, message)
    tokens = collect_generate(map(pb2.GenerateResponse.FromString, replies)).tokens
    assert len(tokens) == 4
    with open(os.path.join(MODELS, "tost-digits", "config.json")) as f:
        v = json.load(f)["vision"]
    x = np.zeros((1, v["in_chans"], v["image_height"], v["image_width"]), np.float32)
    code, message, replies = raw_grpc_call(
        server.address, "/tost.v1.Tost/Classify",
        pb2.ClassifyRequest(model="tost-digits", tensor=pb2.FloatTensor(shape=list(x.shape), raw=x.tobytes())),
        [("grpc-timeout", timeout)])
    assert code == 0, (code, message)
    assert len(pb2.ClassifyResponse.FromString(replies[0]).results) == 1


def test_a_deadline_already_past_on_arrival_moves_no_session(server, stub, proto_modules):
    """grpc-timeout 1n: the call is answered DEADLINE_EXCEEDED and its session stays at 0."""
    pb2, _ = proto_modules
    sid = stub.CreateSession(pb2.CreateSessionRequest(model=LM), timeout=30).session_id
    for timeout in ["1n", "1u", "50u"]:
        code, message, _ = raw_grpc_call(
            server.address, "/tost.v1.Tost/Generate",
            pb2.GenerateRequest(session_id=sid, prompt_bytes=b"The weather ", max_new_tokens=50),
            [("grpc-timeout", timeout)])
        # gRPC may answer DEADLINE_EXCEEDED itself or just reset a call expired on arrival.
        assert code in (grpc.StatusCode.DEADLINE_EXCEEDED.value[0], -1), (timeout, code, message)
        assert _settled_position(stub, pb2, sid) == 0, timeout


def test_no_session_is_created_during_a_drain(proto_modules, tmp_path):
    pb2, pb2_grpc = proto_modules
    key = tmp_path / "session.key"
    key.write_bytes(os.urandom(32))
    srv = RunningServer(MODELS, [f"--session_key_file={key}", "--drain_timeout_s=20"])
    try:
        ch = grpc.insecure_channel(srv.address)
        grpc.channel_ready_future(ch).result(timeout=30)
        stub = pb2_grpc.TostStub(ch)
        held = stub.CreateSession(pb2.CreateSessionRequest(model=LM), timeout=30).session_id
        blob = stub.ExportSession(pb2.SessionRef(session_id=held), timeout=30).state
        # A stream whose client reads nothing keeps the drain open while the session calls are
        # tried: with a small HTTP/2 window the server's writes wait, and the generation pauses
        # (the stall timeout, 30 s, is past the drain's 20 s).
        slow = grpc.insecure_channel(srv.address, options=[("grpc.http2.lookahead_bytes", 1024),
                                                           ("grpc.http2.bdp_probe", 0)])
        stream = pb2_grpc.TostStub(slow).Generate(pb2.GenerateRequest(model=LM, prompt_bytes=b"a", max_new_tokens=4000,
                                                   sampling=pb2.SamplingParams(temperature=1.0, seed=1)),
                               timeout=120)
        assert next(stream).HasField("token")
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # the drain has begun (health NOT_SERVING) well within this
        attempts = {
            "CreateSession": lambda: stub.CreateSession(pb2.CreateSessionRequest(model=LM), timeout=10),
            "ForkSession": lambda: stub.ForkSession(pb2.SessionRef(session_id=held), timeout=10),
            "ImportSession": lambda: stub.ImportSession(pb2.ImportSessionRequest(state=blob), timeout=10),
        }
        for name, call in attempts.items():
            with pytest.raises(grpc.RpcError) as e:
                call()
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE, (name, e.value.code(), e.value.details())
            assert "another replica" in e.value.details(), e.value.details()
        # What a client does to keep a session across the drain still works.
        exported = stub.ExportSession(pb2.SessionRef(session_id=held), timeout=10)
        assert exported.state and exported.session.session_id == held
        stream.cancel()
        slow.close()
        ch.close()
        assert srv.proc.wait(timeout=60) == 0
    finally:
        srv.stop()


def test_an_http_address_that_does_not_resolve_stops_the_start_naming_it():
    code, err = _run_server("--http_port=0", "--http_address=300.1.2.3")
    assert code == 1, err
    assert "--http_address" in err and "300.1.2.3" in err and "does not resolve" in err, err
    assert "loading models" not in err, err

