"""Soak, end to end: mixed traffic for ten minutes (TOST_SOAK_SECONDS) from several
threads: classification (tensors and PNGs), generation (fresh, and continued statelessly from its
blob), sessions (create, generate, export, import, fork, close), and clients that misbehave:
cancel mid-stream, stop reading a stream (past the stall timeout, or for a while and then resume),
and close their channel with calls in flight.

After the warm-up the server's resident memory must stay flat, and at the end nothing may be left:
no active, queued or paused generation, no session beyond the baseline, no queued classification,
and the thread count back to its baseline (/proc/<pid>/status). The normal end-to-end run skips it:
the `soak` ctest test (label `slow`) sets TOST_SOAK=1, and it runs for TOST_SOAK_SECONDS if the
caller sets that (a short local check), 600 otherwise."""
import os
import random
import threading
import time

import grpc
import numpy as np
import pytest

from conftest import SOURCE_DIR, RunningServer, proc_status
from tost_harness import collect_generate, metric_value, scrape_metrics

SOAK_S = float(os.environ.get("TOST_SOAK_SECONDS", "600"))
pytestmark = pytest.mark.skipif(not os.environ.get("TOST_SOAK") and "TOST_SOAK_SECONDS" not in os.environ,
                                reason="the soak runs under `ctest -L slow` (or with TOST_SOAK_SECONDS set)")

VISION, LM = "tost-digits", "tost-austen"
STALL_MS = 2000  # --stream_stall_timeout_ms: stalled readers are ended within the soak
SAMPLE_S = 5.0   # resident memory and threads are read this often
# Resident memory after the warm-up may move by this much between the first and the last quarter
# of the soak (means of the samples): allocator caches and gRPC's buffers settle within the
# warm-up. In the 10-minute run about 165,000 RPCs separate the two quarters, so a leak of 50 bytes
# per request would exceed it; measured: +1.2 MiB (425.7 to 426.9 MiB).
RSS_FLAT_TOLERANCE_MIB = 8
# Codes a misbehaving client may see; anything else (INTERNAL, UNKNOWN, ...) fails the soak.
EXPECTED = {"OK", "CANCELLED", "RESOURCE_EXHAUSTED"}
# Python's channels share one connection per address unless told otherwise: a client that
# disconnects must own its connection, so that closing its channel closes the TCP connection.
OWN_CONNECTION = ("grpc.use_local_subchannel_pool", 1)


