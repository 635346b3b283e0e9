"""Metrics end to end: a real Prometheus server scrapes a live
tost_server during a classify + generate + sessions load, and its HTTP API must report what the
clients saw (tokens received, images sent, requests by method and code, histogram counts, session
gauges with one active and one idle session, exact state bytes, resident memory). Also:
`promtool check metrics` on /metrics, `promtool check rules/config` on deploy/prometheus, the
"## Metrics" table of docs/metrics.md against the live families, the Grafana dashboard covering every
family, and JSON logs with request ids."""
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import grpc
import pytest

from conftest import SOURCE_DIR, RunningServer
from tost_harness import collect_generate, fetch_metrics, metric_value, scrape_metrics

LM = "tost-austen"
VISION = "tost-digits"
RULES = os.path.join(SOURCE_DIR, "deploy", "prometheus", "rules.yml")
PROM_CONFIG = os.path.join(SOURCE_DIR, "deploy", "prometheus", "prometheus.yml")
DASHBOARD = os.path.join(SOURCE_DIR, "deploy", "grafana", "tost-serve.json")
BLOCKER_PROMPT = 1000     # prompt tokens of each blocker, prefilled one per step (--prefill_chunk_tokens=1)
ACTIVE_WINDOW_S = 6.0     # how long the blockers keep session b waiting (several 1 s scrapes)


def tool(name):
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: scripts/install-deps.sh installs Debian's prometheus package")
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def family_types(text):
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


class Prometheus:
    """Debian's Prometheus server scraping one target every second, with our rules loaded."""

    def __init__(self, target_port, workdir):
        self.port = free_port()
        config = os.path.join(workdir, "prometheus.yml")
        with open(config, "w") as f:
            f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - {RULES}
scrape_configs:
  - job_name: tost-serve
    static_configs:
      - targets: ["127.0.0.1:{target_port}"]
""")
        self.log = open(os.path.join(workdir, "prometheus.log"), "w")
        self.proc = subprocess.Popen(
            [tool("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={os.path.join(workdir, 'data')}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus did not become ready: {open(self.log.name).read()[-3000:]}")
            time.sleep(0.2)

    def query(self, expr):
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def value(self, expr):
        """The single sample's value, or None when the query returns nothing."""
        result = self.query(expr)
        assert len(result) <= 1, f"{expr} returned {len(result)} series: {result}"
        return float(result[0]["value"][1]) if result else None

    def wait_for(self, checks, timeout=30):
        """Polls until every (expr, expected) holds in the same round; fails with the last values."""
        deadline = time.time() + timeout
        while True:
            got = {expr: self.value(expr) for expr, _ in checks}
            if all(got[expr] == expected for expr, expected in checks):
                return
            if time.time() > deadline:
                pytest.fail("Prometheus never reported " +
                            "; ".join(f"{e} == {x} (last: {got[e]})" for e, x in checks if got[e] != x))
            time.sleep(0.25)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def image_tensor(pb2, batch):
    values = [((i * 37) % 255) / 255.0 for i in range(batch * 32 * 32)]
    return pb2.FloatTensor(shape=[batch, 1, 32, 32], raw=struct.pack(f"<{len(values)}f", *values))


