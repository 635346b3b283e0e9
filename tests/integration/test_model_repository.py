"""A model repository with hostile or careless entries beside the shipped models: a folder that is a
symbolic link loop or a dangling link, a config.json that is a link loop, /dev/zero or a FIFO, weights that are /dev/zero, invalid
UTF-8 in config.json's strings. The server must start within a bounded time, list every model
through a strict (UTF-8 checking) client, the good ones ready and the bad ones failed with their path
in the repository and the reason, and serve the good ones."""
import json
import os
import signal
import time

import grpc
import numpy as np
import pytest

from conftest import SOURCE_DIR, RunningServer
from tost_harness import collect_generate, scrape_metrics

START_LIMIT_S = 120  # loading the shipped models takes seconds; a blocked read would never end


def _kill_servers_of(repo):
    """Ends a tost_server serving `repo` that never printed its port (by pid, from /proc)."""
    wanted = f"--model_repository={repo}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if wanted in f.read().split(b"\0"):
                    os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass


def _start_within(repo, seconds):
    def expired(signum, frame):
        raise TimeoutError(f"tost_server did not start within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        return RunningServer(str(repo), extra_args=("--device=cpu",))
    except TimeoutError:
        _kill_servers_of(repo)
        raise
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _model_copy(repo, shipped, name, edit_config=None, weights=None):
    """<repo>/<name>: the shipped model's files as links, its config.json rewritten with `name`
    (bytes: `edit_config` may put any bytes in it), the weights a link to `weights` if given."""
    src = os.path.join(SOURCE_DIR, "models", shipped)
    dst = repo / name
    dst.mkdir()
    for f in os.listdir(src):
        if f != "config.json":
            os.symlink(os.path.join(src, f), dst / f)
    config = open(os.path.join(src, "config.json"), "rb").read()
    config = config.replace(f'"name": "{shipped}"'.encode(), f'"name": "{name}"'.encode(), 1)
    if edit_config:
        config = edit_config(config)
    (dst / "config.json").write_bytes(config)
    if weights:
        os.remove(dst / "model.safetensors")
        os.symlink(weights, dst / "model.safetensors")
    return dst


@pytest.fixture
def hostile_repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for shipped in ("tost-digits", "tost-austen"):
        os.symlink(os.path.join(SOURCE_DIR, "models", shipped), repo / shipped)
    os.symlink(repo / "loop", repo / "loop")
    os.symlink(repo / "nowhere", repo / "dangling")
    config_loop = _model_copy(repo, "tost-digits", "config-loop")
    os.remove(config_loop / "config.json")
    os.symlink("config.json", config_loop / "config.json")  # a link to itself
    (repo / "zero-config").mkdir()
    os.symlink("/dev/zero", repo / "zero-config" / "config.json")
    (repo / "fifo-config").mkdir()
    os.mkfifo(repo / "fifo-config" / "config.json")
    _model_copy(repo, "tost-digits", "zero-weights", weights="/dev/zero")
    _model_copy(repo, "tost-digits", "bad-name",
                edit_config=lambda c: c.replace(b'"name": "bad-name"', b'"name": "bad-\xffname"', 1))

    def bad_description(config):
        doc = json.loads(config)
        doc["provenance"]["description"] = "PLACEHOLDER"
        return json.dumps(doc).encode().replace(b"PLACEHOLDER", b"caf\xc3(")

    _model_copy(repo, "tost-digits", "bad-description", edit_config=bad_description)
    return repo


def test_bad_entries_fail_alone_and_the_good_models_serve(hostile_repo, proto_modules):
    pb2, pb2_grpc = proto_modules
    repo = hostile_repo
    started = time.monotonic()
    s = _start_within(repo, START_LIMIT_S)
    try:
        assert time.monotonic() - started < START_LIMIT_S
        with grpc.insecure_channel(s.address) as ch:
            stub = pb2_grpc.TostStub(ch)
            # grpcio's protobuf refuses a response whose strings are not UTF-8: this call failing
            # is what one bad byte in a config used to do to every client.
            listed = stub.ListModels(pb2.ListModelsRequest(), timeout=30).models
            models = {m.name: m for m in listed}
            assert set(models) == {"tost-digits", "tost-austen", "loop", "dangling", "config-loop",
                                   "zero-config", "fifo-config", "zero-weights", "bad-name",
                                   "bad-description"}, sorted(models)
            for good in ("tost-digits", "tost-austen"):
                assert models[good].ready, models[good].error
            expected = {
                "loop": [f"{repo}/loop", "Too many levels of symbolic links"],
                "dangling": [f"{repo}/dangling", "No such file or directory"],
                "config-loop": [f"{repo}/config-loop/config.json", "Too many levels of symbolic links"],
                "zero-config": [f"{repo}/zero-config/config.json", "regular file", "character device"],
                "fifo-config": [f"{repo}/fifo-config/config.json", "regular file", "FIFO"],
                "zero-weights": [f"{repo}/zero-weights/model.safetensors", "weights file",
                                 "character device"],
                "bad-name": [f"{repo}/bad-name/config.json", "invalid UTF-8 at byte offset",
                             'field "name"', "0xff"],
                "bad-description": [f"{repo}/bad-description/config.json", "invalid UTF-8 at byte offset",
                                    'field "provenance.description"', "0xc3"],
            }
            for name, fragments in expected.items():
                assert not models[name].ready, name
                # Clients read a path within the repository, never where the server keeps it.
                assert str(repo) not in models[name].error, (name, models[name].error)
                for fragment in fragments:
                    fragment = fragment.replace(f"{repo}/", "")
                    assert fragment in models[name].error, (name, fragment, models[name].error)

            info = stub.ModelInfo(pb2.ModelInfoRequest(model="bad-name"), timeout=30)
            assert not info.ready and "invalid UTF-8" in info.error
            stub.ServerStatus(pb2.ServerStatusRequest(), timeout=30)

            x = np.zeros((1, 1, 32, 32), dtype=np.float32)
            tensor = pb2.FloatTensor(shape=list(x.shape), raw=x.tobytes())
            assert len(stub.Classify(pb2.ClassifyRequest(model="tost-digits", tensor=tensor),
                                     timeout=30).results) == 1
            tokens = collect_generate(stub.Generate(
                pb2.GenerateRequest(model="tost-austen", prompt_bytes=b"It is a truth", max_new_tokens=4),
                timeout=60)).ids
            assert len(tokens) == 4
            with pytest.raises(grpc.RpcError) as e:
                stub.Classify(pb2.ClassifyRequest(model="zero-weights", tensor=tensor), timeout=30)
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "character device" in e.value.details()
            # A call to a model whose config.json is a loop fails with its load error, as for any
            # unreadable config; an entry that is no folder at all is failed the same way.
            for name, fragment in (("config-loop", "Too many levels of symbolic links"),
                                   ("dangling", "No such file or directory")):
                with pytest.raises(grpc.RpcError) as e:
                    stub.Classify(pb2.ClassifyRequest(model=name, tensor=tensor), timeout=30)
                assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, (name, e.value)
                assert fragment in e.value.details(), (name, e.value.details())

        # The metrics page names the served models; it must stay UTF-8 too (scrape_metrics decodes
        # it strictly).
        assert any(sample.labels.get("model") == "tost-digits" for sample in scrape_metrics(s))
    finally:
        assert s.stop() == 0


def test_a_repository_that_cannot_be_examined_stops_the_server_with_the_reason(tmp_path):
    import subprocess

    from conftest import _binary

    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    result = subprocess.run(
        [_binary("TOST_SERVER_BIN"), f"--model_repository={loop}", "--host=127.0.0.1", "--port=0",
         "--metrics_port=-1", "--http_port=-1"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "cannot examine the model repository" in result.stderr, result.stderr
    assert "Too many levels of symbolic links" in result.stderr, result.stderr
