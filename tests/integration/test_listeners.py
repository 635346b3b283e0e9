"""Where a real tost_server's listeners bind and what each serves without an API key.

Addresses: --host is every listener's address (gRPC, the HTTP front end, /metrics) unless
--http_address or --metrics_address says otherwise; each case reads the addresses the server's
listening sockets are bound to (/proc), the addresses it prints on stdout and its start-up
`listening` log lines.

Keys: with --api_keys_file every route of every listener needs one, except the probes
(grpc.health.v1 Check and Watch; GET /v1/health/live and /v1/health/ready) and /metrics unless
--metrics_require_api_key. Every gRPC method the server's own reflection lists, every HTTP route and
/metrics are called without a key, with an unknown one and with the right one, and the `listening`
lines must say the same.

Servers here load tost-digits alone (a repository of one symlink), so each starts in about a second.
"""
import http.client
import json
import os
import socket
import subprocess

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

import tost_launch
from conftest import SOURCE_DIR, _binary

KEY = "listeners-test-key-0123456789"
WRONG = "not-a-key-of-this-server-0123"
LOOPBACK = {"127.0.0.1", "::1"}
WILDCARD = {"0.0.0.0", "::"}
GRPC_PROBES = {"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"}
HTTP_PROBES = [("GET", "/v1/health/live"), ("GET", "/v1/health/ready"),
               ("HEAD", "/v1/health/live"), ("HEAD", "/v1/health/ready")]
# Every route of the HTTP front end (service/server.cc, service/openai_http), and paths no route has.
HTTP_ROUTES = [
    ("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
    ("POST", "/v1/responses"), ("GET", "/v1/responses/resp_x"), ("DELETE", "/v1/responses/resp_x"),
    ("GET", "/v1/responses/resp_x/input_items"), ("POST", "/v1/conversations"),
    ("GET", "/v1/conversations/conv_x"), ("POST", "/v1/conversations/conv_x"),
    ("DELETE", "/v1/conversations/conv_x"), ("GET", "/v1/conversations/conv_x/items"),
    ("POST", "/v1/conversations/conv_x/items"), ("GET", "/v1/conversations/conv_x/items/item_x"),
    ("DELETE", "/v1/conversations/conv_x/items/item_x"),
    ("GET", "/no/such/route"), ("DELETE", "/v1/models"), ("POST", "/v1/health/live"),
]


class Server(tost_launch.TostServer):
    """tost_server on `repo` with free ports (gRPC, HTTP, metrics), JSON logs and exactly `args`
    for the rest: TostServer itself always passes --http_address and --metrics_address, which would
    hide what --host does."""

    def __init__(self, repo, args=()):
        self.metrics_port = None
        self.http_port = None
        self.stdout_lines = []
        tost_launch.ServerProcess.__init__(
            self, [_binary("TOST_SERVER_BIN"), f"--model_repository={repo}", "--port=0", "--http_port=0",
                   "--metrics_port=0", "--intra_op_threads=1", "--log_format=json", *args],
            name="tost_server")

    def listening_lines(self):
        """The start-up `listening` log lines, by listener name."""
        lines = [json.loads(line) for line in self.log_text().splitlines() if line.startswith("{")]
        return {line["listener"]: line for line in lines if line.get("msg") == "listening"}

    def _expect(self, pattern, what):
        m = super()._expect(pattern, what)
        self.stdout_lines.append(m.string)  # the whole line the ready pattern matched
        return m


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    d = tmp_path_factory.mktemp("listeners") / "repo"
    d.mkdir()
    os.symlink(os.path.join(SOURCE_DIR, "models", "tost-digits"), d / "tost-digits")
    return str(d)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    path = tmp_path_factory.mktemp("listener_keys") / "keys"
    path.write_text(f"alice {KEY}\n")
    return str(path)


def _address(hex_address):
    """The address of a /proc/net/tcp{,6} "ADDR:PORT" field: (text, port)."""
    addr, port = hex_address.split(":")
    raw = bytes.fromhex(addr)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1]), int(port, 16)
    # IPv6: four 32-bit words, each in host (little-endian) order. gRPC binds an IPv4 address as
    # its IPv4-mapped IPv6 one (::ffff:127.0.0.1), which is the IPv4 address all the same.
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    if raw[:12] == b"\0" * 10 + b"\xff\xff":
        return socket.inet_ntop(socket.AF_INET, raw[12:]), int(port, 16)
    return socket.inet_ntop(socket.AF_INET6, raw), int(port, 16)


