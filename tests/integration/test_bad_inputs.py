"""Bad input, RPC by RPC: every method of tost.v1.Tost, inference.GRPCInferenceService and
grpc.health.v1.Health gets hostile requests (string fields that are not UTF-8, bytes that are not a
protobuf message, empty, oversized, negative and non-finite values, wrong shapes and datatypes,
unknown models, versions and sessions, missing API keys), and each must be refused with the code
docs/api.md documents and a message that names the field (gRPC's own health service names none).
After each one the server must still report SERVING.

Strings that are not UTF-8 cannot be sent through generated stubs (their serializers refuse to
write them), so every request goes out as raw bytes on a generic channel method with identity
serializers: built as a message with a "~" where the bad byte goes, serialized, then given the
byte. One server for the module, with API keys, so that the raw-bytes handlers are shown to
authenticate."""
import math
import os
import struct
from dataclasses import dataclass
from typing import Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as kserve

from conftest import SOURCE_DIR, RunningServer

VISION, LM = "tost-digits", "tost-austen"
KEY = "bad-inputs-key-0123456789"
AUTH = (("x-api-key", KEY),)
PIXELS = b"\0" * (32 * 32 * 4)  # one 1x32x32 float32 image of zeros
HUGE = "m" * 300_000

METHODS = {
    # rpc: (path, server streaming)
    "Classify": ("/tost.v1.Tost/Classify", False),
    "Generate": ("/tost.v1.Tost/Generate", True),
    "ListModels": ("/tost.v1.Tost/ListModels", False),
    "ModelInfo": ("/tost.v1.Tost/ModelInfo", False),
    "ServerStatus": ("/tost.v1.Tost/ServerStatus", False),
    "CreateSession": ("/tost.v1.Tost/CreateSession", False),
    "ForkSession": ("/tost.v1.Tost/ForkSession", False),
    "ExportSession": ("/tost.v1.Tost/ExportSession", False),
    "ImportSession": ("/tost.v1.Tost/ImportSession", False),
    "CloseSession": ("/tost.v1.Tost/CloseSession", False),
    "ServerLive": ("/inference.GRPCInferenceService/ServerLive", False),
    "ServerReady": ("/inference.GRPCInferenceService/ServerReady", False),
    "ServerMetadata": ("/inference.GRPCInferenceService/ServerMetadata", False),
    "ModelReady": ("/inference.GRPCInferenceService/ModelReady", False),
    "ModelMetadata": ("/inference.GRPCInferenceService/ModelMetadata", False),
    "ModelInfer": ("/inference.GRPCInferenceService/ModelInfer", False),
    "HealthCheck": ("/grpc.health.v1.Health/Check", False),
    "HealthWatch": ("/grpc.health.v1.Health/Watch", True),
}


class Ctx:
    """What a case builds its request from: the tost.v1 messages, a live session of the language
    model and a state blob exported from it (both owned by KEY's caller)."""

    def __init__(self, pb2, session_id: str, blob: bytes):
        self.pb2 = pb2
        self.session_id = session_id
        self.blob = blob


@dataclass
class Case:
    name: str
    rpc: str
    build: Callable[[Ctx], bytes]
    code: grpc.StatusCode
    fragment: str  # the field (and what is wrong with it), as the message must say
    metadata: tuple = AUTH
    xfail: str = ""  # why the server does not answer as it should yet


def poison(message) -> bytes:
    """The message serialized, with its one "~" replaced by 0xff: never valid UTF-8."""
    wire = message.SerializeToString()
    assert wire.count(b"~") == 1, wire
    return wire.replace(b"~", b"\xff")


def ser(message) -> bytes:
    return message.SerializeToString()


def floats(*values) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND


# ---- tost.v1 Classify -------------------------------------------------------------------------

def classify(c, model=VISION, shape=(1, 1, 32, 32), raw=PIXELS, **kw):
    tensor = c.pb2.FloatTensor(shape=list(shape), raw=raw) if shape is not None else None
    return c.pb2.ClassifyRequest(model=model, tensor=tensor, **kw)