@pytest.fixture(scope="module")
def observed(proto_modules, tmp_path_factory):
    """Runs the load against a server scraped by Prometheus; yields what the clients saw."""
    pb2, pb2_grpc = proto_modules
    workdir = str(tmp_path_factory.mktemp("prometheus"))
    server = RunningServer(os.path.join(SOURCE_DIR, "models"),
                           ["--log_format=json", "--max_active_generations=1", "--prefill_chunk_tokens=1"])
    prom = None
    try:
        prom = Prometheus(server.metrics_port, workdir)
        # Target discovery takes a few seconds after start: the load begins once scrapes run.
        prom.wait_for([('up{job="tost-serve"}', 1.0)], timeout=60)
        channel = grpc.insecure_channel(server.address)
        grpc.channel_ready_future(channel).result(timeout=30)
        stub = pb2_grpc.TostStub(channel)
        seen = {"prompt_tokens": 0, "tokens": 0, "streams_with_tokens": 0, "generate_ok": 0}
        lock = threading.Lock()

        def generate(request):
            got = collect_generate(stub.Generate(request, timeout=300))
            tokens, final = len(got.tokens), got.final
            with lock:
                seen["tokens"] += tokens
                seen["streams_with_tokens"] += 1 if tokens else 0
                seen["prompt_tokens"] += final.prompt_tokens
                seen["generate_ok"] += 1
            return tokens, final

        # Classification: concurrent requests (they share batches) plus one malformed request.
        sizes = [1, 2, 3, 1, 2, 3, 1, 2]
        errors = []

        def classify(n):
            try:
                r = stub.Classify(pb2.ClassifyRequest(model=VISION, tensor=image_tensor(pb2, n)), timeout=60)
                assert len(r.results) == n
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=classify, args=(n,)) for n in sizes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        with pytest.raises(grpc.RpcError) as bad:
            stub.Classify(pb2.ClassifyRequest(model=VISION, tensor=pb2.FloatTensor(shape=[1, 3, 5, 5], data=[0.0] * 75)))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as missing:
            stub.ModelInfo(pb2.ModelInfoRequest(model="no-such-model"))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND

        # The HTTP front end: one completion (the OpenAI-compatible API) and one malformed body.
        http = f"http://127.0.0.1:{server.http_port}/v1/completions"
        body = json.dumps({"model": LM, "prompt": "metrics over HTTP", "max_tokens": 4}).encode()
        with urllib.request.urlopen(urllib.request.Request(http, data=body), timeout=60) as r:
            usage = json.load(r)["usage"]
        # Its tokens count in the generation families like a Generate's.
        seen["tokens"] += usage["completion_tokens"]
        seen["prompt_tokens"] += usage["prompt_tokens"]
        seen["streams_with_tokens"] += 1
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(http, data=b"{"), timeout=60)
        assert refused.value.code == 400

        # One-shot generations.
        for i in range(3):
            generate(pb2.GenerateRequest(model=LM, prompt_bytes=f"metrics test {i} ".encode(), max_new_tokens=12,
                                         sampling=pb2.SamplingParams(temperature=0.8, seed=i)))

        # Two sessions; b's Generate waits behind the blockers (one slot, one prompt token per
        # step), so b stays checked out (active) for seconds while a stays idle.
        # Blockers: prompt-only generations; one timed alone sizes how many fill ACTIVE_WINDOW_S. Each
        # starts with its own token: a prompt sent before would come from the prefix-state cache.
        def blocker(i):
            return pb2.GenerateRequest(model=LM, prompt_tokens=pb2.TokenIds(ids=[100 + i] + [122] * (BLOCKER_PROMPT - 1)),
                                       max_new_tokens=1)
        started = time.time()
        generate(blocker(0))
        blocker_count = max(4, min(200, int(ACTIVE_WINDOW_S / (time.time() - started)) + 1))
        per_session = stub.ServerStatus(pb2.ServerStatusRequest()).generators[0].state_bytes_per_session
        a = stub.CreateSession(pb2.CreateSessionRequest(model=LM))
        b = stub.CreateSession(pb2.CreateSessionRequest(model=LM))
        assert a.state_bytes == b.state_bytes == per_session
        done_blockers = []

        def run_blocker(i):
            generate(blocker(i))
            with lock:
                done_blockers.append(1)

        blockers = [threading.Thread(target=run_blocker, args=(i + 1,)) for i in range(blocker_count)]
        for t in blockers:
            t.start()
        deadline = time.time() + 30
        while True:  # every blocker admitted before b's Generate
            g = stub.ServerStatus(pb2.ServerStatusRequest()).generators[0]
            with lock:
                finished = len(done_blockers)
            if g.active + g.queued + finished == blocker_count:
                break
            assert time.time() < deadline, f"blockers not admitted: {g}"
            time.sleep(0.01)
        b_thread = threading.Thread(target=generate, args=(pb2.GenerateRequest(
            session_id=b.session_id, prompt_bytes=b"hello session", max_new_tokens=10),))
        b_thread.start()
        # b is checked out from its Generate's start until every blocker has run (seconds).
        while True:
            direct = scrape_metrics(server)
            if metric_value(direct, "tost_sessions", state="active") == 1:
                break
            assert time.time() < deadline, "b never showed as an active session"
            time.sleep(0.005)
        active_window = {
            "direct_idle": metric_value(direct, "tost_sessions", default=None, state="idle"),
            "direct_state_bytes": metric_value(direct, "tost_session_state_bytes", default=None),
            "blockers_left": stub.ServerStatus(pb2.ServerStatusRequest()).generators[0].queued,
        }
        prom.wait_for([('tost_sessions{state="active"}', 1.0), ('tost_sessions{state="idle"}', 1.0),
                       ("tost_session_state_bytes", 2.0 * per_session)], timeout=ACTIVE_WINDOW_S * 5)
        for t in blockers:
            t.join()
        b_thread.join()

        # Request ids: the client's is echoed and logged.
        _, call = stub.ListModels.with_call(pb2.ListModelsRequest(), metadata=(("x-request-id", "metrics-test-42"),))
        echoed = dict(call.initial_metadata()).get("x-request-id")

        exported = [stub.ExportSession(pb2.SessionRef(session_id=s.session_id)).session.state_bytes for s in (a, b)]
        yield {"prom": prom, "server": server, "seen": seen, "images": sum(sizes), "classify_ok": len(sizes),
               "per_session": per_session, "exported": exported, "active_window": active_window,
               "echoed_request_id": echoed, "blockers": blocker_count}
        channel.close()
    finally:
        if prom is not None:
            prom.stop()
        assert server.stop() == 0, "tost_server did not exit cleanly on SIGTERM"