def bound_addresses(pid):
    """{port: {address, ...}} of the TCP sockets process `pid` listens on."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    out = {}
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            next(f)
            for row in f:
                fields = row.split()
                if fields[3] == "0A" and fields[9] in inodes:  # TCP_LISTEN, this process's
                    address, port = _address(fields[1])
                    out.setdefault(port, set()).add(address)
    return out


def _scope(addresses):
    """"loopback" when every address is this machine's own, "any" when one is a wildcard."""
    assert addresses, "nothing listens there"
    if addresses & WILDCARD:
        return "any"
    assert addresses <= LOOPBACK, addresses
    return "loopback"


def _other_local_address():
    """An IPv4 address of this machine other than loopback, or None: the route the kernel would
    pick towards a documentation address (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.123", 9))
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def _reachable(address, port):
    try:
        with socket.create_connection((address, port), timeout=2):
            return True
    except OSError:
        return False


# ---- addresses --------------------------------------------------------------------------------

@pytest.mark.parametrize("args, expected", [
    # --host alone keeps every listener local.
    (["--host=127.0.0.1"], {"grpc": "loopback", "http": "loopback", "metrics": "loopback"}),
    # Each listener's own flag overrides --host for it alone.
    (["--host=127.0.0.1", "--http_address=0.0.0.0"], {"grpc": "loopback", "http": "any", "metrics": "loopback"}),
    (["--host=127.0.0.1", "--metrics_address=0.0.0.0"], {"grpc": "loopback", "http": "loopback", "metrics": "any"}),
    (["--host=0.0.0.0", "--http_address=127.0.0.1", "--metrics_address="],
     {"grpc": "any", "http": "loopback", "metrics": "any"}),
], ids=["host", "http_address", "metrics_address", "empty_means_host"])
def test_host_is_every_listeners_address_unless_its_own_flag_says_otherwise(repo, args, expected):
    s = Server(repo, args)
    try:
        ports = {"grpc": s.port, "http": s.http_port, "metrics": s.metrics_port}
        bound = bound_addresses(s.pid)
        assert {name: _scope(bound.get(port, set())) for name, port in ports.items()} == expected, bound
        # The start-up log names each listener with the address it binds.
        lines = s.listening_lines()
        assert set(lines) == set(ports), lines
        for name, port in ports.items():
            assert lines[name]["port"] == port, lines[name]
            assert _scope({lines[name]["address"]}) == expected[name], lines[name]
        # A loopback listener cannot be reached on the machine's other address; the others can.
        other = _other_local_address()
        if other is not None:
            for name, port in ports.items():
                assert _reachable(other, port) == (expected[name] == "any"), (name, other, port)
    finally:
        assert s.stop() == 0


def test_stdout_prints_the_address_each_listener_binds(repo):
    """The `tost_server ... on ADDRESS:PORT` lines (what scripts read) name the address bound,
    --host's for a listener without its own flag."""
    s = Server(repo, ["--host=127.0.0.1", "--metrics_address=0.0.0.0"])
    try:
        assert s.stdout_lines == [f"tost_server listening on 127.0.0.1:{s.port}",
                                  f"tost_server metrics on 0.0.0.0:{s.metrics_port}",
                                  f"tost_server http on 127.0.0.1:{s.http_port}"], s.stdout_lines
    finally:
        assert s.stop() == 0


# ---- keys -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def keyed(repo, keys):
    s = Server(repo, ["--host=127.0.0.1", f"--api_keys_file={keys}"])
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def keyed_channel(keyed):
    with grpc.insecure_channel(keyed.address) as ch:
        grpc.channel_ready_future(ch).result(timeout=30)
        yield ch


