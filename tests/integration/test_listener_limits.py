"""What running out of file descriptors does to the gRPC listener.

gRPC 1.51 (Debian 12's) stops accepting for good after one accept() error such as EMFILE: it logs
"Failed accept4: Too many open files" and never re-arms its listening socket, so the replica keeps
its open connections and answers nobody new, while a gRPC probe can only time out. The server
raises its soft open-files limit to the hard one at start-up, and when the listener dies all the
same it drains and exits with status 75 so that its supervisor starts a replacement.

The limits are set with util-linux's prlimit in front of the server (exec: the pid is the
server's). Connections are plain TCP ones: gRPC accepts each, which is all a descriptor costs."""
import os
import socket
import stat
import time

import grpc

from conftest import SOURCE_DIR, _binary
import tost_launch
import tost_protos  # noqa: F401 - on sys.path once conftest is imported

REPO = os.path.join(SOURCE_DIR, "models")
# Enough for the loaded server (about 20 descriptors idle on two cores) and a few clients.
SMALL_LIMIT = 64
EXIT_LISTENER_FAILED = 75


def limited_server(tmp_path, soft: int, hard: int, extra_args=()):
    """tost_server under RLIMIT_NOFILE soft:hard, without the HTTP and metrics listeners (fewer
    descriptors to account for)."""
    wrapper = tmp_path / "tost_server_limited"
    wrapper.write_text(f'#!/bin/sh\nexec prlimit --nofile={soft}:{hard} -- "{_binary("TOST_SERVER_BIN")}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return tost_launch.TostServer(REPO, ["--drain_timeout_s=2", *extra_args], binary=str(wrapper),
                                  metrics=False, http=False)


def open_connections(address: str, count: int):
    host, port = address.rsplit(":", 1)
    return [socket.create_connection((host, int(port)), timeout=5) for _ in range(count)]


def list_models(pb2, pb2_grpc, address: str, timeout_s: float = 5):
    with grpc.insecure_channel(address) as ch:
        return pb2_grpc.TostStub(ch).ListModels(pb2.ListModelsRequest(), timeout=timeout_s)


def test_the_soft_open_files_limit_is_raised_to_the_hard_one(tmp_path, proto_modules):
    pb2, pb2_grpc = proto_modules
    srv = limited_server(tmp_path, SMALL_LIMIT, 4096)
    try:
        log = srv.log_text()
        assert f"open files limit soft=4096 hard=4096 soft_at_start={SMALL_LIMIT}" in log, log
        # Three times the start-up soft limit in connections: each is a descriptor of the server's.
        held = open_connections(srv.address, 3 * SMALL_LIMIT)
        try:
            time.sleep(0.5)  # gRPC accepts them on its own threads
            assert len(list_models(pb2, pb2_grpc, srv.address).models) >= 2
            assert srv.alive()
        finally:
            for s in held:
                s.close()
        assert "Failed accept4" not in srv.log_text()
    finally:
        assert srv.stop() == 0


def test_a_listener_that_stopped_accepting_drains_and_exits_for_a_replacement(tmp_path, proto_modules):
    pb2, pb2_grpc = proto_modules
    srv = limited_server(tmp_path, SMALL_LIMIT, SMALL_LIMIT)
    held = []
    try:
        assert "open files limit soft=64 hard=64" in srv.log_text()
        assert list_models(pb2, pb2_grpc, srv.address).models
        # Past the limit: gRPC's accept() fails with EMFILE and its listener stops.
        held = open_connections(srv.address, 2 * SMALL_LIMIT)
        deadline = time.monotonic() + 30  # the drain is 2 s; the rest is a loaded machine's slack
        while srv.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not srv.alive(), "the server kept running with a listener that accepts nobody"
        assert srv.proc.returncode == EXIT_LISTENER_FAILED, srv.log_text()[-2000:]
        log = srv.log_text()
        assert "Failed accept4: Too many open files" in log, log[-2000:]
        assert "the gRPC listener stopped accepting connections" in log, log[-2000:]
        assert log.count("the gRPC listener stopped accepting connections") == 1, log[-2000:]
    finally:
        for s in held:
            s.close()
        if srv.alive():
            srv.kill()
