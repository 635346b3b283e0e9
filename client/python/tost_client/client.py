"""Client and AsyncClient: tost.v1 calls with plain arguments, deadlines, API keys and TLS, and one
exception (TostError) for every failed call.

    from tost_client import Client

    with Client("localhost:8500", api_key=None, timeout_s=60) as c:
        print(c.classify("tost-digits", open("seven.png", "rb").read(), top_k=3).results[0].labels)
        for token in c.generate("tost-austen", "It was", max_new_tokens=40, temperature=0.8, seed=7):
            print(token.text, end="")

AsyncClient has the same methods as coroutines (grpc.aio); its generate() is an async iterator.

Constrained generation: generate(..., constraint=...) takes a tost_pb2.Constraint or one of
{"json_schema": dict or JSON text}, {"json_object": True}, {"regex": str}, {"grammar": str} (XGrammar
EBNF, start rule `root`) or {"choice": [str, ...]}:

        gen = c.generate("tost-austen", "Her age:", max_new_tokens=64, temperature=1.0, seed=3,
                         constraint={"json_schema": {"type": "object", "properties": {"age": {"type": "integer"}},
                                                     "required": ["age"]}})
        tokens = list(gen)   # gen.text is then complete JSON when gen.final.finish_reason is EOS
"""
from __future__ import annotations

import json
from typing import (Any, AsyncIterator, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union)

import grpc
import grpc.aio

from ._errors import TostError
from ._pb import tost_pb2, tost_pb2_grpc
from .resumable import AsyncResumableGeneration, ResumableGeneration

# What classify() takes: encoded PNG/JPEG bytes, several of them, a FloatTensor, or an array with
# `shape` (numpy or anything numpy.asarray accepts: converted to little-endian float32).
ClassifyInput = Union[bytes, bytearray, memoryview, Sequence[bytes], tost_pb2.FloatTensor, Any]
# What generate() takes as its prompt: text (UTF-8), bytes, or token ids.
Prompt = Union[str, bytes, Sequence[int]]
Credentials = Union[bool, grpc.ChannelCredentials, None]
# What generate() takes as its constraint: a Constraint message, or a dict of one key
# (constraint_message()).
ConstraintInput = Union[tost_pb2.Constraint, Mapping[str, Any]]

_CONSTRAINT_KEYS = ("json_schema", "json_object", "regex", "grammar", "choice")


def _credentials(tls: Credentials) -> Optional[grpc.ChannelCredentials]:
    if tls is None or tls is False:
        return None
    if tls is True:
        return grpc.ssl_channel_credentials()
    return tls


def _metadata(api_key: Optional[str]) -> Optional[Tuple[Tuple[str, str], ...]]:
    return (("x-api-key", api_key),) if api_key else None


def _tensor(value: Any) -> tost_pb2.FloatTensor:
    import numpy  # noqa: PLC0415 - only for array inputs; not a dependency of the package

    array = numpy.ascontiguousarray(numpy.asarray(value, dtype="<f4"))
    return tost_pb2.FloatTensor(shape=list(array.shape), raw=array.tobytes())


def classify_request(model: str, input: ClassifyInput, *, top_k: Optional[int] = None,
                     return_membership: bool = False) -> tost_pb2.ClassifyRequest:
    """The ClassifyRequest of classify()'s arguments."""
    request = tost_pb2.ClassifyRequest(model=model, return_membership=return_membership)
    if top_k is not None:
        request.top_k = top_k
    if isinstance(input, tost_pb2.FloatTensor):
        request.tensor.CopyFrom(input)
    elif isinstance(input, (bytes, bytearray, memoryview)):
        request.images.append(bytes(input))
    elif isinstance(input, (list, tuple)) and input and all(isinstance(x, (bytes, bytearray)) for x in input):
        request.images.extend(bytes(x) for x in input)
    else:
        request.tensor.CopyFrom(_tensor(input))
    return request


