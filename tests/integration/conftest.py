"""Fixtures for end-to-end tests: a real tost_server on 127.0.0.1 with a free port, and Python
gRPC stubs generated from our .proto files at test time (grpcio-tools, pinned in requirements.txt).

Both come from the repository's helpers in tools/pylib (tost_launch.py, tost_protos.py), which this
file puts on sys.path once: every test module (and failover_proxy.py) imports conftest first, so
`import tost_launch` and `import tost_protos` work in them too, under ctest or pytest alike. So does
`import tost_harness` (tools/pylib/tost_harness.py): the one metrics scraper (scrape_metrics,
metric_value, wait_for_metric) and the one Generate stream decoder (collect_generate) the tests
share."""
import os
import re
import subprocess
import sys
import time

import grpc
import pytest

SOURCE_DIR = os.environ.get("TOST_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
PYLIB = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "pylib"))
if PYLIB not in sys.path:
    sys.path.insert(0, PYLIB)
import tost_harness  # noqa: E402
import tost_launch  # noqa: E402
import tost_protos  # noqa: E402


def _binary(var: str) -> str:
    path = os.environ.get(var)
    if not path or not os.path.exists(path):
        pytest.fail(f"{var} must point at the built binary (run through ctest)")
    return path


@pytest.fixture(scope="session")
def proto_modules():
    """(tost_pb2, tost_pb2_grpc), generated from proto/tost/v1/tost.proto (tools/pylib/tost_protos.py)."""
    return tost_protos.tost()


class RunningServer(tost_launch.TostServer):
    """$TOST_SERVER_BIN on `repo` with `extra_args`, on 127.0.0.1 with a free port, metrics port and
    HTTP port and one intra-op thread, started by the time the constructor returns (its listening
    line read). Attributes: port, address, metrics_port (None with --metrics_port=-1), http_port
    (None with --http_port=-1), proc (the Popen), log (its stderr's file: log.name); stop() returns
    the exit status. See tools/pylib/tost_launch.py."""

    def __init__(self, repo: str, extra_args=()):
        super().__init__(repo, list(extra_args), binary=_binary("TOST_SERVER_BIN"))


def generator_status(status_response, model):
    """The GeneratorStatus of `model` in a ServerStatusResponse."""
    (g,) = [g for g in status_response.generators if g.model == model]
    return g


def concurrent_generates(stub, pb2, model, streams=64, tokens=16):
    """`streams` Generate calls released together (seeded sampling, one seed each); returns each
    stream's token ids and fails the test if any call failed."""
    import threading

    barrier = threading.Barrier(streams)
    results, errors = [None] * streams, []

    def run(i):
        try:
            barrier.wait()
            results[i] = tost_harness.collect_generate(stub.Generate(pb2.GenerateRequest(
                model=model, prompt_bytes=b"x", max_new_tokens=tokens,
                sampling=pb2.SamplingParams(temperature=1.0, seed=i)), timeout=300)).ids
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    return results