def _methods(channel):
    """{"/service/Method": (client streaming, server streaming)} of every service the server's
    reflection lists (with the key), from the descriptors it serves (grpc.health.v1's, which the
    server does not hold, from grpcio-health-checking's)."""
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    md = (("x-api-key", KEY),)
    (listing,) = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                           metadata=md, timeout=10)
    services = [s.name for s in listing.list_services_response.service]
    assert {"tost.v1.Tost", "inference.GRPCInferenceService", "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection"} <= set(services), services
    methods = {}
    for name in services:
        if name == "grpc.health.v1.Health":
            # The two methods gRPC 1.51's health service has (grpcio-health-checking's proto may
            # be newer and list more).
            service = health_pb2.DESCRIPTOR.services_by_name["Health"]
            for m in service.methods:
                if f"/{name}/{m.name}" in GRPC_PROBES:
                    methods[f"/{name}/{m.name}"] = (m.client_streaming, m.server_streaming)
            continue
        (answer,) = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol=name)]), metadata=md, timeout=10)
        files = [descriptor_pb2.FileDescriptorProto.FromString(b)
                 for b in answer.file_descriptor_response.file_descriptor_proto]
        package, _, short = name.rpartition(".")
        (service,) = [s for f in files if f.package == package for s in f.service if s.name == short]
        for m in service.method:
            methods[f"/{name}/{m.name}"] = (m.client_streaming, m.server_streaming)
    return methods


def _call(channel, path, streaming, metadata):
    """The status code of `path` called with an empty request (one, for a client stream): OK once
    its first answer comes, the error code otherwise."""
    client_streaming, server_streaming = streaming
    identity = bytes
    kinds = {(False, False): channel.unary_unary, (False, True): channel.unary_stream,
             (True, False): channel.stream_unary, (True, True): channel.stream_stream}
    method = kinds[(client_streaming, server_streaming)](
        path, request_serializer=identity, response_deserializer=identity)
    request = iter([b""]) if client_streaming else b""
    try:
        answer = method(request, metadata=metadata, timeout=10)
        if server_streaming:
            next(answer)
            answer.cancel()
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details() or ""


def test_with_keys_every_grpc_method_needs_one_but_health(keyed, keyed_channel):
    methods = _methods(keyed_channel)
    assert len(methods) >= 19, methods  # tost.v1 (10), KServe (6), health (2), reflection (1)
    for path, streaming in sorted(methods.items()):
        code, details = _call(keyed_channel, path, streaming, ())
        if path in GRPC_PROBES:
            assert code == grpc.StatusCode.OK, (path, code, details)
            continue
        assert code == grpc.StatusCode.UNAUTHENTICATED, (path, code, details)
        assert "missing API key" in details, (path, details)
        code, details = _call(keyed_channel, path, streaming, (("x-api-key", WRONG),))
        assert (code, details) == (grpc.StatusCode.UNAUTHENTICATED, "unknown API key"), path
        # With the key the method runs (and may refuse the empty request for its own reasons).
        for metadata in ((("x-api-key", KEY),), (("authorization", f"Bearer {KEY}"),)):
            code, details = _call(keyed_channel, path, streaming, metadata)
            assert code != grpc.StatusCode.UNAUTHENTICATED, (path, details)
    line = keyed.listening_lines()["grpc"]
    assert (line["api_key"], line["served_without_key"]) == ("required", "grpc.health.v1.Health"), line


def test_reflection_with_the_key_lists_and_describes_the_services(keyed_channel):
    stub = reflection_pb2_grpc.ServerReflectionStub(keyed_channel)
    requests = [reflection_pb2.ServerReflectionRequest(file_containing_symbol="tost.v1.Tost.Generate"),
                reflection_pb2.ServerReflectionRequest(file_containing_symbol="tost.v1.GenerateRequest"),
                reflection_pb2.ServerReflectionRequest(file_by_filename="kserve/v2/grpc_service.proto"),
                reflection_pb2.ServerReflectionRequest(file_containing_symbol="no.such.Symbol"),
                reflection_pb2.ServerReflectionRequest(all_extension_numbers_of_type="tost.v1.GenerateRequest"),
                reflection_pb2.ServerReflectionRequest()]
    answers = list(stub.ServerReflectionInfo(iter(requests), metadata=(("x-api-key", KEY),), timeout=10))
    assert len(answers) == len(requests)

    def files(answer):
        return [descriptor_pb2.FileDescriptorProto.FromString(b).name
                for b in answer.file_descriptor_response.file_descriptor_proto]

    assert files(answers[0]) == ["tost/v1/tost.proto"]
    assert answers[0].original_request == requests[0]
    # A second symbol of a file already sent still gets its file.
    assert files(answers[1]) == ["tost/v1/tost.proto"]
    assert files(answers[2]) == ["kserve/v2/grpc_service.proto"]
    assert answers[3].error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
    assert answers[4].all_extension_numbers_response.base_type_name == "tost.v1.GenerateRequest"
    assert answers[5].error_response.error_code == grpc.StatusCode.UNIMPLEMENTED.value[0]
    # A request protobuf refuses ends the stream INVALID_ARGUMENT naming the message, as on every
    # other service of the server.
    raw = keyed_channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                      request_serializer=bytes, response_deserializer=bytes)
    with pytest.raises(grpc.RpcError) as e:
        list(raw(iter([b"\x00"]), metadata=(("x-api-key", KEY),), timeout=10))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
    assert "ServerReflectionRequest" in e.value.details(), e.value.details()


