"""Generation that survives the loss of a replica: periodic state snapshots, and a continuation from
the last one on whichever replica answers when the stream breaks.

How positions line up (service/engine/generation_scheduler.cc, service/api/generate_reactor.cc):

- GeneratedToken.position is the token's absolute place in the sequence: with a prompt of P tokens
  the first generated token sits at P, the next at P + 1, and so on (a continued blob goes on from
  where it stopped).
- StateSnapshot.position is the position of the last token the blob includes. A snapshot is sent
  right after that token, so every token up to it has been received when it arrives, and a
  continuation of the blob produces next the token at position + 1.
- GenerateFinal.position is the sequence's length after the call: the last token's position + 1.
  A stream cut by a drain ends with FINISH_REASON_DRAINED and a blob of everything it generated;
  if the drain came before this call produced a token, that blob is the call's own input (or, for
  a fresh prompt, an empty state), so the same request is sent again.

Tokens received after the last snapshot are dropped when the stream breaks and generated again by
the continuation: a greedy decode, or a seeded one (draws are keyed by seed and position), on
servers run with --batch_invariant_decode gives the same tokens whatever else shares the decode
steps. Before the first snapshot the continuation is the original request again.
"""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterator, List, Optional, Sequence, Tuple

import grpc

from ._errors import TostError
from ._pb import tost_pb2

# Breaks a continuation repairs. UNAVAILABLE: a draining or unreachable replica (a proxy with no
# upstream answers 502, which gRPC reports as UNAVAILABLE). INTERNAL and UNKNOWN: a stream reset
# in flight (RST_STREAM through a proxy whose upstream died, a connection closed without
# trailers). CANCELLED from the server side: a reset stream, or one ended for a stalled read.
# RESOURCE_EXHAUSTED: every generation place taken (refused before any work); the backoff waits.
RETRYABLE_CODES = frozenset({
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
})


class ResumeError(TostError):
    """The generation could not be completed: a non-retryable status, the retries or the deadline
    ran out. `code` is the last status (None for a ProtocolError or DivergedError), `breaks` lists
    what happened before."""

    def __init__(self, message: str, breaks, code: Optional[grpc.StatusCode] = None):
        super().__init__(code, message)
        self.breaks = list(breaks)


class DivergedError(ResumeError):
    """A continuation produced a different token where one was already handed out (eager mode):
    the replicas do not decode identically (mixed models, or no --batch_invariant_decode)."""


class ProtocolError(ResumeError):
    """The server's positions do not line up as tost.v1 documents them."""


@dataclass
class Break:
    """One interrupted call."""
    attempt: int                     # 1-based index of the call that broke
    reason: str                      # "UNAVAILABLE: ..." or "DRAINED"
    received: int                    # tokens this call delivered before it broke
    dropped: int                     # of those, tokens past the last snapshot (generated again)
    resume_position: Optional[int]   # the snapshot's position resumed from; None: from the prompt


@dataclass
class _Snapshot:
    state: bytes
    position: int
    committed: int  # tokens of this generation the blob includes


