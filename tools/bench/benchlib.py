"""Shared pieces of the performance scripts (tools/bench/*.py, tools/perf_report.py): starting
tost_server and the Python comparison server on free 127.0.0.1 ports (tools/pylib/tost_launch.py),
the tost.v1 stubs (tools/pylib/tost_protos.py), pinning processes to cores, running tost_loadgen,
reading resident memory, and writing synthetic model repositories with the dims of a shipped model
(for contexts the shipped model does not have)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Dict, List, Optional, Sequence

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOLS = os.path.join(ROOT, "tools")
PYLIB = os.path.join(TOOLS, "pylib")
DEFAULT_BUILD = os.path.join(ROOT, "build")
if PYLIB not in sys.path:
    sys.path.insert(0, PYLIB)
import tost_launch  # noqa: E402
import tost_protos  # noqa: E402


def find_binary(build_dir: str, relative: str) -> str:
    """`relative` under a CMake build directory, or its file name in a flat folder of binaries
    (the bin/ of scripts/gpu-bundle.sh's bundle)."""
    path = os.path.join(build_dir, relative)
    if os.path.exists(path):
        return path
    flat = os.path.join(build_dir, os.path.basename(relative))
    if os.path.exists(flat):
        return flat
    raise SystemExit(f"expected the built binary {path}; build it first "
                     f"(cmake --build {build_dir} --target {os.path.basename(relative)})")


def add_build_args(ap) -> None:
    ap.add_argument("--build-dir", default=os.environ.get("TOST_BUILD_DIR", DEFAULT_BUILD),
                    help="CMake build directory with tost_server and tost_loadgen (default build/)")
    ap.add_argument("--loadgen-cpu", type=int, default=0,
                    help="core the load generator is pinned to; servers get the other cores")


def other_cpus(cpu: int) -> List[int]:
    """The cores a server may use: all this process may use except the load generator's (all of
    them on a one-core machine)."""
    mine = sorted(os.sched_getaffinity(0))
    rest = [c for c in mine if c != cpu]
    return rest or mine


class Process(tost_launch.ServerProcess):
    """A server started on 127.0.0.1 with --port=0 that prints 'listening on HOST:PORT' (the Python
    comparison server), pinned to `cpus`; its log is removed when its `with` block ends."""

    def __init__(self, argv: Sequence[str], name: str, cpus: Optional[Sequence[int]] = None,
                 env: Optional[Dict[str, str]] = None, ready_pattern: str = tost_launch.LISTENING):
        super().__init__(argv, name=name, ready=ready_pattern, cpus=cpus, env=env, stop_timeout_s=60,
                         remove_log=True)


def start_tost_server(build_dir: str, repo: str, extra_args: Sequence[str] = (),
                      cpus: Optional[Sequence[int]] = None, metrics: bool = False) -> tost_launch.TostServer:
    # Access logs off: one stderr line per call would measure the logger at high rates.
    return tost_launch.TostServer(repo, extra_args, binary=find_binary(build_dir, "service/tost_server"),
                                  metrics=metrics, log_requests=False, cpus=cpus, stop_timeout_s=60,
                                  remove_log=True)


def scrape_metrics(metrics_port: int, prefix: str = "") -> dict:
    """{'name{labels}': value} of the server's /metrics lines starting with `prefix`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith(prefix) and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def run_loadgen(build_dir: str, target: str, args: Sequence[str], cpu: int,
                json_path: Optional[str] = None, echo: bool = True) -> dict:
    """Runs tost_loadgen pinned to `cpu`; returns its JSON report."""
    loadgen = find_binary(build_dir, "tests/bench/tost_loadgen")
    own_json = json_path is None
    if own_json:
        fd, json_path = tempfile.mkstemp(prefix="loadgen_", suffix=".json")
        os.close(fd)
    argv = [loadgen, f"--target={target}", f"--cpu={cpu}", f"--json={json_path}", *args]
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"tost_loadgen failed ({out.returncode}): {' '.join(argv)}\n{out.stderr}")
    if echo:
        sys.stdout.write(out.stdout)
        sys.stdout.flush()
    with open(json_path) as f:
        result = json.load(f)
    if own_json:
        os.unlink(json_path)
    return result


def proc_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def proto_modules():
    """(tost_pb2, tost_pb2_grpc): the tost.v1 Python stubs (tools/pylib/tost_protos.py)."""
    return tost_protos.tost()


def reference():
    """tools/tost_reference.py, the Python model the comparison servers and baselines use."""
    if TOOLS not in sys.path:
        sys.path.insert(0, TOOLS)
    import tost_reference  # noqa: E402

    return tost_reference


def write_lm_like(shipped_dir: str, out_repo: str, name: str, context_length: int,
                  seed: int = 0, **overrides) -> dict:
    """Writes <out_repo>/<name>: the shipped LM's config (dims, tokenizer) with `context_length`
    (and any other lm overrides), at the official random initialisation. Returns the lm config.
    Memory and speed do not depend on the weights' values, only on the dims."""
    import torch

    R = reference()
    with open(os.path.join(shipped_dir, "config.json")) as f:
        shipped = json.load(f)
    lm = dict(shipped["lm"], context_length=context_length, **overrides)
    torch.manual_seed(seed)
    cfg = R.LMConfig.from_dict(lm)
    model = R.TostLM(cfg)
    tokenizer = dict(shipped["tokenizer"])
    config = R.make_config(name, cfg, version=f"random-{seed}", trained=False,
                           provenance={"kind": "random_init", "script": "tools/bench/benchlib.py",
                                       "dims_of": os.path.basename(os.path.normpath(shipped_dir))},
                           tokenizer=tokenizer)
    out_dir = os.path.join(out_repo, name)
    R.save_model(model, config, out_dir)
    if "file" in tokenizer:
        shutil.copy(os.path.join(shipped_dir, tokenizer["file"]), os.path.join(out_dir, tokenizer["file"]))
    return lm


def write_bench_lm(out_repo: str, name: str = "bench-lm", quick: bool = False, seed: int = 7) -> dict:
    """The generation benchmark's LM (tests/bench/generation_bench.cc: 6 layers, C 384, 6 heads,
    context 4096, byte vocabulary; 2 layers, C 96 with --quick), random weights."""
    import torch

    R = reference()
    torch.manual_seed(seed)
    cfg = R.LMConfig(n_layer=2 if quick else 6, n_head=6, n_embd=96 if quick else 384,
                     context_length=4096, vocab_size=257, bias=False, mlp_ratio=4)
    config = R.make_config(name, cfg, version=f"random-{seed}", trained=False,
                           provenance={"kind": "random_init", "script": "tools/bench/benchlib.py"})
    R.save_model(R.TostLM(cfg), config, os.path.join(out_repo, name))
    return cfg.to_dict()


def lm_repo(prefix: str, model_dir: str = "", quick: bool = False):
    """A scratch model repository serving one language model: `model_dir` (linked in) when given,
    else the benchmark LM written by write_bench_lm. (repo, model name, write_bench_lm's dict or
    None); the caller removes the repo."""
    repo = tempfile.mkdtemp(prefix=prefix)
    if model_dir:
        model_dir = os.path.abspath(model_dir)
        model = os.path.basename(model_dir)
        os.symlink(model_dir, os.path.join(repo, model))
        return repo, model, None
    return repo, "bench-lm", write_bench_lm(repo, "bench-lm", quick=quick)


def machine() -> dict:
    info = {"cpus": os.cpu_count(), "affinity": sorted(os.sched_getaffinity(0))}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            info["mem_total_kib"] = int(f.readline().split()[1])
        info["loadavg_start"] = open("/proc/loadavg").read().split()[:3]
    except OSError:
        pass
    return info


def write_json(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")


def now_s() -> float:
    return time.monotonic()