def _request(port, method, path, headers=None):
    body = b"{}" if method == "POST" else None
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_with_keys_every_http_route_needs_one_but_the_probes(keyed):
    port = keyed.http_port
    for method, path in HTTP_PROBES:
        assert _request(port, method, path)[0] == 200, (method, path)
    for method, path in HTTP_ROUTES:
        status, headers, body = _request(port, method, path)
        assert status == 401 and headers.get("www-authenticate") == "Bearer", (method, path, status, body)
        assert "missing API key" in body.decode(), (method, path, body)
        status, _, body = _request(port, method, path, {"Authorization": f"Bearer {WRONG}"})
        assert status == 401 and "unknown API key" in body.decode(), (method, path, status, body)
        for auth in ({"Authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}):
            status, _, body = _request(port, method, path, auth)
            assert status != 401, (method, path, body)
    line = keyed.listening_lines()["http"]
    assert (line["api_key"], line["served_without_key"]) == \
        ("required", "GET /v1/health/live, GET /v1/health/ready"), line


def test_with_keys_metrics_stays_open_unless_a_flag_closes_it(keyed):
    """The documented exception: /metrics on its own port is served without a key by default, and
    the start-up line says so."""
    status, _, body = _request(keyed.metrics_port, "GET", "/metrics")
    assert status == 200 and b"tost_model_info" in body
    line = keyed.listening_lines()["metrics"]
    assert (line["api_key"], line["served_without_key"]) == \
        ("not required (--metrics_require_api_key=false)", "GET /metrics"), line


def test_metrics_require_api_key_refuses_scrapes_without_one(repo, keys):
    s = Server(repo, ["--host=127.0.0.1", f"--api_keys_file={keys}", "--metrics_require_api_key"])
    try:
        port = s.metrics_port
        for path in ("/metrics", "/other"):  # an unknown path is refused before its 404
            status, headers, body = _request(port, "GET", path)
            assert status == 401 and headers.get("www-authenticate") == "Bearer", (path, status, body)
            assert b"missing API key" in body, body
        status, _, body = _request(port, "GET", "/metrics", {"Authorization": f"Bearer {WRONG}"})
        assert status == 401 and b"unknown API key" in body
        for auth in ({"Authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}):
            status, _, body = _request(port, "GET", "/metrics", auth)
            assert status == 200 and b"tost_model_info" in body, (auth, status)
        line = s.listening_lines()["metrics"]
        assert (line["api_key"], line["served_without_key"]) == ("required", "nothing"), line
        # The probes stay open on the other ports.
        assert _request(s.http_port, "GET", "/v1/health/ready")[0] == 200
    finally:
        assert s.stop() == 0


def test_metrics_require_api_key_without_keys_stops_the_start(repo):
    proc = subprocess.run([_binary("TOST_SERVER_BIN"), f"--model_repository={repo}", "--host=127.0.0.1",
                           "--port=0", "--http_port=-1", "--metrics_port=0", "--metrics_require_api_key"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc
    assert "--metrics_require_api_key needs --api_keys_file" in proc.stderr, proc.stderr


def test_without_keys_the_start_up_lines_say_everything_is_open(repo):
    s = Server(repo, ["--host=127.0.0.1"])
    try:
        lines = s.listening_lines()
        for name in ("grpc", "http", "metrics"):
            assert lines[name]["api_key"] == "not required (no --api_keys_file)", lines[name]
            assert lines[name]["served_without_key"] == "everything", lines[name]
            assert lines[name]["tls"] == "off", lines[name]
    finally:
        assert s.stop() == 0
