"""What the end-to-end tests read from a running tost_server, decoded one way for all of them: its
Prometheus metrics and its tost.v1 Generate streams. Servers are started by tost_launch.py (the
tests' RunningServer is a tost_launch.TostServer).

    import tost_harness
    samples = tost_harness.scrape_metrics(server)          # a TostServer, or a metrics port
    ok = tost_harness.metric_value(samples, "tost_requests_total", rpc="Generate", code="OK")
    tost_harness.wait_for_metric(server, "tost_requests_total", lambda v: v >= 3, rpc="Generate")

    got = tost_harness.collect_generate(stub.Generate(request, timeout=60))
    got.ids, got.texts, got.text, got.logprobs, got.snapshots, got.final

Metrics: one rule for every lookup. A series is named exactly and its labels are matched as a
subset; the values of every sample that matches are added up (no labels: the whole family's sum).
When nothing matches, the value is `default` (0.0: a counter never incremented is absent). The text
is parsed by prometheus_client's parser; the lent GPU machines' image runs test_gpu_serving.py
without it, and there a strict parser of the same format here stands in.

Generate: a stream is events in order (GenerateResponse.event: token, snapshot, final). The final
message is the last one: a message after it, or one without an event, fails the decode. An RpcError
ends the stream: it propagates, or with capture_error=True it is kept in `error` beside what came
before it (a cancelled or cut stream's tokens).
"""
from __future__ import annotations

import re
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, List, NamedTuple, Optional, Union

import grpc

# --- metrics -------------------------------------------------------------------------------------


class Sample(NamedTuple):
    name: str    # as exposed: a histogram's name_bucket / name_sum / name_count, a counter's name_total
    labels: dict
    value: float


def _metrics_port(target: Union[int, Any]) -> int:
    return target if isinstance(target, int) else target.metrics_port


def fetch_metrics(target: Union[int, Any], timeout_s: float = 10) -> str:
    """The /metrics page of `target` (an object with a metrics_port, e.g. a TostServer, or the port
    itself) on 127.0.0.1, as text. It must be served as Prometheus' text format 0.0.4, the format
    parse_metrics reads, and be valid UTF-8."""
    with urllib.request.urlopen(f"http://127.0.0.1:{_metrics_port(target)}/metrics", timeout=timeout_s) as r:
        assert r.status == 200, r.status
        content_type = r.headers["Content-Type"]
        assert content_type.startswith("text/plain; version=0.0.4"), content_type
        return r.read().decode("utf-8", errors="strict")


def parse_metrics(text: str) -> List[Sample]:
    """Every sample of a text exposition, in order. A line that is not valid exposition raises
    ValueError."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        return _parse_without_prometheus_client(text)
    return [Sample(s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text) for s in family.samples]


def scrape_metrics(target: Union[int, Any], timeout_s: float = 10) -> List[Sample]:
    """parse_metrics(fetch_metrics(target))."""
    return parse_metrics(fetch_metrics(target, timeout_s))


def metric_value(samples: Iterable[Sample], name: str, *, default: Optional[float] = 0.0,
                 **labels: str) -> Optional[float]:
    """The sum of the values of the samples named exactly `name` whose labels include `labels`;
    `default` when none does (default=None tells an absent series from a zero)."""
    matched = [s.value for s in samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    return sum(matched) if matched else default


def wait_for_metric(target: Union[int, Any], name: str, predicate: Callable[[Optional[float]], bool], *,
                    timeout_s: float = 10.0, interval_s: float = 0.01, default: Optional[float] = 0.0,
                    message: str = "", **labels: str) -> Optional[float]:
    """Scrapes `target` until predicate(metric_value(samples, name, default=default, **labels))
    holds, and returns that value. The server records some counters after the last byte of a
    response is written, so a client may see its answer before the count moves. Fails (an
    AssertionError with `message`, the series and its last value) after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = metric_value(scrape_metrics(target), name, default=default, **labels)
        if predicate(value):
            return value
        if time.monotonic() > deadline:
            series = name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
            raise AssertionError(f"{message + ': ' if message else ''}{series} was {value} for {timeout_s:g} s, "
                                 "never what the test waits for")
        time.sleep(interval_s)


_SAMPLE_LINE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?[ \t]+(\S+)(?:[ \t]+-?\d+)?")
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(,|$)')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _parse_without_prometheus_client(text: str) -> List[Sample]:
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_LINE.fullmatch(line)
        if not m:
            raise ValueError(f"not a sample line: {line!r}")
        labels, rest = {}, m.group(2) or ""
        while rest.strip():
            label = _LABEL.match(rest)
            if not label or label.group(1) in labels:
                raise ValueError(f"bad labels in {line!r}")
            labels[label.group(1)] = re.sub(r'\\[\\"n]', lambda e: _UNESCAPE[e.group(0)], label.group(2))
            rest = rest[label.end():]
        samples.append(Sample(m.group(1), labels, float(m.group(3))))
    return samples


