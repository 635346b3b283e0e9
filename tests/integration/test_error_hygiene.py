"""Error hygiene, end to end: every class of error the server gives a client, over gRPC (tost.v1 and
KServe v2) and HTTP (the OpenAI routes, the Responses API, the HTTP layer's own answers), says what
went wrong in at most MAX_MESSAGE_BYTES, and names no server path, no host or port, and no text of
the libraries' insides (LibTorch, XGrammar, hiredis). What a client must not read goes to the
server's log, under the request's id.

Three servers: one with API keys on a repository holding a model that fails to load (its weights
are /dev/zero); one whose --session_store is a Redis that is down (a closed port); one whose store
is a fake Redis that answers every command with an error naming a source file (what the server
reports as INTERNAL)."""
import json
import os
import re
import socket
import threading
import time
import uuid

import grpc
import pytest
from tritonclient.grpc import service_pb2 as kserve
from tritonclient.grpc import service_pb2_grpc as kserve_grpc

from conftest import SOURCE_DIR, RunningServer

MAX_MESSAGE_BYTES = 1024  # docs/api.md, "Status codes"
KEY = "error-hygiene-key-0123456789"
AUTH = (("x-api-key", KEY),)
BEARER = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
VISION, LM, BROKEN = "tost-digits", "tost-austen", "broken"
BIG = "q" * 300_000

# What a message must not hold: server paths, addresses, the libraries' own text.
FORBIDDEN = [
    (r"(?<![\w.-])/(?:opt|usr|work|tmp|home|root|var|dev|proc|srv|build)/", "a server path"),
    (r"\b(?:127\.0\.0\.1|localhost|0\.0\.0\.0|\[::1?\]):\d+", "a host:port"),
    (r"redis://", "a store URL"),
    (r"Check failed", "an XGrammar check"),
    (r"The JSON string is", "XGrammar's echo of the whole schema"),
    (r"\bc10\b|c10::|Exception raised from|at::Tensor|CUDA error", "LibTorch's text"),
    (r"[\w-]+\.(?:cc|cpp|cxx|h|hpp|c):\d+", "a source file:line"),
    (r"\bpicojson\b|\bLogFatal|\bhiredis\b|std::|json\.exception", "a library's internal text"),
]


def violations(message, extra_paths=()):
    """Why `message` (what a client read) breaks the rules; [] when it does not."""
    out = []
    size = len(message.encode("utf-8", "surrogateescape"))
    if size > MAX_MESSAGE_BYTES:
        out.append(f"{size} bytes (bound {MAX_MESSAGE_BYTES})")
    for pattern, what in FORBIDDEN:
        if m := re.search(pattern, message):
            out.append(f"{what} ({m.group(0)!r})")
    for path in extra_paths:
        if len(path) > 1 and path in message:
            out.append(f"the server path {path!r}")
    return out


# ---- a fake Redis that fails every command ----------------------------------------------------

class FailingRedis:
    """A RESP server on 127.0.0.1 that answers PING with PONG and every other command with an
    error reply naming a source file and line, the way a store's internal failure might read."""

    REPLY = b"-ERR internal failure at /usr/src/redis/src/server.c:4242 (assertion)\r\n"

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        buf = b""
        with conn:
            while True:
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    return
                if not chunk:
                    return
                buf += chunk
                while (command := self._parse(buf)) is not None:
                    argv, buf = command
                    conn.sendall(b"+PONG\r\n" if argv[:1] == [b"PING"] else self.REPLY)

    @staticmethod
    def _parse(buf):
        """(argv, rest) of the first whole RESP array in buf, or None."""
        if not buf.startswith(b"*") or b"\r\n" not in buf:
            return None
        head, rest = buf.split(b"\r\n", 1)
        argv = []
        for _ in range(int(head[1:])):
            if b"\r\n" not in rest:
                return None
            length, rest = rest.split(b"\r\n", 1)
            n = int(length[1:])
            if len(rest) < n + 2:
                return None
            argv.append(rest[:n].upper() if not argv else rest[:n])
            rest = rest[n + 2:]
        return argv, rest

    def close(self):
        self.stopped = True
        self.sock.close()