def constraint_message(value: ConstraintInput) -> tost_pb2.Constraint:
    """The Constraint message of generate()'s `constraint`: a tost_pb2.Constraint as it is, or a dict
    of exactly one of these keys:

        {"json_schema": {...}}     a JSON schema, as a dict (sent as JSON text, its key order kept)
                                   or as JSON text
        {"json_object": True}      any JSON object
        {"regex": "..."}           a regular expression the whole output matches
        {"grammar": "..."}         an XGrammar EBNF grammar whose start rule is `root`
        {"choice": ["a", "b"]}     exactly one of these strings

    A dict of another shape raises ValueError naming the key; what the server alone can judge (a
    schema, regex or grammar its compiler refuses, sizes) fails the call with INVALID_ARGUMENT."""
    if isinstance(value, tost_pb2.Constraint):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"constraint: expected a tost_pb2.Constraint or a dict, got {type(value).__name__}")
    keys = list(value)
    unknown = [k for k in keys if k not in _CONSTRAINT_KEYS]
    if unknown:
        raise ValueError(f"constraint: unknown key {unknown[0]!r}; expected one of {', '.join(_CONSTRAINT_KEYS)}")
    if len(keys) != 1:
        raise ValueError(f"constraint: expected exactly one of {', '.join(_CONSTRAINT_KEYS)}, got "
                         f"{', '.join(map(repr, keys)) if keys else 'none'}")
    (key,) = keys
    v = value[key]
    if key == "json_schema":
        if isinstance(v, Mapping):
            return tost_pb2.Constraint(json_schema=json.dumps(v))
        if isinstance(v, str) and v:
            return tost_pb2.Constraint(json_schema=v)
        raise ValueError(f"constraint['json_schema']: expected a schema as a dict or as non-empty JSON text, "
                         f"got {type(v).__name__} {v!r:.40}")
    if key == "json_object":
        if v is not True:
            raise ValueError(f"constraint['json_object']: expected True (any JSON object), got {v!r:.40}; "
                             "leave `constraint` out for unconstrained output")
        return tost_pb2.Constraint(json_object=True)
    if key in ("regex", "grammar"):
        if not isinstance(v, str) or not v:
            raise ValueError(f"constraint[{key!r}]: expected a non-empty string, got {type(v).__name__} {v!r:.40}")
        return tost_pb2.Constraint(**{key: v})
    if isinstance(v, (str, bytes)) or not isinstance(v, Sequence) or not v:
        raise ValueError(f"constraint['choice']: expected a non-empty list of strings, got {type(v).__name__} "
                         f"{v!r:.40}")
    for i, choice in enumerate(v):
        if not isinstance(choice, str) or not choice:
            raise ValueError(f"constraint['choice'][{i}]: expected a non-empty string, got {choice!r:.40}")
    return tost_pb2.Constraint(choice=tost_pb2.ChoiceList(choices=list(v)))


def generate_request(model: str, prompt: Optional[Prompt] = None, *, max_new_tokens: int = 64,
                     temperature: Optional[float] = None, top_k: Optional[int] = None,
                     top_p: Optional[float] = None, min_p: Optional[float] = None, seed: Optional[int] = None,
                     repetition_penalty: Optional[float] = None, stop: Iterable[str] = (),
                     stop_token_ids: Iterable[int] = (), session_id: Optional[str] = None,
                     state: Optional[bytes] = None, return_state: bool = False, state_every_tokens: int = 0,
                     top_logprobs: int = 0, logprobs: bool = False,
                     constraint: Optional[ConstraintInput] = None) -> tost_pb2.GenerateRequest:
    """The GenerateRequest of generate()'s arguments. Sampling parameters left None are not sent
    (a session or blob then keeps its stored ones; a fresh prompt decodes greedily). `constraint`:
    what the output must conform to, a tost_pb2.Constraint or a dict (see constraint_message()); None:
    unconstrained."""
    request = tost_pb2.GenerateRequest(model=model, max_new_tokens=max_new_tokens, return_state=return_state,
                                       state_every_tokens=state_every_tokens, top_logprobs=top_logprobs,
                                       logprobs=logprobs)
    if isinstance(prompt, str):
        request.prompt_bytes = prompt.encode("utf-8")
    elif isinstance(prompt, (bytes, bytearray, memoryview)):
        request.prompt_bytes = bytes(prompt)
    elif prompt is not None:
        request.prompt_tokens.ids.extend(int(i) for i in prompt)
    if session_id:
        request.session_id = session_id
    if state:
        request.state = state
    sampling = {k: v for k, v in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p),
                                  ("min_p", min_p), ("seed", seed), ("repetition_penalty", repetition_penalty))
                if v is not None}
    for name, value in sampling.items():
        setattr(request.sampling, name, value)
    stop, stop_token_ids = list(stop), list(stop_token_ids)
    if stop or stop_token_ids:
        request.stop.CopyFrom(tost_pb2.StopConditions(stop=stop, stop_token_ids=stop_token_ids))
    if constraint is not None:
        request.constraint.CopyFrom(constraint_message(constraint))
    return request