# --- Generate streams ----------------------------------------------------------------------------


@dataclass
class Generation:
    """One Generate stream, decoded. tokens: its GeneratedToken messages; snapshots: its
    StateSnapshot messages, and snapshot_token_counts: how many tokens came before each; final: its
    GenerateFinal (None when the stream ended without one); error: the RpcError that ended it (only
    with capture_error=True)."""
    tokens: List[Any] = field(default_factory=list)
    snapshots: List[Any] = field(default_factory=list)
    snapshot_token_counts: List[int] = field(default_factory=list)
    final: Optional[Any] = None
    error: Optional[grpc.RpcError] = None

    @property
    def ids(self) -> List[int]:
        return [t.id for t in self.tokens]

    @property
    def positions(self) -> List[int]:
        return [t.position for t in self.tokens]

    @property
    def texts(self) -> List[str]:
        return [t.text for t in self.tokens]

    @property
    def text(self) -> str:
        """The tokens' texts, then what the final message released at the end (a one-shot
        generation's held-back text)."""
        return "".join(self.texts) + (self.final.text if self.final is not None else "")

    @property
    def output_bytes(self) -> bytes:
        """The tokens' raw bytes, joined (whole UTF-8 characters or not)."""
        return b"".join(t.bytes for t in self.tokens)

    @property
    def logprobs(self) -> List[Optional[float]]:
        """Each token's own logprob (None where the request asked for none)."""
        return [t.logprob if t.HasField("logprob") else None for t in self.tokens]

    @property
    def top_logprobs(self) -> List[List[tuple]]:
        """Each token's alternatives, as (id, logprob)."""
        return [[(alt.id, alt.logprob) for alt in t.top_logprobs] for t in self.tokens]

    def add(self, msg) -> None:
        """Takes the stream's next GenerateResponse."""
        assert self.final is None, f"a message after the final one: {msg}"
        event = msg.WhichOneof("event")
        if event == "token":
            self.tokens.append(msg.token)
        elif event == "snapshot":
            self.snapshots.append(msg.snapshot)
            self.snapshot_token_counts.append(len(self.tokens))
        elif event == "final":
            self.final = msg.final
        else:
            raise AssertionError(f"a GenerateResponse without an event: {msg!r}")


def collect_generate(responses: Iterable[Any], *, capture_error: bool = False) -> Generation:
    """Reads a Generate stream (the call, or any iterable of GenerateResponse) to its end."""
    got = Generation()
    try:
        for msg in responses:
            got.add(msg)
    except grpc.RpcError as e:
        if not capture_error:
            raise
        got.error = e
    return got


async def acollect_generate(call, *, capture_error: bool = False) -> Generation:
    """collect_generate for a grpc.aio call (or any async iterable of GenerateResponse)."""
    got = Generation()
    try:
        async for msg in call:
            got.add(msg)
    except grpc.RpcError as e:
        if not capture_error:
            raise
        got.error = e
    return got


def generate_preempted_repeatedly(stub, pb2, low, urgent_request, *, expected_tokens: int, max_urgent: int,
                                  timeout_s: float = 300) -> tuple:
    """Runs the generation `low` while, each time it has drawn two more tokens, one `urgent_request`
    (a more urgent call) is sent and read to its end: on a server with one active place each one
    takes the place from `low`, which is parked and goes on later where it stopped. Stops sending
    when `low` ends, when it is within 4 tokens of `expected_tokens`, or after `max_urgent` calls.
    Returns (low's Generation, the number of urgent calls)."""
    import threading

    got = Generation()
    state = {"done": False}
    progress = threading.Condition()

    def run_low():
        try:
            for msg in stub.Generate(low, timeout=timeout_s):
                with progress:
                    got.add(msg)
                    progress.notify_all()
        finally:
            with progress:
                state["done"] = True
                progress.notify_all()

    thread = threading.Thread(target=run_low)
    thread.start()
    urgent, seen = 0, 0
    try:
        while True:
            with progress:
                progress.wait_for(lambda: state["done"] or len(got.ids) >= seen + 2, timeout=60)
                if state["done"] or len(got.ids) + 4 >= expected_tokens or urgent >= max_urgent:
                    break
                seen = len(got.ids)
            answer = collect_generate(stub.Generate(urgent_request, timeout=timeout_s))
            assert answer.final is not None and answer.ids, answer
            urgent += 1
    finally:
        thread.join()
    return got, urgent
