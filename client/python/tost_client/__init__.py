"""tost_client: a Python client of tost-serve (tost.v1) whose generations survive the loss of a
replica.

Setup: with the repository checked out and `pip install grpcio grpcio-tools`, put client/python
on the path (`PYTHONPATH=client/python`, or `sys.path.insert`) and import the package. Its first
import generates the tost.v1 modules from proto/tost/v1/tost.proto with grpc_tools.protoc into a
cache directory (see tost_client._stubs for TOST_PROTO_DIR and TOST_CLIENT_CACHE_DIR); nothing
generated is committed, so the stubs always match the proto and the installed protobuf runtime.

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
"""
from ._stubs import load as _load
from .resumable import (RETRYABLE_CODES, Break, DivergedError, ProtocolError, ResumableGeneration,
                        ResumeError, generate)

tost_pb2, tost_pb2_grpc = _load()
TostStub = tost_pb2_grpc.TostStub

__all__ = ["Break", "DivergedError", "ProtocolError", "RETRYABLE_CODES", "ResumableGeneration", "ResumeError",
           "TostStub", "generate", "tost_pb2", "tost_pb2_grpc"]