def _request(request: Optional[tost_pb2.GenerateRequest], model: str, prompt: Optional[Prompt],
             max_new_tokens: int, constraint: Optional[ConstraintInput], state_every_tokens: int,
             fields: Mapping[str, Any]) -> tost_pb2.GenerateRequest:
    """generate()'s request: the one given whole, or generate_request()'s of the arguments."""
    if request is None:
        return generate_request(model, prompt, max_new_tokens=max_new_tokens, constraint=constraint,
                                state_every_tokens=state_every_tokens, **fields)
    if constraint is not None:
        # Not silently dropped: an unconstrained output where one was asked for would parse as
        # nothing the caller expects.
        raise ValueError("constraint: pass it in the request (request.constraint) or as constraint=, not both")
    return request


class _Events:
    """What one Generate stream has delivered so far."""

    def __init__(self) -> None:
        self.tokens: List[tost_pb2.GeneratedToken] = []
        self.final: Optional[tost_pb2.GenerateFinal] = None
        self.snapshot: Optional[tost_pb2.StateSnapshot] = None

    def on(self, msg: tost_pb2.GenerateResponse) -> Optional[tost_pb2.GeneratedToken]:
        kind = msg.WhichOneof("event")
        if kind == "token":
            self.tokens.append(msg.token)
            return msg.token
        if kind == "snapshot":
            self.snapshot = msg.snapshot
        elif kind == "final":
            self.final = msg.final
        return None

    @property
    def token_ids(self) -> List[int]:
        return [t.id for t in self.tokens]

    @property
    def text(self) -> str:
        """The text of the tokens, and what the final message adds."""
        return "".join(t.text for t in self.tokens) + (self.final.text if self.final is not None else "")

    @property
    def state(self) -> Optional[bytes]:
        """The latest state blob: the final message's, else the last snapshot's (None without)."""
        if self.final is not None and self.final.state:
            return self.final.state
        return self.snapshot.state if self.snapshot is not None else None


class Generation(_Events):
    """One Generate stream: iterate it for the tokens (GeneratedToken), once; afterwards `final`
    (GenerateFinal), `tokens`, `token_ids`, `text` and `state` describe it. A failed stream raises
    TostError; cancel() ends it early."""

    def __init__(self, call: Any) -> None:
        super().__init__()
        self._call = call
        self._started = False

    def __iter__(self) -> Iterator[tost_pb2.GeneratedToken]:
        if self._started:
            raise RuntimeError("a Generation is iterated once")
        self._started = True
        return self._run()

    def _run(self) -> Iterator[tost_pb2.GeneratedToken]:
        try:
            for msg in self._call:
                token = self.on(msg)
                if token is not None:
                    yield token
        except grpc.RpcError as e:
            raise TostError.from_rpc_error(e) from None
        finally:
            self._call.cancel()

    def cancel(self) -> None:
        self._call.cancel()


class AsyncGeneration(_Events):
    """Generation for AsyncClient: `async for token in generation`."""

    def __init__(self, call: Any) -> None:
        super().__init__()
        self._call = call
        self._started = False

    def __aiter__(self) -> AsyncIterator[tost_pb2.GeneratedToken]:
        if self._started:
            raise RuntimeError("an AsyncGeneration is iterated once")
        self._started = True
        return self._run()

    async def _run(self) -> AsyncIterator[tost_pb2.GeneratedToken]:
        try:
            async for msg in self._call:
                token = self.on(msg)
                if token is not None:
                    yield token
        except grpc.RpcError as e:
            raise TostError.from_rpc_error(e) from None
        finally:
            self._call.cancel()

    def cancel(self) -> None:
        self._call.cancel()


