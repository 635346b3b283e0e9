"""The HTTP front end (--http_port, service/http) of a real tost_server: health routes, 404/405 in
OpenAI's error shape, API keys as `Authorization: Bearer`, TLS and mutual TLS with the gRPC port's
files, the header and body limits, a slowloris client cut off at the header deadline while others
are served, and the drain on SIGTERM."""
import http.client
import json
import os
import signal
import socket
import ssl
import threading
import time

import grpc
import pytest

import tost_launch
from conftest import SOURCE_DIR, HeldLoading, RunningServer, _binary, port_while_loading
from tost_harness import wait_for_metric

MODELS = os.path.join(SOURCE_DIR, "models")
API_KEY = "http-test-key-0123456789"


def _request(port, method, path, headers=None, body=None, context=None, timeout=10):
    """(status, headers as a dict of lower-cased names, body) of one request on a new connection."""
    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    else:
        conn = http.client.HTTPSConnection("localhost", port, timeout=timeout, context=context)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def _raw(port, data, timeout=10):
    """What the server answers to `data` sent as is, until it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
        return out


def _error(body):
    e = json.loads(body)["error"]
    assert set(e) == {"message", "type", "param", "code"}, e
    return e


@pytest.fixture(scope="module")
def server():
    s = RunningServer(MODELS)
    yield s
    assert s.stop() == 0


def test_health_routes_and_the_request_id(server):
    assert server.http_port and server.http_port not in (server.port, server.metrics_port)
    status, headers, body = _request(server.http_port, "GET", "/v1/health/live")
    assert status == 200 and json.loads(body) == {"status": "live"}
    assert len(headers["x-request-id"]) == 16
    status, headers, body = _request(server.http_port, "GET", "/v1/health/ready", {"x-request-id": "probe-1"})
    assert status == 200 and json.loads(body) == {"status": "ready"}
    assert headers["x-request-id"] == "probe-1"
    assert "request_id=probe-1" in server.log_text() and "path=/v1/health/ready" in server.log_text()


def test_unknown_paths_are_404_and_other_methods_405_in_openai_shape(server):
    status, _, body = _request(server.http_port, "GET", "/v1/no/such/route")
    assert status == 404
    e = _error(body)
    assert e["type"] == "not_found_error" and "/v1/no/such/route" in e["message"]
    status, headers, body = _request(server.http_port, "POST", "/v1/health/live", body=b"{}")
    assert status == 405 and headers["allow"] == "GET, HEAD"
    assert _error(body)["type"] == "invalid_request_error"


def test_oversized_header_is_431_and_oversized_body_413(server):
    big = b"GET /v1/health/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"
    assert _raw(server.http_port, big).startswith(b"HTTP/1.1 431 ")
    # Refused from its Content-Length, before any of the 9 MiB is sent.
    declared = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 9437184\r\n\r\n"
    answer = _raw(server.http_port, declared)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert _error(answer.split(b"\r\n\r\n", 1)[1])["type"] == "invalid_request_error"
    # The server serves on.
    assert _request(server.http_port, "GET", "/v1/health/live")[0] == 200


def test_a_slowloris_client_is_closed_at_the_header_deadline_while_others_are_served(server):
    slow = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    start = time.monotonic()
    slow.sendall(b"GET /v1/health/live HTTP/1.1\r\nX-Slow: ")
    closed_after = None
    served = 0
    while time.monotonic() - start < 20:
        try:
            slow.sendall(b"a")  # a byte every half second: no single read waits long
        except (BrokenPipeError, ConnectionResetError):
            closed_after = time.monotonic() - start
            break
        t0 = time.monotonic()
        assert _request(server.http_port, "GET", "/v1/health/ready")[0] == 200
        assert time.monotonic() - t0 < 2
        served += 1
        slow.settimeout(0.5)
        try:
            if slow.recv(4096) == b"":
                closed_after = time.monotonic() - start
                break
        except socket.timeout:
            pass
        except ConnectionResetError:
            closed_after = time.monotonic() - start
            break
    slow.close()
    # The default 10 s header deadline runs from accept, however steadily the client trickles.
    assert closed_after is not None, "the slowloris connection was never closed"
    assert 9 <= closed_after < 15, closed_after
    assert served >= 10


def test_api_keys_guard_every_route_but_health(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"alice {API_KEY}\n")
    s = RunningServer(MODELS, [f"--api_keys_file={keys}"])
    try:
        port = s.http_port
        # Probes carry no key.
        assert _request(port, "GET", "/v1/health/ready")[0] == 200
        status, headers, body = _request(port, "GET", "/v1/models")
        assert status == 401 and headers["www-authenticate"] == "Bearer"
        e = _error(body)
        assert e["type"] == "authentication_error" and "missing API key" in e["message"]
        status, _, body = _request(port, "GET", "/v1/models", {"Authorization": "Bearer wrong-key-wrong-key-0"})
        assert status == 401 and "unknown API key" in _error(body)["message"]
        # With the key, the route answers.
        assert _request(port, "GET", "/v1/models", {"Authorization": f"Bearer {API_KEY}"})[0] == 200
    finally:
        assert s.stop() == 0


def test_tls_and_mutual_tls_with_the_grpc_ports_files(pki):
    tls = [f"--tls_cert_file={pki / 'server.pem'}", f"--tls_key_file={pki / 'server.key'}"]
    s = RunningServer(MODELS, tls)
    try:
        context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        assert _request(s.http_port, "GET", "/v1/health/live", context=context)[0] == 200
        # Plain HTTP on the TLS port gets no answer.
        with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
            _request(s.http_port, "GET", "/v1/health/live", timeout=5)
    finally:
        assert s.stop() == 0
    s = RunningServer(MODELS, [*tls, f"--tls_client_ca_file={pki / 'ca.pem'}"])
    try:
        context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        context.load_cert_chain(str(pki / "alice.pem"), str(pki / "alice.key"))
        assert _request(s.http_port, "GET", "/v1/health/live", context=context)[0] == 200
        # No client certificate: refused.
        anonymous = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
            _request(s.http_port, "GET", "/v1/health/live", context=anonymous, timeout=5)
    finally:
        assert s.stop() == 0


def test_sigterm_turns_readiness_off_then_drains_and_closes_the_port(proto_modules):
    pb2, pb2_grpc = proto_modules
    # One generation at a time and four dozen queued, 1000 tokens each (0.1 to 0.5 s on a CPU: the
    # lean decode step takes tost-austen's token in about 0.1 ms), so the queue holds more than
    # the drain's 3 s and the drain waits all of them: what the HTTP port answers meanwhile is the
    # drain's doing.
    s = RunningServer(MODELS, ["--drain_timeout_s=3", "--max_active_generations=1"])
    try:
        with grpc.insecure_channel(s.address) as channel:
            stub = pb2_grpc.TostStub(channel)
            clients_count = 48
            first_tokens = threading.Barrier(clients_count + 1)

            def generate():
                stream = stub.Generate(pb2.GenerateRequest(model="tost-austen", prompt_bytes=b"It is",
                                                           max_new_tokens=1000), timeout=60)
                try:
                    first_tokens.wait(timeout=30)
                    for _ in stream:
                        pass
                except (grpc.RpcError, threading.BrokenBarrierError):
                    pass

            clients = [threading.Thread(target=generate, daemon=True) for _ in range(clients_count)]
            for c in clients:
                c.start()
            first_tokens.wait(timeout=30)
            # Every call admitted (one active, the rest queued) before the signal: one sent after
            # it would be refused, and the drain end early.
            wait_for_metric(s, "tost_queue_depth", lambda depth: depth >= 8, timeout_s=30, interval_s=0.05,
                            message="the generations were not queued", model="tost-austen", workload="generate")
            kept = http.client.HTTPConnection("127.0.0.1", s.http_port, timeout=10)
            kept.request("GET", "/v1/health/ready")
            assert kept.getresponse().status == 200
            start = time.monotonic()
            s.proc.send_signal(signal.SIGTERM)
            ready = 200
            while ready == 200 and time.monotonic() < start + 1:
                ready = _request(s.http_port, "GET", "/v1/health/ready")[0]
            assert ready == 503, "readiness did not turn off on SIGTERM"
            # Still draining a second later: the port serves, ready says 503 and live 200.
            time.sleep(max(0.0, start + 1.5 - time.monotonic()))
            status, _, body = _request(s.http_port, "GET", "/v1/health/ready")
            assert status == 503 and _error(body)["type"] == "server_error"
            assert _request(s.http_port, "GET", "/v1/health/live")[0] == 200
            assert s.proc.wait(timeout=15) == 0
            assert 2.5 < time.monotonic() - start < 8
            kept.close()
            for c in clients:
                c.join(timeout=10)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", s.http_port), timeout=5)
    finally:
        s.stop()


def test_while_the_models_load_the_port_answers_503_and_live_200(tmp_path):
    """The HTTP front end listens before the first model loads, as the gRPC port does: liveness
    200, readiness and the API 503 with a retry hint. The server is held inside its model loading
    (HeldLoading: its first open() under the repository waits) while the test probes it; its log
    names the HTTP port first. Released, it loads and turns ready."""
    held = HeldLoading(tmp_path)
    server = tost_launch.TostServer(held.repo, binary=_binary("TOST_SERVER_BIN"), metrics=False,
                                    extra_args=["--http_port=0"], log_path=str(tmp_path / "server.log"),
                                    env=held.env, wait=False)
    with server:
        port = port_while_loading(server, "http_port")
        held.reached(server)
        status, _, _ = _request(port, "GET", "/v1/health/live")
        assert status == 200
        ready, _, ready_body = _request(port, "GET", "/v1/health/ready")
        models, _, models_body = _request(port, "GET", "/v1/models")
        completion, _, completion_body = _request(
            port, "POST", "/v1/completions", {"content-type": "application/json"},
            json.dumps({"model": "austen-00", "prompt": "It was", "max_tokens": 2}))
        assert ready == 503, ready_body
        assert "loading" in _error(ready_body)["message"]
        for status, body in ((models, models_body), (completion, completion_body)):
            assert status == 503, body
            assert "still loading its models" in _error(body)["message"], body
        held.release()
        server.wait_ready()
        assert _request(port, "GET", "/v1/health/ready")[0] == 200
