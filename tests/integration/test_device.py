"""Device selection end to end (--device, --dtype, config.json "serving"): on a machine without a
CUDA device, asking the server for CUDA stops it with the reason, and a model whose config asks for
CUDA fails alone while the others serve. (With a device, tests/integration/test_gpu_serving.py
runs the models there.)"""
import json
import os
import shutil
import subprocess

import grpc
import pytest

from conftest import SOURCE_DIR, RunningServer, _binary
from tost_harness import collect_generate


def _cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no torch or no driver: no device
        return 0


def _run_server(*args, timeout=60):
    return subprocess.run(
        [_binary("TOST_SERVER_BIN"), f"--model_repository={os.path.join(SOURCE_DIR, 'models')}",
         "--host=127.0.0.1", "--port=0", "--metrics_port=-1", "--http_port=-1", *args],
        capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args, expected", [
    (["--device=gpu"], '--device: expected auto, cpu, cuda or cuda:N (N a device index), got \\"gpu\\"'),
    (["--dtype=int4"], '--dtype: expected fp32, bf16, fp16 or int8, got \\"int4\\"'),
    (["--device=cuda:7"], "--device asks for cuda:7 but this process sees"),
])
def test_bad_or_unavailable_device_stops_the_server_with_the_reason(args, expected):
    if "cuda:7" in args[0] and _cuda_devices() > 7:
        pytest.skip("this machine has a cuda:7")
    result = _run_server(*args)
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr


def test_int8_on_cuda_stops_the_server_naming_the_field():
    if _cuda_devices() == 0:
        pytest.skip("no CUDA device: int8 on the CPU is served (below)")
    result = _run_server("--device=cuda", "--dtype=int8")
    assert result.returncode != 0
    assert "--dtype: int8 is served on the CPU only, but the server's device is cuda:0" in result.stderr, \
        result.stderr
    assert "expected fp32, bf16 or fp16 on CUDA" in result.stderr, result.stderr


def test_cuda_where_there_is_none_stops_the_server():
    if _cuda_devices() > 0:
        pytest.skip("this machine has a CUDA device")
    result = _run_server("--device=cuda")
    assert result.returncode != 0
    assert "--device asks for cuda:0 but this process sees 0 CUDA device(s)" in result.stderr, result.stderr
    assert "listening on" not in result.stdout


def test_a_model_asking_for_absent_cuda_fails_alone(tmp_path, proto_modules):
    pb2, pb2_grpc = proto_modules
    devices = _cuda_devices()
    repo = tmp_path / "repo"
    repo.mkdir()
    os.symlink(os.path.join(SOURCE_DIR, "models", "tost-digits"), repo / "tost-digits")
    shutil.copytree(os.path.join(SOURCE_DIR, "models", "tost-austen"), repo / "tost-austen")
    config_path = repo / "tost-austen" / "config.json"
    config = json.loads(config_path.read_text())
    config["serving"] = {"device": f"cuda:{devices}", "dtype": "bf16"}  # one past the last device
    config_path.write_text(json.dumps(config))
    s = RunningServer(str(repo), extra_args=("--device=cpu",))
    try:
        with grpc.insecure_channel(s.address) as ch:
            stub = pb2_grpc.TostStub(ch)
            models = {m.name: m for m in stub.ListModels(pb2.ListModelsRequest(), timeout=30).models}
            assert models["tost-digits"].ready
            assert not models["tost-austen"].ready
            assert (f'model "tost-austen" (config.json serving.device) asks for cuda:{devices} '
                    f"but this process sees {devices} CUDA device(s)") in models["tost-austen"].error
            with pytest.raises(grpc.RpcError) as e:
                list(stub.Generate(pb2.GenerateRequest(model="tost-austen", prompt_bytes=b"x"), timeout=30))
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        assert s.stop() == 0


def test_server_status_reports_the_state_pool_and_no_device_memory_on_cpu(proto_modules):
    """The active sequences' statistics live in a pool of --max_active_generations rows, sized by
    the model's dimensions alone; a CPU server reports no CUDA device memory."""
    pb2, pb2_grpc = proto_modules
    s = RunningServer(os.path.join(SOURCE_DIR, "models"), extra_args=("--device=cpu", "--max_active_generations=7"))
    try:
        with grpc.insecure_channel(s.address) as ch:
            stub = pb2_grpc.TostStub(ch)
            models = {m.name: m for m in stub.ListModels(pb2.ListModelsRequest(), timeout=30).models}
            status = stub.ServerStatus(pb2.ServerStatusRequest(), timeout=30)
            assert len(status.device_memory) == 0
            assert status.generators, "the shipped repository serves a language model"
            for g in status.generators:
                config = json.loads(open(os.path.join(SOURCE_DIR, "models", g.model, "config.json")).read())
                assert models[g.model].ready
                lm = config["lm"]
                layers, embd, heads = lm["n_layer"], lm["n_embd"], lm["n_head"]
                assert g.state_pool_bytes == 7 * layers * (2 * embd + heads) * 4, g
    finally:
        assert s.stop() == 0


def _generate(stub, pb2, **request):
    got = collect_generate(stub.Generate(pb2.GenerateRequest(**request), timeout=120))
    return got.ids, got.final


def test_cpu_serves_reduced_precision_weights_and_blobs_cross_precisions(proto_modules, key_file):
    """--dtype=bf16/fp16/int8 take effect on the CPU (ListModels says so, the log names the product
    path), and a state blob made at one precision continues at another: statistics stay float32."""
    pb2, pb2_grpc = proto_modules
    models = os.path.join(SOURCE_DIR, "models")
    servers = {d: RunningServer(models, (f"--session_key_file={key_file}", "--device=cpu", f"--dtype={d}"))
               for d in ("fp32", "bf16", "fp16", "int8")}
    try:
        stubs = {}
        for d, s in servers.items():
            ch = grpc.insecure_channel(s.address)
            stubs[d] = pb2_grpc.TostStub(ch)
            listed = {m.name: m for m in stubs[d].ListModels(pb2.ListModelsRequest(), timeout=30).models}
            for m in listed.values():
                assert m.ready and m.device == "cpu" and m.dtype == d, m
            s.log.flush()
            log = open(s.log.name, encoding="utf-8").read()
            assert "cpu_precision_flags" in log and "cpu_products" in log, log
        for a, b in (("bf16", "fp32"), ("fp32", "bf16"), ("fp16", "fp32"), ("fp32", "fp16"), ("int8", "fp32"),
                     ("fp32", "int8")):
            first, final = _generate(stubs[a], pb2, model="tost-austen", prompt_bytes=b"It was a truth ",
                                     max_new_tokens=6, return_state=True)
            assert len(first) == 6 and final.state
            more, _ = _generate(stubs[b], pb2, state=final.state, max_new_tokens=6)
            assert len(more) == 6, (a, b)
    finally:
        for s in servers.values():
            assert s.stop() == 0