class _Base:
    def __init__(self, address: str, api_key: Optional[str], timeout_s: Optional[float]) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._metadata = _metadata(api_key)

    def _timeout(self, timeout_s: Optional[float]) -> Optional[float]:
        return self.timeout_s if timeout_s is None else timeout_s


class Client(_Base):
    """A blocking client of one tost-serve address (a server, a proxy, or `dns:///name` with a
    balancer's service config).

    address: a gRPC target ("host:port", "dns:///tost:8500", "ipv4:10.0.0.1:8500,10.0.0.2:8500").
    api_key: sent as `x-api-key` on every call (servers run with --api_keys_file).
    tls: None/False: plaintext; True: TLS with the system's roots; a grpc.ChannelCredentials
        (grpc.ssl_channel_credentials(root_certificates=..., private_key=..., certificate_chain=...)
        for a private CA or mTLS).
    timeout_s: every call's deadline unless the call names its own (a generation's: the whole
        stream's, or, resumable, the whole generation's over every continuation); None: none.
    options: extra grpc channel options; channel: use this channel instead (address is then only
        a label; the caller closes it).
    Every failed call raises TostError (code, message)."""

    def __init__(self, address: str, *, api_key: Optional[str] = None, tls: Credentials = None,
                 timeout_s: Optional[float] = 60.0, options: Sequence[Tuple[str, Any]] = (),
                 channel: Optional[grpc.Channel] = None) -> None:
        super().__init__(address, api_key, timeout_s)
        self._own_channel = channel is None
        if channel is None:
            credentials = _credentials(tls)
            channel = (grpc.secure_channel(address, credentials, options=list(options)) if credentials is not None
                       else grpc.insecure_channel(address, options=list(options)))
        self.channel = channel
        self.stub = tost_pb2_grpc.TostStub(channel)

    def close(self) -> None:
        if self._own_channel:
            self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _unary(self, method: Any, request: Any, timeout_s: Optional[float]) -> Any:
        try:
            return method(request, timeout=self._timeout(timeout_s), metadata=self._metadata)
        except grpc.RpcError as e:
            raise TostError.from_rpc_error(e) from None

    def classify(self, model: str, input: ClassifyInput, *, top_k: Optional[int] = None,
                 return_membership: bool = False, timeout_s: Optional[float] = None) -> tost_pb2.ClassifyResponse:
        """Classifies encoded images (PNG/JPEG bytes, or a list of them) or a tensor ([C,H,W] or
        [B,C,H,W], preprocessed: a FloatTensor or an array). Returns the ClassifyResponse: one
        result per image, its `labels` highest probability first (top_k of them, default 5)."""
        return self._unary(self.stub.Classify, classify_request(model, input, top_k=top_k,
                                                                return_membership=return_membership), timeout_s)

    def generate(self, model: str = "", prompt: Optional[Prompt] = None, *, max_new_tokens: int = 64,
                 constraint: Optional[ConstraintInput] = None,
                 resumable: bool = False, state_every_tokens: int = 0, timeout_s: Optional[float] = None,
                 request: Optional[tost_pb2.GenerateRequest] = None,
                 max_retries: int = 5, backoff_s: float = 0.05, max_backoff_s: float = 2.0, eager: bool = False,
                 **fields: Any) -> Union[Generation, ResumableGeneration]:
        """Streams a generation: iterate the result for the tokens (GeneratedToken: id, text,
        position). prompt: text, bytes or token ids; or a session_id / state blob to continue.
        constraint: what the output must conform to, a tost_pb2.Constraint or a dict such as
        {"json_schema": {...}}, {"json_object": True}, {"regex": "..."}, {"grammar": "..."} or
        {"choice": ["a", "b"]} (constraint_message(); an invalid dict raises ValueError).
        Other fields (temperature, top_k, top_p, min_p, seed, repetition_penalty, stop,
        stop_token_ids, session_id, state, return_state, top_logprobs, logprobs) as in generate_request(),
        or a whole `request` (with none of them).

        resumable=True: a ResumableGeneration (tost_client.resumable) that asks for a state blob
        every `state_every_tokens` tokens (default 16) and, when the stream breaks (a lost or
        drained replica), continues from the last one through the same channel; max_retries,
        backoff_s, max_backoff_s and eager as there, timeout_s bounds the whole generation.
        Otherwise a Generation of the one stream."""
        request = _request(request, model, prompt, max_new_tokens, constraint,
                           0 if resumable else state_every_tokens, fields)
        if resumable:
            timeout = self._timeout(timeout_s)
            return ResumableGeneration(self.stub, request, state_every_tokens=state_every_tokens or 16,
                                       max_retries=max_retries, deadline_s=600.0 if timeout is None else timeout,
                                       backoff_s=backoff_s, max_backoff_s=max_backoff_s, metadata=self._metadata,
                                       eager=eager)
        call = self.stub.Generate(request, timeout=self._timeout(timeout_s), metadata=self._metadata)
        return Generation(call)

    def create_session(self, model: str, *, sampling: Optional[tost_pb2.SamplingParams] = None,
                       stop: Optional[tost_pb2.StopConditions] = None,
                       timeout_s: Optional[float] = None) -> tost_pb2.SessionInfo:
        """A server-held session (continue it with generate(session_id=...)); SessionInfo."""
        return self._unary(self.stub.CreateSession,
                           tost_pb2.CreateSessionRequest(model=model, sampling=sampling, stop=stop), timeout_s)

    def fork_session(self, session_id: str, *, timeout_s: Optional[float] = None) -> tost_pb2.SessionInfo:
        """A new session with a copy of `session_id`'s state."""
        return self._unary(self.stub.ForkSession, tost_pb2.SessionRef(session_id=session_id), timeout_s)

    def export_session(self, session_id: str, *, timeout_s: Optional[float] = None) -> tost_pb2.ExportSessionResponse:
        """The session's state as an authenticated blob (`.state`), and its SessionInfo (`.session`)."""
        return self._unary(self.stub.ExportSession, tost_pb2.SessionRef(session_id=session_id), timeout_s)

    def import_session(self, state: bytes, *, timeout_s: Optional[float] = None) -> tost_pb2.SessionInfo:
        """A session from a blob (any replica with the same model and --session_key_file)."""
        return self._unary(self.stub.ImportSession, tost_pb2.ImportSessionRequest(state=state), timeout_s)

    def close_session(self, session_id: str, *, timeout_s: Optional[float] = None) -> None:
        self._unary(self.stub.CloseSession, tost_pb2.SessionRef(session_id=session_id), timeout_s)

    def server_status(self, *, timeout_s: Optional[float] = None) -> tost_pb2.ServerStatusResponse:
        """Capacity and drain state: free active-generation places, queue depth, session headroom."""
        return self._unary(self.stub.ServerStatus, tost_pb2.ServerStatusRequest(), timeout_s)

    def list_models(self, *, timeout_s: Optional[float] = None) -> List[tost_pb2.ModelStatus]:
        """Every model of the repository, with its state (ready, error, shapes, device)."""
        return list(self._unary(self.stub.ListModels, tost_pb2.ListModelsRequest(), timeout_s).models)

    def model_info(self, model: str, *, timeout_s: Optional[float] = None) -> tost_pb2.ModelStatus:
        return self._unary(self.stub.ModelInfo, tost_pb2.ModelInfoRequest(model=model), timeout_s)


