"""The model server protocol's gauges on a running tost_server (docs/metrics.md, "The model server
protocol of inference gateways"): what an inference gateway's endpoint picker reads.

- Held requests: with 2 active places, 2 + 5 Generate calls whose long prompts are prefilled one
  token per step (--prefill_chunk_tokens=1) keep every place busy for seconds; one scrape of
  /metrics then reads exactly 5 waiting and 2 running, under the tost_ names and vLLM's
  (--metrics_vllm_names), and the utilisation gauge reads 1 (every place taken).
- Sessions: with a 64 KiB state budget, the utilisation gauge is the sessions' state bytes over the
  budget, rising with each session created and falling with each one closed, back to 0.
- traceparent on one server: a traced gRPC call and HTTP request log its trace id (the two-replica
  case, on Redis, is test_request_tracing.py)."""
import os
import threading
import time

import grpc

from conftest import SOURCE_DIR, RunningServer
from tost_harness import fetch_metrics, metric_value, parse_metrics, scrape_metrics

MODEL = "tost-austen"
MODELS = os.path.join(SOURCE_DIR, "models")
RUNNING, WAITING = 2, 5


def gauges(samples):
    """(waiting, running, utilisation) of MODEL under the tost_ names, and under vLLM's."""
    tost = tuple(metric_value(samples, name, default=None, model=MODEL) for name in
                 ("tost_generation_requests_waiting", "tost_generation_requests_running",
                  "tost_state_budget_utilization"))
    vllm = tuple(metric_value(samples, name, default=None, model_name=MODEL) for name in
                 ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"))
    return tost, vllm


def test_gauges_read_exactly_the_requests_held_waiting_and_running(proto_modules):
    pb2, pb2_grpc = proto_modules
    args = [f"--max_active_generations={RUNNING}", f"--max_queued_generations={2 * WAITING}",
            "--prefill_chunk_tokens=1", "--metrics_vllm_names"]
    with RunningServer(MODELS, args) as s:
        samples = scrape_metrics(s)
        assert gauges(samples) == ((0, 0, 0), (0, 0, 0))
        families = fetch_metrics(s)
        for name in ("tost_generation_requests_waiting", "tost_generation_requests_running",
                     "tost_state_budget_utilization", "tost_prefix_cache_config_info",
                     "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                     "vllm:gpu_cache_usage_perc", "vllm:cache_config_info"):
            assert f"# TYPE {name} gauge\n" in families, name
        (info,) = [x for x in parse_metrics(families) if x.name == "vllm:cache_config_info"]
        assert info.labels["block_size"] == "1" and int(info.labels["num_gpu_blocks"]) > 0, info

        # Each prompt is some 500 tokens fed one per step, shared by the prefilling calls: the first
        # call to finish needs well over a thousand steps, seconds even unloaded.
        prompt = ("It is a truth universally acknowledged, that a single man in possession of a good "
                  "fortune, must be in want of a wife. " * 20).encode()
        channel = grpc.insecure_channel(s.address)
        stub = pb2_grpc.TostStub(channel)
        calls, errors = [], []

        def run(call):
            try:
                for _ in call:
                    pass
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.CANCELLED:
                    errors.append(e)

        threads = []
        try:
            for _ in range(RUNNING + WAITING):
                call = stub.Generate(pb2.GenerateRequest(model=MODEL, prompt_bytes=prompt, max_new_tokens=64,
                                                         sampling=pb2.SamplingParams(temperature=0)),
                                     timeout=300)
                calls.append(call)
                threads.append(threading.Thread(target=run, args=(call,)))
                threads[-1].start()
            # Admission takes a moment per call; once all are in, nothing moves until the first call
            # finishes its prefill.
            deadline = time.monotonic() + 60
            while True:
                samples = scrape_metrics(s)
                got = gauges(samples)
                if got[0][:2] == (WAITING, RUNNING) or time.monotonic() > deadline:
                    break
                assert not errors, errors[0]
                time.sleep(0.02)
            finished = metric_value(samples, "tost_requests_total", rpc="Generate")
            assert finished == 0, "a call finished before the scrape: the prompts are too short for this machine"
            assert got == ((WAITING, RUNNING, 1.0), (WAITING, RUNNING, 1.0)), got
            assert metric_value(samples, "vllm:gpu_cache_usage_perc", model_name=MODEL) == 1.0
            assert metric_value(samples, "tost_queue_depth", model=MODEL, workload="generate") == WAITING
        finally:
            for call in calls:
                call.cancel()
            for t in threads:
                t.join(timeout=30)
            channel.close()
        assert not errors, errors[0]


def test_utilization_follows_sessions_created_and_closed(proto_modules):
    pb2, pb2_grpc = proto_modules
    budget = 64 << 10
    with RunningServer(MODELS, [f"--session_budget_bytes={budget}"]) as s, \
            grpc.insecure_channel(s.address) as channel:
        stub = pb2_grpc.TostStub(channel)

        def utilization():
            samples = scrape_metrics(s)
            u = metric_value(samples, "tost_state_budget_utilization", default=None, model=MODEL)
            held = metric_value(samples, "tost_session_state_bytes")
            assert u == held / budget, (u, held)
            return u

        assert utilization() == 0
        ids, seen = [], [0.0]
        for _ in range(6):
            ids.append(stub.CreateSession(pb2.CreateSessionRequest(model=MODEL), timeout=30).session_id)
            seen.append(utilization())
        for sid in ids:
            stub.CloseSession(pb2.SessionRef(session_id=sid), timeout=30)
            seen.append(utilization())
        print(f"\nutilisation over 6 creates and 6 closes: {[round(u, 4) for u in seen]}")
        assert all(b > a for a, b in zip(seen[:7], seen[1:7])), seen
        assert all(b < a for a, b in zip(seen[6:], seen[7:])), seen
        assert seen[-1] == 0 and 0 < seen[6] < 1


def test_traceparent_reaches_the_access_log_on_grpc_and_http_of_one_server(proto_modules):
    """The same as request_tracing_end_to_end on one server, without Redis: a traced gRPC call and a
    traced HTTP request each log the trace id, a span id of the server's and the request id
    <trace id>-<span id> that the response echoed."""
    import json
    import urllib.request
    pb2, pb2_grpc = proto_modules
    trace = "0af7651916cd43dd8448eb211c80319c"
    with RunningServer(MODELS, ["--log_format=json"]) as s, grpc.insecure_channel(s.address) as channel:
        _, call = pb2_grpc.TostStub(channel).ListModels.with_call(
            pb2.ListModelsRequest(), metadata=[("traceparent", f"00-{trace}-b7ad6b7169203331-01")], timeout=30)
        echoed = {"ListModels": dict(call.initial_metadata())["x-request-id"]}
        req = urllib.request.Request(f"http://127.0.0.1:{s.http_port}/v1/models",
                                     headers={"traceparent": f"00-{trace}-b7ad6b7169203332-00"})
        with urllib.request.urlopen(req, timeout=30) as r:
            echoed["/v1/models"] = r.headers["x-request-id"]
        deadline = time.monotonic() + 10
        while True:
            events = [json.loads(line) for line in open(s.log.name) if line.strip()]
            traced = {e.get("rpc") or e.get("path"): e for e in events if e.get("trace_id") == trace}
            if len(traced) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert set(traced) == {"ListModels", "/v1/models"}, traced
        for key, e in traced.items():
            assert e["request_id"] == f"{trace}-{e['span_id']}" == echoed[key], (key, e, echoed)