class ResumableGeneration:
    """One Generate that continues through broken streams. Iterate it for the tokens
    (GeneratedToken messages), each once, in order; afterwards `final`, `tokens`, `breaks` and
    `calls` describe the whole generation.

    stub: a tost.v1 TostStub (any channel: a proxy, `dns:///` with round_robin, one server).
    request: the GenerateRequest of a fresh prompt, or of a state blob to continue. It must set
        max_new_tokens (the count left after a break is computed from it) and no session_id
        (sessions live on one replica; blobs are what any replica with the same
        --session_key_file continues).
    state_every_tokens: snapshot interval; at most this many tokens are generated again per break,
        and (unless eager) tokens are handed out once a snapshot or the final message covers them.
    max_retries: breaks in a row without a new snapshot before giving up.
    deadline_s: the whole generation's deadline, over every call and backoff.
    backoff_s, max_backoff_s: the wait before a continuation, doubling per break in a row, with
        jitter, never past the deadline.
    eager: hand tokens out as they arrive; a continuation's tokens at positions already handed out
        are checked against them (DivergedError if they differ) instead of being withheld.
    """

    def __init__(self, stub: Any, request: tost_pb2.GenerateRequest, *, state_every_tokens: int = 16,
                 max_retries: int = 5, deadline_s: float = 600.0, backoff_s: float = 0.05,
                 max_backoff_s: float = 2.0, metadata: Optional[Sequence[Tuple[str, str]]] = None,
                 eager: bool = False, rng: Optional[random.Random] = None) -> None:
        if request.session_id:
            raise ValueError("session_id: sessions are held by one replica and cannot move; continue a "
                             "state blob (GenerateRequest.state) instead")
        if request.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be > 0 (the count left after a break is computed "
                             f"from it), got {request.max_new_tokens}")
        if state_every_tokens <= 0:
            raise ValueError(f"state_every_tokens must be > 0, got {state_every_tokens}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self._stub = stub
        self._first = tost_pb2.GenerateRequest()
        self._first.CopyFrom(request)
        self._first.return_state = True
        self._first.state_every_tokens = state_every_tokens
        self._every = state_every_tokens
        self._max_retries = max_retries
        self._deadline = time.monotonic() + deadline_s
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._metadata = metadata
        self._eager = eager
        self._rng = rng or random.Random()
        self._started = False
        self.tokens: List[tost_pb2.GeneratedToken] = []  # every token handed out, in order
        self.final: Optional[tost_pb2.GenerateFinal] = None  # the last call's GenerateFinal
        self.breaks: List[Break] = []
        self.calls = 0
        # The loop's state: over the whole generation,
        self._committed: List[tost_pb2.GeneratedToken] = []  # tokens a snapshot (or the final) covers
        self._snapshot: Optional[_Snapshot] = None
        self._first_position: Optional[int] = None  # where the first generated token sits
        self._in_a_row = 0                           # breaks since the last snapshot
        # and of the current call.
        self._expected: Optional[int] = None
        self._pending: List[tost_pb2.GeneratedToken] = []  # this call's tokens past the last snapshot
        self._received = 0
        self._reason: Optional[str] = None
        self._code: Optional[grpc.StatusCode] = None

    # What the generation as a whole produced.
    @property
    def token_ids(self) -> List[int]:
        return [t.id for t in self.tokens]

    @property
    def text(self) -> str:
        """The text the tokens released, and what the final message adds. With return_state (which
        this class always sets) the server keeps text it still withholds (an incomplete UTF-8
        character, a possible stop-string prefix) in the blob rather than in the final message."""
        return "".join(t.text for t in self.tokens) + (self.final.text if self.final is not None else "")

    @property
    def resumed_from_snapshot(self) -> int:
        return sum(1 for b in self.breaks if b.resume_position is not None)

    def __iter__(self) -> Iterator[tost_pb2.GeneratedToken]:
        if self._started:
            raise RuntimeError("a ResumableGeneration is iterated once")
        self._started = True
        return self._run()

    def _request_for(self, snapshot: Optional[_Snapshot]):
        if snapshot is None:
            return self._first
        return tost_pb2.GenerateRequest(
            model=self._first.model, state=snapshot.state,
            max_new_tokens=self._first.max_new_tokens - snapshot.committed, return_state=True,
            state_every_tokens=self._every, top_logprobs=self._first.top_logprobs,
            logprobs=self._first.logprobs)

    def _fail(self, cls, message, code=None):
        return cls(f"{message} (after {self.calls} call(s), {len(self.breaks)} break(s))", self.breaks, code)

    # One generation is a series of calls; the sync (_run) and asyncio (AsyncResumableGeneration)
    # loops share the bookkeeping below and differ only in how they call, read and wait.
    def _start_call(self) -> Tuple[tost_pb2.GenerateRequest, float]:
        """The next call's request and its timeout (what is left of the deadline)."""
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise self._fail(ResumeError, "deadline passed before the generation finished",
                             grpc.StatusCode.DEADLINE_EXCEEDED)
        snapshot = self._snapshot
        # None until the first call has sent a token.
        self._expected = snapshot.position + 1 if snapshot is not None else self._first_position
        self._pending = []
        self._received = 0
        self._reason = None
        self._code = None
        self.calls += 1
        return self._request_for(snapshot), remaining

    def _on_message(self, msg: tost_pb2.GenerateResponse) -> Tuple[List[tost_pb2.GeneratedToken], Optional[bool]]:
        """The tokens to hand out for one message, and whether the call ended: True (the
        generation is complete), False (drained: a break), None (read on)."""
        out: List[tost_pb2.GeneratedToken] = []
        pending, committed = self._pending, self._committed
        kind = msg.WhichOneof("event")
        if kind == "token":
            t = msg.token
            if self._expected is not None and t.position != self._expected:
                raise self._fail(ProtocolError, f"token at position {t.position}, expected position {self._expected}")
            if self._first_position is None:
                self._first_position = t.position
            self._expected = t.position + 1
            self._received += 1
            pending.append(t)
            index = len(committed) + len(pending) - 1  # this token's index in the output
            if self._eager:
                if index < len(self.tokens):
                    if self.tokens[index].id != t.id:
                        raise self._fail(DivergedError, f"continuation gave token {t.id} at position "
                                         f"{t.position}, where token {self.tokens[index].id} was "
                                         "already handed out")
                else:
                    self.tokens.append(t)
                    out.append(t)
        elif kind == "snapshot":
            last = pending[-1].position if pending else (committed[-1].position if committed else None)
            if last is None or msg.snapshot.position != last:
                raise self._fail(ProtocolError, f"snapshot at position {msg.snapshot.position}, expected "
                                 f"the last token's position {last}")
            out += self._commit()
            self._snapshot = _Snapshot(msg.snapshot.state, msg.snapshot.position, len(committed))
            self._in_a_row = 0
        elif kind == "final":
            f = msg.final
            if f.finish_reason != tost_pb2.FINISH_REASON_DRAINED:
                out += self._commit()
                self.final = f
                return out, True
            self._reason = "DRAINED"
            if f.generated_tokens > 0:
                # The blob holds every token of this call: nothing is generated again.
                last = pending[-1].position if pending else (committed[-1].position if committed else None)
                if last is None or f.position != last + 1 or not f.state:
                    raise self._fail(ProtocolError, f"drained final at position {f.position} with "
                                     f"{len(f.state)} state bytes, expected position "
                                     f"{None if last is None else last + 1} and a blob")
                out += self._commit()
                self._snapshot = _Snapshot(f.state, last, len(committed))
                self._in_a_row = 0
            # Drained before this call produced a token: its blob is its input (or an empty state
            # for a fresh prompt), so the same request goes out again.
            return out, False
        return out, None

    def _on_end_without_final(self) -> None:
        self._reason = "the stream ended without a final message"
        self._code = grpc.StatusCode.UNKNOWN

    def _on_rpc_error(self, e: grpc.RpcError) -> None:
        code = e.code()
        if code not in RETRYABLE_CODES:
            raise self._fail(ResumeError, f"Generate failed with {code.name}: {e.details()}", code) from e
        self._code = code
        self._reason = f"{code.name}: {e.details()}"

    def _on_break(self) -> float:
        """Records the break; the backoff to wait before the next call."""
        self.breaks.append(Break(attempt=self.calls, reason=self._reason or "", received=self._received,
                                 dropped=len(self._pending),
                                 resume_position=None if self._snapshot is None else self._snapshot.position))
        self._in_a_row += 1
        if self._in_a_row > self._max_retries:
            raise self._fail(ResumeError, f"gave up after {self._in_a_row} break(s) in a row without a new snapshot; "
                             f"the last: {self._reason}", self._code)
        delay = min(self._max_backoff_s, self._backoff_s * 2 ** (self._in_a_row - 1))
        delay *= 0.5 + self._rng.random() / 2
        return max(0.0, min(delay, self._deadline - time.monotonic()))

    def _run(self) -> Iterator[tost_pb2.GeneratedToken]:
        while True:
            request, remaining = self._start_call()
            call = self._stub.Generate(request, timeout=remaining, metadata=self._metadata)
            try:
                for msg in call:
                    out, ended = self._on_message(msg)
                    yield from out
                    if ended:
                        return
                    if ended is not None:
                        break
                else:
                    self._on_end_without_final()
            except grpc.RpcError as e:
                self._on_rpc_error(e)
            finally:
                call.cancel()  # no-op once it ended; frees the server's slot if the caller stopped early
            time.sleep(self._on_break())

    def _commit(self) -> List[tost_pb2.GeneratedToken]:
        """Moves this call's pending tokens to the committed ones; those to hand out now."""
        pending = self._pending
        self._committed.extend(pending)
        self._pending = []
        if self._eager:
            return []
        self.tokens.extend(pending)
        return pending


class AsyncResumableGeneration(ResumableGeneration):
    """ResumableGeneration for grpc.aio stubs: `async for token in generation` (the same options;
    waits between continuations with asyncio.sleep)."""

    def __iter__(self) -> Iterator[tost_pb2.GeneratedToken]:
        raise TypeError("an AsyncResumableGeneration is iterated with `async for`")

    def __aiter__(self) -> AsyncIterator[tost_pb2.GeneratedToken]:
        if self._started:
            raise RuntimeError("a ResumableGeneration is iterated once")
        self._started = True
        return self._arun()

    async def _arun(self) -> AsyncIterator[tost_pb2.GeneratedToken]:
        while True:
            request, remaining = self._start_call()
            call = self._stub.Generate(request, timeout=remaining, metadata=self._metadata)
            try:
                ended: Optional[bool] = None
                async for msg in call:
                    out, ended = self._on_message(msg)
                    for t in out:
                        yield t
                    if ended is not None:
                        break
                if ended:
                    return
                if ended is None:
                    self._on_end_without_final()
            except grpc.RpcError as e:
                self._on_rpc_error(e)
            finally:
                call.cancel()
            await asyncio.sleep(self._on_break())


def generate(stub: Any, request: tost_pb2.GenerateRequest, **options: Any) -> ResumableGeneration:
    """A ResumableGeneration of `request` (see its options); iterate it for the tokens."""
    return ResumableGeneration(stub, request, **options)