class AsyncClient(_Base):
    """Client for asyncio (grpc.aio): the same arguments, coroutine methods, and generate() an
    async iterator (`async for token in client.generate(...)`): an AsyncGeneration, or with
    resumable=True an AsyncResumableGeneration. Use `async with AsyncClient(...) as c:` or await
    close(). Create it inside the running event loop."""

    def __init__(self, address: str, *, api_key: Optional[str] = None, tls: Credentials = None,
                 timeout_s: Optional[float] = 60.0, options: Sequence[Tuple[str, Any]] = (),
                 channel: Optional[grpc.aio.Channel] = None) -> None:
        super().__init__(address, api_key, timeout_s)
        self._own_channel = channel is None
        if channel is None:
            credentials = _credentials(tls)
            channel = (grpc.aio.secure_channel(address, credentials, options=list(options))
                       if credentials is not None else grpc.aio.insecure_channel(address, options=list(options)))
        self.channel = channel
        self.stub = tost_pb2_grpc.TostStub(channel)

    async def close(self) -> None:
        if self._own_channel:
            await self.channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _unary(self, method: Any, request: Any, timeout_s: Optional[float]) -> Any:
        try:
            return await method(request, timeout=self._timeout(timeout_s), metadata=self._metadata)
        except grpc.RpcError as e:
            raise TostError.from_rpc_error(e) from None

    async def classify(self, model: str, input: ClassifyInput, *, top_k: Optional[int] = None,
                       return_membership: bool = False,
                       timeout_s: Optional[float] = None) -> tost_pb2.ClassifyResponse:
        """See Client.classify."""
        return await self._unary(self.stub.Classify, classify_request(model, input, top_k=top_k,
                                                                      return_membership=return_membership), timeout_s)

    def generate(self, model: str = "", prompt: Optional[Prompt] = None, *, max_new_tokens: int = 64,
                 constraint: Optional[ConstraintInput] = None,
                 resumable: bool = False, state_every_tokens: int = 0, timeout_s: Optional[float] = None,
                 request: Optional[tost_pb2.GenerateRequest] = None,
                 max_retries: int = 5, backoff_s: float = 0.05, max_backoff_s: float = 2.0, eager: bool = False,
                 **fields: Any) -> Union[AsyncGeneration, AsyncResumableGeneration]:
        """See Client.generate: `async for token in client.generate(...)`."""
        request = _request(request, model, prompt, max_new_tokens, constraint,
                           0 if resumable else state_every_tokens, fields)
        if resumable:
            timeout = self._timeout(timeout_s)
            return AsyncResumableGeneration(self.stub, request, state_every_tokens=state_every_tokens or 16,
                                            max_retries=max_retries,
                                            deadline_s=600.0 if timeout is None else timeout, backoff_s=backoff_s,
                                            max_backoff_s=max_backoff_s, metadata=self._metadata, eager=eager)
        return AsyncGeneration(self.stub.Generate(request, timeout=self._timeout(timeout_s), metadata=self._metadata))

    async def create_session(self, model: str, *, sampling: Optional[tost_pb2.SamplingParams] = None,
                             stop: Optional[tost_pb2.StopConditions] = None,
                             timeout_s: Optional[float] = None) -> tost_pb2.SessionInfo:
        return await self._unary(self.stub.CreateSession,
                                 tost_pb2.CreateSessionRequest(model=model, sampling=sampling, stop=stop), timeout_s)

    async def fork_session(self, session_id: str, *, timeout_s: Optional[float] = None) -> tost_pb2.SessionInfo:
        return await self._unary(self.stub.ForkSession, tost_pb2.SessionRef(session_id=session_id), timeout_s)

    async def export_session(self, session_id: str, *,
                             timeout_s: Optional[float] = None) -> tost_pb2.ExportSessionResponse:
        return await self._unary(self.stub.ExportSession, tost_pb2.SessionRef(session_id=session_id), timeout_s)

    async def import_session(self, state: bytes, *, timeout_s: Optional[float] = None) -> tost_pb2.SessionInfo:
        return await self._unary(self.stub.ImportSession, tost_pb2.ImportSessionRequest(state=state), timeout_s)

    async def close_session(self, session_id: str, *, timeout_s: Optional[float] = None) -> None:
        await self._unary(self.stub.CloseSession, tost_pb2.SessionRef(session_id=session_id), timeout_s)

    async def server_status(self, *, timeout_s: Optional[float] = None) -> tost_pb2.ServerStatusResponse:
        return await self._unary(self.stub.ServerStatus, tost_pb2.ServerStatusRequest(), timeout_s)

    async def list_models(self, *, timeout_s: Optional[float] = None) -> List[tost_pb2.ModelStatus]:
        return list((await self._unary(self.stub.ListModels, tost_pb2.ListModelsRequest(), timeout_s)).models)

    async def model_info(self, model: str, *, timeout_s: Optional[float] = None) -> tost_pb2.ModelStatus:
        return await self._unary(self.stub.ModelInfo, tost_pb2.ModelInfoRequest(model=model), timeout_s)