class Soak:
    def __init__(self, srv, pb2, pb2_grpc):
        self.srv, self.pb2, self.pb2_grpc = srv, pb2, pb2_grpc
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.codes = {}        # (worker, code) -> count
        self.unexpected = []   # (worker, code, details), first few
        self.control = grpc.insecure_channel(srv.address)
        self.stub = pb2_grpc.TostStub(self.control)
        digits = os.path.join(SOURCE_DIR, "models", VISION, "samples")
        self.pngs = [open(os.path.join(digits, f"{d}_0.png"), "rb").read() for d in range(10)]

    def count(self, worker, code, details=""):
        with self.lock:
            self.codes[(worker, code)] = self.codes.get((worker, code), 0) + 1
            if code not in EXPECTED and len(self.unexpected) < 20:
                self.unexpected.append((worker, code, details))

    def call(self, worker, fn):
        """Runs one client operation, counting how it ended."""
        try:
            fn()
            self.count(worker, "OK")
        except grpc.RpcError as e:
            self.count(worker, e.code().name, e.details())

    def close_session(self, worker, session_id):
        """Closes a session, waiting while a cut stream still holds it busy (its state is checked
        in when the server has taken the stream's final event)."""
        deadline = time.monotonic() + 30
        while True:
            try:
                self.stub.CloseSession(self.pb2.SessionRef(session_id=session_id), timeout=10)
                return
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.FAILED_PRECONDITION and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                self.count(worker, "close:" + e.code().name, e.details())
                return

    def request(self, rng, **kw):
        return self.pb2.GenerateRequest(
            prompt_bytes=rng.choice([b"It was", b"Mr. Darcy", b"She said that", b"The"]),
            sampling=self.pb2.SamplingParams(temperature=0.8, top_p=0.95, seed=rng.randrange(1 << 30)),
            **kw)

    # --- well-behaved clients -------------------------------------------------------------------

    def classifier(self, seed):
        rng, pb2 = random.Random(seed), self.pb2
        with grpc.insecure_channel(self.srv.address) as ch:
            stub = self.pb2_grpc.TostStub(ch)
            while not self.stop.is_set():
                n = rng.randint(1, 8)
                if rng.random() < 0.5:
                    req = pb2.ClassifyRequest(model=VISION, images=rng.choices(self.pngs, k=n))
                else:
                    pixels = np.random.default_rng(rng.randrange(1 << 30)).standard_normal(
                        (n, 1, 32, 32), dtype=np.float32)
                    req = pb2.ClassifyRequest(model=VISION, tensor=pb2.FloatTensor(
                        shape=[n, 1, 32, 32], raw=pixels.tobytes()), top_k=3)

                def classify():
                    r = stub.Classify(req, timeout=30)
                    assert len(r.results) == n

                self.call("classify", classify)
                time.sleep(0.01)

    def generator(self, seed):
        rng = random.Random(seed)
        with grpc.insecure_channel(self.srv.address) as ch:
            stub = self.pb2_grpc.TostStub(ch)
            while not self.stop.is_set():
                blob = []

                def generate():
                    final = collect_generate(stub.Generate(self.request(
                        rng, model=LM, max_new_tokens=rng.randint(4, 48), return_state=True),
                        timeout=60)).final
                    blob.append(final.state)

                self.call("generate", generate)
                if blob:  # stateless continuation from the returned blob
                    self.call("generate_state", lambda: [m for m in stub.Generate(
                        self.pb2.GenerateRequest(state=blob[0], max_new_tokens=rng.randint(1, 16)),
                        timeout=60)])
                time.sleep(0.01)

    def sessions(self, seed):
        rng, pb2 = random.Random(seed), self.pb2
        with grpc.insecure_channel(self.srv.address) as ch:
            stub = self.pb2_grpc.TostStub(ch)
            while not self.stop.is_set():
                ids = []
                try:
                    s = stub.CreateSession(pb2.CreateSessionRequest(
                        model=LM, sampling=pb2.SamplingParams(temperature=0.7, seed=rng.randrange(1000))),
                        timeout=30)
                    ids.append(s.session_id)
                    list(stub.Generate(pb2.GenerateRequest(session_id=s.session_id, prompt_bytes=b"It was",
                                                           max_new_tokens=rng.randint(1, 24)), timeout=60))
                    exported = stub.ExportSession(pb2.SessionRef(session_id=s.session_id), timeout=30)
                    imported = stub.ImportSession(pb2.ImportSessionRequest(state=exported.state), timeout=30)
                    ids.append(imported.session_id)
                    assert imported.position == exported.session.position
                    fork = stub.ForkSession(pb2.SessionRef(session_id=s.session_id), timeout=30)
                    ids.append(fork.session_id)
                    for sid in (imported.session_id, fork.session_id):
                        list(stub.Generate(pb2.GenerateRequest(session_id=sid, max_new_tokens=rng.randint(1, 8)),
                                           timeout=60))
                    self.count("sessions", "OK")
                except grpc.RpcError as e:
                    self.count("sessions", e.code().name, e.details())
                finally:
                    for sid in ids:
                        self.close_session("sessions", sid)
                time.sleep(0.01)

    # --- misbehaving clients --------------------------------------------------------------------

    def canceller(self, seed):
        """Cancels streams after a few tokens; every other one continues a session."""
        rng, pb2 = random.Random(seed), self.pb2
        with grpc.insecure_channel(self.srv.address) as ch:
            stub = self.pb2_grpc.TostStub(ch)
            while not self.stop.is_set():
                session = None
                if rng.random() < 0.5:
                    session = stub.CreateSession(pb2.CreateSessionRequest(model=LM), timeout=30).session_id
                    req = self.request(rng, session_id=session, max_new_tokens=400)
                else:
                    req = self.request(rng, model=LM, max_new_tokens=400)
                call = stub.Generate(req, timeout=60)

                def read_then_cancel():
                    want = rng.randint(0, 12)
                    for i, _ in enumerate(call):
                        if i >= want:
                            break
                    call.cancel()
                    list(call)  # raises CANCELLED

                self.call("cancel", read_then_cancel)
                if session:
                    self.close_session("cancel", session)
                time.sleep(0.01)

    def staller(self, seed):
        """Stops reading a stream: past the stall timeout (the server ends it) and then closes the
        channel, or for less than it and then reads the rest."""
        rng, pb2 = random.Random(seed), self.pb2
        while not self.stop.is_set():
            # A small receive window that never grows: the server's own bound on unread tokens,
            # not the transport's buffers, is what stops the generation.
            ch = grpc.insecure_channel(self.srv.address, options=[
                ("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0), OWN_CONNECTION])
            stub = self.pb2_grpc.TostStub(ch)
            session = None
            if rng.random() < 0.5:
                session = self.stub.CreateSession(pb2.CreateSessionRequest(model=LM), timeout=30).session_id
            past_timeout = rng.random() < 0.5
            req = self.request(rng, model="" if session else LM, session_id=session or "",
                               max_new_tokens=600 if past_timeout else 120, top_logprobs=20)
            call = stub.Generate(req, timeout=60)

            def stall():
                next(call)
                time.sleep(STALL_MS / 1000 * (1.5 if past_timeout else 0.4))
                if past_timeout:
                    ch.close()  # the server has ended it; nobody reads the rest
                    list(call)
                else:
                    list(call)  # resumes, and finishes

            self.call("stall_past" if past_timeout else "stall_resume", stall)
            ch.close()
            if session:
                self.close_session("stall", session)

    def disconnecter(self, seed):
        """Closes its channel with a stream or a classification in flight."""
        rng, pb2 = random.Random(seed), self.pb2
        while not self.stop.is_set():
            ch = grpc.insecure_channel(self.srv.address, options=[OWN_CONNECTION])
            stub = self.pb2_grpc.TostStub(ch)
            session = None
            if rng.random() < 0.3:
                future = stub.Classify.future(pb2.ClassifyRequest(
                    model=VISION, images=rng.choices(self.pngs, k=8)), timeout=30)
                time.sleep(rng.random() * 0.005)
                ch.close()
                self.call("disconnect_classify", future.result)
                continue
            if rng.random() < 0.5:
                session = self.stub.CreateSession(pb2.CreateSessionRequest(model=LM), timeout=30).session_id
            call = stub.Generate(self.request(rng, model="" if session else LM, session_id=session or "",
                                              max_new_tokens=300), timeout=60)

            def read_then_disconnect():
                want = rng.randint(0, 6)
                for i, _ in enumerate(call):
                    if i >= want:
                        break
                ch.close()
                list(call)

            self.call("disconnect", read_then_disconnect)
            if session:
                self.close_session("disconnect", session)
            time.sleep(0.01)


def thread_names(pid):
    """How many of the process's threads carry each name (/proc/<pid>/task/*/comm)."""
    names = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue  # ended meanwhile
        names[name] = names.get(name, 0) + 1
    return dict(sorted(names.items()))


def run_traffic(soak, seconds, on_sample=None):
    """Runs every kind of client for `seconds`, then stops them and waits for them to finish."""
    soak.stop = threading.Event()
    workers = [soak.classifier, soak.classifier, soak.generator, soak.generator, soak.sessions,
               soak.canceller, soak.staller, soak.disconnecter]
    threads = [threading.Thread(target=w, args=(random.randrange(1 << 30),), daemon=True)
               for w in workers]
    start = time.monotonic()
    for t in threads:
        t.start()
    while (left := seconds - (time.monotonic() - start)) > 0:
        time.sleep(min(SAMPLE_S, left))
        if on_sample is not None:
            on_sample(time.monotonic() - start)
        dead = [w.__name__ for w, t in zip(workers, threads) if not t.is_alive()]
        assert not dead, f"workers died: {dead}; codes {soak.codes}"
    soak.stop.set()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a worker did not stop"
    return time.monotonic() - start


def thread_allowance(baseline_names):
    """The threads each name may have once the traffic is over: as many as after the warm-up, except
    gRPC's default executor, which adds threads on demand up to twice the cores (gRPC's
    gpr_cpu_num_cores, the configured CPUs) and keeps them, so a short warm-up may not have reached
    its size yet."""
    allowed = dict(baseline_names)
    allowed["default-executo"] = max(allowed.get("default-executo", 0), 2 * os.cpu_count())
    return allowed


def threads_within(names, allowed):
    return all(n <= allowed.get(name, 0) for name, n in names.items())


def settle(stub, pb2, pid, sessions, allowed_threads=None, timeout_s=60):
    """Waits until no generation runs or waits, `sessions` sessions are held and the threads are
    within `allowed_threads` (by name); returns the last ServerStatus, its generator, /proc status,
    the thread names and the time taken."""
    start = time.monotonic()
    while True:
        status = stub.ServerStatus(pb2.ServerStatusRequest())
        (g,) = [g for g in status.generators if g.model == LM]
        st, names = proc_status(pid), thread_names(pid)
        if ((g.active, g.queued, g.paused, status.sessions) == (0, 0, 0, sessions)
                and (allowed_threads is None or threads_within(names, allowed_threads))
                or time.monotonic() - start > timeout_s):
            return status, g, st, names, time.monotonic() - start
        time.sleep(0.5)


def test_soak_memory_flat_and_nothing_leaked(proto_modules):
    pb2, pb2_grpc = proto_modules
    srv = RunningServer(os.path.join(SOURCE_DIR, "models"), [f"--stream_stall_timeout_ms={STALL_MS}"])
    soak = Soak(srv, pb2, pb2_grpc)
    pid = srv.proc.pid
    try:
        stub = soak.stub
        grpc.channel_ready_future(soak.control).result(timeout=30)
        cold, cold_names = proc_status(pid), thread_names(pid)
        status0 = stub.ServerStatus(pb2.ServerStatusRequest())

        # Warm-up: the same traffic, then a pause. gRPC grows some pools on first use and keeps
        # them (its executor up to 2 threads per core, a second timer thread, a second poller of
        # the synchronous server): the baseline is taken once they have, with nothing running.
        warmup_s = min(60.0, SOAK_S * 0.2)
        run_traffic(soak, warmup_s)
        status_w, _, _, _, _ = settle(stub, pb2, pid, status0.sessions)
        time.sleep(5)  # the synchronous server's extra pollers end within a second or two of idling
        base, base_names = proc_status(pid), thread_names(pid)
        assert status_w.sessions == status0.sessions, status_w

        samples = []  # (seconds since the soak began, VmRSS kB, Threads)
        soak_s = SOAK_S - warmup_s

        def sample(t):
            st = proc_status(pid)
            samples.append((t, st["VmRSS"], st["Threads"]))

        traffic_s = run_traffic(soak, soak_s, sample)
        # Nothing left: every generation ended, every session closed, no queue holds anything,
        # and the threads that served the traffic are gone.
        allowed = thread_allowance(base_names)
        status, g, st, end_names, settle_s = settle(stub, pb2, pid, status0.sessions, allowed)
        m = scrape_metrics(srv, timeout_s=5)

        total = sum(soak.codes.values())
        by_worker = {}
        for (worker, code), n in sorted(soak.codes.items()):
            by_worker.setdefault(worker, {})[code] = n
        q = max(1, len(samples) // 4)
        first = sum(s[1] for s in samples[:q]) / q / 1024
        last = sum(s[1] for s in samples[-q:]) / q / 1024
        slope = (np.polyfit([s[0] for s in samples], [s[1] / 1024 for s in samples], 1)[0] * 60
                 if len(samples) >= 2 else float("nan"))
        requests = metric_value(m, "tost_requests_total")
        print(f"soak: {warmup_s:.0f} s warm-up + {traffic_s:.0f} s of traffic, {total} client "
              f"operations, {requests:.0f} RPCs answered; by worker: {by_worker}")
        print(f"  VmRSS: {cold['VmRSS'] / 1024:.0f} MiB cold, {base['VmRSS'] / 1024:.0f} MiB after the "
              f"warm-up; over the soak: first quarter {first:.1f} MiB, last quarter {last:.1f} MiB "
              f"({last - first:+.1f} MiB), slope {slope:+.2f} MiB/min, max "
              f"{max(s[1] for s in samples) / 1024:.1f} MiB; {st['VmRSS'] / 1024:.1f} MiB at the end, "
              f"VmHWM {st['VmHWM'] / 1024:.0f} MiB")
        print(f"  threads: {cold['Threads']} cold {cold_names}, {base['Threads']} after the warm-up "
              f"{base_names}, at most {max(s[2] for s in samples)} under traffic, {st['Threads']} at the "
              f"end {end_names} ({settle_s:.1f} s to settle)")
        print(f"  generator: active {g.active} queued {g.queued} paused {g.paused}, stalled streams "
              f"ended {g.stalled_streams}; sessions {status.sessions} (baseline {status0.sessions}), "
              f"state bytes {status.session_state_bytes}")

        assert not soak.unexpected, soak.unexpected
        assert (g.active, g.queued, g.paused) == (0, 0, 0), g
        assert (status.sessions, status.session_state_bytes) == (
            status0.sessions, status0.session_state_bytes), status
        assert metric_value(m, "tost_sessions") == status0.sessions
        assert metric_value(m, "tost_queue_depth") == 0
        for code in ("INTERNAL", "UNKNOWN", "DATA_LOSS"):
            assert metric_value(m, "tost_requests_total", code=code) == 0, code
        assert threads_within(end_names, allowed), (
            f"{st['Threads']} threads {end_names}, {base['Threads']} after the warm-up {base_names}")
        # Every kind of client ran, misbehaving ones included.
        for worker in ("classify", "generate", "generate_state", "sessions", "cancel", "stall_past",
                       "stall_resume", "disconnect", "disconnect_classify"):
            assert any(w == worker for w, _ in soak.codes), f"no {worker} operation ran"
        assert g.stalled_streams > 0
        assert abs(last - first) <= RSS_FLAT_TOLERANCE_MIB, (
            f"resident memory moved {last - first:+.1f} MiB after the warm-up (tolerance "
            f"{RSS_FLAT_TOLERANCE_MIB} MiB)")
    finally:
        if hasattr(soak, "stop"):
            soak.stop.set()
        soak.control.close()
        assert srv.stop() == 0
