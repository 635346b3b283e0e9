"""The HTTP/2 rapid-reset flood through the shipped gRPC edge proxy (deploy/proxy: the compose
stack's grpc-proxy services and the Kubernetes grpc-edge-proxy sidecar run this configuration), with
Debian's nginx run by the image's own entrypoint script against a real tost_server.

The flooder connects from 127.0.0.3, a client address of its own, as a flooding client would; the
bystander from 127.0.0.1. Measured: the server's memory and descriptors during and after the flood,
what the bystander waited, and what the proxy answered the flood."""
import json
import os
import re
import subprocess
import sys
import threading
import time

import grpc

from conftest import SOURCE_DIR, RunningServer, proc_status
from failover_proxy import free_port
from test_http2_hardening import _bystander, digits_request, latency_summary, rss_after_settling, rss_mib

REPO = os.path.join(SOURCE_DIR, "models")
ENTRYPOINT = os.path.join(SOURCE_DIR, "deploy", "proxy", "entrypoint.sh")
NGINX = os.environ.get("TOST_NGINX_BIN", "/usr/sbin/nginx")
HARDENING = os.path.join(os.path.dirname(__file__), "test_http2_hardening.py")

# The flood of the report that asked for the proxy: 38 connections for 10 s (524,400 resets took
# the bare server from 399 to 1,233 MiB, kept afterwards).
FLOOD_SECONDS = 10
FLOOD_CONNECTIONS = 38
FLOOD_SOURCE = "127.0.0.3"
# Measured here (2 cores, AVX-512, 2026-11-29, other builds running): 430,000-790,000 streams,
# the server +32 to +36 MiB at the peak, 2,000-2,600 descriptors at most (connections nginx opened
# for reset calls and closed, which gRPC tears down within about two seconds), 98% of the flood
# answered 429 by the proxy itself. Bounds for a loaded CI machine.
MIN_STREAMS = 50_000
MAX_FLOOD_GROWTH_MIB = 120
MAX_RESIDUAL_GROWTH_MIB = 60
MAX_SERVER_FDS = 10_000
MAX_BYSTANDER_SECONDS = 2.5
MAX_BYSTANDER_MEDIAN_SECONDS = 0.05