def test_prometheus_sees_the_load(observed):
    prom, seen = observed["prom"], observed["seen"]
    lm, vm = f'model="{LM}"', f'model="{VISION}"'
    generate_calls = seen["generate_ok"]
    assert generate_calls == 3 + 1 + observed["blockers"] + 1
    prom.wait_for([
        # Throughput counters equal what the clients sent and received.
        (f"tost_generated_tokens_total{{{lm}}}", float(seen["tokens"])),
        (f"tost_prompt_tokens_total{{{lm}}}", float(seen["prompt_tokens"])),
        (f"tost_images_classified_total{{{vm}}}", float(observed["images"])),
        # Requests by method and code, errors included.
        ('tost_requests_total{rpc="Classify",code="OK"}', float(observed["classify_ok"])),
        ('tost_requests_total{rpc="Classify",code="INVALID_ARGUMENT"}', 1.0),
        ('tost_requests_total{rpc="ModelInfo",code="NOT_FOUND"}', 1.0),
        ('tost_requests_total{rpc="Generate",code="OK"}', float(generate_calls)),
        ('tost_requests_total{rpc="CreateSession",code="OK"}', 2.0),
        ('sum(tost_requests_total{code!="OK"})', 2.0),
        # Histogram counts.
        ('tost_request_duration_seconds_count{rpc="Classify"}', float(observed["classify_ok"] + 1)),
        ('tost_request_duration_seconds_count{rpc="Generate"}', float(generate_calls)),
        (f"tost_time_to_first_token_seconds_count{{{lm}}}", float(seen["streams_with_tokens"])),
        (f"tost_inter_token_latency_seconds_count{{{lm}}}", float(seen["tokens"] - seen["streams_with_tokens"])),
        (f'tost_batch_size_sum{{{vm},workload="classify"}}', float(observed["images"])),
        (f'tost_batch_size_sum{{{lm},workload="generate"}}', float(seen["tokens"])),
        # After the load: both sessions idle, holding exactly their exported states' bytes.
        ('tost_sessions{state="active"}', 0.0),
        ('tost_sessions{state="idle"}', 2.0),
        ("tost_session_state_bytes", float(sum(observed["exported"]))),
        ('sum(tost_rejections_total)', 0.0),
    ])
    batches = prom.value(f"tost_compute_duration_seconds_count{{{vm}}}")
    assert 1 <= batches <= observed["classify_ok"]
    assert prom.value(f"tost_queue_duration_seconds_count{{{vm}}}") == batches
    assert prom.value(f'tost_batch_size_count{{{vm},workload="classify"}}') == batches
    assert prom.value("tost_process_resident_memory_bytes") > 50e6  # LibTorch alone maps more
    assert prom.value("tost_session_budget_bytes") == 256 * 2**20
    with open(os.path.join(SOURCE_DIR, "models", "tost-austen", "config.json")) as f:
        lm_version = json.load(f)["version"]
    assert prom.value(f'tost_model_info{{{lm},backend="libtorch_cpu",version="{lm_version}"}}') == 1
    assert prom.value(f"tost_queue_capacity{{{vm}}}") == 64
    # The recording rules evaluate in a real Prometheus against these series.
    prom.wait_for([(f'tost:generated_tokens:rate1m{{{lm}}} > bool 0', 1.0),
                   (f'count(tost:time_to_first_token_seconds:p99_5m{{{lm}}})', 1.0)], timeout=30)


