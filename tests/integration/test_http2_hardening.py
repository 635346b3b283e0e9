"""HTTP/2 input a gRPC client library never sends, written frame by frame (the `h2` package and
hand-built frames): a rapid-reset flood (HEADERS, DATA, RST_STREAM, stream after stream) must leave
the server's memory bounded and other clients answered, and compressed messages must be refused
with a status that says why when their encoding is unsupported, their body corrupt, or their
inflated size past --max_message_bytes, while a well-behaved gzip client keeps working.

`python test_http2_hardening.py flood HOST:PORT PID SECONDS CONNECTIONS` runs the flood alone
against a running server and prints what it measured."""
import gzip
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib

import grpc
import h2.config
import h2.connection
import h2.events
import hpack
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from conftest import SOURCE_DIR, RunningServer, proc_status  # noqa: E402
import tost_protos  # noqa: E402 - on sys.path once conftest is imported
from tost_harness import collect_generate  # noqa: E402

REPO = os.path.join(SOURCE_DIR, "models")
CLASSIFY = "/tost.v1.Tost/Classify"
LIST_MODELS = "/tost.v1.Tost/ListModels"
MIB = 1 << 20


def grpc_message(payload: bytes, compressed: bool = False) -> bytes:
    """A gRPC length-prefixed message: the compressed flag, the length, the bytes."""
    return struct.pack(">BI", 1 if compressed else 0, len(payload)) + payload


def digits_request(pb2, seed=0):
    x = np.random.default_rng(seed).standard_normal((1, 1, 32, 32)).astype(np.float32)
    return pb2.ClassifyRequest(model="tost-digits", top_k=3,
                               tensor=pb2.FloatTensor(shape=list(x.shape), raw=x.tobytes()))


def rss_mib(pid):
    return proc_status(pid)["VmRSS"] / 1024


def rss_after_settling(pid, before_mib, max_growth_mib, timeout_s=15.0):
    """The server's RSS in MiB once it is back within max_growth_mib of before_mib (memory a flood
    took comes back when its reset calls have ended and idle threads are gone), or at timeout_s."""
    deadline = time.monotonic() + timeout_s
    while rss_mib(pid) - before_mib > max_growth_mib and time.monotonic() < deadline:
        time.sleep(0.25)
    return rss_mib(pid)