# ---- fixtures ---------------------------------------------------------------------------------

def _closed_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """The shipped models, and `broken`: tost-digits whose weights are /dev/zero."""
    root = tmp_path_factory.mktemp("hygiene") / "repo"
    root.mkdir()
    for shipped in (VISION, LM):
        os.symlink(os.path.join(SOURCE_DIR, "models", shipped), root / shipped)
    src = os.path.join(SOURCE_DIR, "models", VISION)
    dst = root / BROKEN
    dst.mkdir()
    for f in os.listdir(src):
        if f not in ("config.json", "model.safetensors"):
            os.symlink(os.path.join(src, f), dst / f)
    config = open(os.path.join(src, "config.json")).read()
    (dst / "config.json").write_text(config.replace(f'"name": "{VISION}"', f'"name": "{BROKEN}"', 1))
    os.symlink("/dev/zero", dst / "model.safetensors")
    return str(root)


@pytest.fixture(scope="module")
def servers(repo, tmp_path_factory):
    d = tmp_path_factory.mktemp("hygiene-keys")
    keys = d / "api_keys"
    keys.write_text(f"hygiene {KEY}\n")
    session_key = d / "session.key"
    session_key.write_bytes(os.urandom(32))
    fake = FailingRedis()
    store = [f"--session_key_file={session_key}", "--session_store_timeout_ms=300"]
    started = []
    try:
        started.append(RunningServer(repo, [f"--api_keys_file={keys}"]))
        started.append(RunningServer(repo, [f"--session_store=redis://127.0.0.1:{_closed_port()}/0", *store]))
        started.append(RunningServer(repo, [f"--session_store=redis://127.0.0.1:{fake.port}/0", *store]))
        yield started
    finally:
        for s in started:
            s.stop()
        fake.close()


# ---- the clients ------------------------------------------------------------------------------

class Collector:
    """Runs each case and keeps (where, code, message) of every error a client read."""

    def __init__(self):
        self.seen = []

    def grpc(self, where, call, code=None):
        try:
            call()
        except grpc.RpcError as e:
            self.seen.append((where, e.code().name, e.details() or ""))
            # Trailers too: the binary status details (grpc-status-details-bin) are where a server
            # detail would leak if the interceptor let it through.
            for key, value in (e.trailing_metadata() or ()):
                text = value.decode("latin-1") if isinstance(value, bytes) else value
                self.seen.append((f"{where} trailer {key}", e.code().name, text))
            if code is not None:
                assert e.code() == code, (where, e.code(), e.details())
            return e
        raise AssertionError(f"{where}: expected an error, the call succeeded")

    def text(self, where, message):
        """A client-facing string that is no RPC error (ListModels' error field, a trailer)."""
        self.seen.append((where, "-", message))

    def http(self, where, port, method, path, body=None, headers=None, status=None):
        payload = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
            lines += [f"{k}: {v}" for k, v in (headers if headers is not None else BEARER).items()]
            if payload is not None and not any(k.lower() == "content-length" for k in (headers or {})):
                lines.append(f"Content-Length: {len(payload)}")
            s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + (payload or b""))
            raw = b""
            try:
                while chunk := s.recv(65536):
                    raw += chunk
            except (ConnectionResetError, socket.timeout):
                pass
        head, _, rest = raw.partition(b"\r\n\r\n")
        code = int(head.split(b" ", 2)[1])
        if b"transfer-encoding: chunked" in head.lower():
            rest = _unchunk(rest)
        messages = []
        for text in [rest] + [line[6:] for line in rest.split(b"\n") if line.startswith(b"data: {")]:
            try:
                doc = json.loads(text)
            except ValueError:
                continue
            err = doc.get("error") or (doc.get("response") or {}).get("error") or {}
            if isinstance(err, dict) and "message" in err:
                messages.append(err["message"])
        assert code >= 400 or messages, (where, code, raw[:300])
        if not messages:
            messages = [rest.decode("utf-8", "replace")]
        for m in messages:
            self.seen.append((where, str(code), m))
        if status is not None:
            assert code == status, (where, code, raw[:500])
        return code, messages


