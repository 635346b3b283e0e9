"""tools/pylib/tost_harness.py on its own, without a server: the metrics parser (prometheus_client's
and the stand-in used where it is not installed read an exposition alike), the one lookup rule, and
the Generate stream decoder on hand-made streams."""
import asyncio

import grpc
import pytest

import conftest  # noqa: F401 - puts tools/pylib on sys.path
import tost_harness
from tost_harness import collect_generate, metric_value, parse_metrics

EXPOSITION = r"""# HELP tost_requests_total RPCs finished, by method and status code.
# TYPE tost_requests_total counter
tost_requests_total{rpc="Generate",code="OK"} 7
tost_requests_total{rpc="Generate",code="CANCELLED"} 2
tost_requests_total{rpc="Classify",code="OK"} 3
# HELP tost_sessions Sessions held.
# TYPE tost_sessions gauge
tost_sessions{state="active"} 0
tost_sessions{state="idle"} 2
# TYPE tost_session_state_bytes gauge
tost_session_state_bytes 10752
# TYPE tost_request_duration_seconds histogram
tost_request_duration_seconds_bucket{rpc="Generate",le="0.5"} 4
tost_request_duration_seconds_bucket{rpc="Generate",le="+Inf"} 9
tost_request_duration_seconds_sum{rpc="Generate"} 1.25e+00
tost_request_duration_seconds_count{rpc="Generate"} 9
# TYPE tost_model_info gauge
tost_model_info{model="odd \"name\" \\ here",backend="libtorch_cpu"} 1
"""


def test_both_parsers_read_an_exposition_alike():
    with_client = parse_metrics(EXPOSITION)
    assert with_client == tost_harness._parse_without_prometheus_client(EXPOSITION)
    assert len(with_client) == 11
    assert tost_harness.Sample("tost_model_info", {"model": 'odd "name" \\ here', "backend": "libtorch_cpu"},
                               1.0) in with_client
    for bad in ('tost_sessions{state="idle} 2\n', "tost_sessions{state=idle} 2\n", "tost sessions 2\n"):
        with pytest.raises(ValueError):
            parse_metrics(bad)
        with pytest.raises(ValueError):
            tost_harness._parse_without_prometheus_client(bad)


def test_one_lookup_rule_exact_name_label_subset_summed():
    samples = parse_metrics(EXPOSITION)
    assert metric_value(samples, "tost_requests_total", rpc="Generate", code="OK") == 7
    assert metric_value(samples, "tost_requests_total", rpc="Generate") == 9
    assert metric_value(samples, "tost_requests_total") == 12
    assert metric_value(samples, "tost_requests") == 0.0  # the name is exact: no prefix matches
    assert metric_value(samples, "tost_sessions", state="idle") == 2
    assert metric_value(samples, "tost_session_state_bytes") == 10752
    assert metric_value(samples, "tost_request_duration_seconds_count", rpc="Generate") == 9
    assert metric_value(samples, "tost_request_duration_seconds_bucket", rpc="Generate", le="+Inf") == 9
    assert metric_value(samples, "tost_requests_total", rpc="ModelInfo") == 0.0
    assert metric_value(samples, "tost_requests_total", default=None, rpc="ModelInfo") is None
    assert metric_value(samples, "tost_sessions", default=None, state="active") == 0


class _Failed(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.CANCELLED


def _stream(pb2, *messages, error=None):
    for m in messages:
        yield m
    if error is not None:
        raise error


def _messages(pb2):
    token = pb2.GeneratedToken
    return [pb2.GenerateResponse(token=token(id=5, bytes=b"I", text="I", position=3, logprob=-0.5,
                                             top_logprobs=[pb2.TokenLogprob(id=5, logprob=-0.5)])),
            pb2.GenerateResponse(snapshot=pb2.StateSnapshot(state=b"s1", position=4)),
            pb2.GenerateResponse(token=token(id=6, bytes=b"\xc3", text="", position=4)),
            pb2.GenerateResponse(token=token(id=7, bytes=b"\xa9", text="\u00e9", position=5)),
            pb2.GenerateResponse(final=pb2.GenerateFinal(generated_tokens=3, text="!", position=6))]


def test_collect_generate_decodes_tokens_snapshots_and_the_final_message(proto_modules):
    pb2, _ = proto_modules
    got = collect_generate(_stream(pb2, *_messages(pb2)))
    assert got.ids == [5, 6, 7] and got.positions == [3, 4, 5]
    assert got.texts == ["I", "", "\u00e9"] and got.text == "I\u00e9!"
    assert got.output_bytes == "I\u00e9".encode()
    assert got.logprobs == [-0.5, None, None]
    assert got.top_logprobs == [[(5, -0.5)], [], []]
    assert [s.state for s in got.snapshots] == [b"s1"] and got.snapshot_token_counts == [1]
    assert got.final.generated_tokens == 3 and got.error is None


def test_collect_generate_refuses_what_a_stream_cannot_hold_and_keeps_or_raises_its_error(proto_modules):
    pb2, _ = proto_modules
    messages = _messages(pb2)
    with pytest.raises(AssertionError, match="after the final"):
        collect_generate(messages + messages[:1])
    with pytest.raises(AssertionError, match="without an event"):
        collect_generate([pb2.GenerateResponse()])
    with pytest.raises(_Failed):
        collect_generate(_stream(pb2, *messages[:2], error=_Failed()))
    got = collect_generate(_stream(pb2, *messages[:2], error=_Failed()), capture_error=True)
    assert got.ids == [5] and got.final is None and got.error.code() == grpc.StatusCode.CANCELLED


def test_acollect_generate_reads_an_async_stream(proto_modules):
    pb2, _ = proto_modules

    async def stream(error=None):
        for m in _messages(pb2)[:3]:
            yield m
        if error is not None:
            raise error

    got = asyncio.run(tost_harness.acollect_generate(stream()))
    assert got.ids == [5, 6] and got.final is None
    with pytest.raises(_Failed):
        asyncio.run(tost_harness.acollect_generate(stream(_Failed())))
    got = asyncio.run(tost_harness.acollect_generate(stream(_Failed()), capture_error=True))
    assert got.ids == [5, 6] and got.error.code() == grpc.StatusCode.CANCELLED
