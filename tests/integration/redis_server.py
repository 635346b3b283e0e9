"""A real redis-server for the tests and benchmarks of the shared session store (--session_store=
redis://...): Debian's redis-server (or $TOST_REDIS_SERVER_BIN) on 127.0.0.1 at a free port, with its
configuration, data and log in a temporary directory, as a child process of its own.

    with RedisServer(appendonly=True, appendfsync="always", requirepass="secret") as redis:
        url = redis.url()          # redis://default:secret@127.0.0.1:PORT/0 (password=False: without)
        redis.kill()               # SIGKILL: what was not on disk is lost
        redis.start()              # the same port and directory: the AOF is loaded again
        redis.pause()              # SIGSTOP: connections are accepted and never answered
        redis.resume()             # SIGCONT
        redis.client_command("DBSIZE")  # "3" (redis-cli -u URL, $TOST_REDIS_CLI_BIN)
    # stopped (SIGTERM, then SIGKILL), its directory removed

No RDB snapshots (`save ""`) and no automatic AOF rewrite, so the server never forks a child that
could outlive it; stop() and the `with` block's end always leave no process behind. Standard library
only: tools/bench/session_store_bench.py imports it too."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from typing import Dict, Optional, Sequence

REDIS_SERVER = os.environ.get("TOST_REDIS_SERVER_BIN", "/usr/bin/redis-server")
REDIS_CLI = os.environ.get("TOST_REDIS_CLI_BIN", "/usr/bin/redis-cli")
ERROR_PREFIXES = tuple(f"{p} " for p in ("ERR", "WRONGTYPE", "NOAUTH", "WRONGPASS", "NOPERM", "LOADING", "BUSY",
                                          "NOSCRIPT", "READONLY", "MISCONF", "EXECABORT", "OOM", "(error)"))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reap(proc: subprocess.Popen) -> None:
    """Kills `proc` if it still runs (a stopped process too): the finaliser of a RedisServer that
    was never stopped."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