def _unchunk(body):
    out = b""
    while body:
        size, _, body = body.partition(b"\r\n")
        n = int(size.split(b";")[0] or b"0", 16)
        if n == 0:
            break
        out += body[:n]
        body = body[n + 2:]
    return out


def _chat(model=LM, **kw):
    return {"model": model, "messages": [{"role": "user", "content": "It was"}], "max_tokens": 2, **kw}


BAD_JSON_SCHEMA = '{"type": "object", "properties": '
# A schema that is no JSON, 60 KB long (schemas may be 64 KiB): XGrammar's refusal quoted all of it.
BIG_BAD_SCHEMA = '{"enum": ["' + "x" * 60_000 + '", ]}'


def _constraints(pb2):
    return {
        "unknown type": pb2.Constraint(json_schema='{"type": "nonsense"}'),
        "not JSON": pb2.Constraint(json_schema=BAD_JSON_SCHEMA),
        "60 KB not JSON": pb2.Constraint(json_schema=BIG_BAD_SCHEMA),
        "unknown type 5 KB": pb2.Constraint(json_schema=json.dumps({"type": "t" * 5000})),
        "number past double": pb2.Constraint(json_schema='{"enum": [{"a": 1e400}]}'),
        "regex": pb2.Constraint(regex="([a-z"),
        "regex 50 KB": pb2.Constraint(regex="a" * 50_000 + "("),
        "grammar": pb2.Constraint(grammar='root ::= ???'),
        "grammar undefined rule": pb2.Constraint(grammar='root ::= "a" | ' + "r" * 5000),
    }