class EdgeProxy:
    """deploy/proxy/entrypoint.sh in front of `upstream`, in a temporary run directory."""

    def __init__(self, upstream: str, tmp_path, extra_env=None, credentials=None):
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.run_dir = str(tmp_path / "proxy")
        self.access_log = os.path.join(self.run_dir, "access.log")
        env = {**os.environ, "TOST_GRPC_UPSTREAM": upstream, "TOST_GRPC_PROXY_PORT": f"127.0.0.1:{self.port}",
               "TOST_PROXY_RUN_DIR": self.run_dir, "TOST_NGINX_BIN": NGINX,
               "TOST_PROXY_ACCESS_LOG": f"{self.access_log} tost_grpc",
               # As root (CI), nginx would run its workers as `nobody`, who cannot write the run dir.
               "TOST_PROXY_GLOBALS": "user root;" if os.geteuid() == 0 else "", **(extra_env or {})}
        self.credentials = credentials
        self.stderr = open(tmp_path / "proxy.err", "w+")
        self.proc = subprocess.Popen(["/bin/sh", ENTRYPOINT], env=env, stdout=subprocess.DEVNULL,
                                     stderr=self.stderr)
        deadline = time.monotonic() + 20
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the proxy exited with {self.proc.returncode}: {self.errors()}")
            try:
                with self.channel() as ch:
                    grpc.channel_ready_future(ch).result(timeout=1)
                return
            except grpc.FutureTimeoutError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the proxy did not listen on {self.address}: {self.errors()}")

    def channel(self):
        if self.credentials is None:
            return grpc.insecure_channel(self.address)
        return grpc.secure_channel(self.address, self.credentials,
                                   options=[("grpc.ssl_target_name_override", "tost-serve.test")])

    def errors(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read()[-3000:]

    def statuses(self):
        """What the access log holds, by status: the calls the proxy passed on (it writes no line for
        the ones it refused itself, 429). Lines are flushed at least once a second."""
        time.sleep(1.2)
        counts = {}
        with open(self.access_log, errors="replace") as f:
            for line in f:
                m = re.search(r'HTTP/2\.0" (\d+) ', line)
                if m:
                    counts[m.group(1)] = counts.get(m.group(1), 0) + 1
        return counts

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def open_fds(pid) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_rapid_reset_flood_through_the_shipped_proxy(tmp_path, proto_modules):
    pb2, pb2_grpc = proto_modules
    srv = RunningServer(REPO)
    proxy = None
    try:
        pid = srv.proc.pid
        proxy = EdgeProxy(srv.address, tmp_path)
        with grpc.insecure_channel(proxy.address) as ch:  # warm, through the proxy
            stub = pb2_grpc.TostStub(ch)
            for _ in range(20):
                stub.Classify(digits_request(pb2), timeout=30)
                stub.ListModels(pb2.ListModelsRequest(), timeout=30)
        time.sleep(0.5)
        before = rss_mib(pid)
        fds_before = open_fds(pid)
        stop, latencies, errors = threading.Event(), [], []
        bystander = threading.Thread(target=_bystander, args=(proxy.address, pb2, pb2_grpc, stop, latencies, errors))
        fd_peak = [fds_before]

        def sample_fds():
            while not stop.is_set():
                fd_peak[0] = max(fd_peak[0], open_fds(pid))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample_fds)
        bystander.start()
        sampler.start()
        try:
            out = subprocess.run([sys.executable, HARDENING, "flood", proxy.address, str(pid), str(FLOOD_SECONDS),
                                  str(FLOOD_CONNECTIONS), FLOOD_SOURCE, "10000000", "100000"],
                                 capture_output=True, text=True, timeout=180,
                                 env={**os.environ, "TOST_SOURCE_DIR": SOURCE_DIR})
            assert out.returncode == 0, out.stderr
            result = json.loads(out.stdout.splitlines()[-1])
        finally:
            stop.set()
            bystander.join()
            sampler.join()
        after = rss_after_settling(pid, before, MAX_RESIDUAL_GROWTH_MIB)
        p50, p99, slowest = latency_summary(latencies)
        statuses = proxy.statuses()
        print(f"flood through the proxy: {result}; server RSS {before:.0f} MiB before, "
              f"{result['peak_rss_mib']:.0f} peak, {after:.0f} after; descriptors {fds_before} before, "
              f"{fd_peak[0]} peak; {proc_status(pid)['Threads']} threads; proxy answers {statuses}; "
              f"bystander calls {len(latencies)}, p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
              f"slowest {slowest * 1000:.0f} ms")
        assert not errors, errors[0]
        assert result["streams"] >= MIN_STREAMS, result  # the flood did happen
        # The proxy refused most of it itself (429: the per-client call rate), unlogged.
        assert "429" not in statuses, statuses
        assert sum(statuses.values()) <= 0.2 * result["streams"], (statuses, result)
        assert result["peak_rss_mib"] - before < MAX_FLOOD_GROWTH_MIB, (before, result)
        assert after - before < MAX_RESIDUAL_GROWTH_MIB, (before, after)
        assert fd_peak[0] < MAX_SERVER_FDS, fd_peak
        assert latencies and slowest < MAX_BYSTANDER_SECONDS, sorted(t for _, t in latencies)[-5:]
        assert p50 < MAX_BYSTANDER_MEDIAN_SECONDS, p50
        # The server still accepts: directly, and through the proxy.
        for address in (srv.address, proxy.address):
            with grpc.insecure_channel(address) as ch:
                assert pb2_grpc.TostStub(ch).ListModels(pb2.ListModelsRequest(), timeout=10).models
        assert srv.alive()
        assert "Failed accept4" not in srv.log_text()
    finally:
        if proxy is not None:
            proxy.stop()
        assert srv.stop() == 0


def test_the_proxy_terminates_tls_in_front_of_a_plaintext_server(tmp_path, proto_modules):
    """TOST_PROXY_TLS_CERT_FILE / _KEY_FILE: clients speak TLS to the proxy, which passes the calls
    to the server in plaintext (on the pod's loopback in Kubernetes)."""
    pb2, pb2_grpc = proto_modules
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=tost-serve.test", "-addext", "subjectAltName=DNS:tost-serve.test",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    srv = RunningServer(REPO)
    proxy = None
    try:
        proxy = EdgeProxy(srv.address, tmp_path,
                          {"TOST_PROXY_TLS_CERT_FILE": str(cert), "TOST_PROXY_TLS_KEY_FILE": str(key)},
                          credentials=grpc.ssl_channel_credentials(root_certificates=cert.read_bytes()))
        with proxy.channel() as ch:
            stub = pb2_grpc.TostStub(ch)
            assert {m.name for m in stub.ListModels(pb2.ListModelsRequest(), timeout=10).models} >= {"tost-digits"}
            assert len(stub.Classify(digits_request(pb2), timeout=30).results) == 1
        # Plaintext to the TLS port is refused.
        with grpc.insecure_channel(proxy.address) as ch:
            try:
                pb2_grpc.TostStub(ch).ListModels(pb2.ListModelsRequest(), timeout=5)
                raise AssertionError("a plaintext call went through the TLS proxy")
            except grpc.RpcError as e:
                assert e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL,
                                    grpc.StatusCode.DEADLINE_EXCEEDED), e
    finally:
        if proxy is not None:
            proxy.stop()
        assert srv.stop() == 0
