"""Starting tost_server (and servers that announce themselves the way it does) for the tests, the
benchmarks and the tools: on 127.0.0.1 with a free port, ready when the server says so, its log in a
file, stopped with SIGTERM and then SIGKILL.

    import tost_launch
    with tost_launch.TostServer("models", ["--max_active_generations=8"]) as server:
        ...  # server.address ("127.0.0.1:PORT"), server.port, server.metrics_port, server.http_port,
             # server.pid
    # stopped; server.proc.returncode, server.log_text()

Readiness is the server's own signal: tost_server prints `tost_server listening on HOST:PORT` on
stdout once every model of its repository is loaded and the port serves, then `tost_server metrics
on HOST:PORT` when its metrics endpoint is on and `tost_server http on HOST:PORT` when its HTTP front
end is (service/server_main.cc), in that order; nothing else goes to stdout.
Its log (stderr) goes to a file: `log_path`, or a temporary file kept after the server stops (its
name is `server.log.name`; `remove_log=True` removes it when the `with` block ends).
"""
from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import tempfile
import time
from typing import Dict, Optional, Sequence

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
LISTENING = r"listening on [\d.]+:(\d+)"
METRICS = r"metrics on [\d.]+:(\d+)"
HTTP = r"http on [\d.]+:(\d+)"


class StartError(RuntimeError):
    """The server exited, or printed something else, before its ready line (its log is in the
    message), or did not print it within the start timeout."""


def default_binary() -> str:
    """$TOST_SERVER_BIN (ctest sets it), else build/service/tost_server of this checkout."""
    return os.environ.get("TOST_SERVER_BIN") or os.path.join(ROOT, "build", "service", "tost_server")


def last_flag(argv: Sequence[str], name: str) -> Optional[str]:
    """The value the last `--name=V` / `--name V` (or single-dash) of argv gives, as Abseil reads
    it; None when absent (values from a --flagfile are not seen)."""
    value = None
    for i, arg in enumerate(argv):
        m = re.fullmatch(rf"--?{name}(?:=(.*))?", arg)
        if m:
            value = m.group(1) if m.group(1) is not None else (argv[i + 1] if i + 1 < len(argv) else None)
    return value