def test_every_error_class_is_bounded_and_names_nothing_of_the_server(servers, repo, proto_modules):
    keyed, down, failing = servers
    pb2, pb2_grpc = proto_modules
    c = Collector()
    build_dir = os.path.dirname(os.path.dirname(os.environ.get("TOST_SERVER_BIN", "")))
    extra_paths = sorted({SOURCE_DIR, repo, os.path.realpath(repo), build_dir})

    with grpc.insecure_channel(keyed.address) as ch:
        stub = pb2_grpc.TostStub(ch)
        ks = kserve_grpc.GRPCInferenceServiceStub(ch)
        inv, nf = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
        tensor = pb2.FloatTensor(shape=[1, 1, 32, 32], raw=b"\0" * 4096)
        # Bad fields, unknown and failed models.
        c.grpc("Classify top_k=-1", lambda: stub.Classify(pb2.ClassifyRequest(
            model=VISION, tensor=tensor, top_k=-1), metadata=AUTH), inv)
        c.grpc("Classify unknown model", lambda: stub.Classify(pb2.ClassifyRequest(
            model="no-such-model", tensor=tensor), metadata=AUTH), nf)
        c.grpc("Classify 300 KB model name", lambda: stub.Classify(pb2.ClassifyRequest(
            model=BIG, tensor=tensor), metadata=AUTH), nf)
        c.grpc("Classify failed model", lambda: stub.Classify(pb2.ClassifyRequest(
            model=BROKEN, tensor=tensor), metadata=AUTH), grpc.StatusCode.FAILED_PRECONDITION)
        c.grpc("Generate on a classifier", lambda: list(stub.Generate(pb2.GenerateRequest(
            model=VISION, prompt_bytes=b"x", max_new_tokens=1), metadata=AUTH)), inv)
        c.grpc("Generate max_new_tokens past the bound", lambda: list(stub.Generate(pb2.GenerateRequest(
            model=LM, prompt_bytes=b"x", max_new_tokens=1 << 30), metadata=AUTH)))
        listed = stub.ListModels(pb2.ListModelsRequest(), metadata=AUTH).models
        failed = [m for m in listed if m.name == BROKEN]
        assert failed and not failed[0].ready and failed[0].error, listed
        for m in listed:
            if m.error:
                c.text(f"ListModels error of {m.name}", m.error)
        c.text("ModelInfo error", stub.ModelInfo(pb2.ModelInfoRequest(model=BROKEN), metadata=AUTH).error)
        # Sessions: not found, busy, a bad state blob.
        c.grpc("Generate unknown session", lambda: list(stub.Generate(pb2.GenerateRequest(
            session_id="no-such-session", prompt_bytes=b"x", max_new_tokens=1), metadata=AUTH)), nf)
        c.grpc("CloseSession 300 KB id", lambda: stub.CloseSession(pb2.SessionRef(session_id=BIG),
                                                                    metadata=AUTH), nf)
        session = stub.CreateSession(pb2.CreateSessionRequest(model=LM), metadata=AUTH).session_id
        running = stub.Generate(pb2.GenerateRequest(session_id=session, prompt_bytes=b"It was",
                                                    max_new_tokens=2000), metadata=AUTH)
        next(running)  # the session is checked out now
        c.grpc("Generate busy session", lambda: list(stub.Generate(pb2.GenerateRequest(
            session_id=session, prompt_bytes=b"x", max_new_tokens=1), metadata=AUTH)))
        running.cancel()
        c.grpc("ImportSession garbage", lambda: stub.ImportSession(pb2.ImportSessionRequest(
            state=b"garbage"), metadata=AUTH), inv)
        c.grpc("Generate forged state", lambda: list(stub.Generate(pb2.GenerateRequest(
            state=b"TOSTSESS" + os.urandom(300), max_new_tokens=1), metadata=AUTH)))
        # Constraints the compiler refuses.
        for name, constraint in _constraints(pb2).items():
            c.grpc(f"Generate constraint {name}", lambda: list(stub.Generate(pb2.GenerateRequest(
                model=LM, prompt_bytes=b"x", max_new_tokens=2, constraint=constraint), metadata=AUTH)), inv)
        # Keys.
        c.grpc("ListModels without a key", lambda: stub.ListModels(pb2.ListModelsRequest()),
               grpc.StatusCode.UNAUTHENTICATED)
        c.grpc("ListModels with a wrong key", lambda: stub.ListModels(
            pb2.ListModelsRequest(), metadata=(("x-api-key", "wrong-key-0123456789"),)),
            grpc.StatusCode.UNAUTHENTICATED)
        # KServe.
        image = kserve.ModelInferRequest.InferInputTensor(name="image", datatype="FP32", shape=[1, 1, 32, 32])
        image.contents.fp32_contents.extend([0.0] * 1024)
        c.grpc("ModelInfer failed model", lambda: ks.ModelInfer(kserve.ModelInferRequest(
            model_name=BROKEN, inputs=[image]), metadata=AUTH), grpc.StatusCode.FAILED_PRECONDITION)
        c.grpc("ModelInfer unknown model", lambda: ks.ModelInfer(kserve.ModelInferRequest(
            model_name="no-such-model", inputs=[image]), metadata=AUTH), nf)
        c.grpc("ModelInfer 300 KB version", lambda: ks.ModelInfer(kserve.ModelInferRequest(
            model_name=VISION, model_version=BIG, inputs=[image]), metadata=AUTH), nf)
        bad = kserve.ModelInferRequest.InferInputTensor(name="image", datatype="F" * 5000, shape=[1, 1, 32, 32])
        c.grpc("ModelInfer bad datatype", lambda: ks.ModelInfer(kserve.ModelInferRequest(
            model_name=VISION, inputs=[bad]), metadata=AUTH), inv)
        ready, call = ks.ModelReady.with_call(kserve.ModelReadyRequest(name=BROKEN), metadata=AUTH)
        assert not ready.ready
        for key, value in call.trailing_metadata() or ():
            c.text(f"ModelReady trailer {key}", value)
        c.grpc("ModelMetadata failed model", lambda: ks.ModelMetadata(
            kserve.ModelMetadataRequest(name=BROKEN), metadata=AUTH))

    port = keyed.http_port
    # The HTTP layer's own answers, and keys.
    c.http("HTTP without a key", port, "GET", "/v1/models", headers={}, status=401)
    c.http("HTTP wrong key", port, "GET", "/v1/models",
           headers={"Authorization": "Bearer wrong-key-0123456789"}, status=401)
    c.http("HTTP 404", port, "GET", "/v1/" + "n" * 8000, status=404)
    c.http("HTTP 404 DELETE", port, "DELETE", "/v1/chat/" + "m" * 8000, status=404)
    c.http("HTTP 405", port, "DELETE", "/v1/models", status=405)
    c.http("HTTP 413", port, "POST", "/v1/chat/completions",
           headers={**BEARER, "Content-Length": str(64 << 20)}, status=413)
    c.http("HTTP 431", port, "GET", "/v1/models", headers={**BEARER, "X-Big": "h" * (64 << 10)}, status=431)
    c.http("HTTP malformed JSON", port, "POST", "/v1/chat/completions", body=b'{"model": ', status=400)
    # The OpenAI routes.
    c.http("chat bad field", port, "POST", "/v1/chat/completions", _chat(max_tokens=-1), status=400)
    c.http("chat unknown model", port, "POST", "/v1/chat/completions", _chat(model="no-such-model"), status=404)
    c.http("chat 300 KB model", port, "POST", "/v1/chat/completions", _chat(model=BIG), status=404)
    c.http("chat failed model", port, "POST", "/v1/chat/completions", _chat(model=BROKEN), status=400)
    c.http("completions failed model", port, "POST", "/v1/completions",
           {"model": BROKEN, "prompt": "x", "max_tokens": 1}, status=400)
    c.http("chat bad state", port, "POST", "/v1/chat/completions", _chat(state="!!!"), status=400)
    c.http("chat forged state", port, "POST", "/v1/chat/completions",
           _chat(state="VE9TVFNFU1M" + "A" * 400), status=400)
    c.http("chat unknown session", port, "POST", "/v1/chat/completions",
           _chat(session_id="no-such-session"), status=404)
    for name, extra in {
            "json_schema unknown type": {"response_format": {"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "nonsense"}}}},
            "guided_json not JSON": {"guided_json": BAD_JSON_SCHEMA},
            "guided_json 60 KB not JSON": {"guided_json": BIG_BAD_SCHEMA},
            "guided_regex": {"guided_regex": "([a-z"},
            "guided_regex 50 KB": {"guided_regex": "a" * 50_000 + "("},
            "guided_grammar": {"guided_grammar": 'root ::= ???'},
            "guided_grammar undefined rule": {"guided_grammar": 'root ::= "a" | ' + "r" * 5000}}.items():
        c.http(f"chat {name}", port, "POST", "/v1/chat/completions", _chat(**extra), status=400)
        c.http(f"chat stream {name}", port, "POST", "/v1/chat/completions", _chat(stream=True, **extra), status=400)
    # The Responses API.
    c.http("responses bad field", port, "POST", "/v1/responses",
           {"model": LM, "input": "x", "max_output_tokens": -5}, status=400)
    c.http("responses unknown previous", port, "POST", "/v1/responses",
           {"model": LM, "input": "x", "previous_response_id": "resp_" + "0" * 32}, status=404)
    c.http("responses failed model", port, "POST", "/v1/responses", {"model": BROKEN, "input": "x"}, status=400)
    c.http("responses text.format not JSON", port, "POST", "/v1/responses", {
        "model": LM, "input": "x", "max_output_tokens": 2,
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "t" * 5000}}}}, status=400)
    c.http("responses forged state", port, "POST", "/v1/responses",
           {"model": LM, "input": "x", "store": False, "state": "VE9TVFNFU1M" + "A" * 400}, status=400)
    c.http("responses get unknown", port, "GET", "/v1/responses/resp_" + "1" * 32, status=404)
    c.http("conversations get 8 KB id", port, "GET", "/v1/conversations/" + "c" * 8000, status=404)

    # A store that is down: UNAVAILABLE / 503.
    with grpc.insecure_channel(down.address) as ch:
        stub = pb2_grpc.TostStub(ch)
        c.grpc("CreateSession store down", lambda: stub.CreateSession(pb2.CreateSessionRequest(model=LM)),
               grpc.StatusCode.UNAVAILABLE)
        c.grpc("Generate session store down", lambda: list(stub.Generate(pb2.GenerateRequest(
            session_id="sess-" + uuid.uuid4().hex, prompt_bytes=b"x", max_new_tokens=1))))
    c.http("responses store down", down.http_port, "POST", "/v1/responses",
           {"model": LM, "input": "x", "max_output_tokens": 2}, headers={"Content-Type": "application/json"},
           status=503)
    c.http("responses get store down", down.http_port, "GET", "/v1/responses/resp_" + "2" * 32, headers={},
           status=503)
    c.http("conversations store down", down.http_port, "POST", "/v1/conversations", {},
           headers={"Content-Type": "application/json"}, status=503)

    # A store that fails inside: INTERNAL / 500.
    with grpc.insecure_channel(failing.address) as ch:
        stub = pb2_grpc.TostStub(ch)
        c.grpc("CreateSession store failing", lambda: stub.CreateSession(pb2.CreateSessionRequest(model=LM)))
    c.http("responses store failing", failing.http_port, "POST", "/v1/responses",
           {"model": LM, "input": "x", "max_output_tokens": 2}, headers={"Content-Type": "application/json"})
    c.http("responses get store failing", failing.http_port, "GET", "/v1/responses/resp_" + "3" * 32,
           headers={})

    codes = {code for _, code, _ in c.seen}
    for expected in ("INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION", "UNAUTHENTICATED",
                     "UNAVAILABLE", "400", "401", "404", "405", "413", "431", "503"):
        assert expected in codes, f"no {expected} among {sorted(codes)}"
    assert "INTERNAL" in codes or "UNKNOWN" in codes, sorted(codes)
    assert "500" in codes, sorted(codes)
    problems = [f"{where} [{code}]: {'; '.join(why)}: {message[:240]!r}" for where, code, message in c.seen
                if (why := violations(message, extra_paths))]
    print(f"\n{len(c.seen)} client-facing messages checked")
    for where, code, message in c.seen:
        print(f"  {where} [{code}] {len(message.encode())} B: {message[:160]!r}")
    assert not problems, f"{len(problems)} of {len(c.seen)} messages break the rules:\n" + "\n".join(problems)
    for s in servers:
        assert s.alive(), s.log_text()[-2000:]


