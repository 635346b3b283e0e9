"""Log injection through gRPC core's own log lines: chttp2 logs a header value it cannot parse
("Error parsing metadata: ... value=<the client's bytes>"). A value carrying a newline and a
timestamp, ANSI escape sequences and bytes that are not UTF-8 must leave every line of the server's
log one line: one JSON object per line with --log_format=json, no raw control character and no
forged line in text. The HTTP/2 frames are written by hand (RFC 7540/7541): grpcio refuses such
metadata, and no HTTP/2 library is needed."""
import json
import os
import socket
import struct
import time

import grpc
import pytest

from conftest import SOURCE_DIR, RunningServer

FAKE_LINE = b"2026-01-01 00:00:00 INFO fake line"
# A grpc-timeout gRPC cannot parse, so it logs the value; the rest is what an attacker would add.
HOSTILE_TIMEOUT = b"1S\n" + FAKE_LINE + b" \x1b[31mred\x1b[0m \x9b2J \xff\xfe\xc3 \xe2\x80\xae end"


def _hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 5.1) on a `prefix_bits` prefix of a first byte holding `first`."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out, value = [first | limit], value - limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """A literal header field without indexing, new name, no Huffman coding (RFC 7541 6.2.2)."""
    return b"\x00" + _hpack_int(len(name), 7) + name + _hpack_int(len(value), 7) + value


def _frame(frame_type: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    header = struct.pack(">I", len(payload))[1:] + bytes([frame_type, flags])
    return header + struct.pack(">I", stream_id) + payload


def send_raw_headers(address: str, headers) -> None:
    """Opens an HTTP/2 connection, sends one request's HEADERS (END_STREAM | END_HEADERS) and reads
    what the server answers until it closes or goes quiet."""
    host, port = address.rsplit(":", 1)
    block = b"".join(_literal(k, v) for k, v in headers)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(0x4, 0, 0, b"")  # SETTINGS
                  + _frame(0x1, 0x5, 1, block))  # HEADERS on stream 1
        s.settimeout(1)
        try:
            while s.recv(65536):
                pass
        except socket.timeout:
            pass


def request_headers(path=b"/tost.v1.Tost/ListModels", **extra):
    return [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path),
            (b":authority", b"localhost"), (b"content-type", b"application/grpc"),
            (b"te", b"trailers")] + [(k.replace("_", "-").encode(), v) for k, v in extra.items()]


def wait_for_log(server, predicate, timeout_s=10.0):
    """The log's lines (bytes) once one of them satisfies `predicate`, or fails after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        with open(server.log.name, "rb") as f:
            lines = f.read().split(b"\n")
        if any(predicate(line) for line in lines):
            return lines
        assert time.monotonic() < deadline, b"\n".join(lines).decode("utf-8", "backslashreplace")
        time.sleep(0.1)


def serves_a_normal_call(server, proto_modules):
    pb2, pb2_grpc = proto_modules
    with grpc.insecure_channel(server.address) as ch:
        reply = pb2_grpc.TostStub(ch).ListModels(pb2.ListModelsRequest(), timeout=30)
    assert reply.models


def attack(server):
    send_raw_headers(server.address, request_headers(grpc_timeout=HOSTILE_TIMEOUT))
    # Bytes gRPC passes on to the server's own code: an unknown method holding them, and a request
    # id and a user agent that the access log must not take as they are.
    send_raw_headers(server.address, request_headers(
        path=b"/tost.v1.Tost/\x1b[31mList\nModels\xff", x_request_id=b"id\n" + FAKE_LINE,
        user_agent=b"agent\r\n" + FAKE_LINE + b"\x1b]0;title\x07"))


def no_forged_lines(lines):
    for line in lines:
        assert not line.startswith(FAKE_LINE), line
        # No raw control character (C0, DEL, C1 in UTF-8) and nothing that is not UTF-8.
        assert not any(b < 0x20 or b == 0x7F for b in line), line
        text = line.decode("utf-8")  # raises on bytes that are not UTF-8
        assert not any(0x80 <= ord(c) <= 0x9F or c in "\u2028\u2029\u202e" for c in text), line


@pytest.fixture
def server_with():
    servers = []

    def start(*args):
        servers.append(RunningServer(os.path.join(SOURCE_DIR, "models"), args))
        return servers[-1]

    yield start
    for s in servers:
        assert s.stop() == 0, "tost_server did not exit cleanly on SIGTERM"


def attack_and_read_log(server, proto_modules, served_line):
    """The log's lines (bytes) after the attack and a normal call that follows it (whose access-log
    line satisfies `served_line`): the server must still serve."""
    attack(server)
    wait_for_log(server, lambda line: b"fake line" in line)
    serves_a_normal_call(server, proto_modules)
    lines = wait_for_log(server, served_line)
    assert lines[-1] == b"", "the log ends with a newline"
    return lines[:-1]


def test_grpc_core_lines_are_json_objects_in_json_mode(server_with, proto_modules):
    server = server_with("--log_format=json")
    lines = attack_and_read_log(server, proto_modules,
                                lambda line: b'"rpc":"ListModels"' in line and b'"code":"OK"' in line)
    no_forged_lines(lines)
    objects = [json.loads(line.decode("utf-8")) for line in lines]
    assert all(isinstance(o, dict) and {"ts", "level", "msg"} <= o.keys() for o in objects)
    (grpc_line,) = [o for o in objects if o.get("component") == "grpc" and "fake line" in o["msg"]]
    # The value arrives whole once decoded: the newline, the escape sequences, U+FFFD for the bytes
    # that were not UTF-8; gRPC's file:line as `source`.
    assert "1S\n2026-01-01 00:00:00 INFO fake line \x1b[31mred" in grpc_line["msg"], grpc_line
    assert "\ufffd" in grpc_line["msg"] and "\u202e" in grpc_line["msg"], grpc_line
    assert grpc_line["level"] == "error"
    assert ".cc:" in grpc_line["source"] and "/" not in grpc_line["source"], grpc_line
    # The unknown method and the unusable request id never reach the access log as sent.
    for o in objects:
        if o.get("msg") == "rpc":
            assert "fake line" not in o["request_id"] and o["rpc"] in ("ListModels", "other"), o


def test_grpc_core_lines_are_escaped_in_text_mode(server_with, proto_modules):
    server = server_with("--log_format=text")
    lines = attack_and_read_log(server, proto_modules,
                                lambda line: b" rpc=ListModels " in line and b" code=OK " in line)
    no_forged_lines(lines)
    (grpc_line,) = [line for line in lines if b"fake line" in line]
    # Escaped where it stands: the forged line is inside the quoted message of gRPC's line.
    assert b' ERROR "Error parsing metadata: ' in grpc_line, grpc_line
    assert b"\\n2026-01-01 00:00:00 INFO fake line \\x1b[31mred" in grpc_line, grpc_line
    assert b"\\xff\\xfe" in grpc_line and b"\\x9b2J" in grpc_line and b"\\u202e" in grpc_line, grpc_line
    assert b" component=grpc" in grpc_line and b" source=" in grpc_line, grpc_line


def test_grpc_verbosity_still_decides(server_with, proto_modules, monkeypatch):
    monkeypatch.setenv("GRPC_VERBOSITY", "NONE")
    server = server_with("--log_format=json")
    attack(server)
    serves_a_normal_call(server, proto_modules)
    lines = wait_for_log(server, lambda line: b'"rpc":"ListModels"' in line and b'"code":"OK"' in line)
    assert not [line for line in lines if b'"component":"grpc"' in line or b"fake line" in line]