class ServerProcess:
    """A child process that serves on 127.0.0.1 and prints, on stdout, a line matching `ready` whose
    group 1 is its port. Starting waits for that line (up to `start_timeout_s`; `wait=False` returns
    at once, and wait_ready() waits later); stderr goes to the log file. `cpus` pins the process
    (sched_setaffinity); `env` replaces the environment. A context manager: stop() on exit."""

    def __init__(self, argv: Sequence[str], name: Optional[str] = None, ready: str = LISTENING,
                 log_path: Optional[str] = None, cpus: Optional[Sequence[int]] = None,
                 env: Optional[Dict[str, str]] = None, start_timeout_s: float = 300,
                 stop_timeout_s: float = 30, remove_log: bool = False, wait: bool = True):
        self.argv = [str(a) for a in argv]
        self.name = name or os.path.basename(self.argv[0])
        self.ready = ready
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.remove_log = remove_log
        self.port: Optional[int] = None
        self.address: Optional[str] = None
        self.log = (open(log_path, "w+b") if log_path else
                    tempfile.NamedTemporaryFile(prefix=f"{self.name}_", suffix=".log", delete=False))
        self.log_path = self.log.name
        self._stdout = b""
        affinity = list(cpus) if cpus else None
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=self.log, env=env,
                                     preexec_fn=(lambda: os.sched_setaffinity(0, affinity)) if affinity else None)
        self.pid = self.proc.pid
        if wait:
            self.wait_ready()

    # --- start -----------------------------------------------------------------------------------
    def wait_ready(self) -> "ServerProcess":
        """Until the ready line; sets port and address. Stops the process and raises StartError
        when it does not come."""
        self._deadline = time.monotonic() + self.start_timeout_s
        self.port = int(self._expect(self.ready, "its ready line").group(1))
        self.address = f"127.0.0.1:{self.port}"
        return self

    def _readline(self) -> Optional[str]:
        """The next stdout line; "" at end of file; None at the deadline."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._stdout:
            left = self._deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            self._stdout += chunk
        line, _, self._stdout = self._stdout.partition(b"\n")
        return line.decode(errors="replace")

    def _expect(self, pattern: str, what: str) -> re.Match:
        line = self._readline()
        m = re.search(pattern, line) if line else None
        if m:
            return m
        got = (f"nothing within {self.start_timeout_s:g} s" if line is None else
               f"exit status {self.stop()}" if not line else repr(line))
        self.stop()
        raise StartError(f"{self.name} did not start: expected {what} (matching {pattern!r}) on stdout, got {got}; "
                         f"command: {' '.join(self.argv)}; log {self.log_path}:\n{self.log_text()[-4000:]}")

    # --- while it runs ---------------------------------------------------------------------------
    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        """What the server has written to its log so far."""
        with open(self.log_path, errors="replace") as f:
            return f.read()

    # --- stop ------------------------------------------------------------------------------------
    def stop(self, timeout_s: Optional[float] = None) -> int:
        """SIGTERM, then SIGKILL if it has not exited within `timeout_s` (default stop_timeout_s);
        returns its exit status (negative: the signal that ended it)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=self.stop_timeout_s if timeout_s is None else timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._close()
        return self.proc.returncode

    def kill(self) -> int:
        """SIGKILL (a crash, as the server sees it); returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self._close()
        return self.proc.returncode

    def _close(self) -> None:
        if self.proc.stdout and not self.proc.stdout.closed:
            self.proc.stdout.close()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        if self.remove_log:
            try:
                os.unlink(self.log_path)
            except FileNotFoundError:
                pass


class TostServer(ServerProcess):
    """tost_server with `repo` as its model repository, on 127.0.0.1 with a free port (--port=0) and,
    with `metrics`, a free metrics port on 127.0.0.1 (else --metrics_port=-1), and with `http`, a
    free HTTP front end port on 127.0.0.1 (else --http_port=-1); `extra_args` come last and win (a
    fixed --port=N, --metrics_port=-1, ...). `intra_op_threads` (None: the server's default) and
    `log_requests=False` (no access log line per call) are flags too. metrics_port / http_port are
    None when that endpoint is off. Other keywords: ServerProcess's."""

    def __init__(self, repo: str, extra_args: Sequence[str] = (), binary: Optional[str] = None,
                 metrics: bool = True, intra_op_threads: Optional[int] = 1, log_requests: bool = True,
                 name: str = "tost_server", http: bool = True, **kwargs):
        argv = [binary or default_binary(), f"--model_repository={repo}", "--host=127.0.0.1", "--port=0"]
        if intra_op_threads is not None:
            argv.append(f"--intra_op_threads={intra_op_threads}")
        argv += ["--metrics_port=0", "--metrics_address=127.0.0.1"] if metrics else ["--metrics_port=-1"]
        argv += ["--http_port=0", "--http_address=127.0.0.1"] if http else ["--http_port=-1"]
        if not log_requests:
            argv.append("--log_requests=false")
        self.metrics_port: Optional[int] = None
        self.http_port: Optional[int] = None
        super().__init__([*argv, *extra_args], name=name, **kwargs)

    def wait_ready(self) -> "TostServer":
        super().wait_ready()
        # The metrics line follows the listening line (absent with --metrics_port=-1).
        if last_flag(self.argv, "metrics_port") != "-1":
            self.metrics_port = int(self._expect(METRICS, "its metrics line").group(1))
        # Then the HTTP front end's (absent with --http_port=-1).
        if last_flag(self.argv, "http_port") != "-1":
            self.http_port = int(self._expect(HTTP, "its http line").group(1))
        return self