def test_what_a_client_is_not_told_is_logged_under_its_request_id(servers, proto_modules):
    keyed, _, failing = servers
    pb2, pb2_grpc = proto_modules
    with grpc.insecure_channel(keyed.address) as ch:
        stub = pb2_grpc.TostStub(ch)
        rid = "hygiene-schema-" + uuid.uuid4().hex[:8]
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Generate(pb2.GenerateRequest(
                model=LM, prompt_bytes=b"x", max_new_tokens=2,
                constraint=pb2.Constraint(json_schema=BIG_BAD_SCHEMA)),
                metadata=AUTH + (("x-request-id", rid),)))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "json_schema" in e.value.details() and len(e.value.details()) <= MAX_MESSAGE_BYTES
    with grpc.insecure_channel(failing.address) as ch:
        stub = pb2_grpc.TostStub(ch)
        internal_rid = "hygiene-internal-" + uuid.uuid4().hex[:8]
        with pytest.raises(grpc.RpcError) as e:
            stub.CreateSession(pb2.CreateSessionRequest(model=LM), metadata=(("x-request-id", internal_rid),))
        assert e.value.code() == grpc.StatusCode.INTERNAL, e.value.details()
        # The client reads which request to ask about; the log has what went wrong.
        assert internal_rid in e.value.details(), e.value.details()
    deadline = time.monotonic() + 10
    while True:
        keyed_log, failing_log = keyed.log_text(), failing.log_text()
        schema_lines = [line for line in keyed_log.splitlines() if rid in line]
        internal_lines = [line for line in failing_log.splitlines() if internal_rid in line]
        if (any("Failed to parse JSON" in line for line in schema_lines)
                and any("server.c:4242" in line for line in internal_lines)) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert any("Failed to parse JSON" in line for line in schema_lines), schema_lines
    assert any("server.c:4242" in line for line in internal_lines), internal_lines
    assert any("127.0.0.1:" in line and "redis://" in line for line in internal_lines), internal_lines