CASES = [
    Case("model-not-utf8", "Classify", lambda c: poison(classify(c, model="tost~digits")),
         INVALID, "ClassifyRequest.model: not valid UTF-8 at byte 4"),
    Case("truncated-encoding", "Classify", lambda c: ser(classify(c))[:-100],
         INVALID, "ClassifyRequest.tensor: not a valid protobuf encoding"),
    Case("field-number-zero", "Classify", lambda c: b"\x00" + ser(classify(c)),
         INVALID, "ClassifyRequest: not a valid protobuf encoding at byte 0"),
    Case("unknown-model", "Classify", lambda c: ser(classify(c, model="no-such-model")),
         NOT_FOUND, 'model "no-such-model" is not served'),
    Case("empty-model", "Classify", lambda c: ser(classify(c, model="")),
         NOT_FOUND, 'model "" is not served'),
    Case("huge-model-name", "Classify", lambda c: ser(classify(c, model=HUGE)),
         NOT_FOUND, "(300000 bytes) is not served"),
    Case("language-model", "Classify", lambda c: ser(classify(c, model=LM)),
         INVALID, "Classify needs a tost_vision model"),
    Case("negative-top-k", "Classify", lambda c: ser(classify(c, top_k=-1)),
         INVALID, "top_k must be >= 0"),
    Case("no-input", "Classify", lambda c: ser(classify(c, shape=None)),
         INVALID, "neither tensor nor images is set"),
    Case("tensor-and-images", "Classify", lambda c: ser(classify(c, images=[b"x"])),
         INVALID, "tensor and images are both set"),
    Case("wrong-image-size", "Classify", lambda c: ser(classify(c, shape=(1, 1, 31, 32))),
         INVALID, "tensor.shape"),
    Case("rank-5-tensor", "Classify", lambda c: ser(classify(c, shape=(1, 1, 1, 32, 32))),
         INVALID, "tensor.shape"),
    Case("negative-batch", "Classify", lambda c: ser(classify(c, shape=(-1, 1, 32, 32))),
         INVALID, "tensor.shape[0]"),
    Case("zero-batch", "Classify", lambda c: ser(classify(c, shape=(0, 1, 32, 32), raw=b"")),
         INVALID, "tensor.shape[0]"),
    Case("batch-over-limit", "Classify", lambda c: ser(classify(c, shape=(9, 1, 32, 32), raw=PIXELS * 9)),
         INVALID, "tensor.shape[0]"),
    Case("dimension-past-int64", "Classify",
         lambda c: ser(classify(c, shape=(1, 1, 2**62, 2**62))), INVALID, "tensor.shape"),
    Case("raw-too-short", "Classify", lambda c: ser(classify(c, raw=PIXELS[:-4])),
         INVALID, "tensor.raw"),
    Case("data-count-mismatch", "Classify",
         lambda c: ser(c.pb2.ClassifyRequest(model=VISION, tensor=c.pb2.FloatTensor(
             shape=[1, 1, 32, 32], data=[0.0] * 1000))), INVALID, "tensor.data"),
    Case("nan-pixel", "Classify",
         lambda c: ser(classify(c, raw=floats(math.nan) + PIXELS[4:])), INVALID, "tensor.raw"),
    Case("infinite-pixel", "Classify",
         lambda c: ser(c.pb2.ClassifyRequest(model=VISION, tensor=c.pb2.FloatTensor(
             shape=[1, 1, 32, 32], data=[math.inf] + [0.0] * 1023))), INVALID, "tensor.data"),
    Case("pixel-past-magnitude", "Classify",
         lambda c: ser(classify(c, raw=floats(1e7) + PIXELS[4:])), INVALID, "magnitude at most"),
    Case("raw-and-data", "Classify",
         lambda c: ser(c.pb2.ClassifyRequest(model=VISION, tensor=c.pb2.FloatTensor(
             shape=[1, 1, 32, 32], raw=PIXELS, data=[0.0] * 1024))), INVALID, "tensor.raw"),
    Case("image-not-an-image", "Classify",
         lambda c: ser(c.pb2.ClassifyRequest(model=VISION, images=[b"not an image"])),
         INVALID, "images[0]"),
    Case("empty-image", "Classify", lambda c: ser(c.pb2.ClassifyRequest(model=VISION, images=[b""])),
         INVALID, "images[0]"),
    Case("truncated-png", "Classify",
         lambda c: ser(c.pb2.ClassifyRequest(model=VISION, images=[b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"])),
         INVALID, "images[0]"),
    Case("images-over-limit", "Classify",
         lambda c: ser(c.pb2.ClassifyRequest(model=VISION, images=[b"x"] * 9)), INVALID, "images"),
]


# ---- tost.v1 Generate -------------------------------------------------------------------------

def generate(c, model=LM, prompt=b"It was", sampling=None, stop=None, max_new_tokens=1, **kw):
    sampling = c.pb2.SamplingParams(**sampling) if sampling else None
    stop = c.pb2.StopConditions(**stop) if stop else None
    return c.pb2.GenerateRequest(model=model, prompt_bytes=prompt, max_new_tokens=max_new_tokens,
                                 sampling=sampling, stop=stop, **kw)


def tampered(blob: bytes) -> bytes:
    middle = len(blob) // 2
    return blob[:middle] + bytes([blob[middle] ^ 1]) + blob[middle + 1:]


CASES += [
    Case("model-not-utf8", "Generate", lambda c: poison(generate(c, model="tost~austen")),
         INVALID, "GenerateRequest.model: not valid UTF-8"),
    Case("session-id-not-utf8", "Generate",
         lambda c: poison(c.pb2.GenerateRequest(session_id="~" + c.session_id, max_new_tokens=1)),
         INVALID, "GenerateRequest.session_id: not valid UTF-8 at byte 0"),
    Case("stop-string-not-utf8", "Generate",
         lambda c: poison(generate(c, stop=dict(stop=["a", "b", "c~"]))),
         INVALID, "GenerateRequest.stop.stop[2]: not valid UTF-8 at byte 1"),
    Case("truncated-encoding", "Generate", lambda c: ser(generate(c))[:-3],
         INVALID, "GenerateRequest.prompt_bytes: not a valid protobuf encoding"),
    Case("unknown-model", "Generate", lambda c: ser(generate(c, model="no-such-model")),
         NOT_FOUND, 'model "no-such-model" is not served'),
    Case("vision-model", "Generate", lambda c: ser(generate(c, model=VISION)),
         INVALID, "Generate needs a tost_lm model"),
    Case("unknown-session", "Generate",
         lambda c: ser(c.pb2.GenerateRequest(session_id="0" * 32, max_new_tokens=1)),
         NOT_FOUND, 'session "00000000000000000000000000000000"'),
    Case("session-of-another-model", "Generate",
         lambda c: ser(c.pb2.GenerateRequest(model=VISION, session_id=c.session_id,
                                             prompt_bytes=b"x", max_new_tokens=1)),
         INVALID, f'belongs to model "{LM}"'),
    Case("session-with-huge-model-name", "Generate",
         lambda c: ser(c.pb2.GenerateRequest(model=HUGE, session_id=c.session_id,
                                             prompt_bytes=b"x", max_new_tokens=1)),
         INVALID, f'belongs to model "{LM}", the request names "{"m" * 64}..." (300000 bytes)'),
    Case("session-and-state", "Generate",
         lambda c: ser(c.pb2.GenerateRequest(session_id=c.session_id, state=c.blob,
                                             max_new_tokens=1)),
         INVALID, "set session_id or state, not both"),
    Case("state-not-a-blob", "Generate",
         lambda c: ser(c.pb2.GenerateRequest(state=b"not a blob", max_new_tokens=1)),
         INVALID, "state blob is not a tost-serve session"),
    Case("state-tampered", "Generate",
         lambda c: ser(c.pb2.GenerateRequest(state=tampered(c.blob), max_new_tokens=1)),
         INVALID, "state blob failed authentication"),
    Case("state-truncated", "Generate",
         lambda c: ser(c.pb2.GenerateRequest(state=c.blob[:-1], max_new_tokens=1)),
         INVALID, "state blob is truncated"),
    Case("negative-max-new-tokens", "Generate", lambda c: ser(generate(c, max_new_tokens=-1)),
         INVALID, "max_new_tokens must be in [0, 4096], got -1"),
    Case("max-new-tokens-over-limit", "Generate", lambda c: ser(generate(c, max_new_tokens=4097)),
         INVALID, "max_new_tokens must be in [0, 4096], got 4097"),
    Case("nan-temperature", "Generate",
         lambda c: ser(generate(c, sampling=dict(temperature=math.nan))), INVALID, "temperature"),
    Case("negative-temperature", "Generate",
         lambda c: ser(generate(c, sampling=dict(temperature=-1))), INVALID, "temperature"),
    Case("infinite-temperature", "Generate",
         lambda c: ser(generate(c, sampling=dict(temperature=math.inf))), INVALID, "temperature"),
    Case("top-p-above-one", "Generate",
         lambda c: ser(generate(c, sampling=dict(top_p=1.5))), INVALID, "top_p must be in (0, 1]"),
    Case("nan-top-p", "Generate",
         lambda c: ser(generate(c, sampling=dict(top_p=math.nan))), INVALID, "top_p"),
    Case("min-p-one", "Generate",
         lambda c: ser(generate(c, sampling=dict(min_p=1.0))), INVALID, "min_p must be in [0, 1)"),
    Case("negative-top-k", "Generate",
         lambda c: ser(generate(c, sampling=dict(top_k=-5))), INVALID, "top_k must be >= 0"),
    Case("negative-repetition-penalty", "Generate",
         lambda c: ser(generate(c, sampling=dict(repetition_penalty=-2))), INVALID,
         "repetition_penalty"),
    Case("infinite-repetition-penalty", "Generate",
         lambda c: ser(generate(c, sampling=dict(repetition_penalty=math.inf))), INVALID,
         "repetition_penalty"),
    Case("repetition-window-over-limit", "Generate",
         lambda c: ser(generate(c, sampling=dict(repetition_window=4097))), INVALID,
         "repetition_window"),
    Case("negative-repetition-window", "Generate",
         lambda c: ser(generate(c, sampling=dict(repetition_window=-1))), INVALID,
         "repetition_window"),
    Case("stop-strings-over-limit", "Generate",
         lambda c: ser(generate(c, stop=dict(stop=["x"] * 17))), INVALID, "stop: at most 16"),
    Case("empty-stop-string", "Generate",
         lambda c: ser(generate(c, stop=dict(stop=[""]))), INVALID, "stop strings must hold 1 to 256"),
    Case("stop-string-over-limit", "Generate",
         lambda c: ser(generate(c, stop=dict(stop=["s" * 257]))), INVALID,
         "stop strings must hold 1 to 256 bytes, got 257"),
    Case("stop-ids-over-limit", "Generate",
         lambda c: ser(generate(c, stop=dict(stop_token_ids=list(range(65))))), INVALID,
         "stop_token_ids: at most 64"),
    Case("stop-id-outside-vocabulary", "Generate",
         lambda c: ser(generate(c, stop=dict(stop_token_ids=[1 << 20]))), INVALID,
         "stop_token_ids: id 1048576 is outside the vocabulary"),
    Case("prompt-token-outside-vocabulary", "Generate",
         lambda c: ser(c.pb2.GenerateRequest(model=LM, prompt_tokens=c.pb2.TokenIds(ids=[1, 99999]),
                                             max_new_tokens=1)),
         INVALID, "prompt token id 99999 at index 1"),
    Case("negative-prompt-token", "Generate",
         lambda c: ser(c.pb2.GenerateRequest(model=LM, prompt_tokens=c.pb2.TokenIds(ids=[-3]),
                                             max_new_tokens=1)),
         INVALID, "prompt token id -3 at index 0"),
    Case("empty-prompt", "Generate", lambda c: ser(generate(c, prompt=b"")),
         INVALID, "prompt is empty"),
    Case("prompt-past-context-length", "Generate",
         lambda c: ser(c.pb2.GenerateRequest(model=LM, prompt_tokens=c.pb2.TokenIds(ids=[1] * 1025),
                                             max_new_tokens=1)),
         grpc.StatusCode.OUT_OF_RANGE, "exceeds the context length of 1024 tokens"),
    Case("prompt-bytes-over-limit", "Generate",
         lambda c: ser(generate(c, prompt=b"a" * ((1 << 20) + 1))), INVALID,
         "prompt_bytes holds 1048577 bytes, more than the limit of 1048576"),
    Case("top-logprobs-over-limit", "Generate", lambda c: ser(generate(c, top_logprobs=21)),
         INVALID, "top_logprobs must be in [0, 20], got 21"),
    Case("negative-top-logprobs", "Generate", lambda c: ser(generate(c, top_logprobs=-1)),
         INVALID, "top_logprobs must be in [0, 20], got -1"),
    Case("negative-state-every-tokens", "Generate",
         lambda c: ser(generate(c, state_every_tokens=-1)), INVALID, "state_every_tokens must be >= 0"),
]


# ---- tost.v1 model and server RPCs, sessions ----------------------------------------------------

CASES += [
    Case("field-number-zero", "ListModels", lambda c: b"\x00", INVALID,
         "ListModelsRequest: not a valid protobuf encoding at byte 0"),
    Case("unterminated-group", "ServerStatus", lambda c: b"\x0b", INVALID,
         "ServerStatusRequest field 1: not a valid protobuf encoding"),
    Case("model-not-utf8", "ModelInfo", lambda c: poison(c.pb2.ModelInfoRequest(model="~")),
         INVALID, "ModelInfoRequest.model: not valid UTF-8"),
    Case("unknown-model", "ModelInfo", lambda c: ser(c.pb2.ModelInfoRequest(model="nope")),
         NOT_FOUND, 'model "nope" is not served'),
    Case("huge-model-name", "ModelInfo", lambda c: ser(c.pb2.ModelInfoRequest(model=HUGE)),
         NOT_FOUND, "(300000 bytes) is not served"),
    Case("model-not-utf8", "CreateSession",
         lambda c: poison(c.pb2.CreateSessionRequest(model="tost-a~sten")),
         INVALID, "CreateSessionRequest.model: not valid UTF-8 at byte 6"),
    Case("stop-string-not-utf8", "CreateSession",
         lambda c: poison(c.pb2.CreateSessionRequest(model=LM, stop=c.pb2.StopConditions(stop=["~"]))),
         INVALID, "CreateSessionRequest.stop.stop[0]: not valid UTF-8"),
    Case("unknown-model", "CreateSession", lambda c: ser(c.pb2.CreateSessionRequest(model="nope")),
         NOT_FOUND, 'model "nope" is not served'),
    Case("vision-model", "CreateSession", lambda c: ser(c.pb2.CreateSessionRequest(model=VISION)),
         INVALID, "Generate needs a tost_lm model"),
    Case("nan-temperature", "CreateSession",
         lambda c: ser(c.pb2.CreateSessionRequest(
             model=LM, sampling=c.pb2.SamplingParams(temperature=math.nan))), INVALID, "temperature"),
    Case("stop-ids-over-limit", "CreateSession",
         lambda c: ser(c.pb2.CreateSessionRequest(
             model=LM, stop=c.pb2.StopConditions(stop_token_ids=list(range(65))))),
         INVALID, "stop_token_ids: at most 64"),
    Case("state-empty", "ImportSession", lambda c: ser(c.pb2.ImportSessionRequest()),
         INVALID, "state blob is not a tost-serve session (0 bytes"),
    Case("state-not-a-blob", "ImportSession",
         lambda c: ser(c.pb2.ImportSessionRequest(state=b"TOSTSESS" + b"\0" * 100)),
         INVALID, "state blob"),
    Case("state-tampered", "ImportSession",
         lambda c: ser(c.pb2.ImportSessionRequest(state=tampered(c.blob))),
         INVALID, "state blob failed authentication"),
    Case("truncated-encoding", "ImportSession", lambda c: ser(c.pb2.ImportSessionRequest(state=c.blob))[:-1],
         INVALID, "ImportSessionRequest.state: not a valid protobuf encoding"),
]
for rpc in ("ForkSession", "ExportSession", "CloseSession"):
    CASES += [
        Case("session-id-not-utf8", rpc, lambda c: poison(c.pb2.SessionRef(session_id=c.session_id + "~")),
             INVALID, "SessionRef.session_id: not valid UTF-8 at byte 32"),
        Case("unknown-session", rpc, lambda c: ser(c.pb2.SessionRef(session_id="f" * 32)),
             NOT_FOUND, 'session "ffffffffffffffffffffffffffffffff"'),
        Case("huge-session-id", rpc, lambda c: ser(c.pb2.SessionRef(session_id=HUGE)),
             NOT_FOUND, "(300000 bytes)"),
    ]


# ---- KServe v2 ------------------------------------------------------------------------------

def infer(name="image", datatype="FP32", shape=(1, 1, 32, 32), raw=(PIXELS,), model=VISION, **kw):
    request = kserve.ModelInferRequest(model_name=model, **kw)
    request.inputs.add(name=name, datatype=datatype, shape=list(shape))
    request.raw_input_contents.extend(raw)
    return request


def infer_with(change):
    request = infer()
    change(request)
    return request


CASES += [
    Case("malformed-encoding", "ServerLive", lambda c: b"\x0f", INVALID,
         "ServerLiveRequest field 1: not a valid protobuf encoding"),
    Case("malformed-encoding", "ServerReady", lambda c: b"\x0a\x05ab", INVALID,
         "ServerReadyRequest field 1: not a valid protobuf encoding"),
    Case("malformed-encoding", "ServerMetadata", lambda c: b"\x0c", INVALID,
         "ServerMetadataRequest: not a valid protobuf encoding"),
    Case("unknown-model", "ModelInfer", lambda c: ser(infer(model="nope")),
         NOT_FOUND, 'model "nope" is not served'),
    Case("unknown-version", "ModelInfer", lambda c: ser(infer(model_version="999")),
         NOT_FOUND, 'model_version: model "tost-digits" serves version'),
    Case("language-model", "ModelInfer", lambda c: ser(infer(model=LM)),
         grpc.StatusCode.UNIMPLEMENTED, "tost.v1.Tost/Generate"),
    Case("truncated-encoding", "ModelInfer", lambda c: ser(infer())[:-1],
         INVALID, "ModelInferRequest.raw_input_contents[0]: not a valid protobuf encoding"),
    Case("fp16-datatype", "ModelInfer", lambda c: ser(infer(datatype="FP16")),
         INVALID, 'inputs[0] ("image").datatype: expected FP32, got "FP16"'),
    Case("wrong-shape", "ModelInfer", lambda c: ser(infer(shape=(1, 32, 32))),
         INVALID, 'inputs[0] ("image").shape'),
    Case("negative-batch", "ModelInfer", lambda c: ser(infer(shape=(-1, 1, 32, 32))),
         INVALID, "inputs[0].shape[0]"),
    Case("batch-over-limit", "ModelInfer", lambda c: ser(infer(shape=(9, 1, 32, 32), raw=(PIXELS * 9,))),
         INVALID, "inputs[0].shape[0]"),
    Case("no-inputs", "ModelInfer", lambda c: ser(kserve.ModelInferRequest(model_name=VISION)),
         INVALID, "inputs: model tost-digits takes exactly one input"),
    Case("two-inputs", "ModelInfer",
         lambda c: ser(infer_with(lambda r: (r.inputs.add(name="image_bytes", datatype="BYTES", shape=[1]),
                                             r.raw_input_contents.append(b"\1\0\0\0x")))),
         INVALID, "takes exactly one input"),
    Case("unknown-input", "ModelInfer", lambda c: ser(infer(name="pixels")),
         INVALID, 'inputs[0].name: model tost-digits has no input "pixels"'),
    Case("raw-too-short", "ModelInfer", lambda c: ser(infer(raw=(PIXELS[:-4],))),
         INVALID, "raw_input_contents[0]"),
    Case("raw-count-mismatch", "ModelInfer", lambda c: ser(infer(raw=(PIXELS, PIXELS))),
         INVALID, "raw_input_contents holds 2 entries for 1 input(s)"),
    Case("nan-pixel", "ModelInfer", lambda c: ser(infer(raw=(floats(math.nan) + PIXELS[4:],))),
         INVALID, "raw_input_contents[0]"),
    Case("negative-infinite-pixel", "ModelInfer",
         lambda c: ser(infer(raw=(floats(-math.inf) + PIXELS[4:],))), INVALID, "raw_input_contents[0]"),
    Case("bytes-length-past-end", "ModelInfer",
         lambda c: ser(infer(name="image_bytes", datatype="BYTES", shape=(1,), raw=(b"\xff\0\0\0abc",))),
         INVALID, "raw_input_contents[0]: element 0 declares 255 bytes"),
    Case("zero-classes", "ModelInfer",
         lambda c: ser(infer_with(lambda r: r.outputs.add(name="probabilities").parameters["classification"]
                                  .MergeFrom(kserve.InferParameter(int64_param=0)))),
         INVALID, 'outputs[0].parameters["classification"] must be >= 1'),
    Case("string-class-count", "ModelInfer",
         lambda c: ser(infer_with(lambda r: r.outputs.add(name="probabilities").parameters["classification"]
                                  .MergeFrom(kserve.InferParameter(string_param="3")))),
         INVALID, 'outputs[0].parameters["classification"] must be an int64'),
    Case("unknown-output", "ModelInfer",
         lambda c: ser(infer_with(lambda r: r.outputs.add(name="logits"))),
         INVALID, 'outputs[0].name: model tost-digits has no output "logits"'),
    Case("sequence-parameter", "ModelInfer",
         lambda c: ser(infer_with(lambda r: r.parameters["sequence_id"].MergeFrom(
             kserve.InferParameter(int64_param=5)))),
         INVALID, 'parameters["sequence_id"]'),
    Case("model-name-not-utf8", "ModelInfer", lambda c: poison(infer(model="tost-d~gits")),
         INVALID, "ModelInferRequest.model_name: not valid UTF-8 at byte 6"),
    Case("model-version-not-utf8", "ModelInfer", lambda c: poison(infer(model_version="~")),
         INVALID, "ModelInferRequest.model_version: not valid UTF-8"),
    Case("id-not-utf8", "ModelInfer", lambda c: poison(infer(id="request-~")),
         INVALID, "ModelInferRequest.id: not valid UTF-8"),
    Case("input-name-not-utf8", "ModelInfer", lambda c: poison(infer(name="im~ge")),
         INVALID, "ModelInferRequest.inputs[0].name: not valid UTF-8"),
    Case("input-datatype-not-utf8", "ModelInfer", lambda c: poison(infer(datatype="FP~2")),
         INVALID, "ModelInferRequest.inputs[0].datatype: not valid UTF-8"),
    Case("parameter-key-not-utf8", "ModelInfer",
         lambda c: poison(infer_with(lambda r: r.parameters["prio~ity"].MergeFrom(
             kserve.InferParameter(int64_param=1)))),
         INVALID, "ModelInferRequest.parameters[0].key: not valid UTF-8"),
    Case("parameter-value-not-utf8", "ModelInfer",
         lambda c: poison(infer_with(lambda r: r.parameters["tag"].MergeFrom(
             kserve.InferParameter(string_param="~")))),
         INVALID, "ModelInferRequest.parameters[0].value.string_param: not valid UTF-8"),
    Case("input-parameter-key-not-utf8", "ModelInfer",
         lambda c: poison(infer_with(lambda r: r.inputs[0].parameters["~"].MergeFrom(
             kserve.InferParameter(bool_param=True)))),
         INVALID, "ModelInferRequest.inputs[0].parameters[0].key: not valid UTF-8"),
    Case("output-name-not-utf8", "ModelInfer",
         lambda c: poison(infer_with(lambda r: r.outputs.add(name="probabilit~es"))),
         INVALID, "ModelInferRequest.outputs[0].name: not valid UTF-8"),
    Case("output-parameter-key-not-utf8", "ModelInfer",
         lambda c: poison(infer_with(lambda r: r.outputs.add(name="probabilities").parameters["~"]
                                     .MergeFrom(kserve.InferParameter(int64_param=1)))),
         INVALID, "ModelInferRequest.outputs[0].parameters[0].key: not valid UTF-8"),
]
for rpc, message in (("ModelReady", kserve.ModelReadyRequest), ("ModelMetadata", kserve.ModelMetadataRequest)):
    CASES += [
        Case("name-not-utf8", rpc, lambda c, m=message: poison(m(name="tost~digits")),
             INVALID, f"{message.__name__}.name: not valid UTF-8 at byte 4"),
        Case("version-not-utf8", rpc, lambda c, m=message: poison(m(name=VISION, version="~1")),
             INVALID, f"{message.__name__}.version: not valid UTF-8 at byte 0"),
        Case("unknown-model", rpc, lambda c, m=message: ser(m(name="nope")),
             NOT_FOUND, 'model "nope" is not served'),
        Case("unknown-version", rpc, lambda c, m=message: ser(m(name=VISION, version="999")),
             NOT_FOUND, f'version: model "{VISION}" serves version'),
        Case("huge-version", rpc, lambda c, m=message: ser(m(name=VISION, version=HUGE)),
             NOT_FOUND, "(300000 bytes)"),
    ]


# ---- health and API keys ----------------------------------------------------------------------

# grpc.health.v1 is gRPC's own service (grpc::EnableDefaultHealthCheckService): its messages are
# its own and name no field.
CASES += [
    Case("unknown-service", "HealthCheck",
         lambda c: ser(health_pb2.HealthCheckRequest(service="no.such.Service")), NOT_FOUND,
         "service name unknown"),
    Case("service-not-utf8", "HealthCheck",
         lambda c: poison(health_pb2.HealthCheckRequest(service="tost.v1.T~st")), INVALID,
         "could not parse request"),
    Case("huge-service-name", "HealthCheck",
         lambda c: ser(health_pb2.HealthCheckRequest(service=HUGE)), INVALID, "could not parse request"),
    Case("field-number-zero", "HealthCheck", lambda c: b"\x00", INVALID, "could not parse request"),
    Case("field-number-zero", "HealthWatch", lambda c: b"\x00", INVALID, "could not parse request",
         xfail="gRPC's default health service answers a malformed Watch request INTERNAL (the "
               "server would need a health service of its own)"),
]
for rpc, build in (("Classify", lambda c: ser(classify(c))),
                   ("Generate", lambda c: ser(generate(c))),
                   ("ListModels", lambda c: b""),
                   ("CreateSession", lambda c: ser(c.pb2.CreateSessionRequest(model=LM))),
                   ("ExportSession", lambda c: ser(c.pb2.SessionRef(session_id=c.session_id))),
                   ("ModelInfer", lambda c: ser(infer())),
                   ("ModelMetadata", lambda c: ser(kserve.ModelMetadataRequest(name=VISION)))):
    CASES += [
        Case("no-api-key", rpc, build, grpc.StatusCode.UNAUTHENTICATED,
             "missing API key: send it in the x-api-key metadata", metadata=()),
        Case("unknown-api-key", rpc, build, grpc.StatusCode.UNAUTHENTICATED, "unknown API key",
             metadata=(("x-api-key", "not-the-key-0123456789"),)),
    ]


# ---- the tests --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    keys = tmp_path_factory.mktemp("bad_inputs") / "keys"
    keys.write_text(f"bad-inputs {KEY}\n")
    s = RunningServer(os.path.join(SOURCE_DIR, "models"), extra_args=[f"--api_keys_file={keys}"])
    yield s
    assert s.stop() == 0, "tost_server did not exit cleanly on SIGTERM"


@pytest.fixture(scope="module")
def keyed_channel(keyed_server):
    with grpc.insecure_channel(keyed_server.address) as ch:
        grpc.channel_ready_future(ch).result(timeout=30)
        yield ch


@pytest.fixture(scope="module")
def ctx(keyed_channel, proto_modules):
    pb2, pb2_grpc = proto_modules
    stub = pb2_grpc.TostStub(keyed_channel)
    session = stub.CreateSession(pb2.CreateSessionRequest(model=LM), metadata=AUTH, timeout=30)
    list(stub.Generate(pb2.GenerateRequest(session_id=session.session_id, prompt_bytes=b"It was",
                                           max_new_tokens=2), metadata=AUTH, timeout=30))
    blob = stub.ExportSession(pb2.SessionRef(session_id=session.session_id), metadata=AUTH,
                              timeout=30).state
    return Ctx(pb2, session.session_id, blob)


def call(channel, rpc, request: bytes, metadata):
    path, streaming = METHODS[rpc]
    def identity(b):  # the request is already bytes, the answer stays bytes
        return b

    if streaming:
        method = channel.unary_stream(path, request_serializer=identity, response_deserializer=identity)
        return list(method(request, metadata=metadata, timeout=30))
    method = channel.unary_unary(path, request_serializer=identity, response_deserializer=identity)
    return method(request, metadata=metadata, timeout=30)


def test_every_rpc_has_hostile_cases():
    assert len(CASES) >= 60
    assert {case.rpc for case in CASES} == set(METHODS), set(METHODS) - {case.rpc for case in CASES}
    names = [f"{case.rpc}-{case.name}" for case in CASES]
    assert len(names) == len(set(names)), "case names must be distinct"


@pytest.mark.parametrize(
    "case", [pytest.param(case, marks=pytest.mark.xfail(strict=True, reason=case.xfail))
             if case.xfail else case for case in CASES],
    ids=lambda case: f"{case.rpc}-{case.name}")
def test_bad_input_is_refused_with_its_code_naming_the_field(case, keyed_channel, ctx):
    request = case.build(ctx)
    with pytest.raises(grpc.RpcError) as e:
        call(keyed_channel, case.rpc, request, case.metadata)
    details = e.value.details() or ""
    assert e.value.code() == case.code, f"{e.value.code()}: {details}"
    assert case.fragment in details, details
    # A client's string comes back short (at most a 64-byte prefix) and escaped.
    assert len(details) < 1024, len(details)
    assert not any(ord(ch) < 32 for ch in details), details
    health = health_pb2_grpc.HealthStub(keyed_channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_the_same_requests_with_valid_text_are_served(keyed_channel, ctx):
    """The raw-bytes handlers answer well-formed requests (responses serialised, keys checked)."""
    pb2 = ctx.pb2
    reply = call(keyed_channel, "Classify", ser(classify(ctx, top_k=3)), AUTH)
    result = pb2.ClassifyResponse.FromString(reply)
    assert result.model == VISION and len(result.results[0].labels) == 3
    messages = [pb2.GenerateResponse.FromString(m) for m in
                call(keyed_channel, "Generate", ser(generate(ctx, max_new_tokens=3, stop=dict(stop=["\xe9t\xe9"]))), AUTH)]
    assert messages[-1].final.generated_tokens == 3
    info = pb2.ModelStatus.FromString(call(keyed_channel, "ModelInfo", ser(pb2.ModelInfoRequest(model=LM)), AUTH))
    assert info.context_length == 1024
    ready = kserve.ModelReadyResponse.FromString(
        call(keyed_channel, "ModelReady", ser(kserve.ModelReadyRequest(name=VISION)), AUTH))
    assert ready.ready
    live = kserve.ServerLiveResponse.FromString(call(keyed_channel, "ServerLive", b"", AUTH))
    assert live.live  # with keys, KServe's probes need one too (grpc.health.v1 is the keyless probe)
