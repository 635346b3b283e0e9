"""tost_client: the Python client of tost-serve (tost.v1).

Install it with `pip install ./client/python` from a checkout (or from its sdist): the tost.v1
modules (tost_pb2, tost_pb2_grpc, with .pyi type stubs) are generated from proto/tost/v1/tost.proto
when the wheel is built, and the package needs only grpcio and protobuf at run time.

    from tost_client import Client, TostError

    with Client("tost.example:8500", api_key=None, tls=None, timeout_s=60) as client:
        best = client.classify("tost-digits", png_bytes, top_k=3).results[0].labels[0]
        for token in client.generate("tost-austen", "It was", max_new_tokens=200, temperature=0.8, seed=7):
            print(token.text, end="", flush=True)
        # Survives the loss of a replica: a state blob every 16 tokens, continued on a break.
        gen = client.generate("tost-austen", "It was", max_new_tokens=200, resumable=True,
                              state_every_tokens=16)
        print("".join(t.text for t in gen), gen.final.finish_reason, len(gen.breaks), "break(s)")

Constrained output: generate(..., constraint={"json_schema": schema}) (or {"json_object": True},
{"regex": ...}, {"grammar": ...}, {"choice": [...]}, or a tost_pb2.Constraint; see
tost_client.client.constraint_message).

asyncio: `async with AsyncClient(address) as client:` with the same methods awaited, and
`async for token in client.generate(...)` (resumable=True too). Every failed call raises TostError (`.code`, a
grpc.StatusCode, and `.message`).

The lower layer stays available: tost_client.TostStub, tost_client.tost_pb2 and
tost_client.tost_pb2_grpc, and tost_client.generate(stub, request, state_every_tokens=...), the
ResumableGeneration of one GenerateRequest on any stub:

    import grpc
    import tost_client
    from tost_client import tost_pb2

    stub = tost_client.TostStub(grpc.insecure_channel("tost.example:8500"))
    gen = tost_client.generate(stub, tost_pb2.GenerateRequest(
        model="tost-austen", prompt_bytes=b"It was", max_new_tokens=200,
        sampling=tost_pb2.SamplingParams(temperature=0.8, seed=7)), state_every_tokens=16)
    for token in gen:               # each token once, in order, whatever broke in between
        print(token.text, end="", flush=True)
    print(gen.final.finish_reason, len(gen.breaks), "break(s)")

The generation asks for a state snapshot every `state_every_tokens` tokens. When the stream breaks
(UNAVAILABLE, a reset stream, a drained replica's FINISH_REASON_DRAINED) it continues from the last
snapshot with Generate(state=blob) through the same channel, so on whichever replica the balancer
picks; any replica with the same model and --session_key_file accepts the blob. See
tost_client.resumable for how positions line up and what is guaranteed.

Used from a checkout without installing (client/python on PYTHONPATH), the first import generates
the tost.v1 modules from the repository's proto/ into a cache instead (tost_client._stubs; needs
grpcio-tools).
"""
from ._errors import TostError
from ._pb import tost_pb2, tost_pb2_grpc
from .client import AsyncClient, AsyncGeneration, Client, Generation
from .resumable import (RETRYABLE_CODES, AsyncResumableGeneration, Break, DivergedError, ProtocolError,
                        ResumableGeneration, ResumeError, generate)

TostStub = tost_pb2_grpc.TostStub

__version__ = "0.1.0"

__all__ = ["AsyncClient", "AsyncGeneration", "AsyncResumableGeneration", "Break", "Client", "DivergedError",
           "Generation", "ProtocolError", "RETRYABLE_CODES", "ResumableGeneration", "ResumeError", "TostError",
           "TostStub", "generate", "tost_pb2", "tost_pb2_grpc"]
