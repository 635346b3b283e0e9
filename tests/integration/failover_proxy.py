"""Several tost_server replicas behind a real L7 gRPC proxy: Debian's nginx (grpc_pass to an
upstream group, round robin), on 127.0.0.1 with free ports, run as a child process with its own
prefix, configuration, pid file, temporary paths and error log in a temporary directory.

Replicas listen on ports chosen up front (not --port=0), so a replica restarted after a kill comes
back at the address the proxy already knows."""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from conftest import RunningServer

NGINX = os.environ.get("TOST_NGINX_BIN", "/usr/sbin/nginx")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_serving(address: str, timeout_s: float = 60) -> None:
    """Until grpc.health.v1 says SERVING at `address` (the models are loaded and warm)."""
    deadline = time.monotonic() + timeout_s
    last = None
    with grpc.insecure_channel(address) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            try:
                last = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status
                if last == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError as e:
                last = e.code()
            time.sleep(0.05)
    raise TimeoutError(f"{address}: health SERVING expected within {timeout_s} s, last answer {last}")


class Replica:
    """One tost_server at a fixed port; kill() and start() again keep the address."""

    def __init__(self, repo: str, args):
        self.repo = repo
        self.args = list(args)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.server = None
        self.starts = 0

    def start(self, timeout_s: float = 60):
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                # A later --port overrides conftest's --port=0.
                self.server = RunningServer(self.repo, [*self.args, f"--port={self.port}"])
                break
            except RuntimeError:
                # The port of a killed replica can take a moment to be bindable again.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.starts += 1
        wait_serving(self.address, max(1.0, deadline - time.monotonic()))
        return self

    @property
    def pid(self):
        return self.server.proc.pid

    def alive(self) -> bool:
        return self.server is not None and self.server.proc.poll() is None

    def kill(self):
        self.server.kill()

    def terminate(self):
        self.server.proc.send_signal(signal.SIGTERM)

    def stop(self):
        return self.server.stop() if self.server is not None else None

    def log(self) -> str:
        return self.server.log_text() if self.server is not None else ""


class Nginx:
    """nginx as an L7 gRPC proxy in front of `upstreams` ([(address, weight)]).

    How it meets a dead upstream (nginx 1.22, as the failover tests see it):
    - a call in flight when its upstream dies is not retried (the request was sent, and a POST is
      not idempotent): nginx logs "upstream prematurely closed connection while reading upstream"
      and resets the client's stream, which gRPC reports as INTERNAL "Received RST_STREAM with
      error code 2". Resuming it is the client's part;
    - a new call to it is refused at connect and passed to the next server (grpc_next_upstream
      error) before anything was sent, invisibly to the client; the server is then left out for
      `fail_timeout_s`, and once back its share ramps up to its weight again (nginx lowers a failed
      server's effective weight and raises it one step per pick);
    - with no upstream left, nginx answers 502, which gRPC reports as UNAVAILABLE."""

    def __init__(self, upstreams, fail_timeout_s: float = 2):
        self.dir = tempfile.mkdtemp(prefix="tost_nginx_")
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.conf = os.path.join(self.dir, "nginx.conf")
        self.error_log = os.path.join(self.dir, "error.log")
        self.access_log = os.path.join(self.dir, "access.log")
        for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            os.makedirs(os.path.join(self.dir, sub))
        servers = "\n".join(f"    server {address} weight={weight} max_fails=1 fail_timeout={fail_timeout_s}s;"
                            for address, weight in upstreams)
        # Run as root (CI containers), nginx would switch its worker to `nobody`, which cannot
        # write the temporary directory.
        user = "user root;" if os.geteuid() == 0 else ""
        with open(self.conf, "w") as f:
            f.write(f"""{user}
daemon off;
master_process on;
worker_processes 1;
pid {self.dir}/nginx.pid;
lock_file {self.dir}/nginx.lock;
error_log {self.error_log} info;
events {{ worker_connections 1024; }}
http {{
  log_format upstream '$remote_addr "$request" $status upstream=$upstream_addr '
                      'upstream_status=$upstream_status time=$request_time';
  access_log {self.access_log} upstream;
  client_body_temp_path {self.dir}/body;
  proxy_temp_path {self.dir}/proxy;
  fastcgi_temp_path {self.dir}/fastcgi;
  uwsgi_temp_path {self.dir}/uwsgi;
  scgi_temp_path {self.dir}/scgi;
  upstream tost {{
{servers}
  }}
  server {{
    listen 127.0.0.1:{self.port} http2;
    http2_max_concurrent_streams 512;
    keepalive_requests 1000000;
    keepalive_timeout 600s;
    location / {{
      grpc_pass grpc://tost;
      grpc_next_upstream error timeout;
      grpc_next_upstream_tries 4;
      grpc_connect_timeout 2s;
      grpc_read_timeout 300s;
      grpc_send_timeout 300s;
    }}
  }}
}}
""")
        self.proc = None

    def _args(self):
        return [NGINX, "-p", self.dir, "-c", self.conf, "-e", self.error_log]

    def start(self, timeout_s: float = 20):
        check = subprocess.run([*self._args(), "-t"], capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            raise RuntimeError(f"nginx -t rejected {self.conf}: {check.stderr}")
        self.proc = subprocess.Popen(self._args(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited with {self.proc.returncode}: {self.proc.stderr.read()} "
                                   f"{self.errors()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"nginx did not listen on {self.address} within {timeout_s} s: {self.errors()}")

    def errors(self) -> str:
        try:
            with open(self.error_log, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def access(self) -> str:
        try:
            with open(self.access_log, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # fast shutdown: the master stops its worker
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        shutil.rmtree(self.dir, ignore_errors=True)


class Cluster:
    """Replicas sharing one session key, in batch-invariant decode mode, behind one nginx."""

    def __init__(self, repo: str, key_file: str, replicas: int = 2, weights=None, extra_args=()):
        # A short drain by default, so stopping a replica with streams left (a failed test) is
        # quick; extra_args come later and win.
        args = [f"--session_key_file={key_file}", "--batch_invariant_decode", "--drain_timeout_s=2", *extra_args]
        self.replicas = [Replica(repo, args) for _ in range(replicas)]
        self.weights = list(weights or [1] * replicas)
        self.proxy = None

    def __enter__(self):
        try:
            for r in self.replicas:
                r.start()
            self.proxy = Nginx(list(zip((r.address for r in self.replicas), self.weights))).start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        for r in self.replicas:
            try:
                if r.alive():
                    r.stop()
            except Exception:  # noqa: BLE001 - the others are stopped all the same
                if r.alive():
                    r.server.proc.kill()
        if self.proxy is not None:
            self.proxy.stop()