def test_prometheus_sees_http_requests_by_route_and_code(observed):
    observed["prom"].wait_for([('tost_http_requests_total{route="/v1/completions",code="200"}', 1.0),
                               ('tost_http_requests_total{route="/v1/completions",code="400"}', 1.0),
                               ('tost_http_request_duration_seconds_count{route="/v1/completions"}', 2.0)],
                              timeout=30)


def test_state_bytes_count_active_and_idle_sessions_exactly(observed):
    window, per_session = observed["active_window"], observed["per_session"]
    # While b waited for its slot (active) and a was held (idle), both fresh: 2 × the state size.
    assert window["blockers_left"] > 0, f"b was not waiting behind the blockers: {window}"
    assert window["direct_idle"] == 1, window
    assert window["direct_state_bytes"] == 2 * per_session, window
    # After b's generation its state grew by exactly what it holds (repetition window, text).
    assert observed["exported"][0] == per_session
    assert observed["exported"][1] > per_session


def test_promtool_accepts_metrics_rules_and_config(observed):
    text = fetch_metrics(observed["server"])
    check = subprocess.run([tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    for args in (["check", "rules", RULES], ["check", "config", PROM_CONFIG]):
        check = subprocess.run([tool("promtool"), *args], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr


def documented_families():
    """(family, type, cuda_only) rows of the metrics table in docs/metrics.md's "## Metrics" section."""
    with open(os.path.join(SOURCE_DIR, "docs", "metrics.md"), encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^## Metrics\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, "no '## Metrics' section in docs/metrics.md"
    rows = re.findall(r"^\| `(tost_\w+)` \| (\w+) \|[^|]*\| ([^|]*) \|$", m.group(1), re.M)
    assert rows, "the Metrics section has no table rows"
    return {name: (kind, meaning.strip().startswith("CUDA only")) for name, kind, meaning in rows}


def test_documented_families_match_metrics(observed):
    docs = documented_families()
    live = {name: kind for name, kind in family_types(fetch_metrics(observed["server"])).items()
            if name.startswith("tost_")}
    required = {name for name, (_, cuda_only) in docs.items() if not cuda_only}
    assert set(live) - set(docs) == set(), "families served but not documented"
    assert required - set(live) == set(), "families documented but not served"
    for name, kind in live.items():
        assert docs[name][0] == kind, f"{name}: documented as {docs[name][0]}, served as {kind}"


def test_dashboard_covers_every_family():
    dashboard = json.load(open(DASHBOARD))
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    missing = [name for name in documented_families() if not re.search(rf"\b{name}(_bucket|_sum|_count)?\b", exprs)]
    assert not missing, f"no dashboard panel queries {missing}"


def test_json_logs_carry_request_ids(observed):
    assert observed["echoed_request_id"] == "metrics-test-42"
    lines = [line for line in open(observed["server"].log.name).read().splitlines() if line]
    events = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"ts", "level", "msg"} <= set(e) for e in events)
    rpcs = [e for e in events if e["msg"] == "rpc"]
    assert any(e["request_id"] == "metrics-test-42" and e["rpc"] == "ListModels" and e["code"] == "OK" for e in rpcs)
    bad = [e for e in rpcs if e["code"] == "INVALID_ARGUMENT"]
    assert len(bad) == 1 and bad[0]["rpc"] == "Classify" and "expected images of shape" in bad[0]["error"]
    assert all(re.fullmatch(r"[0-9a-f]{16}", e["request_id"]) for e in rpcs if e["request_id"] != "metrics-test-42")
    assert len({e["request_id"] for e in rpcs}) == len(rpcs)