def proc_status(pid):
    """VmRSS, VmHWM (kB) and Threads of a process, from /proc/<pid>/status."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, value = line.split(":", 1)
            if key in ("VmRSS", "VmHWM", "Threads"):
                out[key] = int(value.split()[0])
    return out


@pytest.fixture(scope="session")
def server():
    s = RunningServer(os.path.join(SOURCE_DIR, "models"))
    yield s
    assert s.stop() == 0, "tost_server did not exit cleanly on SIGTERM"


@pytest.fixture(scope="module")
def srv():
    """A server of the shipped models for one test module: its own log, caches and sessions."""
    s = RunningServer(os.path.join(SOURCE_DIR, "models"))
    yield s
    assert s.stop() == 0, "tost_server did not exit cleanly on SIGTERM"


def openai_client(srv, api_key="none", timeout=120, **kw):
    """The unmodified openai client on srv's HTTP port, with no retries: a retry would hide a
    refusal the test means to see."""
    import openai  # only the OpenAI tests need it

    return openai.OpenAI(base_url=f"http://127.0.0.1:{srv.http_port}/v1", api_key=api_key, max_retries=0,
                         timeout=timeout, **kw)


@pytest.fixture(scope="session")
def channel(server):
    ch = grpc.insecure_channel(server.address)
    grpc.channel_ready_future(ch).result(timeout=30)
    yield ch
    ch.close()


@pytest.fixture(scope="session")
def stub(channel, proto_modules):
    _, tost_pb2_grpc = proto_modules
    return tost_pb2_grpc.TostStub(channel)


@pytest.fixture(scope="module")
def key_file(tmp_path_factory):
    """A random --session_key_file shared by a module's servers (replicas continue each other's
    sessions and blobs only with the same key)."""
    path = tmp_path_factory.mktemp("keys") / "session.key"
    path.write_bytes(os.urandom(32))
    return str(path)


class HeldLoading:
    """A repository of one tost-austen model (austen-00, weights linked) and what holds a server
    inside its model loading for as long as the test needs: tests/integration/open_gate.c, preloaded
    into the server ($TOST_OPEN_GATE_LIB), stops its first open() under the repository until
    release(). Start the server with env=held.env and wait=False; reached() waits until it is held
    there (which also proves the gate still catches what the loader opens). Then the server is
    loading whatever the machine's speed: no race against a slow repository, nothing to skip."""

    def __init__(self, tmp_path):
        repo = tmp_path / "repo"
        (repo / "austen-00").mkdir(parents=True)
        source = os.path.join(SOURCE_DIR, "models", "tost-austen")
        with open(os.path.join(source, "config.json")) as f:
            config = f.read()
        (repo / "austen-00" / "config.json").write_text(config.replace('"name": "tost-austen"', '"name": "austen-00"'))
        for name in os.listdir(source):
            if name != "config.json":
                os.symlink(os.path.join(source, name), repo / "austen-00" / name)
        self.repo = str(repo)
        self.gate = tmp_path / "open_gate"
        self.gate.touch()
        preload = " ".join(p for p in (os.environ.get("LD_PRELOAD"), _binary("TOST_OPEN_GATE_LIB")) if p)
        self.env = dict(os.environ, LD_PRELOAD=preload, TOST_OPEN_GATE=str(self.gate),
                        TOST_OPEN_GATE_PREFIX=self.repo + os.sep)

    def reached(self, server, timeout_s=60):
        """Until `server` waits at the gate, inside its model loading."""
        marker = f"{self.gate}.reached"
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(marker):
            assert server.alive(), server.log_text()
            assert time.monotonic() < deadline, (
                f"the server never opened a file under {self.repo}: the loader no longer reads the models "
                f"with open()/openat(), which tests/integration/open_gate.c intercepts; log:\n{server.log_text()}")
            time.sleep(0.005)

    def release(self):
        """Lets the held open() and every later one through."""
        self.gate.unlink(missing_ok=True)


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A test CA (ca.pem) and certificates it signed, made with the openssl tool: server.pem for
    localhost and 127.0.0.1, client certificates alice.pem and bob.pem (each with its .key)."""
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=tost-test-ca", cwd=d)
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name, ext in (("server", ["-extfile", "san.ext"]), ("alice", []), ("bob", [])):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", *ext, cwd=d)
    return d


def port_while_loading(server, key="port", timeout_s=60):
    """The port named `key` (port, http_port) in the 'loading models' line of `server`'s log: a
    server started with wait=False writes it before its first model loads, when only that line
    says where it listens."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert server.alive(), server.log_text()
        m = re.search(rf"loading models .*\b{key}=(\d+)", server.log_text())
        if m:
            return int(m.group(1))
        assert time.monotonic() < deadline, f"no 'loading models' line: {server.log_text()}"
        time.sleep(0.005)