class RedisServer:
    """redis-server on 127.0.0.1:`port` (a free one by default), started by the constructor unless
    start=False. `appendonly`/`appendfsync` are Redis' options of those names; `requirepass` sets
    the default user's password; `config` adds lines of redis.conf."""

    def __init__(self, appendonly: bool = False, appendfsync: str = "everysec",
                 requirepass: Optional[str] = None, port: Optional[int] = None,
                 config: Sequence[str] = (), start: bool = True, start_timeout_s: float = 30):
        if appendfsync not in ("always", "everysec", "no"):
            raise ValueError(f"appendfsync must be always, everysec or no, not {appendfsync!r}")
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.password = requirepass
        self.port = port or _free_port()
        self.host = "127.0.0.1"
        self.address = f"{self.host}:{self.port}"
        self.dir = tempfile.mkdtemp(prefix="tost_redis_")
        self.conf = os.path.join(self.dir, "redis.conf")
        self.log_path = os.path.join(self.dir, "redis.log")
        self.start_timeout_s = start_timeout_s
        self.proc: Optional[subprocess.Popen] = None
        self._finalizer = None
        self.starts = 0
        lines = [
            f"bind {self.host}",
            f"port {self.port}",
            "protected-mode no",
            "daemonize no",
            f"dir {self.dir}",
            f"logfile {self.log_path}",
            'save ""',  # no RDB snapshots (and no forked child writing one)
            "dbfilename dump.rdb",
            f"appendonly {'yes' if appendonly else 'no'}",
            f"appendfsync {appendfsync}",
            "auto-aof-rewrite-percentage 0",  # no automatic rewrite (a forked child) either
            "aof-use-rdb-preamble yes",
        ]
        if requirepass is not None:
            lines.append(f"requirepass {requirepass}")
        lines += list(config)
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        if start:
            try:
                self.start()
            except BaseException:
                self.close()
                raise

    # --- addresses -------------------------------------------------------------------------------
    def url(self, db: int = 0, password: bool = True, user: str = "default") -> str:
        """redis://[user:password@]127.0.0.1:PORT/db; the password (requirepass) only when asked."""
        auth = f"{user}:{self.password}@" if password and self.password is not None else ""
        return f"redis://{auth}{self.host}:{self.port}/{db}"

    def display_url(self, db: int = 0) -> str:
        """How the server's log names the store: redis://host:port/db, no credentials (its messages to
        clients name it by its flag, --session_store)."""
        return f"redis://{self.host}:{self.port}/{db}"

    # --- lifecycle -------------------------------------------------------------------------------
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> "RedisServer":
        """Starts redis-server on this port and directory (an AOF there is loaded again), and waits
        until it answers PING with PONG (not LOADING)."""
        if self.alive():
            raise RuntimeError(f"redis-server {self.address} already runs (pid {self.proc.pid})")
        if not os.path.exists(REDIS_SERVER):
            raise RuntimeError(f"no redis-server at {REDIS_SERVER} (set TOST_REDIS_SERVER_BIN)")
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            self.proc = subprocess.Popen([REDIS_SERVER, self.conf], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self._finalizer = weakref.finalize(self, _reap, self.proc)
            while self.proc.poll() is None and time.monotonic() < deadline:
                if self._ping():
                    self.starts += 1
                    return self
                time.sleep(0.02)
            if self.proc.poll() is None:  # never answered
                self.kill()
                raise TimeoutError(f"redis-server {self.address} did not answer PING within "
                                   f"{self.start_timeout_s:g} s:\n{self.log_text()[-3000:]}")
            # Exited: a port of a killed server is normally bindable again at once (Redis sets
            # SO_REUSEADDR), but give it a moment before failing.
            if time.monotonic() >= deadline or "Address already in use" not in self.log_text():
                raise RuntimeError(f"redis-server {self.address} exited with {self.proc.returncode}:\n"
                                   f"{self.log_text()[-3000:]}")
            time.sleep(0.2)

    def stop(self, timeout_s: float = 30) -> Optional[int]:
        """SIGTERM (Redis writes its AOF out and exits), then SIGKILL after `timeout_s`; returns the
        exit status (None if it was not started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a paused server cannot act on SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> Optional[int]:
        """SIGKILL: a crash; what appendfsync had not written out is lost."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode

    def pause(self) -> None:
        """SIGSTOP: the kernel still accepts connections and takes commands, nothing answers."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        """Stops the server and removes its directory."""
        try:
            self.stop(timeout_s=10)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- looking inside --------------------------------------------------------------------------
    def _ping(self) -> bool:
        """PING over a plain socket (AUTH first with a password): True on PONG."""
        try:
            with socket.create_connection((self.host, self.port), timeout=1) as s:
                cmds = []
                if self.password is not None:
                    cmds.append(_resp("AUTH", self.password))
                cmds.append(_resp("PING"))
                s.sendall(b"".join(cmds))
                data = b""
                while data.count(b"\r\n") < len(cmds):
                    chunk = s.recv(4096)
                    if not chunk:
                        return False
                    data += chunk
                return data.split(b"\r\n")[len(cmds) - 1] == b"+PONG"
        except OSError:
            return False

    def client_command(self, *args, db: int = 0, timeout_s: float = 10) -> str:
        """One command through redis-cli (redis_cli()) on database `db`."""
        return redis_cli(self.url(db), *args, timeout_s=timeout_s)

    def keys(self, pattern: str, db: int = 0) -> list:
        """The keys matching `pattern` (redis-cli --scan: SCAN, not KEYS)."""
        return redis_cli(self.url(db), "--scan", "--pattern", pattern, timeout_s=300).splitlines()

    def info(self, section: str = "") -> Dict[str, str]:
        """INFO `section` as a dict of its fields."""
        return info(self.url(), section)

    def log_text(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""


def _resp(*args) -> bytes:
    parts = [f"*{len(args)}\r\n".encode()]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(parts)


def redis_cli(url: str, *args, timeout_s: float = 10) -> str:
    """One command through redis-cli -u `url` (redis://[user:password@]host:port[/db]), its raw
    output (as for a pipe) without the last newline. Raises RuntimeError on a failed redis-cli or
    an error reply (redis-cli exits 0 and prints it as text: one that starts with Redis' error
    prefixes is taken for one)."""
    argv = [REDIS_CLI, "-u", url, "--no-auth-warning", *[str(a) for a in args]]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    text = out.stdout[:-1] if out.stdout.endswith("\n") else out.stdout
    if out.returncode != 0 or text.startswith(ERROR_PREFIXES):
        raise RuntimeError(f"redis-cli {' '.join(str(a) for a in args)}: exit {out.returncode}, "
                           f"{text!r} {out.stderr!r}")
    return text


def info(url: str, section: str = "") -> Dict[str, str]:
    """INFO `section` of the Redis at `url` as a dict of its fields."""
    fields = {}
    for line in redis_cli(url, "INFO", *([section] if section else [])).splitlines():
        line = line.strip()
        if line and not line.startswith("#") and ":" in line:
            key, value = line.split(":", 1)
            fields[key] = value
    return fields
