"""The Python client as a package (client/python): its wheel built with the stubs generated at build
time, installed into a fresh virtual environment (no system site-packages, no PYTHONPATH, no proto/
reachable), and used there against real servers: classify, a streamed generation, the asyncio
client, constrained generations (a JSON schema, a regex, a grammar and a choice list, given as dicts
or as a Constraint; invalid dicts refused before any call), sessions moved between two servers,
errors, and a resumable generation that goes on on the second server when the first is killed
mid-stream (blocking and asyncio).

The wheel is built from a copy of client/python and proto/ laid out as in a checkout (so nothing is
written into the source tree) with this venv's setuptools and grpcio-tools (--no-build-isolation: no
network for the build); the fresh venv installs grpcio and protobuf with pip (its cache, or PyPI).
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

from conftest import SOURCE_DIR, RunningServer
from constrained_schemas import SCHEMAS, check_output

MODELS = os.path.join(SOURCE_DIR, "models")
PACKAGE = os.path.join(SOURCE_DIR, "client", "python")
PROTO = os.path.join("tost", "v1", "tost.proto")
GENERATED = {"tost_client/tost_pb2.py", "tost_client/tost_pb2.pyi", "tost_client/tost_pb2_grpc.py"}


def run(cmd, cwd=None, env=None, timeout=120):
    """Runs cmd; fails the test with its output unless it exits 0."""
    p = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{cmd} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p.stdout


def clean_env():
    """The environment without anything that would put the checkout's tost_client or proto/ in reach."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "TOST_PROTO_DIR", "TOST_CLIENT_CACHE_DIR", "VIRTUAL_ENV")}


def copy_checkout(root):
    """client/python and proto/tost/v1/tost.proto under root, as in a checkout."""
    shutil.copytree(PACKAGE, os.path.join(root, "client", "python"),
                    ignore=shutil.ignore_patterns("build", "dist", "proto", "*.egg-info", "__pycache__"))
    os.makedirs(os.path.join(root, "proto", "tost", "v1"))
    shutil.copyfile(os.path.join(SOURCE_DIR, "proto", PROTO), os.path.join(root, "proto", PROTO))
    return os.path.join(root, "client", "python")


def build_wheel(source, out):
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir", "-q",
         "-w", out, source], env=clean_env())
    (wheel,) = glob.glob(os.path.join(out, "tost_client-*.whl"))
    return wheel