def latency_summary(latencies):
    """(p50, p99, slowest) in seconds of the bystander's (method, seconds) calls; zeros if none."""
    times = sorted(t for _, t in latencies)
    if not times:
        return 0.0, 0.0, 0.0
    return times[len(times) // 2], times[min(len(times) - 1, int(len(times) * 0.99))], times[-1]


def raw_unary(address, path, body: bytes, extra_headers=(), timeout=30.0):
    """One call on its own HTTP/2 connection with `body` as the request's DATA (sent as flow
    control allows); returns {"headers", "trailers", "data", "reset"} as the server answered."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", address),
                            ("content-type", "application/grpc"), ("te", "trailers"), *extra_headers])
    out = {"headers": {}, "trailers": {}, "data": b"", "reset": None}
    sent, done = 0, False
    deadline = time.monotonic() + timeout
    try:
        while not done:
            assert time.monotonic() < deadline, f"no answer within {timeout} s: {out}"
            while sent < len(body) and out["reset"] is None:
                chunk = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size, len(body) - sent)
                if chunk <= 0:
                    break
                sent += chunk
                conn.send_data(sid, body[sent - chunk:sent], end_stream=sent == len(body))
            if not body and sent == 0:
                conn.end_stream(sid)
                sent = -1
            sock.sendall(conn.data_to_send())
            data = sock.recv(1 << 16)
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    out["headers"] = dict(event.headers)
                elif isinstance(event, h2.events.DataReceived):
                    out["data"] += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, sid)
                elif isinstance(event, h2.events.TrailersReceived):
                    out["trailers"] = dict(event.headers)
                elif isinstance(event, (h2.events.StreamEnded, h2.events.ConnectionTerminated)):
                    done = True
                elif isinstance(event, h2.events.StreamReset):
                    out["reset"] = event.error_code
                    done = True
    finally:
        sock.close()
    return out


def grpc_status(answer):
    """(grpc-status, grpc-message) of a raw answer: in the trailers, or in the headers of a
    trailers-only response; (None, None) when the stream was reset instead."""
    fields = answer["trailers"] or answer["headers"]
    if "grpc-status" not in fields:
        return None, None
    from urllib.parse import unquote
    return int(fields["grpc-status"]), unquote(fields.get("grpc-message", ""))


# --- The rapid-reset flood -------------------------------------------------------------------

def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream) + payload


class FloodConnection:
    """One connection that opens streams and resets them at once: HEADERS, the request's DATA and
    RST_STREAM(CANCEL) per stream, many streams per write. The header block is encoded once (static
    table and literals only), so replaying it on every stream is valid HPACK. A reader thread drains
    what the server sends and counts GOAWAY frames."""

    def __init__(self, address, path, message: bytes, source: str = ""):
        host, port = address.rsplit(":", 1)
        # `source`: the local address to connect from (another loopback address is another client
        # to a proxy that limits per client address).
        self.sock = socket.create_connection((host, int(port)), source_address=(source, 0) if source else None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                        (":authority", address), ("content-type", "application/grpc"),
                                        ("te", "trailers")])
        self.block, self.data = block, grpc_message(message)
        self.next_stream, self.sent, self.goaways, self.closed = 1, 0, 0, False
        # Preface, empty SETTINGS, and the ACK of the server's SETTINGS (sent before they arrive;
        # the server only counts ACKs).
        self.sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0, b"") + _frame(4, 1, 0, b""))
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        buf = b""
        try:
            while True:
                data = self.sock.recv(1 << 16)
                if not data:
                    break
                buf += data
                while len(buf) >= 9:
                    length = int.from_bytes(buf[:3], "big")
                    if len(buf) < 9 + length:
                        break
                    if buf[3] == 7:
                        self.goaways += 1
                    buf = buf[9 + length:]
        except OSError:
            pass
        self.closed = True

    def burst(self, streams: int) -> bool:
        """`streams` streams opened and reset in one write; False once the server closed it."""
        if self.closed or self.next_stream + 2 * streams >= 1 << 31:
            return False
        out = []
        for _ in range(streams):
            s = self.next_stream
            self.next_stream += 2
            out.append(_frame(1, 0x4, s, self.block))          # HEADERS, END_HEADERS
            out.append(_frame(0, 0x1, s, self.data))           # DATA, END_STREAM
            out.append(_frame(3, 0, s, struct.pack(">I", 8)))  # RST_STREAM CANCEL
        try:
            self.sock.sendall(b"".join(out))
        except OSError:
            self.closed = True
            return False
        self.sent += streams
        return True

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def flood(address, pid, seconds, connections, path, message, max_streams=60000, source="", max_reconnects=64):
    """Floods for `seconds` or `max_streams` streams, whichever comes first (reconnecting when the
    server closes a connection, at most `max_reconnects` times) and samples the server's RSS every
    50 ms. Returns the counts."""
    conns = [FloodConnection(address, path, message, source) for _ in range(connections)]
    result = {"streams": 0, "goaways": 0, "reconnects": 0, "peak_rss_mib": rss_mib(pid)}
    end = time.monotonic() + seconds
    next_sample = 0.0
    while time.monotonic() < end and result["streams"] + sum(c.sent for c in conns) < max_streams:
        for i, c in enumerate(conns):
            if not c.burst(50):
                result["streams"] += c.sent
                result["goaways"] += c.goaways
                c.close()
                if result["reconnects"] >= max_reconnects:
                    conns[i] = None
                    continue
                result["reconnects"] += 1
                try:
                    conns[i] = FloodConnection(address, path, message, source)
                except OSError:
                    conns[i] = None
                    continue
        conns = [c for c in conns if c is not None]
        if not conns:
            break
        if time.monotonic() >= next_sample:
            next_sample = time.monotonic() + 0.05
            result["peak_rss_mib"] = max(result["peak_rss_mib"], rss_mib(pid))
    time.sleep(0.2)
    for c in conns:
        result["streams"] += c.sent
        result["goaways"] += c.goaways
        c.close()
    result["peak_rss_mib"] = max(result["peak_rss_mib"], rss_mib(pid))
    return result


def _bystander(address, pb2, pb2_grpc, stop, latencies, errors):
    """A well-behaved client during the flood: Classify and ListModels, one after the other."""
    with grpc.insecure_channel(address) as ch:
        stub = pb2_grpc.TostStub(ch)
        request = digits_request(pb2)
        while not stop.is_set():
            try:
                start = time.monotonic()
                stub.Classify(request, timeout=20)
                latencies.append(("Classify", time.monotonic() - start))
                start = time.monotonic()
                stub.ListModels(pb2.ListModelsRequest(), timeout=20)
                latencies.append(("ListModels", time.monotonic() - start))
            except grpc.RpcError as e:
                errors.append(e)
                return
            time.sleep(0.05)


# The flood: 8 connections for 4 s or 60,000 streams (45,000-60,000 from this Python flooder on two
# cores).
# Before the fix the server started a handler thread for nearly every reset stream (765 threads,
# kept), grew by ~450 MiB and kept it. Now reset streams cost no thread, no access-log line each
# and no label lookups, each connection's kernel receive buffer is bounded
# (--connection_receive_buffer_bytes, 64 KiB) so TCP holds a flooder back, and the freed heap goes
# back to the system within --heap_trim_interval_ms (5 s). During the flood gRPC 1.51 still holds
# a call for every stream it accepted and has not yet finished (it has no bound on those, nor on
# resets per connection): +160-340 MiB at the peak here (+210-480 MiB with an autotuned buffer and
# a line logged per reset call). A bystander's median call takes 5-13 ms (4 ms without the flood);
# its slowest 0.3-1.1 s (0.7-3.1 s before): such a call waits in gRPC core's transport and callback
# queues before it reaches the service (its duration in the access log stays a few ms). Bounds, for
# a loaded CI machine: latency over twice what was measured, growth about 1.5 times.
FLOOD_SECONDS = 4
FLOOD_CONNECTIONS = 8
MAX_FLOOD_GROWTH_MIB = 500
MAX_RESIDUAL_GROWTH_MIB = 80
MAX_THREADS_AFTER = 64
MAX_BYSTANDER_SECONDS = 2.5
MAX_BYSTANDER_MEDIAN_SECONDS = 0.05


def test_a_rapid_reset_flood_keeps_memory_bounded_and_bystanders_served(proto_modules):
    pb2, pb2_grpc = proto_modules
    srv = RunningServer(REPO)
    try:
        pid = srv.proc.pid
        with grpc.insecure_channel(srv.address) as ch:  # warm: the first calls allocate for good
            stub = pb2_grpc.TostStub(ch)
            for _ in range(20):
                start = time.monotonic()
                stub.Classify(digits_request(pb2), timeout=30)
                stub.ListModels(pb2.ListModelsRequest(), timeout=30)
                quiet = time.monotonic() - start
        time.sleep(0.5)
        before = rss_mib(pid)
        stop, latencies, errors = threading.Event(), [], []
        bystander = threading.Thread(target=_bystander,
                                     args=(srv.address, pb2, pb2_grpc, stop, latencies, errors))
        bystander.start()
        try:
            # In a process of its own: in this one it would hold the interpreter lock the
            # bystander needs, and the bystander's latency would be the flooder's.
            out = subprocess.run([sys.executable, __file__, "flood", srv.address, str(pid), str(FLOOD_SECONDS),
                                  str(FLOOD_CONNECTIONS)], capture_output=True, text=True, timeout=120,
                                 env={**os.environ, "TOST_SOURCE_DIR": SOURCE_DIR})
            assert out.returncode == 0, out.stderr
            result = json.loads(out.stdout.splitlines()[-1])
        finally:
            stop.set()
            bystander.join()
        after = rss_after_settling(pid, before, MAX_RESIDUAL_GROWTH_MIB)

        def slowest(method):
            return max((t for m, t in latencies if m == method), default=0.0)

        p50, p99, _ = latency_summary(latencies)

        threads = proc_status(pid)["Threads"]
        print(f"flood: {result}; RSS {before:.0f} MiB before, {result['peak_rss_mib']:.0f} peak, "
              f"{after:.0f} after, {threads} threads; bystander calls {len(latencies)}, slowest "
              f"{slowest('Classify'):.3f} s (Classify), {slowest('ListModels'):.3f} s (ListModels), "
              f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms; "
              f"without the flood {quiet:.3f} s for both")
        assert not errors, errors[0]
        assert result["streams"] >= 20000, result  # the flood did happen
        assert result["peak_rss_mib"] - before < MAX_FLOOD_GROWTH_MIB, (before, result)
        assert after - before < MAX_RESIDUAL_GROWTH_MIB, (before, after)
        assert threads <= MAX_THREADS_AFTER, threads
        assert latencies and max(t for _, t in latencies) < MAX_BYSTANDER_SECONDS, latencies
        assert p50 < MAX_BYSTANDER_MEDIAN_SECONDS, latencies
        assert srv.proc.poll() is None
    finally:
        assert srv.stop() == 0
    # The reset calls get no access-log line each, only a count at most once a second.
    with open(srv.log.name, encoding="utf-8") as f:
        lines = f.read().splitlines()
    per_call = [l for l in lines if " rpc " in l and "expected a request message" in l]
    summaries = [l for l in lines if "calls ended before their handler ran" in l]
    summarised = sum(int(l.split(" calls=")[1].split()[0]) for l in summaries)
    print(f"log: {len(lines)} lines, {len(summaries)} summaries of {summarised} calls ended before "
          f"their handler")
    assert not per_call, per_call[:3]
    assert summaries and 0 < summarised <= result["streams"], (summarised, result)
    assert len(summaries) <= FLOOD_SECONDS + 15, summaries


# --- Compressed messages ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_limit_server():
    # 1 MiB: a bomb's inflated size is far past it while its compressed size is far below.
    s = RunningServer(REPO, ["--max_message_bytes=1048576"])
    yield s
    assert s.stop() == 0


def test_an_unsupported_encoding_is_unimplemented(small_limit_server, proto_modules):
    pb2, _ = proto_modules
    body = grpc_message(digits_request(pb2).SerializeToString(), compressed=True)
    for encoding in ("snappy", "zstd", "x-made-up"):
        answer = raw_unary(small_limit_server.address, CLASSIFY, body, [("grpc-encoding", encoding)])
        code, message = grpc_status(answer)
        assert code == grpc.StatusCode.UNIMPLEMENTED.value[0], (encoding, answer)
        assert "grpc-encoding" in message and "gzip" in message, message
        assert answer["headers"].get("grpc-accept-encoding"), answer


def test_a_corrupt_gzip_body_is_refused_with_a_message(small_limit_server, proto_modules):
    pb2, _ = proto_modules
    good = gzip.compress(digits_request(pb2).SerializeToString())
    # The same bytes intact are inflated and answered.
    answer = raw_unary(small_limit_server.address, CLASSIFY, grpc_message(good, compressed=True),
                       [("grpc-encoding", "gzip")])
    assert grpc_status(answer) == (0, ""), answer
    reply = pb2.ClassifyResponse.FromString(answer["data"][5:])
    assert reply.model == "tost-digits" and len(reply.results[0].labels) == 3
    for corrupt in (b"not gzip at all", good[:len(good) // 2], good[:20] + b"\xff" * 40 + good[60:]):
        answer = raw_unary(small_limit_server.address, CLASSIFY, grpc_message(corrupt, compressed=True),
                           [("grpc-encoding", "gzip")])
        code, message = grpc_status(answer)
        assert code == grpc.StatusCode.INVALID_ARGUMENT.value[0], answer
        assert "gzip" in message and "ClassifyRequest" in message, message


def test_a_gzip_bomb_is_refused_without_inflating_it(small_limit_server):
    # 300 MiB of zeros in a few hundred KiB: refused at the 1 MiB limit, long before.
    bomb = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = bytes(MIB)
    compressed = b"".join(bomb.compress(chunk) for _ in range(300)) + bomb.flush()
    pid = small_limit_server.proc.pid
    before = proc_status(pid)["VmHWM"] / 1024
    answer = raw_unary(small_limit_server.address, LIST_MODELS, grpc_message(compressed, compressed=True),
                       [("grpc-encoding", "gzip")])
    code, message = grpc_status(answer)
    peak = proc_status(pid)["VmHWM"] / 1024
    print(f"bomb: {len(compressed)} bytes compressed, 300 MiB inflated; peak RSS {before:.0f} -> {peak:.0f} MiB")
    assert peak - before < 32, f"the bomb inflated: peak RSS {before:.0f} -> {peak:.0f} MiB"
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], answer
    assert "1048576" in message and "ListModelsRequest" in message, message


def test_a_gzip_client_still_works(small_limit_server, proto_modules):
    pb2, pb2_grpc = proto_modules
    # gRPC sends a message uncompressed when compressing would not shrink it: these requests are
    # compressible (a blank image, a repetitive prompt), so they travel compressed.
    blank = pb2.ClassifyRequest(model="tost-digits", top_k=3,
                                tensor=pb2.FloatTensor(shape=[1, 1, 32, 32], raw=bytes(4 * 32 * 32)))
    with grpc.insecure_channel(small_limit_server.address, compression=grpc.Compression.Gzip) as ch:
        stub = pb2_grpc.TostStub(ch)
        reply = stub.Classify(blank, timeout=30)
        assert reply.model == "tost-digits" and len(reply.results) == 1
        assert any(m.name == "tost-austen" for m in stub.ListModels(pb2.ListModelsRequest(), timeout=30).models)
        got = collect_generate(stub.Generate(pb2.GenerateRequest(model="tost-austen", prompt_bytes=b"It was so. " * 50,
                                                                 max_new_tokens=4), timeout=60))
        assert got.final is not None  # and nothing after it (collect_generate checks)
        # Deflate too, and a compressed request that is refused still gets the usual answer.
        reply = stub.Classify(blank, timeout=30, compression=grpc.Compression.Deflate)
        assert len(reply.results) == 1
        with pytest.raises(grpc.RpcError) as e:
            stub.Classify(pb2.ClassifyRequest(model="no-such-model"), timeout=30)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND, e.value.details()
    # Inflated past the limit by a real client: RESOURCE_EXHAUSTED naming the limit.
    with grpc.insecure_channel(small_limit_server.address, compression=grpc.Compression.Gzip) as ch:
        stub = pb2_grpc.TostStub(ch)
        big = pb2.ClassifyRequest(model="tost-digits", images=[bytes(2 * MIB)])
        with pytest.raises(grpc.RpcError) as e:
            stub.Classify(big, timeout=30)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
        assert "1048576" in e.value.details(), e.value.details()


# flood HOST:PORT PID SECONDS CONNECTIONS [SOURCE MAX_STREAMS MAX_RECONNECTS]: PID is the server's
# (its RSS is sampled), HOST:PORT the server or a proxy in front of it.
if __name__ == "__main__" and len(sys.argv) in (6, 9) and sys.argv[1] == "flood":
    tost_pb2, _ = tost_protos.tost()
    address, pid, seconds, connections = sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    more = {}
    if len(sys.argv) == 9:
        more = {"source": sys.argv[6], "max_streams": int(sys.argv[7]), "max_reconnects": int(sys.argv[8])}
    r = flood(address, pid, seconds, connections, CLASSIFY, digits_request(tost_pb2).SerializeToString(), **more)
    print(json.dumps(r))