def project_version():
    with open(os.path.join(SOURCE_DIR, "CMakeLists.txt")) as f:
        return re.search(r"project\(tost_serve VERSION (\S+)", f.read()).group(1)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return build_wheel(copy_checkout(tmp_path_factory.mktemp("checkout")), tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A fresh venv (the base interpreter's, without system site-packages) with the wheel installed;
    returns its python."""
    path = tmp_path_factory.mktemp("venv")
    base = getattr(sys, "_base_executable", sys.executable)
    run([base, "-m", "venv", path], env=clean_env())
    python = os.path.join(path, "bin", "python")
    run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel], env=clean_env(), timeout=300)
    return python


def test_the_wheel_holds_the_generated_stubs_and_the_projects_version(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = z.read(f"tost_client-{project_version()}.dist-info/METADATA").decode()
    assert GENERATED | {"tost_client/py.typed", "tost_client/client.py", "tost_client/resumable.py"} <= names
    assert not [n for n in names if n.startswith("tost/") or n.endswith(".proto")], sorted(names)
    assert os.path.basename(wheel).startswith(f"tost_client-{project_version()}-")
    # The lower bounds the generated code itself checks at import.
    assert re.search(r"^Requires-Dist: grpcio>=\d+\.\d+", metadata, re.M), metadata
    assert re.search(r"^Requires-Dist: protobuf>=\d+\.\d+", metadata, re.M), metadata
    assert "Requires-Python: >=3.9" in metadata
    # Nothing generated is in the source tree (the build wrote into its copy's build/).
    assert not glob.glob(os.path.join(PACKAGE, "tost_client", "tost_pb2*"))
    with open(os.path.join(PACKAGE, "tost_client", "__init__.py")) as f:
        assert f'__version__ = "{project_version()}"' in f.read()


def test_an_sdist_carries_the_proto_and_builds_away_from_the_checkout(tmp_path):
    source = copy_checkout(tmp_path / "checkout")
    run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
         "print(build_meta.build_sdist(sys.argv[1]))", tmp_path / "sdist"], cwd=source, env=clean_env())
    (sdist,) = glob.glob(str(tmp_path / "sdist" / "tost_client-*.tar.gz"))
    with tarfile.open(sdist) as t:
        names = t.getnames()
        t.extractall(tmp_path / "unpacked", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    top = f"tost_client-{project_version()}"
    assert f"{top}/proto/{PROTO}" in names and not [n for n in names if "tost_pb2" in n], names
    wheel = build_wheel(tmp_path / "unpacked" / top, tmp_path / "wheel")  # no ../../proto from here
    with zipfile.ZipFile(wheel) as z:
        assert GENERATED <= set(z.namelist())


SCRIPT = r'''
import asyncio, json, os, re, signal, sys, sysconfig
import grpc
import tost_client
from tost_client import AsyncClient, Client, TostError, tost_pb2
from tost_client.client import generate_request

a, b, a2 = sys.argv[1:4]
a_pid, a2_pid = int(sys.argv[4]), int(sys.argv[5])
schema = json.loads(sys.argv[6])
site = sysconfig.get_paths()["purelib"]
assert tost_client.__file__.startswith(site + os.sep), (tost_client.__file__, site)
assert tost_client.tost_pb2.__name__ == "tost_client.tost_pb2" and "tost" not in sys.modules
assert tost_client.TostStub is tost_client.tost_pb2_grpc.TostStub
out = {}

with Client(a, timeout_s=60) as client:
    models = {m.name: m for m in client.list_models()}
    assert {"tost-digits", "tost-austen"} <= set(models), models
    assert client.model_info("tost-digits").input_shape == [1, 32, 32]
    assert client.server_status().generators
    image = tost_pb2.FloatTensor(shape=[1, 32, 32], data=[((i * 7) % 13) / 13.0 for i in range(1024)])
    (result,) = client.classify("tost-digits", image, top_k=3).results
    assert len(result.labels) == 3 and result.labels[0].probability >= result.labels[1].probability
    out["classify"] = result.labels[0].label

    gen = client.generate("tost-austen", "It was", max_new_tokens=12)
    tokens = list(gen)
    assert len(tokens) == 12 and gen.final.finish_reason == tost_pb2.FINISH_REASON_LENGTH
    assert [t.position for t in tokens] == list(range(tokens[0].position, tokens[0].position + 12))
    out["generate"] = gen.text

    # Constrained: a dict per kind, or a Constraint message. Each output that ends with EOS is
    # complete (the JSON ones are validated by the test, outside this venv).
    EOS, LENGTH = tost_pb2.FINISH_REASON_EOS, tost_pb2.FINISH_REASON_LENGTH
    out["json_schema"] = []
    for seed in range(4):
        gen = client.generate("tost-austen", "Her answer, written plainly:", max_new_tokens=256, temperature=1.0,
                              seed=seed, constraint={"json_schema": schema})
        list(gen)
        out["json_schema"].append([gen.text, gen.final.finish_reason == EOS])
        assert gen.final.finish_reason in (EOS, LENGTH), gen.final
    for kind, value, matches in [
            ("regex", "[A-Z][a-z]{2,8} (was|is) [0-9]{1,3}", lambda t: re.fullmatch("[A-Z][a-z]{2,8} (was|is) [0-9]{1,3}", t)),
            ("grammar", 'root ::= "yes" | "no"', lambda t: t in ("yes", "no")),
            ("choice", ["Elizabeth", "Mr. Darcy"], lambda t: t in ("Elizabeth", "Mr. Darcy"))]:
        for c in ({kind: value}, tost_client.client.constraint_message({kind: value})):
            gen = client.generate("tost-austen", "Her answer:", max_new_tokens=64, temperature=1.0, seed=1,
                                  constraint=c)
            list(gen)
            assert gen.final.finish_reason == EOS and matches(gen.text), (kind, gen.text, gen.final)
    gen = client.generate("tost-austen", "Her answer:", max_new_tokens=32, constraint=tost_pb2.Constraint(json_object=True))
    list(gen)
    assert gen.text.startswith("{"), gen.text
    request = generate_request("tost-austen", "x", constraint={"json_schema": json.dumps(schema)})
    assert request.constraint.json_schema == json.dumps(schema)
    assert not generate_request("tost-austen", "x").HasField("constraint")
    # Invalid dicts: ValueError naming the key, before any call.
    for bad, key in [({}, "json_schema"), ({"regex": "a", "choice": ["a"]}, "'choice'"), ({"nope": 1}, "'nope'"),
                     ({"json_object": False}, "json_object"), ({"choice": "yes"}, "choice"),
                     ({"choice": ["a", ""]}, "choice'][1]"), ({"regex": ""}, "regex"), ({"grammar": 3}, "grammar"),
                     ({"json_schema": 5}, "json_schema")]:
        try:
            client.generate("tost-austen", "x", constraint=bad)
            raise AssertionError(f"constraint {bad!r} was accepted")
        except ValueError as e:
            assert key in str(e), (bad, str(e))
    try:
        client.generate(request=request, constraint={"regex": "a"})
        raise AssertionError("constraint= beside request= was accepted")
    except ValueError as e:
        assert "not both" in str(e), e
    # What only the server can judge: its compiler's refusal.
    try:
        list(client.generate("tost-austen", "x", constraint={"regex": "([a-z"}))
        raise AssertionError("a regex that does not parse was accepted")
    except TostError as e:
        assert e.code == grpc.StatusCode.INVALID_ARGUMENT and "regex" in e.message, e

    try:
        client.classify("no-such-model", image)
        raise AssertionError("classify of an unknown model succeeded")
    except TostError as e:
        assert isinstance(e.code, grpc.StatusCode) and e.code != grpc.StatusCode.OK and e.message, e
        out["error"] = str(e)

    # Sessions: create, continue, fork, export; the blob imported on the other server.
    session = client.create_session("tost-austen")
    list(client.generate("tost-austen", "It was", session_id=session.session_id, max_new_tokens=4))
    fork = client.fork_session(session.session_id)
    exported = client.export_session(session.session_id)
    assert exported.state and exported.session.position == fork.position > 0
    with Client(b) as other:
        imported = other.import_session(exported.state)
        assert imported.position == exported.session.position
        other.close_session(imported.session_id)
    client.close_session(fork.session_id)
    client.close_session(session.session_id)
    try:
        client.close_session(session.session_id)
        raise AssertionError("a closed session closed again")
    except TostError as e:
        assert e.code != grpc.StatusCode.OK


async def with_asyncio():
    async with AsyncClient(a, timeout_s=60) as client:
        assert "tost-austen" in {m.name for m in await client.list_models()}
        gen = client.generate("tost-austen", "It was", max_new_tokens=12)
        tokens = [t async for t in gen]
        choice = client.generate("tost-austen", "Her answer:", max_new_tokens=64, temperature=1.0, seed=2,
                                 constraint={"choice": ["Elizabeth", "Mr. Darcy"]})
        assert [t async for t in choice] and choice.text in ("Elizabeth", "Mr. Darcy"), choice.text
        (result,) = (await client.classify("tost-digits", image, top_k=3)).results
        try:
            await client.server_status(timeout_s=10)
            await client.model_info("no-such-model")
            raise AssertionError("model_info of an unknown model succeeded")
        except TostError as e:
            assert e.code != grpc.StatusCode.OK
        return gen.text, result.labels[0].label

text, label = asyncio.run(with_asyncio())
assert text == out["generate"] and label == out["classify"], (text, label, out)

# Resumable: pick_first over [a, b]; a is killed once tokens have arrived, the client continues
# from its last blob on b. The output equals an uninterrupted run on b.
N = 400
with Client(b, timeout_s=120) as client:
    reference = client.generate("tost-austen", "It was a truth", max_new_tokens=N)
    reference_ids = [t.id for t in reference]
assert len(reference_ids) == N, reference.final
with Client(f"ipv4:{a},{b}", timeout_s=120) as client:
    gen = client.generate("tost-austen", "It was a truth", max_new_tokens=N, resumable=True, state_every_tokens=4,
                          max_retries=10, backoff_s=0.05, max_backoff_s=0.5)
    ids = []
    for token in gen:
        ids.append(token.id)
        if len(ids) == 8:
            os.kill(a_pid, signal.SIGKILL)
assert ids == reference_ids, (ids, reference_ids)
assert gen.breaks and gen.breaks[0].resume_position is not None, gen.breaks
out["breaks"] = [b.reason for b in gen.breaks]
out["resumed_from"] = gen.breaks[0].resume_position


async def resumable_with_asyncio():
    async with AsyncClient(f"ipv4:{a2},{b}", timeout_s=120) as client:
        gen = client.generate("tost-austen", "It was a truth", max_new_tokens=N, resumable=True, state_every_tokens=4,
                              max_retries=10, backoff_s=0.05, max_backoff_s=0.5)
        ids = []
        async for token in gen:
            ids.append(token.id)
            if len(ids) == 8:
                os.kill(a2_pid, signal.SIGKILL)
        return ids, gen

ids, gen = asyncio.run(resumable_with_asyncio())
assert ids == reference_ids, (ids, reference_ids)
assert gen.breaks and gen.breaks[0].resume_position is not None, gen.breaks
out["async_breaks"] = [b.reason for b in gen.breaks]
print(json.dumps(out))
'''


def test_the_installed_client_against_real_servers(venv, tmp_path):
    key = tmp_path / "session.key"
    key.write_bytes(os.urandom(32))
    args = [f"--session_key_file={key}", "--batch_invariant_decode"]
    servers = [RunningServer(MODELS, args) for _ in range(3)]
    a, a2, b = servers
    try:
        script = tmp_path / "use_client.py"
        script.write_text(SCRIPT)
        # From an empty directory: neither the checkout nor its proto/ is on any path.
        cwd = tmp_path / "elsewhere"
        cwd.mkdir()
        schema = SCHEMAS["bounds"]
        stdout = run([venv, script, a.address, b.address, a2.address, a.proc.pid, a2.proc.pid, json.dumps(schema)],
                     cwd=cwd, env=clean_env(), timeout=300)
        print(stdout)
        assert '"async_breaks"' in stdout
        out = json.loads(stdout.strip().splitlines()[-1])
        for text, complete in out["json_schema"]:
            if complete:
                check_output(schema, text)
        assert any(complete for _, complete in out["json_schema"]), out["json_schema"]
    finally:
        a.stop()
        a2.stop()
        assert b.stop() == 0
